"""Exceptions from outside the model pass through the capture unchanged (issue 25 item 11).

A ``KeyboardInterrupt``, or a ``TimeoutError`` that a ``signal.alarm`` handler raises while the step is
traced, is the caller's, not the model's: ``estimate()`` must not turn it into "the forward pass failed
... check the input shapes".  The same exception raised by the model's own code still is the model's
error: a one-line :class:`~estimator.errors.UserError`.
"""

from __future__ import annotations

import signal
import time

import pytest
import torch

from estimator import estimate
from estimator.errors import UserError


class Raises(torch.nn.Module):
    """Raises ``exc`` from its forward (``where='forward'``) or from a gradient hook (``'backward'``)."""

    def __init__(self, exc: BaseException, where: str = "forward"):
        super().__init__()
        self.lin, self.exc, self.where = torch.nn.Linear(8, 8), exc, where

    def forward(self, x):
        y = self.lin(x)
        if self.where == "forward":
            raise self.exc
        y.register_hook(lambda g: (_ for _ in ()).throw(self.exc))
        return y.sum()


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_keyboard_interrupt_passes_through(where):
    with pytest.raises(KeyboardInterrupt):
        estimate(Raises(KeyboardInterrupt(), where), torch.randn(2, 8), device="cpu")


class Spins(torch.nn.Module):
    """Arms an alarm, then waits in plain Python until its handler raises TimeoutError.

    The wait is a Python loop, not torch ops: a handler that raises while the interpreter is inside
    a C++ call back into Python (a dispatch hook) can abort the process, which is torch's behaviour,
    not the capture's, and made this test crash a CI worker.  The signal is delivered between two
    bytecodes of this loop, inside the traced forward, which is what the capture must pass through.
    """

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        x = self.lin(x)
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            pass
        return x.sum()


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="no interval timers on this platform")
def test_an_alarm_raised_during_the_step_passes_through():
    def on_alarm(signum, frame):
        raise TimeoutError("the caller's deadline")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        with pytest.raises(TimeoutError, match="the caller's deadline"):
            estimate(Spins(), torch.randn(2, 8), device="cpu")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_the_models_own_timeout_error_is_still_a_one_line_user_error():
    with pytest.raises(UserError, match="forward pass failed.*TimeoutError: the model's") as info:
        estimate(Raises(TimeoutError("the model's")), torch.randn(2, 8), device="cpu")
    assert "\n" not in str(info.value)


def test_an_extension_whose_ops_do_not_load_is_said_so():
    """torchvision's PyPI wheel beside a CPU torch cannot load its C++ ops (nms, roi_align): the real step fails as
    the estimate does, and the hint said to check the input shapes and dtypes. It names the cause now."""
    from estimator import estimate

    class Detector(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            raise RuntimeError("Couldn't load custom C++ ops. This can happen if your PyTorch and torchvision versions "
                               "are incompatible")

    with pytest.raises(UserError, match="do not load with this torch, in a real step too") as info:
        estimate(Detector(), torch.randn(2, 4), device="cpu")
    assert "input shapes" not in str(info.value)

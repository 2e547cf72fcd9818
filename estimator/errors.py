"""User-facing errors.

A :class:`UserError` is a mistake the user can fix (a bad spec, a shape that
does not fit the model, an unknown GPU name).  Its message is one line that
says what to fix; the CLI prints it without a traceback and exits with 2.
"""

from __future__ import annotations

from typing import Any


class UserError(Exception):
    """An input problem the user can fix; the message says how."""


class UnsupportedModelError(UserError):
    """The model cannot be captured (e.g. data-dependent control flow on a model too large to run)."""


class DataDependentError(UnsupportedModelError):
    """The model reads tensor values in its forward and could be traced on real tensors only where
    that was not allowed (a fake-only trace, such as the planner's engines)."""


def from_outside(exc: BaseException) -> bool:
    """Whether ``exc`` is not the model's error but came from outside it: anything that is not an
    :class:`Exception` (``KeyboardInterrupt``, ``SystemExit``), or an exception a signal handler raised
    while the model ran (``signal.alarm`` with a handler that raises ``TimeoutError``, a test runner's
    timeout).  The capture lets these pass unchanged instead of blaming the model's inputs."""
    if not isinstance(exc, Exception):
        return True
    import signal

    handlers = set()
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
        except (ValueError, OSError):  # pragma: no cover - a signal Python cannot query
            continue
        code = getattr(handler, "__code__", None)
        if code is not None:
            handlers.add(code)
    tb = exc.__traceback__
    while tb is not None:  # the frames from where it was caught to where it was raised
        if tb.tb_frame.f_code in handlers:
            return True
        tb = tb.tb_next
    return False


def switch_choice(value: Any, name: str, choices: tuple[str, ...], when_true: str) -> str | None:
    """An option that is off or one of ``choices``: None for None/False/"none" (and ""), ``when_true`` for True,
    the choice (case-insensitive); else a one-line error naming the choices."""
    if value in (None, False, "", "none"):
        return None
    if value is True:
        return when_true
    if isinstance(value, str) and value.lower() in choices:
        return value.lower()
    raise UserError(f"{name} must be one of {', '.join(choices)} (or none), not {value!r}")

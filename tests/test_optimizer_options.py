"""Optimizer options as training scripts write them: nanoGPT's and torchtitan's ``AdamW(fused=True, betas=(0.9,
0.95), weight_decay=0.1)``, on the CUDA target (where the estimate picks the foreach implementation unless the
user asks for another: torch refuses fused and foreach together) and on the CPU.

Truth, measured in the same test: the state a real fused AdamW holds after a real ``optimizer.step()`` on the
CPU, and the kernel torch's own step runs (``_fused_adamw_``, seen by a dispatch mode around the real step).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from estimator import estimate
from estimator.errors import UserError
from estimator.optim import parse_optimizer

from test_cli import _one_line_error, run


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4)), torch.randn(8, 16)


def _real_fused_step(model, x, **options):
    """One real step of ``AdamW(fused=True, **options)``: the state's bytes and the optimizer's kernels."""
    opt = torch.optim.AdamW(model.parameters(), fused=True, **options)
    model(x).square().mean().backward()
    with _Ops() as ops:
        opt.step()
    state = sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
                if isinstance(t, torch.Tensor))
    return state, ops.seen


def test_option_values_in_parentheses_are_tuples():
    assert parse_optimizer("adamw:betas=(0.9,0.95),weight_decay=0.1,fused=true") == \
        ("adamw", {"betas": (0.9, 0.95), "weight_decay": 0.1, "fused": True})
    assert parse_optimizer("adamw:betas=( 0.9 , 0.95 )") == ("adamw", {"betas": (0.9, 0.95)})


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_fused_adamw_is_traced_as_torch_runs_it(device):
    model, x = _model()
    state, kernels = _real_fused_step(model, x, betas=(0.9, 0.95), weight_decay=0.1)
    assert "aten._fused_adamw_.default" in kernels
    report = estimate(model, x, loss_fn=lambda out: out.square().mean(), device=device,
                      optimizer="adamw:fused=true,betas=(0.9,0.95),weight_decay=0.1")
    ops = [str(n.target) for n in report.capture.nodes if n.meta.get("phase") == "optimizer"]
    # the first step's kernels as torch ran them: the state made, the step counts added, one fused update
    assert [op for op in ops if op.startswith("aten.")] == [op for op in kernels if op.startswith("aten.")], ops
    # exp_avg and exp_avg_sq like each parameter, one fp32 step count per parameter: the real state's bytes
    assert report.to_dict()["memory"]["optimizer_state"] == state
    assert report.tally.unsupported == []


def test_fused_and_foreach_together_and_capturable_are_one_line_errors():
    model, x = _model()
    loss = lambda out: out.square().mean()  # noqa: E731
    with pytest.raises(UserError, match="cannot be `True` together"):
        estimate(model, x, loss_fn=loss, optimizer="adamw:fused=true,foreach=true")
    with pytest.raises(UserError, match="drop capturable"):
        estimate(model, x, loss_fn=loss, optimizer="adamw:capturable=true")


def test_the_cli_takes_nanogpts_optimizer():
    proc = run("estimate", "examples/gpt.py:build", "--gpu", "H100", "--optimizer",
               "adamw:fused=true,betas=(0.9,0.95),weight_decay=0.1", "--format", "json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    bad = run("estimate", "examples/gpt.py:build", "--gpu", "H100", "--optimizer", "adamw:capturable=true")
    _one_line_error(bad, "capturable")

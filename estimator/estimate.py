"""The one-call API: capture a training step, apply the rules, tally, report."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from .capture import capture
from .memory import simulate
from .report import Report
from .tally import tally


def estimate(
    model: torch.nn.Module,
    inputs: Any,
    *,
    optimizer: Any = "adamw",
    optimizer_kwargs: Mapping[str, Any] | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    device: str = "cuda",
    depth: int = 2,
    mode: str = "auto",
    model_name: str | None = None,
) -> Report:
    """Estimate one training step (forward, loss, backward, optimizer step) of ``model``.

    Args:
        model: any ``nn.Module``; its weights may be real, on the ``meta`` device or fake.
            It is never modified (train/eval mode is restored, parameters are not touched).
        inputs: a tensor, a tuple of positional arguments or a dict of keyword arguments
            (nested lists/dicts of tensors allowed); real, ``meta`` or fake tensors.
        optimizer: a name (``"adamw"``, ``"sgd:momentum=0.9"``, ``"adam:amsgrad=true"``,
            ``"none"``), a ``torch.optim.Optimizer`` class, or an instance over ``model``'s parameters.
        optimizer_kwargs: extra keyword arguments for the optimizer.
        loss_fn: ``loss_fn(output) -> scalar``; default: the output if it is a scalar,
            else ``output.loss``, else the sum of the means of the floating-point outputs.
        device: the target device (``"cuda"`` or ``"cpu"``): picks the optimizer
            implementation PyTorch defaults to there (foreach on CUDA).
        depth: module depth of the per-module table.
        mode: ``"auto"``, ``"fake"`` or ``"real"`` (see :func:`estimator.capture.capture`).
    """
    if device not in ("cuda", "cpu"):
        from .errors import UserError

        raise UserError(f"device must be 'cuda' or 'cpu', not {device!r}")
    cap = capture(
        model,
        inputs,
        loss_fn=loss_fn,
        optimizer=optimizer,
        optimizer_kwargs=optimizer_kwargs,
        foreach=True if device == "cuda" else None,
        mode=mode,
    )
    t = tally(cap)
    profile = simulate(cap, device)
    return Report(cap, t, model_name=model_name or type(model).__name__, depth=depth, memory=profile)

"""Which tensor of the model's output is the loss of the step."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import torch
import torch.utils._pytree as pytree

from ..errors import UserError


def _leaves(output: Any) -> list[Any]:
    """pytree's leaves of ``output``, a plain dataclass (which pytree keeps whole) opened into its fields."""
    out = []
    for leaf in pytree.tree_leaves(output):
        if dataclasses.is_dataclass(leaf) and not isinstance(leaf, type):
            out.extend(_leaves([getattr(leaf, f.name) for f in dataclasses.fields(leaf)]))
        else:
            out.append(leaf)
    return out


def default_loss(output: Any) -> torch.Tensor:
    """The default loss: the sum of the means of every floating-point output tensor."""
    terms = [
        t.mean()
        for t in _leaves(output)
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad
    ]
    if not terms:
        raise UserError(
            "the model's output has no floating-point tensor that requires grad: "
            "nothing to train; pass loss_fn= or check that parameters require grad"
        )
    loss = terms[0]
    for t in terms[1:]:
        loss = loss + t
    return loss


def select_loss(output: Any, loss_fn: Callable[[Any], torch.Tensor] | None) -> tuple[torch.Tensor, str]:
    """Pick the loss of one step, and say which rule picked it.

    In order: ``loss_fn(output)`` when given; the output itself when it is a
    scalar tensor; ``output.loss`` (HF style) or ``output["loss"]``, its mean when the model
    returns one loss per sample (DAC); else :func:`default_loss`.
    """
    if loss_fn is not None:
        return loss_fn(output), "loss_fn(output)"
    if isinstance(output, torch.Tensor) and output.numel() == 1:
        return output.reshape(()) if output.ndim else output, "model output (scalar)"
    loss, source = getattr(output, "loss", None), "output.loss"
    if not isinstance(loss, torch.Tensor) and isinstance(output, Mapping):
        loss, source = output.get("loss"), 'output["loss"]'
    if isinstance(loss, torch.Tensor):
        if loss.numel() != 1 and loss.is_floating_point():  # DAC: one loss per sample, (batch,)
            shape = "x".join(str(d) for d in loss.shape)
            return loss.mean(), f"{source} ({shape}): its mean, as a training script reduces it"
        return loss, source
    return default_loss(output), "default: sum of the means of the floating-point outputs"

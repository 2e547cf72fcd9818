"""An exponential moving average of the weights, kept beside the model and updated after each optimizer step:
``torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))`` with
``ema.update_parameters(model)`` after ``opt.step()`` (timm's ``ModelEmaV3`` and diffusers' ``EMAModel`` hold and
update the same).

What it holds: a copy of every parameter, frozen ones included, in the parameter's dtype, and of every buffer
(``AveragedModel`` deep copies the module: a sinusoidal position table or BatchNorm's statistics too; left out
until 2026-11-30, -33 % on a model whose position table was most of its bytes); counted with the optimizer state
(:class:`EMA` is stepped as one more optimizer, after the real one).  What it runs at each step: one
``_foreach_lerp_`` per dtype over the parameters' copies towards the parameters (weight ``1 - decay``); the
buffers' copies are not updated (``use_buffers=False``, the default).  Not modelled: its ``n_averaged`` counter
(8 bytes).  The copy is traced inside the first step (where its ops replicate with the
blocks) and counted live from the first step's start, as ``AveragedModel`` makes it before the loop
(:attr:`EMA.made_before_loop`).
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from .errors import UserError


class EMA:
    """The moving average of ``params`` (see the module docstring), stepped like an optimizer."""

    def __init__(self, params: Iterable[torch.Tensor], decay: float, buffers: Iterable[torch.Tensor] = ()):
        self.params, self.decay, self.buffers = list(params), decay, list(buffers)
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
        self.param_groups: list[dict[str, Any]] = []  # nothing for a GradScaler to unscale

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        if not self.state:  # AveragedModel's deep copy (made before the loop)
            for p in self.params + self.buffers:
                self.state[p] = {"ema": torch.empty_like(p)}
        by_dtype: dict[torch.dtype, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        for p in self.params:
            ema, model = by_dtype.setdefault(p.dtype, ([], []))
            ema.append(self.state[p]["ema"])
            model.append(p.detach())
        for dtype, (ema, model) in by_dtype.items():
            if dtype.is_floating_point or dtype.is_complex:  # get_ema_multi_avg_fn
                torch._foreach_lerp_(ema, model, 1 - self.decay)

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    made_before_loop = True  # (its state: see the module docstring)


def check_ema(decay: Any, mode: str = "train") -> float | None:
    """``ema``: None or a decay in (0, 1), e.g. 0.999, for a training step; else a one-line error."""
    if decay is None:
        return None
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 < decay < 1:
        raise UserError(f"ema is the moving average's decay, a number between 0 and 1 (e.g. 0.999), not {decay!r}")
    if mode != "train":
        raise UserError(f"ema averages a training loop's weights; drop it for mode={mode!r}")
    return float(decay)


def with_ema(opt: Any, params: Iterable[torch.Tensor], decay: float, buffers: Iterable[torch.Tensor] = ()) -> Any:
    """``opt`` and then the weights' moving average (:class:`EMA`, with copies of ``buffers`` too), stepped as one
    (:class:`.optim.Chain`)."""
    from .optim import Chain

    inner = opt.optimizers if isinstance(opt, Chain) else [opt]
    note = (f"EMA of the weights (decay {decay:g}): a copy of every parameter and buffer, the parameters' stepped "
            f"after the optimizer by one foreach lerp (torch.optim.swa_utils.AveragedModel, get_ema_multi_avg_fn); "
            f"counted with the optimizer state")
    return Chain(inner + [EMA(params, decay, buffers)], "; ".join(n for n in (getattr(opt, "note", None), note) if n))

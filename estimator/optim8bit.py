"""bitsandbytes' 8-bit AdamW (``bnb.optim.AdamW8bit``, ``--optimizer adamw8bit``) as it holds and updates its state,
on any device (fake and meta tensors included); the estimator does not need bitsandbytes.

As bitsandbytes 0.50 lays it out (``optim/optimizer.py``: ``Optimizer2State.init_state`` and ``update_step``):

* a parameter of at least ``min_8bit_size`` (4,096) elements: its two moments as uint8 tensors of the
  parameter's shape (``state1``, ``state2``), one float32 absmax per block of 256 elements for each
  (``absmax1``, ``absmax2``), and the two 256-entry float32 quantization maps, one pair shared by every
  parameter of the optimizer (``name2qmap``, moved to the device once);
* a smaller one: float32 moments (``state1``, ``state2``), as 32-bit Adam keeps them;
* ``step``: a Python integer, no tensor;
* the update: one kernel per parameter, in place on the parameter, its moments and their absmax
  (``optimizer_update_8bit_blockwise``; ``optimizer_update_32bit`` for the small ones), no temporaries.

The kernels are :data:`ADAM_8BIT` and :data:`ADAM_32BIT`, custom ops that change nothing (shapes are all an
estimate needs) with cost rules: the AdamW update's FLOPs per element (``rules.elementwise.adam_flops``), and for
the 8-bit one a dequantizing multiply and a requantizing divide per element of each moment (4 more).  Paged
variants (``PagedAdamW8bit``: the moments in CUDA unified memory, outside PyTorch's allocator) are not modelled.
"""

from __future__ import annotations

import torch

from .rules import OTHER, lookup, register
from .rules.elementwise import adam_flops

MIN_8BIT_SIZE = 4096  # bitsandbytes' min_8bit_size: smaller parameters keep 32-bit moments
BLOCKSIZE = 256  # elements per absmax of the 8-bit moments


@torch.library.custom_op("estimator::adam_8bit_blockwise_", mutates_args=("param", "state1", "state2", "absmax1",
                                                                          "absmax2"))
def adam_8bit_blockwise_(param: torch.Tensor, grad: torch.Tensor, state1: torch.Tensor, state2: torch.Tensor,
                         absmax1: torch.Tensor, absmax2: torch.Tensor, qmap1: torch.Tensor, qmap2: torch.Tensor,
                         weight_decay: float) -> None:
    """bitsandbytes' blockwise 8-bit Adam update, in place (values not modelled)."""


@adam_8bit_blockwise_.register_fake
def _(param, grad, state1, state2, absmax1, absmax2, qmap1, qmap2, weight_decay):
    return None


@torch.library.custom_op("estimator::adam_32bit_", mutates_args=("param", "state1", "state2"))
def adam_32bit_(param: torch.Tensor, grad: torch.Tensor, state1: torch.Tensor, state2: torch.Tensor,
                weight_decay: float) -> None:
    """bitsandbytes' 32-bit Adam update of a small parameter, in place (values not modelled)."""


@adam_32bit_.register_fake
def _(param, grad, state1, state2, weight_decay):
    return None


ADAM_8BIT = torch.ops.estimator.adam_8bit_blockwise_
ADAM_32BIT = torch.ops.estimator.adam_32bit_


@register(ADAM_8BIT, kind=OTHER)
def adam_8bit_flops(call) -> int:
    """The AdamW update per element (13, 14 with weight decay) and 4 for the two moments' dequantization and
    requantization."""
    n = call["param"].numel
    return adam_flops(n, call["weight_decay"], False, decoupled=True) + 4 * n


@register(ADAM_32BIT, kind=OTHER)
def adam_32bit_flops(call) -> int:
    """The AdamW update per element (13, 14 with weight decay)."""
    return adam_flops(call["param"].numel, call["weight_decay"], False, decoupled=True)


class AdamW8bit(torch.optim.Optimizer):
    """``bnb.optim.AdamW8bit`` (see the module docstring): its state and one in-place kernel per parameter."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, min_8bit_size: int = MIN_8BIT_SIZE):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.min_8bit_size = min_8bit_size
        self.qmaps: tuple[torch.Tensor, torch.Tensor] | None = None

    def _init_state(self, p: torch.Tensor, state: dict) -> None:
        state["step"] = 0
        if p.numel() < self.min_8bit_size:
            state["state1"] = torch.zeros_like(p, dtype=torch.float32)
            state["state2"] = torch.zeros_like(p, dtype=torch.float32)
            return
        if self.qmaps is None:  # the signed and unsigned dynamic maps, once per optimizer
            self.qmaps = (p.new_zeros(256, dtype=torch.float32), p.new_zeros(256, dtype=torch.float32))
        blocks = -(-p.numel() // BLOCKSIZE)
        state["state1"] = torch.zeros_like(p, dtype=torch.uint8)
        state["qmap1"] = self.qmaps[0]
        state["state2"] = torch.zeros_like(p, dtype=torch.uint8)
        state["qmap2"] = self.qmaps[1]
        state["absmax1"] = p.new_zeros(blocks, dtype=torch.float32)
        state["absmax2"] = p.new_zeros(blocks, dtype=torch.float32)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    self._init_state(p, state)
                state["step"] += 1
                if state["state1"].dtype == torch.uint8:
                    ADAM_8BIT(p, p.grad, state["state1"], state["state2"], state["absmax1"], state["absmax2"],
                              state["qmap1"], state["qmap2"], group["weight_decay"])
                else:
                    ADAM_32BIT(p, p.grad, state["state1"], state["state2"], group["weight_decay"])


# FLOPs per element of bitsandbytes' own update kernels besides Adam's (this module's count above), from each
# update as bitsandbytes writes it (``bitsandbytes/functional.py``, ``optimizer_update_32bit``): the moments' updates
# and the parameter's, the weight decay's multiply-add where set; +4 for an 8-bit state's dequantize and requantize.
_BNB_PER_ELEMENT = {
    "momentum": 4,  # m = beta * m + g; p -= lr * m
    "rmsprop": 8,  # v = a * v + (1 - a) * g^2; p -= lr * g / (sqrt(v) + eps)
    "adagrad": 6,  # v += g^2; p -= lr * g / (sqrt(v) + eps)
    "lion": 11,  # u = sign(b1 * m + (1 - b1) * g); p = p * (1 - lr * wd) - lr * u; m = b2 * m + (1 - b2) * g
    "lamb": 16, "lars": 8,  # Adam's / momentum's with the trust ratio's scale
}


def register_bitsandbytes_rules() -> None:
    """Cost rules for bitsandbytes' own optimizer kernels (``torch.ops.bitsandbytes.optimizer_update_32bit`` and
    ``optimizer_update_8bit_blockwise``, which an instance of ``bnb.optim.*`` runs), the same count as this module's
    stand-ins for Adam and :data:`_BNB_PER_ELEMENT` for the others; registered once bitsandbytes is loaded (the ops
    exist only then).  A real instance was counted 0 FLOPs ("no cost rule") where the name counted 310,284."""
    ops = getattr(torch.ops, "bitsandbytes", None)
    for name, extra in (("optimizer_update_32bit", 0), ("optimizer_update_8bit_blockwise", 4)):
        op = getattr(ops, name, None) if ops is not None else None
        if op is None or lookup(op) is not None:
            continue

        @register(op, kind=OTHER)
        def bnb_update_flops(call, extra=extra) -> int:
            n = call["p"].numel
            kind = str(call["optimizer_name"])
            if kind in ("adam", "ademamix"):
                return adam_flops(n, call["weight_decay"], False, decoupled=True) + extra * n
            return (_BNB_PER_ELEMENT.get(kind, 4) + (2 if call["weight_decay"] else 0) + extra) * n

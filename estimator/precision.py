"""Precision policies: how a training step's tensors are typed.

* ``fp32``: everything float32 (4 bytes per element).
* ``bf16`` / ``fp16``: the model is cast (``model.to(dtype)``): parameters,
  gradients, optimizer state and activations in 2 bytes per element.
* ``bf16-mixed`` / ``fp16-mixed``: ``torch.autocast``: float32 master weights,
  gradients and optimizer state; autocast casts the weights of ops on its
  lower-precision list (matmul, convolution, attention...) to bf16/fp16, caches
  those copies for the forward pass, and runs the rest in float32.
  ``fp16-mixed`` adds a ``GradScaler`` (scaled loss, unscale before the step).

The trace runs these policies for real (on CPU fake tensors), so dtypes,
casts and cached weight copies come from PyTorch itself.  Autocast's op lists
are those of the traced device (CPU); on CUDA a few ops differ (e.g. CUDA
keeps softmax/layer norm in float32 where CPU may not).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .errors import UserError

POLICIES = ("fp32", "bf16", "fp16", "bf16-mixed", "fp16-mixed")


@dataclass(frozen=True)
class Precision:
    name: str
    cast: torch.dtype | None  # dtype the model and floating inputs are cast to
    autocast: torch.dtype | None  # autocast dtype for forward + loss
    grad_scaler: bool

    def autocast_context(self):
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast("cpu", dtype=self.autocast)

    def traced_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a floating parameter, buffer or input has under this policy."""
        return self.cast if (self.cast is not None and dtype.is_floating_point) else dtype


def parse_precision(name: str | Precision | None) -> Precision:
    if isinstance(name, Precision):
        return name
    key = (name or "fp32").strip().lower()
    table = {
        "fp32": Precision("fp32", None, None, False),
        "bf16": Precision("bf16", torch.bfloat16, None, False),
        "fp16": Precision("fp16", torch.float16, None, False),
        "bf16-mixed": Precision("bf16-mixed", None, torch.bfloat16, False),
        "fp16-mixed": Precision("fp16-mixed", None, torch.float16, True),
    }
    if key not in table:
        raise UserError(f"unknown precision {name!r}; choose one of {', '.join(POLICIES)}")
    return table[key]

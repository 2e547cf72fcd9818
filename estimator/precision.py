"""Precision policies: how a training step's tensors are typed.

* ``fp32``: everything float32 (4 bytes per element).
* ``bf16`` / ``fp16``: the model is cast (``model.to(dtype)``): parameters,
  gradients, optimizer state and activations in 2 bytes per element.
* ``bf16-mixed`` / ``fp16-mixed``: ``torch.autocast``: float32 master weights,
  gradients and optimizer state; autocast casts the weights of ops on its
  lower-precision list (matmul, convolution, attention...) to bf16/fp16, caches
  those copies for the forward pass, and runs the rest in float32.
  ``fp16-mixed`` adds a ``GradScaler`` (scaled loss, unscale before the step).
* ``fp8``: a what-if, not a trace: the ``bf16-mixed`` step with its linear layers in fp8
  (:func:`fp8_what_if`).

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

POLICIES = ("fp32", "bf16", "fp16", "bf16-mixed", "fp16-mixed", "fp8")


@dataclass(frozen=True)
class Precision:
    name: str
    cast: torch.dtype | None  # dtype the model and floating inputs are cast to
    autocast: torch.dtype | None  # autocast dtype for forward + loss
    grad_scaler: bool
    fp8_linear: bool = False  # the fp8 what-if over this trace (see fp8_what_if)

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
        "fp8": Precision("fp8", None, torch.bfloat16, False, fp8_linear=True),
    }
    if key not in table:
        raise UserError(f"unknown precision {name!r}; choose one of {', '.join(POLICIES)}")
    return table[key]


# -- fp8 what-if ------------------------------------------------------------------

FP8_FORWARD = "float8_e4m3fn"  # activations and weights (E4M3: more mantissa)
FP8_BACKWARD = "float8_e5m2"  # gradients (E5M2: more range)
_MATMULS = ("mm", "addmm", "bmm", "baddbmm")


def fp8_what_if(cap, module_types: dict[str, str], flops_by_dtype: dict[str, int],
                linear_types: tuple[str, ...] = ("Linear",)) -> dict:
    """Linear layers in fp8 over a ``bf16-mixed`` trace, as TransformerEngine / torchao float8 train.

    A model, not a trace: the matmuls of ``nn.Linear`` modules run in fp8 (forward GEMM on
    E4M3 inputs and weights; backward GEMMs on E5M2 gradients), everything else as traced.
    Memory: the bf16 weight copies autocast makes for those matmuls become 1-byte E4M3
    copies, and a bf16 input a linear layer saves for backward is saved as an E4M3 copy
    (1 byte per element) when no other op reads it.  Returns ``{"resize": {sid: bytes},
    "flops_by_dtype": {dtype: FLOPs}}`` to apply to the tallies and the memory replay.
    """
    readers: dict[int, set[str]] = {}  # sid -> "linear" / "other": who reads it in the forward pass
    linear_nodes = []
    for node in cap.nodes:
        if node.meta.get("phase") not in ("forward", "loss"):
            continue
        is_linear = (module_types.get(node.meta.get("module", ""), "") in linear_types
                     and str(getattr(node.target, "overloadpacket", "")).removeprefix("aten.") in _MATMULS)
        if is_linear:
            linear_nodes.append(node)
        produced = set(node.meta.get("storage", ()))
        for arg in node.all_input_nodes:
            for sid in arg.meta.get("storage", ()):
                if sid in produced and not is_linear:  # a view or in-place op: the readers of its result count
                    continue
                readers.setdefault(sid, set()).add("linear" if is_linear else "other")
    resize: dict[int, int] = {}
    for node in linear_nodes:
        for arg in node.all_input_nodes:
            for spec, sid in zip(arg.meta.get("spec", ()), arg.meta.get("storage", ())):
                if spec.dtype in (torch.bfloat16, torch.float16) and readers.get(sid) == {"linear"}:
                    resize[sid] = cap.storage_bytes[sid] // spec.dtype.itemsize  # 1 byte per element
    by_dtype = dict(flops_by_dtype)
    for node in cap.nodes:
        cost = node.meta.get("cost")
        phase = node.meta.get("phase")
        if cost is None or not cost.flops or cost.kind != "matmul" or phase not in ("forward", "loss", "backward"):
            continue
        if module_types.get(node.meta.get("module", ""), "") in linear_types and \
                str(getattr(node.target, "overloadpacket", "")).removeprefix("aten.") in _MATMULS:
            to = FP8_BACKWARD if phase == "backward" else FP8_FORWARD
            by_dtype[cost.dtype] = by_dtype.get(cost.dtype, 0) - cost.flops
            by_dtype[to] = by_dtype.get(to, 0) + cost.flops
    return {"resize": resize, "flops_by_dtype": {k: v for k, v in by_dtype.items() if v}}

"""The likely range of a predicted step time, from the model's held-out errors for the GPU and the
step's op mix (:func:`half_width`, :func:`likely_range`, :func:`origin`).

``likely = total * exp(-h) .. total * exp(+h)`` with

    h = sqrt(step ** 2 + (sum over families f of share_f * e_f) ** 2)

* ``step`` (``band["step"]``): the error of a whole step when the kernels are calibrated: the 80th
  percentile of |log(predicted / measured)| of the H100's training steps, each predicted with its
  model held out (``benchmarks/fit_timing.py``, leave one model out).  It covers what kernel
  measurements cannot (host time, launch gaps, how kernels compose into a step).
* ``e_f`` (``band[f]``): this GPU's extra error on the kernels of family ``f`` (fp32 ``gemm``, fp32
  ``conv``, ``memory``-bound, and ``tensor``: tensor-core GEMMs, convolutions and attention in
  TF32 / bf16 / fp16): 0 for the families measured on this GPU; for a family carried from other GPUs,
  the root mean square over held-out GPUs of the family's median log error when that GPU is left
  out (``benchmarks/fit_kernels.py``, leave one GPU out).  Tensor-core kernels are measured on the
  H100 only: on other GPUs their figure is the fp32 GEMMs' (a stand-in, said so in :func:`origin`).
  A GPU timed from a sibling's constants (the same chip on another board) takes, per family, the
  |median log error| of that transfer on a measured sibling's own kernels (the H100's constants on the
  H200's fp32 kernels and bf16 GEMMs, ``catalog.sibling_band``).
* ``share_f``: the family's kernel time over the step's time.  Errors within a family are treated
  as one systematic error (an efficiency off by 20 % moves every GEMM), hence the linear sum; the
  calibrated step's error is independent of it, hence the quadrature.

"Likely" is therefore about 4 cases in 5 on the data the figures come from.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from .constants import TimingModel
from .kernels import precision_of
from .optable import ATTENTION, CONV, MATMUL, MEMORY, RNN
from .records import OpWork

FAMILIES = ("gemm", "conv", "memory", "tensor")


def family_of(w: OpWork, model: TimingModel, matmul_tf32: bool = False) -> str | None:
    """The band family of one op (None: no kernel)."""
    if w.kind == MEMORY:
        return "memory"
    if w.kind not in (MATMUL, CONV, ATTENTION, RNN):
        return None
    _, precision = precision_of(w, matmul_tf32, model.tf32)
    if precision in ("half", "tf32") or w.kind == ATTENTION:
        return "tensor"
    return "conv" if w.kind == CONV else "gemm"


def shares(works: Sequence[OpWork], gpu_s: Sequence[float], total: float, model: TimingModel,
           matmul_tf32: bool = False) -> dict[str, float]:
    """Each family's kernel time over the step's time."""
    out = dict.fromkeys(FAMILIES, 0.0)
    for w, g in zip(works, gpu_s):
        f = family_of(w, model, matmul_tf32)
        if f is not None and g > 0:
            out[f] += g
    return {f: (v / total if total > 0 else 0.0) for f, v in out.items()}


def half_width(band: Mapping[str, float], share: Mapping[str, float]) -> float:
    """``h`` of the module docstring (log scale)."""
    kernels = sum(share.get(f, 0.0) * band.get(f, 0.0) for f in FAMILIES)
    return math.hypot(band.get("step", 0.0), kernels)


def likely_range(total: float, h: float) -> tuple[float, float]:
    return total * math.exp(-h), total * math.exp(h)


def origin(model: TimingModel, share: Mapping[str, float] | None = None) -> str:
    """Where the constants come from, in a few words (what the range rests on)."""
    prov = model.provenance or {}
    if "sibling" in prov:
        return (f"not measured: the {prov['sibling']}'s measurements (the same chip) on this GPU's datasheet, "
                f"with the kernel errors of that transfer as measured on an H200")
    measured = prov.get("measured")
    if measured == "training steps":
        return "calibrated on measured training steps of this GPU"
    if measured == "fp32 kernels":
        text = "calibrated on fp32 kernels measured on this GPU"
        if share and share.get("tensor", 0.0) >= 0.05:
            text += "; its attention and tensor-core (TF32/bf16/fp16) kernels are extrapolated from the H100"
        return text
    return "extrapolated: no kernel measurements for this GPU"

"""The constants of the step-time model for one GPU (:class:`TimingModel`) and where they come from.

The constants are fitted (``benchmarks/fit_timing.py``) on real H100 measurements and stored
with their provenance in ``estimator/data/timing_h100.json``.  For a GPU without measurements,
:func:`load_model` scales the H100 figures: efficiencies are fractions of the datasheet peaks and
the bandwidth a fraction of the datasheet bandwidth, so they carry over; floors and host costs
are kept (the host is the same kind of machine).  Such a model says ``calibrated=False`` and its
``source`` says "extrapolated".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

from ..hardware import GPU
from ..hardware import lookup as lookup_gpu

# -- the constants ---------------------------------------------------------------------------

#: Streaming multiprocessors are not needed; peaks come from hardware.GPU.  Keys of ``eff``:
#: "<family>.<precision>" with family matmul / conv / attention.<backend> and precision fp32
#: (fp32 pipes), tf32 or half (bf16 / fp16 tensor cores).
EFF_KEYS = ("matmul.fp32", "matmul.tf32", "matmul.half", "conv.tf32", "conv.half", "conv.fp32", "conv.grouped",
            "attention.cudnn.half", "attention.efficient.fp32", "attention.efficient.half",
            "attention.flash.half", "attention.flash.fp32")


@dataclass(frozen=True)
class TimingModel:
    """The constants of the time model for one GPU (see the module docstring for the formulas).

    Seconds, bytes/s and fractions; ``eff`` holds achieved fractions of the datasheet peak
    (``hardware.GPU.peak``) by op family and precision.  ``provenance`` says where each figure
    comes from (fitted from which cases, or assumed, and why).
    """

    gpu: str
    calibrated: bool
    source: str
    # GPU kernels
    launch_s: float  # floor of one memory-bound kernel (launch + ramp), GPU busy
    library_s: float  # floor of one cuBLAS / cuDNN kernel (GEMM, convolution, attention)
    bandwidth: float  # achieved bytes/s of a streaming elementwise kernel
    memory_eff: Mapping[str, float]  # fraction of ``bandwidth`` by memory class (elementwise = 1)
    overlap_p: float  # soft_max exponent between compute and memory time of a compute kernel
    eff: Mapping[str, float]  # achieved fraction of the peak, EFF_KEYS
    attention_backward: float  # the backward attention kernels reach this fraction of the forward's
    conv_backward: float  # convolution backward (dgrad + wgrad) reaches this fraction of the forward's
    fill_rows: float  # output elements (batch * m * n) at which a GEMM reaches half its efficiency
    n0: float  # m or n at which a GEMM reaches half its efficiency (tile padding)
    k0: float  # inner dimension at which a GEMM reaches half its efficiency (prologue / epilogue)
    align_gamma: float  # tensor-core efficiency x (alignment_bytes / 16) ** gamma
    peaks: Mapping[str, float]  # fp32 / tf32 / bf16 / fp16 FLOP/s of the GPU (datasheet)
    # host
    cpu_view: Mapping[str, float]  # per op (a view's cost: dispatcher, autograd, forward Python), by phase
    cpu_inop: Mapping[str, float]  # host time inside an op beyond a view's, by aten op name (measured)
    cpu_inop_class: Mapping[str, float]  # the same for op names without samples: kernel/cublas/cudnn/foreach
    cpu_tensor: float  # per tensor of a foreach op's lists (the optimizer's per-parameter work)
    cpu_sync: float  # extra host time of a device -> host read (besides waiting for the GPU)
    provenance: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in d.items()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "TimingModel":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


_DATA_FILES = {"H100-SXM": "timing_h100.json"}


@lru_cache(maxsize=None)
def _measured(name: str) -> TimingModel:
    text = resources.files("estimator").joinpath("data", _DATA_FILES[name]).read_text()
    return TimingModel.from_json(json.loads(text))


def datasheet_peaks(gpu: GPU) -> dict[str, float]:
    fp32 = gpu.peak.get("fp32") or 0.0
    half = gpu.peak.get("bf16") or gpu.peak.get("fp16") or fp32
    return {"fp32": fp32, "tf32": gpu.peak.get("tf32") or fp32, "bf16": half,
            "fp16": gpu.peak.get("fp16") or half}


def load_model(gpu: GPU | str = "H100-SXM") -> TimingModel:
    """The constants for ``gpu``: measured ones when this GPU was calibrated, else the H100's
    scaled to ``gpu``'s datasheet (efficiencies are fractions of the peaks and the bandwidth a
    fraction of the datasheet bandwidth, so they carry over; floors and host costs are kept),
    marked ``calibrated=False``."""
    gpu = lookup_gpu(gpu) if isinstance(gpu, str) else gpu
    if gpu.name in _DATA_FILES:
        return _measured(gpu.name)
    ref_name = "H100-SXM"
    ref = _measured(ref_name)
    ref_gpu = lookup_gpu(ref_name)
    return replace(
        ref, gpu=gpu.name, calibrated=False,
        source=f"extrapolated from {ref_name} ({ref.source}): efficiencies x {gpu.name}'s datasheet peaks, "
               f"bandwidth x {gpu.bandwidth / ref_gpu.bandwidth:.3g}",
        bandwidth=ref.bandwidth * gpu.bandwidth / ref_gpu.bandwidth, peaks=datasheet_peaks(gpu))

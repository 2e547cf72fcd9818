"""The constants of the step-time model for one GPU (:class:`TimingModel`).

The constants are fitted on measurements (``benchmarks/fit_timing.py``: this project's H100 steps;
``benchmarks/fit_kernels.py``: public fp32 kernel measurements of other GPUs) and stored with their
provenance in ``estimator/data/timing_<gpu>.json``; :mod:`.catalog` loads them, or carries them to a
GPU without measurements (:mod:`.structure`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..hardware import GPU

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
    tf32: bool = True  # the GPU has TF32 tensor cores (cuDNN runs fp32 convolutions on them by default)
    # log half-widths of the "likely" range of a step by op family (estimator.timing.band): "step" (the
    # whole step on a calibrated GPU), "gemm", "conv", "memory", "tensor" (this GPU's extra error)
    band: Mapping[str, float] = field(default_factory=dict)
    # this GPU's sustained tensor-core rate over the H100 SXM's at 700 W (estimator.timing.structure.apply: the
    # power factors' ratio): what the single-kernel tables measured on the H100's chip (attention) are scaled by
    tensor_ratio: float = 1.0

    def to_json(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in d.items()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "TimingModel":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def datasheet_peaks(gpu: GPU) -> dict[str, float]:
    """fp32 / tf32 / bf16 / fp16 / fp8 FLOP/s of ``gpu`` (a mode the GPU lacks runs at the next one it has:
    tf32 -> fp32; bf16 -> fp16 -> fp32; fp8 -> bf16), and ``half_cuda``: bf16 / fp16 on the CUDA cores (not the
    tensor cores), twice the fp32 rate with packed two-element instructions (HFMA2 / BF16x2: the
    H100 whitepaper's 133.8 non-tensor fp16 and bf16 TFLOP/s for 66.9 fp32), what depthwise
    convolutions run in bf16 / fp16."""
    peaks = {key: gpu.matmul_peak(key) for key in ("fp32", "tf32", "bf16", "fp16", "fp8")}
    return {**peaks, "half_cuda": 2 * peaks["fp32"]}

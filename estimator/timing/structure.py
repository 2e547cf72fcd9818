"""The time model's kernel constants of a GPU from its structure: how the constants measured on some
GPUs carry to a GPU without measurements (:func:`kernel_constants`, :func:`apply`).

The global parameters (:class:`Structure`) are fitted across the GPUs with kernel measurements by
``benchmarks/fit_kernels.py`` (stage 2) and stored in ``estimator/data/timing_structure.json``; the
same script holds each measured GPU out in turn and predicts its kernels from these formulas (the
errors are the file's ``logo`` entry and the error band's figures, :mod:`.band`).

* **Sustained fp32 GEMM efficiency** (fraction of the datasheet fp32 peak, GPU busy):
  ``eff = gemm_eff * power_factor`` with ``power_factor = min(1, H / H0) ** alpha`` and the power
  headroom ``H = tdp_w / peak_fp32[TFLOP/s] * (12 / process_nm)``: watts per TFLOP/s the board may
  draw, scaled to a 12 nm chip's energy per FLOP (assumed proportional to the process node).  A GPU
  whose power limit cannot feed its peak throttles under a steady load: the L4 (72 W for 30.3
  TFLOP/s) sustains a quarter of its fp32 peak, the T4 (70 W, 8.1) under two fifths; an A100 or a
  V100 is not limited.  The roofline part (the datasheet peak) carries the SMs and the clock.
* **Shape** (``estimator.timing.size_factor``): ``fill_rows = fill_per_sm * SMs`` (a GPU with more
  SMs needs more output tiles to fill a wave); ``n0``, ``k0`` and the compute/memory overlap
  exponent are shared by all GPUs.  A hard wave-quantisation factor (tiles of 128 x 128, one per SM)
  was tried on the measured GEMMs and fitted to exponents of 0.1-0.45 with no better residuals:
  cuBLAS picks tile shapes and split-K per shape, which smooths the waves out.
* **Memory-bound kernels**: ``bandwidth = bandwidth_frac * datasheet bandwidth``; reductions
  (softmax) and fused norms stream at the shared fractions ``reduction`` and ``norm`` of it.  The L2
  is not modelled: kernels whose data fit in it are shorter than the measurement floor in the data.
* **Convolutions** without TF32 (the fp32 pipes): ``conv_ratio`` x the GEMM efficiency.
* **Not measured on any GPU but the H100** (tensor-core GEMMs and convolutions in TF32 / bf16 /
  fp16, attention, depthwise convolutions, ATen's batch norm): the H100's fractions of the peak x
  the GPU's power factor relative to the H100's.  Launch floors and host costs: the H100's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from ..hardware import GPU
from .constants import TimingModel, datasheet_peaks

REF_NM = 12.0  # the process node the power headroom is expressed at


@dataclass(frozen=True)
class Structure:
    """The global parameters of the structural model (see the module docstring)."""

    gemm_eff: float  # sustained fp32 GEMM efficiency of a GPU with power headroom
    headroom0: float  # H0: the headroom (W per TFLOP/s at 12 nm) below which the fp32 rate throttles
    alpha: float  # how fast it throttles below H0
    bandwidth_frac: float  # achieved / datasheet bandwidth of a streaming elementwise kernel
    reduction: float  # softmax-class kernels' fraction of it
    norm: float  # fused norms' fraction of it
    fill_per_sm: float  # output elements per SM at which a GEMM reaches half its efficiency
    n0: float
    k0: float
    overlap_p: float
    conv_ratio: float  # fp32 convolutions (no TF32) / fp32 GEMMs
    provenance: Mapping[str, Any] = field(default_factory=dict)

    FIELDS = ("gemm_eff", "headroom0", "alpha", "bandwidth_frac", "reduction", "norm", "fill_per_sm", "n0", "k0",
              "overlap_p", "conv_ratio")

    def to_json(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self.FIELDS}, "provenance": dict(self.provenance)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Structure":
        return cls(**{k: d[k] for k in cls.FIELDS}, provenance=d.get("provenance", {}))


def power_headroom(gpu: GPU) -> float | None:
    """``tdp_w / peak_fp32[TFLOP/s] * (12 / process_nm)``: None when the GPU's table entry lacks them."""
    fp32 = gpu.peak.get("fp32")
    if not (gpu.tdp_w and fp32):
        return None
    return gpu.tdp_w / (fp32 / 1e12) * (REF_NM / (gpu.process_nm or REF_NM))


def power_factor(headroom: float | None, headroom0: float, alpha: float) -> float:
    """``min(1, H / H0) ** alpha``: the share of its boost rate a GPU sustains under a steady load
    (1 when the headroom is unknown)."""
    if headroom is None:
        return 1.0
    return min(1.0, headroom / headroom0) ** alpha


def kernel_constants(gpu: GPU, s: Structure) -> dict[str, float]:
    """The measured kinds of constants (fp32 kernels, memory-bound kernels) of ``gpu`` from its
    structure: what a GPU with fp32 kernel measurements has measured instead."""
    pf = power_factor(power_headroom(gpu), s.headroom0, s.alpha)
    gemm = s.gemm_eff * pf
    return {"bandwidth_frac": s.bandwidth_frac, "reduction": s.reduction, "norm": s.norm, "matmul.fp32": gemm,
            "conv.fp32": gemm * s.conv_ratio, "fill_rows": s.fill_per_sm * (gpu.sms or 132), "n0": s.n0, "k0": s.k0,
            "overlap_p": s.overlap_p}


# efficiencies only the H100 measures: scaled by the power factor relative to the H100's
_TENSOR_EFF = ("matmul.tf32", "matmul.half", "conv.tf32", "conv.half", "conv.grouped", "attention.cudnn.half",
               "attention.efficient.fp32", "attention.efficient.half", "attention.flash.half", "attention.flash.fp32")


def apply(base: TimingModel, base_gpu: GPU, gpu: GPU, constants: Mapping[str, float], s: Structure, *,
          calibrated: bool, source: str, band: Mapping[str, float], provenance: Mapping[str, Any]) -> TimingModel:
    """``base`` (the H100's model) carried to ``gpu``: the measured kinds of constants from
    ``constants`` (this GPU's fit, or :func:`kernel_constants`), the others the H100's scaled by the
    power factor (see the module docstring)."""
    own = power_factor(power_headroom(gpu), s.headroom0, s.alpha)
    ref = power_factor(power_headroom(base_gpu), s.headroom0, s.alpha)
    # a measured fp32 GEMM efficiency below the structural one means a lower sustained clock: tensor ops too
    measured = constants["matmul.fp32"] / (s.gemm_eff * ref)
    ratio = min(1.0, measured if calibrated else own / ref)
    eff = {k: v * (ratio if k in _TENSOR_EFF else 1.0) for k, v in base.eff.items()}
    eff.update({"matmul.fp32": constants["matmul.fp32"], "conv.fp32": constants["conv.fp32"]})
    memory_eff = dict(base.memory_eff)
    # classes measured on the H100 only: the norm-like ones move with this GPU's norm, the others carry over
    scale = constants["norm"] / max(memory_eff.get("norm", 1.0), 1e-9)
    for cls in ("batch_norm_native", "norm_backward"):
        if cls in memory_eff:
            memory_eff[cls] *= scale
    memory_eff.update(reduction=constants["reduction"], norm=constants["norm"])
    return replace(base, gpu=gpu.name, calibrated=calibrated, source=source,
                   bandwidth=gpu.bandwidth * constants["bandwidth_frac"], memory_eff=memory_eff, eff=eff,
                   fill_rows=constants["fill_rows"], n0=constants["n0"], k0=constants["k0"],
                   overlap_p=constants["overlap_p"], peaks=datasheet_peaks(gpu), tf32=bool(gpu.peak.get("tf32")),
                   band=dict(band), provenance=dict(provenance), tensor_ratio=ratio)


"""GPU time of one op (:func:`gpu_seconds`): pure functions of an :class:`~.records.OpWork` and the
constants (:class:`~.constants.TimingModel`).

* **compute-bound ops** (mm/addmm/bmm/baddbmm/_grouped_mm, convolution and its backward, the
  fused SDPA kernels by backend): ``t = launches * library_s + soft_max(compute, memory)`` with
  ``compute = FLOPs / (peak * eff * size * align)`` and ``memory = bytes / bandwidth``.  ``peak``
  is the datasheet peak (``hardware.GPU.peak``) of the precision the kernel runs in: fp32 GEMMs
  on the fp32 pipes (``torch.backends.cuda.matmul.allow_tf32`` is False by default), cuDNN
  convolutions in TF32 (``torch.backends.cudnn.allow_tf32`` is True), bf16/fp16 on tensor cores,
  grouped convolutions on the CUDA cores (fp32, or packed bf16/fp16 at twice that); depthwise ones at the
  rate measured for their backend, dtype, stride and kernel size (:mod:`.depthwise`).  ``eff`` is the achieved
  fraction per op family and precision (and backend for fp32 attention; backward kernels x ``attention_backward``
  / ``conv_backward``); bf16 / fp16 attention kernels at their measured efficiency by backend, direction, head
  size and sequence (:mod:`.attention`), float8 GEMMs at the bf16 one times their variant's ratio
  (:mod:`.float8`).  ``size = rows/(rows + fill_rows) * m/(m + n0) * n/(n + n0) * k/(k + k0)``
  (rows = batch * m * n output elements): small GEMMs fill too few tiles, narrow ones pad their
  tiles, short inner loops do not amortise prologue and epilogue.  ``align = (a / 16) ** gamma``
  for tensor-core kernels whose leading dimensions are only ``a``-byte aligned (GPT-2's 50,257
  vocabulary: 2 bytes; cuBLAS needs 16 for its fastest loads); convolutions use channels per
  group.  Causal attention does the score blocks on and below the diagonal only.
  ``soft_max(a, b) = (a**p + b**p) ** (1/p)`` is how far a kernel overlaps its math and its
  memory traffic (p = 1: not at all; p -> inf: the roofline's max).
* **memory-bound ops** (norms, activations, softmax, elementwise, casts, reductions, embedding,
  losses, copies, the foreach optimizer kernels): ``t = launches * launch_s + bytes /
  (bandwidth * memory_eff[class])`` with bytes = distinct bytes read + written (a broadcast
  operand once; a gather reads the rows it returns) and classes elementwise (1), reduction,
  norm and ATen's own batch norm.  Foreach ops launch one kernel per ``multi_tensor_apply`` chunk.
* **recurrent ops** (``_cudnn_rnn``): the input projections as GEMMs over all time steps, then
  ``steps`` dependent steps (time steps x layers), each one recurrent GEMM [batch, hidden] @
  [hidden, gates * hidden] at the GEMM constants (cuDNN fuses the gate math into it).  There is
  no recurrent constant of its own: the only recurrent case is not needed to fit the model.
* **views, metadata, the optimizer's host-side scalar reads**: no GPU time.

The fit script (``benchmarks/fit_timing.py``) vectorises these formulas and must keep them
equal (``tests/test_timing.py`` checks them against each other).
"""

from __future__ import annotations

from . import attention, depthwise, float8
from .constants import TimingModel
from .geometry import causal_fraction
from .optable import ATTENTION, CONV, MATMUL, MEMORY, NO_KERNEL, RNN, TENSOR_CORE_BYTES
from .records import OpWork

# -- per-op times ------------------------------------------------------------------------------


def precision_of(w: OpWork, matmul_tf32: bool = False, conv_tf32: bool = True) -> tuple[str, str]:
    """(peak key, efficiency key) of a compute op: which datasheet peak and which achieved fraction.

    fp32 GEMMs run on the fp32 pipes unless ``torch.backends.cuda.matmul.allow_tf32`` (default
    False); cuDNN convolutions run TF32 (``torch.backends.cudnn.allow_tf32``, default True) on a GPU
    with TF32 tensor cores (``conv_tf32``: ``TimingModel.tf32``), else on the fp32 pipes.
    Grouped (depthwise) convolutions are not GEMMs: cuDNN runs them as direct convolutions on the
    CUDA cores, timed against the CUDA cores' peak of their dtype (fp32, or ``half_cuda``: packed
    bf16 / fp16, twice the fp32 rate) with their own efficiency ("grouped").
    """
    dtype = w.dtype or "float32"
    if dtype.startswith("float8"):
        # torchao's float8 GEMMs (torch._scaled_mm): the float8 tensor-core peak, at their variant's fitted
        # fraction (timing.float8; gpu_seconds reads it)
        return "fp8", "fp8"
    if w.kind == CONV and w.batch > 1:
        return ("half_cuda" if dtype in ("bfloat16", "float16") else "fp32"), "grouped"
    if dtype in ("bfloat16", "float16"):
        return ("bf16" if dtype == "bfloat16" else "fp16"), "half"
    if (w.kind == CONV and conv_tf32) or (w.kind == MATMUL and matmul_tf32):
        return "tf32", "tf32"
    return "fp32", "fp32"


def peak_of(model: TimingModel, key: str) -> float:
    """The model's peak FLOP/s for ``key``; float8 from the hardware table when the constants lack it (the
    bf16 rate on a GPU without float8 tensor cores, where torchao would not run)."""
    peak = model.peaks.get(key)
    if peak:
        return peak
    if key == "fp8":
        from ..hardware import lookup

        try:
            peak = lookup(model.gpu).peak_flops("fp8")
        except Exception:  # a GPU described by the user's own file: no table entry
            peak = None
        return peak or model.peaks["bf16"]
    return model.peaks[key]


def efficiency_key(w: OpWork, precision: str) -> str:
    if w.kind == ATTENTION:
        return f"attention.{w.backend}.{precision}"
    if w.kind == CONV:
        return f"conv.{precision}"
    return f"matmul.{precision}"


def size_factor(rows: float, m: float, n: float, k: float, fill_rows: float, n0: float, k0: float) -> float:
    """Efficiency lost to small GEMMs: too few output elements (``rows`` = batch * m * n) to fill
    the GPU with tiles, narrow m or n (tiles padded or shrunk), and short inner loops (k) whose
    prologue and epilogue do not amortise.  Each factor is d / (d + d0): 1/2 at d = d0."""
    return rows / (rows + fill_rows) * m / (m + n0) * n / (n + n0) * k / (k + k0)


PAD_LIMIT = 64  # the smallest m and n of the fp32 GEMMs the GPUs without steps of their own are fitted on


def padded_size(batch: int, m: int, n: int, k: int, fill_rows: float, n0: float, k0: float) -> float:
    """:func:`size_factor` made monotone in ``m`` and ``n`` below :data:`PAD_LIMIT`: a GEMM with fewer rows (or
    columns) runs no slower than the same GEMM padded to more, which the library can always run, so its size
    factor is at least ``size_factor(padded) x m / m_padded`` (the padded GEMM does ``m_padded / m`` times the
    work).  The fitted factor, extrapolated below the fitted shapes (m, n >= 64 in the public kernels), made a
    one-row GEMM (a decode step's) up to 5x slower than a 16-row one with the same weight (2.1 against 0.44 ms on an
    L4 for 1 x 11008 @ 11008 x 4096 in bf16) where its weight's bytes bound both."""
    best = size_factor(batch * m * n, m, n, k, fill_rows, n0, k0)
    if m >= PAD_LIMIT and n >= PAD_LIMIT:
        return best
    pads_m = [m] + [p for p in (2, 4, 8, 16, 32, 64) if m < p <= PAD_LIMIT]
    pads_n = [n] + [p for p in (2, 4, 8, 16, 32, 64) if n < p <= PAD_LIMIT]
    for pm in pads_m:
        for pn in pads_n:
            best = max(best, size_factor(batch * pm * pn, pm, pn, k, fill_rows, n0, k0) * (m / pm) * (n / pn))
    return best


def align_factor(align: float, gamma: float) -> float:
    """Tensor-core efficiency of misaligned operands: 16-byte loads need 16-byte aligned leading
    dimensions; narrower ones (8, 4, 2 bytes) issue proportionally more load instructions."""
    return (align / TENSOR_CORE_BYTES) ** gamma


def compute_seconds(flops: float, peak: float, eff: float, size: float, align: float) -> float:
    """FLOPs over the achieved rate: peak x efficiency x size factor x alignment factor."""
    return flops / (peak * eff * size * align)


def soft_max_p(a, b, p):
    """``(a**p + b**p) ** (1/p)`` (arithmetic only: floats or tensors)."""
    return (a ** p + b ** p) ** (1.0 / p)


def gemm_seconds(model: TimingModel, peak_key: str, eff_key: str, batch: int, m: int, n: int, k: int,
                 align: int = TENSOR_CORE_BYTES, nbytes: int | None = None) -> float:
    """One GEMM (or a batch of them) on the GPU: the library floor plus compute and memory."""
    # [batch, m, k] @ [batch, k, n]: 2*batch*m*n*k FLOPs; operands and result once
    flops = 2 * batch * m * n * k
    item = 2 if eff_key == "half" else 4
    nbytes = item * batch * (m * k + k * n + m * n) if nbytes is None else nbytes
    size = padded_size(batch, m, n, k, model.fill_rows, model.n0, model.k0)
    align_f = align_factor(align, model.align_gamma) if eff_key != "fp32" else 1.0
    compute = compute_seconds(flops, peak_of(model, peak_key), model.eff[f"matmul.{eff_key}"], size, align_f)
    return model.library_s + soft_max_p(compute, nbytes / model.bandwidth, model.overlap_p)


def rnn_seconds(w: OpWork, model: TimingModel, matmul_tf32: bool = False) -> float:
    """A cuDNN recurrent layer stack: the input projections as GEMMs over all time steps, then
    ``steps`` dependent steps, each a recurrent GEMM [batch, hidden] @ [hidden, gates * hidden]
    with the gate math fused in.  Backward: input gradients and weight gradients as big GEMMs,
    and one recurrent GEMM per step."""
    peak_key, eff_key = precision_of(w, matmul_tf32, model.tf32)
    layers = max(1, w.batch)
    t_steps = w.steps // layers  # time steps per layer
    rows = t_steps * w.m  # T * B rows of the input projection
    # recurrent part of the forward FLOPs: every step, [B, H] @ [H, G*H]
    recurrent = 2 * w.m * w.k * w.n * w.steps
    forward = w.flops // (2 if w.backward else 1)
    k_in = max(1, (forward - recurrent) // max(1, 2 * rows * w.n * layers))  # mean input width
    big = layers * gemm_seconds(model, peak_key, eff_key, 1, rows, w.n, k_in)
    # cuDNN fuses the gate math into its per-step kernels: one GEMM-class kernel per step
    step = gemm_seconds(model, peak_key, eff_key, 1, w.m, w.n, w.k)
    if w.backward:
        # dX and dW_ih as big GEMMs, dW_hh over all steps as one GEMM [G*H, T*B] @ [T*B, H]
        big = 2 * big + layers * gemm_seconds(model, peak_key, eff_key, 1, w.n, w.k, rows)
    return big + w.steps * step


def gpu_seconds(w: OpWork, model: TimingModel, matmul_tf32: bool = False, conv_tf32: bool | None = None) -> float:
    """GPU time of one op when the GPU is busy (kernels back to back).  ``conv_tf32``: whether cuDNN may
    run fp32 convolutions in TF32 (default: the GPU has TF32, ``model.tf32``, as torch's default allows)."""
    if w.kind in NO_KERNEL:
        return 0.0
    if w.kind == MEMORY:
        bandwidth = model.bandwidth * model.memory_eff.get(w.memory_class, 1.0)
        t = w.launches * model.launch_s + (w.bytes - w.streamed) / bandwidth + w.streamed / model.bandwidth
        return t * float8.scaling_factor() if w.subclass else t  # (an eager float8 layer's scaling and casts)
    if w.kind == RNN:
        return rnn_seconds(w, model, matmul_tf32)
    if w.kind == CONV and w.depthwise:
        dw_eff = depthwise.efficiency(w.depthwise, w.dtype, w.backward)
        if dw_eff is not None:
            # measured kernels (timing.depthwise): the rate is the whole op's, its launches and traffic included
            return max(w.launches * model.library_s, w.flops / (peak_of(model, "fp32") * dw_eff))
    peak_key, precision = precision_of(w, matmul_tf32, model.tf32 if conv_tf32 is None else conv_tf32)
    if precision == "fp8":
        # a float8 GEMM: the bf16 GEMMs' fraction times its variant's measured ratio (timing.float8)
        eff = model.eff["matmul.half"] * (float8.relative(w.backend) or 1.0)
    else:
        eff = model.eff[efficiency_key(w, precision)]
    flops = float(w.flops)
    if w.kind == ATTENTION:
        # score blocks above the diagonal are skipped by causal kernels
        flops *= causal_fraction(w.m, w.n) if w.causal else 1.0
        measured = attention.efficiency(w.backend, w.backward, w.k, w.m) if precision == "half" else None
        # bf16 / fp16: the kernel's efficiency measured on the H100's chip (timing.attention) at this GPU's sustained
        # tensor-core rate (a lower power limit throttles it as it does the GEMMs); fp32: the fitted one
        eff = measured * model.tensor_ratio if measured else eff * (model.attention_backward if w.backward else 1.0)
        size = 1.0
    else:
        size = (padded_size(w.batch, w.m, w.n, w.k, model.fill_rows, model.n0, model.k0) if w.kind == MATMUL
                else size_factor(w.batch * w.m * w.n, w.m, w.n, w.k, model.fill_rows, model.n0, model.k0))
        if w.kind == CONV and w.backward:
            eff *= model.conv_backward
    align = align_factor(w.align, model.align_gamma) if precision not in ("fp32", "grouped") else 1.0
    compute = compute_seconds(flops, peak_of(model, peak_key), eff, size, align)
    return w.launches * model.library_s + soft_max_p(compute, w.bytes / model.bandwidth, model.overlap_p)

"""Step time of a training step on a GPU: a per-op time model calibrated on measured kernels.

API (for wiring into ``estimate --gpu``, ``plan`` and ``validate``)::

    from estimator.timing import step_time, load_model, OpWork

    st = step_time(report, gpu)                 # a Report, a Capture, OpNodes or OpWork records
    st.total, st.forward, st.backward, st.optimizer       # seconds
    st.calibrated, st.source                    # measured constants for this GPU, or extrapolated
    st.achieved_flops, st.mfu                   # model FLOP/s and model FLOPs utilisation
    st.top(10)                                  # the ops that take the most GPU time
    model = load_model(gpu)                     # the constants (TimingModel) for a hardware.GPU

    step_time(obj, gpu="H100-SXM", model=None, *, matmul_tf32=False, steady_state=True) -> StepTime
    works_of(obj, steady_state=True) -> list[OpWork]   # a Report / Capture / OpNodes as OpWork records
    OpWork.from_node(node) -> OpWork | None     # one op of this project's capture
    OpWork.from_record(rec, mem=None, causal=False) -> OpWork   # one op of the CUDA reference data
    gpu_seconds(work, model) -> float           # the kernel time of one op (GPU busy)
    cpu_seconds(work, model) -> float           # the host time to issue one op (dispatch, launch)
    simulate(works, model) -> StepTime          # the two timelines

Wiring: ``step_time(report, gpu).total`` is the step time that ``plan`` now takes from its
roofline (``plan.roofline``); per-phase seconds are ``.forward/.backward/.optimizer``; ``validate``
can put ``.total`` beside a measured step.  ``OpWork.from_node`` reads shapes from the nodes
(``meta["spec"]`` of the node and of its inputs), not the tally, so it works on any capture; the
FLOPs it finds equal the rules' (``tests/test_timing.py``).  Check ``.calibrated`` before
reporting a time as measured-quality: only the H100-SXM is calibrated.

The model (pure functions of an :class:`OpWork`, one op at a time):

* **compute-bound ops** (mm/addmm/bmm/baddbmm/_grouped_mm, convolution and its backward, the
  fused SDPA kernels by backend): ``t = launches * library_s + soft_max(compute, memory)`` with
  ``compute = FLOPs / (peak * eff * size * align)`` and ``memory = bytes / bandwidth``.  ``peak``
  is the datasheet peak (``hardware.GPU.peak``) of the precision the kernel runs in: fp32 GEMMs
  on the fp32 pipes (``torch.backends.cuda.matmul.allow_tf32`` is False by default), cuDNN
  convolutions in TF32 (``torch.backends.cudnn.allow_tf32`` is True), bf16/fp16 on tensor cores,
  grouped (depthwise) convolutions on the fp32 pipes.  ``eff`` is the achieved fraction per op
  family and precision (and backend for attention; backward kernels x ``attention_backward`` /
  ``conv_backward``).  ``size = rows/(rows + fill_rows) * m/(m + n0) * n/(n + n0) * k/(k + k0)``
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
* **views, metadata, the optimizer's host-side scalar reads**: host time only.
* **host**: every op costs ``cpu_view[phase]`` (the dispatcher and autograd; in the forward the
  model's Python around it as well); an op with kernels adds what it does on the host itself,
  ``cpu_inop[op name]`` (allocation, TensorIterator set-up, cuBLAS heuristics, cuDNN plans, the
  launch: measured per op name on the H100's host, ``cpu_inop_class`` for names not measured);
  a foreach op adds ``cpu_tensor`` per tensor of its lists (the optimizer's per-parameter Python).
  A step is two timelines: the host issues op *i* at ``cpu_i = cpu_{i-1} + cpu_seconds(op_i)``;
  the GPU runs it from ``max(cpu_i, gpu_{i-1})`` for ``gpu_seconds(op_i)``; an op that reads a
  GPU value on the host (``.item()`` outside the optimizer, ``nonzero``, the fp32
  ``_grouped_mm`` fallback that copies its offsets) first waits for the GPU.  The step ends when
  both are done.  So small steps are launch-bound (Llama-small at batch 1 and 4 take the same
  34 ms on an H100) and big ones are the sum of their kernels.

The constants are fitted (``benchmarks/fit_timing.py``) on real H100 measurements and stored
with their provenance in ``estimator/data/timing_h100.json``.  For a GPU without measurements,
:func:`load_model` scales the H100 figures: efficiencies are fractions of the datasheet peaks and
the bandwidth a fraction of the datasheet bandwidth, so they carry over; floors and host costs
are kept (the host is the same kind of machine).  Such a model says ``calibrated=False`` and its
``source`` says "extrapolated".

MFU, as in PaLM (Chowdhery et al. 2022, appendix B): model FLOPs per second over the peak,
``MFU = model_flops / (step_seconds * peak)``, where model FLOPs are the FLOPs of the forward
and backward passes as counted by this project's rules (a multiply-add is 2 FLOPs, as
``torch.utils.flop_counter``; attention included, recomputation excluded) and the peak is the
datasheet dense peak of the dtype the matmuls run in (``hardware.GPU.peak``).

Why one file of this length: the per-op work records, the formulas and the two timelines are
pure functions of each other that the fit script (``benchmarks/fit_timing.py``) vectorises and
must keep equal (tests/test_timing.py checks them against each other); the constants are data
(``estimator/data/timing_h100.json``).
"""

from __future__ import annotations

import json
import math
import operator
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from math import prod
from typing import Any, Iterable, Mapping, Sequence

from .hardware import GPU, lookup as lookup_gpu
from .rules.attention import sdpa_backward_flops, sdpa_flops
from .rules.conv import conv_flops
from .rules.matmul import grouped_mm_flops
from .rules.zero import VIEWS

# -- kinds of work ---------------------------------------------------------------------

MATMUL = "matmul"  # cuBLAS GEMMs: mm, addmm, bmm, baddbmm, _grouped_mm
CONV = "conv"  # cuDNN convolutions, forward and backward
ATTENTION = "attention"  # fused SDPA kernels (cudnn, efficient, flash), forward and backward
RNN = "rnn"  # cuDNN recurrent layers
MEMORY = "memory"  # every other kernel: bandwidth-bound
VIEW = "view"  # views, metadata, allocation without a kernel: host time only
HOST = "host"  # host-side work with no kernel (the optimizer's scalar reads, profiler records)
SYNC = "sync"  # reads a GPU value on the host: waits for the GPU
KINDS = (MATMUL, CONV, ATTENTION, RNN, MEMORY, VIEW, HOST, SYNC)
COMPUTE_KINDS = (MATMUL, CONV, ATTENTION, RNN)
NO_KERNEL = (VIEW, HOST, SYNC)

PHASES = ("forward", "backward", "optimizer")

# -- op tables (names without the "aten." prefix and the overload) ---------------------------

_MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "_grouped_mm", "_addmm_activation", "_scaled_mm",
                         "_int_mm", "addbmm"})
_CONV_OPS = frozenset({"convolution", "_convolution", "cudnn_convolution", "cudnn_convolution_transpose",
                       "convolution_overrideable"})
_CONV_BACKWARD_OPS = frozenset({"convolution_backward", "convolution_backward_overrideable"})
# SDPA kernels: op -> (backend, is_backward, layout of q/k/v: "bhsd" or "bshd")
_ATTENTION_OPS = {
    "_scaled_dot_product_cudnn_attention": ("cudnn", False, "bhsd"),
    "_scaled_dot_product_cudnn_attention_backward": ("cudnn", True, "bhsd"),
    "_scaled_dot_product_efficient_attention": ("efficient", False, "bhsd"),
    "_scaled_dot_product_efficient_attention_backward": ("efficient", True, "bhsd"),
    "_efficient_attention_forward": ("efficient", False, "bshd"),
    "_efficient_attention_backward": ("efficient", True, "bshd"),
    "_scaled_dot_product_flash_attention": ("flash", False, "bhsd"),
    "_scaled_dot_product_flash_attention_backward": ("flash", True, "bhsd"),
    "_flash_attention_forward": ("flash", False, "bshd"),
    "_flash_attention_backward": ("flash", True, "bshd"),
    # what the capture records when SDPA runs the CPU kernel: timed as the flash kernel it stands for
    "_scaled_dot_product_flash_attention_for_cpu": ("flash", False, "bhsd"),
    "_scaled_dot_product_flash_attention_for_cpu_backward": ("flash", True, "bhsd"),
}
_RNN_OPS = frozenset({"_cudnn_rnn", "_cudnn_rnn_backward", "mkldnn_rnn_layer", "mkldnn_rnn_layer_backward"})
# ops with no kernel: views and metadata (rules/zero.py's list), allocation without a fill,
# profiler records
_VIEW_OPS = frozenset(VIEWS) | frozenset({
    "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
    "_record_function_enter", "_record_function_enter_new", "_record_function_exit", "_assert_async",
    "_assert_scalar", "_assert_tensor_metadata", "record_stream", "_version", "is_same_size",
})
# ops whose result the host reads (a device -> host copy and a wait)
_SYNC_OPS = frozenset({"_local_scalar_dense", "item", "nonzero", "masked_select", "unique", "_unique",
                       "_unique2", "unique_consecutive", "unique_dim", "is_nonzero", "equal"})
# cuDNN calls besides the compute kinds (host: descriptor set-up and plan lookup)
_LIBRARY_OPS = frozenset({"cudnn_batch_norm", "cudnn_batch_norm_backward"})
# kernels per call where more than one (launch floor); foreach ops: see foreach_launches
_LAUNCHES = {
    "native_layer_norm_backward": 2, "native_batch_norm_backward": 2, "cudnn_batch_norm_backward": 2,
    "native_group_norm_backward": 2, "_fused_rms_norm_backward": 2, "embedding_dense_backward": 3,
    "nll_loss_backward": 2, "sort": 2, "topk": 2, "index_put": 2, "_index_put_impl_": 2,
}
# memory-bound kernels by how close they stream at the bandwidth: "elementwise" (one pass, the
# reference), "reduction" (reductions, softmax, losses, pooling, scatters and sorts: a reduction
# tree or atomics), "norm" (fused normalisations: layer/RMS/group norm, cuDNN batch norm: two
# passes over the input in backward) and "batch_norm_native" (ATen's own batch norm kernels,
# what autocast runs for bf16 inputs with fp32 weights: per-channel reductions over N*H*W)
_MEMORY_CLASS = {
    **{op: "reduction" for op in (
        "sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "std", "std_mean", "norm",
        "linalg_vector_norm", "prod", "logsumexp", "argmax", "argmin", "all", "any", "_softmax", "_log_softmax",
        "_safe_softmax", "_softmax_backward_data", "_log_softmax_backward_data", "nll_loss_forward",
        "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward", "max_pool2d_with_indices",
        "max_pool2d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward", "_adaptive_avg_pool2d",
        "_adaptive_avg_pool2d_backward", "adaptive_max_pool2d", "adaptive_max_pool2d_backward", "cumsum",
        "sort", "topk", "embedding_dense_backward", "index_put", "_index_put_impl_", "scatter_add",
        "index_add", "histc", "bincount", "_foreach_norm")},
    **{op: "norm" for op in (
        "native_layer_norm", "native_layer_norm_backward", "cudnn_batch_norm", "cudnn_batch_norm_backward",
        "native_group_norm", "native_group_norm_backward", "_fused_rms_norm", "_fused_rms_norm_backward",
        "miopen_batch_norm", "miopen_batch_norm_backward")},
    **{op: "batch_norm_native" for op in (
        "native_batch_norm", "native_batch_norm_backward", "_native_batch_norm_legit",
        "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional")},
}
MEMORY_CLASSES = ("elementwise", "reduction", "norm", "batch_norm_native")
# gathers: they read the rows they return, not the whole table
_GATHER_OPS = frozenset({"embedding", "index", "_unsafe_index", "index_select", "gather", "take",
                         "take_along_dim"})

# multi_tensor_apply (ATen/native/cuda/MultiTensorApply.cuh): tensors per launch by list depth,
# blocks per launch, elements per block
_FOREACH_TENSORS = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}
_FOREACH_BLOCKS = 320
_FOREACH_CHUNK = 65536

_TENSOR_CORE_BYTES = 16  # cuBLAS/cuDNN tensor-core kernels want 16-byte aligned leading dimensions

_ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4, "int16": 2,
             "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "complex64": 8,
             "complex128": 16, "uint16": 2, "uint32": 4, "uint64": 8}


# -- math helpers (pure functions of shapes) -------------------------------------------------


def itemsize(dtype: str) -> int:
    """Bytes per element of a dtype named as in torch without the prefix ("bfloat16")."""
    return _ITEMSIZE.get(dtype, 4)


def numel(shape: Sequence[int]) -> int:
    return prod(shape) if shape else 1


def footprint(shape: Sequence[int], stride: Sequence[int] | None) -> int:
    """Distinct elements a strided tensor addresses: broadcast (stride 0) dims count once."""
    n = numel(shape)
    if stride is None or n == 0:
        return n
    # the span of the addresses: 1 + sum((size - 1) * stride); at most numel (overlap-free views)
    span = 1 + sum((s - 1) * abs(st) for s, st in zip(shape, stride))
    return min(n, span)


def alignment_bytes(dims: Iterable[int], item: int) -> int:
    """The largest power of two <= 16 that divides every leading dimension, in bytes."""
    # a leading dimension of d elements is aligned to the lowest set bit of d * itemsize
    align = _TENSOR_CORE_BYTES
    for d in dims:
        b = d * item
        if b > 0:
            align = min(align, b & -b)
    return align


def gemm_dims(a_shape: Sequence[int], b_shape: Sequence[int]) -> tuple[int, int, int, int]:
    """(batch, m, n, k) of ``a @ b`` for [m, k] @ [k, n] or [b, m, k] @ [b, k, n]."""
    # [.., m, k] @ [.., k, n] -> [.., m, n]; leading dims are the batch
    batch = numel(a_shape[:-2])
    return batch, a_shape[-2], b_shape[-1], a_shape[-1]


def grouped_gemm_dims(a_shape, b_shape, out_shape) -> tuple[int, int, int, int]:
    """(groups, rows per group, n, k) of ``_grouped_mm``, rows spread evenly over the groups."""
    if len(a_shape) == 2 and len(b_shape) == 2:
        # (K, T) @ (T, N) split over T into G groups -> (G, K, N): G GEMMs [K, T/G] @ [T/G, N]
        g = out_shape[0]
        return g, a_shape[0], b_shape[1], max(1, a_shape[1] // g)
    if len(a_shape) == 2:
        # (T, K) @ (G, K, N) -> (T, N): G GEMMs [T/G, K] @ [K, N]
        g = b_shape[0]
        return g, max(1, a_shape[0] // g), b_shape[-1], a_shape[1]
    # (G, M, K) @ (G, K, N) -> (G, M, N)
    return a_shape[0], a_shape[1], b_shape[-1], a_shape[-1]


def conv_gemm_dims(x_shape, w_shape, out_shape) -> tuple[int, int, int, int]:
    """(groups, m, n, k) of a convolution as an implicit GEMM (cuDNN's view of it)."""
    # weight [C_out, C_in/g, *kernel]; groups g = C_in / (C_in/g); rows = N * output positions
    groups = max(1, x_shape[1] // w_shape[1]) if len(x_shape) == len(w_shape) else 1
    rows = out_shape[0] * numel(out_shape[2:]) if len(x_shape) == len(w_shape) else numel(out_shape[1:])
    # per group: [rows, C_in/g * prod(kernel)] @ [C_in/g * prod(kernel), C_out/g]
    return groups, rows, max(1, w_shape[0] // groups), numel(w_shape[1:])


def causal_fraction(s_q: int, s_k: int, block: int = 128) -> float:
    """Fraction of the score blocks a causal attention kernel computes (the rest are masked out)."""
    # square case: blocks on or below the diagonal of an n x n grid: n (n + 1) / 2 of n^2
    n = max(1, math.ceil(min(s_q, s_k) / block))
    return (n + 1) / (2 * n)


def foreach_launches(numels: Sequence[int], depth: int) -> int:
    """Kernel launches of one multi_tensor_apply over tensors of ``numels`` with ``depth`` lists."""
    # a launch takes up to _FOREACH_TENSORS[depth] tensors and _FOREACH_BLOCKS chunks of 64k elements
    if not numels:
        return 0
    per_launch = _FOREACH_TENSORS.get(depth, 30)
    chunks = sum(max(1, math.ceil(n / _FOREACH_CHUNK)) for n in numels)
    return max(math.ceil(len(numels) / per_launch), math.ceil(chunks / _FOREACH_BLOCKS))


def soft_max(a: float, b: float, p: float) -> float:
    """``(a**p + b**p) ** (1/p)``: between a + b (p = 1) and max(a, b) (p -> inf)."""
    hi = max(a, b)
    if hi <= 0.0:
        return 0.0
    return hi * ((a / hi) ** p + (b / hi) ** p) ** (1.0 / p)


def op_base(name: str) -> str:
    """``"aten.mm.default"`` -> ``"mm"``; ``"profiler._record_function_exit._RecordFunction"`` ->
    ``"_record_function_exit"``."""
    parts = name.split(".")
    return parts[1] if len(parts) >= 2 else parts[0]


def is_inplace(base: str) -> bool:
    return base.endswith("_") and not base.endswith("__")


# -- one op's work -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OpWork:
    """What one aten op asks of the GPU and of the host.

    ``flops`` follows the project's convention (a multiply-add is 2 FLOPs, as
    ``torch.utils.flop_counter``); ``bytes_read``/``bytes_written`` are distinct bytes (a
    broadcast operand once).  For compute kinds, ``batch, m, n, k`` is the GEMM the kernel runs
    (a convolution: its implicit GEMM per group; attention: batch x heads, s_q, s_kv, head dim;
    a recurrent layer: the per-step GEMM [batch, hidden] @ [hidden, gates * hidden]).
    """

    op: str
    phase: str
    kind: str
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    dtype: str | None = None
    batch: int = 1
    m: int = 0
    n: int = 0
    k: int = 0
    align: int = _TENSOR_CORE_BYTES  # bytes; < 16 when a GEMM leading dimension is misaligned
    backend: str = ""  # attention kernel (cudnn, efficient, flash)
    backward: bool = False
    causal: bool = False
    launches: int = 1  # kernels launched (0 for views)
    tensors: int = 0  # tensors in a foreach op's lists (host cost per tensor)
    steps: int = 0  # dependent recurrent steps (RNN)
    library: str = ""  # "cublas" or "cudnn": a library call (host cost of descriptors, heuristics, plans)
    sync: bool = False  # the host reads a device value (waits for the GPU) before it goes on
    memory_class: str = "elementwise"  # how a memory-bound kernel streams (see _MEMORY_CLASS)

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    # -- constructors --------------------------------------------------------------------------

    @classmethod
    def from_record(cls, rec: Mapping[str, Any], mem: Mapping[str, Any] | None = None,
                    causal: bool = False) -> "OpWork":
        """One op of the CUDA reference data (``timing/*.timing.json.gz`` ``ops`` entries).

        ``rec`` has ``op``, ``phase`` and ``in`` (``[shape, dtype]`` per tensor input, flattened
        in schema order); ``mem`` is the same op's entry of ``memory/*.json.gz`` (inputs with
        strides, ``out`` with ``[shape, dtype, stride, storage_bytes]``); without it the outputs
        are inferred where the FLOPs need them.  The records keep no non-tensor arguments, so
        SDPA's ``is_causal`` comes from the caller (the model definition).
        """
        name = rec["op"]
        base = op_base(name)
        phase = _phase(rec.get("phase", "forward"))
        ins = [(tuple(t[0]), t[1], tuple(t[2]) if len(t) > 2 else None)
               for t in (mem["in"] if mem is not None else rec["in"])]
        outs = [(tuple(t[0]), t[1], tuple(t[2]) if len(t) > 2 else None) for t in (mem or {}).get("out", [])]
        return _work(name, base, phase, ins, outs, causal, _RecordShapes(ins, outs))

    @classmethod
    def from_node(cls, node: Any) -> "OpWork | None":
        """One op of this project's capture (an :class:`~estimator.graph.OpNode`); None for
        placeholders and ``getitem`` bookkeeping."""
        if getattr(node, "op", None) != "call_function" or node.target is operator.getitem:
            return None
        target = node.target
        name = str(target)
        base = op_base(name) if "." in name else getattr(target, "__name__", name)
        phase = _phase(node.meta.get("phase", "forward"))
        ins, producers = _node_inputs(node)
        outs = [(tuple(s.shape), _dtype_name(s.dtype), None) for s in (node.meta.get("spec") or ()) if s is not None]
        causal = _node_causal(node)
        return _work(name, base, phase, ins, outs, causal, _NodeShapes(node, ins, outs, producers))


def _phase(phase: str) -> str:
    return "forward" if phase in ("loss", "") else phase


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


class _RecordShapes:
    """Shapes of a reference record's tensors, in flattened schema order."""

    def __init__(self, ins, outs):
        self.ins, self.outs = ins, outs

    def a_transposed(self, index: int) -> bool:
        """Whether matrix input ``index`` is a column-major (transposed) view."""
        shape, _, stride = self.ins[index]
        return stride is not None and len(shape) >= 2 and shape[-2] > 1 and stride[-2] == 1 and shape[-1] > 1


class _NodeShapes:
    """Shapes of a captured node's tensors (no strides: transposition read off the producer)."""

    _TRANSPOSES = frozenset({"t", "transpose", "permute", "mT", "adjoint"})

    def __init__(self, node, ins, outs, producers):
        self.node, self.ins, self.outs, self.producers = node, ins, outs, producers

    def a_transposed(self, index: int) -> bool:
        prod_node = self.producers[index] if index < len(self.producers) else None
        target = getattr(prod_node, "target", None)
        return target is not None and op_base(str(target)) in self._TRANSPOSES


def _node_inputs(node) -> tuple[list, list]:
    """Tensor inputs of a captured node in schema order, as (shape, dtype, None), and their
    producers; an input made by ``expand`` counts the expanded tensor's source elements."""
    from .graph import OpNode

    ins, producers = [], []

    def visit(v):
        if isinstance(v, OpNode):
            spec = (v.meta.get("spec") or (None,))
            spec = spec[0] if len(spec) == 1 else None
            if v.target is operator.getitem and v.op == "call_function":
                spec = (v.meta.get("spec") or (None,))[0]
            if spec is None:
                return
            shape = tuple(spec.shape)
            stride = None
            if v.op == "call_function" and op_base(str(v.target)) in ("expand", "expand_as", "broadcast_to"):
                src = v.args[0] if v.args else None
                src_spec = (src.meta.get("spec") or (None,))[0] if isinstance(src, OpNode) else None
                if src_spec is not None:
                    # an expanded view addresses only its source's elements: stride 0 on broadcast dims
                    pad = len(shape) - len(src_spec.shape)
                    src_shape = (1,) * pad + tuple(src_spec.shape)
                    stride = tuple(0 if (s == 1 and d != 1) else 1 for s, d in zip(src_shape, shape))
                    stride = _dense_strides_masked(shape, stride)
            ins.append((shape, _dtype_name(spec.dtype), stride))
            producers.append(v)
        elif isinstance(v, (list, tuple)):
            for x in v:
                visit(x)
        elif isinstance(v, dict):
            for x in v.values():
                visit(x)

    for a in node.args:
        visit(a)
    for a in node.kwargs.values():
        visit(a)
    return ins, producers


def _dense_strides_masked(shape, mask) -> tuple[int, ...]:
    """Row-major strides of ``shape`` with the broadcast dims (mask 0) at stride 0."""
    strides, acc = [], 1
    for size, keep in zip(reversed(shape), reversed(mask)):
        strides.append(acc if keep else 0)
        if keep:
            acc *= size
    return tuple(reversed(strides))


def _node_causal(node) -> bool:
    is_causal = node.kwargs.get("is_causal")
    if is_causal is None:
        try:
            schema = node.target._schema
            for i, a in enumerate(schema.arguments):
                if a.name == "is_causal" and i < len(node.args):
                    is_causal = node.args[i]
        except AttributeError:
            return False
    return bool(is_causal)


def _kind_of(base: str, phase: str, ins) -> str:
    if base in _MATMUL_OPS:
        return MATMUL
    if base in _CONV_OPS or base in _CONV_BACKWARD_OPS:
        return CONV
    if base in _ATTENTION_OPS:
        return ATTENTION
    if base in _RNN_OPS:
        return RNN
    if base in ("_local_scalar_dense", "item") and phase == "optimizer":
        return HOST  # the optimizer's step counts live on the host (capturable=False): no device read
    if base in _SYNC_OPS:
        return SYNC
    if base in _VIEW_OPS:
        return VIEW
    if base.startswith("_foreach_") and ins and all(len(s) == 0 for s, _, _ in ins):
        return HOST  # foreach over the host-side step counts (AdamW's state_steps on the CPU)
    return MEMORY


def _bytes_of(t) -> int:
    shape, dtype, stride = t
    return footprint(shape, stride) * itemsize(dtype)


def _work(name, base, phase, ins, outs, causal, shapes) -> OpWork:
    """The work of one op from its tensor inputs and outputs ((shape, dtype, stride) triples)."""
    kind = _kind_of(base, phase, ins)
    if kind in (VIEW, HOST, SYNC):
        return OpWork(name, phase, kind, launches=0, sync=kind == SYNC)
    read = sum(_bytes_of(t) for t in ins)
    written = sum(_bytes_of(t) for t in outs)
    dtype = next((d for _, d, _ in ins if d.startswith(("float", "bfloat", "complex"))),
                 outs[0][1] if outs else None)
    if base in _GATHER_OPS and ins and outs:
        # a gather reads the rows it returns (and the indices), not the whole table
        read = min(read, _bytes_of(outs[0]) + sum(_bytes_of(t) for t in ins[1:]))
    if base in ("nll_loss_forward", "nll_loss2d_forward") and len(ins) >= 2:
        # reads one log-probability per target (a gather), not the whole [N, C] input
        read = sum(_bytes_of(t) for t in ins[1:]) + numel(ins[1][0]) * itemsize(ins[0][1])
    if base in ("nll_loss_backward", "nll_loss2d_backward") and outs:
        # zero-fills grad_input [N, C] and scatters one value per target: writes it, reads the targets
        read = sum(_bytes_of(t) for i, t in enumerate(ins) if i != 1)
    if base.startswith("_foreach_"):
        return _foreach_work(name, base, phase, ins, outs, dtype)
    if is_inplace(base) and not outs and ins:
        written = _bytes_of(ins[0])
    launches = _LAUNCHES.get(base, 1)
    common = dict(bytes_read=read, bytes_written=written, dtype=dtype)
    if kind == MATMUL:
        return _matmul_work(name, base, phase, ins, outs, shapes, common)
    if kind == CONV:
        return _conv_work(name, base, phase, ins, outs, common)
    if kind == ATTENTION:
        return _attention_work(name, base, phase, ins, outs, causal, common)
    if kind == RNN:
        return _rnn_work(name, base, phase, ins, outs, common)
    return OpWork(name, phase, MEMORY, launches=launches, library="cudnn" if base in _LIBRARY_OPS else "",
                  memory_class=_MEMORY_CLASS.get(base, "elementwise"), **common)


def _matmul_work(name, base, phase, ins, outs, shapes, common) -> OpWork:
    # operands in schema order: mm(self, mat2), bmm(self, mat2), addmm(self=bias, mat1, mat2),
    # baddbmm(self, batch1, batch2), _grouped_mm(self, mat2, offs?, bias?)
    ia = 1 if base in ("addmm", "baddbmm", "_addmm_activation", "addbmm") else 0
    a, b = ins[ia][0], ins[ia + 1][0]
    dtype = ins[ia][1]
    launches, sync = 1, False
    if base == "_grouped_mm":
        out_shape = outs[0][0] if outs else _grouped_out_shape(a, b)
        batch, m, n, k = grouped_gemm_dims(a, b, out_shape)
        # (T, K) @ (G, K, N): 2*T*K*N; (K, T) @ (T, N) per group: 2*K*T*N
        flops = grouped_mm_flops(a, b, out_shape)
        if dtype != "bfloat16":
            # only bf16 has a grouped kernel (CUTLASS, sm90+); other dtypes take ATen's fallback,
            # which copies the group offsets to the host (a sync) and runs one mm per group
            launches, sync = batch, True
    else:
        batch, m, n, k = gemm_dims(a, b)
        # [batch, m, k] @ [batch, k, n]: one multiply-add per (batch, m, n, k)
        flops = 2 * batch * m * n * k
    # leading dims: C's n, A's k (or m when A is a transposed view), B's n or k
    lead = [n, k] + ([m] if shapes.a_transposed(ia) else [])
    align = alignment_bytes(lead, itemsize(dtype))
    return OpWork(name, phase, MATMUL, flops=flops, batch=batch, m=m, n=n, k=k, align=align,
                  launches=launches, sync=sync, library="cublas", **{**common, "dtype": dtype})


def _grouped_out_shape(a, b):
    if len(a) == 2 and len(b) == 2:
        return (1, a[0], b[1])
    return (a[0], b[-1]) if len(a) == 2 else (a[0], a[1], b[-1])


def _conv_work(name, base, phase, ins, outs, common) -> OpWork:
    if base in _CONV_BACKWARD_OPS:
        # convolution_backward(grad_output, input, weight, ...) -> (grad_input?, grad_weight?, grad_bias?)
        g, x, w = ins[0][0], ins[1][0], ins[2][0]
        dtype = ins[0][1]
        grads = [o[0] for o in outs]
        # one forward's FLOPs per requested gradient: grad_input has x's shape, grad_weight w's
        n_grads = int(x in grads) + int(w in grads) if grads else 2
        per = conv_flops(x, w, g)
        batch, m, n, k = conv_gemm_dims(x, w, g)
        launches = max(1, n_grads + int(len(grads) > n_grads))
        # channels per group are the contiguous (NHWC) GEMM dimensions cuDNN's kernels load
        align = alignment_bytes([x[1] // batch if len(x) > 1 else 1, n], itemsize(dtype))
        return OpWork(name, phase, CONV, flops=per * n_grads, batch=batch, m=m, n=n, k=k, align=align, backward=True,
                      launches=launches, library="cudnn", **{**common, "dtype": dtype})
    # convolution(input, weight, bias?, ...) -> out
    x, w = ins[0][0], ins[1][0]
    out = outs[0][0] if outs else None
    if out is None:
        raise ValueError(f"{name}: the output shape is needed for the FLOPs (pass the memory record)")
    batch, m, n, k = conv_gemm_dims(x, w, out)
    # channels per group (C_in/g, C_out/g) are the contiguous GEMM dimensions (NHWC kernels)
    align = alignment_bytes([w[1], n], itemsize(ins[0][1]))
    # 2 * N * prod(out spatial) * weight.numel (rules/conv.py)
    return OpWork(name, phase, CONV, flops=conv_flops(x, w, out), batch=batch, m=m, n=n, k=k, align=align,
                  library="cudnn", **{**common, "dtype": ins[0][1]})


def _attention_work(name, base, phase, ins, outs, causal, common) -> OpWork:
    backend, backward, layout = _ATTENTION_OPS[base]
    # forward: (query, key, value, ...); backward: (grad_out, query, key, value, ...)
    q, k, v = (t[0] for t in ins[1:4]) if backward else (t[0] for t in ins[0:3])
    if layout == "bshd":
        # [b, s, h, d] -> [b, h, s, d]
        q, k, v = ((s[0], s[2], s[1], s[3]) for s in (q, k, v))
    # forward: Q @ K^T and P @ V (4*b*h*s_q*s_k*d); backward: five such products
    flops = sdpa_backward_flops(q, q, k, v) if backward else sdpa_flops(q, k, v)
    dtype = ins[1 if backward else 0][1]
    b, h, s_q, d = q
    s_k = k[2]
    launches = 2 if backward else 1
    return OpWork(name, phase, ATTENTION, flops=flops, batch=b * h, m=s_q, n=s_k, k=d, backend=backend,
                  backward=backward, causal=causal, launches=launches, library="cudnn" if backend == "cudnn" else "",
                  **{**common, "dtype": dtype})


def _rnn_work(name, base, phase, ins, outs, common) -> OpWork:
    backward = base.endswith("_backward")
    dtype = ins[0][1]
    x = ins[0][0]
    if base.startswith("mkldnn"):
        # mkldnn_rnn_layer(input, W_ih, W_hh, b_ih, b_hh, hx_, cx_, ...) and its backward
        # (input, W_ih, W_hh, b_ih, b_hh, hx_, cx_, ...): one layer in one direction per call
        w_ih, w_hh, hx = ins[1][0], ins[2][0], ins[5][0]
        batch, hidden = hx[-2], hx[-1]
        gates = numel(w_hh) // (hidden * hidden)
        # rows = T * B in either layout: the time steps are rows / B
        steps = numel(x[:-1]) // max(1, batch)
        layers = [(numel(w_ih) // (gates * hidden), hidden)]
    else:
        # _cudnn_rnn(input, weight[] (per layer and direction: W_ih, W_hh[, b_ih, b_hh]), weight_buf,
        # hx [L*D, B, H], cx?, ...); the backward has the same head.  Autocast passes the weights as
        # flat [n, 1] views, so sizes are read from element counts.
        i_hx = next(i for i in range(1, len(ins)) if len(ins[i][0]) == 3)
        ld, batch, hidden = ins[i_hx][0]
        weights = ins[1:i_hx]
        total = sum(numel(t[0]) for t in weights)
        weights = [t for t in weights if 2 * numel(t[0]) != total]  # drop the flat weight buffer
        per = len(weights) // max(1, ld)  # 4 with biases, 2 without
        gates = numel(weights[1][0]) // (hidden * hidden)
        layers = [(numel(weights[j * per][0]) // (gates * hidden), hidden) for j in range(ld)]
        # input [B, T, I] (batch_first) or [T, B, I]; a PackedSequence's rows [sum of lengths, I]
        steps = x[1] if x[0] == batch else x[0]
    gh = gates * hidden
    rows = steps * batch
    if len(x) == 2 and not base.startswith("mkldnn"):
        # packed rows: the steps are at least rows / B (the longest sequence; batch_sizes is not a tensor here)
        rows, steps = x[0], -(-x[0] // max(1, batch))
    # per step and batch row: x @ W_ih^T (2*I*G*H) and h @ W_hh^T (2*H*G*H); backward twice that
    flops = sum(2 * rows * gh * (i_l + h_l) for i_l, h_l in layers) * (2 if backward else 1)
    return OpWork(name, phase, RNN, flops=flops, batch=len(layers), m=batch, n=gh, k=hidden,
                  steps=steps * len(layers), backward=backward, launches=len(layers),
                  library="cudnn" if base.startswith("_cudnn") else "",
                  **{**common, "dtype": dtype})


def _foreach_work(name, base, phase, ins, outs, dtype) -> OpWork:
    # the lists are flattened in schema order; the .List overloads take one tensor list more
    overload = name.rsplit(".", 1)[-1]
    lists = _FOREACH_DEPTH.get(base.rstrip("_"), 1) + (1 if overload == "List" else 0)
    n_list = max(1, len(ins) // lists)  # a single Tensor argument (``.Tensor``) rounds away
    first = ins[:n_list]
    read = sum(_bytes_of(t) for t in ins)
    # in place: the first list is written back; otherwise the outputs are new tensors
    written = sum(_bytes_of(t) for t in outs) if outs else (sum(_bytes_of(t) for t in first) if is_inplace(base) else 0)
    depth = lists + (0 if is_inplace(base) else 1)
    launches = foreach_launches([numel(t[0]) for t in first], depth)
    return OpWork(name, phase, MEMORY, bytes_read=read, bytes_written=written, dtype=dtype, launches=launches,
                  tensors=n_list)


# tensor lists per foreach op (the scalar-list and scalar overloads have one list fewer than .List)
_FOREACH_DEPTH = {
    "_foreach_add": 1, "_foreach_sub": 1, "_foreach_mul": 1, "_foreach_div": 1, "_foreach_sqrt": 1,
    "_foreach_lerp": 2, "_foreach_addcmul": 3, "_foreach_addcdiv": 3, "_foreach_maximum": 1,
    "_foreach_neg": 1, "_foreach_abs": 1, "_foreach_exp": 1, "_foreach_copy": 2, "_foreach_zero": 1,
    "_foreach_norm": 1, "_foreach_pow": 1, "_foreach_sign": 1, "_foreach_clamp_max": 1, "_foreach_clamp_min": 1,
}


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


def _peaks(gpu: GPU) -> dict[str, float]:
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
        bandwidth=ref.bandwidth * gpu.bandwidth / ref_gpu.bandwidth, peaks=_peaks(gpu))


# -- per-op times ------------------------------------------------------------------------------


def precision_of(w: OpWork, matmul_tf32: bool = False) -> tuple[str, str]:
    """(peak key, efficiency key) of a compute op: which datasheet peak and which achieved fraction.

    fp32 GEMMs run on the fp32 pipes unless ``torch.backends.cuda.matmul.allow_tf32`` (default
    False); cuDNN convolutions run TF32 (``torch.backends.cudnn.allow_tf32``, default True).
    Grouped (depthwise) convolutions are not GEMMs: cuDNN runs them as direct convolutions on the
    CUDA cores, timed against the fp32 peak with their own efficiency ("grouped").
    """
    dtype = w.dtype or "float32"
    if w.kind == CONV and w.batch > 1:
        return "fp32", "grouped"
    if dtype in ("bfloat16", "float16"):
        return ("bf16" if dtype == "bfloat16" else "fp16"), "half"
    if w.kind == CONV or (w.kind == MATMUL and matmul_tf32):
        return "tf32", "tf32"
    return "fp32", "fp32"


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


def align_factor(align: float, gamma: float) -> float:
    """Tensor-core efficiency of misaligned operands: 16-byte loads need 16-byte aligned leading
    dimensions; narrower ones (8, 4, 2 bytes) issue proportionally more load instructions."""
    return (align / _TENSOR_CORE_BYTES) ** gamma


def compute_seconds(flops: float, peak: float, eff: float, size: float, align: float) -> float:
    """FLOPs over the achieved rate: peak x efficiency x size factor x alignment factor."""
    return flops / (peak * eff * size * align)


def soft_max_p(a, b, p):
    """``(a**p + b**p) ** (1/p)`` (arithmetic only: floats or tensors)."""
    return (a ** p + b ** p) ** (1.0 / p)


def gemm_seconds(model: TimingModel, peak_key: str, eff_key: str, batch: int, m: int, n: int, k: int,
                 align: int = _TENSOR_CORE_BYTES, nbytes: int | None = None) -> float:
    """One GEMM (or a batch of them) on the GPU: the library floor plus compute and memory."""
    # [batch, m, k] @ [batch, k, n]: 2*batch*m*n*k FLOPs; operands and result once
    flops = 2 * batch * m * n * k
    item = 2 if eff_key == "half" else 4
    nbytes = item * batch * (m * k + k * n + m * n) if nbytes is None else nbytes
    size = size_factor(batch * m * n, m, n, k, model.fill_rows, model.n0, model.k0)
    align_f = align_factor(align, model.align_gamma) if eff_key != "fp32" else 1.0
    compute = compute_seconds(flops, model.peaks[peak_key], model.eff[f"matmul.{eff_key}"], size, align_f)
    return model.library_s + soft_max_p(compute, nbytes / model.bandwidth, model.overlap_p)


def rnn_seconds(w: OpWork, model: TimingModel, matmul_tf32: bool = False) -> float:
    """A cuDNN recurrent layer stack: the input projections as GEMMs over all time steps, then
    ``steps`` dependent steps, each a recurrent GEMM [batch, hidden] @ [hidden, gates * hidden]
    with the gate math fused in.  Backward: input gradients and weight gradients as big GEMMs,
    and one recurrent GEMM per step."""
    peak_key, eff_key = precision_of(w, matmul_tf32)
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


def gpu_seconds(w: OpWork, model: TimingModel, matmul_tf32: bool = False) -> float:
    """GPU time of one op when the GPU is busy (kernels back to back)."""
    if w.kind in NO_KERNEL:
        return 0.0
    if w.kind == MEMORY:
        bandwidth = model.bandwidth * model.memory_eff.get(w.memory_class, 1.0)
        return w.launches * model.launch_s + w.bytes / bandwidth
    if w.kind == RNN:
        return rnn_seconds(w, model, matmul_tf32)
    peak_key, precision = precision_of(w, matmul_tf32)
    eff = model.eff[efficiency_key(w, precision)]
    flops = float(w.flops)
    if w.kind == ATTENTION:
        # score blocks above the diagonal are skipped by causal kernels
        flops *= causal_fraction(w.m, w.n) if w.causal else 1.0
        eff *= model.attention_backward if w.backward else 1.0
        size = 1.0
    else:
        size = size_factor(w.batch * w.m * w.n, w.m, w.n, w.k, model.fill_rows, model.n0, model.k0)
        if w.kind == CONV and w.backward:
            eff *= model.conv_backward
    align = align_factor(w.align, model.align_gamma) if precision not in ("fp32", "grouped") else 1.0
    compute = compute_seconds(flops, model.peaks[peak_key], eff, size, align)
    return w.launches * model.library_s + soft_max_p(compute, w.bytes / model.bandwidth, model.overlap_p)


def host_class(w: OpWork) -> str:
    """The host-cost class of an op with kernels: foreach, cudnn, cublas or kernel."""
    if w.tensors:
        return "foreach"
    return w.library or "kernel"


def inop_seconds(w: OpWork, table: Mapping[str, float], classes: Mapping[str, float]) -> float:
    """Host time inside one op beyond a view's: its op name's measured figure, else its class's."""
    t = table.get(w.op)
    return t if t is not None else classes.get(host_class(w), classes.get("kernel", 0.0))


def cpu_seconds(w: OpWork, model: TimingModel) -> float:
    """Host time to issue one op: the dispatcher, autograd and (forward) the model's Python around
    it, plus what the op does on the host itself (allocation, TensorIterator, library plans, the
    launch), plus the foreach optimizer's per-tensor Python."""
    if w.kind == HOST:
        return 0.0  # the optimizer's scalar reads: inside its per-tensor cost (cpu_tensor)
    t = model.cpu_view[w.phase]
    if w.kind in (VIEW, SYNC):
        return t + (model.cpu_sync if w.kind == SYNC else 0.0)
    return t + inop_seconds(w, model.cpu_inop, model.cpu_inop_class) + model.cpu_tensor * w.tensors


# -- the step: two timelines ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OpTime:
    """One op's share of the step: its kernel time and host time."""

    index: int
    op: str
    phase: str
    kind: str
    gpu_s: float
    cpu_s: float
    flops: int
    bytes: int


@dataclass
class StepTime:
    """Predicted time of one training step (seconds).

    ``forward + backward + optimizer == total``: the phases split the simulated timeline at the
    moment the last op of each phase is done (host and GPU).  ``gpu_busy`` is the sum of kernel
    times, ``host`` the sum of host issue times: when ``host`` is close to ``total`` the step is
    launch-bound.  MFU (PaLM, appendix B): ``model_flops / (total * peak)``, with model FLOPs the
    forward and backward matmul-class FLOPs (this project's rules: multiply-add = 2 FLOPs) and
    ``peak`` the datasheet dense peak of the precision most of those FLOPs run in.
    """

    gpu: str
    total: float
    forward: float
    backward: float
    optimizer: float
    gpu_busy: float
    host: float
    model_flops: int
    peak: float
    calibrated: bool
    source: str
    ops: list[OpTime] = field(default_factory=list, repr=False)

    @property
    def achieved_flops(self) -> float:
        """Model FLOPs per second of the step."""
        return self.model_flops / self.total if self.total > 0 else 0.0

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: ``model_flops / (total * peak)`` (PaLM, appendix B)."""
        return self.achieved_flops / self.peak if self.peak > 0 else 0.0

    @property
    def bound(self) -> str:
        """"host" when the GPU waits for the host for more than half of the step, else "gpu"."""
        return "host" if self.gpu_busy < 0.5 * self.total else "gpu"

    def top(self, n: int = 10) -> list[OpTime]:
        """The ``n`` ops with the most GPU time."""
        return sorted(self.ops, key=lambda o: -o.gpu_s)[:n]

    def by_op(self) -> dict[str, float]:
        """GPU seconds per aten op name, largest first."""
        out: dict[str, float] = {}
        for o in self.ops:
            out[o.op] = out.get(o.op, 0.0) + o.gpu_s
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "total_s": self.total, "forward_s": self.forward, "backward_s": self.backward,
                "optimizer_s": self.optimizer, "gpu_busy_s": self.gpu_busy, "host_s": self.host,
                "bound": self.bound, "model_flops": self.model_flops, "achieved_flops": self.achieved_flops,
                "mfu": self.mfu, "calibrated": self.calibrated, "source": self.source,
                "top_ops": [{"op": o.op, "phase": o.phase, "gpu_s": o.gpu_s} for o in self.top(10)]}


def timeline(gpu_s: Sequence[float], cpu_s: Sequence[float], sync: Sequence[bool]) -> tuple[float, list[float]]:
    """The step's end and each op's completion on two timelines.

    The host issues op i at ``cpu_i = cpu_{i-1} + cpu_s[i]``; its kernels run from
    ``max(cpu_i, gpu_{i-1})`` for ``gpu_s[i]``; a sync op makes the host wait for the GPU work
    issued before it (a device -> host read) and then issues its own kernels.
    Op i is done at ``max(cpu_i, gpu_i)``.
    """
    cpu = gpu = 0.0
    done = []
    for g, c, s in zip(gpu_s, cpu_s, sync):
        cpu += c
        if s:
            cpu = max(cpu, gpu)
        if g > 0.0:
            gpu = max(cpu, gpu) + g
        done.append(max(cpu, gpu))
    return max(cpu, gpu), done


def simulate(works: Sequence[OpWork], model: TimingModel, matmul_tf32: bool = False) -> StepTime:
    """The step time of ``works`` (one training step's ops in execution order) under ``model``."""
    gpu_s = [gpu_seconds(w, model, matmul_tf32) for w in works]
    cpu_s = [cpu_seconds(w, model) for w in works]
    total, done = timeline(gpu_s, cpu_s, [w.sync for w in works])
    ends = {}
    for w, t in zip(works, done):
        ends[w.phase] = t
    fwd_end = ends.get("forward", 0.0)
    bwd_end = max(ends.get("backward", fwd_end), fwd_end)
    ops = [OpTime(i, w.op, w.phase, w.kind, g, c, w.flops, w.bytes)
           for i, (w, g, c) in enumerate(zip(works, gpu_s, cpu_s))]
    flops_by_peak: dict[str, int] = {}
    model_flops = 0
    for w in works:
        if w.kind in COMPUTE_KINDS and w.phase in ("forward", "backward"):
            model_flops += w.flops
            key = precision_of(w, matmul_tf32)[0]
            flops_by_peak[key] = flops_by_peak.get(key, 0) + w.flops
    peak_key = max(flops_by_peak, key=flops_by_peak.get) if flops_by_peak else "fp32"
    return StepTime(gpu=model.gpu, total=total, forward=fwd_end, backward=bwd_end - fwd_end,
                    optimizer=total - bwd_end, gpu_busy=sum(gpu_s), host=sum(cpu_s), model_flops=model_flops,
                    peak=model.peaks.get(peak_key, 0.0), calibrated=model.calibrated, source=model.source, ops=ops)


# optimizer-state initialisation that only the first step runs (the capture records step 1)
_FIRST_STEP_ONLY = frozenset({"zeros_like", "zeros", "full", "full_like", "ones_like", "empty_like", "empty",
                              "lift_fresh", "scalar_tensor", "new_zeros"})


def _first_step_only(w: OpWork) -> bool:
    """An op only the first step runs: the optimizer's state initialisation."""
    return w.phase == "optimizer" and op_base(w.op) in _FIRST_STEP_ONLY


def works_of(obj: Any, steady_state: bool = True) -> list[OpWork]:
    """OpWork records from a Report, a Capture, OpNodes or OpWork records (in order).

    ``steady_state`` drops what only a first step runs: the optimizer's state initialisation
    (``zeros_like`` per state tensor and the step counters), which a capture records because it
    traces step 1, and which a steady-state step (the one timed) does not run.
    """
    if hasattr(obj, "capture"):
        obj = obj.capture
    if hasattr(obj, "nodes"):
        obj = obj.nodes
    works: list[OpWork] = []
    for item in obj:
        w = item if isinstance(item, OpWork) else OpWork.from_node(item)
        if w is None:
            continue
        if steady_state and _first_step_only(w):
            continue
        works.append(w)
    return works


def node_times(nodes: Sequence[Any], gpu: GPU | str = "H100-SXM", model: TimingModel | None = None, *,
               matmul_tf32: bool = False, steady_state: bool = True) -> list[tuple[float, float, bool]]:
    """(kernel seconds, host seconds, waits for the GPU) of each of ``nodes`` (captured OpNodes, in
    order): the per-op model of this module, for schedules that place ops themselves (the planner's
    streams and links).  Placeholders, bookkeeping and (``steady_state``) the first step's
    optimizer-state initialisation take (0, 0, False)."""
    gpu = lookup_gpu(gpu) if isinstance(gpu, str) else gpu
    model = model or load_model(gpu)
    out = []
    for node in nodes:
        w = OpWork.from_node(node)
        if w is None or (steady_state and _first_step_only(w)):
            out.append((0.0, 0.0, False))
        else:
            out.append((gpu_seconds(w, model, matmul_tf32), cpu_seconds(w, model), w.sync))
    return out


def step_time(obj: Any, gpu: GPU | str = "H100-SXM", model: TimingModel | None = None, *,
              matmul_tf32: bool = False, steady_state: bool = True) -> StepTime:
    """Predicted time of one training step on ``gpu``.

    ``obj``: a :class:`~estimator.report.Report` (``estimate(..., device="cuda")``), its
    ``Capture``, the captured ``OpNode`` list, or :class:`OpWork` records.  ``model``: the
    constants (default :func:`load_model` for ``gpu``).  ``matmul_tf32``: fp32 GEMMs on TF32
    tensor cores (``torch.backends.cuda.matmul.allow_tf32 = True``).
    """
    gpu = lookup_gpu(gpu) if isinstance(gpu, str) else gpu
    model = model or load_model(gpu)
    return simulate(works_of(obj, steady_state), model, matmul_tf32)

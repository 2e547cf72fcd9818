"""Memory the CUDA libraries take inside the caching allocator that no op returns.

``torch.cuda.max_memory_allocated()`` counts everything the caching allocator hands out, which
includes, besides the tensors of the step (what the capture records):

* **cuBLAS workspaces**, one per cuBLAS handle, i.e. per thread that runs a GEMM: the thread of
  the forward pass and optimizer step, and autograd's device thread for backward.  They are
  allocated at the first GEMM of each thread and kept (the reference H100 steps hold 64 MiB of
  them in training, 32 MiB in inference).  Size: ``CUBLAS_WORKSPACE_CONFIG`` when set, else
  ``:4096:8`` = 32 MiB on sm90 and newer, ``:4096:2:16:8`` = 8 MiB + 128 KiB before
  (``aten/src/ATen/cuda/CublasHandlePool.cpp``: ``getChosenWorkspaceSize``).  A thread that runs
  an ``addmm`` through cuBLASLt (a 1-D bias fused in the epilogue: ``Blas.cpp``,
  ``isInputCompliesAddmmCudaLt``) also gets a cuBLASLt workspace of 1 MiB
  (``CUBLASLT_WORKSPACE_SIZE``, in KiB); the reference steps show 65 MiB for models with biased
  linear layers, 66 MiB when checkpointing recomputes them in backward.
* **Kernel temporaries**: workspaces allocated inside one op and freed before it returns
  (cuDNN convolution, attention and RNN workspaces, the cross-block buffers of ATen's reductions,
  softmax backward's ``grad * output``, ``_safe_softmax``'s masks, CUB's sort and scan buffers in
  embedding backward, ``sort``, ``index_put`` and ``cumsum``): per-op rules, registered like the
  FLOP rules (:func:`transient`), pure functions of the op's arguments and of its tensors' strides
  (:class:`Layout`); each docstring names its source and the reference figures it reproduces
  (``tests/test_workspace.py`` checks them against every op of the reference H100 steps).
* **Outputs the CUDA kernel does not place on the GPU**: the memory-efficient attention
  kernel's RNG seed and offset are host tensors when there is no dropout (:func:`device_bytes`).

:func:`library_memory` applies them to a captured step; :func:`estimator.memory.simulate` adds
them to the timeline.

Why one file of this length: every rule is a port of one library's temporary-memory logic with
the reference figures it was checked on; they share the layout and CUB helpers and one registry
(``@transient``), as ``rules/`` shares one for costs.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple

import torch

from .graph import OpNode, map_args
from .hardware import multiprocessors
from .rules.registry import OpCall, TensorSpec, bind
from .target import CudaTarget

aten = torch.ops.aten
MiB = 1 << 20

# -- cuBLAS ------------------------------------------------------------------------------------------


def cublas_workspace_bytes(target: CudaTarget, config: str | None = None) -> int:
    """One cuBLAS handle's workspace: ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE_KiB:COUNT`` pairs), else the
    default of the architecture (``getChosenWorkspaceSize``)."""
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG") if config is None else config
    if config:
        parts = [p for p in config.split(":") if p]
        try:
            pairs = [(int(parts[i]), int(parts[i + 1])) for i in range(0, len(parts) - 1, 2)]
            if pairs:
                return sum(kib * 1024 * count for kib, count in pairs)
        except ValueError:
            pass
    if target.arch >= (9, 0):
        return 4096 * 1024 * 8  # ":4096:8"
    return 4096 * 1024 * 2 + 16 * 1024 * 8  # ":4096:2:16:8"


def cublaslt_workspace_bytes() -> int:
    """The cuBLASLt workspace: ``CUBLASLT_WORKSPACE_SIZE`` KiB, default 1024."""
    try:
        return int(os.environ.get("CUBLASLT_WORKSPACE_SIZE", "1024")) * 1024
    except ValueError:
        return MiB


_GEMMS = frozenset(map(id, (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
                            aten.addmv.default, aten.mv.default, aten.dot.default, aten.addbmm.default)))


def _thread(node: OpNode) -> str:
    """The host thread that issues ``node``: autograd's device thread runs backward on CUDA."""
    return "autograd" if node.meta.get("phase") == "backward" else "main"


def _uses_cublaslt(node: OpNode) -> bool:
    """``isInputCompliesAddmmCudaLt`` for an ``addmm`` (CUDA build): a contiguous 1-D bias fused in the
    epilogue, beta == 1, a 2-D contiguous result, float/half/bf16, both matrices larger than 1 x 1."""
    if node.target is not aten.addmm.default:
        return False
    args = node.args
    bias, mat1, mat2 = (a.meta["spec"][0] if isinstance(a, OpNode) else None for a in args[:3])
    if bias is None or mat1 is None or mat2 is None:
        return False
    beta = node.kwargs.get("beta", args[3] if len(args) > 3 else 1)
    bias_ok = len(bias.shape) == 1 or sum(1 for s in bias.shape if s != 1) <= 1
    return (beta == 1 and bias_ok and bias.shape[-1] == mat2.shape[1]
            and mat1.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64)
            and min(mat1.shape[0], mat1.shape[1], mat2.shape[0], mat2.shape[1]) > 1)


# -- per-op temporaries ------------------------------------------------------------------------------

class Layout(NamedTuple):
    """The strides (in elements) of an op's tensors, which :class:`OpCall` leaves out: ``args`` by schema
    name (a stride tuple per tensor, a tuple of them for a tensor list, None for anything else),
    ``outputs`` one per tensor output, in order.  Rules that depend on memory layout (a reduction's
    launch configuration, a kernel's ``.contiguous()`` copies) read it; :func:`layout_of` builds it
    from a captured node's ``meta["stride"]``."""

    args: Mapping[str, Any]
    outputs: tuple[tuple[int, ...] | None, ...] = ()

    def stride(self, name: str, spec: TensorSpec | None = None) -> tuple[int, ...]:
        """The strides of argument ``name``; contiguous strides of ``spec`` where none were recorded."""
        value = self.args.get(name)
        if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
            return value
        return contiguous_strides(spec.shape) if spec is not None else ()


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of ``shape``."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _strides_of(node: OpNode) -> tuple[int, ...] | None:
    strides = node.meta.get("stride") or ()
    return tuple(strides[0]) if len(strides) == 1 else None


def layout_of(node: OpNode) -> Layout:
    """The :class:`Layout` of a captured node: its inputs' and outputs' recorded strides."""
    args, kwargs = map_args(node, _strides_of, lambda _: None)
    outputs = tuple(tuple(s) for s in node.meta.get("stride") or ())
    return Layout(bind(node.target, args, kwargs), outputs)


TransientRule = Callable[[OpCall, CudaTarget, Layout], int]
_TRANSIENT: dict[Any, TransientRule] = {}


def transient(*ops: Any) -> Callable[[TransientRule], TransientRule]:
    """Register ``fn(call, target, layout) -> bytes`` as the temporary memory ``ops`` take while they run
    (``layout``: the strides of the op's tensors, :class:`Layout`)."""

    def decorator(fn: TransientRule) -> TransientRule:
        for op in ops:
            _TRANSIENT[getattr(op, "overloadpacket", op)] = fn
        return fn

    return decorator


def _bytes(spec: TensorSpec | None, dtype: torch.dtype | None = None) -> int:
    if spec is None:
        return 0
    return spec.numel * (dtype or spec.dtype).itemsize


@transient(aten._scaled_dot_product_cudnn_attention)
def _cudnn_attention(call: OpCall, target: CudaTarget, layout: Layout | None = None) -> int:
    """512 B: the reference H100 steps show 512 bytes above the outputs in every cuDNN forward."""
    return 512


@transient(aten._scaled_dot_product_cudnn_attention_backward)
def _cudnn_attention_backward(call: OpCall, target: CudaTarget, layout: Layout | None = None) -> int:
    """2|Q| + |logsumexp| + 512 B, and 2|Q| more with grouped-query heads (the gradients of the K/V heads
    at the query's head count, summed after).  Fitted on the reference H100 steps: GPT-2 (B8 H12
    L1024 D64 bf16) 25,559,552 B; BERT, T5 (B8 H8 L512 D64) 8,520,192 B; Llama (B4, 16 query and 4
    KV heads, L1024 D64) 33,817,088 B: the formula gives each exactly."""
    q, k, lse = call["query"], call["key"], call["logsumexp"]
    gqa = k.shape[-3] != q.shape[-3]
    return (4 if gqa else 2) * _bytes(q) + _bytes(lse) + 512


@transient(aten._scaled_dot_product_efficient_attention_backward)
def _efficient_attention_backward(call: OpCall, target: CudaTarget, layout: Layout | None = None) -> int:
    """|Q in float32| + 2|logsumexp|: the float32 gradient accumulator and the row-wise delta.
    Reference H100 steps (fp32): GPT-2 (B8 H12 L1024 D64) 25,952,256 B, BERT/T5 (B8 H8 L512) 8,650,752 B,
    the examples' GPT (B8 H8 L256) 4,325,376 B: the formula gives each exactly."""
    q, lse = call["query"], call["logsumexp"]
    return _bytes(q, torch.float32) + 2 * _bytes(lse)


@transient(aten._scaled_dot_product_flash_attention_backward)
def _flash_attention_backward(call: OpCall, target: CudaTarget, layout: Layout | None = None) -> int:
    """flash-attn 2's backward buffers (``flash_api.cpp`` ``mha_bwd``): ``softmax_d`` (B, H, L rounded up to
    128) and ``dq_accum`` (B, L rounded to 128, H, D rounded to 32) in float32.  Not measured here (the
    reference GPU runs cuDNN attention)."""
    q = call["query"]
    b, h, length, d = q.shape
    l_r = -(-length // 128) * 128
    d_r = -(-d // 32) * 32
    return 4 * b * h * l_r + 4 * b * l_r * h * d_r


@transient(aten._cudnn_rnn, aten._cudnn_rnn_backward)
def _cudnn_rnn_workspace(call: OpCall, target: CudaTarget, layout: Layout | None = None) -> int:
    """cuDNN's RNN workspace, scaled from the one configuration measured (reference H100 steps: a 2-layer
    LSTM, hidden 512, 128 steps, batch 16: forward 57,672,192 B in float32, 37,028,352 B in float16;
    backward 131,072 B / 65,536 B more): ``a + b x itemsize`` per layer, step, sequence and hidden unit
    (a = 16,384,512, b = 10,321,920 for those 2 x 128 x 16 x 512 = 2,097,152 units)."""
    input = call["input"]
    weight = call["weight"]
    hidden, layers = call["hidden_size"], call["num_layers"]
    directions = 2 if call["bidirectional"] else 1
    seq, batch = (input.shape[1], input.shape[0]) if call["batch_first"] else (input.shape[0], input.shape[1])
    units = layers * directions * seq * batch * hidden
    itemsize = input.dtype.itemsize
    forward = units / 2_097_152 * (16_384_512 + 10_321_920 * itemsize)
    backward = 65_536 * itemsize / 2 * units / 2_097_152 if call.op.overloadpacket is aten._cudnn_rnn_backward else 0
    return int(forward + backward) if weight else 0


# -- kernel temporaries: shared helpers -----------------------------------------------------------------
#
# Every temporary below is a request to the caching allocator, which hands out 512-byte multiples
# (``round_size``); a rule's figure is the sum of the rounded requests alive together at the op's
# highest point.  The measured figures it reproduces are ``peak - max(before, after)`` of the reference
# H100 steps (tests/data/cuda_reference); where a measured figure is higher by at most 1 MiB, that is
# the allocator handing out a cached or freshly rounded block whose remainder (<= kSmallSize) it does
# not split (``should_split``), a property of the allocator's state, not of the op.

_BLOCK = 512


def _r(nbytes: int) -> int:
    """A request as the caching allocator rounds it (512-byte blocks); 0 stays 0."""
    return -(-int(nbytes) // _BLOCK) * _BLOCK if nbytes > 0 else 0


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _is_contiguous(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """``Tensor.is_contiguous()``: row-major strides, size-1 dimensions ignored."""
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size == 0:
            return True
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _copy_unless_contiguous(spec: TensorSpec | None, strides: tuple[int, ...]) -> int:
    """Bytes of ``t.contiguous()``: a dense copy unless ``t`` already is contiguous."""
    if spec is None or not strides or _is_contiguous(spec.shape, strides):
        return 0
    return _r(spec.nbytes)


def _viewable_flat(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """``t.reshape(-1)`` is a view: the non-singleton dims are row-major with respect to each other."""
    dims = [(size, stride) for size, stride in zip(shape, strides) if size != 1]
    return all(dims[i][1] == dims[i + 1][1] * dims[i + 1][0] for i in range(len(dims) - 1))


def _dtype_of(value: Any, default: torch.dtype) -> torch.dtype:
    return value if isinstance(value, torch.dtype) else default


# -- CUB temporaries (ATen's at::cuda::cub wrappers allocate them from the caching allocator) ---------

_CUB_ALIGN = 256  # cub::AliasTemporaries aligns every sub-allocation to 256 bytes, then adds 255


def _cub_temp(*sizes: int) -> int:
    """``temp_storage_bytes`` of a CUB call with these sub-allocations (``AliasTemporaries``)."""
    return sum(-(-s // _CUB_ALIGN) * _CUB_ALIGN for s in sizes) + _CUB_ALIGN - 1


# Onesweep radix sort (CUB's ``DispatchRadixSort::InvokeOnesweep``, 8 radix bits a pass): the lookback
# array holds RADIX_DIGITS 8-byte counters per tile of ``_ONESWEEP_TILE`` keys.  The tile is fitted: the
# reference steps sort 8,192 keys in one tile and 262,144 (T5's relative-position bucket ids) in 28
# tiles (lookback 57,344 B), which brackets it to 9,363..9,709 keys; 9,600 = 384 threads x 25 keys.
_ONESWEEP_TILE = 9600
_SINGLE_TILE = 2048  # at most this many keys: CUB's one-block sort asks for 1 byte (bound assumed, not measured)


def cub_radix_sort_pairs_bytes(n: int, key_bytes: int, value_bytes: int, bits: int) -> int:
    """Temporary storage of ``cub::DeviceRadixSort::SortPairs`` (ATen's ``radix_sort_pairs``, keys and
    values in separate input and output arrays): the alternate key and value buffers (the sort is not
    allowed to overwrite its input), the per-pass digit histograms (``passes * 256`` 8-byte offsets),
    the lookback counters (``tiles * 256 * 8``) and the per-pass tile counters."""
    if n <= 0:
        return 0
    if n <= _SINGLE_TILE:
        return _r(1)
    passes = -(-bits // 8)  # one pass per 8 key bits
    tiles = -(-n // _ONESWEEP_TILE)  # lookback: one 256-digit row per tile
    return _r(_cub_temp(passes * 256 * 8, tiles * 256 * 8, n * key_bytes, n * value_bytes, passes * 8))


_SCAN_TILE = 128 * 15  # CUB scan: 128 threads x 15 items a tile (4-byte items; the tile state is tiny)


def cub_scan_bytes(n: int, itemsize: int) -> int:
    """Temporary storage of ``cub::DeviceScan::InclusiveScan``: the decoupled-lookback tile state for
    ``tiles + 32`` (warp padding) tiles.  Items of 4 bytes or less pack status and value into one 8-byte
    word; 8-byte items keep three arrays (1-byte status, partial and inclusive values).  Reference H100:
    an int32 scan of 4 items 1,024 B; int64 scans of 1,024 and 4,096 items 1,536 B: the formula gives
    each."""
    tiles = -(-n // _SCAN_TILE) + 32
    if itemsize <= 4:
        return _r(_cub_temp(tiles * 8))
    return _r(_cub_temp(tiles, tiles * itemsize, tiles * itemsize))


def cub_num_bits(max_key: int) -> int:
    """``at::cuda::cub::get_num_bits``: bits needed for keys up to ``max_key``."""
    bits = 1
    while max_key > 1:
        max_key >>= 1
        bits += 1
    return bits


# -- reductions: Reduce.cuh ------------------------------------------------------------------------------


def _reduction_iterator(shape: tuple[int, ...], in_strides: tuple[int, ...], reduced: set[int],
                        itemsize: int, out_itemsize: int | None = None) -> tuple[list[int], list[int], list[int]]:
    """The TensorIterator of a reduction (``make_reduction`` -> ``TensorIterator::reduce_op``): shape and
    byte strides of the output (0 on reduced dims; the kept dims contiguous, ``resize_reduction``) and
    of the input, after ``reorder_dimensions`` (reduced dims first, then by ascending stride; dim 0 is
    the fastest) and ``coalesce_dimensions``."""
    kept = [s if d not in reduced else 1 for d, s in enumerate(shape)]
    out_el = contiguous_strides(tuple(kept))
    out = [0 if d in reduced else out_el[d] * (out_itemsize or itemsize) for d in range(len(shape))]
    inp = [s * itemsize for s in in_strides]
    nd = len(shape)

    def should_swap(d0: int, d1: int) -> int:  # TensorIteratorBase::reorder_dimensions
        for strides, is_output in ((out, True), (inp, False)):
            s0, s1 = strides[d0], strides[d1]
            if is_output and (s0 == 0) != (s1 == 0):
                return 1 if s1 == 0 else -1
            if s0 == 0 or s1 == 0:
                continue
            if s0 != s1:
                return -1 if s0 < s1 else 1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    perm = list(range(nd - 1, -1, -1))
    for i in range(1, nd):  # insertion sort with ambiguous comparisons, as TensorIterator does
        dim1 = i
        for dim0 in range(i - 1, -1, -1):
            comparison = should_swap(perm[dim0], perm[dim1])
            if comparison > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif comparison < 0:
                break
    sizes = [shape[d] for d in perm]
    strides = [[out[d] for d in perm], [inp[d] for d in perm]]
    if len(sizes) > 1:  # TensorIteratorBase::coalesce_dimensions
        prev = 0
        for dim in range(1, len(sizes)):
            s0, s1 = sizes[prev], sizes[dim]
            if s0 == 1 or s1 == 1 or all(s0 * st[prev] == st[dim] for st in strides):
                if sizes[prev] == 1:
                    for st in strides:
                        st[prev] = st[dim]
                sizes[prev] *= sizes[dim]
            else:
                prev += 1
                if prev != dim:
                    for st in strides:
                        st[prev] = st[dim]
                    sizes[prev] = sizes[dim]
        del sizes[prev + 1:]
        for st in strides:
            del st[prev + 1:]
    return sizes, strides[0], strides[1]


def _last_pow2(n: int) -> int:
    """``last_pow2``: the largest power of two <= n (1 for n < 1)."""
    return 1 << (n.bit_length() - 1) if n >= 1 else 1


def reduce_buffer_bytes(sizes: list[int], out: list[int], inp: list[int], itemsize: int, arg_bytes: int,
                        target: CudaTarget, input_vec_size: int = 4, max_threads: int = 512) -> int:
    """Cross-block buffer + semaphores of one ``gpu_reduce_kernel`` launch: ``setReduceConfig`` ported
    (``ReduceConfig::global_memory_size`` and ``semaphore_size``), on a coalesced iterator from
    :func:`_reduction_iterator` (``sizes``, output and input byte strides).  The base address is taken
    as 16-byte aligned (``get_output_vec_size``); the caching allocator returns 512-byte aligned blocks."""
    ndim = len(sizes)
    numel = _numel(tuple(sizes))
    if numel == 0:
        return 0
    n_reduce = sum(1 for s in out if s == 0)
    num_outputs = _numel(tuple(s for s, o in zip(sizes, out) if o != 0))
    inputs_per_output = numel // num_outputs
    if ndim > 0:
        on_fastest = n_reduce == ndim or inp[0] < inp[n_reduce]
        if on_fastest:  # block.x along the reduced, fastest dimension
            dim0, dim1, fastest = inputs_per_output, num_outputs, inp[0]
        else:  # block.x along the fastest kept dimension
            dim0, dim1, fastest = num_outputs, inputs_per_output, inp[n_reduce]
    else:
        on_fastest, fastest, dim0, dim1 = True, itemsize, 1, 1
    output_vec = 1
    if fastest == itemsize:
        if on_fastest and dim0 >= 128 and n_reduce == 1:
            dim0 //= input_vec_size  # "vectorize along input"
        elif not on_fastest:
            output_vec = 4  # get_output_vec_size: halve while the kept size or a stride is not a multiple
            for n in [sizes[n_reduce]] + [s // itemsize for j, s in enumerate(inp) if j != n_reduce]:
                while n % output_vec:
                    output_vec //= 2
            dim0 //= output_vec
    # set_block_dimension
    mnt = max_threads // output_vec
    dim0_pow2 = _last_pow2(dim0) if dim0 < mnt else mnt
    dim1_pow2 = _last_pow2(dim1) if dim1 < mnt else mnt
    block_x = min(dim0_pow2, 32)
    block_y = min(dim1_pow2, mnt // block_x)
    block_x = min(dim0_pow2, mnt // block_y)
    num_threads = block_x * block_y
    step_input, step_output = 1, 1
    block_x_reduce = ndim == 0 or on_fastest
    if block_x_reduce:
        step_input *= block_x  # input_mult[BLOCK_X]
    else:
        step_output *= block_x  # output_mult[BLOCK_X]
    min_values, max_values = 16, 256
    values_per_thread = -(-inputs_per_output // step_input)
    split_warps = values_per_thread >= min(block_y * 16, max_values)
    if split_warps:
        step_input *= block_y  # input_mult[BLOCK_Y]
    else:
        step_output *= block_y
    sm = multiprocessors(target.name)
    target_grid = sm.count * (sm.max_threads // num_threads)
    grid_x = -(-(num_outputs // output_vec) // step_output)
    values_per_thread = -(-inputs_per_output // step_input)
    if not (split_warps and values_per_thread >= max_values and grid_x <= target_grid):
        return 0
    ctas = max(min(-(-target_grid // grid_x), -(-values_per_thread // min_values)),
               -(-values_per_thread // max_values))
    if ctas <= 1:
        return 0
    buffer = arg_bytes * num_outputs * ctas * (1 if block_x_reduce else block_x * output_vec)
    return _r(buffer) + _r(4 * grid_x)  # staging buffer; one int semaphore per output block


_INT32_MAX = 2**31 - 1


def reduction_bytes(shape: tuple[int, ...], in_strides: tuple[int, ...], reduced: set[int], itemsize: int,
                    arg_bytes: int, out_bytes: int, target: CudaTarget, input_vec_size: int = 4) -> int:
    """The temporaries of a TensorIterator reduction on CUDA (``gpu_reduce_kernel``): the largest
    cross-block buffer of its launches, and, when the iterator is too large for 32-bit offsets and the
    output type cannot hold the accumulator (``AccumulationBuffer``), an accumulator copy of the output
    kept across the launches that ``with_32bit_indexing`` splits it into (each split halves the
    dimension with the largest extent)."""
    sizes, out, inp = _reduction_iterator(shape, in_strides, reduced, itemsize, out_bytes)
    if not sizes or _numel(tuple(sizes)) == 0:
        return 0
    seen: dict[tuple, int] = {}

    def launch(sizes: list[int]) -> int:
        key = tuple(sizes)
        if key in seen:
            return seen[key]
        offsets = [sum((n - 1) * s for n, s in zip(sizes, st)) for st in (out, inp)]
        if _numel(key) <= _INT32_MAX and max(offsets) < _INT32_MAX:
            seen[key] = reduce_buffer_bytes(sizes, out, inp, itemsize, arg_bytes, target, input_vec_size)
            return seen[key]
        # get_dim_to_split: the largest (size - 1) * |stride| over the operands, last dim first on ties
        dim = max(range(len(sizes) - 1, -1, -1), key=lambda d: max((sizes[d] - 1) * abs(st[d]) for st in (out, inp)))
        half = list(sizes)
        half[dim] = sizes[dim] // 2
        rest = list(sizes)
        rest[dim] = sizes[dim] - half[dim]
        seen[key] = max(launch(half), launch(rest))
        return seen[key]

    buffers = launch(sizes)
    offsets = [sum((n - 1) * s for n, s in zip(sizes, st)) for st in (out, inp)]
    split = _numel(tuple(sizes)) > _INT32_MAX or max(offsets) >= _INT32_MAX
    accumulate = 0
    if split and out_bytes < arg_bytes:  # AccumulationBuffer: the output in the accumulator type
        extent = max([out_bytes] + [n * s for n, s in zip(sizes, out)])
        accumulate = _r(extent // out_bytes * arg_bytes)
    return accumulate + buffers


def _reduced_dims(shape: tuple[int, ...], dim: Any) -> set[int]:
    """The dims a reduction's ``dim`` argument names (None or empty: all)."""
    nd = len(shape)
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return set(range(nd))
    dims = dim if isinstance(dim, (list, tuple)) else (dim,)
    return {d % nd for d in dims} if nd else set()


def _low_precision(dtype: torch.dtype) -> bool:
    return dtype in (torch.float16, torch.bfloat16)


def _acc_bytes(dtype: torch.dtype) -> int:
    """``acc_type<T, true>`` / ``opmath_type``: float for half and bfloat16, double for double, int64 for
    integers and bool (sum), else the type itself."""
    if _low_precision(dtype) or dtype == torch.float32:
        return 4
    if dtype == torch.float64 or not dtype.is_floating_point:
        return 8
    return dtype.itemsize


def _reduce_call(call: OpCall, layout: Layout, target: CudaTarget, arg_bytes: int,
                 input_vec_size: int = 4, out_dtype: torch.dtype | None = None) -> int:
    x = call["self"]
    if x is None or x.numel == 0:
        return 0
    reduced = _reduced_dims(x.shape, call.get("dim"))
    out_dtype = out_dtype or (call.out.dtype if call.outputs else x.dtype)
    return reduction_bytes(x.shape, layout.stride("self", x), reduced, x.itemsize, arg_bytes, out_dtype.itemsize,
                           target, input_vec_size)


@transient(aten.sum, aten.nansum)
def _sum(call: OpCall, target: CudaTarget, layout: Layout) -> int:
    """Cross-block buffer of the sum kernel (``ReduceSumProdKernel.cu: sum_functor``: accumulator float
    for half/bfloat16/float, ``vt0`` 4, 16-bit inputs loaded 8 at a time), :func:`reduction_bytes`; plus
    the cast copy of the input when ``dtype`` asks for a type the kernel does not read directly
    (``make_reduction_from_out_ty``: half/bfloat16 -> float is read directly).

    Reference H100 steps (132 SMs, 2,048 threads each), every ``sum.dim_IntList`` reproduced: e.g. the
    bias gradients of a [8192, C] activation over dim 0 allocate 4 * C * ctas * 128 B + 512 B
    (semaphores): GPT-2 C=768 50,332,160 B, C=2304 139,198,976 B, C=3072 138,412,544 B, BERT
    C=2048 67,109,376 B; the LSTM head's [16, 128, 8000] over dims (0, 1) 131,072,512 B requested
    (measured 132,121,088 B: a fresh 2 MiB-rounded segment whose 1 MiB remainder is not split);
    reductions over the last dim or with few rows per output: 0."""
    x = call["self"]
    if x is None:
        return 0
    out_dtype = _dtype_of(call.get("dtype"), call.out.dtype if call.outputs else x.dtype)
    lowp_to_float = _low_precision(x.dtype) and out_dtype == torch.float32
    cast = 0
    if out_dtype != x.dtype and not lowp_to_float:
        cast = _r(x.numel * out_dtype.itemsize)  # self.to(out_dtype): the kernel reads its own type
        x = TensorSpec(x.shape, out_dtype)
        layout = Layout({"self": contiguous_strides(x.shape)})
    vec = 8 if x.itemsize == 2 else 4
    reduced = _reduced_dims(x.shape, call.get("dim"))
    return cast + reduction_bytes(x.shape, layout.stride("self", x), reduced, x.itemsize, _acc_bytes(x.dtype),
                                  out_dtype.itemsize, target, vec)


@transient(aten.mean, aten.prod, aten.linalg_vector_norm)
def _mean(call: OpCall, target: CudaTarget, layout: Layout) -> int:
    """Cross-block buffer of the mean / prod / norm kernels (``MeanOps``, ``func_wrapper`` product,
    ``NormOps``: accumulator float for half/bfloat16/float, ``vt0`` = input vector 4),
    :func:`reduction_bytes`.  Reference H100: every ``mean.dim`` (RMSNorm statistics, pooling heads)
    reduces the last dims or few rows per output: 0, as measured."""
    x = call["self"]
    if x is None:
        return 0
    return _reduce_call(call, layout, target, 4 if x.dtype.is_floating_point and x.itemsize <= 4 else 8)


@transient(aten.amax, aten.amin, aten.all, aten.any)
def _minmax_allany(call: OpCall, target: CudaTarget, layout: Layout) -> int:
    """Cross-block buffer of the max/min and and/or kernels (``MaxNanFunctor`` / ``MinNanFunctor`` and
    the ``all``/``any`` lambdas accumulate in the input's own type), :func:`reduction_bytes`.
    Reference H100: every ``all.default`` (attention-mask checks) measured 0, as predicted."""
    x = call["self"]
    if x is None:
        return 0
    return _reduce_call(call, layout, target, x.itemsize)


# -- softmax: SoftMax.cu / attention.cpp -------------------------------------------------------------


@transient(aten._softmax_backward_data)
def _softmax_backward(call: OpCall, target: CudaTarget, layout: Layout) -> int:
    """|grad * output|: ``softmax_backward_cuda_out`` computes ``tmp = grad * output`` (a full tensor of
    the promoted type) and passes it to ``host_softmax_backward``, which also takes ``.contiguous()`` of
    it and of ``output``.  Reference H100 steps: [4, 16, 1024, 1024] fp32 268,435,456 B, [1, 16, 4096,
    4096] fp32 1,073,741,824 B, [8, 8, 512, 512] 67,108,864 B, Mixtral's router [4096, 4] 65,536 B, every
    one exactly |grad|."""
    grad, output = call["grad_output"], call["output"]
    if grad is None or output is None:
        return 0
    dtype = torch.promote_types(grad.dtype, output.dtype)
    shape = torch.broadcast_shapes(grad.shape, output.shape)
    g, o = layout.stride("grad_output", grad), layout.stride("output", output)
    # TensorIterator's output follows its inputs' layout when they share a dense permutation
    tmp_copy = _r(_numel(shape) * dtype.itemsize) if (g == o and grad.shape == output.shape
                                                      and not _is_contiguous(shape, g)) else 0
    return _r(_numel(shape) * dtype.itemsize) + tmp_copy + _copy_unless_contiguous(output, o)


@transient(aten._log_softmax_backward_data)
def _log_softmax_backward(call: OpCall, target: CudaTarget, layout: Layout) -> int:
    """``host_softmax_backward``'s ``.contiguous()`` copies of grad and output (0 for contiguous ones,
    as every reference step measures)."""
    return (_copy_unless_contiguous(call["grad_output"], layout.stride("grad_output", call["grad_output"]))
            + _copy_unless_contiguous(call["output"], layout.stride("output", call["output"])))


@transient(aten._softmax, aten._log_softmax)
def _softmax(call: OpCall, target: CudaTarget, layout: Layout) -> int:
    """``host_softmax``'s ``input.contiguous()`` copy (0 for a contiguous input, as measured)."""
    return _copy_unless_contiguous(call["self"], layout.stride("self", call["self"]))


@transient(aten._safe_softmax)
def _safe_softmax(call: OpCall, target: CudaTarget, layout: Layout) -> int:
    """numel + rows bytes of bool masks + a 0-d zero: ``_safe_softmax`` (``attention.cpp``) runs
    ``softmax``, then ``masked = self.isneginf()`` (bool, numel), ``masked_rows = all(masked, dim,
    keepdim)`` (bool, one per row) and ``where_out(out, masked_rows, zero, out)`` with ``zero`` a 0-d
    tensor on the device, in place.  Reference H100 steps: [4, 16, 1024, 1024] 67,174,912 B, [1, 16,
    1024, 1024] 16,794,112 B, [1, 16, 4096, 4096] 268,501,504 B, [4, 8, 1024, 1024] 33,587,712 B,
    [8, 8, 512, 512] 16,810,496 B: the formula gives each exactly."""
    x = call["self"]
    if x is None or x.numel == 0:
        return 0
    dim = call.get("dim", -1) % max(x.ndim, 1)
    rows = x.numel // max(x.shape[dim], 1) if x.ndim else 1
    return _copy_unless_contiguous(x, layout.stride("self", x)) + _r(x.numel) + _r(rows) + _r(x.dtype.itemsize)


# -- embeddings: Embedding.cu, EmbeddingBackwardKernel.cu --------------------------------------------


@transient(aten.embedding)
def _embedding(call: OpCall, target: CudaTarget, layout: Layout) -> int:
    """``embedding`` = ``weight.index_select(0, indices.reshape(-1))``: the reshape copies indices that
    cannot be flattened as a view.  Reference H100: BERT's token-type ids (an expanded [8, 512] int64,
    strides (0, 1)) 32,768 B, contiguous ids 0."""
    idx = call["indices"]
    if idx is None or idx.ndim <= 1:
        return 0
    return 0 if _viewable_flat(idx.shape, layout.stride("indices", idx)) else _r(idx.nbytes)


_NROWS_PER_THREAD = 10  # EmbeddingBackwardKernel.cu


@transient(aten.embedding_dense_backward)
def _embedding_backward(call: OpCall, target: CudaTarget, layout: Layout) -> int:
    """``embedding_dense_backward_cuda``: ``.contiguous()`` of indices and grad, then for more than
    3,072 indices (or ``scale_grad_by_freq``) the sort-based path, whose high point is the larger of

    * the sort: ``sorted_indices``, ``orig_indices``, ``range`` (n indices each) and CUB's radix sort
      over all the key bits (:func:`cub_radix_sort_pairs_bytes`);
    * ``embedding_backward_cuda_kernel``: sorted and original indices, ``segment_offsets`` (n),
      two 0-d counters, ``partials_per_segment`` and its offsets (``min(n, num_weights)`` each),
      ``partial_segment_offset`` and the float ``grad_weight_per_segment`` (``n / 10 + min(n,
      num_weights)`` rows, of ``D`` floats).

    Reference H100 steps: GPT-2 (8,192 ids, D 768) 28,082,688 B, BERT/T5 word embeddings (4,096, D 512)
    9,427,456 B, Llama (4,096, D 1,024) 18,653,696 B, T5's relative-position bias (262,144 ids of 32
    buckets, D 8, a strided grad: 8 MiB copy + the sort) 18,948,608 B, the LSTM's 2,048 ids (a strided
    grad copy only) 2,097,152 B, 1,024/2,048 contiguous ids 0: exactly.  BERT's token-type table
    (2 rows, 4,096 expanded ids) measures 210,432 B where this gives 978,432 B: the source sizes
    ``grad_weight_per_segment`` for 4,096 / 10 + 2 = 411 partial segments (841,728 B), which the
    step did not allocate; the one contradiction found."""
    grad, idx = call["grad_output"], call["indices"]
    if grad is None or idx is None:
        return 0
    n, d = idx.numel, grad.shape[-1] if grad.ndim else 1
    base = (_copy_unless_contiguous(idx, layout.stride("indices", idx))
            + _copy_unless_contiguous(grad, layout.stride("grad_output", grad)))
    scale = bool(call.get("scale_grad_by_freq", False))
    if n <= 3072 and not scale:
        return base
    isz = idx.itemsize
    ids = _r(n * isz)
    sort = 3 * ids + cub_radix_sort_pairs_bytes(n, isz, isz, 8 * isz)
    segments = min(n, int(call["num_weights"]))
    partials = n // _NROWS_PER_THREAD + segments
    acc = 4 if grad.dtype.itemsize <= 4 else 8
    kernel = (2 * ids + (ids if scale else 0) + ids + 2 * _r(8) + 2 * _r(segments * isz) + _r(partials * isz)
              + _r(partials * d * acc))
    return base + max(sort, kernel)


# -- scans and sorts: ScanUtils.cuh, Sort.cu, Indexing.cu ----------------------------------------------


@transient(aten.cumsum, aten.cumprod)
def _cumsum(call: OpCall, target: CudaTarget, layout: Layout) -> int:
    """``self.to(result dtype)`` when the dtypes differ (``impl_func_cum_ops``), its ``.contiguous()``
    otherwise, and CUB's scan temporaries when the scanned dim holds every element (``scan_dim`` ->
    ``cub::inclusive_scan``; :func:`cub_scan_bytes`).  Reference H100: bool [8, 1024] -> int64 65,536 B,
    [4, 1024] 32,768 B, [1, 1024] 9,728 B (8 KiB + 1,536 B of CUB), [1, 4096] 34,304 B, int32 [4] 1,024 B:
    exactly."""
    x = call["self"]
    if x is None or x.numel == 0 or x.ndim == 0:
        return 0
    out = call.out.dtype if call.outputs else _dtype_of(call.get("dtype"), x.dtype)
    if out != x.dtype:
        extra = _r(x.numel * out.itemsize)
    else:
        extra = _copy_unless_contiguous(x, layout.stride("self", x))
    dim = call["dim"] % x.ndim
    if x.numel == x.shape[dim]:
        extra += cub_scan_bytes(x.numel, out.itemsize)
    return extra


_SMALL_SORT = 4096  # Sort.cpp: should_use_small_sort, an in-place bitonic sort per row


@transient(aten.sort)
def _sort(call: OpCall, target: CudaTarget, layout: Layout) -> int:
    """``sort_out_stable_cuda``: rows of more than 4,096 keys go to ``launch_stable_sort_kernel``: a dense
    copy of a strided input, the ``iota`` indices (one int64 per key of a row) and CUB's radix sort of
    (key, int64 index) pairs over all the key bits; shorter rows sort in place (0).  Reference H100:
    Mixtral's [8192] int64 expert ids 215,552 B, exactly.  Batched rows of more than 4,096 keys (CUB's
    segmented sort) are modelled as one sort of every key (not measured)."""
    x = call["self"]
    if x is None or x.numel == 0:
        return 0
    dim = call.get("dim", -1) % max(x.ndim, 1)
    nsort = x.shape[dim] if x.ndim else 1
    if nsort <= _SMALL_SORT:
        return 0
    strides = layout.stride("self", x)
    dense = strides and strides[dim] == 1 and _is_contiguous(x.shape, strides)
    copy = 0 if dense else _r(x.nbytes)
    n = nsort if x.numel == nsort else x.numel
    return copy + _r(n * 8) + cub_radix_sort_pairs_bytes(n, x.itemsize, 8, 8 * x.itemsize)


@transient(aten.index_put, aten.index_put_, aten._index_put_impl_)
def _index_put(call: OpCall, target: CudaTarget, layout: Layout) -> int:
    """``index_put_with_sort_kernel`` (``accumulate=True`` on CUDA): the linear index (n int64), sorted
    and original positions, ``range`` (n each), CUB's radix sort of (index, position) pairs over the bits
    of the largest slice index, and a dense copy of a strided ``self``.  Without ``accumulate`` the
    TensorIterator kernel allocates nothing.  Reference H100: Mixtral's expert scatter (8,192 indices
    into [8192, 512], [4096, 512] or [8192]) 399,872 B each, exactly."""
    if not call.get("accumulate", False):
        return 0
    self_ = call["self"]
    indices = [i for i in (call.get("indices") or ()) if i is not None]
    if self_ is None or not indices:
        return 0
    n = max(i.numel for i in indices)
    if n == 0:
        return 0
    n_indexed = len(call.get("indices") or ())
    slice_size = _numel(self_.shape[n_indexed:]) if self_.ndim >= n_indexed else 1
    max_key = max(self_.numel - 1, 0) // max(slice_size, 1)
    copy = _copy_unless_contiguous(self_, layout.stride("self", self_))
    return copy + 4 * _r(n * 8) + cub_radix_sort_pairs_bytes(n, 8, 8, cub_num_bits(max_key))


# -- convolutions: cuDNN (Conv_v8.cpp), by algorithm family ---------------------------------------------
#
# cuDNN picks the convolution engine by heuristics that only a GPU can query, so these rules model
# the families the reference H100 steps show (torch 2.11, cuDNN 9.19, NCHW tensors, TF32 allowed for
# float32), each with the workspace its data layout implies:
#
# * **layout transform** (NHWC-native engines on NCHW tensors): the workspace holds the transposed
#   input, the transposed weight (a 1x1 weight has the same layout either way) and the output in
#   NHWC, transposed back at the end; plus one 512-byte block.  Forward: |x| + |w'| + |y| + 512;
#   backward (dgrad reads dy and w and writes dx; wgrad reads dy and x and writes dw; dx is
#   allocated before dgrad runs, dw after): |dy| + |x| + |w'| + 512 for either or both.
# * **pointwise GEMM** (1x1, stride 1): NCHW is already a per-image GEMM; forward needs nothing
#   (0, or 512 B for float32); wgrad accumulates one float partial dw per image: N * K * C * 4 B.
# * **depthwise / grouped** (ATen's own kernels or cuDNN's grouped ones): 0 in every reference step.
# * **few input channels** (C < 8, the stem): 3x3 kernels run on a direct kernel (0); larger kernels
#   pad the channels for tensor cores (bfloat16 to 8, float16 to 4: :func:`_stem_channels`):
#   |x| * pad / C + |w| * pad / C + |y| + 512; float32 keeps C in the forward (|x| + |w| + |y|) and
#   pads to 4 in wgrad.
#
# Which family a convolution gets (cuDNN's choice, fitted on the reference steps):
#
# * forward 1x1, stride 1: the transform when the image has 2..195 positions (below 14x14) and both
#   channel counts are >= 128 (ResNet's 7x7 layer4), else the GEMM; a 1x1 image is a plain GEMM (0);
#   1x1 with a stride: the transform without the weight, |x| + |y| + 512;
# * backward 1x1, stride 1: the family whose workspace is smaller, min(|dy| + |x| + 512, N*K*C*4):
#   per-image GEMMs win when the image is large against the channels (every 28x28 and larger ResNet
#   / MobileNet layer), the transform on 7x7;
# * every other kernel shape (3x3, 7x7 with C >= 8, strides): the transform.
#
# Figures (tests/test_workspace.py measures them on every reference op; "within": exact, or at most
# the allocator's unsplit 1 MiB above a prediction holding a large request):
#
# * forward: 451 of 597 ops exact, 490 within; |error| summed over the 597 ops 1,066 MiB = 6.2 % of
#   the 16.9 GiB measured (663 MiB over, 404 under); the largest misses: ResNet-50's float32 strided
#   1x1 downsample 56x56 -> 28x28 (cuDNN transforms the input and weight, not the output: +|y| - |w|,
#   391.5 MiB at batch 256, 97.5 at 64; the 28x28 and 14x14 ones do transform the output) and the
#   16-bit [N, 1024, 14, 14] -> 512 1x1 (transformed although 14x14: -(|x| + |y|), 147 MiB at 256);
# * backward: 205 of 491 exact, 298 within; |error| 1,055 MiB = 4.3 % of 24.0 GiB, all of it under:
#   a lower bound on every reference op, the engines adding split-K buffers of 0..16 MiB (most often
#   2, 6.8 or 8 MiB) that depend on the kernel chosen (ResNet-50 b256 bf16 layer3 3x3: +15.8 MiB
#   over 50.1 MiB; the largest, 16.0 MiB, on its strided 1x1 over 294 MiB).

_CONV_MIN_CHANNELS = 8  # fewer input channels: the stem families above
_POINTWISE_TRANSFORM_BELOW = 196  # positions per image (14x14) under which a 1x1 forward transforms
_POINTWISE_TRANSFORM_CHANNELS = 128


def _stem_channels(dtype: torch.dtype) -> int:
    """Channels a 16-bit stem is padded to: 4 for float16 (cuDNN's C=4 first-layer kernels), 8 for
    bfloat16.  Reference H100 ResNet-50 b64 stem forward: float16 |x|*4/3 + |w|*4/3 + |y| + 512 =
    128,476,160 B, bfloat16 |x|*8/3 + |w|*8/3 + |y| + 512 = 154,191,360 B (measured 155,189,248:
    the allocator's slack), exactly."""
    return 4 if dtype == torch.float16 else _CONV_MIN_CHANNELS


def _channels_last(spec: TensorSpec | None, strides: tuple[int, ...]) -> bool:
    """A 4-D/5-D tensor laid out channels-last (strides decreasing over N, spatial..., C) and not also
    contiguous (an [N, C, 1, 1] tensor is both: NCHW, as ``suggest_memory_format`` takes it)."""
    if spec is None or spec.ndim < 4 or len(strides) != spec.ndim or _is_contiguous(spec.shape, strides):
        return False
    return strides[1] == 1 and _is_contiguous(tuple(spec.shape[i] for i in (0, *range(2, spec.ndim), 1)),
                                              tuple(strides[i] for i in (0, *range(2, spec.ndim), 1)))


def _conv_geometry(x: TensorSpec, w: TensorSpec, transposed: bool) -> tuple[int, int, int, int, int]:
    """(N, C_in, C_out, positions per input image, kernel positions) of a convolution."""
    n = x.shape[0] if x.ndim == w.ndim else 1
    c_in = x.shape[1] if x.ndim == w.ndim else x.shape[0]
    k_out = w.shape[1] * (x.shape[1] // max(w.shape[0], 1)) if transposed else w.shape[0]
    positions = _numel(x.shape[2:] if x.ndim == w.ndim else x.shape[1:])
    return n, c_in, k_out, positions, _numel(w.shape[2:])


def _cudnn_eligible(x: TensorSpec, w: TensorSpec, groups: int) -> bool:
    """cuDNN runs it with the families above: a float/half/bfloat16 convolution without groups."""
    return groups == 1 and x.dtype in (torch.float32, torch.float16, torch.bfloat16) and w.ndim >= 3


def _stride_of(call: OpCall) -> int:
    stride = call.get("stride") or (1,)
    return max(stride) if isinstance(stride, (list, tuple)) else int(stride)


@transient(aten.convolution, aten.cudnn_convolution, aten._convolution)
def _convolution(call: OpCall, target: CudaTarget, layout: Layout) -> int:
    """cuDNN forward workspace by algorithm family (see the section comment): |x| + |w'| + |y| + 512
    for the layout transform (3x3 and larger kernels, strided or small-image 1x1 convolutions),
    0 / 512 for a stride-1 1x1 GEMM, 0 for grouped and depthwise ones, channel-padded for C < 8."""
    x = call.get("input", call.get("self"))  # cudnn_convolution names its input "self"
    w = call["weight"]
    if x is None or w is None or not call.outputs:
        return 0
    y = call.out
    groups = int(call.get("groups", 1) or 1)
    if not _cudnn_eligible(x, w, groups):
        return 0
    transposed = bool(call.get("transposed", False))
    strides_x = layout.stride("input" if "input" in call.args else "self", x)
    copy = 0 if _channels_last(x, strides_x) else _copy_unless_contiguous(x, strides_x)
    if _channels_last(x, strides_x):
        return _BLOCK  # NHWC engines take it as it is
    n, c, k, positions, kernel = _conv_geometry(x, w, transposed)
    xb, wb, yb = _r(x.nbytes), _r(w.nbytes), _r(y.nbytes)
    if c < _CONV_MIN_CHANNELS and not transposed:
        if kernel <= 9:
            return copy  # direct kernel
        if x.itemsize != 2:
            return copy + xb + wb + yb  # float32: transposed as they are
        pad = _stem_channels(x.dtype)
        return copy + _r(x.nbytes // c * pad) + _r(w.nbytes // c * pad) + yb + _BLOCK
    if kernel == 1:
        if positions == 1:
            return copy  # one position per image: a plain GEMM
        if _stride_of(call) > 1:
            return copy + xb + yb + _BLOCK  # strided: transposed input and output
        if positions < _POINTWISE_TRANSFORM_BELOW and min(c, k) >= _POINTWISE_TRANSFORM_CHANNELS:
            return copy + xb + yb + _BLOCK
        return copy + (_BLOCK if x.dtype == torch.float32 else 0)
    return copy + xb + wb + yb + _BLOCK


@transient(aten.convolution_backward)
def _convolution_backward(call: OpCall, target: CudaTarget, layout: Layout) -> int:
    """cuDNN backward workspaces by algorithm family (see the section comment): |dy| + |x| + |w'| + 512
    for the layout transform, min(that, N * K * C * 4) for a stride-1 1x1 (per-image float partial
    weight gradients), 0 for grouped/depthwise and 1x1-image convolutions; plus the grad-bias sum's
    buffer (:func:`reduction_bytes`) when asked for, whichever is larger."""
    dy, x, w = call["grad_output"], call["input"], call["weight"]
    if dy is None or x is None or w is None:
        return 0
    mask = list(call.get("output_mask") or (True, True, False))
    bias = 0
    if len(mask) > 2 and mask[2] and dy.ndim >= 2:
        dims = {0, *range(2, dy.ndim)}
        bias = reduction_bytes(dy.shape, layout.stride("grad_output", dy), dims, dy.itemsize,
                               _acc_bytes(dy.dtype), dy.itemsize, target, 8 if dy.itemsize == 2 else 4)
    groups = int(call.get("groups", 1) or 1)
    if not _cudnn_eligible(x, w, groups) or not (mask[0] or mask[1]):
        return bias
    transposed = bool(call.get("transposed", False))
    sdy, sx = layout.stride("grad_output", dy), layout.stride("input", x)
    if _channels_last(x, sx):
        return max(bias, _BLOCK)
    copies = _copy_unless_contiguous(dy, sdy) + _copy_unless_contiguous(x, sx)
    n, c, k, positions, kernel = _conv_geometry(x, w, transposed)
    dyb, xb, wb = _r(dy.nbytes), _r(x.nbytes), _r(w.nbytes)
    if c < _CONV_MIN_CHANNELS and not transposed:
        if x.dtype == torch.float32 and kernel <= 9:
            return max(bias, copies)
        pad = 4 if x.dtype == torch.float32 else _stem_channels(x.dtype)
        return max(bias, copies + dyb + _r(x.nbytes // c * pad) + _BLOCK)
    if kernel == 1 and positions == 1:
        return max(bias, copies)
    transform = dyb + xb + (0 if kernel == 1 else wb) + _BLOCK
    if kernel == 1 and _stride_of(call) == 1:
        per_image = n * k * c * 4 if mask[1] else 0  # wgrad: one float dw per image, then summed
        return max(bias, copies + min(transform, per_image))
    return max(bias, copies + transform)


# -- outputs the CUDA kernel leaves off the GPU -------------------------------------------------------


def device_bytes(node: OpNode, index: int, nbytes: int) -> int:
    """Bytes output ``index`` of ``node`` takes on the GPU (the fake kernel says ``nbytes``)."""
    if node.target is aten._scaled_dot_product_efficient_attention.default and index in (2, 3):
        dropout = node.args[5] if len(node.args) > 5 else node.kwargs.get("dropout_p", 0.0)
        return nbytes if dropout else 0  # philox seed/offset: host tensors without dropout
    return nbytes


# -- the whole step ------------------------------------------------------------------------------------


@dataclass
class LibraryMemory:
    """What the CUDA libraries add to a captured step (see the module docstring)."""

    transients: dict[int, int] = field(default_factory=dict)  # node index -> bytes during the op
    persistent: list[tuple[int, int, str]] = field(default_factory=list)  # (node index, bytes, what), kept
    resize: dict[int, int] = field(default_factory=dict)  # sid -> bytes on the GPU


def library_memory(cap: Any, target: CudaTarget) -> LibraryMemory:
    """The cuBLAS workspaces, kernel temporaries and device sizes of every op of ``cap``."""
    from .tally import op_call

    out = LibraryMemory()
    seen: set[str] = set()
    ws = cublas_workspace_bytes(target)
    lt = cublaslt_workspace_bytes()
    for index, node in enumerate(cap.nodes):
        target_op = node.target
        if id(target_op) in _GEMMS:
            thread = _thread(node)
            if thread not in seen:
                seen.add(thread)
                out.persistent.append((index, ws, f"cuBLAS workspace ({thread} thread)"))
            if f"lt:{thread}" not in seen and _uses_cublaslt(node):
                seen.add(f"lt:{thread}")
                out.persistent.append((index, lt, f"cuBLASLt workspace ({thread} thread)"))
        rule = _TRANSIENT.get(getattr(target_op, "overloadpacket", None))
        if rule is not None:
            try:
                nbytes = int(rule(op_call(node), target, layout_of(node)))
            except Exception as exc:  # a rule that cannot handle these arguments is a bug: say where
                raise RuntimeError(f"transient rule for {target_op} failed on {node.format_node()}: {exc}") from exc
            if nbytes > 0:
                out.transients[index] = nbytes
        for i, (sid, spec) in enumerate(zip(node.meta.get("storage", ()), node.meta.get("spec", ()))):
            nbytes = cap.storage_bytes[sid]
            on_device = device_bytes(node, i, nbytes)
            if on_device != nbytes:
                out.resize[sid] = on_device
    return out

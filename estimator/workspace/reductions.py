"""Temporaries of ATen's reductions and softmax: the cross-block buffers of a reduction's launch
configuration (``Reduce.cuh``), float accumulators of 16-bit inputs, softmax backward's
``grad * output`` and ``_safe_softmax``'s masks.
"""

from __future__ import annotations

from typing import Any

import torch

from ..rules.registry import OpCall, TensorSpec
from ..hardware import Multiprocessors, multiprocessors
from ..target import CudaTarget
from .layout import (
    Layout, contiguous_strides, copy_unless_contiguous, dtype_of, is_contiguous, numel_of, rounded, transient,
)
aten = torch.ops.aten


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
    numel = numel_of(tuple(sizes))
    if numel == 0:
        return 0
    n_reduce = sum(1 for s in out if s == 0)
    num_outputs = numel_of(tuple(s for s, o in zip(sizes, out) if o != 0))
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
    sm = (Multiprocessors(target.sms, target.max_threads_per_sm) if target.sms and target.max_threads_per_sm
          else multiprocessors(target.name))  # a card described in a GPU file has its own
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
    return rounded(buffer) + rounded(4 * grid_x)  # staging buffer; one int semaphore per output block


_INT32_MAX = 2**31 - 1


def reduction_bytes(shape: tuple[int, ...], in_strides: tuple[int, ...], reduced: set[int], itemsize: int,
                    arg_bytes: int, out_bytes: int, target: CudaTarget, input_vec_size: int = 4) -> int:
    """The temporaries of a TensorIterator reduction on CUDA (``gpu_reduce_kernel``): the largest
    cross-block buffer of its launches, and, when the iterator is too large for 32-bit offsets and the
    output type cannot hold the accumulator (``AccumulationBuffer``), an accumulator copy of the output
    kept across the launches that ``with_32bit_indexing`` splits it into (each split halves the
    dimension with the largest extent)."""
    sizes, out, inp = _reduction_iterator(shape, in_strides, reduced, itemsize, out_bytes)
    if not sizes or numel_of(tuple(sizes)) == 0:
        return 0
    buffers = _launch_buffers(sizes, out, inp, (itemsize, arg_bytes, target, input_vec_size), {})
    offsets = [sum((n - 1) * s for n, s in zip(sizes, st)) for st in (out, inp)]
    split = numel_of(tuple(sizes)) > _INT32_MAX or max(offsets) >= _INT32_MAX
    accumulate = 0
    if split and out_bytes < arg_bytes:  # AccumulationBuffer: the output in the accumulator type
        extent = max([out_bytes] + [n * s for n, s in zip(sizes, out)])
        accumulate = rounded(extent // out_bytes * arg_bytes)
    return accumulate + buffers


def _launch_buffers(sizes: list[int], out: list[int], inp: list[int], kernel: tuple, seen: dict[tuple, int]) -> int:
    """The largest cross-block buffer of the launches a reduction of ``sizes`` splits into (``kernel``:
    :func:`reduce_buffer_bytes`'s itemsize, arg_bytes, target, input_vec_size; ``seen``: sizes already
    costed).  A module-level recursion: a nested function calling itself is a reference cycle per call."""
    key = tuple(sizes)
    if key in seen:
        return seen[key]
    offsets = [sum((n - 1) * s for n, s in zip(sizes, st)) for st in (out, inp)]
    if numel_of(key) <= _INT32_MAX and max(offsets) < _INT32_MAX:
        itemsize, arg_bytes, target, input_vec_size = kernel
        seen[key] = reduce_buffer_bytes(sizes, out, inp, itemsize, arg_bytes, target, input_vec_size)
        return seen[key]
    # get_dim_to_split: the largest (size - 1) * |stride| over the operands, last dim first on ties
    dim = max(range(len(sizes) - 1, -1, -1), key=lambda d: max((sizes[d] - 1) * abs(st[d]) for st in (out, inp)))
    half = list(sizes)
    half[dim] = sizes[dim] // 2
    rest = list(sizes)
    rest[dim] = sizes[dim] - half[dim]
    seen[key] = max(_launch_buffers(half, out, inp, kernel, seen), _launch_buffers(rest, out, inp, kernel, seen))
    return seen[key]


def _reduced_dims(shape: tuple[int, ...], dim: Any) -> set[int]:
    """The dims a reduction's ``dim`` argument names (None or empty: all)."""
    nd = len(shape)
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return set(range(nd))
    dims = dim if isinstance(dim, (list, tuple)) else (dim,)
    return {d % nd for d in dims} if nd else set()


def _low_precision(dtype: torch.dtype) -> bool:
    return dtype in (torch.float16, torch.bfloat16)


def acc_bytes(dtype: torch.dtype) -> int:
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
    out_dtype = dtype_of(call.get("dtype"), call.out.dtype if call.outputs else x.dtype)
    lowp_to_float = _low_precision(x.dtype) and out_dtype == torch.float32
    cast = 0
    if out_dtype != x.dtype and not lowp_to_float:
        cast = rounded(x.numel * out_dtype.itemsize)  # self.to(out_dtype): the kernel reads its own type
        x = TensorSpec(x.shape, out_dtype)
        layout = Layout({"self": contiguous_strides(x.shape)})
    vec = 8 if x.itemsize == 2 else 4
    reduced = _reduced_dims(x.shape, call.get("dim"))
    return cast + reduction_bytes(x.shape, layout.stride("self", x), reduced, x.itemsize, acc_bytes(x.dtype),
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
    tmp_copy = rounded(numel_of(shape) * dtype.itemsize) if (g == o and grad.shape == output.shape
                                                      and not is_contiguous(shape, g)) else 0
    return rounded(numel_of(shape) * dtype.itemsize) + tmp_copy + copy_unless_contiguous(output, o)


@transient(aten._log_softmax_backward_data)
def _log_softmax_backward(call: OpCall, target: CudaTarget, layout: Layout) -> int:
    """``host_softmax_backward``'s ``.contiguous()`` copies of grad and output (0 for contiguous ones,
    as every reference step measures)."""
    return (copy_unless_contiguous(call["grad_output"], layout.stride("grad_output", call["grad_output"]))
            + copy_unless_contiguous(call["output"], layout.stride("output", call["output"])))


@transient(aten._softmax, aten._log_softmax)
def _softmax(call: OpCall, target: CudaTarget, layout: Layout) -> int:
    """``host_softmax``'s ``input.contiguous()`` copy (0 for a contiguous input, as measured)."""
    return copy_unless_contiguous(call["self"], layout.stride("self", call["self"]))


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
    return copy_unless_contiguous(x, layout.stride("self", x)) + rounded(x.numel) + rounded(rows) + rounded(x.dtype.itemsize)

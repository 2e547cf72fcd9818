"""CUB's sort and scan buffers, and the ops that take them: embedding backward, ``sort``,
``index_put`` and ``cumsum``.
"""

from __future__ import annotations

import torch

from ..rules.registry import OpCall
from ..target import CudaTarget
from .layout import Layout, copy_unless_contiguous, dtype_of, is_contiguous, numel_of, rounded, transient, viewable_flat
aten = torch.ops.aten


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
        return rounded(1)
    passes = -(-bits // 8)  # one pass per 8 key bits
    tiles = -(-n // _ONESWEEP_TILE)  # lookback: one 256-digit row per tile
    return rounded(_cub_temp(passes * 256 * 8, tiles * 256 * 8, n * key_bytes, n * value_bytes, passes * 8))


_SCAN_TILE = 128 * 15  # CUB scan: 128 threads x 15 items a tile (4-byte items; the tile state is tiny)


def cub_scan_bytes(n: int, itemsize: int) -> int:
    """Temporary storage of ``cub::DeviceScan::InclusiveScan``: the decoupled-lookback tile state for
    ``tiles + 32`` (warp padding) tiles.  Items of 4 bytes or less pack status and value into one 8-byte
    word; 8-byte items keep three arrays (1-byte status, partial and inclusive values).  Reference H100:
    an int32 scan of 4 items 1,024 B; int64 scans of 1,024 and 4,096 items 1,536 B: the formula gives
    each."""
    tiles = -(-n // _SCAN_TILE) + 32
    if itemsize <= 4:
        return rounded(_cub_temp(tiles * 8))
    return rounded(_cub_temp(tiles, tiles * itemsize, tiles * itemsize))


def cub_num_bits(max_key: int) -> int:
    """``at::cuda::cub::get_num_bits``: bits needed for keys up to ``max_key``."""
    bits = 1
    while max_key > 1:
        max_key >>= 1
        bits += 1
    return bits


# -- embeddings: Embedding.cu, EmbeddingBackwardKernel.cu --------------------------------------------


@transient(aten.embedding)
def _embedding(call: OpCall, target: CudaTarget, layout: Layout) -> int:
    """``embedding`` = ``weight.index_select(0, indices.reshape(-1))``: the reshape copies indices that
    cannot be flattened as a view.  Reference H100: BERT's token-type ids (an expanded [8, 512] int64,
    strides (0, 1)) 32,768 B, contiguous ids 0."""
    idx = call["indices"]
    if idx is None or idx.ndim <= 1:
        return 0
    return 0 if viewable_flat(idx.shape, layout.stride("indices", idx)) else rounded(idx.nbytes)


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
    base = (copy_unless_contiguous(idx, layout.stride("indices", idx))
            + copy_unless_contiguous(grad, layout.stride("grad_output", grad)))
    scale = bool(call.get("scale_grad_by_freq", False))
    if n <= 3072 and not scale:
        return base
    isz = idx.itemsize
    ids = rounded(n * isz)
    sort = 3 * ids + cub_radix_sort_pairs_bytes(n, isz, isz, 8 * isz)
    segments = min(n, int(call["num_weights"]))
    partials = n // _NROWS_PER_THREAD + segments
    acc = 4 if grad.dtype.itemsize <= 4 else 8
    kernel = (2 * ids + (ids if scale else 0) + ids + 2 * rounded(8) + 2 * rounded(segments * isz) + rounded(partials * isz)
              + rounded(partials * d * acc))
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
    out = call.out.dtype if call.outputs else dtype_of(call.get("dtype"), x.dtype)
    if out != x.dtype:
        extra = rounded(x.numel * out.itemsize)
    else:
        extra = copy_unless_contiguous(x, layout.stride("self", x))
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
    dense = strides and strides[dim] == 1 and is_contiguous(x.shape, strides)
    copy = 0 if dense else rounded(x.nbytes)
    n = nsort if x.numel == nsort else x.numel
    return copy + rounded(n * 8) + cub_radix_sort_pairs_bytes(n, x.itemsize, 8, 8 * x.itemsize)


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
    slice_size = numel_of(self_.shape[n_indexed:]) if self_.ndim >= n_indexed else 1
    max_key = max(self_.numel - 1, 0) // max(slice_size, 1)
    copy = copy_unless_contiguous(self_, layout.stride("self", self_))
    return copy + 4 * rounded(n * 8) + cub_radix_sort_pairs_bytes(n, 8, 8, cub_num_bits(max_key))

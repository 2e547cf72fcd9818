"""Pure functions of shapes for the step-time model: element and byte counts, GEMM dimensions of
matmuls, grouped matmuls and convolutions, alignment of leading dimensions, the causal fraction
of attention and the launches of a foreach kernel.
"""

from __future__ import annotations

import math
from math import prod
from typing import Iterable, Sequence

from .optable import FOREACH_BLOCKS, FOREACH_CHUNK, FOREACH_TENSORS, ITEMSIZE, TENSOR_CORE_BYTES

# -- math helpers (pure functions of shapes) -------------------------------------------------


def itemsize(dtype: str) -> int:
    """Bytes per element of a dtype named as in torch without the prefix ("bfloat16")."""
    return ITEMSIZE.get(dtype, 4)


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
    align = TENSOR_CORE_BYTES
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
    # a launch takes up to FOREACH_TENSORS[depth] tensors and FOREACH_BLOCKS chunks of 64k elements
    if not numels:
        return 0
    per_launch = FOREACH_TENSORS.get(depth, 30)
    chunks = sum(max(1, math.ceil(n / FOREACH_CHUNK)) for n in numels)
    return max(math.ceil(len(numels) / per_launch), math.ceil(chunks / FOREACH_BLOCKS))


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

"""Reductions, scans, sorting and the softmax family (OTHER).

Convention: a reduction of N input elements into M outputs costs 1 FLOP per
input element per accumulating operation (N adds for a sum; the N - M
"first element needs no add" saving is ignored) plus its per-output finishing
operations (a divide for a mean, a sqrt for a 2-norm).  Transcendentals count
1, like an add.
"""

from __future__ import annotations

import math

from .registry import OTHER, TensorSpec, aten_ops, register

# -- math helpers (pure functions of element counts) -------------------------


def sum_flops(n: int) -> int:
    """N adds."""
    return n


def mean_flops(n: int, m: int) -> int:
    """N adds, then one divide per output."""
    return n + m


def var_flops(n: int, m: int) -> int:
    """Two passes: mean (N adds, M divides), then (x - mean)^2 summed (3N), then M divides."""
    # mean: N + M; deviations: sub, square, add per element: 3N; final divide by N - correction: M
    return 4 * n + 2 * m


def std_flops(n: int, m: int) -> int:
    """The variance, then one sqrt per output."""
    return var_flops(n, m) + m


def vector_norm_flops(n: int, m: int, ord=2) -> int:
    """p-norm of N elements into M: 2N + M for p=2 (square, add; sqrt), 2N for 1/inf (abs, add/max),
    N for p=0 (count non-zeros), 3N + M otherwise (abs, pow, add; root)."""
    p = 2.0 if ord is None or ord == "fro" else float(ord)
    if p == 2:
        return 2 * n + m
    if p in (1, math.inf, -math.inf):
        return 2 * n
    if p == 0:
        return n
    return 3 * n + m


def logsumexp_flops(n: int, m: int) -> int:
    """max (N), x - max (N), exp (N), sum (N), then log and + max per output (2M)."""
    return 4 * n + 2 * m


def softmax_flops(n: int) -> int:
    """max (N), x - max (N), exp (N), sum (N), divide (N)."""
    # the per-row normalizer is shared: exp(x - max) / sum over the row
    return 5 * n


def log_softmax_flops(n: int, rows: int) -> int:
    """max, x - max, exp, sum (4N), then log per row and subtract (N + rows)."""
    return 5 * n + rows


def softmax_backward_flops(n: int) -> int:
    """grad_in = y * (g - sum(g*y)): mul, sum, sub, mul per element."""
    return 4 * n


def log_softmax_backward_flops(n: int) -> int:
    """grad_in = g - exp(y) * sum(g): sum, exp, mul, sub per element."""
    return 4 * n


def sort_flops(n: int, length: int) -> int:
    """N * ceil(log2(length)) comparisons (a comparison sort along a dim of ``length``)."""
    return n * max(1, math.ceil(math.log2(max(length, 2))))


def _rows(spec: TensorSpec, dim: int) -> int:
    """Number of rows (slices along ``dim``) of ``spec``."""
    if spec.ndim == 0:
        return 1
    return spec.numel // max(spec.shape[dim], 1)


# -- rules ---------------------------------------------------------------------


@register(*aten_ops("sum", "nansum", "prod", "cumsum", "cumprod", "count_nonzero"), kind=OTHER)
def sum_(call):
    """N FLOPs: one add (multiply for prod) per input element."""
    return sum_flops(call["self"].numel)


@register(
    *aten_ops("amax", "amin", "argmax", "argmin", "any", "all", "aminmax", "cummax", "cummin",
              "median", "nanmedian", "mode", "kthvalue", "_is_all_true", "_is_any_true"),
    kind=OTHER,
)
def compare_reduce(call):
    """N FLOPs: one comparison (or logical op) per input element."""
    return call["self"].numel


@register(*aten_ops("max", "min"), kind=OTHER)
def max_(call):
    """N FLOPs: one comparison per input element (max.other: 1 per output element)."""
    if call.get("other") is not None:  # the binary overload: elementwise max(a, b)
        return call.out.numel
    return call["self"].numel


@register(*aten_ops("mean", "nanmean"), kind=OTHER)
def mean(call):
    """N + M FLOPs: N adds, one divide per output."""
    return mean_flops(call["self"].numel, call.out.numel)


@register(*aten_ops("var", "var_mean"), kind=OTHER)
def var(call):
    """4N + 2M FLOPs: mean (N + M), then (x - mean)^2 accumulated (3N), then divide (M)."""
    return var_flops(call["self"].numel, call.out.numel)


@register(*aten_ops("std", "std_mean"), kind=OTHER)
def std(call):
    """4N + 3M FLOPs: the variance (4N + 2M), then sqrt per output (M)."""
    return std_flops(call["self"].numel, call.out.numel)


@register(*aten_ops("linalg_vector_norm", "linalg__powsum"), kind=OTHER)
def linalg_vector_norm(call):
    """2N + M FLOPs for ord=2 (square, add; sqrt); 2N for 1/inf; N for 0; 3N + M otherwise."""
    return vector_norm_flops(call["self"].numel, call.out.numel, call.get("ord", 2))


@register(*aten_ops("norm", "native_norm", "frobenius_norm"), kind=OTHER)
def norm(call):
    """2N + M FLOPs for p=2 (square, add; sqrt); 2N for 1/inf; N for 0; 3N + M otherwise."""
    return vector_norm_flops(call["self"].numel, call.out.numel, call.get("p", 2))


@register(*aten_ops("logsumexp"), kind=OTHER)
def logsumexp(call):
    """4N + 2M FLOPs: max, x - max, exp, sum per element; log and + max per output."""
    return logsumexp_flops(call["self"].numel, call.out.numel)


@register(*aten_ops("logcumsumexp", "_logcumsumexp"), kind=OTHER)
def logcumsumexp(call):
    """4N FLOPs: per element a running log-add-exp (max, sub, exp, log1p-add)."""
    return 4 * call["self"].numel


@register(*aten_ops("sort", "topk"), kind=OTHER)
def sort(call):
    """N*ceil(log2(L)) FLOPs: comparisons of a sort along a dim of length L."""
    x = call["self"]
    length = x.shape[call.get("dim", -1)] if x.ndim else 1
    return sort_flops(x.numel, length)


@register(*aten_ops("searchsorted", "bucketize"), kind=OTHER)
def binary_search(call):
    """N*ceil(log2(L)) FLOPs: a binary search of each of the N queries (one per output element) among the L
    sorted values (searchsorted: the last dimension of ``sorted_sequence``; bucketize: ``boundaries``)."""
    sorted_values = call.get("sorted_sequence") or call.get("boundaries")
    length = sorted_values.shape[-1] if sorted_values is not None and sorted_values.ndim else 1
    return sort_flops(call.out.numel, length)


@register(*aten_ops("_unique", "_unique2", "unique_dim"), kind=OTHER)
def unique(call):
    """N*ceil(log2(N)) + N FLOPs: sort the N elements (or rows), then 1 comparison with the neighbour each."""
    n = call["self"].numel
    return sort_flops(n, n) + n


@register(*aten_ops("unique_consecutive", "unique_dim_consecutive"), kind=OTHER)
def unique_consecutive(call):
    """N FLOPs: 1 comparison of each element with its neighbour (no sort)."""
    return call["self"].numel


@register(*aten_ops("_softmax", "_masked_softmax"), kind=OTHER)
def softmax(call):
    """5N FLOPs: max, x - max, exp, sum, divide per element."""
    return softmax_flops(call["self"].numel)


@register(*aten_ops("_safe_softmax"), kind=OTHER)
def safe_softmax(call):
    """6N FLOPs: softmax (5N) and a select zeroing fully masked rows (N)."""
    return softmax_flops(call["self"].numel) + call["self"].numel


@register(*aten_ops("_log_softmax"), kind=OTHER)
def log_softmax(call):
    """5N + R FLOPs (R rows): max, x - max, exp, sum, subtract per element; one log per row."""
    x = call["self"]
    return log_softmax_flops(x.numel, _rows(x, call["dim"]))


@register(*aten_ops("_softmax_backward_data", "_masked_softmax_backward"), kind=OTHER)
def softmax_backward(call):
    """4N FLOPs: y * (g - sum(g * y)): mul, sum, sub, mul per element."""
    return softmax_backward_flops(call["grad_output"].numel)


@register(*aten_ops("_log_softmax_backward_data"), kind=OTHER)
def log_softmax_backward(call):
    """4N FLOPs: g - exp(y) * sum(g): sum, exp, mul, sub per element."""
    return log_softmax_backward_flops(call["grad_output"].numel)


@register(*aten_ops("cumprod_backward"), kind=OTHER)
def cumprod_backward(call):
    """4N FLOPs: a reversed cumsum of grad * output, divided by input (mul, add, div, select for zeros)."""
    return 4 * call["input"].numel


@register(*aten_ops("_cdist_forward"), kind=OTHER)
def cdist(call):
    """3*P*R*D FLOPs (p=2: sub, square, add per coordinate pair) + P*R sqrt; x1 [.., P, D], x2 [.., R, D]."""
    pairs = call.out.numel  # [.., P, R]: one distance per (row of x1, row of x2)
    return 3 * pairs * call["x1"].shape[-1] + pairs


@register(*aten_ops("_euclidean_dist"), kind=OTHER)
def euclidean_dist(call):
    """cdist's matrix-multiply path (p=2, large inputs; ``_euclidean_dist`` in ATen's Distance.cpp): squared
    norms of both sides (2*P*D + 2*R*D), x1 * -2 (P*D), [-2*x1, |x1|^2, 1] @ [x2, 1, |x2|^2]^T
    (2*P*R*(D+2)), then clamp and sqrt per distance (2*P*R); x1 [.., P, D], x2 [.., R, D]."""
    x1, x2 = call["x1"], call["x2"]
    d = x1.shape[-1]
    rows1, rows2, pairs = x1.numel // d, x2.numel // d, call.out.numel
    return 3 * rows1 * d + 2 * rows2 * d + 2 * pairs * (d + 2) + 2 * pairs


@register(*aten_ops("_cdist_backward"), kind=OTHER)
def cdist_backward(call):
    """4*P*R*D FLOPs: per coordinate pair (x1 - x2) * grad / dist accumulated: sub, mul, div, add."""
    x1 = call["x1"]
    pairs = call["grad"].numel
    return 4 * pairs * x1.shape[-1]


@register(*aten_ops("_pdist_forward"), kind=OTHER)
def pdist(call):
    """3*D per pair + 1 sqrt, N(N-1)/2 pairs (the output): cdist's count over the rows of one [N, D] matrix."""
    pairs = call.out.numel
    return 3 * pairs * call["self"].shape[-1] + pairs


@register(*aten_ops("_pdist_backward"), kind=OTHER)
def pdist_backward(call):
    """4*D per pair (cdist's backward): (x_i - x_j) * grad / dist, added into both rows' gradients."""
    return 4 * call["grad"].numel * call["self"].shape[-1]


@register(*aten_ops("segment_reduce"), kind=OTHER)
def segment_reduce(call):
    """1 per element of ``data``: each added (compared for max/min) into its segment's result."""
    return call["data"].numel


@register(*aten_ops("_segment_reduce_backward"), kind=OTHER)
def segment_reduce_backward(call):
    """Per element of ``data`` (ATen's ``_segment_reduce_backward`` kernels): sum 1 (its segment's gradient added
    into place), mean 2 (and divided by the length), max/min 3 (compared with the result, masked, divided among
    ties), prod 3 (result / element * gradient)."""
    per = {"sum": 1, "mean": 2, "max": 3, "min": 3, "prod": 3}.get(call["reduce"], 1)
    return per * call["data"].numel


@register(*aten_ops("renorm"), kind=OTHER)
def renorm(call):
    """norm FLOPs of the S slices along dim (p=2: 2N + S), one clamp per slice (S), one scale per element (N)."""
    x = call["self"]
    slices = x.shape[call["dim"]] if x.ndim else 1
    return vector_norm_flops(x.numel, slices, call["p"]) + slices + x.numel


@register(*aten_ops("trace"), kind=OTHER)
def trace(call):
    """min(m, n) FLOPs: the diagonal's adds."""
    return min(call["self"].shape) if call["self"].ndim else 1


@register(*aten_ops("equal", "nonzero", "nonzero_static", "argwhere"), kind=OTHER)
def compare_all(call):
    """N FLOPs: one comparison per input element."""
    return call["self"].numel


@register(*aten_ops("histc", "bincount"), kind=OTHER)
def histogram(call):
    """3 FLOPs per input element: its bin ((x - min) * bins / (max - min), or the value itself for
    bincount) and one count increment."""
    return 3 * call["self"].numel

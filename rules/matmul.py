"""Matrix products: mm, addmm, bmm, baddbmm and their relatives.

``nn.Linear``, ``torch.matmul`` and ``torch.einsum`` reach the dispatcher as
these ops (plus views), so they are covered here.  The matmul-class formulas
equal ``torch.utils.flop_counter`` exactly: ``2*m*k*n`` per product, bias and
``alpha``/``beta`` scaling not counted.

Matrix-vector and vector-vector products (mv, addmv, dot, vdot, addr) are
counted as OTHER: they are memory-bound, run on no tensor core, and
``FlopCounterMode`` does not count them either.
"""

from __future__ import annotations

from math import prod

from .registry import MATMUL, OTHER, aten_ops, register

# -- math helpers (pure functions of shapes) ---------------------------------


def mm_flops(a_shape, b_shape) -> int:
    """FLOPs of ``[m, k] @ [k, n]``."""
    # [m, k] @ [k, n] -> [m, n]: one multiply-add per (m, n, k) triple
    m, k = a_shape
    k2, n = b_shape
    if k != k2:
        raise ValueError(f"mm: inner dimensions differ: {tuple(a_shape)} @ {tuple(b_shape)}")
    return 2 * m * k * n


def bmm_flops(a_shape, b_shape) -> int:
    """FLOPs of ``[b, m, k] @ [b, k, n]``."""
    # [b, m, k] @ [b, k, n] -> [b, m, n]: b independent mm's
    b, m, k = a_shape
    b2, k2, n = b_shape
    if b != b2:
        raise ValueError(f"bmm: batch dimensions differ: {tuple(a_shape)} @ {tuple(b_shape)}")
    return b * mm_flops((m, k), (k2, n))


def trilinear_flops(shapes, expands) -> int:
    """FLOPs of ``sum over sumdim of i1*i2*i3`` (``aten._trilinear``, what ``nn.Bilinear`` runs)."""
    # each input unsqueezed at its expand dims; one multiply-add per point of the broadcast index space
    full = []
    for shape, expand in zip(shapes, expands):
        dims = list(shape)
        for d in sorted(expand):
            dims.insert(d, 1)
        full.append(dims)
    return 2 * prod(max(sizes) for sizes in zip(*full))


def grouped_mm_flops(a_shape, b_shape, out_shape) -> int:
    """Grouped GEMM (mixture-of-experts): every output element is a dot product of the contraction
    length, except 2D x 2D, where ``offs`` splits the contraction itself (the weight gradient)."""
    if len(a_shape) == 2 and len(b_shape) == 2:
        # (K, T) @ (T, N) split over T into G groups -> (G, K, N): 2 * K * T * N in all
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    # (T, K) @ (G, K, N) -> (T, N), each row with its group's matrix; (G, M, K) @ (G, K, N) -> (G, M, N)
    n = 1
    for s in out_shape:
        n *= s
    return 2 * n * a_shape[-1]


def mv_flops(a_shape, v_shape) -> int:
    """FLOPs of ``[m, n] @ [n]``."""
    # [m, n] @ [n] -> [m]: one multiply-add per matrix element
    return mm_flops(a_shape, (v_shape[0], 1))


def dot_flops(v_shape) -> int:
    """FLOPs of ``[n] . [n]``."""
    # [n] . [n] -> []: one multiply-add per element
    return 2 * v_shape[0]


def outer_flops(u_shape, v_shape) -> int:
    """FLOPs of ``self + u (x) v``: one multiply and one add per output element."""
    # [m] (x) [n] -> [m, n]
    return 2 * u_shape[0] * v_shape[0]


# -- rules ---------------------------------------------------------------------


@register(*aten_ops("mm", "_int_mm"), kind=MATMUL)
def mm(call):
    """2*m*k*n for self [m, k] @ mat2 [k, n]."""
    return mm_flops(call["self"].shape, call["mat2"].shape)


@register(*aten_ops("addmm", "_addmm_activation"), kind=MATMUL)
def addmm(call):
    """2*m*k*n for mat1 [m, k] @ mat2 [k, n]; the bias add is not counted (as torch)."""
    return mm_flops(call["mat1"].shape, call["mat2"].shape)


@register(*aten_ops("_scaled_mm", "_scaled_mm_v2"), kind=MATMUL)
def scaled_mm(call):
    """2*m*k*n for self [m, k] @ mat2 [k, n]; scaling and bias are not counted (as torch)."""
    return mm_flops(call["self"].shape, call["mat2"].shape)


@register(*aten_ops("_grouped_mm", "_scaled_grouped_mm"), kind=MATMUL)
def grouped_mm(call):
    """2*T*K*N for (T, K) tokens x (G, K, N) experts; 2*K*T*N for the grouped weight gradient (float8's scaled
    variant the same; its scaling is not counted, as for ``_scaled_mm``)."""
    return grouped_mm_flops(call["self"].shape, call["mat2"].shape, call.out.shape)


@register(*aten_ops("bmm"), kind=MATMUL)
def bmm(call):
    """2*b*m*k*n for self [b, m, k] @ mat2 [b, k, n]."""
    return bmm_flops(call["self"].shape, call["mat2"].shape)


@register(*aten_ops("baddbmm"), kind=MATMUL)
def baddbmm(call):
    """2*b*m*k*n for batch1 [b, m, k] @ batch2 [b, k, n]; the add of self is not counted (as torch)."""
    return bmm_flops(call["batch1"].shape, call["batch2"].shape)


@register(*aten_ops("addbmm"), kind=MATMUL)
def addbmm(call):
    """2*b*m*k*n for batch1 [b, m, k] @ batch2 [b, k, n] summed over b (FlopCounterMode has no formula)."""
    # the sum over b is the accumulation the multiply-adds already count
    return bmm_flops(call["batch1"].shape, call["batch2"].shape)


@register(*aten_ops("_trilinear"), kind=MATMUL)
def trilinear(call):
    """2*prod(broadcast index space): nn.Bilinear's x1 W x2 is 2*B*O*I1*I2 (FlopCounterMode has no formula)."""
    return trilinear_flops(
        (call["i1"].shape, call["i2"].shape, call["i3"].shape),
        (call["expand1"], call["expand2"], call["expand3"]),
    )


@register(*aten_ops("mv"), kind=OTHER)
def mv(call):
    """2*m*n for self [m, n] @ vec [n] (matrix-vector: memory-bound, not matmul class)."""
    return mv_flops(call["self"].shape, call["vec"].shape)


@register(*aten_ops("addmv"), kind=OTHER)
def addmv(call):
    """2*m*n for mat [m, n] @ vec [n]; the add of self is not counted."""
    return mv_flops(call["mat"].shape, call["vec"].shape)


@register(*aten_ops("dot", "vdot"), kind=OTHER)
def dot(call):
    """2*n for a dot product of two [n] vectors."""
    return dot_flops(call["self"].shape)


@register(*aten_ops("addr"), kind=OTHER)
def addr(call):
    """2*m*n for self + vec1 [m] (x) vec2 [n]: one multiply and one add per output element."""
    return outer_flops(call["vec1"].shape, call["vec2"].shape)


# -- triangular solves (OTHER: FlopCounterMode has no formula for them) ------------------------


def triangular_solve_flops(n: int, x_shape, left: bool = True) -> int:
    """n*n*k per batch for A [.., n, n] triangular and the solution X [.., n, k] (left: A X = B) or
    [.., k, n] (right: X A = B): back-substitution does n(n+1)/2 multiply-adds and n divides per
    right-hand side, counted as n*n FLOPs (the ``trsm`` count of LAPACK Working Note 41)."""
    k = x_shape[-1] if left else x_shape[-2]
    batch = 1
    for d in x_shape[:-2]:
        batch *= d
    return batch * n * n * k


@register(*aten_ops("linalg_solve_triangular"), kind=OTHER)
def linalg_solve_triangular(call):
    """n*n*k per batch: A (``self``) [.., n, n] triangular, X [.., n, k] (left=True) or [.., k, n]."""
    return triangular_solve_flops(call["self"].shape[-1], call.out.shape, bool(call.get("left", True)))


@register(*aten_ops("triangular_solve"), kind=OTHER)
def triangular_solve(call):
    """n*n*k per batch: A [.., n, n] triangular, X [.., n, k]."""
    return triangular_solve_flops(call["A"].shape[-1], call.out.shape, True)


# ATen's matrix exponential (aten/src/ATen/native/LinearAlgebra.cpp, ``mexp``): the Taylor polynomials of degree
# 1, 2, 4, 8, 12 and 18 of Bader, Blanes and Casas ("Computing the matrix exponential with an optimized Taylor
# polynomial approximation", Mathematics 7(12), 2019), which take 0, 1, 2, 3, 4 and 5 matrix products
MATRIX_EXP_PRODUCTS = 5


@register(*aten_ops("linalg_matrix_exp"), kind=OTHER)
def linalg_matrix_exp(call):
    """5 products of n x n matrices per matrix, 2 n^3 each: the degree-18 polynomial, the most ATen evaluates.  The
    degree is picked from each matrix's 1-norm, and above the degree-18 threshold (3.01 in float) it adds
    ceil(log2(norm / 3.01)) squarings: values the trace does not have, not counted (a small norm takes fewer)."""
    n = call["self"].shape[-1]
    return MATRIX_EXP_PRODUCTS * 2 * n ** 3 * (prod(call["self"].shape) // (n * n))

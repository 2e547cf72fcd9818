"""Dense linear algebra (OTHER): ``torch.linalg``'s factorizations, solves, inverses and decompositions.

Counts are LAPACK's, as LAPACK Working Note 41 (Blackford and Dongarra, *Installation Guide for LAPACK*, 1999,
section 3.2, the operation counts of each routine) and Golub and Van Loan (*Matrix Computations*, 4th ed., 2013)
give them, leading terms only, in FLOPs (a multiply and an add are one FLOP each: the project's multiply-add = 2).
Real data; complex data 4x (a complex multiply-add is 4 real multiplies and 4 adds).  Per matrix of the batch
(the product of the leading dimensions).  For an m x n matrix, k = min(m, n):

* Cholesky (``potrf``) n^3/3; LDL^T (``sytrf``) n^3/3; LU with partial pivoting (``getrf``) m k^2 - k^3/3
  (2n^3/3 square); a determinant or log-determinant is its LU;
* a solve with n x n A and r right-hand sides: its factorization, then two triangular solves, 2 n^2 r; an inverse
  2 n^3 (LU, then ``getri``'s 4n^3/3); from a Cholesky factor, ``potrs`` 2 n^2 r and ``potri`` 2n^3/3;
* Householder QR (``geqrf``) 2 m n^2 - 2n^3/3 (m >= n; transposed otherwise); forming Q of m x c from k
  reflectors (``orgqr``) 4 m c k - 2 (m + c) k^2 + 4k^3/3; applying them to an m x c matrix (``ormqr``,
  from the left) 4 m c k - 2 c k^2;
* the symmetric eigenproblem (``syevd``): 4n^3/3 for the eigenvalues, 9n^3 with the eigenvectors (GVL section
  8.3, the symmetric QR algorithm); the general one (``geev``, eigenvectors always in ``linalg.eig``) 25n^3 (GVL
  section 7.5.6);
* the SVD of m x n with m >= n (Golub-Kahan-Reinsch, GVL section 8.6.3's table): singular values only
  4 m n^2 - 4n^3/3; with thin U and V 14 m n^2 + 8n^3; with full U and V 4 m^2 n + 8 m n^2 + 9n^3;
* least squares (``lstsq``, QR-based drivers): QR of A, Q^T applied to B, a triangular solve.

The iterative parts (eigenvalue and singular value iterations) are counted at the textbooks' typical
iteration counts, which the values decide.  Backward formulas of these ops are matmuls and triangular solves,
counted by their own rules.
"""

from __future__ import annotations

from math import prod

from .registry import OTHER, aten_ops, register

# -- math helpers (pure functions of shapes) ---------------------------------


def batch_of(shape) -> int:
    """Matrices in a batch of shape [..., m, n]."""
    return prod(shape[:-2])


def _complex(spec) -> int:
    return 4 if spec.dtype.is_complex else 1


def lu_flops(m: int, n: int) -> float:
    """getrf of m x n: M k^2 - k^3/3 (k = min, M = max; 2n^3/3 for a square matrix)."""
    k, big = min(m, n), max(m, n)
    return big * k * k - k ** 3 / 3


def qr_flops(m: int, n: int) -> float:
    """geqrf of m x n: 2 M k^2 - 2k^3/3 (k = min, M = max)."""
    k, big = min(m, n), max(m, n)
    return 2 * big * k * k - 2 * k ** 3 / 3


def orgqr_flops(m: int, c: int, k: int) -> float:
    """Q of m x c formed from k Householder reflectors."""
    return 4 * m * c * k - 2 * (m + c) * k * k + 4 * k ** 3 / 3


def svd_flops(m: int, n: int, compute_uv: bool, full: bool) -> float:
    """Golub-Kahan-Reinsch SVD of m x n (transposed so that m >= n)."""
    m, n = max(m, n), min(m, n)
    if not compute_uv:
        return 4 * m * n * n - 4 * n ** 3 / 3
    if full:
        return 4 * m * m * n + 8 * m * n * n + 9 * n ** 3
    return 14 * m * n * n + 8 * n ** 3


def _per_matrix(call, name: str, flops: float) -> int:
    spec = call[name]
    return int(batch_of(spec.shape) * flops * _complex(spec))


def _rhs(spec, left: bool = True) -> int:
    """Right-hand sides of B: its columns (B [..., n, r], left) or rows (right: X A = B)."""
    return spec.shape[-1] if left else spec.shape[-2]


# -- factorizations ----------------------------------------------------------


@register(*aten_ops("linalg_cholesky_ex", "cholesky", "linalg_ldl_factor_ex"), kind=OTHER)
def cholesky(call):
    """n^3/3 per matrix (potrf; LDL^T's sytrf the same)."""
    return _per_matrix(call, "self", call["self"].shape[-1] ** 3 / 3)


@register(*aten_ops("linalg_lu_factor_ex", "linalg_lu", "_linalg_det", "_linalg_slogdet"), kind=OTHER)
def lu(call):
    """M k^2 - k^3/3 per matrix (getrf; a determinant is its LU's diagonal product)."""
    shape = call["A"].shape
    return _per_matrix(call, "A", lu_flops(shape[-2], shape[-1]))


@register(*aten_ops("geqrf"), kind=OTHER)
def geqrf(call):
    """2 M k^2 - 2k^3/3 per matrix (Householder QR)."""
    shape = call["self"].shape
    return _per_matrix(call, "self", qr_flops(shape[-2], shape[-1]))


@register(*aten_ops("linalg_qr"), kind=OTHER)
def linalg_qr(call):
    """2 M k^2 - 2k^3/3 (geqrf), then Q formed (orgqr): none for mode "r", m x k for "reduced", m x m for
    "complete"."""
    m, n = call["A"].shape[-2:]
    k = min(m, n)
    mode = call.get("mode", "reduced")
    q = 0 if mode == "r" else orgqr_flops(m, m if mode == "complete" else k, k)
    return _per_matrix(call, "A", qr_flops(m, n) + q)


@register(*aten_ops("linalg_householder_product"), kind=OTHER)
def householder_product(call):
    """4 m c k - 2 (m + c) k^2 + 4k^3/3: Q of m x c from k = len(tau) reflectors (orgqr)."""
    m, c = call["input"].shape[-2:]
    return _per_matrix(call, "input", orgqr_flops(m, c, call["tau"].shape[-1]))


@register(*aten_ops("ormqr"), kind=OTHER)
def ormqr(call):
    """4 m c k - 2 c k^2 (left) or 4 m c k - 2 m k^2 (right): k reflectors applied to ``input3`` [.., m, c]."""
    m, c = call["input3"].shape[-2:]
    k = call["input2"].shape[-1]
    side = c if call.get("left", True) else m
    return _per_matrix(call, "input3", 4 * m * c * k - 2 * side * k * k)


# -- solves and inverses -----------------------------------------------------


@register(*aten_ops("_linalg_solve_ex"), kind=OTHER)
def linalg_solve(call):
    """LU of A (2n^3/3), then two triangular solves per right-hand side (2 n^2 r)."""
    n = call["A"].shape[-1]
    b = call["B"]
    r = _rhs(b, call.get("left", True)) if b.ndim >= 2 and b.shape[-2:] != call["A"].shape[-1:] else 1
    return _per_matrix(call, "A", lu_flops(n, n) + 2 * n * n * r)


@register(*aten_ops("linalg_lu_solve"), kind=OTHER)
def lu_solve(call):
    """2 n^2 r: the two triangular solves from an LU factorization."""
    n = call["LU"].shape[-1]
    return _per_matrix(call, "B", 2 * n * n * _rhs(call["B"], call.get("left", True)))


@register(*aten_ops("cholesky_solve"), kind=OTHER)
def cholesky_solve(call):
    """2 n^2 r: two triangular solves with the Cholesky factor (``input2``) for B (``self`` [.., n, r])."""
    n = call["input2"].shape[-1]
    return _per_matrix(call, "self", 2 * n * n * call["self"].shape[-1])


@register(*aten_ops("linalg_inv_ex"), kind=OTHER)
def linalg_inv(call):
    """2 n^3: LU (2n^3/3) and the inverse from it (getri, 4n^3/3)."""
    return _per_matrix(call, "A", 2 * call["A"].shape[-1] ** 3)


@register(*aten_ops("cholesky_inverse"), kind=OTHER)
def cholesky_inverse(call):
    """2n^3/3: potri (the triangular inverse, then its product with its transpose)."""
    return _per_matrix(call, "self", 2 * call["self"].shape[-1] ** 3 / 3)


@register(*aten_ops("linalg_lstsq"), kind=OTHER)
def lstsq(call):
    """2 M k^2 - 2k^3/3 (QR of A, m x n) + 4 m r k - 2 r k^2 (Q^T applied to B, m x r) + k^2 r (the solve)."""
    m, n = call["self"].shape[-2:]
    k = min(m, n)
    b = call["b"]
    r = b.shape[-1] if b.ndim == call["self"].ndim else 1
    return _per_matrix(call, "self", qr_flops(m, n) + 4 * m * r * k - 2 * r * k * k + k * k * r)


# -- eigenvalues and singular values -------------------------------------------


@register(*aten_ops("_linalg_eigh"), kind=OTHER)
def eigh(call):
    """4n^3/3 for the eigenvalues (tridiagonalization), 9n^3 with the eigenvectors."""
    n = call["A"].shape[-1]
    return _per_matrix(call, "A", 9 * n ** 3 if call.get("compute_v", True) else 4 * n ** 3 / 3)


@register(*aten_ops("linalg_eig"), kind=OTHER)
def eig(call):
    """25n^3: Hessenberg reduction and the QR algorithm with the Schur vectors, then the eigenvectors."""
    return _per_matrix(call, "self", 25 * call["self"].shape[-1] ** 3)


@register(*aten_ops("_linalg_svd"), kind=OTHER)
def svd(call):
    """Golub-Kahan-Reinsch (m >= n): 4 m n^2 - 4n^3/3 for the singular values, 14 m n^2 + 8n^3 with thin U and
    V, 4 m^2 n + 8 m n^2 + 9n^3 with full ones."""
    m, n = call["A"].shape[-2:]
    return _per_matrix(call, "A", svd_flops(m, n, bool(call.get("compute_uv", True)),
                                            bool(call.get("full_matrices", False))))


@register(*aten_ops("linalg_pinv"), kind=OTHER)
def pinv(call):
    """The SVD with thin U and V (an eigendecomposition when ``hermitian``), then V diag(1/s) U^H: 2 m n k."""
    m, n = call["self"].shape[-2:]
    k = min(m, n)
    decomposition = 9 * n ** 3 if call.get("hermitian", False) else svd_flops(m, n, True, False)
    return _per_matrix(call, "self", decomposition + 2 * m * n * k)


@register(*aten_ops("lu_unpack"), kind=OTHER)
def lu_unpack(call):
    """0: the permutation made from the pivots and L, U copied out of the factor (no arithmetic)."""
    return 0

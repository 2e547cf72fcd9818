"""Rules of the ops scientific models run (FFTs, ``affine_grid``, the matrix exponential, special functions)
against the ops run in the test.

Truth: a radix-2 Cooley-Tukey FFT written here that counts every real multiply and add it does, checked
against ``torch.fft.fft`` on the same values (so what it counts is an FFT); the ATen calls a real step makes
(``_fft_r2c`` / ``_fft_c2r`` / ``_fft_c2c`` with their dims, sizes and normalization), logged by a dispatch mode
around a real forward and backward and compared with the capture's.
"""

from __future__ import annotations

import cmath
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from estimator import estimate
from rules import lookup
from rules.fft import fft_flops

from test_rules import op_call

aten = torch.ops.aten
FFT_OPS = ("aten._fft_r2c.default", "aten._fft_c2r.default", "aten._fft_c2c.default")


def _counted_fft(x: list[complex], counter: list[int]) -> list[complex]:
    """Radix-2 decimation in time; ``counter[0]`` += 6 per complex multiply (4 multiplies, 2 adds) and 2 per
    complex add or subtract.  Twiddles are constants (not counted, as in FFTW's plans)."""
    n = len(x)
    if n == 1:
        return x
    even, odd = _counted_fft(x[0::2], counter), _counted_fft(x[1::2], counter)
    out = [0j] * n
    for k in range(n // 2):
        t = cmath.exp(-2j * math.pi * k / n) * odd[k]
        counter[0] += 6 + 2 + 2  # one complex multiply, one add, one subtract
        out[k], out[k + n // 2] = even[k] + t, even[k] - t
    return out


@pytest.mark.parametrize("n", [8, 64, 256])
def test_a_complex_fft_costs_what_a_radix2_fft_does(n):
    batch = 3
    x = torch.randn(batch, n, dtype=torch.complex128, generator=torch.Generator().manual_seed(n))
    counter = [0]
    rows = [_counted_fft([complex(v) for v in row], counter) for row in x]
    assert torch.allclose(torch.tensor(rows, dtype=torch.complex128), torch.fft.fft(x), atol=1e-9)  # what was counted is an FFT
    op = aten._fft_c2c.default
    ours = lookup(op).fn(op_call(op, x.to(torch.complex64), [1], 0, True, outputs=[torch.fft.fft(x)]))
    assert ours == counter[0]  # 5 N log2 N per row: N/2 log2 N butterflies of 10 FLOPs
    # a transform of N real points is counted as half a complex one (FFTW's convention for real data)
    assert fft_flops(n, batch, real=True) == counter[0] / 2


class _Log(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if str(func) in FFT_OPS:
            self.calls.append((str(func), tuple(args[0].shape), tuple(args[1]), int(args[2]), tuple(out.shape)))
        return out


class SpectralConv(nn.Module):
    """A Fourier neural operator's layer (Li et al. 2021): rfft2, the low modes mixed by a complex weight, irfft2
    with the default (backward) normalization, and a 1-D ortho-normalized FFT branch."""

    def __init__(self, c: int = 4, modes: int = 6):
        super().__init__()
        self.modes = modes
        self.w = nn.Parameter(torch.randn(c, c, modes, modes, dtype=torch.cfloat) * 0.1)
        self.lift = nn.Conv2d(1, c, 1)

    def forward(self, x):
        h = self.lift(x)
        f = torch.fft.rfft2(h)
        mixed = torch.einsum("bixy,ioxy->boxy", f[:, :, :self.modes, :self.modes], self.w)
        z = torch.zeros_like(f)
        z[:, :, :self.modes, :self.modes] = mixed
        spatial = torch.fft.irfft2(z, s=h.shape[-2:])
        rows = torch.fft.ifft(torch.fft.fft(h.to(torch.cfloat), norm="ortho"), norm="ortho").real
        return F.gelu(spatial + rows)


def test_a_spectral_step_has_the_real_steps_ffts_and_no_unsupported_op():
    torch.manual_seed(0)
    model, x = SpectralConv(), torch.randn(2, 1, 16, 12)
    log = _Log()
    with log:
        model(x).square().mean().backward()
    report = estimate(model, x, loss_fn=lambda out: out.square().mean(), device="cpu")
    assert report.tally.unsupported == []
    ours = [(str(n.target), tuple(n.meta["spec"][0].shape)) for n in report.capture.nodes if str(n.target) in FFT_OPS]
    assert sorted(ours) == sorted((op, out) for op, _, _, _, out in log.calls), (ours, log.calls)

    def expected(op, shape, dims, norm, out):  # the counted FFT's 5 N log2 N (real data: half), + the scale
        real = shape if op.endswith("r2c.default") else out
        points = math.prod(real[d % len(real)] for d in dims)
        per = 5 * points * math.log2(points) * (0.5 if "c2c" not in op else 1)
        return int(math.prod(real) // points * per) + (0 if norm == 0 else (1 if "c2r" in op else 2) * math.prod(out))

    flops = sum(row["flops_forward"] + row["flops_backward"] for row in report.tally.by_operator
                if row["op"] in {op.rsplit(".", 1)[0] for op in FFT_OPS})
    assert flops == sum(expected(*call) for call in log.calls) > 0


@pytest.mark.parametrize("size", [(4, 3, 16, 12), (2, 3, 5, 6, 7)])
def test_affine_grid_costs_the_batched_matmul_aten_runs(size):
    """``F.affine_grid``: ATen multiplies the base grid (N, H*W, K) by theta transposed (N, K, dims); the rule's
    count is FlopCounterMode's for that bmm, the shapes taken from the real call."""
    from instruments import flop_counter

    dims = len(size) - 2
    theta = torch.randn(size[0], dims, dims + 1)
    grid = F.affine_grid(theta, list(size), align_corners=False)
    base = torch.randn(size[0], math.prod(size[2:]), dims + 1)
    counter = flop_counter()
    with counter:
        torch.bmm(base, theta.transpose(1, 2))
    op = aten.affine_grid_generator.default
    assert lookup(op).fn(op_call(op, theta, list(size), False, outputs=[grid])) == counter.get_total_flops()


class _Calls(TorchDispatchMode):
    """Every aten op a real step runs, with its first argument's shape."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        self.calls.append((str(func), tuple(first.shape) if first is not None else ()))
        return func(*args, **(kwargs or {}))


def test_an_orthogonal_parametrization_costs_its_matrix_exponentials():
    """``parametrizations.orthogonal`` (the matrix exponential of a skew-symmetric matrix, forward and backward):
    5 products of n x n per exponential (the degree-18 polynomial; ``rules.matmul.linalg_matrix_exp``), for every
    exponential the real step runs, at the sizes it runs them (the backward's is of a 2n x 2n block matrix)."""
    torch.manual_seed(0)
    model = nn.Sequential(torch.nn.utils.parametrizations.orthogonal(nn.Linear(16, 16)), nn.Linear(16, 2))
    x = torch.randn(8, 16)
    with _Calls() as real:
        model(x).square().mean().backward()
    shapes = [shape for op, shape in real.calls if op == "aten.linalg_matrix_exp.default"]
    assert len(shapes) == 2 and shapes[1][-1] == 2 * shapes[0][-1]  # forward n = 16, backward 2n
    report = estimate(model, x, loss_fn=lambda out: out.square().mean(), device="cpu")
    assert report.tally.unsupported == []
    row = next(r for r in report.tally.by_operator if r["op"] == "aten.linalg_matrix_exp")
    assert row["count"] == len(shapes)
    assert row["flops_forward"] + row["flops_backward"] == sum(5 * 2 * s[-1] ** 3 for s in shapes)


def test_special_functions_and_their_gradients_have_rules():
    """Bessel and error-function family ops a model may call (and ``i0``'s gradient, ``special_i1``): the real
    step's ops, none without a rule."""
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8)

    def loss(out):
        return sum(f(out).sum() for f in (torch.special.i0, torch.special.i0e, torch.special.i1, torch.special.i1e,
                                          torch.special.erfcx, torch.special.log_ndtr, torch.special.entr,
                                          lambda t: torch.special.ndtri(torch.sigmoid(t))))

    with _Calls() as real:
        loss(lin(x)).backward()
    report = estimate(lin, x, loss_fn=loss, device="cpu")
    assert report.tally.unsupported == []
    ran = {op.rsplit(".", 1)[0] for op, _ in real.calls}
    assert {"aten.special_i1", "aten.special_i1e", "aten.special_ndtri"} <= ran


class _QatNet(nn.Module):
    def __init__(self):
        super().__init__()
        import torch.ao.quantization as Q

        self.quant, self.dequant = Q.QuantStub(), Q.DeQuantStub()
        self.conv, self.fc = nn.Conv2d(3, 8, 3), nn.Linear(8, 4)

    def forward(self, x):
        return self.dequant(self.fc(torch.relu(self.conv(self.quant(x))).mean((2, 3))))


@pytest.mark.filterwarnings("ignore")
def test_quantization_aware_training_costs_each_fake_quantization():
    """``prepare_qat`` with the default QAT qconfig (``FusedMovingAvgObsFakeQuantize`` on weights and activations:
    ``_fused_moving_avg_obs_fq_helper``, 9 FLOPs per element) and the learnable LSQ fake quantizer (7 forward, 14
    backward per element; ``rules/quantization.py``): every call the real step makes, at its size."""
    import torch.ao.quantization as Q
    from torch.ao.quantization._learnable_fake_quantize import _LearnableFakeQuantize

    torch.manual_seed(0)
    model = _QatNet().train()
    model.qconfig = Q.get_default_qat_qconfig("x86")
    Q.prepare_qat(model, inplace=True)
    lsq = nn.Sequential(model, _LearnableFakeQuantize(observer=Q.MovingAverageMinMaxObserver, quant_min=0,
                                                      quant_max=255))
    x = torch.randn(2, 3, 12, 12)
    per = {"aten._fused_moving_avg_obs_fq_helper": 9, "aten._fake_quantize_learnable_per_tensor_affine": 7,
           "aten._fake_quantize_learnable_per_tensor_affine_backward": 14}
    with _Calls() as real:
        lsq(x).square().mean().backward()
    counted = [(op.rsplit(".", 1)[0], shape) for op, shape in real.calls if op.rsplit(".", 1)[0] in per]
    assert {op for op, _ in counted} == set(per)
    report = estimate(lsq, x, loss_fn=lambda out: out.square().mean(), device="cpu")
    assert report.tally.unsupported == []
    rows = {r["op"]: r for r in report.tally.by_operator if r["op"] in per}
    for op in per:
        assert rows[op]["count"] == sum(1 for o, _ in counted if o == op), op
        expected = sum(per[op] * math.prod(shape) for o, shape in counted if o == op)
        assert rows[op]["flops_forward"] + rows[op]["flops_backward"] == expected, op


def test_sparse_embedding_gradients_are_a_one_line_error():
    from estimator.errors import UserError

    model = nn.Sequential(nn.EmbeddingBag(50, 8, sparse=True), nn.Linear(8, 2))
    ids = torch.randint(0, 50, (4, 6))
    with pytest.raises(UserError, match="sparse=False"):
        estimate(model, ids, device="cpu")
    assert estimate(model, ids, device="cpu", mode="inference").to_dict()["memory"]["peak"] > 0


def _counted_cholesky(a: list[list[float]], counter: list[int]) -> None:
    """The column Cholesky of GVL's Algorithm 4.2.1, counting each real multiply, add, divide and square root."""
    n = len(a)
    for j in range(n):
        for k in range(j):
            for i in range(j, n):
                a[i][j] -= a[i][k] * a[j][k]
                counter[0] += 2
        a[j][j] = a[j][j] ** 0.5
        counter[0] += 1
        for i in range(j + 1, n):
            a[i][j] /= a[j][j]
            counter[0] += 1


def _counted_lu(a: list[list[float]], counter: list[int]) -> None:
    """Gaussian elimination (GVL's Algorithm 3.2.1, pivoting moves no arithmetic), counting as above."""
    n = len(a)
    for k in range(n - 1):
        for i in range(k + 1, n):
            a[i][k] /= a[k][k]
            counter[0] += 1
            for j in range(k + 1, n):
                a[i][j] -= a[i][k] * a[k][j]
                counter[0] += 2


@pytest.mark.parametrize("n", [32, 64])
def test_cholesky_and_lu_cost_what_the_textbook_algorithms_do(n):
    """The rules' leading terms (n^3/3, 2n^3/3) against the algorithms run here, counting: within the lower-order
    terms (under 5 % at n = 32); the algorithms' results checked against torch's."""
    from rules.linalg import lu_flops

    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, n, dtype=torch.float64, generator=g)
    spd = x @ x.T + n * torch.eye(n, dtype=torch.float64)
    chol, counted = spd.tolist(), [0]
    _counted_cholesky(chol, counted)
    assert torch.allclose(torch.tensor(chol, dtype=torch.float64).tril(), torch.linalg.cholesky(spd))
    op = aten.linalg_cholesky_ex.default
    ours = lookup(op).fn(op_call(op, spd.float(), outputs=[spd.float(), torch.zeros((), dtype=torch.int32)]))
    assert ours == pytest.approx(counted[0], rel=0.05)
    lu, counted_lu = spd.tolist(), [0]
    _counted_lu(lu, counted_lu)  # (spd: no pivoting needed, the same arithmetic)
    assert lu_flops(n, n) == pytest.approx(counted_lu[0], rel=0.05)


class _Linalg(nn.Module):
    """A model that factorizes what it computes (a Gaussian-process-like head, whitening, an orthogonal basis)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 6)

    def forward(self, x):
        a = self.a(x)
        spd = a.T @ a + torch.eye(8)
        out = torch.cholesky_solve(a.T[:, :3], torch.linalg.cholesky(spd)).sum() + torch.linalg.slogdet(spd)[1]
        out = out + torch.linalg.solve(spd, a.T).sum() + torch.linalg.inv(spd).sum() + torch.linalg.det(spd)
        q, r = torch.linalg.qr(self.b(x))
        w, v = torch.linalg.eigh(spd)
        u, s, vh = torch.linalg.svd(self.b(x), full_matrices=False)
        out = out + q.sum() + r.sum() + w.sum() + v.abs().sum() + s.sum() + u.abs().sum()
        return out + torch.linalg.lstsq(spd, a.T).solution.sum() + torch.linalg.lu(spd)[2].sum()


def test_a_step_of_factorizations_has_a_rule_for_every_op_the_real_step_runs():
    torch.manual_seed(0)
    model, x = _Linalg(), torch.randn(16, 8)
    with _Calls() as real:
        model(x).backward()
    report = estimate(model, x, loss_fn=lambda out: out, device="cpu")
    assert report.tally.unsupported == []
    rows = {r["op"]: r for r in report.tally.by_operator}
    for op in ("aten.linalg_cholesky_ex", "aten._linalg_eigh", "aten._linalg_svd", "aten.linalg_qr",
               "aten._linalg_solve_ex", "aten.linalg_inv_ex", "aten.linalg_lstsq"):
        assert rows[op]["count"] == sum(1 for o, _ in real.calls if o.rsplit(".", 1)[0] == op), op
        assert rows[op]["flops_forward"] + rows[op]["flops_backward"] > 0, op


def test_pairwise_distances_and_incomplete_gamma_have_rules():
    """``torch.pdist`` (its forward and backward kernels: cdist's per-pair counts over one matrix's N(N-1)/2 pairs)
    and the incomplete gamma functions: a real step's calls, each with a rule; pdist's count is cdist's over the
    same pairs (the upper triangle of ``cdist(x, x)``'s)."""
    from rules.reduction import cdist as cdist_rule

    lin = nn.Linear(8, 8)
    x = torch.randn(10, 8)

    def loss(y):
        return torch.pdist(y).sum() + torch.special.gammaincc(y.abs().detach() + 1, y.abs() + 0.5).sum()

    with _Calls() as real:
        loss(lin(x)).backward()
    report = estimate(lin, x, loss_fn=loss, device="cpu")
    assert report.tally.unsupported == []
    rows = {r["op"]: r for r in report.tally.by_operator}
    assert {op.rsplit(".", 1)[0] for op, _ in real.calls} >= {"aten._pdist_forward", "aten._pdist_backward"}
    y = lin(x).detach()
    full = torch.cdist(y, y)
    per_pair = cdist_rule(op_call(aten._cdist_forward.default, y, y, 2.0, None, outputs=[full])) / full.numel()
    assert rows["aten._pdist_forward"]["flops_forward"] == per_pair * 10 * 9 // 2


def test_an_op_without_a_gradient_fails_as_the_real_step_does():
    """``gammainc``'s first argument has no derivative in PyTorch: the real backward raises, and the estimate's
    one-line error says so (not "check the input shapes")."""
    from estimator.errors import UserError

    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8)

    def loss(y):
        return torch.special.gammainc(y.abs() + 1, y.abs().detach() + 0.5).sum()

    with pytest.raises(NotImplementedError):
        loss(lin(x)).backward()
    with pytest.raises(UserError, match="the real step fails the same way"):
        estimate(lin, x, loss_fn=loss, device="cpu")


def test_torch_complex_moves_data_and_computes_nothing():
    """``torch.complex(real, imag)`` (a complex-valued network's input) was listed as without a rule; it
    interleaves its two inputs: no FLOP, as FlopCounterMode (no formula for it) and the copies count it."""
    class ComplexNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 8, dtype=torch.cfloat))

        def forward(self, x):
            return (torch.complex(x, torch.zeros_like(x)) @ self.w).abs().square().mean()

    model, x = ComplexNet(), torch.randn(4, 8)
    report = estimate(model, x, loss_fn=lambda out: out, device="cpu")
    assert report.tally.unsupported == []
    assert any(str(n.target) == "aten.complex.default" for n in report.capture.nodes)

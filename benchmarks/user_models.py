"""Models written by hand, as users write them (not from a model zoo), against a real CPU step measured in the
same run: a sweep for ops without a rule and for any figure the estimate gets wrong.

32 patterns: nn.TransformerEncoder and nn.Transformer, nn.MultiheadAttention with a padding mask, complex rotary
embeddings, einsum attention, weight and spectral norm, a Fourier neural operator (rfft2 / irfft2), a U-Net with
GroupNorm and ConvTranspose2d, a dilated WaveNet, a hand-written mixture of experts (topk, nonzero, index_add_), a
custom autograd.Function, a spatial transformer (affine_grid, grid_sample), an LSTMCell loop, message passing
(index_add_, scatter_add_), cdist and pdist, an STFT front end, unfold/fold, an orthogonal parametrization
(matrix_exp), log-space scans (cumsum, logcumsumexp, cumprod), sort/argsort/bucketize/searchsorted, a VAE with
torch.distributions (rsample, kl_divergence, Gamma log_prob, gumbel_softmax), eleven losses, volumetric 3-D layers,
fourteen activations and special functions, an embedding with max_norm, quantization-aware training (FakeQuantize),
SDPA with a float bias and dropout, torch.compile'd submodules, nn.DataParallel on the CPU, a frozen BatchNorm, a
gradient hook, a tied autoencoder.

Truth (the tests' own instruments): ``tests/groundtruth.measure`` (parameters, gradients and optimizer state after
a real AdamW step, saved activations through saved_tensors_hooks, matmul FLOPs with the fixed FlopCounterMode) and
``tests/livetracker.measure_peaks`` (the first and steady-state live-byte peaks of real iterations).  Target: the
states, activations and FLOPs equal, the peaks within 1 %, no op without a rule.

    python benchmarks/user_models.py            # ~2 min on 2 cores
    python benchmarks/user_models.py fno_fft    # one case

Measured on 2026-11-30: 32 of 32 exact (peaks within 1 %), no op without a rule (before that day's rules: the FFTs,
affine_grid_generator, linalg_matrix_exp, special_i1 and QAT's fake quantization were listed as unsupported).
"""

from __future__ import annotations

import copy
import os
import sys

import torch
import torch.distributions as D
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from groundtruth import measure  # noqa: E402
from livetracker import measure_peaks  # noqa: E402

from estimator import estimate  # noqa: E402


class TE(nn.Module):
    def __init__(self):
        super().__init__()
        l = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(l, 2, enable_nested_tensor=False)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.enc(x).mean(1))


class MHA(nn.Module):
    def __init__(self):
        super().__init__()
        self.m = nn.MultiheadAttention(64, 4, batch_first=True)
        self.o = nn.Linear(64, 3)

    def forward(self, x, mask):
        return self.o(self.m(x, x, x, key_padding_mask=mask, need_weights=False)[0]).sum(1)


class Rotary(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(64, 64)
        self.o = nn.Linear(64, 64)
        t = torch.arange(32).float()[:, None] * (1.0 / 10000 ** (torch.arange(0, 64, 2).float() / 64))[None]
        self.register_buffer("freqs", torch.polar(torch.ones_like(t), t), persistent=False)

    def forward(self, x):
        q = self.q(x)
        qc = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
        q = torch.view_as_real(qc * self.freqs[: x.shape[1]]).flatten(2)
        return self.o(q)


class Einsum(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(64, 192)
        self.o = nn.Linear(64, 64)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        a = torch.einsum("bid,bjd->bij", q, k).softmax(-1)
        return self.o(torch.einsum("bij,bjd->bid", a, v))


class WN(nn.Module):
    def __init__(self):
        super().__init__()
        P = torch.nn.utils.parametrizations
        self.a = P.weight_norm(nn.Linear(64, 128))
        self.b = P.spectral_norm(nn.Linear(128, 10))

    def forward(self, x):
        return self.b(F.relu(self.a(x)))


class FNO(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8, 16, 9, dtype=torch.cfloat) * 0.1)
        self.lift = nn.Conv2d(1, 8, 1)
        self.proj = nn.Conv2d(8, 1, 1)

    def forward(self, x):
        h = self.lift(x)
        f = torch.fft.rfft2(h)
        out = torch.einsum("bixy,ioxy->boxy", f[:, :, :16, :9], self.w)
        z = torch.zeros_like(f)
        z[:, :, :16, :9] = out
        return self.proj(F.gelu(torch.fft.irfft2(z, s=h.shape[-2:])) + h)


class UNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.d = nn.Conv2d(3, 16, 3, 2, 1)
        self.g = nn.GroupNorm(4, 16)
        self.u = nn.ConvTranspose2d(16, 8, 4, 2, 1)
        self.ps = nn.PixelShuffle(2)
        self.o = nn.Conv2d(2, 3, 3, padding=1)

    def forward(self, x):
        return self.o(self.ps(self.u(F.silu(self.g(self.d(x))))))


class WaveNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.ModuleList([nn.Conv1d(16, 32, 2, dilation=2**i) for i in range(4)])
        self.inp = nn.Conv1d(1, 16, 1)
        self.r = nn.ModuleList([nn.Conv1d(16, 16, 1) for _ in range(4)])

    def forward(self, x):
        h = self.inp(x)
        for c, r in zip(self.c, self.r):
            y = c(F.pad(h, (c.dilation[0], 0)))
            a, b = y.chunk(2, 1)
            h = h + r(torch.tanh(a) * torch.sigmoid(b))
        return h


class MoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.g = nn.Linear(32, 4)
        self.e = nn.ModuleList([nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)) for _ in range(4)])

    def forward(self, x):
        x = x.reshape(-1, 32)
        w, idx = self.g(x).softmax(-1).topk(2, -1)
        out = torch.zeros_like(x)
        for e in range(4):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            out.index_add_(0, tok, self.e[e](x[tok]) * w[tok, slot, None])
        return out


class Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x**3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * x * x * g


class Custom(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 8)

    def forward(self, x):
        return self.b(Cube.apply(self.a(x)))


class STN(nn.Module):
    def __init__(self):
        super().__init__()
        self.loc = nn.Linear(3 * 16 * 16, 6)
        self.c = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        th = self.loc(x.flatten(1)).view(-1, 2, 3)
        g = F.affine_grid(th, x.shape, align_corners=False)
        return self.c(F.grid_sample(x, g, align_corners=False))


class Cell(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.LSTMCell(16, 32)
        self.o = nn.Linear(32, 4)

    def forward(self, x):
        h = c = x.new_zeros(x.shape[0], 32)
        for t in range(x.shape[1]):
            h, c = self.c(x[:, t], (h, c))
        return self.o(h)


class GNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(16, 32)
        self.l2 = nn.Linear(32, 4)

    def forward(self, x, src, dst):
        m = self.l1(x)[src]
        agg = torch.zeros(x.shape[0], 32).index_add_(0, dst, m)
        deg = torch.zeros(x.shape[0]).scatter_add_(0, dst, torch.ones_like(dst, dtype=torch.float))
        return self.l2(F.relu(agg / deg.clamp(min=1)[:, None]))


class CDist(nn.Module):
    def __init__(self):
        super().__init__()
        self.e = nn.Linear(16, 32)
        self.c = nn.Parameter(torch.randn(10, 32))

    def forward(self, x):
        return -torch.cdist(self.e(x), self.c)


class STFT(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("win", torch.hann_window(256))
        self.c = nn.Conv1d(129, 32, 3)
        self.o = nn.Linear(32, 5)

    def forward(self, wav):
        spec = torch.stft(wav, 256, 64, window=self.win, return_complex=True).abs().add(1e-6).log()
        return self.o(self.c(spec).mean(-1))


class Unfold(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(3 * 9, 8)

    def forward(self, x):
        p = F.unfold(x, 3, padding=1).transpose(1, 2)
        y = self.l(p).transpose(1, 2)
        return F.fold(y, x.shape[-2:], 1)


class Ortho(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.utils.parametrizations.orthogonal(nn.Linear(16, 16))
        self.o = nn.Linear(16, 2)

    def forward(self, x):
        return self.o(self.l(x))


class Scan(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)

    def forward(self, x):
        la = F.logsigmoid(self.a(x))
        c = torch.cumsum(la, 1)
        h = torch.logcumsumexp(self.b(x) - c, 1) + c
        return torch.cumprod(torch.sigmoid(h), 1)


class Seq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.t = nn.Transformer(32, 4, 1, 1, 64, dropout=0.0, batch_first=True)
        self.e = nn.Embedding(50, 32)
        self.o = nn.Linear(32, 50)

    def forward(self, src, tgt):
        m = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        return F.cross_entropy(
            self.o(self.t(self.e(src), self.e(tgt), tgt_mask=m, src_key_padding_mask=src == 0)).flatten(0, 1),
            tgt.flatten(),
        )


class Sorts(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(16, 16)
        self.register_buffer("edges", torch.linspace(-2, 2, 9))

    def forward(self, x):
        y = self.l(x)
        v, i = y.sort(-1)
        b = torch.bucketize(y.detach(), self.edges)
        return (
            v * (b.float() + 1)
            + torch.gather(y, -1, y.argsort(-1))
            + torch.searchsorted(self.edges, y.detach().contiguous()).float()
        )


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.e = nn.Linear(32, 16)
        self.d = nn.Linear(8, 32)

    def forward(self, x):
        mu, logv = self.e(x).chunk(2, -1)
        q = D.Normal(mu, (0.5 * logv).exp())
        z = q.rsample()
        kl = D.kl_divergence(q, D.Normal(torch.zeros_like(mu), torch.ones_like(mu))).sum(-1)
        g = D.Gamma(F.softplus(mu) + 1, 1.0).log_prob(F.softplus(z) + 0.1).sum(-1)
        return (F.mse_loss(self.d(z), x, reduction="none").sum(-1) + kl - g).mean() + F.gumbel_softmax(
            mu, tau=0.5
        ).sum() * 0


class Losses(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(16, 10)
        self.a = nn.AdaptiveLogSoftmaxWithLoss(16, 100, [10, 50])

    def forward(self, x, y, y100):
        o = self.l(x)
        lp = o.log_softmax(-1)
        return (
            F.kl_div(lp, torch.softmax(o.detach() * 2, -1), reduction="batchmean")
            + F.triplet_margin_loss(o[:4], o[4:8], o[8:12])
            + F.cosine_embedding_loss(o[:6], o[6:12], torch.tensor([1, -1, 1, -1, 1, -1]))
            + F.cross_entropy(o, y, label_smoothing=0.1, weight=torch.linspace(0.5, 1.5, 10))
            + F.nll_loss(lp, y)
            + self.a(x, y100).loss
            + F.huber_loss(o, o.detach() + 1)
            + F.smooth_l1_loss(o, o.detach() * 0.5)
            + F.binary_cross_entropy_with_logits(o, torch.rand(12, 10), pos_weight=torch.ones(10))
            + F.margin_ranking_loss(o[:, 0], o[:, 1], torch.ones(12))
            + F.poisson_nll_loss(o, o.detach().exp())
        )


class Vol(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv3d(2, 4, 3, padding=1)
        self.b = nn.BatchNorm3d(4)
        self.p = nn.MaxPool3d(2)
        self.u = nn.Upsample(scale_factor=2, mode="trilinear")
        self.i = nn.InstanceNorm3d(4, affine=True)

    def forward(self, x):
        return self.i(self.u(self.p(F.relu(self.b(self.c(x))))))


class Acts(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(16, 16)
        self.acts = nn.ModuleList(
            [
                nn.PReLU(16),
                nn.CELU(),
                nn.Softplus(),
                nn.Mish(),
                nn.Hardswish(),
                nn.SELU(),
                nn.Softsign(),
                nn.Tanhshrink(),
                nn.LogSigmoid(),
                nn.GLU(),
                nn.Hardtanh(),
                nn.ELU(),
                nn.SiLU(),
                nn.Softmin(-1),
            ]
        )
        self.lrn = nn.LocalResponseNorm(3)

    def forward(self, x):
        y = self.l(x)
        outs = [a(y) for a in self.acts]
        return (
            sum(o.sum() for o in outs)
            + self.lrn(y[:, :, None, None]).sum()
            + F.normalize(y).sum()
            + F.cosine_similarity(y, y.flip(0)).sum()
            + torch.erf(y).sum()
            + torch.lgamma(y.abs() + 1).sum()
            + torch.special.i0(y).sum()
        )


class MaxNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.e = nn.Embedding(100, 16, max_norm=1.0)
        self.o = nn.Linear(16, 4)

    def forward(self, i):
        return self.o(self.e(i).mean(1))


class QAT(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(16, 16)
        self.o = nn.Linear(16, 4)
        self.fq = torch.ao.quantization.FakeQuantize()

    def forward(self, x):
        return self.o(self.fq(F.relu(self.l(x))))


class DropAttn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.o = nn.Linear(32, 32)

    def forward(self, x, bias):
        q, k, v = self.qkv(x).view(2, 10, 3, 4, 8).permute(2, 0, 3, 1, 4)
        return self.o(
            F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=0.1).transpose(1, 2).reshape(2, 10, 32)
        )


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 64)
        self.b = nn.Linear(64, 32)

    def forward(self, x):
        return x + self.b(F.gelu(self.a(x)))


class Compiled(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([torch.compile(Inner()) for _ in range(2)])
        self.o = nn.Linear(32, 2)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.o(x)


class DP(nn.Module):
    def __init__(self):
        super().__init__()
        self.m = nn.DataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))

    def forward(self, x):
        return self.m(x)


class BNEval(nn.Module):  # frozen BN (detection backbones): eval-mode norm inside a training model
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.o = nn.Linear(8, 2)
        self.bn.eval()
        self.bn.requires_grad_(False)

    def train(self, mode=True):
        super().train(mode)
        self.bn.eval()
        return self

    def forward(self, x):
        return self.o(F.relu(self.bn(self.c(x))).mean((2, 3)))


class Hooked(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(16, 16)
        self.o = nn.Linear(16, 2)
        self.l.weight.register_hook(lambda g: g * 0.5)

    def forward(self, x):
        return self.o(self.l(x))


class WeightTieTranspose(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(32, 8)

    def forward(self, x):
        return F.linear(torch.sigmoid(self.enc(x)), self.enc.weight.t())


def cases():
    """name -> (model, inputs), built with a fixed seed."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    mask = torch.randn(2, 4, 10, 10)
    return {
        "transformer_encoder": (TE(), (torch.randn(4, 20, 64),)),
        "mha_padding": (
            MHA(),
            (torch.randn(4, 20, 64), torch.arange(20)[None].expand(4, 20) >= torch.tensor([[20], [15], [10], [5]])),
        ),
        "rotary_complex": (Rotary(), (torch.randn(2, 32, 64),)),
        "einsum_attention": (Einsum(), (torch.randn(4, 24, 64),)),
        "weight_spectral_norm": (WN(), (torch.randn(16, 64),)),
        "fno_fft": (FNO(), (torch.randn(2, 1, 32, 32),)),
        "unet_groupnorm_convtranspose": (UNet(), (torch.randn(2, 3, 32, 32),)),
        "wavenet_dilated": (WaveNet(), (torch.randn(2, 1, 256),)),
        "moe_by_hand": (MoE(), (torch.randn(4, 16, 32),)),
        "custom_function": (Custom(), (torch.randn(32, 64),)),
        "spatial_transformer": (STN(), (torch.randn(4, 3, 16, 16),)),
        "lstm_cell_loop": (Cell(), (torch.randn(4, 12, 16),)),
        "gnn_scatter": (
            GNN(),
            (torch.randn(50, 16), torch.randint(0, 50, (200,), generator=g), torch.randint(0, 50, (200,), generator=g)),
        ),
        "cdist": (CDist(), (torch.randn(64, 16),)),
        "stft_frontend": (STFT(), (torch.randn(2, 4000),)),
        "unfold_fold": (Unfold(), (torch.randn(2, 3, 12, 12),)),
        "orthogonal_param": (Ortho(), (torch.randn(8, 16),)),
        "log_scan": (Scan(), (torch.randn(2, 20, 16),)),
        "seq2seq_transformer": (Seq2Seq(), (torch.randint(1, 50, (3, 12)), torch.randint(0, 50, (3, 9)))),
        "sorts": (Sorts(), (torch.randn(8, 16),)),
        "vae_distributions": (VAE(), (torch.randn(16, 32),)),
        "losses": (Losses(), (torch.randn(12, 16), torch.randint(0, 10, (12,)), torch.randint(0, 100, (12,)))),
        "volumetric": (Vol(), (torch.randn(2, 2, 8, 8, 8),)),
        "activations": (Acts(), (torch.randn(8, 16),)),
        "embedding_max_norm": (MaxNorm(), (torch.randint(0, 100, (4, 12)),)),
        "qat_fake_quant": (QAT(), (torch.randn(8, 16),)),
        "sdpa_bias_dropout": (DropAttn(), (torch.randn(2, 10, 32), mask)),
        "compiled_submodules": (Compiled(), (torch.randn(4, 32),)),
        "data_parallel_cpu": (DP(), (torch.randn(4, 8),)),
        "frozen_bn": (BNEval(), (torch.randn(2, 3, 16, 16),)),
        "grad_hook": (Hooked(), (torch.randn(4, 16),)),
        "tied_autoencoder": (WeightTieTranspose(), (torch.randn(4, 32),)),
    }


def _loss(out):
    return out.float().square().mean() if out.numel() > 1 or not out.requires_grad else out


def compare(model, inputs) -> tuple[dict, list[str]]:
    """The figures that differ (estimate, measured, error) and the ops without a rule (truth measured first)."""
    first, steady = measure_peaks(copy.deepcopy(model), inputs, lambda p: torch.optim.AdamW(p, lr=1e-3), _loss)
    truth = measure(copy.deepcopy(model), inputs, optimizer="adamw", loss_fn=_loss)
    d = estimate(model, inputs, loss_fn=_loss, device="cpu", optimizer="adamw").to_dict()
    pairs = {
        "parameters": (d["memory"]["parameters"], truth["param_bytes"]),
        "gradients": (d["memory"]["gradients"], truth["grad_bytes"]),
        "optimizer_state": (d["memory"]["optimizer_state"], truth["optimizer_state_bytes"]),
        "activations": (d["memory"]["activations"], truth["activation_bytes"]),
        "matmul_forward": (d["flops"]["matmul_forward"], truth["matmul_forward"]),
        "matmul_backward": (d["flops"]["matmul_backward"], truth["matmul_backward"]),
        "peak": (d["memory"]["peak"], steady),
        "peak_first_step": (d["memory"]["peak_first_step"], first),
    }
    off = {
        k: (e, t, (e - t) / t if t else float("inf"))
        for k, (e, t) in pairs.items()
        if (abs(e - t) > 0.01 * t if k.startswith("peak") else e != t)
    }
    return off, sorted({u["op"] for u in d.get("unsupported_ops", [])})


def main(argv: list[str]) -> int:
    rows = []
    for name, (model, inputs) in cases().items():
        if argv and name not in argv:
            continue
        off, unsupported = compare(model, inputs)
        rows.append((name, off, unsupported))
        rule = f"without a rule: {', '.join(unsupported)}" if unsupported else ""
        print(f"{name:30s} {'exact' if not off else off} {rule}", flush=True)
    good = sum(1 for _, off, uns in rows if not off and not uns)
    print(f"{good} of {len(rows)} exact (peaks within 1 %) with a rule for every op")
    return 0 if good == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

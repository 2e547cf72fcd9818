"""Rules for the ops the zoo sweep met without one (issue 25 item 10): ``aten.polar`` (Llama 4's
rotary), ``grid_sampler_2d`` (RT-DETR's deformable attention), ``linalg_solve_triangular``, and
torchvision's ``nms`` / ``roi_align``.

For the aten ops the truth is a real CPU step: a dispatch mode records every op it runs with its
arguments, so the test knows the op ran (forward and backward) and with which shapes; the estimate must
report no unsupported op and, per op, the FLOPs the rule's formula gives on the real shapes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from estimator import estimate
from estimator.rules import lookup

aten = torch.ops.aten


class Calls(TorchDispatchMode):
    """The ops a real run dispatches, with their arguments."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func, args, kwargs or {}))
        return func(*args, **(kwargs or {}))

    def of(self, packet):
        return [(a, k) for f, a, k in self.calls if f.overloadpacket is packet]


def real_step(model, inputs) -> Calls:
    calls = Calls()
    with calls:
        model(*inputs).backward()
    return calls


def by_op(d: dict) -> dict[str, dict]:
    return {row["op"]: row for row in d["by_operator"]}


class Sampler(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.offset = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Linear(2, 2)

    def forward(self, x, grid):
        return F.grid_sample(self.conv(x), self.offset(grid), align_corners=False).sum()


def test_grid_sampler_forward_and_backward():
    model, inputs = Sampler(), (torch.randn(2, 3, 8, 8), torch.rand(2, 5, 6, 2) * 2 - 1)
    calls = real_step(model, inputs)
    (fwd_args, _), = calls.of(aten.grid_sampler_2d)
    (bwd_args, _), = calls.of(aten.grid_sampler_2d_backward)
    d = estimate(model, inputs, device="cpu").to_dict()
    assert not d["unsupported_ops"]
    rows = by_op(d)
    inp, grid, mode = fwd_args[0], fwd_args[1], fwd_args[2]
    assert mode == 0  # bilinear: 4 taps
    out = inp.shape[0] * inp.shape[1] * grid.shape[1] * grid.shape[2]  # N*C*Hout*Wout = 2*4*5*6 = 240
    # forward: 7 FLOPs per output element (4 multiplies, 3 adds) + 2 per location and dim to unnormalise
    assert rows["aten.grid_sampler_2d"]["flops_forward"] == 7 * out + 2 * 2 * (grid.numel() // 2)
    # backward (both gradients asked, as the real call's output_mask says): 2*4 for the input's, 2*2*4 for the grid's
    assert list(bwd_args[6]) == [True, True]
    assert rows["aten.grid_sampler_2d_backward"]["flops_backward"] == (8 + 16) * bwd_args[0].numel()


class Solve(torch.nn.Module):
    def __init__(self, n: int = 5):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(n, n))
        self.b = torch.nn.Linear(3, 3)

    def forward(self, x):  # x: (B, n, 3)
        a = torch.triu(self.a) + 4 * torch.eye(self.a.shape[0])
        return torch.linalg.solve_triangular(a, self.b(x), upper=True).sum()


def test_linalg_solve_triangular():
    model, inputs = Solve(), (torch.randn(4, 5, 3),)
    calls = real_step(model, inputs)
    solves = calls.of(aten.linalg_solve_triangular)
    assert solves  # the forward's solve, and the backward's (A^T solved against the gradient)
    d = estimate(model, inputs, device="cpu").to_dict()
    assert not d["unsupported_ops"]
    row = by_op(d)["aten.linalg_solve_triangular"]
    assert row["count"] == len(solves)
    # each real call: batch * n * n * k, with n from its triangular A [n, n] and (batch, k) from its B [batch, n, k]
    expected = sum(args[1].shape[0] * args[0].shape[-1] ** 2 * args[1].shape[-1] for args, _ in solves)
    assert row["flops_forward"] + row["flops_backward"] == expected


class Rotary(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        freqs = torch.polar(torch.ones_like(h), h)  # Llama 4's rotary: unit magnitude, angle h
        return torch.view_as_real(freqs).sum()


def test_polar():
    model, inputs = Rotary(), (torch.randn(3, 8),)
    calls = real_step(model, inputs)
    (args, _), = calls.of(aten.polar)
    d = estimate(model, inputs, device="cpu").to_dict()
    assert not d["unsupported_ops"]
    # cos, sin and two multiplies per output element: 4 * 24
    assert by_op(d)["aten.polar"]["flops_forward"] == 4 * torch.broadcast_shapes(args[0].shape, args[1].shape).numel()


TORCHVISION_SCHEMAS = {  # torchvision/csrc/ops/{nms,roi_align}.cpp, as torchvision 0.2x defines them
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align": "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
                 "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor",
    "_roi_align_backward": "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, "
                           "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width, "
                           "int sampling_ratio, bool aligned) -> Tensor",
}
_LIBS: list = []  # the libraries defined here, kept alive for the session


def torchvision_ops():
    """torchvision's ops: the real ones where torchvision's C++ library loads, else the same schemas defined
    here (each that is missing: beside the CPU torch, conftest's import defines nms alone)."""
    try:
        import torchvision  # noqa: F401
    except Exception:  # not installed, or built for another torch
        pass
    missing = [name for name in TORCHVISION_SCHEMAS if not hasattr(torch.ops.torchvision, name)]
    if missing:
        lib = torch.library.Library("torchvision", "FRAGMENT")  # noqa: TOR901
        for name in missing:
            lib.define(TORCHVISION_SCHEMAS[name])
        _LIBS.append(lib)
    return torch.ops.torchvision


def _call(op, args: dict, out_shape):
    from estimator.rules import OpCall, TensorSpec, bind

    spec = lambda v: TensorSpec(tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v  # noqa: E731
    bound = {k: spec(v) for k, v in bind(op.default, (), args).items()}
    return OpCall(op.default, bound, (TensorSpec(tuple(out_shape), torch.float32),))


def test_torchvision_detection_ops_get_their_rules_when_torchvision_defines_them():
    tv = torchvision_ops()
    nms, roi, roi_back = lookup(tv.nms.default), lookup(tv.roi_align.default), lookup(tv._roi_align_backward.default)
    assert nms and roi and roi_back  # registered on first sight of the namespace
    boxes, scores = torch.empty(100, 4), torch.empty(100)
    # every pair once: 100 * 99 / 2 = 4,950 pairs of 13 FLOPs
    assert nms.fn(_call(tv.nms, dict(dets=boxes, scores=scores, iou_threshold=0.5), (100,))) == 13 * 4950
    feats, rois = torch.empty(2, 16, 32, 32), torch.empty(10, 5)
    out = (10, 16, 7, 7)  # K rois x C x 7 x 7 = 7,840 elements
    args = dict(input=feats, rois=rois, spatial_scale=0.25, pooled_height=7, pooled_width=7, sampling_ratio=2,
                aligned=True)
    assert roi.fn(_call(tv.roi_align, args, out)) == 7840 * (8 * 2 * 2 + 1)  # 4 samples of 8, 1 divide
    args["sampling_ratio"] = 0  # adaptive: depends on the boxes, 2 assumed (the docstring says so)
    assert roi.fn(_call(tv.roi_align, args, out)) == 7840 * 33
    grad = torch.empty(out)
    back = dict(grad=grad, rois=rois, spatial_scale=0.25, pooled_height=7, pooled_width=7, batch_size=2,
                channels=16, height=32, width=32, sampling_ratio=3, aligned=True)
    assert roi_back.fn(_call(tv._roi_align_backward, back, (2, 16, 32, 32))) == 7840 * (8 * 3 * 3 + 1)


class Unique(torch.nn.Module):
    """ViLT's embeddings count the distinct values of a mask with torch.unique."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, ids):
        kinds = torch.unique(ids)  # sorted, distinct ids
        return self.lin(x).sum() * kinds.numel()


def test_unique():
    model, inputs = Unique(), (torch.randn(3, 4), torch.tensor([3, 1, 3, 2, 1, 5, 5, 0]))
    calls = real_step(model, inputs)
    (args, _), = calls.of(aten._unique2)
    d = estimate(model, inputs, device="cpu").to_dict()
    assert not d["unsupported_ops"]
    n = args[0].numel()  # the ids: a sort of n * ceil(log2 n) comparisons, then n neighbour comparisons
    assert by_op(d)["aten._unique2"]["flops_forward"] == n * math.ceil(math.log2(n)) + n


class ConcatHead(torch.nn.Module):
    """MobileBERT's output head: the logits against a concatenation of the tied embedding (transposed) and a
    dense weight, so the dense weight's gradient is a slice of the concatenation's gradient."""

    def __init__(self, vocab: int = 1000, e: int = 16, h: int = 24):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, e)
        self.dense = torch.nn.Linear(vocab, h - e, bias=False)
        self.up = torch.nn.Linear(e, h)

    def forward(self, ids):
        h = self.up(self.emb(ids))
        return h.matmul(torch.cat([self.emb.weight.t(), self.dense.weight], dim=0)).logsumexp(-1).mean()


def test_a_gradient_that_views_a_larger_one_holds_its_whole_storage():
    model, ids = ConcatHead(), torch.randint(0, 1000, (2, 8))
    model(ids).backward()
    g = model.dense.weight.grad  # AccumulateGrad stole a contiguous slice: the whole (24 x 1000) storage lives
    assert g.untyped_storage().nbytes() == 24 * 1000 * 4 > g.numel() * 4
    held = sum({p.grad.untyped_storage().data_ptr(): p.grad.untyped_storage().nbytes()
                for p in model.parameters()}.values())
    model.zero_grad(set_to_none=True)
    assert estimate(model, (ids,), device="cpu").to_dict()["memory"]["gradients"] == held


def test_inductors_fused_multiply_add_is_a_multiply_and_an_add():
    """``prims.fma`` (Inductor defines it when imported; its compiled graphs hold it): a * b + c, which a real
    call computes, costs what the mul and the add cost on the same shapes (one multiply-add, 2 FLOPs)."""
    import torch._inductor.inductor_prims  # noqa: F401  (defines prims.fma)

    a, b, c = torch.randn(3, 5), torch.randn(3, 5), torch.randn(3, 5)
    fma = torch.ops.prims.fma.default
    assert torch.allclose(fma(a, b, c), a * b + c)
    rule = lookup(fma)
    assert rule is not None  # registered on first sight of the prims namespace
    mul, add = lookup(aten.mul.Tensor), lookup(aten.add.Tensor)
    expected = mul.fn(_call(aten.mul, dict(self=a, other=b), (3, 5))) + add.fn(_call(aten.add, dict(self=a, other=c),
                                                                                       (3, 5)))
    assert rule.fn(_call(torch.ops.prims.fma, dict(a=a, b=b, c=c), (3, 5))) == expected == 30

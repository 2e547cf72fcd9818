"""A fake tensor indexed by a boolean mask whose values the trace knows traces on fake tensors (the rotary
positions of Qwen2-VL-style models gather by ``attention_mask == 1``): as ATen does, the mask becomes the
integer positions of its true entries, so the output's size is known and the real-tensor fallback is not
needed.  Truth: a real CPU step (tests/groundtruth.measure) of the same model; ``trace="fake"`` forbids
the fallback."""

from __future__ import annotations

import pytest
import torch

import groundtruth
from estimator import estimate


class MaskedGather(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x, mask):  # x: (B, T, 8); mask: (B, T) bool, known values
        h = self.lin(x)
        picked = h[mask]  # (mask.sum(), 8): x[mask]
        h = h.clone()
        h[~mask] = 0.0  # index_put_ with a mask
        return picked.square().sum() + h.sum()


def test_boolean_mask_indexing_traces_on_fake_tensors_and_matches_a_real_step():
    model = MaskedGather()
    x, mask = torch.randn(2, 6, 8), torch.tensor([[1, 1, 0, 1, 0, 0], [1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    d = estimate(model, (x, mask), device="cpu", trace="fake").to_dict()
    truth = groundtruth.measure(model, (x, mask), "adamw", loss_fn=lambda out: out)
    assert d["capture_fallback"] is None
    assert d["memory"]["activations"] == truth["activation_bytes"]
    assert d["flops"]["matmul_forward"] == truth["matmul_forward"]
    assert d["flops"]["matmul_backward"] == truth["matmul_backward"]


class SkipsAnAllOnesMask(torch.nn.Module):
    """A mask builder as transformers' create_bidirectional_mask writes it: an all-ones mask is skipped (no 4-D
    additive mask is made, saved or read), any other becomes a (B, 1, T, T) bias on the scores."""

    def __init__(self):
        super().__init__()
        self.q, self.k = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x, attention_mask):
        scores = self.q(x) @ self.k(x).transpose(-1, -2)  # (B, T, T)
        if not bool(attention_mask.all()):
            bias = (1.0 - attention_mask[:, None, :]) * -1e9  # (B, 1, T)
            scores = scores * bias.expand_as(scores).exp()  # (the bias saved for backward)
        return scores.softmax(-1).sum()


def test_a_float_mask_given_by_name_keeps_its_values_so_an_all_ones_mask_is_skipped_as_in_the_real_step():
    """A user's float attention_mask of ones (Pix2Struct's processor gives float masks): traced with its values,
    the model skips it as the real step does; traced fake it would count the bias the real step never makes
    (Pix2Struct's vision tower: +74 % activations).  A mask with a zero still makes the bias in both."""
    model = SkipsAnAllOnesMask()
    x = torch.randn(2, 6, 8)
    for mask in (torch.ones(2, 6), torch.tensor([[1.0] * 6, [1.0] * 5 + [0.0]])):
        d = estimate(model, {"x": x, "attention_mask": mask}, device="cpu", loss_fn=lambda out: out).to_dict()
        truth = groundtruth.measure(model, {"x": x, "attention_mask": mask}, "adamw", loss_fn=lambda out: out)
        assert d["capture_fallback"] is None
        assert d["memory"]["activations"] == truth["activation_bytes"]


class InversePermutation(torch.nn.Module):
    """Reformer's LSH attention undoes its sort with an index made by the legacy ``Tensor.new(*size)`` (memory as it
    was) and filled by ``scatter_`` from the computed order."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 4)

    def forward(self, x):  # x: (B, T, 16)
        order = torch.argsort(self.proj(x).argmax(-1), dim=-1)  # (B, T), from the weights: fake
        with torch.no_grad():
            undo = order.new(*order.size())
            undo.scatter_(-1, order, torch.arange(x.shape[1]).expand_as(order))
        back = x.gather(1, order.unsqueeze(-1).expand_as(x)).gather(1, undo.unsqueeze(-1).expand_as(x))
        return (back * self.proj.weight.sum()).mean()


def test_an_uninitialized_index_filled_by_a_fake_scatter_is_not_read_as_known():
    """An integer ``empty`` was made for real (small, integral: "known values"), the fake ``scatter_`` wrote a
    stand-in, and the bounds check read the memory's garbage: a false IndexError quoting it (HF Reformer could not
    be estimated).  A real tensor a fake value is written into is its fake stand-in from then on; the step equals
    the real one.  (torch's own ``invert_permutation``, ``empty_like`` filled by a real ``scatter_``, keeps its
    values: packed sequences.)"""
    import groundtruth
    from estimator import estimate

    torch.manual_seed(0)
    model, x = InversePermutation(), torch.randn(2, 32, 16)
    d = estimate(model, x, device="cpu", loss_fn=lambda out: out).to_dict()
    truth = groundtruth.measure(model, x, "adamw", loss_fn=lambda out: out)
    assert d["memory"]["activations"] == truth["activation_bytes"]
    assert d["flops"]["matmul_forward"] == truth["matmul_forward"]

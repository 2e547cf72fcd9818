"""A fake tensor indexed by a boolean mask whose values the trace knows traces on fake tensors (the rotary
positions of Qwen2-VL-style models gather by ``attention_mask == 1``): as ATen does, the mask becomes the
integer positions of its true entries, so the output's size is known and the real-tensor fallback is not
needed.  Truth: a real CPU step (tests/groundtruth.measure) of the same model; ``trace="fake"`` forbids
the fallback."""

from __future__ import annotations

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

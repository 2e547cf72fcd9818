"""A model that branches on one random draw traces on fake tensors (issue 25 item 12).

OPT's decoder (and BART's, wav2vec2's) draws ``torch.rand([])`` per layer and compares it with its
LayerDrop probability, even when that is 0.  On fake tensors the draw has no value, so the capture fell
back to real tensors, which a full-size model (OPT-1.3B) is too large for: no estimate at all.  Single
draws now run for real from the capture's seeded generator.  ``trace="fake"`` forbids the fallback; every
number must still equal a real CPU step's (tests/groundtruth.measure)."""

from __future__ import annotations

import pytest
import torch

import groundtruth
from estimator import estimate
from sweep import COMPARED, materialize, real_inputs

pytest.importorskip("transformers")
pytestmark = pytest.mark.hf


def _get(d, path):
    for k in path:
        d = d[k]
    return d


def test_opt_traces_on_fake_tensors_and_matches_a_real_step():
    from estimator.specs import load_spec

    loaded = load_spec("hf:opt", batch=2, seq=16, overrides={"num_hidden_layers": 2, "hidden_size": 32,
                                                            "ffn_dim": 64, "num_attention_heads": 2,
                                                            "word_embed_proj_dim": 32, "vocab_size": 256})
    d = estimate(loaded.model, loaded.inputs, device="cpu", trace="fake").to_dict()
    assert d["capture_fallback"] is None
    truth = groundtruth.measure(materialize(loaded.model), real_inputs(loaded.inputs), "adamw")
    for name, (path, key) in COMPARED.items():
        assert _get(d, path) == truth[key], name


class StochasticDepth(torch.nn.Module):
    """Skips its block when one draw falls under p (a hand-written stochastic depth)."""

    def __init__(self, p: float):
        super().__init__()
        self.block, self.p = torch.nn.Linear(8, 8), p

    def forward(self, x):
        if self.training and torch.rand([]) < self.p:
            return x
        return x + self.block(x)


def test_a_hand_written_stochastic_depth_traces_on_fake_tensors():
    model = torch.nn.Sequential(StochasticDepth(0.0), StochasticDepth(0.0), torch.nn.Linear(8, 1))
    d = estimate(model, torch.randn(4, 8), device="cpu", trace="fake").to_dict()
    truth = groundtruth.measure(model, torch.randn(4, 8), "adamw", loss_fn=lambda out: out.sum())
    assert d["flops"]["matmul_forward"] == truth["matmul_forward"]  # every block ran: p = 0
    assert d["memory"]["activations"] == truth["activation_bytes"]

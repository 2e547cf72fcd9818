"""CTC with tensor lengths saves what the real step saves (issue 25's sweep: every speech CTC head, wav2vec2,
HuBERT, WavLM, SEW, UniSpeech, data2vec-audio, was 32-40 bytes over in activations).  ATen converts real
length tensors to lists and runs ``_ctc_loss`` with them; on fake tensors, or under any dispatch mode, it
took the ``_ctc_loss.Tensor`` overload, whose backward node keeps both length tensors.  The truth is a real
CPU step (tests/groundtruth.measure), for the fake trace and the real-tensor trace alike."""

from __future__ import annotations

import pytest
import torch

import groundtruth
from estimator import estimate


class CTCHead(torch.nn.Module):
    def __init__(self, d: int = 12, classes: int = 6):
        super().__init__()
        self.proj = torch.nn.Linear(d, classes)

    def forward(self, x, labels):  # x: (B, T, d); labels: (B, L), padding -100
        log_probs = self.proj(x).log_softmax(-1).transpose(0, 1)  # (T, B, classes)
        input_lengths = torch.ones_like(x[..., 0], dtype=torch.long).sum(-1)  # (B,): every frame
        mask = labels >= 0
        return torch.nn.functional.ctc_loss(log_probs, labels.masked_select(mask), input_lengths, mask.sum(-1),
                                            blank=0, reduction="mean")


@pytest.mark.parametrize("trace", ["fake", "real"])
def test_ctc_with_tensor_lengths_saves_what_the_real_step_saves(trace):
    model = CTCHead()
    x, labels = torch.randn(3, 20, 12), torch.tensor([[1, 2, 3, -100], [2, 2, -100, -100], [4, 5, 1, 3]])
    d = estimate(model, (x, labels), device="cpu", trace=trace).to_dict()
    truth = groundtruth.measure(model, (x, labels), "adamw", loss_fn=lambda out: out)
    assert d["memory"]["activations"] == truth["activation_bytes"]

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


class FixedLengths(torch.nn.Module):
    """CTC with lengths written for a batch of 2 (lists, as a training script may hard-code them)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(12, 6)

    def forward(self, x):  # x: (B, T, 12)
        log_probs = self.proj(x).log_softmax(-1).transpose(0, 1)
        targets = torch.ones(2, 3, dtype=torch.long)
        return torch.nn.functional.ctc_loss(log_probs, targets, [x.shape[1]] * 2, [3, 3], reduction="sum")


@pytest.mark.parametrize("bad", ["lengths for another batch", "input length over T"])
def test_ctc_lengths_that_do_not_fit_are_the_real_steps_error(bad):
    """ATen's checks of the lengths (``ctc_loss_allocate_outputs``) were not made on fake tensors: the backward's
    fallback then ran the real kernel on them and the process died (SIGSEGV, or glibc's heap corruption abort).
    Now the real step's error, in one line, and a search at other batch sizes that the lengths do not fit is
    "not searched" with that error (it died there too)."""
    from estimator.errors import UserError

    x = torch.randn(4 if bad == "lengths for another batch" else 2, 7, 12)
    model = FixedLengths()
    if bad == "input length over T":
        model.forward = lambda x: torch.nn.functional.ctc_loss(  # 9 frames claimed of 7
            model.proj(x).log_softmax(-1).transpose(0, 1), torch.ones(2, 3, dtype=torch.long), [9, 7], [3, 3])
    with pytest.raises(RuntimeError) as real:
        model(x).backward()
    with pytest.raises(UserError) as info:
        estimate(model, x, device="cpu", loss_fn=lambda out: out)
    assert "\n" not in str(info.value) and str(real.value).split(" (while")[0] in str(info.value)


def test_a_search_at_batches_the_ctc_lengths_do_not_fit_is_not_searched():
    report = estimate(FixedLengths(), torch.randn(2, 7, 12), gpu="H100", loss_fn=lambda out: out)
    assert report.max_batch is None and "input_lengths must be of size batch_size" in report.max_batch_note

"""Python-level stand-ins that send a fake-tensor trace down the path ATen takes for real tensors.

Some composite ops pick their implementation by whether an argument is a tensor subclass: on fake
tensors they take the "composite compliant" branch, which records different ops and saves different
tensors for backward than the fast branch a real step runs.  While :func:`eager_paths` is active:

* ``torch.nn.functional.ctc_loss`` with lengths whose values the trace knows (lists, or real CPU integer
  tensors: the lengths HF's CTC heads compute from the attention mask and the labels) runs ATen's
  list path op for op, its reduction in Python (ATen's ``at::tensor`` of the target lengths cannot be
  written on fake tensors).  ATen's ``ctc_loss`` (``aten/src/ATen/native/LossCTC.cpp``) converts real length tensors to
  ``IntArrayRef`` itself and calls ``_ctc_loss`` with lists, which saves no length tensors; on fake
  log-probabilities, and on real ones while a dispatch mode is active (the capture's, also on the
  real-tensor fallback: ``isTensorSubclassLike`` is true under any mode), it calls the
  ``_ctc_loss.Tensor`` overload instead, whose backward node keeps both length tensors (2 x batch x 8
  bytes more activations than the real step: wav2vec2, HuBERT, WavLM).
* ``torch.utils.swap_tensors``, which ``nn.Module._apply`` calls for every FakeTensor parameter (a module
  converted inside forward: Switch Transformers' router runs ``self.classifier = self.classifier.to(dtype)``
  at each call), and which refuses a tensor with weak references (the capture's, on every stand-in): the
  real step's parameters are plain tensors, which ``_apply`` updates in place (``param.data =``), so a refused
  swap of a fake tensor does that.

Each stand-in forwards to the original when its condition does not hold; everything is restored on exit.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F


def _known_lengths(t: object) -> bool:
    """Lengths whose values are known: a list of ints, or a real (not fake, not meta) integer tensor."""
    if isinstance(t, (list, tuple)):
        return all(isinstance(n, int) for n in t)
    return isinstance(t, torch.Tensor) and type(t) is torch.Tensor and not t.is_meta \
        and not t.is_floating_point() and t.dim() <= 1


def _as_list(t: object) -> list[int]:
    return list(t) if isinstance(t, (list, tuple)) else t.tolist()


def _ctc_loss(original):
    def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean",
                 zero_infinity=False):
        if not (_known_lengths(input_lengths) and _known_lengths(target_lengths)) or \
                reduction not in ("mean", "sum", "none"):
            return original(log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity)
        # ATen's ctc_loss(..., IntArrayRef input_lengths, IntArrayRef target_lengths, ...), op for op: the
        # per-sample losses from _ctc_loss with lists, then the reduction (its at::tensor of the target
        # lengths cannot be written on fake tensors, so the reduction is done here as ATen does it)
        lengths = _as_list(target_lengths)
        res = torch.ctc_loss(log_probs, targets, _as_list(input_lengths), lengths, blank, 0, False)  # 0: none
        if zero_infinity:
            res = torch.where(res == float("inf"), torch.zeros((), dtype=res.dtype, device=res.device), res)
        if reduction == "mean":
            return (res / torch.tensor(lengths, dtype=res.dtype, device=res.device).clamp_min(1)).mean()
        return res.sum() if reduction == "sum" else res

    ctc_loss.__wrapped__ = original  # type: ignore[attr-defined]
    return ctc_loss


def _swap_tensors(original):
    def swap_tensors(t1, t2):
        from torch._subclasses.fake_tensor import FakeTensor

        try:
            return original(t1, t2)
        except RuntimeError:
            if not (isinstance(t1, FakeTensor) and isinstance(t2, FakeTensor)):
                raise
            with torch.no_grad():  # (what _apply does for a plain tensor: its data replaced, the object kept)
                t1.data = t2.detach()

    swap_tensors.__wrapped__ = original  # type: ignore[attr-defined]
    return swap_tensors


def fast_path_failed(model: torch.nn.Module, train: bool, exc: BaseException) -> bool:
    """Whether ``exc`` is the fake trace failing on ``nn.MultiheadAttention``'s inference fast path: with a padding
    mask it makes a nested tensor, which "doesn't support sizes" on fake tensors (nn.TransformerEncoder was refused
    where its real forward runs); without one it runs its fused kernel, which the trace costs
    (``rules``: ``_native_multi_head_attention``, ``_transformer_encoder_layer_fwd``)."""
    kinds = (torch.nn.MultiheadAttention, torch.nn.TransformerEncoderLayer)
    return (not train and torch.backends.mha.get_fastpath_enabled() and "Nested" in str(exc)
            and any(isinstance(m, kinds) for m in model.modules()))


@contextlib.contextmanager
def mha_slow_path(slow: bool, notes: list[str]) -> Iterator[None]:
    """With ``slow``, the inference fast path of ``nn.MultiheadAttention`` off (:func:`fast_path_failed`), and said:
    its standard path runs the same projections and attention over every position, padded ones included."""
    if not slow:
        yield
        return
    notes.append("nn.MultiheadAttention's inference fast path with a padding mask (padded positions skipped as a "
                 "nested tensor) traced as its standard path: the same matmuls over every position")
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(True)


@contextlib.contextmanager
def eager_paths() -> Iterator[None]:
    original, swap = F.ctc_loss, torch.utils.swap_tensors
    F.ctc_loss, torch.utils.swap_tensors = _ctc_loss(original), _swap_tensors(swap)
    try:
        yield
    finally:
        F.ctc_loss, torch.utils.swap_tensors = original, swap

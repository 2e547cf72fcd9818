"""Shape-only kernels of ops FakeTensorMode has none for, whose sizes depend on length lists or real lengths:
``aten._ctc_loss`` with list lengths and ``aten._pack_padded_sequence`` (see each); and where a CPU kernel's
path differs from its meta kernel's (a bf16 EmbeddingBag sum: :func:`bf16_sum_fast_path`)."""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _disable_current_modes

from ..rules.registry import bind


def fake_ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """``aten._ctc_loss`` with list lengths (the overload a real step runs, see :mod:`.eager_paths`) on fake
    log-probabilities: ``neg_log_likelihood`` [B] and ``log_alpha`` [B, T, 2 * max(target_lengths) + 1]
    (ATen's ``ctc_loss_cpu_template`` / ``ctc_loss_gpu_template``), unbatched [T, C] input without the B.
    FakeTensorMode has no kernel for this overload (the sizes depend on the lengths' values, which the
    lists carry).  ATen's checks of the lengths first (``ctc_loss_allocate_outputs``): lengths that do not fit
    the tensors made the real kernels, run by FakeTensor's fallback in backward, crash the process."""
    steps = log_probs.shape[0]
    n = log_probs.shape[1] if log_probs.dim() == 3 else 1
    torch._check(len(input_lengths) == n, lambda: f"input_lengths must be of size batch_size ({len(input_lengths)} "
                                                   f"lengths for a batch of {n})")
    torch._check(len(target_lengths) == n, lambda: f"target_lengths must be of size batch_size ({len(target_lengths)} "
                                                    f"lengths for a batch of {n})")
    torch._check(max(input_lengths, default=0) <= steps, lambda: f"Expected input_lengths to have value at most "
                                                                  f"{steps}, but got value {max(input_lengths)}")
    torch._check(min(list(input_lengths) + list(target_lengths), default=0) >= 0, lambda: "lengths must be >= 0")
    if targets.dim() == 1:  # concatenated targets
        torch._check(sum(target_lengths) <= targets.shape[0], lambda: f"targets hold {targets.shape[0]} labels, the "
                                                                       f"target_lengths sum to {sum(target_lengths)}")
    else:
        torch._check(targets.shape[-1] >= max(target_lengths, default=0),
                     lambda: f"Expected tensor to have size at least {max(target_lengths)} at dimension 1, but got "
                             f"size {targets.shape[-1]} for argument #2 'targets'")
    width = 2 * (max(target_lengths) if len(target_lengths) else 0) + 1
    batch = (log_probs.shape[1],) if log_probs.dim() == 3 else ()
    return log_probs.new_empty(batch), log_probs.new_empty((*batch, steps, width))


def fake_pack_padded_sequence(input, lengths, batch_first):
    """``aten._pack_padded_sequence`` (``nn.utils.rnn.pack_padded_sequence``) on a fake ``input`` with
    real ``lengths`` (integer inputs keep their values): the packed rows, and ``batch_sizes`` as the
    kernel computes it (the number of sequences longer than each step; a real CPU int64 tensor, which
    the recurrent kernels read).  ATen's kernel writes ``batch_sizes`` through a data pointer, which a
    fake tensor has not: without this the capture fell back to a real trace (and, on the CUDA target,
    to CPU kernels instead of cuDNN's).  The kernel's per-step copies before its ``cat`` are not
    recorded (transient, at the start of the forward)."""
    if type(lengths) is FakeTensor or lengths.is_meta:  # lengths computed from fake values: the fake kernel
        return torch.ops.aten._pack_padded_sequence.default(input, lengths, batch_first)  # says it reads values
    with _disable_current_modes():
        known = lengths.to(torch.int64).tolist()
        steps = known[0] if known else 0  # ATen checks lengths are sorted, longest first
        batch_sizes = torch.tensor([sum(1 for n in known if n > t) for t in range(steps)], dtype=torch.int64)
    rows = input.new_empty((sum(known), *input.shape[2:]))  # (sum of lengths, features...)
    return rows, batch_sizes


def bf16_sum_fast_path(func: Any, args: tuple, kwargs: dict, output: torch.Tensor) -> bool:
    """ATen's CPU EmbeddingBag takes its sum fast path (no ``offset2bag``) for bfloat16 weights too, where the meta
    kernel's test names float and half only (``is_fast_path_index_select`` in EmbeddingBag.cpp and in
    ``meta_embedding_bag``): activations +44.6 % to +72.7 % on bf16 bags."""
    call = bind(func, args, kwargs)
    weight, scale = call.get("weight"), call.get("per_sample_weights")
    padding_idx = call.get("padding_idx")
    return (isinstance(weight, torch.Tensor) and weight.dtype == torch.bfloat16 and (call.get("mode") or 0) == 0
            and weight.stride(1) == 1 and output.stride(1) == 1 and (padding_idx is None or padding_idx < 0)
            and (scale is None or scale.stride(0) == 1))

"""Context parallelism: torch's ring attention (``context_parallel``) inside the traced step.

Under ``--cp N`` the ``N`` ranks of a context-parallel group hold one batch of sequences between
them, each a ``1/N`` shard of every sequence (torchtitan: ``context_parallel`` over the ``cp``
mesh dimension, the inputs, labels and position buffers sharded on their sequence dimension).
Everything but attention runs on the local shard as it would on a shorter sequence; attention
is torch's own ring attention (``torch/distributed/tensor/experimental/_context_parallel/
_attention.py``), traced here as it runs:

* ``F.scaled_dot_product_attention`` is wrapped (torch's monkey-patch dispatch): the query, key
  and value become DTensors sharded on the sequence, and the fused attention kernel (flash,
  memory-efficient or cuDNN) is dispatched to ``_templated_ring_attention``;
* the ring's key/value exchange is torch's default rotation (``_RotateMethod.ALL_GATHER``, also
  torchtitan's ``context_parallel_rotate_method = "allgather"``): one all-gather of the local
  keys and values per attention layer in forward and again in backward; the key/value
  gradients go round the ring by all-to-all (``permute_tensor``), ``N`` times (one per ring step);
* causal attention is load-balanced (torch's head-tail split, ``_cp_options.enable_load_balance``):
  each rank holds two chunks of every sequence, so the sequence must divide by ``2 x N``;
* the partial outputs and log-sum-exps are merged in float32 (``_SDPAMerger``,
  ``_cp_options.convert_to_f32``), the gradients accumulated in float32.

The kernels, buffers, collectives and saved tensors are therefore torch's, one rank's worth, on
the fake process group.  torch's ring attention handles only the CUDA attention kernels; a plan
traced for a CPU (``device="cpu"``, the exact-bytes mode the tests use) routes attention to the
flash kernel's op (its shapes from the meta kernel) and says so.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import replace
from typing import Any, Iterator

import torch
import torch.utils._pytree as pytree

from ..errors import UserError
from .layout import CP_ROTATES
from .results import Solve
from .search import _plain, resize_inputs

def shard_sequence(inputs: Any, seq: int | None, cp: int) -> Any:
    """``inputs`` as ``context_parallel(buffers=...)`` leaves them on each rank of the group: every tensor's
    sequence dimension (dim 1 of size ``seq``) cut to the rank's ``seq / cp``, in place (``resize_``), so each
    keeps its full-length storage."""
    if seq is None:
        raise UserError(f"--cp {cp} shards the sequence: the inputs have no sequence dimension (dimension 1)")
    if seq % (2 * cp):
        raise UserError(f"--cp {cp} splits each sequence into 2 x {cp} chunks (torch's load-balanced causal ring "
                        f"attention): the sequence {seq} must be a multiple of {2 * cp}")
    made: dict[int, torch.Tensor] = {}

    def one(t: torch.Tensor) -> torch.Tensor:
        if t.ndim < 2 or t.shape[1] != seq:
            return t
        if t.requires_grad:  # a leaf taking gradients (inputs_embeds): a tensor of its own
            return resize_inputs(t, 1, seq, seq // cp)
        if id(t) not in made:
            shape = (t.shape[0], seq // cp, *t.shape[2:])
            storage = torch.empty(t.numel(), dtype=t.dtype, device="meta")  # the full-length storage kept
            made[id(t)] = storage[:math.prod(shape)].view(shape)
        return made[id(t)]

    return pytree.tree_map_only(torch.Tensor, one, _plain(inputs))


def in_chunks(found: Solve, unit: int, limit: tuple[int, str] | None) -> Solve:
    """A sequence search run in units of ``unit`` = 2 x cp positions (every length traced splits into the
    load-balanced chunks), its lengths given back in positions; ``limit``: the model's own, in positions."""
    def times(v: int | None) -> int | None:
        return None if v is None else v * unit

    return replace(found, value=times(found.value), memory_allows=times(found.memory_allows),
                   traced=[v * unit for v in found.traced], method=f"{found.method}, in steps of 2 x cp = {unit}",
                   limited_by=found.limited_by and limit and f"{limit[1]} = {limit[0]}")


def _flash_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """``F.scaled_dot_product_attention`` as the flash kernel's op (what CUDA runs for a causal, unmasked call in
    half precision): the op torch's ring attention takes over."""
    if attn_mask is not None:
        raise UserError("--cp: the model passes an attention mask; torch's ring attention takes causal or "
                        "unmasked attention only (is_causal=True, no attn_mask)")
    return torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False,
                                                              scale=scale)[0]


class Calls:
    """``F.scaled_dot_product_attention`` counting its calls (torch's context parallelism wraps it in turn)."""

    __name__ = "scaled_dot_product_attention"  # torch's patch replaces the function of this name

    def __init__(self, sdpa: Any):
        self.sdpa, self.count = sdpa, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.count += 1
        return self.sdpa(*args, **kwargs)


def check_ring(calls: Calls) -> None:
    """A model whose attention never called ``F.scaled_dot_product_attention`` would be planned with each rank
    attending to its own chunk only: refused."""
    if not calls.count:
        raise UserError("--cp: the model never called torch.nn.functional.scaled_dot_product_attention, the function "
                        "torch's context parallelism turns into ring attention; use a model that does (Hugging Face: "
                        "attn_implementation='sdpa') or plan without --cp")


def cp_error(exc: UserError, cp: int = 2, calls: Calls | None = None) -> None:
    """The one-line errors of attention torch's ring cannot take (raised from ``exc``): the known refusals, then any
    forward that failed on the rank's shard of the sequence (``calls``: the attention calls it made before)."""
    text = str(exc)
    if "Load balancing requires" in text:
        raise UserError("--cp: torch's context parallelism splits causal attention only (its load-balanced ring); "
                        "this model's attention is not causal (an encoder?): plan it without --cp") from exc
    if "Attempting to broadcast a dimension" in text and "aten.sub" in text:
        raise UserError("--cp: torch's ring attention could not merge its partial results: with the memory-efficient "
                        "kernel (fp32 attention on this GPU) each rank's shard must be a multiple of 32 positions (the "
                        "kernel pads its log-sum-exp to 32); use a sequence that is a multiple of 32 x cp") from exc
    if "attn_bias is not supported" in text or "passes an attention mask" in text:
        raise UserError("--cp: the model passes an attention mask, which torch's ring attention does not take "
                        "(causal or unmasked attention only): plan it without --cp") from exc
    if text.startswith("the forward pass failed"):  # (on 1/cp of the sequence: a model that is not cp-ready)
        before = "" if calls is None or calls.count else (" before its first call of "
                                                           "torch.nn.functional.scaled_dot_product_attention")
        raise UserError(f"--cp {cp}: the forward failed on a rank's 1/{cp} of the sequence{before}: torch's context "
                        f"parallelism takes causal attention through scaled_dot_product_attention, without masks, "
                        f"sliding windows or position tables of the whole sequence; plan it without --cp "
                        f"({text.removeprefix('the forward pass failed ').split('; check ')[0]})") from exc


@contextlib.contextmanager
def ring_attention(mesh: Any, device: str, rotate: str = "allgather") -> Iterator[Calls]:
    """torch's context-parallel dispatch for the duration of a trace: scaled-dot-product attention over the
    ``mesh`` (the cp dimension) as ring attention, load-balanced, with the ``rotate`` key/value exchange."""
    import torch.nn.functional as F
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp

    if rotate not in CP_ROTATES:  # (check_layout says so in its words first)
        raise ValueError(f"unknown rotation {rotate!r}")
    options = cp._cp_options
    saved = (options.enable_load_balance, options.rotate_method, F.scaled_dot_product_attention)
    options.enable_load_balance = True
    options.rotate_method = cp._RotateMethod.ALL_GATHER if rotate == "allgather" else cp._RotateMethod.ALL_TO_ALL
    calls = Calls(_flash_sdpa if device == "cpu" else F.scaled_dot_product_attention)
    F.scaled_dot_product_attention = calls
    cp._enable_context_parallel_dispatcher_impl(seq_dim=2, mesh=mesh)
    try:
        yield calls
    finally:
        cp._disable_context_parallel_dispatcher_impl()
        options.enable_load_balance, options.rotate_method, F.scaled_dot_product_attention = saved


def cp_notes(cp: int, rotate: str, device: str) -> list[str]:
    notes = [f"context parallelism: each sequence split over {cp} ranks (2 x {cp} load-balanced chunks), attention "
             f"as torch's ring attention ({rotate} key/value exchange, float32 merge); FSDP2 shards and DDP averages "
             f"over the data-parallel x context-parallel ranks"]
    if device == "cpu":
        notes.append("context parallelism on device cpu: attention traced as the CUDA flash kernel (torch's ring "
                     "attention has no CPU kernel)")
    return notes

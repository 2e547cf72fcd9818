"""What the loop keeps alive: the leaves the loss's graph holds beside the parameters and inputs; the tensors of
the output it holds, a transformers cache's included."""

from __future__ import annotations

import torch


def leaves_held_by(loss: torch.Tensor, known: set[int]) -> list[torch.Tensor]:
    """The leaves made in the step (ids not in ``known``, the parameters' and inputs': a view of the input on which
    the model sets ``requires_grad``, as wav2vec2's feature encoder does; queries a decoder starts from zeros with
    ``requires_grad``) that the loss's graph keeps, and their gradients: its AccumulateGrad nodes hold their leaf,
    and the leaf its ``.grad``, as long as the loss lives."""
    held, seen, stack = [], set(), [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        leaf = getattr(fn, "variable", None)  # AccumulateGrad
        if leaf is not None and id(leaf) not in known:
            held += [leaf] + ([leaf.grad] if leaf.grad is not None else [])
        stack.extend(f for f, _ in fn.next_functions)
    return held


def output_tensors(output: object) -> list[torch.Tensor]:
    """The tensors ``output`` holds: its pytree leaves, and inside a transformers ``Cache`` among them (the
    ``past_key_values`` an inference forward returns with ``use_cache``: each layer's keys and values or
    recurrent states; an encoder-decoder's self- and cross-attention caches) the tensors of its layers."""
    import torch.utils._pytree as pytree

    out: list[torch.Tensor] = []
    for leaf in pytree.tree_leaves(output):
        if isinstance(leaf, torch.Tensor):
            out.append(leaf)
        else:
            out += _cache_tensors(leaf, 0)
    return out


def _cache_tensors(obj: object, depth: int) -> list[torch.Tensor]:
    from .generate import cache_tensors

    if depth > 2 or isinstance(obj, torch.nn.Module):
        return []
    out = [t for _, _, t in cache_tensors(obj)]  # a Cache's layers (nothing for another object)
    for inner in ("self_attention_cache", "cross_attention_cache"):  # EncoderDecoderCache
        if hasattr(obj, inner):
            out += _cache_tensors(getattr(obj, inner), depth + 1)
    return out

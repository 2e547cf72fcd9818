"""What the loss keeps alive: the leaves its graph holds beside the parameters and inputs."""

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

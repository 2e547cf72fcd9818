"""What the loop keeps alive: the leaves the loss's graph holds beside the parameters and inputs; the tensors of
the output it holds, a transformers cache's included."""

from __future__ import annotations

from typing import Any

import torch


def leaves_held_by(loss: torch.Tensor, known: set[int]) -> list[torch.Tensor]:
    """The leaves made in the step (ids not in ``known``, the parameters' and inputs': a view of the input on which
    the model sets ``requires_grad``, as wav2vec2's feature encoder does; queries a decoder starts from zeros with
    ``requires_grad``) that the loss's graph keeps, and their gradients: its AccumulateGrad nodes hold their leaf,
    and the leaf its ``.grad``, as long as the loss lives.  So do a custom autograd Function's nodes hold the
    tensors its ``ctx`` keeps as attributes (``ctx.t = t`` rather than ``save_for_backward``), which backward does
    not free: the steady-state peak left them out (-8.2 % on a layer keeping its input so)."""
    from torch.autograd.function import BackwardCFunction
    from torch.utils.checkpoint import CheckpointFunction

    held, seen, stack = [], set(), [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        leaf = getattr(fn, "variable", None)  # AccumulateGrad
        if leaf is not None and id(leaf) not in known:
            held += [leaf] + ([leaf.grad] if leaf.grad is not None else [])
        # (a ctx attribute: a tensor, or a list or tuple of them; reentrant checkpointing's keeps RNG states, host
        # memory: its inputs it saves for backward)
        if isinstance(fn, BackwardCFunction) and getattr(fn, "_forward_cls", None) is not CheckpointFunction:
            for value in vars(fn).values():
                held += [t for t in (value if isinstance(value, (list, tuple)) else (value,))
                         if isinstance(t, torch.Tensor) and id(t) not in known]
        elif isinstance(fn, BackwardCFunction):  # (its function, to run again in backward, and what it holds)
            held += [t for t in _function_tensors(getattr(fn, "run_function", None)) if id(t) not in known]
        stack.extend(f for f, _ in fn.next_functions)
    return held


def _function_tensors(function: Any) -> list[torch.Tensor]:
    """The tensors a function reentrant checkpointing keeps (``ctx.run_function``) holds: a ``functools.partial``'s
    arguments (transformers' checkpointed layers: ``partial(layer.__call__, **kwargs)``, its rotary cos and sin
    among them) and a closure's cells, one level into lists, tuples and dicts: the steady-state peak left them out
    (-0.3 % on a Llama, their bytes on any layer)."""
    import functools

    values: list[Any] = []
    while isinstance(function, functools.partial):
        values += [*function.args, *function.keywords.values()]
        function = function.func
    for cell in getattr(function, "__closure__", None) or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # (an empty cell)
            continue
    out: list[torch.Tensor] = []
    for v in values:
        inner = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else (v,)
        out += [t for t in inner if isinstance(t, torch.Tensor)]
    return out


def drop_unreached_saves(saved: dict, aliases: dict, sid_of: dict) -> None:
    """The activations are what autograd holds when backward starts: a tensor saved by a node the loss does not
    reach (a metric, an unused pooler, a router's auxiliary output) was freed with its node when the forward's
    references died, as in the real step, and is not counted (its bytes stay in the timeline while they lived).
    ``saved``: storage id -> (bytes, module), trimmed in place; ``aliases``: storage id -> weak references to what
    autograd holds of it; ``sid_of``: the recorder's live storages."""
    live = {sid for sid, ref in sid_of.values() if ref() is not None}
    for sid in list(saved):
        # a save whose node died is freed with it, though its storage may live on elsewhere (a codebook a
        # module caches as a plain attribute, Mimi's ``_embed``): what autograd holds, as the real step
        held = any(ref() is not None for ref in aliases[sid]) if sid in aliases else sid in live
        if not held:
            del saved[sid]


def kept_outside(rec: Any, extra_sids: dict[str, set[int]]) -> set[int]:
    """Leaves from outside the model that take gradients (a discriminator left trainable, run by ``loss_fn`` in a
    generator's step; the recorder's ``outside_grads``): no ``optimizer.zero_grad()`` of the model's reaches their
    ``.grad``, so it stays allocated and each backward adds into it, as an input's that requires grad
    (``extra_sids["input_gradient"]``: the steady-state peak counted it twice, +15 %, the previous loss holding the
    last one as the new was made).  Returns their ids (not leaves the loss holds: they live anyway)."""
    leaves = [t for t in list(rec.outside_grads.keys()) if t.grad is not None]
    extra_sids.setdefault("input_gradient", set()).update(rec.sid(t.grad) for t in leaves)
    return {id(t) for t in leaves}


def held_outside(rec: Any) -> set[int]:
    """Storages of tensors from outside the step that are still alive when it ends (a teacher's weights run by
    ``loss_fn``, a tensor attribute of the model that is no buffer, labels a ``loss_fn`` closes over): they exist
    before the step and after it, so they are live from its start (the first step's too), not from their first
    read (a distiller's peak was 27 % low). Only storages first met as such constants (none of the step's ops
    made them) and never freed during the step."""
    freed = {sid for _, sid, delta in rec.events if delta < 0}
    return set(rec.constant_sids) - freed


def given_inputs_are_theirs(rec: Any, given: Any, stand_ins: list[torch.Tensor]) -> None:
    """Each real tensor of the ``given`` inputs shares its traced stand-in's storage id: read again from outside
    (labels a ``loss_fn`` closes over that are the input ids themselves), it is the input, not a second copy."""
    import torch.utils._pytree as pytree

    from .inputs import is_real

    real = [t for t in pytree.tree_leaves(given) if isinstance(t, torch.Tensor)]
    if len(real) != len(stand_ins):
        return
    for t, stand_in in zip(real, stand_ins):  # (a stand-in is fake, or a real copy keeping the values)
        if is_real(t) and (t.dtype, t.shape) == (stand_in.dtype, stand_in.shape):
            rec.same_storage(t, stand_in)


def restore_outside_grads(rec: Any) -> None:
    """Each outside leaf's ``.grad`` as it was before the step (the trace left a fake tensor on the user's own
    discriminator: its next real step failed)."""
    for t, grad in list(rec.outside_grads.items()):
        t.grad = grad


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

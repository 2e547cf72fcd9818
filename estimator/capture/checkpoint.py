"""Activation checkpointing as the model's framework runs it: every instance of some module classes
(or every N-th, or with a per-op policy) under ``torch.utils.checkpoint`` for one capture, then the
model put back as it was.

* A Hugging Face ``transformers`` model whose checkpointable layers (``GradientCheckpointingLayer``
  subclasses) are exactly the classes asked for, with the ``full`` policy, is checkpointed by
  transformers itself (``activation_checkpointing_enable``, or ``gradient_checkpointing_enable`` in
  releases before it): its layers then run with the KV cache off (``use_cache=False``, no
  ``past_key_values``), as transformers does in training, and with transformers' default
  ``use_reentrant``.
* Any other module, or another policy, runs under non-reentrant ``torch.utils.checkpoint``, as a
  model that calls ``checkpoint(block, x, use_reentrant=False)`` itself (PyTorch's recommended mode),
  or as torchtitan's ``checkpoint_wrapper`` does.

Policies (:func:`parse_policy`), torchtitan's ``activation_checkpoint`` options:

* ``full``: every instance recomputes its whole forward in backward;
* ``layer:N``: every N-th instance (1-based, in module order: the N-th, 2N-th, ...), the others not
  checkpointed (torchtitan's ``selective_ac_option=N``, ``_apply_layer_sac``);
* ``op``: every instance, with a selective-checkpoint policy that saves the outputs of the
  compute-heavy ops and recomputes the rest (``torch.utils.checkpoint.create_selective_checkpoint_contexts``):
  torchtitan's per-op policy (``selective_ac_option="op"``, ``_get_custom_policy``): the outputs of
  the attention kernels, the ``reduce_scatter_tensor`` collectives and ``max`` (float8's amax) are
  saved, and of the ``mm`` outputs every other one, counting the forward's and the recomputation's
  matmuls apart;
* a callable: your own ``context_fn`` for ``torch.utils.checkpoint.checkpoint`` (called once per
  checkpointed forward; returns the forward and recompute context managers).
"""

from __future__ import annotations

import sys
import warnings
from collections import defaultdict
from typing import Any, Callable

import torch

from ..errors import UserError

POLICIES = ("full", "op", "layer:N")


def parse_policy(policy: Any) -> Any:
    """``"full"``, ``"op"``, ``("layer", N)`` for ``"layer:N"``, or a callable ``context_fn``; a one-line
    error for anything else."""
    if policy is None or policy == "full":
        return "full"
    if callable(policy):
        return policy
    if isinstance(policy, tuple) and len(policy) == 2 and policy[0] == "layer" and isinstance(policy[1], int) \
            and policy[1] >= 1:
        return policy  # parsed already
    if isinstance(policy, str):
        text = policy.strip().lower()
        if text == "op":
            return "op"
        head, sep, tail = text.partition(":")
        if head == "layer" and sep:
            try:
                every = int(tail)
            except ValueError:
                every = 0
            if every >= 1:
                return ("layer", every)
    raise UserError(f"--checkpoint-policy {policy!r}: use full, op or layer:N (N >= 1: every N-th instance)")


def policy_name(policy: Any) -> str:
    """How a parsed policy reads in a report: ``full``, ``op``, ``layer:2``, ``custom``."""
    policy = parse_policy(policy)
    if isinstance(policy, tuple):
        return f"layer:{policy[1]}"
    return policy if isinstance(policy, str) else "custom"


def _op_save_list() -> frozenset:
    """The ops whose outputs torchtitan's per-op policy saves (torchtitan ``_save_list``), those this
    torch has."""
    aten = torch.ops.aten
    names = [(aten, "mm"), (aten, "_scaled_dot_product_efficient_attention"),
             (aten, "_scaled_dot_product_flash_attention"), (aten, "_scaled_dot_product_cudnn_attention"),
             (aten, "_scaled_dot_product_attention_math"), (aten, "_scaled_dot_product_fused_attention_overrideable"),
             (aten, "max")]
    ops = [getattr(getattr(ns, name), "default") for ns, name in names if hasattr(ns, name)]
    c10d = getattr(torch.ops, "_c10d_functional", None)
    if c10d is not None and hasattr(c10d, "reduce_scatter_tensor"):
        ops.append(c10d.reduce_scatter_tensor.default)
    return frozenset(ops)


def op_policy_context_fn() -> Any:
    """A ``context_fn`` with torchtitan's per-op policy; one counter of matmuls per checkpointed call."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    # a float8 Linear's GEMM is ``aten.mm`` on torchao's float8 tensors where torchtitan's policy sees it (above the
    # subclass), ``_scaled_mm`` below it, where a compiled graph runs it: a matmul either way
    mms = {torch.ops.aten.mm.default} | ({torch.ops.aten._scaled_mm.default} if hasattr(torch.ops.aten, "_scaled_mm")
                                          else set())
    save = _op_save_list() | mms
    counts: dict[str, int] = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = "recompute_mm_count" if ctx.is_recompute else "forward_mm_count"
        if func in mms:
            counts[key] += 1
        # every compute-heavy op's output saved, but every second matmul's
        to_save = func in save and not (func in mms and counts[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def wrap_checkpointed(model: torch.nn.Module, classes: tuple[type, ...], policy: Any = "full") -> Callable[[], None]:
    """Run the instances of ``classes`` the ``policy`` picks under activation checkpointing; return an undo.

    The undo restores each module exactly: a ``forward`` the user set on the instance comes
    back, and a module without one falls back to its class's ``forward`` again; transformers'
    checkpointing attributes get back the values (or the absence) they had."""
    if not classes:
        return lambda: None
    policy = parse_policy(policy)
    hf = _hf_checkpointing(model, classes) if policy == "full" else None
    if hf is not None:
        return hf
    from torch.utils.checkpoint import checkpoint

    context_fn = op_policy_context_fn if policy == "op" else (policy if callable(policy) else None)
    every = policy[1] if isinstance(policy, tuple) else 1
    _absent = object()
    wrapped: list[tuple[torch.nn.Module, Any]] = []
    count = 0
    for mod in model.modules():
        if isinstance(mod, classes) and mod is not model:
            count += 1
            if count % every:
                continue  # layer:N checkpoints the N-th, 2N-th, ... instance
            own = mod.__dict__.get("forward", _absent)  # an instance-level forward, if the user set one
            original = mod.forward
            extra = {"context_fn": context_fn} if context_fn is not None else {}

            def forward(*a, __f=original, __extra=extra, **k):
                return checkpoint(__f, *a, use_reentrant=False, **__extra, **k)

            mod.forward = forward
            wrapped.append((mod, own))

    def undo() -> None:
        for mod, own in wrapped:
            if own is _absent:
                del mod.forward  # back to the class's forward
            else:
                mod.forward = own

    return undo


_HF_ATTRS = ("gradient_checkpointing", "_gradient_checkpointing_func", "_require_grads_hook", "_require_grads_hooks")


def _hf_checkpointing(model: torch.nn.Module, classes: tuple[type, ...]) -> Callable[[], None] | None:
    """transformers' own checkpointing when ``classes`` are exactly the model's checkpointable layer
    classes (``transformers.modeling_layers.GradientCheckpointingLayer``); else None."""
    layers_module = sys.modules.get("transformers.modeling_layers")
    layer_base = getattr(layers_module, "GradientCheckpointingLayer", None)
    if layer_base is None or not getattr(model, "supports_gradient_checkpointing", False):
        return None
    enable = getattr(model, "activation_checkpointing_enable", None) or \
        getattr(model, "gradient_checkpointing_enable", None)
    disable = getattr(model, "activation_checkpointing_disable", None) or \
        getattr(model, "gradient_checkpointing_disable", None)
    if enable is None or disable is None:
        return None
    layer_classes = {type(m) for m in model.modules() if isinstance(m, layer_base)}
    asked = {type(m) for m in model.modules() if isinstance(m, classes) and m is not model}
    if not layer_classes or asked != layer_classes:
        return None
    saved = [(m, {a: m.__dict__[a] for a in _HF_ATTRS if a in m.__dict__}) for m in model.modules()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # gradient_checkpointing_enable's rename notice
        enable()
    def undo() -> None:
        disable()
        # transformers' enable also hooks the input embeddings (enable_input_require_grads, for token models), which
        # its disable leaves registered: the hooks it added are removed (a copy of the model kept their handles,
        # dead once the step's modules went, and copy.deepcopy failed on them)
        kept = {id(h) for _, attrs in saved for h in attrs.get("_require_grads_hooks", ())}
        for mod in model.modules():
            for h in mod.__dict__.get("_require_grads_hooks", ()):
                if id(h) not in kept:
                    h.remove()
        for mod, attrs in saved:
            for a in _HF_ATTRS:
                if a in attrs:
                    setattr(mod, a, attrs[a])
                elif a in mod.__dict__:
                    delattr(mod, a)

    return undo


def resolve_classes(model: torch.nn.Module, names: Any, option: str = "--checkpoint") -> tuple[type, ...]:
    """Module classes from classes or class names (``"Block"``, ``"GPT2Block"``) present in ``model``."""
    if not names:
        return ()
    items = names if isinstance(names, (list, tuple, set)) else [names]
    # the model itself is never checkpointed or wrapped as one of its blocks: its class alone names nothing
    inner = [m for m in model.modules() if m is not model]
    by_name: dict[str, list[type]] = {}  # (every class of that name: an encoder's Block and a decoder's)
    for m in inner:
        if type(m) not in by_name.setdefault(type(m).__name__, []):
            by_name[type(m).__name__].append(type(m))
    classes = []
    for item in items:
        if (item is type(model) or item == type(model).__name__) and item not in by_name \
                and not any(isinstance(m, type(model)) for m in inner):
            raise UserError(f"{option} {type(model).__name__}: the only module of that class is the model itself, "
                            f"which {option} does not take (it names the model's blocks); classes present: "
                            f"{', '.join(sorted(by_name)[:15])}")
        if isinstance(item, type) and any(isinstance(m, item) for m in inner):
            classes.append(item)
        elif isinstance(item, type):  # (by name it is refused alike: checkpointing it would change nothing)
            raise UserError(f"{option} {item.__name__}: no module of that class in the model; "
                            f"classes present: {', '.join(sorted(by_name)[:15])}")
        elif isinstance(item, str) and item in by_name:
            classes.extend(by_name[item])
        elif isinstance(item, torch.nn.Module):
            raise UserError(f"{option} takes module classes or their names (e.g. {type(item).__name__} or "
                            f"'{type(item).__name__}'), not a module instance")
        else:
            raise UserError(f"{option} {item!r}: no module of that class in the model; "
                            f"classes present: {', '.join(sorted(by_name)[:15])}")
    return tuple(classes)


KV_CACHE_OFF = {  # why a training step's KV cache is turned off (kv_caches_off), as the report says it
    "checkpoint": "checkpointing: the model's KV cache off (config.use_cache=False), as transformers sets it under "
                  "gradient checkpointing",
    "compile": "torch.compile: the model's KV cache off (config.use_cache=False): AOTAutograd cannot return its "
               "cache object (Dynamo compiles it into one graph); the training step's loss does not read it",
}


def kv_caches_off(model: torch.nn.Module, stack: Any) -> bool:
    """Every KV cache of ``model`` turned off for the step, put back by ``stack`` (an ``ExitStack``): each
    ``config`` in the model with ``use_cache`` True (T5's stacks and an encoder-decoder's decoder hold copies of
    their own), as transformers turns its cache off under gradient checkpointing ("use_cache=True is incompatible
    with gradient checkpointing": a cache updated in forward would be updated again by the recomputation).
    Whether there was one."""
    configs = {id(c): c for m in model.modules() for c in [getattr(m, "config", None)]
               if getattr(c, "use_cache", None) is True}
    for config in configs.values():
        config.use_cache = False
        stack.callback(setattr, config, "use_cache", True)
    return bool(configs)

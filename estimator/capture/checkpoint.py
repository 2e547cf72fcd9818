"""The activation-checkpointing what-if: run every instance of some module classes under
activation checkpointing for one capture, as the model's framework runs it, then put the model
back as it was.

* A Hugging Face ``transformers`` model whose checkpointable layers (``GradientCheckpointingLayer``
  subclasses) are exactly the classes asked for is checkpointed by transformers itself
  (``activation_checkpointing_enable``, or ``gradient_checkpointing_enable`` in releases before
  it): its layers then run with the KV cache off (``use_cache=False``, no ``past_key_values``),
  as transformers does in training, and with transformers' default ``use_reentrant``.
* Any other module is run under non-reentrant ``torch.utils.checkpoint``, as a model that calls
  ``checkpoint(block, x, use_reentrant=False)`` itself (PyTorch's recommended mode).
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Callable

import torch

from ..errors import UserError


def wrap_checkpointed(model: torch.nn.Module, classes: tuple[type, ...]) -> Callable[[], None]:
    """Run every instance of ``classes`` under activation checkpointing; return an undo.

    The undo restores each module exactly: a ``forward`` the user set on the instance comes
    back, and a module without one falls back to its class's ``forward`` again; transformers'
    checkpointing attributes get back the values (or the absence) they had."""
    if not classes:
        return lambda: None
    hf = _hf_checkpointing(model, classes)
    if hf is not None:
        return hf
    from torch.utils.checkpoint import checkpoint

    _absent = object()
    wrapped: list[tuple[torch.nn.Module, Any]] = []
    for mod in model.modules():
        if isinstance(mod, classes) and mod is not model:
            own = mod.__dict__.get("forward", _absent)  # an instance-level forward, if the user set one
            original = mod.forward

            def forward(*a, __f=original, **k):
                return checkpoint(__f, *a, use_reentrant=False, **k)

            mod.forward = forward
            wrapped.append((mod, own))

    def undo() -> None:
        for mod, own in wrapped:
            if own is _absent:
                del mod.forward  # back to the class's forward
            else:
                mod.forward = own

    return undo


_HF_ATTRS = ("gradient_checkpointing", "_gradient_checkpointing_func")


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
    by_name = {type(m).__name__: type(m) for m in model.modules()}
    classes = []
    for item in items:
        if isinstance(item, type):
            classes.append(item)
        elif isinstance(item, str) and item in by_name:
            classes.append(by_name[item])
        else:
            raise UserError(f"{option} {item!r}: no module of that class in the model; "
                            f"classes present: {', '.join(sorted(by_name)[:15])}")
    return tuple(classes)

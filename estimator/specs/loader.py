""":func:`load_spec`: the SPEC's loader by its prefix, then ``--input`` shapes over the inputs it made.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ..errors import UserError
from .callables import load_factory
from .hf import load_hf
from .options import Loaded, SpecOptions, parse_overrides, parse_shape, prefix_of
from .vision import load_timm, load_torchvision


def load_spec(
    spec: str,
    input_shapes: list[str] | None = None,
    *,
    batch: int | None = None,
    seq: int | None = None,
    image_size: int | None = None,
    overrides: list[str] | Mapping[str, Any] | None = None,
    empty: bool = True,
    labels: bool = True,
    new_tokens: int | None = None,
) -> Loaded:
    """Build the model and inputs a SPEC names (see the module doc); never downloads anything.

    ``labels``: a training batch (``hf:`` token and image models get labels, so that they compute their loss);
    False for inference and generation, which feed the inputs alone; ``new_tokens``: generation's tokens after the
    prompt of ``seq`` (a warning when the two need more positions than the model has)."""
    opts = SpecOptions(list(input_shapes or []), batch, seq, image_size, parse_overrides(overrides), empty, labels,
                       new_tokens or 0)
    for flag, value in (("--batch", batch), ("--seq", seq), ("--image-size", image_size)):
        if value is not None and value < 1:
            raise UserError(f"{flag} must be >= 1, not {value}")
    prefix = prefix_of(spec)
    if prefix is None:
        loaded = load_factory(spec, opts)
    else:
        target = spec[len(prefix) + 1:].strip()
        if not target:
            raise UserError(f"bad SPEC {spec!r}: write {prefix}:NAME, e.g. "
                            + {"hf": "hf:gpt2", "torchvision": "torchvision:resnet50", "timm": "timm:resnet50"}[prefix])
        loaded = {"hf": load_hf, "torchvision": load_torchvision, "timm": load_timm}[prefix](target, opts)
        loaded.name = spec
    if opts.input_shapes:
        tensors = tuple(parse_shape(s) for s in opts.input_shapes)
        loaded.inputs = tensors[0] if len(tensors) == 1 else tensors
        loaded.loss_fn = None if prefix is None else loaded.loss_fn
        loaded.description = f"{type(loaded.model).__name__}; inputs {', '.join(opts.input_shapes)}"
    if loaded.inputs is None:
        raise UserError(f"{spec} returns a model without inputs: pass --input SHAPE (e.g. --input 8x3x224x224)")
    return loaded


def load(spec: str, input_shapes: list[str] | None = None, **options: Any) -> tuple[torch.nn.Module, Any]:
    """Build ``(model, inputs)`` from a SPEC and optional ``--input`` shapes (see :func:`load_spec`)."""
    loaded = load_spec(spec, input_shapes, **options)
    return loaded.model, loaded.inputs

"""What a model's ``forward`` takes, read from its signature (the loaders build inputs by name)."""

from __future__ import annotations

import inspect

import torch


def takes(model: torch.nn.Module, name: str) -> bool:
    """Whether ``model.forward`` has a parameter called ``name``."""
    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return False


def required(model: torch.nn.Module) -> list[str]:
    """The forward's parameters without a default, in order."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):  # pragma: no cover
        return []
    return [p.name for p in params if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY, p.POSITIONAL_ONLY)]

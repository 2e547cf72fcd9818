"""The activation-checkpointing what-if: run every instance of some module classes under
non-reentrant ``torch.utils.checkpoint`` for one capture, then put the model back as it was."""

from __future__ import annotations

from typing import Any, Callable

import torch


def wrap_checkpointed(model: torch.nn.Module, classes: tuple[type, ...]) -> Callable[[], None]:
    """Run every instance of ``classes`` under non-reentrant ``torch.utils.checkpoint``; return an undo.

    The undo restores each module exactly: a ``forward`` the user set on the instance comes
    back, and a module without one falls back to its class's ``forward`` again."""
    if not classes:
        return lambda: None
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

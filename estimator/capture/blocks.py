"""Repeated blocks: the stack of identical layers most models are made of (a transformer's decoder
layers, a ResNet stage's bottlenecks), found so that the capture traces a few of them and replicates
the rest (:mod:`.replicate`).

A stack qualifies when it is an ``nn.ModuleList`` or ``nn.Sequential`` of at least
:data:`MIN_BLOCKS` distinct modules of one class with the same submodule tree, the same parameter and
buffer names, shapes, dtypes and ``requires_grad``, and the same scalar settings (or settings that follow
the block's index, such as a layer index).  That the blocks also *run* alike (no
behaviour depending on the layer index, such as alternating sliding-window layers) is not assumed
here: the replication checks it on the traced records and falls back to a full trace when it does
not hold.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Iterator

from torch import nn

MIN_BLOCKS = 8  # fewer: a full trace costs little more than the traced head plus six blocks
# traced: the first two, two in the middle (one to copy, the one before to check it against) and the last two.
# The first block may run apart (a pipeline stage's first block takes the activation it receives, a compiled
# region saves its input differently), so the checked block has a middle block before it; in backward an
# engine's block waits for the collective of the block before it (the first block in backward has none), so
# the copied block has two after it.
TRACED_BLOCKS = 6


@dataclass(frozen=True)
class Repeats:
    """A stack of ``count`` identical blocks at ``path`` (``"model.layers"``)."""

    path: str
    count: int

    def block_of(self, name: str) -> tuple[int, str] | None:
        """(block index, the rest of the name) of a module path or parameter name inside the stack:
        ``"model.layers.3.mlp.up_proj.weight"`` -> ``(3, "mlp.up_proj.weight")``; None outside it."""
        prefix = self.path + "." if self.path else ""
        if not name.startswith(prefix):
            return None
        head, _, rest = name[len(prefix):].partition(".")
        return (int(head), rest) if head.isdigit() else None

    def relative_text(self, text: str, block: int) -> str:
        """``text`` with each mention of a block of the stack (``"layers.3"``) written relative to ``block``
        (``"layers.<+1>"``)."""
        return self._mentions().sub(lambda m: f"{m.group(1)}<{int(m.group(2)) - block:+d}>", text)

    def moved_text(self, text: str, block: int, index: int) -> str:
        """``text`` as the block ``index`` has it where block ``block`` has ``text``."""
        return self._mentions().sub(lambda m: f"{m.group(1)}{int(m.group(2)) - block + index}", text)

    def _mentions(self):
        return re.compile(r"(?<![\w.])(" + re.escape(self.path + ".") + r")(\d+)(?![\w])")

    def renamed(self, name: str, index: int) -> str:
        """``name`` moved to block ``index`` (a name inside the stack; others unchanged)."""
        hit = self.block_of(name)
        if hit is None:
            return name
        prefix = self.path + "." if self.path else ""
        return f"{prefix}{index}" + (f".{hit[1]}" if hit[1] else "")


def _signature(block: nn.Module) -> tuple:
    return (type(block),
            tuple((n, type(m)) for n, m in block.named_modules()),
            tuple((n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in block.named_parameters()),
            tuple((n, tuple(b.shape), b.dtype) for n, b in block.named_buffers()))


_SCALARS = (bool, int, float, str)


def _settings(block: nn.Module) -> dict[str, object]:
    """The scalar attributes of a block's modules (``shift_size``, ``is_sliding``, ``layer_idx``)."""
    return {f"{path}.{key}": value for path, mod in block.named_modules() for key, value in vars(mod).items()
            if not key.startswith("_") and type(value) in _SCALARS}


def _settings_alike(kids: list[nn.Module]) -> bool:
    """Whether the blocks' scalar settings are equal, or follow the block's index (a layer index, a
    stochastic-depth rate growing linearly): blocks that alternate settings (Swin's shifted windows, every
    k-th layer sliding) run differently, which the traced check would find only after tracing them."""
    rows = [_settings(k) for k in kids]
    return all(_settings_alike_key([row.get(key) for row in rows]) for key in set().union(*rows))


def _settings_alike_key(values: list) -> bool:
    """Whether one setting's values over the blocks are equal or affine in the block's index."""
    if all(v == values[0] for v in values):
        return True
    if all(type(v) in (int, float) for v in values):
        step = values[1] - values[0]
        return all(abs(v - values[0] - i * step) <= 1e-9 * max(1.0, abs(v)) for i, v in enumerate(values))
    return False


def find_repeats(model: nn.Module, minimum: int = MIN_BLOCKS, alike: bool = True) -> Repeats | None:
    """The stack of identical blocks holding the most parameters, or None.  ``alike=False``: blocks of one class
    whatever their structure (DeepSeek-V3's dense first layers before its MoE layers, alternating sliding-window
    layers), as a pipeline splits a model's layers by name; :func:`block_kinds` tells them apart."""
    best: tuple[int, Repeats] | None = None
    for path, mod in model.named_modules():
        if not path or not isinstance(mod, (nn.ModuleList, nn.Sequential)) or len(mod) < minimum:
            continue  # (the model itself cannot be swapped for a shorter one)
        if list(mod._modules) != [str(i) for i in range(len(mod))]:
            continue
        kids = list(mod._modules.values())
        if len({id(k) for k in kids}) != len(kids) or any(k is None for k in kids):
            continue  # one module called several times (shared weights): nothing to replicate
        if not alike:
            if any(type(k) is not type(kids[0]) for k in kids[1:]):
                continue
        elif any(_signature(k) != _signature(kids[0]) for k in kids[1:]) or not _settings_alike(kids[1:]):
            continue
        size = sum(p.numel() for p in mod.parameters())
        if best is None or size > best[0]:
            best = (size, Repeats(path, len(kids)))
    return best[1] if best is not None else None


def block_kinds(stack: nn.Module) -> list[int]:
    """One number per block of ``stack``, equal for blocks alike (the same structure and the same settings, but
    for settings that follow the index, such as a layer index), in order of first appearance."""
    kids = list(stack._modules.values())
    rows = [_settings(k) for k in kids]
    varying = {key for key in set().union(*rows) if not _settings_alike_key([row.get(key) for row in rows])}
    keys = [(_signature(k), tuple(sorted((key, repr(row.get(key))) for key in varying)))
            for k, row in zip(kids, rows)]
    first: dict[tuple, int] = {}
    return [first.setdefault(key, len(first)) for key in keys]


def shortened(stack: nn.Module, start: int, stop: int) -> nn.Module:
    """A stack (``nn.ModuleList`` or ``nn.Sequential``, or a subclass) of blocks ``start``..``stop`` of ``stack``:
    the same block objects, the same class and attributes (a subclass keeps its own forward)."""
    kids = list(stack._modules.values())[start:stop]
    short = nn.Sequential(*kids) if isinstance(stack, nn.Sequential) else nn.ModuleList(kids)
    short.__class__ = type(stack)
    short.__dict__.update({k: v for k, v in stack.__dict__.items() if k not in short.__dict__})
    return short


@contextlib.contextmanager
def truncated(model: nn.Module, repeats: Repeats, keep: int = TRACED_BLOCKS) -> Iterator[None]:
    """The model with only the first ``keep`` blocks of the stack (the same module objects), put back
    on exit."""
    parent_path, _, attr = repeats.path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    original = parent._modules[attr]
    parent._modules[attr] = shortened(original, 0, keep)
    try:
        yield
    finally:
        parent._modules[attr] = original

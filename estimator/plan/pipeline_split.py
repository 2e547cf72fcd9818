"""Where a model splits into pipeline stages: its stack of blocks (:func:`estimator.capture.blocks.find_repeats`),
the outermost modules before it (an embedding, an encoder, a CNN's earlier stages: stand-ins on later stages) and
after it (the norm and the head, on the last stage), read from the single-device step's trace."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..capture.blocks import Repeats, block_kinds, find_repeats
from ..errors import UserError


@dataclass(frozen=True)
class Split:
    """Where a model splits: its stack of blocks, and the modules with parameters before and after it with
    their output shape and dtype (the first call's)."""

    repeats: Repeats
    before: dict[str, tuple[tuple[int, ...], torch.dtype]]
    after: list[str]
    block_input: tuple[tuple[int, ...], torch.dtype]
    kinds: tuple[int, ...] = ()  # per block, equal for blocks alike (capture.blocks.block_kinds); () all alike

    def kinds_of(self, lo: int, hi: int) -> tuple[int, ...]:
        """The kinds of blocks ``lo``..``hi`` (a stage's): stages of the same kinds run alike."""
        return self.kinds[lo:hi] if self.kinds else (0,) * (hi - lo)


def find_split(model: torch.nn.Module, cap: Any) -> Split:
    """The stack of blocks of ``model`` and the modules before and after it, read from its traced step."""
    repeats, kinds = find_repeats(model, minimum=2), ()
    if repeats is None:  # layers of one class that differ (DeepSeek-V3's dense first layers, sliding windows)
        repeats = find_repeats(model, minimum=2, alike=False)
        if repeats is not None:
            kinds = tuple(block_kinds(model.get_submodule(repeats.path)))
            outputs = {tuple(tuple(o) for o in cap.module_outputs.get(f"{repeats.path}.{i}") or ())
                       for i in range(repeats.count)}
            if len(outputs) != 1:  # a stage receives what the block before it gave: one shape for every block
                repeats = None
    if repeats is None:
        raise UserError("--pp splits a stack of blocks of one class with one output shape (a transformer's layers) "
                        "into stages; this model has none: drop --pp")
    order: dict[str, int] = {}
    for i, node in enumerate(cap.nodes):
        if node.meta.get("phase") != "forward":
            continue
        path = node.meta.get("module", "")
        order.setdefault(path, i)
    inside = [i for p, i in order.items() if p == repeats.path or p.startswith(repeats.path + ".")]
    if not inside:
        raise UserError("--pp: the stack of blocks runs no op in forward; drop --pp")
    start, end = min(inside), max(inside)
    before: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    after: list[str] = []
    # the outermost modules beside the stack (the children of its ancestors): an embedding, an encoder, a
    # head; each a stand-in on the stages it does not run on (a module inside one of them is its own)
    parts = repeats.path.split(".")
    ancestors = [".".join(parts[:i]) for i in range(len(parts))]
    for anc in ancestors:
        for name, module in model.get_submodule(anc).named_children():
            path = f"{anc}.{name}" if anc else name
            if path == repeats.path or path in ancestors or not any(True for _ in module.parameters()):
                continue  # (a module without parameters runs on every stage: rotary tables, dropout)
            first = min((i for p, i in order.items() if p == path or p.startswith(path + ".")), default=None)
            if first is None:
                continue
            if first < start:
                shapes = cap.module_outputs.get(path)
                if not shapes:
                    raise UserError(f"--pp: the output of {path} (before the stack of blocks) was not recorded")
                before[path] = (tuple(shapes[0]), _dtype_of(cap, path))
            elif first > end:
                after.append(path)
    _check_one_input(cap, repeats, before, after)
    block = cap.module_outputs.get(f"{repeats.path}.0")
    if not block:
        raise UserError("--pp: the first block's output was not recorded")
    return Split(repeats, before, after, (tuple(block[0]), _dtype_of(cap, f"{repeats.path}.0")), kinds)


def _check_one_input(cap: Any, repeats: Any, before: dict, after: list[str]) -> None:
    """Refuse a split whose later blocks or modules after the stack read what a module before it made (an
    encoder-decoder's decoder layers read the encoder's output in cross-attention; a decoder after an encoder
    stack reads its own embeddings): a pipeline stage receives only the previous block's output."""
    from ..graph import OpNode

    made_by = {id(n): n.meta.get("module", "") for n in cap.records if n.meta.get("phase") == "forward"}
    heads = tuple(before)

    def later(path: str) -> bool:  # run on a stage that does not run the modules before the stack
        if path.startswith(repeats.path + "."):
            return path[len(repeats.path) + 1:].split(".")[0] != "0"
        return any(path == a or path.startswith(a + ".") for a in after)

    for node in cap.nodes:
        path = node.meta.get("module", "")
        if node.meta.get("phase") != "forward" or not later(path):
            continue
        for arg in pytree.tree_leaves((node.args, node.kwargs)):
            src = made_by.get(id(arg)) if isinstance(arg, OpNode) else None
            hit = next((h for h in heads if src is not None and (src == h or src.startswith(h + "."))), None)
            if hit is not None:
                raise UserError(f"--pp: {path} reads the output of {hit}, which runs before the stack of blocks "
                                f"({repeats.path}; an encoder-decoder's decoder reads its encoder's and its own "
                                f"embeddings): a pipeline stage receives only the block before it; drop --pp")


def _dtype_of(cap: Any, path: str) -> torch.dtype:
    """The dtype of the last forward op of module ``path`` (its output's)."""
    last = None
    for node in cap.nodes:
        if node.meta.get("phase") == "forward" and node.meta.get("module", "") == path:
            last = node
    spec = (last.meta.get("spec") or (None,))[0] if last is not None else None
    return spec.dtype if spec is not None else torch.float32

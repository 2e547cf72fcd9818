"""Caches a model's code keeps across calls at the process's level (``functools.lru_cache`` on its methods:
transformers' ``compile_compatible_method_lru_cache`` on the sine position embeddings and anchors of DETR, RT-DETR,
Mask2Former, BEiT, SAM2 and others), emptied around a capture.

A cached method returns what an earlier call computed: a fake trace's fake tensor stayed in it, the real-tensor
fallback of the same capture got it back (and failed: "the step fails on real CPU tensors too"), and so did the
user's own model after the estimate (RT-DETR raised ``DataDependentOutputException`` on its next real forward).
Emptied before the capture, before a real-tensor trace after a fake one, and after the capture: the user's next
call computes its values again, as a first call does."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch


def _caches_of(value: Any) -> list[Any]:
    """``value`` if it is an ``lru_cache`` wrapper, and those its closure holds (transformers' decorator wraps the
    cached function in one that calls it or, under Dynamo, the plain function)."""
    found = [value] if callable(getattr(value, "cache_clear", None)) else []
    for cell in getattr(value, "__closure__", None) or ():
        try:
            inner = cell.cell_contents
        except ValueError:  # (an empty cell)
            continue
        if callable(getattr(inner, "cache_clear", None)):
            found.append(inner)
    return found


def method_caches(model: torch.nn.Module) -> list[Callable[[], Any]]:
    """The ``cache_clear`` of every cached method (an ``lru_cache`` in a class body, or in the closure of a
    function there) of the classes of ``model``'s modules."""
    seen: set[int] = set()
    out: list[Callable[[], Any]] = []
    for cls in {type(m) for m in model.modules()}:
        for klass in cls.__mro__:
            if klass is torch.nn.Module or klass is object:
                continue
            for value in vars(klass).values():
                for cache in _caches_of(getattr(value, "__func__", value)):
                    if id(cache) not in seen:
                        seen.add(id(cache))
                        out.append(cache.cache_clear)
    return out


def clear_method_caches(model: torch.nn.Module) -> None:
    for clear in method_caches(model):
        clear()


@contextlib.contextmanager
def method_caches_cleared(model: torch.nn.Module) -> Iterator[None]:
    """Inside the block, ``model``'s cached methods start empty; emptied again after it (see the module doc)."""
    clear_method_caches(model)
    try:
        yield
    finally:
        clear_method_caches(model)

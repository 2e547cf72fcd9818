"""Python's cyclic garbage collector during an estimate or a plan: only the objects made during it are scanned.

An estimate makes hundreds of thousands of small objects (the step's records, the allocator's events and
blocks); each time enough of them survive, CPython runs a full collection, which walks every object the
process holds: torch's, transformers', the model's modules.  With transformers loaded one walk takes about
0.1 s, and a 7B Llama's estimate triggered 1-4 of them (0.06-0.43 s of a 1.0-1.4 s estimate, measured with
``gc.callbacks``).  ``gc.freeze()`` moves everything that existed before the call out of the collector's
sight and ``gc.unfreeze()`` puts it back afterwards: nothing of the caller's objects is freed or kept
differently.  A caller that froze objects itself, or disabled the collector, is left as it is.

Automatic collection is also off during the call: a plan keeps each trace it makes (3-4 for a 7B FSDP plan,
hundreds of thousands of objects each), and the full collections those objects trigger walked them all again,
11 times in a 7B plan (1.1 s of its 7.8 s, with 0.3 s of young collections).  The cycles made during the call
are collected after it, by the collector's next automatic run (a 7B FSDP plan holds 51 MiB more at its peak:
463 -> 514 MiB of RSS).  The step itself runs with the collector off anyway (:mod:`.capture.step`: the same
timeline on every run).  A call that makes many traces in turn (a comparison's rows, a pipeline's stages)
settles after each (:func:`settle`): the cycles made so far are collected once and what survives (the traces
it keeps) is put out of sight too, so the next collection walks only what was made after (torchtitan's 405B
pipeline plans, ``benchmarks/plan_torchtitan_405b.py``: 66 -> 57-59 s and 1.36 -> 1.54 GB of RSS; 1.71 GB
without settling).
"""

from __future__ import annotations

import functools
import gc
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


@contextmanager
def young_only() -> Iterator[None]:
    """Inside the block, the collector scans only objects made inside it (see the module doc)."""
    if gc.get_freeze_count() or not gc.isenabled():  # the caller's own policy (or an outer call's): kept
        yield
        return
    gc.freeze()
    gc.disable()
    _owned[0] += 1
    try:
        yield
    finally:
        _owned[0] -= 1
        gc.enable()
        gc.unfreeze()


_owned = [0]  # depth of young_only blocks that froze and paused the collector themselves


def settle() -> None:
    """Inside a :func:`young_only` block that owns the collector: collect the cycles made so far and freeze the
    survivors (see the module doc); elsewhere nothing."""
    if _owned[0]:
        gc.collect()
        gc.freeze()


def young_only_during(fn: F) -> F:
    """``fn`` run inside :func:`young_only`."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with young_only():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]

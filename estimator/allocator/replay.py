"""Replaying a capture's events (``(index, key, ±nbytes)``, in execution order) through an
:class:`~.caching.Allocator`: the counters after each op, their peaks, and where a GPU of a given
capacity runs out of memory (:class:`Trace`, :class:`OOM`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .caching import Allocator
from .stats import OutOfMemoryError, Stats

# -- replaying a capture's events -------------------------------------------------------------


@dataclass(frozen=True)
class OOM:
    """Where a replay ran out of memory: the event's op ``index`` and ``key``, the request
    ``size``, the segment ``alloc_size`` that could not be reserved, and the counters then."""

    index: int
    key: int
    size: int
    alloc_size: int
    allocated: int
    reserved: int
    capacity: int | None


@dataclass
class Trace:
    """The result of a replay.

    ``index[k]`` is an op index of the events (in order, each once); ``allocated[k]`` and
    ``reserved[k]`` are the counters after that op's last event (its allocations and the frees
    recorded after it); ``allocated_max[k]`` the highest ``allocated`` reached during it.
    ``peak_allocated`` is ``max_memory_allocated()`` over the run and ``peak_allocated_index``
    the op where it was reached first; the same for reserved.  ``peak_requested`` is the peak of
    the unrounded live bytes.  ``oom`` is set when a request failed: the replay stops there, and
    the last entry of the lists is that op up to the failed request.  ``start_*`` are the
    counters before the first event; ``stats`` the allocator's counters at the end.
    """

    index: list[int]
    allocated: list[int]
    reserved: list[int]
    allocated_max: list[int]
    peak_allocated: int
    peak_allocated_index: int | None
    peak_reserved: int
    peak_reserved_index: int | None
    peak_requested: int
    start_allocated: int
    start_reserved: int
    oom: OOM | None
    stats: Stats


class Replay:
    """Replays ``(index, key, ±nbytes)`` events through an :class:`Allocator`, keeping the
    key -> block map across runs (so several steps can share one allocator and its cache)."""

    def __init__(self, allocator: Allocator | None = None) -> None:
        self.allocator = allocator if allocator is not None else Allocator()
        self.live: dict[object, tuple[int, int]] = {}  # key -> (address, nbytes)

    def clone(self, capacity: int | None = None) -> "Replay":
        """An independent copy (allocator and live keys) whose allocator has ``capacity``."""
        new = Replay(self.allocator.clone(capacity))
        new.live = dict(self.live)
        return new

    def run(self, events: Iterable[tuple[int, object, int]], *, stream: int = 0,
            skip_live: bool = False) -> Trace:
        """Replay ``events`` in order; peaks are reset first.

        An allocation of a key already live is an error unless ``skip_live`` (then it is
        ignored: the storage exists from the start, as ``estimator.memory`` treats preallocated
        storages); a free of a key that is not live is an error (KeyError), as is a free whose
        size differs from the allocation's (ValueError).  A zero-byte storage takes no block.
        """
        a = self.allocator
        a.reset_peak()
        live = self.live
        malloc, free = a.malloc, a.free
        start_allocated, start_reserved = a._allocated, a._reserved
        index_out: list[int] = []
        alloc_out: list[int] = []
        res_out: list[int] = []
        max_out: list[int] = []
        peak_alloc, peak_alloc_index = start_allocated, None
        peak_res, peak_res_index = start_reserved, None
        cur_index = None
        cur_max = 0
        oom = None
        for index, key, nbytes in events:
            if index != cur_index:
                if cur_index is not None:
                    index_out.append(cur_index)
                    alloc_out.append(a._allocated)
                    res_out.append(a._reserved)
                    max_out.append(cur_max)
                cur_index = index
                cur_max = a._allocated
            if nbytes >= 0:
                if key in live:
                    if skip_live:
                        continue
                    raise ValueError(f"key {key!r} allocated twice (event at op {index})")
                try:
                    ptr = malloc(nbytes, stream)
                except OutOfMemoryError as e:
                    oom = OOM(index, key, nbytes, e.alloc_size, e.allocated, e.reserved, e.capacity)
                    break
                live[key] = (ptr, nbytes)
                allocated = a._allocated
                if allocated > cur_max:
                    cur_max = allocated
                    if allocated > peak_alloc:
                        peak_alloc, peak_alloc_index = allocated, index
                if a._reserved > peak_res:
                    peak_res, peak_res_index = a._reserved, index
            else:
                entry = live.pop(key, None)
                if entry is None:
                    raise KeyError(f"free of key {key!r} that is not live (event at op {index})")
                if entry[1] != -nbytes:
                    live[key] = entry
                    raise ValueError(f"free of key {key!r} with {-nbytes} bytes; it was allocated with {entry[1]}")
                free(entry[0])
        if cur_index is not None:
            index_out.append(cur_index)
            alloc_out.append(a._allocated)
            res_out.append(a._reserved)
            max_out.append(cur_max)
        return Trace(index_out, alloc_out, res_out, max_out, peak_alloc, peak_alloc_index, peak_res,
                     peak_res_index, a._requested_peak, start_allocated, start_reserved, oom, a.stats())


def replay(events: Iterable[tuple[int, object, int]], capacity: int | None = None, *,
           expandable_segments: bool = False, **options) -> Trace:
    """Replay a capture's events on a fresh allocator (see :class:`Replay` and
    :class:`Allocator` for ``options``)."""
    return Replay(Allocator(capacity, expandable_segments, **options)).run(events)

"""A simulator of PyTorch's CUDA caching allocator, in pure Python.

``torch.cuda.memory_allocated()`` is not the sum of the live tensors' bytes: every request goes
through the native caching allocator (``c10/cuda/CUDACachingAllocator.cpp``, class
``DeviceCachingAllocator``), which rounds it, carves it out of cached *segments* (cudaMalloc'd
ranges) and sometimes hands out a cached *block* bigger than asked for.  This module replays a
stream of allocations and frees through a model of those rules and reports what the real
counters would read: allocated bytes (``memory_allocated()``), reserved bytes
(``memory_reserved()``), their peaks, the number of segments, and whether (and where) a GPU
of a given capacity runs out of memory.

What an integrator calls
========================

One-shot, on a capture's event stream (``estimator.capture.Capture.events``: ``(index, key,
+nbytes)`` for an allocation, ``(index, key, -nbytes)`` for a free, in execution order)::

    from estimator.allocator import replay

    trace = replay(cap.events)                         # unlimited memory
    trace.peak_allocated, trace.peak_allocated_index   # max_memory_allocated() and the op index
    trace.peak_reserved                                # max_memory_reserved()
    trace.allocated[k], trace.reserved[k]              # after op trace.index[k] (and the frees after it)

    trace = replay(cap.events, capacity=79 << 30)      # does it fit?
    if trace.oom is not None:
        trace.oom.index, trace.oom.size, trace.oom.reserved   # the op whose request failed

Several steps on one allocator (the cache a first step leaves behind shapes the second; a
capture's events do not free the gradients that ``zero_grad(set_to_none=True)`` drops, so add
those frees at the end of a step)::

    end = len(cap.nodes)
    step = list(cap.events) + [(end, sid, -cap.storage_bytes[sid]) for sid in cap.sids["gradient"]]
    sim = Replay(Allocator(capacity=79 << 30))
    first = sim.run(step)                       # peaks are reset at the start of each run
    steady = sim.run(step, skip_live=True)      # parameters, optimizer state... stay; not re-allocated

Memory the program takes through the allocator outside the captured ops (the cuBLAS/cuBLASLt
workspaces: 32-33 MiB per handle on an H100, inside ``memory_allocated()``) is ordinary events:
add them (at index -1 for example) where they matter.

The allocator alone (``malloc`` returns an address, 0 for a zero-byte request)::

    a = Allocator()
    p = a.malloc(9 << 20)                # a 20 MiB segment; 9 MiB block allocated
    a.free(p)
    a.stats().allocated_bytes, a.stats().reserved_bytes   # 0, 20 MiB (cached)
    a.empty_cache()                                        # reserved back to 0

Rules modelled (default settings of torch 2.11-2.14; names as in the source)
=============================================================================

From ``c10/cuda/CUDACachingAllocator.cpp`` (``DeviceCachingAllocator``) and
``c10/cuda/CUDAAllocatorConfig.{h,cpp}`` (the options):

* **Rounding** (``round_size``): requests below ``kMinBlockSize`` = 512 bytes become 512, others
  round up to a multiple of 512; with ``roundup_power2_divisions`` set for the request's
  power-of-two interval (``CUDAAllocatorConfig::roundup_power2_divisions``: 16 intervals from
  1 MiB, the last open-ended) and ``size > 512 * divisions``, to the next of ``divisions``
  equal steps between two powers of two (``roundup_power2_next_division``).
* **Pools** (``get_pool``): rounded requests up to ``kSmallSize`` = 1 MiB use the small pool,
  larger ones the large pool.  Free blocks are kept per pool ordered by (stream, size, address)
  (``BlockComparatorSize``); only blocks of the request's stream can serve it.
* **Segment sizes** (``get_allocation_size``): a cudaMalloc for the small pool is
  ``kSmallBuffer`` = 2 MiB; for a large request below ``kMinLargeAlloc`` = 10 MiB it is
  ``kLargeBuffer`` = 20 MiB; otherwise the request rounded up to ``kRoundLarge`` = 2 MiB.
* **Best fit** (``get_free_block``): the smallest cached block of the pool and stream that is at
  least the rounded size (lowest address among equals).  With ``max_split_size`` set, a request
  below it never gets a block of at least ``max_split_size``, and a request at or above it only
  gets a block smaller than ``size + max_non_split_rounding_size`` (default ``kLargeBuffer``).
* **Splitting** (``should_split``, ``alloc_found_block``): in the small pool a block is split when
  the remainder is at least 512 bytes; in the large pool only when the request is below
  ``max_split_size`` and the remainder is *more than* ``kSmallSize`` = 1 MiB.  Otherwise the
  block is handed out whole and ``allocated_bytes`` grows by the whole block (a 9 MiB request
  served from a cached 10 MiB block counts 10 MiB).  With expandable segments every pool splits
  at a 512-byte remainder.
* **Coalescing** (``free_block``, ``try_merge_blocks``): a freed block merges with its free
  neighbours in the same segment.
* **Out of memory** (``malloc``, ``alloc_block``, ``release_available_cached_blocks``,
  ``release_cached_blocks``, ``release_blocks``): when no cached block fits, a new segment is
  requested; if it would take reserved memory past ``capacity`` (the ``cudaMalloc`` failure, or
  ``set_per_process_memory_fraction``'s ``allowed_memory_maximum``), then (with
  ``max_split_size`` set) oversize cached blocks are released until enough is freed and the
  cudaMalloc retried; then every cached segment with no allocated block is released
  (``empty_cache``) and it is retried once more (``num_alloc_retries``); then the request fails
  (``num_ooms``, :class:`OutOfMemoryError`).
* **Expandable segments** (``expandable_segments=True``; Note [Expandable Segments],
  ``ExpandableSegment``, ``find_expandable_block``, ``try_allocate_expandable_block``,
  ``map_block``, ``unmap_block``, ``release_expandable_segment``): one virtual range per pool
  and stream (1 1/8 of the device memory), mapped on demand in pages of 2 MiB (small pool) or
  20 MiB (large pool) at the lowest address that fits; ``reserved_bytes`` counts the mapped
  pages; ``empty_cache`` unmaps the whole free pages.  The ``segment`` count does not include
  them (the source counts only cudaMalloc segments there).
* **Statistics** (``DeviceStats``, ``increase_stat``/``decrease_stat``, ``resetPeakStats``):
  ``allocated_bytes`` is the sum of allocated block sizes (``memory_allocated()``),
  ``reserved_bytes`` the sum of segment sizes (``memory_reserved()``), ``requested_bytes`` the
  sum of the unrounded requests; current and peak, in all, ``small_pool`` and ``large_pool``.

Not modelled
============

* More than one stream's *timing*: blocks are kept per stream (the ``stream`` argument), but
  ``record_stream``, the CUDA events that delay the reuse of a block used on another stream
  (``insert_events``/``process_events``) and ``synchronize_and_free_events`` are not: a freed
  block is reusable at once.
* CUDA graphs: private pools (``beginAllocateToPool``, ``PrivatePool``), checkpointed pool state,
  ``MemPool``.
* ``garbage_collection_threshold`` (it only acts under ``set_per_process_memory_fraction``): off.
* Memory outside this allocator (the CUDA context, other processes, cuDNN/cuBLAS memory not taken
  through it, physical fragmentation of the device): ``capacity`` is what this allocator may
  reserve, i.e. the device memory less all that.  cudaMalloc is assumed to succeed exactly while
  ``reserved + segment size <= capacity``.
* Addresses: real cudaMalloc addresses decide which of several equal-size free blocks is taken
  (lowest address first); here each new segment gets an address above all earlier ones, so
  among equal sizes the oldest segment wins.  Totals do not depend on this except through
  which neighbours later coalesce.
* The free-memory callbacks (``trigger_free_memory_callbacks``: CUDA IPC), the
  ``release_lock_on_cudamalloc`` threading option, and switching ``expandable_segments`` on or
  off in the middle of a run.
* One deviation at an edge the settings reject in practice: ``release_available_cached_blocks``
  here only releases whole (unsplit) segments.

Speed: ``bisect`` over sorted integer keys in blocks of at most 2,000 (a small sorted list);
no per-event scan of the cache (only the out-of-memory path and :meth:`Allocator.snapshot` walk
every block).  About 5 microseconds per event: 1e6 events of a synthetic step in ~5 s on one
core.

Why one file of this length: the allocator's block, pool, segment and stream rules are one
state machine (``CUDACachingAllocator.cpp`` is one file for the same reason); split, its
invariants would be spread over modules that only make sense together.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

__all__ = [
    "Allocator",
    "BlockInfo",
    "OutOfMemoryError",
    "OOM",
    "Replay",
    "SegmentInfo",
    "Stats",
    "Trace",
    "replay",
    "round_size",
    "get_allocation_size",
    "kMinBlockSize",
    "kSmallSize",
    "kSmallBuffer",
    "kLargeBuffer",
    "kMinLargeAlloc",
    "kRoundLarge",
]

# -- constants (c10/cuda/CUDACachingAllocator.cpp, top of the file) ---------------------------

kMinBlockSize = 512  # "all sizes are rounded to at least 512 bytes"
kSmallSize = 1048576  # "largest 'small' allocation is 1 MiB"
kSmallBuffer = 2097152  # "'small' allocations are packed in 2 MiB blocks"
kLargeBuffer = 20971520  # "'large' allocations may be packed in 20 MiB blocks"
kMinLargeAlloc = 10485760  # "allocations between 1 and 10 MiB may use kLargeBuffer"
kRoundLarge = 2097152  # "round up large allocations to 2 MiB"

# CUDAAllocatorConfig::roundup_power2_divisions: intervals [2^20, 2^21), ..., the 16th open-ended.
kRoundUpPowerOfTwoIntervals = 16
_ROUNDUP_INTERVAL_START = 20  # log2(1 MiB)

_SHIFT = 64  # free-block sort key: size << _SHIFT | address (addresses stay below 2**64)
_MASK = (1 << _SHIFT) - 1
_BASE_ADDRESS = 1 << 32  # first segment address; 0 stays the null pointer
_DEFAULT_ADDRESS_SPACE = 1 << 40  # expandable segment's virtual range when no capacity is given


# -- rounding ---------------------------------------------------------------------------------


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division``: ``size`` up to the next of ``divisions`` equal steps
    between the powers of two around it (a power of two stays as is)."""
    if size & (size - 1) == 0:
        return size
    power2_floor = 1 << (size.bit_length() - 1)
    power2_division = power2_floor >> (divisions.bit_length() - 1)
    if power2_division == 0:
        return power2_floor << 1
    floor = size & ~(power2_division - 1)
    return size if floor == size else floor + power2_division


def _divisions_for(size: int, divisions: int | Sequence[int]) -> int:
    """``CUDAAllocatorConfig::roundup_power2_divisions(size)``: the setting of ``size``'s interval."""
    if isinstance(divisions, int):
        return divisions
    index = (size.bit_length() - 1) - _ROUNDUP_INTERVAL_START
    index = min(max(index, 0), kRoundUpPowerOfTwoIntervals - 1)
    return divisions[index]


def round_size(size: int, roundup_power2_divisions: int | Sequence[int] = 0) -> int:
    """Bytes a request of ``size`` is rounded to (``DeviceCachingAllocator::round_size``).

    ``roundup_power2_divisions``: 0 (the default: plain 512-byte multiples), one number of
    divisions for every size, or 16 numbers, one per power-of-two interval starting at 1 MiB
    (the last covers everything from 32 GiB), as ``PYTORCH_CUDA_ALLOC_CONF`` sets them.
    """
    if size < kMinBlockSize:
        return kMinBlockSize
    if roundup_power2_divisions:
        divisions = _divisions_for(size, roundup_power2_divisions)
        if divisions > 1 and size > kMinBlockSize * divisions:
            return _roundup_power2_next_division(size, divisions)
    return -(-size // kMinBlockSize) * kMinBlockSize


def get_allocation_size(size: int) -> int:
    """Size of the segment cudaMalloc'd for a rounded request that no cached block serves
    (``DeviceCachingAllocator::get_allocation_size``)."""
    if size <= kSmallSize:
        return kSmallBuffer
    if size < kMinLargeAlloc:
        return kLargeBuffer
    return -(-size // kRoundLarge) * kRoundLarge


# -- a sorted list of ints (bisect over blocks of at most 2 * _LOAD) ---------------------------

_LOAD = 1000


class _SortedInts:
    """Ascending ints with O(log n + _LOAD) insert, remove and ceiling (no dependency on
    ``sortedcontainers``)."""

    __slots__ = ("lists", "maxes")

    def __init__(self) -> None:
        self.lists: list[list[int]] = []
        self.maxes: list[int] = []

    def __bool__(self) -> bool:
        return bool(self.maxes)

    def __len__(self) -> int:
        return sum(len(x) for x in self.lists)

    def add(self, value: int) -> None:
        maxes = self.maxes
        if not maxes:
            self.lists.append([value])
            maxes.append(value)
            return
        i = bisect_left(maxes, value)
        if i == len(maxes):
            i -= 1
            lst = self.lists[i]
            lst.append(value)
            maxes[i] = value
        else:
            lst = self.lists[i]
            insort(lst, value)
        if len(lst) > 2 * _LOAD:
            half = lst[_LOAD:]
            del lst[_LOAD:]
            maxes[i] = lst[-1]
            self.lists.insert(i + 1, half)
            maxes.insert(i + 1, half[-1])

    def remove(self, value: int) -> None:
        maxes = self.maxes
        i = bisect_left(maxes, value)
        lst = self.lists[i]
        j = bisect_left(lst, value)
        if lst[j] != value:  # pragma: no cover - an internal error
            raise KeyError(value)
        del lst[j]
        if not lst:
            del self.lists[i]
            del maxes[i]
        elif j == len(lst):
            maxes[i] = lst[-1]

    def ceiling(self, value: int) -> int | None:
        """The smallest element >= ``value``, or None."""
        maxes = self.maxes
        i = bisect_left(maxes, value)
        if i == len(maxes):
            return None
        lst = self.lists[i]
        return lst[bisect_left(lst, value)]

    def iter_from(self, value: int) -> Iterator[int]:
        """Elements >= ``value`` in ascending order (do not modify the list while iterating)."""
        maxes = self.maxes
        i = bisect_left(maxes, value)
        if i == len(maxes):
            return
        lists = self.lists
        lst = lists[i]
        yield from lst[bisect_left(lst, value):]
        for lst in lists[i + 1:]:
            yield from lst

    def iter_below(self, value: int) -> Iterator[int]:
        """Elements < ``value`` in descending order (a snapshot: safe to modify meanwhile)."""
        out: list[int] = []
        for lst in self.lists:
            if lst[0] >= value:
                break
            out.extend(x for x in lst if x < value)
        return reversed(out)

    def items(self) -> list[int]:
        return [x for lst in self.lists for x in lst]


# -- blocks, pools, segments ------------------------------------------------------------------


class _ExpandableSegment:
    """A virtual address range mapped on demand in pages of ``page`` bytes (``ExpandableSegment``:
    ``segment_size_`` 2 MiB for the small pool, 20 MiB for the large; ``map`` maps the pages that
    cover a range, ``unmap`` the pages wholly inside one)."""

    __slots__ = ("base", "page", "size")

    def __init__(self, base: int, page: int, size: int) -> None:
        self.base = base
        self.page = page
        self.size = size

    def map_range(self, ptr: int, size: int) -> tuple[int, int]:
        """(ptr, size) of the pages covering [ptr, ptr + size): ``ExpandableSegment::map``."""
        page = self.page
        begin = (ptr - self.base) // page
        end = -(-(ptr + size - self.base) // page)
        return self.base + begin * page, (end - begin) * page

    def unmap_range(self, ptr: int, size: int) -> tuple[int, int]:
        """(ptr, size) of the pages wholly inside [ptr, ptr + size): ``ExpandableSegment::unmap``."""
        page = self.page
        begin = -(-(ptr - self.base) // page)
        end = (ptr + size - self.base) // page
        if begin >= end:
            return ptr, 0
        return self.base + begin * page, (end - begin) * page


class _Block:
    """``Block``: a piece of a segment, allocated or free, linked to its neighbours."""

    __slots__ = ("ptr", "size", "requested", "stream", "pool", "allocated", "prev", "next",
                 "expandable", "mapped")

    def __init__(self, ptr: int, size: int, stream: int, pool: "_BlockPool",
                 expandable: _ExpandableSegment | None = None, mapped: bool = True) -> None:
        self.ptr = ptr
        self.size = size
        self.requested = 0
        self.stream = stream
        self.pool = pool
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.expandable = expandable
        self.mapped = mapped

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        state = "allocated" if self.allocated else ("free" if self.mapped else "unmapped")
        return f"<Block {self.ptr:#x} {self.size} {state}>"


class _BlockPool:
    """``BlockPool``: the free (cached) blocks of one pool, per stream, ordered by (size,
    address) (``blocks``), and for expandable segments the unmapped ranges by address
    (``unmapped``); with the pool's own counters (``StatType::SMALL_POOL``/``LARGE_POOL``)."""

    __slots__ = ("is_small", "name", "blocks", "free_by_ptr", "unmapped", "unmapped_by_ptr",
                 "allocated", "allocated_peak", "reserved", "reserved_peak", "segments",
                 "segments_peak", "requested", "requested_peak")

    def __init__(self, is_small: bool) -> None:
        self.is_small = is_small
        self.name = "small_pool" if is_small else "large_pool"
        self.blocks: dict[int, _SortedInts] = {}  # stream -> size << _SHIFT | ptr
        self.free_by_ptr: dict[int, _Block] = {}
        self.unmapped: dict[int, _SortedInts] = {}  # stream -> ptr
        self.unmapped_by_ptr: dict[int, _Block] = {}
        self.allocated = self.allocated_peak = 0
        self.reserved = self.reserved_peak = 0
        self.segments = self.segments_peak = 0
        self.requested = self.requested_peak = 0

    def insert(self, block: _Block) -> None:
        """``insert_into_blocks``."""
        s = self.blocks.get(block.stream)
        if s is None:
            s = self.blocks[block.stream] = _SortedInts()
        s.add(block.size << _SHIFT | block.ptr)
        self.free_by_ptr[block.ptr] = block

    def erase(self, block: _Block) -> None:
        self.blocks[block.stream].remove(block.size << _SHIFT | block.ptr)
        del self.free_by_ptr[block.ptr]

    def insert_unmapped(self, block: _Block) -> None:
        s = self.unmapped.get(block.stream)
        if s is None:
            s = self.unmapped[block.stream] = _SortedInts()
        s.add(block.ptr)
        self.unmapped_by_ptr[block.ptr] = block

    def erase_unmapped(self, block: _Block) -> None:
        self.unmapped[block.stream].remove(block.ptr)
        del self.unmapped_by_ptr[block.ptr]


# -- public records ---------------------------------------------------------------------------


class OutOfMemoryError(MemoryError):
    """The request could not be served even after releasing the cache (``malloc``'s
    ``TORCH_CHECK_WITH(OutOfMemoryError, ...)``).  Attributes: ``size`` (requested bytes),
    ``alloc_size`` (the segment that could not be reserved), ``stream``, ``allocated``,
    ``reserved`` (after the cache was released) and ``capacity``."""

    def __init__(self, size: int, alloc_size: int, stream: int, allocated: int, reserved: int,
                 capacity: int | None) -> None:
        self.size, self.alloc_size, self.stream = size, alloc_size, stream
        self.allocated, self.reserved, self.capacity = allocated, reserved, capacity
        mib = 1 << 20
        cap = "unlimited" if capacity is None else f"{capacity / mib:.2f} MiB"
        super().__init__(
            f"CUDA out of memory (simulated). Tried to allocate {alloc_size / mib:.2f} MiB "
            f"(request {size} B). Capacity {cap}; "
            f"{allocated / mib:.2f} MiB allocated, {(reserved - allocated) / mib:.2f} MiB reserved "
            f"but unallocated.")


@dataclass(frozen=True)
class Stats:
    """The allocator's counters (``DeviceStats``), ``*_peak`` since the last :meth:`Allocator.reset_peak`.

    ``allocated_bytes`` is what ``torch.cuda.memory_allocated()`` reads, ``reserved_bytes``
    ``memory_reserved()``; ``requested_bytes`` the sum of the unrounded requests of the live
    allocations; ``segments`` the cudaMalloc'd segments; ``allocations`` the live blocks.
    ``pools`` has the same counters for ``"small_pool"`` and ``"large_pool"``."""

    allocated_bytes: int
    allocated_bytes_peak: int
    reserved_bytes: int
    reserved_bytes_peak: int
    requested_bytes: int
    requested_bytes_peak: int
    segments: int
    segments_peak: int
    allocations: int
    num_alloc_retries: int
    num_ooms: int
    num_device_alloc: int
    num_device_free: int
    pools: dict[str, dict[str, int]] = field(default_factory=dict)

    def as_memory_stats(self) -> dict[str, int]:
        """The same numbers under ``torch.cuda.memory_stats()``'s keys (the subset modelled)."""
        out = {
            "allocated_bytes.all.current": self.allocated_bytes,
            "allocated_bytes.all.peak": self.allocated_bytes_peak,
            "reserved_bytes.all.current": self.reserved_bytes,
            "reserved_bytes.all.peak": self.reserved_bytes_peak,
            "requested_bytes.all.current": self.requested_bytes,
            "requested_bytes.all.peak": self.requested_bytes_peak,
            "segment.all.current": self.segments,
            "segment.all.peak": self.segments_peak,
            "allocation.all.current": self.allocations,
            "num_alloc_retries": self.num_alloc_retries,
            "num_ooms": self.num_ooms,
            "num_device_alloc": self.num_device_alloc,
            "num_device_free": self.num_device_free,
        }
        for pool, counters in self.pools.items():
            for name, value in counters.items():
                stat, _, kind = name.rpartition("_")
                out[f"{stat}.{pool}.{kind}"] = value
        return out


@dataclass(frozen=True)
class BlockInfo:
    """One block of a segment in :meth:`Allocator.snapshot`."""

    address: int
    size: int
    allocated: bool
    requested_size: int


@dataclass(frozen=True)
class SegmentInfo:
    """One segment (for expandable segments: one contiguous mapped range) in
    :meth:`Allocator.snapshot`, as ``torch.cuda.memory_snapshot()`` lists them."""

    address: int
    total_size: int
    allocated_size: int
    pool: str  # "small_pool" or "large_pool"
    stream: int
    expandable: bool
    blocks: tuple[BlockInfo, ...]


# -- the allocator ----------------------------------------------------------------------------


class Allocator:
    """One device's caching allocator (``DeviceCachingAllocator``).

    ``capacity``: bytes this allocator may reserve (None: unlimited).  Options, as in
    ``PYTORCH_CUDA_ALLOC_CONF`` (``CUDAAllocatorConfig``): ``expandable_segments`` (default
    off), ``max_split_size`` in bytes (None: unlimited, the default; must exceed 20 MiB as the
    config parser requires), ``max_non_split_rounding_size`` (default ``kLargeBuffer``),
    ``roundup_power2_divisions`` (0, an int, or 16 per-interval values; see :func:`round_size`).

    ``malloc(size, stream=0)`` returns the block's address (0 for ``size == 0``, as
    ``allocate(0)`` returns a null pointer); ``free(address)`` returns it to the cache.
    """

    def __init__(self, capacity: int | None = None, expandable_segments: bool = False, *,
                 max_split_size: int | None = None, max_non_split_rounding_size: int = kLargeBuffer,
                 roundup_power2_divisions: int | Sequence[int] = 0) -> None:
        if capacity is not None and capacity < 0:
            raise ValueError(f"negative capacity {capacity}")
        if max_split_size is not None and max_split_size <= kLargeBuffer:
            raise ValueError("max_split_size must exceed 20 MiB (CUDAAllocatorConfig: max_split_size_mb > 20)")
        if not isinstance(roundup_power2_divisions, int):
            roundup_power2_divisions = tuple(roundup_power2_divisions)
            if len(roundup_power2_divisions) != kRoundUpPowerOfTwoIntervals:
                raise ValueError(f"roundup_power2_divisions: one int or {kRoundUpPowerOfTwoIntervals} ints")
        for d in ([roundup_power2_divisions] if isinstance(roundup_power2_divisions, int)
                  else roundup_power2_divisions):
            if d < 0 or (d and d & (d - 1)):
                raise ValueError("roundup_power2_divisions must be 0 or powers of 2")
        self.capacity = capacity
        self.expandable_segments = bool(expandable_segments)
        self.max_split_size = max_split_size if max_split_size is not None else (1 << 64) - 1  # SIZE_MAX
        self.max_non_split_rounding_size = max_non_split_rounding_size
        self.roundup_power2_divisions = roundup_power2_divisions
        self._small = _BlockPool(is_small=True)
        self._large = _BlockPool(is_small=False)
        self._active: dict[int, _Block] = {}  # address -> allocated block (allocated_blocks)
        self._next_address = _BASE_ADDRESS
        self._expandable: list[_ExpandableSegment] = []
        # DeviceStats (aggregate)
        self._allocated = self._allocated_peak = 0
        self._reserved = self._reserved_peak = 0
        self._requested = self._requested_peak = 0
        self._segments = self._segments_peak = 0
        self.num_alloc_retries = self.num_ooms = 0
        self.num_device_alloc = self.num_device_free = 0

    # -- public API ------------------------------------------------------------------------

    @property
    def allocated(self) -> int:
        """``memory_allocated()``: the sum of the allocated blocks' sizes."""
        return self._allocated

    @property
    def reserved(self) -> int:
        """``memory_reserved()``: the sum of the segments' (mapped) sizes."""
        return self._reserved

    def malloc(self, size: int, stream: int = 0) -> int:
        """Allocate ``size`` bytes on ``stream``; the block's address
        (``DeviceCachingAllocator::malloc``).  Raises :class:`OutOfMemoryError`."""
        if size <= 0:
            if size < 0:
                raise ValueError(f"negative allocation size {size}")
            return 0
        rounded = (round_size(size, self.roundup_power2_divisions) if self.roundup_power2_divisions
                   else (kMinBlockSize if size < kMinBlockSize else -(-size // kMinBlockSize) * kMinBlockSize))
        pool = self._small if rounded <= kSmallSize else self._large
        block = self._get_free_block(pool, stream, rounded)
        if block is None:
            alloc_size = get_allocation_size(rounded)
            block = (self._alloc_block(pool, stream, rounded, alloc_size, False)
                     or (self._release_available_cached_blocks(pool, stream, rounded)
                         and self._alloc_block(pool, stream, rounded, alloc_size, False))
                     or (self._release_cached_blocks()
                         and self._alloc_block(pool, stream, rounded, alloc_size, True)))
            if not block:
                self.num_ooms += 1
                raise OutOfMemoryError(size, alloc_size, stream, self._allocated, self._reserved, self.capacity)
        return self._alloc_found_block(block, rounded, size)

    def free(self, ptr: int) -> None:
        """Return an allocated block to the cache (``DeviceCachingAllocator::free``,
        ``free_block``: merged with its free neighbours).  ``free(0)`` does nothing."""
        if not ptr:
            return
        block = self._active.pop(ptr, None)
        if block is None:
            raise ValueError(f"invalid device pointer: {ptr:#x}")
        block.allocated = False
        size = block.size
        pool = block.pool
        self._allocated -= size
        self._requested -= block.requested
        pool.allocated -= size
        pool.requested -= block.requested
        prev, nxt = block.prev, block.next
        if prev is not None and not prev.allocated and prev.mapped == block.mapped:
            self._merge(block, prev)
        if nxt is not None and not nxt.allocated and nxt.mapped == block.mapped:
            self._merge(block, nxt)
        pool.insert(block)

    def reset_peak(self) -> None:
        """``resetPeakStats``: every peak becomes the current value."""
        self._allocated_peak = self._allocated
        self._reserved_peak = self._reserved
        self._requested_peak = self._requested
        self._segments_peak = self._segments
        for pool in (self._small, self._large):
            pool.allocated_peak = pool.allocated
            pool.reserved_peak = pool.reserved
            pool.requested_peak = pool.requested
            pool.segments_peak = pool.segments

    def empty_cache(self) -> None:
        """``emptyCache`` -> ``release_cached_blocks``: release every segment with no
        allocated block (expandable segments: unmap their free pages)."""
        self._release_cached_blocks()

    def stats(self) -> Stats:
        """A copy of the counters."""
        pools = {p.name: {"allocated_bytes_current": p.allocated, "allocated_bytes_peak": p.allocated_peak,
                          "reserved_bytes_current": p.reserved, "reserved_bytes_peak": p.reserved_peak,
                          "requested_bytes_current": p.requested, "requested_bytes_peak": p.requested_peak,
                          "segment_current": p.segments, "segment_peak": p.segments_peak}
                 for p in (self._small, self._large)}
        return Stats(
            allocated_bytes=self._allocated, allocated_bytes_peak=self._allocated_peak,
            reserved_bytes=self._reserved, reserved_bytes_peak=self._reserved_peak,
            requested_bytes=self._requested, requested_bytes_peak=self._requested_peak,
            segments=self._segments, segments_peak=self._segments_peak, allocations=len(self._active),
            num_alloc_retries=self.num_alloc_retries, num_ooms=self.num_ooms,
            num_device_alloc=self.num_device_alloc, num_device_free=self.num_device_free, pools=pools)

    def block_size(self, ptr: int) -> int:
        """Size of the allocated block at ``ptr`` (what ``allocated_bytes`` counts for it)."""
        return self._active[ptr].size if ptr else 0

    def snapshot(self) -> list[SegmentInfo]:
        """Every segment and its blocks in address order (``snapshot``); O(blocks)."""
        blocks: list[_Block] = list(self._active.values())
        for pool in (self._small, self._large):
            blocks.extend(pool.free_by_ptr.values())
        out = []
        for head in blocks:
            if head.prev is not None and head.prev.mapped:
                continue
            infos, b = [], head
            while b is not None and b.mapped:
                infos.append(BlockInfo(b.ptr, b.size, b.allocated, b.requested if b.allocated else 0))
                b = b.next
            out.append(SegmentInfo(head.ptr, sum(i.size for i in infos), sum(i.size for i in infos if i.allocated),
                                   head.pool.name, head.stream, head.expandable is not None, tuple(infos)))
        out.sort(key=lambda s: s.address)
        return out

    # -- internals, named after the source -------------------------------------------------

    def _get_free_block(self, pool: _BlockPool, stream: int, size: int) -> _Block | None:
        """``get_free_block``: best fit in the pool and stream, with the ``max_split_size`` limits."""
        s = pool.blocks.get(stream)
        if not s:
            return None
        key = s.ceiling(size << _SHIFT)
        if key is None:
            return None
        block = pool.free_by_ptr[key & _MASK]
        if block.expandable is not None:
            # "for the purposes of best fit we consider its size to be the size it can expand to"
            def expandable_size(b: _Block) -> int:
                return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)
            it = s.iter_from(key)
            next(it)
            for k in it:
                if block.expandable is None:
                    break
                candidate = pool.free_by_ptr[k & _MASK]
                if expandable_size(candidate) < expandable_size(block):
                    block = candidate
                else:
                    break
        mss = self.max_split_size
        if size < mss and block.size >= mss:
            return None  # "Do not return an oversized block for a large request"
        if size >= mss and block.size >= size + self.max_non_split_rounding_size:
            return None  # "Allow oversized block size to be rounded up but within a limit"
        pool.erase(block)
        return block

    def _should_split(self, block: _Block, size: int) -> bool:
        """``should_split``."""
        remaining = block.size - size
        if block.pool.is_small or self.expandable_segments:
            return remaining >= kMinBlockSize
        return size < self.max_split_size and remaining > kSmallSize

    def _alloc_found_block(self, block: _Block, size: int, orig_size: int) -> int:
        """``alloc_found_block``: split off the remainder if ``should_split``, mark allocated."""
        pool = block.pool
        if self._should_split(block, size):
            remaining = block
            block = _Block(remaining.ptr, size, remaining.stream, pool, remaining.expandable)
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.ptr += size
            remaining.size -= size
            pool.insert(remaining)
        block.allocated = True
        block.requested = orig_size
        self._active[block.ptr] = block
        bsize = block.size
        self._allocated += bsize
        if self._allocated > self._allocated_peak:
            self._allocated_peak = self._allocated
        self._requested += orig_size
        if self._requested > self._requested_peak:
            self._requested_peak = self._requested
        pool.allocated += bsize
        if pool.allocated > pool.allocated_peak:
            pool.allocated_peak = pool.allocated
        pool.requested += orig_size
        if pool.requested > pool.requested_peak:
            pool.requested_peak = pool.requested
        return block.ptr

    def _merge(self, dst: _Block, src: _Block) -> None:
        """``try_merge_blocks`` (the caller checked that ``src`` is free and equally mapped):
        ``dst`` absorbs its neighbour ``src``."""
        pool = dst.pool
        if src.mapped:
            pool.erase(src)
        else:
            pool.erase_unmapped(src)
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    def _grow_reserved(self, pool: _BlockPool, nbytes: int, segment: bool) -> None:
        self._reserved += nbytes
        if self._reserved > self._reserved_peak:
            self._reserved_peak = self._reserved
        pool.reserved += nbytes
        if pool.reserved > pool.reserved_peak:
            pool.reserved_peak = pool.reserved
        if segment:
            self._segments += 1
            if self._segments > self._segments_peak:
                self._segments_peak = self._segments
            pool.segments += 1
            if pool.segments > pool.segments_peak:
                pool.segments_peak = pool.segments
        self.num_device_alloc += 1

    def _shrink_reserved(self, pool: _BlockPool, nbytes: int, segment: bool) -> None:
        self._reserved -= nbytes
        pool.reserved -= nbytes
        if segment:
            self._segments -= 1
            pool.segments -= 1
        self.num_device_free += 1

    def _fits(self, nbytes: int) -> bool:
        return self.capacity is None or self._reserved + nbytes <= self.capacity

    def _alloc_block(self, pool: _BlockPool, stream: int, size: int, alloc_size: int,
                     is_retry: bool) -> _Block | None:
        """``alloc_block``: a new segment of ``alloc_size`` (cudaMalloc), or with expandable
        segments more pages mapped (``try_allocate_expandable_block``); None if it does not fit."""
        if is_retry:
            self.num_alloc_retries += 1
        if self.expandable_segments:
            return self._try_allocate_expandable_block(pool, stream, size)
        if not self._fits(alloc_size):
            return None
        block = _Block(self._next_address, alloc_size, stream, pool)
        self._next_address += -(-alloc_size // kRoundLarge) * kRoundLarge
        self._grow_reserved(pool, alloc_size, segment=True)
        return block

    def _release_block(self, block: _Block) -> None:
        """``release_block``: cudaFree a whole free segment."""
        pool = block.pool
        pool.erase(block)
        self._shrink_reserved(pool, block.size, segment=True)

    def _release_available_cached_blocks(self, pool: _BlockPool, stream: int, size: int) -> bool:
        """``release_available_cached_blocks``: with ``max_split_size`` set, release the smallest
        oversize cached block that covers the request, else oversize blocks from the largest
        down until enough is released."""
        mss = self.max_split_size
        if mss == (1 << 64) - 1:
            return False
        s = pool.blocks.get(stream)
        if not s:
            return False
        target = max(size, mss)
        key = s.ceiling(target << _SHIFT)
        if key is not None:
            block = pool.free_by_ptr[key & _MASK]
            if block.expandable is None and not block.is_split():
                self._release_block(block)
                return True
            return False
        released = 0
        for k in s.iter_below(target << _SHIFT):
            block = pool.free_by_ptr[k & _MASK]
            if released >= target or block.size < mss:
                break
            if block.expandable is None and not block.is_split():
                released += block.size
                self._release_block(block)
        return released >= target

    def _release_cached_blocks(self) -> bool:
        """``release_cached_blocks`` -> ``release_blocks`` (large pool, then small): release
        every whole free segment; unmap the free pages of expandable segments and drop an
        expandable segment left with nothing mapped."""
        for pool in (self._large, self._small):
            to_unmap = []
            for block in list(pool.free_by_ptr.values()):
                if block.expandable is not None:
                    to_unmap.append(block)
                elif block.prev is None and block.next is None:
                    self._release_block(block)
            for block in to_unmap:
                self._unmap_block(block)
                if block.prev is None and block.next is None and not block.mapped:
                    pool.erase_unmapped(block)
                    self._expandable.remove(block.expandable)
        return True

    # -- expandable segments -----------------------------------------------------------------

    def _find_expandable_block(self, pool: _BlockPool, stream: int, size: int) -> _Block:
        """``find_expandable_block``: the lowest-address run of free and unmapped blocks with
        room for ``size``, or a new segment's whole unmapped range."""
        def allocatable(b: _Block | None) -> bool:
            return b is not None and not b.allocated

        s = pool.unmapped.get(stream)
        if s:
            for ptr in s.iter_from(0):
                c = pool.unmapped_by_ptr[ptr]
                if allocatable(c.prev):
                    c = c.prev
                b, nbytes = c, 0
                while nbytes < size and allocatable(b):
                    nbytes += b.size
                    b = b.next
                if nbytes >= size:
                    return c
        page = kSmallBuffer if pool.is_small else kLargeBuffer
        total = self.capacity if self.capacity is not None else _DEFAULT_ADDRESS_SPACE
        space = -(-(total + total // 8) // page) * page
        es = _ExpandableSegment(self._next_address, page, space)
        self._next_address += space
        self._expandable.append(es)
        candidate = _Block(es.base, space, stream, pool, es, mapped=False)
        pool.insert_unmapped(candidate)
        return candidate

    def _map_block(self, to_map: _Block, size: int) -> bool:
        """``map_block``: map the pages covering the first ``size`` bytes of an unmapped block,
        merge them with free mapped neighbours; False if they do not fit in ``capacity``."""
        pool = to_map.pool
        ptr, mapped = to_map.expandable.map_range(to_map.ptr, size)
        if mapped == 0 or not self._fits(mapped):
            return False
        pool.erase_unmapped(to_map)
        to_map.mapped = True
        if mapped < to_map.size:
            remaining = _Block(to_map.ptr + mapped, to_map.size - mapped, to_map.stream, pool,
                               to_map.expandable, mapped=False)
            remaining.prev, remaining.next = to_map, to_map.next
            if to_map.next is not None:
                to_map.next.prev = remaining
            to_map.next = remaining
            pool.insert_unmapped(remaining)
            to_map.size = mapped
        for neighbour in (to_map.prev, to_map.next):
            if neighbour is not None and not neighbour.allocated and neighbour.mapped:
                self._merge(to_map, neighbour)
        pool.insert(to_map)
        self._grow_reserved(pool, mapped, segment=False)
        return True

    def _try_allocate_expandable_block(self, pool: _BlockPool, stream: int, size: int) -> _Block | None:
        """``try_allocate_expandable_block``."""
        candidate = self._find_expandable_block(pool, stream, size)
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            new_candidate = candidate.next
            if not self._map_block(new_candidate, min(size - candidate.size, new_candidate.size)):
                return None
            candidate = new_candidate
        pool.erase(candidate)
        return candidate

    def _unmap_block(self, block: _Block) -> None:
        """``unmap_block``: unmap the whole pages inside a free block of an expandable segment;
        the partial pages before and after stay as free mapped blocks."""
        ptr, nbytes = block.expandable.unmap_range(block.ptr, block.size)
        if nbytes == 0:
            return
        pool = block.pool
        pool.erase(block)
        before = ptr - block.ptr
        if before > 0:
            b = _Block(block.ptr, before, block.stream, pool, block.expandable)
            b.prev, b.next = block.prev, block
            if block.prev is not None:
                block.prev.next = b
            block.prev = b
            pool.insert(b)
        after = block.size - before - nbytes
        if after > 0:
            a = _Block(ptr + nbytes, after, block.stream, pool, block.expandable)
            a.prev, a.next = block, block.next
            if block.next is not None:
                block.next.prev = a
            block.next = a
            pool.insert(a)
        block.ptr, block.size, block.mapped = ptr, nbytes, False
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated and not neighbour.mapped:
                self._merge(block, neighbour)
        pool.insert_unmapped(block)
        self._shrink_reserved(pool, nbytes, segment=False)


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

"""One device's caching allocator (``DeviceCachingAllocator``): the state machine of
``c10/cuda/CUDACachingAllocator.cpp`` and ``c10/cuda/CUDAAllocatorConfig.{h,cpp}`` (default
settings of torch 2.11-2.14; method names as in the source).

* **Pools** (``get_pool``): rounded requests up to ``kSmallSize`` = 1 MiB use the small pool,
  larger ones the large pool.  Free blocks are kept per pool ordered by (stream, size, address)
  (``BlockComparatorSize``); only blocks of the request's stream can serve it.
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
  (``num_ooms``, :class:`~.stats.OutOfMemoryError`).
* **Expandable segments** (``expandable_segments=True``; Note [Expandable Segments],
  ``ExpandableSegment``, ``find_expandable_block``, ``try_allocate_expandable_block``,
  ``map_block``, ``unmap_block``, ``release_expandable_segment``): one virtual range per pool
  and stream (1 1/8 of the device memory), mapped on demand in pages of 2 MiB (small pool) or
  20 MiB (large pool) at the lowest address that fits; ``reserved_bytes`` counts the mapped
  pages; ``empty_cache`` unmaps the whole free pages.  The ``segment`` count does not include
  them (the source counts only cudaMalloc segments there).

The block, pool, segment and stream rules are one state machine (``CUDACachingAllocator.cpp`` is
one class for the same reason), so they stay in one class here; its data structures are in
:mod:`.blocks`, its sizes in :mod:`.sizes`.
"""

from __future__ import annotations

import copy
from typing import Sequence

from .blocks import BASE_ADDRESS, DEFAULT_ADDRESS_SPACE, KEY_MASK, KEY_SHIFT, Block, BlockPool, ExpandableSegment
from .sizes import (
    get_allocation_size, kLargeBuffer, kMinBlockSize, kRoundLarge, kRoundUpPowerOfTwoIntervals, kSmallBuffer,
    kSmallSize, round_size,
)
from .stats import BlockInfo, OutOfMemoryError, SegmentInfo, Stats

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
        self._small = BlockPool(is_small=True)
        self._large = BlockPool(is_small=False)
        self._active: dict[int, Block] = {}  # address -> allocated block (allocated_blocks)
        self._next_address = BASE_ADDRESS
        self._expandable: list[ExpandableSegment] = []
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

    def clone(self, capacity: int | None = None) -> "Allocator":
        """An independent copy of this allocator's state (blocks, pools, counters), with ``capacity``: the
        state a run at that capacity has where it has not yet differed from this one."""
        new = copy.copy(self)
        new.capacity = capacity
        pools = {id(p): p.clone() for p in (self._small, self._large)}
        new._small, new._large = pools[id(self._small)], pools[id(self._large)]
        segments = {id(es): ExpandableSegment(es.base, es.page, es.size) for es in self._expandable}
        new._expandable = [segments[id(es)] for es in self._expandable]
        old = [*self._active.values()]
        for p in (self._small, self._large):
            old += [*p.free_by_ptr.values(), *p.unmapped_by_ptr.values()]
        blocks = {}
        for b in old:
            c = blocks[id(b)] = Block(b.ptr, b.size, b.stream, pools[id(b.pool)],
                                      segments[id(b.expandable)] if b.expandable is not None else None, b.mapped)
            c.requested, c.allocated = b.requested, b.allocated
        for b in old:
            c = blocks[id(b)]
            c.prev = blocks[id(b.prev)] if b.prev is not None else None
            c.next = blocks[id(b.next)] if b.next is not None else None
        new._active = {ptr: blocks[id(b)] for ptr, b in self._active.items()}
        for p in (self._small, self._large):
            q = pools[id(p)]
            q.free_by_ptr = {ptr: blocks[id(b)] for ptr, b in p.free_by_ptr.items()}
            q.unmapped_by_ptr = {ptr: blocks[id(b)] for ptr, b in p.unmapped_by_ptr.items()}
        return new

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
        blocks: list[Block] = list(self._active.values())
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

    def _get_free_block(self, pool: BlockPool, stream: int, size: int) -> Block | None:
        """``get_free_block``: best fit in the pool and stream, with the ``max_split_size`` limits."""
        s = pool.blocks.get(stream)
        if not s:
            return None
        key = s.ceiling(size << KEY_SHIFT)
        if key is None:
            return None
        block = pool.free_by_ptr[key & KEY_MASK]
        if block.expandable is not None:
            # "for the purposes of best fit we consider its size to be the size it can expand to"
            def expandable_size(b: Block) -> int:
                return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)
            it = s.iter_from(key)
            next(it)
            for k in it:
                if block.expandable is None:
                    break
                candidate = pool.free_by_ptr[k & KEY_MASK]
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

    def _should_split(self, block: Block, size: int) -> bool:
        """``should_split``."""
        remaining = block.size - size
        if block.pool.is_small or self.expandable_segments:
            return remaining >= kMinBlockSize
        return size < self.max_split_size and remaining > kSmallSize

    def _alloc_found_block(self, block: Block, size: int, orig_size: int) -> int:
        """``alloc_found_block``: split off the remainder if ``should_split``, mark allocated."""
        pool = block.pool
        if self._should_split(block, size):
            remaining = block
            block = Block(remaining.ptr, size, remaining.stream, pool, remaining.expandable)
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

    def _merge(self, dst: Block, src: Block) -> None:
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

    def _grow_reserved(self, pool: BlockPool, nbytes: int, segment: bool) -> None:
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

    def _shrink_reserved(self, pool: BlockPool, nbytes: int, segment: bool) -> None:
        self._reserved -= nbytes
        pool.reserved -= nbytes
        if segment:
            self._segments -= 1
            pool.segments -= 1
        self.num_device_free += 1

    def _fits(self, nbytes: int) -> bool:
        return self.capacity is None or self._reserved + nbytes <= self.capacity

    def _alloc_block(self, pool: BlockPool, stream: int, size: int, alloc_size: int,
                     is_retry: bool) -> Block | None:
        """``alloc_block``: a new segment of ``alloc_size`` (cudaMalloc), or with expandable
        segments more pages mapped (``try_allocate_expandable_block``); None if it does not fit."""
        if is_retry:
            self.num_alloc_retries += 1
        if self.expandable_segments:
            return self._try_allocate_expandable_block(pool, stream, size)
        if not self._fits(alloc_size):
            return None
        block = Block(self._next_address, alloc_size, stream, pool)
        self._next_address += -(-alloc_size // kRoundLarge) * kRoundLarge
        self._grow_reserved(pool, alloc_size, segment=True)
        return block

    def _release_block(self, block: Block) -> None:
        """``release_block``: cudaFree a whole free segment."""
        pool = block.pool
        pool.erase(block)
        self._shrink_reserved(pool, block.size, segment=True)

    def _release_available_cached_blocks(self, pool: BlockPool, stream: int, size: int) -> bool:
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
        key = s.ceiling(target << KEY_SHIFT)
        if key is not None:
            block = pool.free_by_ptr[key & KEY_MASK]
            if block.expandable is None and not block.is_split():
                self._release_block(block)
                return True
            return False
        released = 0
        for k in s.iter_below(target << KEY_SHIFT):
            block = pool.free_by_ptr[k & KEY_MASK]
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

    def _find_expandable_block(self, pool: BlockPool, stream: int, size: int) -> Block:
        """``find_expandable_block``: the lowest-address run of free and unmapped blocks with
        room for ``size``, or a new segment's whole unmapped range."""
        def allocatable(b: Block | None) -> bool:
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
        total = self.capacity if self.capacity is not None else DEFAULT_ADDRESS_SPACE
        space = -(-(total + total // 8) // page) * page
        es = ExpandableSegment(self._next_address, page, space)
        self._next_address += space
        self._expandable.append(es)
        candidate = Block(es.base, space, stream, pool, es, mapped=False)
        pool.insert_unmapped(candidate)
        return candidate

    def _map_block(self, to_map: Block, size: int) -> bool:
        """``map_block``: map the pages covering the first ``size`` bytes of an unmapped block,
        merge them with free mapped neighbours; False if they do not fit in ``capacity``."""
        pool = to_map.pool
        ptr, mapped = to_map.expandable.map_range(to_map.ptr, size)
        if mapped == 0 or not self._fits(mapped):
            return False
        pool.erase_unmapped(to_map)
        to_map.mapped = True
        if mapped < to_map.size:
            remaining = Block(to_map.ptr + mapped, to_map.size - mapped, to_map.stream, pool,
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

    def _try_allocate_expandable_block(self, pool: BlockPool, stream: int, size: int) -> Block | None:
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

    def _unmap_block(self, block: Block) -> None:
        """``unmap_block``: unmap the whole pages inside a free block of an expandable segment;
        the partial pages before and after stay as free mapped blocks."""
        ptr, nbytes = block.expandable.unmap_range(block.ptr, block.size)
        if nbytes == 0:
            return
        pool = block.pool
        pool.erase(block)
        before = ptr - block.ptr
        if before > 0:
            b = Block(block.ptr, before, block.stream, pool, block.expandable)
            b.prev, b.next = block.prev, block
            if block.prev is not None:
                block.prev.next = b
            block.prev = b
            pool.insert(b)
        after = block.size - before - nbytes
        if after > 0:
            a = Block(ptr + nbytes, after, block.stream, pool, block.expandable)
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

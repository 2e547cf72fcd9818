"""The CUDA caching-allocator model (``estimator.allocator``): one test per rule, property tests
on seeded random streams (with a brute-force model of the same rules as an oracle), and the
rules against allocations measured on an H100 (``tests/data/allocator/``).

Every expected number follows from a documented rule of ``c10/cuda/CUDACachingAllocator.cpp``;
the arithmetic is in the comments.
"""

from __future__ import annotations

import difflib
import functools
import gc
import gzip
import json
import os
import random

import pytest

from estimator.allocator import (
    Allocator,
    OutOfMemoryError,
    Replay,
    get_allocation_size,
    kLargeBuffer,
    kMinBlockSize,
    kSmallBuffer,
    kSmallSize,
    replay,
    round_size,
)

KiB = 1 << 10
MiB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data", "allocator")


def layout(a: Allocator) -> list[list[tuple[int, bool]]]:
    """Each segment's blocks as (size, allocated), in address order."""
    return [[(b.size, b.allocated) for b in s.blocks] for s in a.snapshot()]


def r512(n: int) -> int:
    return max(kMinBlockSize, -(-n // kMinBlockSize) * kMinBlockSize)


# -- rounding and segment sizes ----------------------------------------------------------------


def test_round_size():
    assert round_size(1) == 512  # below kMinBlockSize -> 512
    assert round_size(512) == 512
    assert round_size(513) == 1024  # up to a multiple of 512
    assert round_size(1_179_648) == 1_179_648  # already a multiple (2304 * 512)
    # roundup_power2_divisions:4: 1200 <= 512 * 4, so still a 512-multiple
    assert round_size(1200, 4) == 1536
    # 2049 > 2048: four steps of 512 between 2048 and 4096 -> 2560
    assert round_size(2049, 4) == 2560
    # 1.2 MiB with 4 divisions: steps of 256 KiB above 1 MiB -> 1.25 MiB
    assert round_size(int(1.2 * MiB), 4) == 1280 * KiB
    assert round_size(4 * MiB, 4) == 4 * MiB  # powers of two stay
    # per interval (16 values from [1 MiB, 2 MiB)): only [2 MiB, 4 MiB) has 2 divisions
    per = [0] * 16
    per[1] = 2
    assert round_size(int(1.2 * MiB), per) == r512(int(1.2 * MiB))
    assert round_size(int(2.2 * MiB), per) == 3 * MiB  # 2 steps between 2 and 4 MiB
    with pytest.raises(ValueError):
        Allocator(roundup_power2_divisions=3)  # must be a power of two


def test_allocation_size():
    assert get_allocation_size(512) == kSmallBuffer  # small pool: 2 MiB segments
    assert get_allocation_size(kSmallSize) == kSmallBuffer  # 1 MiB is still small
    assert get_allocation_size(kSmallSize + 512) == kLargeBuffer  # (1 MiB, 10 MiB): 20 MiB
    assert get_allocation_size(10 * MiB - 512) == kLargeBuffer
    assert get_allocation_size(10 * MiB) == 10 * MiB  # >= kMinLargeAlloc: rounded to 2 MiB
    assert get_allocation_size(11 * MiB + 1) == 12 * MiB


def test_malloc_rounds_and_counts_requested():
    a = Allocator()
    a.malloc(1000)
    s = a.stats()
    assert s.allocated_bytes == 1024 and s.requested_bytes == 1000  # rounded block, raw request
    assert s.reserved_bytes == kSmallBuffer and s.segments == 1
    assert a.malloc(0) == 0 and a.stats().allocations == 1  # a zero-byte request takes no block
    a.free(0)  # freeing the null pointer does nothing


# -- large pool: 20 MiB segments, split rule, whole blocks ------------------------------------


def test_9mib_carves_a_20mib_segment_and_the_rest_is_reused():
    a = Allocator()
    p = a.malloc(9 * MiB)  # 9 MiB < kMinLargeAlloc -> a kLargeBuffer (20 MiB) segment, split
    assert (a.allocated, a.reserved, a.stats().segments) == (9 * MiB, 20 * MiB, 1)
    assert layout(a) == [[(9 * MiB, True), (11 * MiB, False)]]  # remainder 11 MiB > 1 MiB: split
    q = a.malloc(5 * MiB)  # best fit: the 11 MiB remainder; 6 MiB left > 1 MiB: split again
    assert (a.allocated, a.reserved) == (14 * MiB, 20 * MiB)
    assert layout(a) == [[(9 * MiB, True), (5 * MiB, True), (6 * MiB, False)]]
    r = a.malloc(6 * MiB)  # exactly the 6 MiB remainder: no new segment
    assert (a.allocated, a.reserved, a.stats().segments) == (20 * MiB, 20 * MiB, 1)
    a.malloc(512)  # the small pool is separate: a 2 MiB segment of its own
    assert a.reserved == 22 * MiB
    for ptr in (p, q, r):
        a.free(ptr)
    assert layout(a)[0] == [(20 * MiB, False)]  # coalesced back into one free block


def test_cached_block_taken_whole_when_remainder_is_at_most_1mib():
    # The H100 case (tests/data/allocator): a 1,179,648-byte tensor raised memory_allocated() by
    # 1,310,720 (1.25 MiB). Build that cache state: a free 1.25 MiB block between allocated ones.
    a = Allocator()
    x = a.malloc(1_310_720)  # 20 MiB segment: [1.25 MiB alloc, 18.75 MiB free]
    a.malloc(20 * MiB - 1_310_720)  # takes the 18.75 MiB remainder exactly
    a.free(x)  # [1.25 MiB free, 18.75 MiB alloc]
    before = a.allocated
    p = a.malloc(1_179_648)  # > 1 MiB: large pool; best fit the 1.25 MiB block
    # remainder 1,310,720 - 1,179,648 = 131,072 <= kSmallSize: no split, the block goes whole
    assert a.allocated - before == 1_310_720 == a.block_size(p)
    assert a.stats().requested_bytes == 1_179_648 + 20 * MiB - 1_310_720
    assert a.reserved == 20 * MiB  # no new segment


def test_split_threshold_is_strictly_more_than_1mib():
    for cached, request, split in [(3 * MiB, 2 * MiB, False),  # remainder exactly 1 MiB: whole
                                   (3 * MiB + 512, 2 * MiB, True),  # 1 MiB + 512 > 1 MiB: split
                                   (2 * MiB + 512, 1 * MiB + 512, False)]:  # 1 MiB: whole
        a = Allocator()
        x = a.malloc(cached)
        a.malloc(20 * MiB - cached)  # fill the rest of the 20 MiB segment
        a.free(x)
        before = a.allocated
        a.malloc(request)
        assert a.allocated - before == (request if split else cached), (cached, request)


def test_small_pool_splits_at_512_bytes_and_never_over_allocates():
    a = Allocator()
    x = a.malloc(3 * KiB)  # a 2 MiB small segment: [3 KiB, 2 MiB - 3 KiB free]
    a.malloc(kSmallSize)  # 1 MiB is still the small pool: split from the remainder
    a.malloc(kSmallSize - 3 * KiB)  # the rest of the segment, exactly
    a.free(x)  # a free 3 KiB block between allocated ones
    before = a.allocated
    a.malloc(2 * KiB + 1)  # rounds to 2.5 KiB; remainder 512 >= kMinBlockSize: split
    assert a.allocated - before == 2560
    assert layout(a)[0][:2] == [(2560, True), (512, False)]


def test_small_and_large_pools_do_not_share_blocks():
    a = Allocator()
    s = a.malloc(kSmallSize)  # exactly 1 MiB: small pool, 2 MiB segment
    a.free(s)  # a cached 2 MiB small block
    assert (a.allocated, a.reserved) == (0, kSmallBuffer)
    a.malloc(kSmallSize + 512)  # large pool: cannot use the small block -> new 20 MiB segment
    assert a.reserved == kSmallBuffer + kLargeBuffer
    st = a.stats()
    assert st.pools["small_pool"]["reserved_bytes_current"] == kSmallBuffer
    assert st.pools["large_pool"]["allocated_bytes_current"] == kSmallSize + 512
    ms = st.as_memory_stats()
    assert ms["reserved_bytes.large_pool.current"] == kLargeBuffer and ms["segment.all.current"] == 2


def test_large_requests_round_to_2mib_segments_and_best_fit_prefers_smallest():
    a = Allocator()
    big = a.malloc(33 * MiB + 1)  # >= 10 MiB: segment of 34 MiB (2 MiB multiple)
    mid = a.malloc(13 * MiB)  # 14 MiB segment
    assert a.reserved == 34 * MiB + 14 * MiB
    # 33 MiB + 512 rounded; the 34 MiB segment's remainder 1 MiB - 512 <= 1 MiB: taken whole
    assert a.block_size(big) == 34 * MiB and a.block_size(mid) == 14 * MiB  # (13 in 14: 1 MiB left)
    a.free(big)
    a.free(mid)
    a.malloc(12 * MiB)  # best fit: the 14 MiB block (not the 34 MiB one); 2 MiB left: split
    assert layout(a) == [[(34 * MiB, False)], [(12 * MiB, True), (2 * MiB, False)]]


def test_coalescing_of_adjacent_free_blocks():
    a = Allocator()
    x, y, z = a.malloc(2 * MiB), a.malloc(2 * MiB), a.malloc(2 * MiB)  # one 20 MiB segment
    assert layout(a) == [[(2 * MiB, True)] * 3 + [(14 * MiB, False)]]
    a.free(y)  # no free neighbour: stays a 2 MiB hole
    assert layout(a) == [[(2 * MiB, True), (2 * MiB, False), (2 * MiB, True), (14 * MiB, False)]]
    a.free(x)  # merges with the hole after it
    assert layout(a) == [[(4 * MiB, False), (2 * MiB, True), (14 * MiB, False)]]
    a.free(z)  # merges with both neighbours: the segment is one free block again
    assert layout(a) == [[(20 * MiB, False)]]
    a.malloc(20 * MiB)  # served by the coalesced block, no new segment
    assert (a.allocated, a.reserved) == (20 * MiB, 20 * MiB)


def test_streams_have_their_own_blocks():
    a = Allocator()
    a.free(a.malloc(4 * MiB, stream=0))  # a cached 20 MiB block on stream 0
    a.malloc(4 * MiB, stream=1)  # stream 1 cannot reuse it
    assert a.reserved == 40 * MiB


def test_max_split_size():
    a = Allocator(max_split_size=40 * MiB)
    a.free(a.malloc(64 * MiB))  # an oversize cached 64 MiB block
    a.malloc(30 * MiB)  # 30 < 40 MiB: may not take an oversize block -> new 30 MiB segment
    assert a.reserved == 94 * MiB
    before = a.allocated
    a.malloc(50 * MiB)  # >= max_split_size: takes the 64 MiB block (64 < 50 + 20), never split
    assert a.allocated - before == 64 * MiB and a.reserved == 94 * MiB
    b = Allocator(max_split_size=40 * MiB)
    b.free(b.malloc(72 * MiB))
    b.malloc(50 * MiB)  # 72 >= 50 + 20 (max_non_split_rounding_size): not taken
    assert b.reserved == (72 + 50) * MiB
    with pytest.raises(ValueError):
        Allocator(max_split_size=20 * MiB)  # the config parser requires > 20 MiB


def test_max_split_size_releases_oversize_blocks_before_everything_else():
    a = Allocator(capacity=120 * MiB, max_split_size=40 * MiB)
    a.free(a.malloc(64 * MiB))  # a cached oversize 64 MiB segment
    s = a.malloc(2 * MiB)  # may not take the oversize block: a 20 MiB segment, 18 MiB free
    a.free(a.malloc(24 * MiB))  # a cached 24 MiB segment (not oversize)
    assert a.reserved == 108 * MiB
    a.malloc(42 * MiB)  # >= max_split_size: 64 >= 42 + 20, not taken; 108 + 42 > 120.
    # release_available_cached_blocks frees the smallest oversize block covering max(42, 40) MiB,
    # the 64 MiB one, and the first retry fits (44 + 42 = 86); the 24 MiB segment stays cached
    st = a.stats()
    assert (a.reserved, st.num_alloc_retries, st.segments) == (86 * MiB, 0, 3)
    a.free(s)


# -- out of memory -----------------------------------------------------------------------------


def test_oom_releases_cached_segments_and_retries():
    a = Allocator(capacity=40 * MiB)
    p, q = a.malloc(9 * MiB), a.malloc(15 * MiB)  # 20 MiB segment + 16 MiB segment (15 > 11 free)
    assert a.reserved == 36 * MiB and a.allocated == 25 * MiB  # 15 in 16: 1 MiB left, taken whole
    a.free(p)
    a.free(q)  # both cached, 36 MiB reserved, nothing allocated
    a.malloc(30 * MiB)  # no cached fit; 36 + 30 > 40: release both cached segments, retry: 30
    st = a.stats()
    assert (a.allocated, a.reserved, st.segments, st.num_alloc_retries) == (30 * MiB, 30 * MiB, 1, 1)
    with pytest.raises(OutOfMemoryError) as e:
        a.malloc(12 * MiB)  # 30 + 12 > 40 and nothing cached to release: out of memory
    assert (e.value.alloc_size, e.value.allocated, e.value.reserved) == (12 * MiB, 30 * MiB, 30 * MiB)
    assert a.stats().num_ooms == 1 and a.stats().num_alloc_retries == 2


def test_oom_keeps_partly_used_segments():
    a = Allocator(capacity=44 * MiB)
    keep = a.malloc(2 * MiB)  # 20 MiB segment: 2 allocated, 18 free (split: cannot be released)
    a.free(a.malloc(19 * MiB))  # 19 > 18: a new 20 MiB segment, then cached whole
    a.malloc(22 * MiB)  # 40 + 22 > 44 -> release the unsplit segment only -> 20 + 22 = 42 fits
    assert a.reserved == 42 * MiB and layout(a)[0] == [(2 * MiB, True), (18 * MiB, False)]
    a.free(keep)


def test_replay_reports_oom_and_stops():
    events = [(0, "a", 30 * MiB), (1, "b", 8 * MiB), (2, "a", -30 * MiB), (3, "c", 9 * MiB)]
    trace = replay(events, capacity=48 * MiB)
    # 30 MiB segment + 20 MiB segment (8 MiB < 10 MiB) = 50 MiB > 48: nothing cached -> OOM at op 1
    assert trace.oom is not None and (trace.oom.index, trace.oom.key, trace.oom.size) == (1, "b", 8 * MiB)
    assert trace.oom.alloc_size == kLargeBuffer
    assert trace.index == [0, 1] and trace.allocated == [30 * MiB] * 2  # op 1 up to its failure
    assert replay(events, capacity=50 * MiB).oom is None


def test_empty_cache():
    a = Allocator()
    keep = a.malloc(5 * MiB)  # 20 MiB segment, 15 MiB free
    a.free(a.malloc(16 * MiB))  # 16 > 15: a 16 MiB segment, cached
    a.free(a.malloc(100))  # a 2 MiB small segment, cached
    a.empty_cache()  # the 16 MiB and the 2 MiB segments go; the split 20 MiB one stays
    assert (a.reserved, a.stats().segments) == (20 * MiB, 1)
    a.free(keep)
    a.empty_cache()
    assert (a.reserved, a.stats().segments, a.stats().reserved_bytes_peak) == (0, 0, 38 * MiB)


# -- expandable segments -----------------------------------------------------------------------


def test_expandable_segments_map_20mib_pages_and_split_exactly():
    a = Allocator(expandable_segments=True)
    p = a.malloc(9 * MiB)  # maps one 20 MiB page of the large pool's segment
    assert (a.allocated, a.reserved) == (9 * MiB, 20 * MiB)
    q = a.malloc(15 * MiB)  # 11 MiB free at the end: map one more page, merge: 31 MiB, split
    assert (a.allocated, a.reserved) == (24 * MiB, 40 * MiB)
    assert layout(a) == [[(9 * MiB, True), (15 * MiB, True), (16 * MiB, False)]]
    r = a.malloc(1 * MiB + 512)  # expandable: split when the remainder is >= 512 (not > 1 MiB)
    assert a.allocated == 25 * MiB + 512
    s = a.malloc(100)  # the small pool maps 2 MiB pages in a segment of its own
    assert a.reserved == 42 * MiB
    assert a.stats().segments == 0  # the source counts cudaMalloc segments only
    for ptr in (p, q, r, s):
        a.free(ptr)
    assert layout(a) == [[(40 * MiB, False)], [(2 * MiB, False)]]
    a.empty_cache()  # unmaps every free page; the segments go
    assert (a.reserved, a.snapshot()) == (0, [])


def test_expandable_segments_unmap_only_whole_free_pages():
    a = Allocator(expandable_segments=True)
    p = a.malloc(30 * MiB)  # pages [0, 40 MiB)
    q = a.malloc(10 * MiB)  # the remaining 10 MiB of page 1
    a.free(p)
    a.empty_cache()  # [0, 30) free: page 0 is wholly free, page 1 is partly used
    assert a.reserved == 20 * MiB
    assert layout(a) == [[(10 * MiB, False), (10 * MiB, True)]]
    a.malloc(25 * MiB)  # first fit from the lowest address: re-map page 0 and use [0, 25)
    assert a.reserved == 40 * MiB and a.allocated == 35 * MiB
    a.free(q)


def test_expandable_segments_oom():
    a = Allocator(capacity=60 * MiB, expandable_segments=True)
    a.malloc(30 * MiB)  # 2 pages = 40 MiB: [30 allocated, 10 free]
    a.malloc(25 * MiB)  # 10 free + one more page (60 <= 60): [30, 25, 5 free]
    assert (a.allocated, a.reserved) == (55 * MiB, 60 * MiB)
    with pytest.raises(OutOfMemoryError):
        a.malloc(10 * MiB)  # 5 free + one more page: 80 > 60; the 5 MiB lies in a used page
    assert a.reserved == 60 * MiB and a.stats().num_ooms == 1


# -- replay ------------------------------------------------------------------------------------


def test_replay_trace_per_op():
    events = [(-1, 0, 4 * MiB),  # before the first op (e.g. parameters)
              (0, 1, 2 * MiB), (0, 2, 100),  # op 0 makes two tensors
              (0, 1, -2 * MiB),  # ... and one dies after it
              (1, 3, 12 * MiB), (1, 3, -12 * MiB), (1, 2, -100)]
    t = replay(events)
    assert t.index == [-1, 0, 1]
    # 4 MiB + 2 MiB: one 20 MiB segment; 100 B: 512-byte block in a 2 MiB small segment
    # after op 0 the 2 MiB block is free again (merged back into the 16 MiB remainder)
    assert t.allocated == [4 * MiB, 4 * MiB + 512, 4 * MiB]
    # op 1: 12 MiB from the 16 MiB free remainder (4 MiB left: split); 100 B still live
    assert t.allocated_max == [4 * MiB, 6 * MiB + 512, 16 * MiB + 512]
    assert (t.peak_allocated, t.peak_allocated_index) == (16 * MiB + 512, 1)
    assert t.reserved == [20 * MiB, 22 * MiB, 22 * MiB] and t.peak_reserved == 22 * MiB
    assert t.peak_requested == 16 * MiB + 100 and t.oom is None


def test_replay_errors_and_skip_live():
    with pytest.raises(KeyError):
        replay([(0, "x", -512)])  # a free of a key never allocated
    with pytest.raises(ValueError):
        replay([(0, "x", 512), (1, "x", 512)])  # allocated twice
    with pytest.raises(ValueError):
        replay([(0, "x", 512), (1, "x", -1024)])  # freed with another size
    sim = Replay()
    sim.run([(0, "p", 8 * MiB), (0, "t", 3 * MiB), (1, "t", -3 * MiB)])
    t = sim.run([(0, "p", 8 * MiB), (0, "t", 3 * MiB), (1, "t", -3 * MiB)], skip_live=True)
    # second step: "p" is still live (skipped), "t" reuses the cached 3 MiB hole: nothing new
    assert (t.start_allocated, t.peak_allocated, t.peak_reserved) == (8 * MiB, 11 * MiB, 20 * MiB)
    assert t.stats.num_device_alloc == 1


# -- property tests on seeded random streams ---------------------------------------------------


class BruteForce:
    """The same rules written the obvious way (lists, linear scans), default settings: the oracle."""

    def __init__(self, capacity=None):
        self.capacity = capacity
        self.segments = []  # [base, pool, stream, blocks: list of [size, allocated]]
        self.next_base = 1 << 32
        self.allocated = self.reserved = 0
        self.ptrs = {}  # ptr -> (segment, size)

    def _free_blocks(self, small, stream):
        for seg in self.segments:
            if seg[1] == small and seg[2] == stream:
                offset = 0
                for i, (size, used) in enumerate(seg[3]):
                    if not used:
                        yield size, seg[0] + offset, seg, i
                    offset += size

    def malloc(self, n, stream=0):
        size = r512(n)
        small = size <= kSmallSize
        fits = [c for c in self._free_blocks(small, stream) if c[0] >= size]
        if fits:
            bsize, ptr, seg, i = min(fits, key=lambda c: (c[0], c[1]))
        else:
            alloc = get_allocation_size(size)
            if self.capacity is not None and self.reserved + alloc > self.capacity:
                for s in [s for s in self.segments if len(s[3]) == 1 and not s[3][0][1]]:
                    self.segments.remove(s)
                    self.reserved -= s[3][0][0]
                if self.reserved + alloc > self.capacity:
                    raise OutOfMemoryError(n, alloc, stream, self.allocated, self.reserved, self.capacity)
            seg = [self.next_base, small, stream, [[alloc, False]]]
            self.next_base += alloc
            self.segments.append(seg)
            self.reserved += alloc
            bsize, ptr, i = alloc, seg[0], 0
        rest = bsize - size
        if (small and rest >= 512) or (not small and rest > kSmallSize):
            seg[3][i:i + 1] = [[size, True], [rest, False]]
        else:
            seg[3][i][1] = True
            size = bsize
        self.allocated += size
        self.ptrs[ptr] = seg
        return ptr

    def free(self, ptr):
        seg = self.ptrs.pop(ptr)
        offset, blocks = seg[0], seg[3]
        i = 0
        while offset != ptr:
            offset += blocks[i][0]
            i += 1
        blocks[i][1] = False
        self.allocated -= blocks[i][0]
        if i + 1 < len(blocks) and not blocks[i + 1][1]:
            blocks[i][0] += blocks.pop(i + 1)[0]
        if i > 0 and not blocks[i - 1][1]:
            blocks[i - 1][0] += blocks.pop(i)[0]


def random_events(seed: int, n: int, max_log2: float = 26.0, live: int = 60):
    """A seeded stream of (index, key, ±bytes): sizes log-uniform from 1 B to 2**max_log2."""
    rng = random.Random(seed)
    events, alive, key, index = [], [], 0, 0
    while len(events) < n:
        index += rng.random() < 0.7
        if not alive or (len(alive) < live and rng.random() < 0.55):
            size = int(2 ** rng.uniform(0, max_log2))
            events.append((index, key, size))
            alive.append((key, size))
            key += 1
        else:
            k, size = alive.pop(rng.randrange(len(alive)))
            events.append((index, k, -size))
    return events, alive


def check_invariants(a: Allocator, live_requests: list[int]):
    st = a.stats()
    assert st.allocated_bytes <= st.reserved_bytes
    assert st.allocated_bytes >= sum(r512(n) for n in live_requests if n)
    if a.capacity is not None:
        assert st.reserved_bytes <= a.capacity
    segments = a.snapshot()
    assert sum(s.total_size for s in segments) == st.reserved_bytes
    assert sum(s.allocated_size for s in segments) == st.allocated_bytes
    for s in segments:
        for b, c in zip(s.blocks, s.blocks[1:]):
            assert b.address + b.size == c.address  # contiguous
            assert b.allocated or c.allocated  # no two free neighbours: coalesced


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("expandable", [False, True])
def test_properties_on_random_streams(seed, expandable):
    events, _ = random_events(seed, 1500)
    a = Allocator(capacity=None, expandable_segments=expandable)
    ptrs, live = {}, {}
    for k, (index, key, n) in enumerate(events):
        if n >= 0:
            ptrs[key] = a.malloc(n)
            live[key] = n
        else:
            a.free(ptrs.pop(key))
            del live[key]
        if k % 50 == 0:
            check_invariants(a, list(live.values()))
    check_invariants(a, list(live.values()))
    for ptr in ptrs.values():
        a.free(ptr)
    assert a.allocated == 0 and a.stats().requested_bytes == 0
    a.empty_cache()
    assert a.reserved == 0 and a.snapshot() == []


@pytest.mark.parametrize("seed", range(4))
def test_replay_properties(seed):
    events, alive = random_events(100 + seed, 3000)
    t = replay(events)
    assert all(x <= r for x, r in zip(t.allocated, t.reserved))
    assert t.peak_allocated == max(t.allocated_max)  # the peak is the max of the trace
    assert t.allocated[t.index.index(t.peak_allocated_index)] <= t.peak_allocated
    assert t.allocated_max[t.index.index(t.peak_allocated_index)] == t.peak_allocated
    assert t.peak_reserved == max(t.reserved) == t.stats.reserved_bytes_peak
    assert t.stats.allocated_bytes_peak == t.peak_allocated
    assert t.peak_requested <= t.peak_allocated
    assert replay(events) == t  # deterministic
    # freeing what is left brings allocated to 0
    last = events[-1][0] + 1
    t2 = replay(events + [(last, k, -n) for k, n in alive])
    assert t2.allocated[-1] == 0 and t2.stats.allocations == 0


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("capacity", [None, 96 * MiB])
def test_against_brute_force(seed, capacity):
    """The sorted-structure implementation and the linear-scan oracle agree event by event."""
    events, _ = random_events(200 + seed, 2500, max_log2=25.5, live=40)
    a, b = Allocator(capacity=capacity), BruteForce(capacity=capacity)
    pa, pb = {}, {}
    for index, key, n in events:
        if n >= 0:
            try:
                pa[key] = a.malloc(n)
            except OutOfMemoryError:
                with pytest.raises(OutOfMemoryError):
                    b.malloc(n)
                continue
            pb[key] = b.malloc(n)
        elif key in pa:
            a.free(pa.pop(key))
            b.free(pb.pop(key))
        assert (a.allocated, a.reserved) == (b.allocated, b.reserved), (index, key, n)
        assert pa.get(key) == pb.get(key)  # the same block (address) chosen


def test_many_free_blocks_stay_consistent():
    """More free blocks than one sorted bucket holds (exercises bucket splits and removals)."""
    a = Allocator()
    ptrs = [a.malloc(1024 * (1 + i % 7)) for i in range(6000)]
    for p in ptrs[::2]:
        a.free(p)  # 3000 separate holes in the small pool
    check_invariants(a, [])
    again = [a.malloc(1024) for _ in range(500)]  # best fits: the 1 KiB holes
    assert a.reserved == a.stats().reserved_bytes_peak
    for p in ptrs[1::2] + again:
        a.free(p)
    assert a.allocated == 0 and len(a.snapshot()) == a.stats().segments


# -- against the H100 reference ----------------------------------------------------------------
# tests/data/cuda_reference/memory (the project's copy of the shared H100 set; see its README):
# per op, memory_allocated() before and after it and its output storages' bytes.

REFERENCE = os.path.join(HERE, "data", "cuda_reference", "memory")


@functools.lru_cache(maxsize=None)
def reference(name: str) -> dict:
    with open(os.path.join(REFERENCE, name + ".json.gz"), "rb") as f:
        raw = gzip.decompress(f.read())
    # many small objects at once: without this the collector rescans the whole heap (torch is
    # imported by conftest) several times per file
    enabled = gc.isenabled()
    gc.disable()
    try:
        return json.loads(raw)
    finally:
        if enabled:
            gc.enable()


def reference_names() -> list[str]:
    return sorted(f[:-len(".json.gz")] for f in os.listdir(REFERENCE) if f.endswith(".json.gz"))


def out_bytes(op: dict) -> list[int]:
    return [o[3] for o in op["out"] if o and len(o) > 3 and o[3]]


def test_reference_over_allocations_follow_should_split():
    """Wherever an H100 op raised memory_allocated() by more than its rounded outputs (2,072
    ops in 44 steps when written), the excess is what whole cached blocks explain: a multiple
    of 512, at most kSmallSize (1 MiB) per large (> 1 MiB) output, and never for an op whose
    outputs are all small-pool sizes (small blocks split down to 512 bytes).  The many excesses
    of exactly 1 MiB show the remainder test is ``> kSmallSize``, not ``>=``."""
    over = exactly_1mib = 0
    for name in reference_names():
        for op in reference(name)["ops"]:
            outs = out_bytes(op)
            excess = op["after"] - op["before"] - sum(r512(n) for n in outs)
            if excess <= 0:
                continue
            over += 1
            large = sum(1 for n in outs if r512(n) > kSmallSize)
            assert excess % kMinBlockSize == 0 and excess <= large * kSmallSize, (name, op["op"], outs, excess)
            exactly_1mib += len(outs) == 1 and excess == kSmallSize
    assert over > 1000 and exactly_1mib > 100


def test_reference_whole_block_cases_replayed():
    """Cases where the block the op took is knowable: the frees right before the op released
    exactly ``taken`` bytes and the op's single large output then raised memory_allocated() by
    ``taken``.  Rebuild that cache state (the freed block between allocated neighbours) and
    replay the op: the model hands out the same whole block, growing allocated by ``taken``."""
    cases = []
    for name in reference_names():
        ops = reference(name)["ops"]
        for prev, op in zip(ops, ops[1:]):
            outs = out_bytes(op)
            taken, freed = op["after"] - op["before"], prev["after"] - op["before"]
            if len(outs) == 1 and r512(outs[0]) > kSmallSize and taken > r512(outs[0]) and freed == taken:
                cases.append((name, op["op"], outs[0], taken))
    assert len(cases) >= 20
    for name, opname, request, taken in cases:
        a = Allocator()
        a.free(a.malloc(taken + 4 * MiB))  # a cached segment with room for `taken` and more
        x = a.malloc(taken)  # split: the remainder is > 1 MiB
        a.malloc(a.snapshot()[0].blocks[1].size)  # the remainder stays in use
        a.free(x)  # the frees before the op: a free block of exactly `taken`
        assert [b.size for s in a.snapshot() for b in s.blocks if not b.allocated] == [taken]
        before = a.allocated
        a.malloc(request)
        assert a.allocated - before == taken, (name, opname, request, taken)


def replay_capture(name: str):
    """Three steps of a frozen estimator capture (tests/data/allocator) through the model, with
    the reference's cuBLAS workspaces allocated first and zero_grad(set_to_none=True) freeing the
    gradients at the end of each step.  Returns (reference, ops, per-op allocated growth in the
    third step, 512-rounded requests per op, [trace of step 1, trace of step 2, peak of step 3])."""
    with gzip.open(os.path.join(DATA, name + ".capture.json.gz"), "rt") as f:
        cap = json.load(f)
    ref = reference(name)
    ws = ref["ws"]
    events = [(-1, "ws0", ws // 2), (-1, "ws1", ws - ws // 2)] + [tuple(e) for e in cap["events"]]
    end = len(cap["ops"])
    events += [(end, sid, -n) for sid, n in zip(cap["gradients"], cap["storage_bytes_gradients"])]
    sim = Replay()
    traces = [sim.run(events, skip_live=True) for _ in range(2)]
    # the third step event by event, for the growth of allocated during each op
    a, live = sim.allocator, sim.live
    a.reset_peak()
    grown, rounded, start = {}, {}, {}
    for index, key, n in events:
        if n >= 0:
            if key in live:
                continue
            start.setdefault(index, a.allocated)
            live[key] = (a.malloc(n), n)
            grown[index] = a.allocated - start[index]
            rounded[index] = rounded.get(index, 0) + r512(n)
        else:
            a.free(live.pop(key)[0])
    traces.append(a.stats().allocated_bytes_peak)
    return ref, cap["ops"], grown, rounded, traces


@pytest.mark.parametrize("name", ["mobilenet_v3_small_b64__fp32", "resnet50_b64__fp32"])
def test_reference_step_peaks(name):
    """The estimator's event stream of a CNN step (close to the real one) through the model:
    the steady-state max_memory_allocated() and max_memory_reserved() land within 1 % of the
    H100's (measured when written: 1.000 / 1.003 and 1.001 / 0.993), and the model's peak is at
    least the 512-rounding-only estimate's (whole blocks only add)."""
    ref, ops, grown, rounded, traces = replay_capture(name)
    steady = ref["steps"][1]
    assert traces[1].peak_allocated == pytest.approx(steady["peak"], rel=0.01)
    assert traces[1].peak_reserved == pytest.approx(steady["reserved_peak"], rel=0.01)
    with gzip.open(os.path.join(DATA, name + ".capture.json.gz"), "rt") as f:
        estimate_peak = json.load(f)["estimate_peak"] + ref["ws"]
    assert traces[1].peak_allocated >= estimate_peak
    assert traces[2] == traces[1].peak_allocated  # steady state: the third step peaks alike


def test_reference_per_op_whole_blocks_reproduced():
    """Op by op (aligned by name within each phase), the third replayed step of MobileNetV3's
    capture against the H100's: where the real op took whole cached blocks (memory_allocated()
    grew by more than its rounded outputs: 39 ops when written), the model grows allocated by
    the same bytes in at least 90 % of them (38 when written), and it matches the real growth
    exactly in more ops than rounding to 512 bytes alone does (530 vs 492 of 532)."""
    ref, ops, grown, rounded, _ = replay_capture("mobilenet_v3_small_b64__fp32")
    ours = [(("forward" if phase == "loss" else phase), op, grown.get(i, 0), rounded.get(i, 0))
            for i, (phase, op) in enumerate(ops)]
    theirs = [(r["phase"], r["op"].removeprefix("aten.").rsplit(".", 1)[0], r["after"] - r["before"],
               sum(r512(n) for n in out_bytes(r))) for r in ref["ops"]]
    whole = whole_same = exact_model = exact_rounding = aligned = 0
    for phase in ("forward", "backward", "optimizer"):
        o = [x for x in ours if x[0] == phase]
        t = [x for x in theirs if x[0] == phase]
        matcher = difflib.SequenceMatcher(a=[x[1] for x in o], b=[x[1] for x in t], autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag != "equal":
                continue
            for x, y in zip(o[i1:i2], t[j1:j2]):
                aligned += 1
                exact_model += x[2] == y[2]
                exact_rounding += x[3] == y[2]
                if y[2] > y[3] > 0:
                    whole += 1
                    whole_same += x[2] == y[2]
    assert aligned > 500 and whole > 30
    assert whole_same >= 0.9 * whole
    assert exact_model > exact_rounding

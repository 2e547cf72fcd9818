"""The allocator's data structures: blocks of a segment linked to their neighbours (``Block``), the
free blocks of a pool per stream ordered by (size, address) (``BlockPool``), the virtual range of
an expandable segment (``ExpandableSegment``), and the sorted integer list they are kept in.

Speed: ``bisect`` over sorted integer keys in blocks of at most 2,000 (a small sorted list); no
per-event scan of the cache.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Iterator

KEY_SHIFT = 64  # free-block sort key: size << KEY_SHIFT | address (addresses stay below 2**64)
KEY_MASK = (1 << KEY_SHIFT) - 1
BASE_ADDRESS = 1 << 32  # first segment address; 0 stays the null pointer
DEFAULT_ADDRESS_SPACE = 1 << 40  # expandable segment's virtual range when no capacity is given


# -- a sorted list of ints (bisect over blocks of at most 2 * _LOAD) ---------------------------

_LOAD = 1000


class SortedInts:
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

    def copy(self) -> "SortedInts":
        new = SortedInts()
        new.lists = [list(lst) for lst in self.lists]
        new.maxes = list(self.maxes)
        return new

    def items(self) -> list[int]:
        return [x for lst in self.lists for x in lst]


# -- blocks, pools, segments ------------------------------------------------------------------


class ExpandableSegment:
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


class Block:
    """``Block``: a piece of a segment, allocated or free, linked to its neighbours."""

    __slots__ = ("ptr", "size", "requested", "stream", "pool", "allocated", "prev", "next",
                 "expandable", "mapped")

    def __init__(self, ptr: int, size: int, stream: int, pool: "BlockPool",
                 expandable: ExpandableSegment | None = None, mapped: bool = True) -> None:
        self.ptr = ptr
        self.size = size
        self.requested = 0
        self.stream = stream
        self.pool = pool
        self.allocated = False
        self.prev: Block | None = None
        self.next: Block | None = None
        self.expandable = expandable
        self.mapped = mapped

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        state = "allocated" if self.allocated else ("free" if self.mapped else "unmapped")
        return f"<Block {self.ptr:#x} {self.size} {state}>"


class BlockPool:
    """``BlockPool``: the free (cached) blocks of one pool, per stream, ordered by (size,
    address) (``blocks``), and for expandable segments the unmapped ranges by address
    (``unmapped``); with the pool's own counters (``StatType::SMALL_POOL``/``LARGE_POOL``)."""

    __slots__ = ("is_small", "name", "blocks", "free_by_ptr", "unmapped", "unmapped_by_ptr",
                 "allocated", "allocated_peak", "reserved", "reserved_peak", "segments",
                 "segments_peak", "requested", "requested_peak")

    def __init__(self, is_small: bool) -> None:
        self.is_small = is_small
        self.name = "small_pool" if is_small else "large_pool"
        self.blocks: dict[int, SortedInts] = {}  # stream -> size << KEY_SHIFT | ptr
        self.free_by_ptr: dict[int, Block] = {}
        self.unmapped: dict[int, SortedInts] = {}  # stream -> ptr
        self.unmapped_by_ptr: dict[int, Block] = {}
        self.allocated = self.allocated_peak = 0
        self.reserved = self.reserved_peak = 0
        self.segments = self.segments_peak = 0
        self.requested = self.requested_peak = 0

    def clone(self) -> "BlockPool":
        """A copy with the same counters and sorted keys; ``free_by_ptr`` and ``unmapped_by_ptr`` are left for
        the caller to fill with its copies of the blocks (:meth:`Allocator.clone`)."""
        new = BlockPool(self.is_small)
        for name in ("allocated", "allocated_peak", "reserved", "reserved_peak", "segments", "segments_peak",
                     "requested", "requested_peak"):
            setattr(new, name, getattr(self, name))
        new.blocks = {stream: s.copy() for stream, s in self.blocks.items()}
        new.unmapped = {stream: s.copy() for stream, s in self.unmapped.items()}
        return new

    def insert(self, block: Block) -> None:
        """``insert_into_blocks``."""
        s = self.blocks.get(block.stream)
        if s is None:
            s = self.blocks[block.stream] = SortedInts()
        s.add(block.size << KEY_SHIFT | block.ptr)
        self.free_by_ptr[block.ptr] = block

    def erase(self, block: Block) -> None:
        self.blocks[block.stream].remove(block.size << KEY_SHIFT | block.ptr)
        del self.free_by_ptr[block.ptr]

    def insert_unmapped(self, block: Block) -> None:
        s = self.unmapped.get(block.stream)
        if s is None:
            s = self.unmapped[block.stream] = SortedInts()
        s.add(block.ptr)
        self.unmapped_by_ptr[block.ptr] = block

    def erase_unmapped(self, block: Block) -> None:
        self.unmapped[block.stream].remove(block.ptr)
        del self.unmapped_by_ptr[block.ptr]

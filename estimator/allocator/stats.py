"""What the allocator reports: its counters (:class:`Stats`, ``DeviceStats``), a snapshot of its
segments and blocks (:class:`SegmentInfo`, :class:`BlockInfo`, as ``torch.cuda.memory_snapshot()``
lists them) and the out-of-memory error.

``allocated_bytes`` is the sum of allocated block sizes (``memory_allocated()``),
``reserved_bytes`` the sum of segment sizes (``memory_reserved()``), ``requested_bytes`` the sum
of the unrounded requests; current and peak, in all, ``small_pool`` and ``large_pool``
(``increase_stat``/``decrease_stat``, ``resetPeakStats``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

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

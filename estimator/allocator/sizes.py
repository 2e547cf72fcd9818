"""How the caching allocator sizes things: the constants at the top of
``c10/cuda/CUDACachingAllocator.cpp``, request rounding (``round_size``, with
``roundup_power2_divisions``) and the size of a new segment (``get_allocation_size``).

* **Rounding** (``round_size``): requests below ``kMinBlockSize`` = 512 bytes become 512, others
  round up to a multiple of 512; with ``roundup_power2_divisions`` set for the request's
  power-of-two interval (``CUDAAllocatorConfig::roundup_power2_divisions``: 16 intervals from
  1 MiB, the last open-ended) and ``size > 512 * divisions``, to the next of ``divisions``
  equal steps between two powers of two (``roundup_power2_next_division``).
* **Segment sizes** (``get_allocation_size``): a cudaMalloc for the small pool is
  ``kSmallBuffer`` = 2 MiB; for a large request below ``kMinLargeAlloc`` = 10 MiB it is
  ``kLargeBuffer`` = 20 MiB; otherwise the request rounded up to ``kRoundLarge`` = 2 MiB.
"""

from __future__ import annotations

from typing import Sequence

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

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

Where the rules live (default settings of torch 2.11-2.14, from ``c10/cuda/CUDACachingAllocator.cpp``
and ``c10/cuda/CUDAAllocatorConfig.{h,cpp}``; names as in the source):

* :mod:`.sizes`: constants, request rounding, segment sizes;
* :mod:`.blocks`: blocks, pools, expandable segments and the sorted lists they are kept in;
* :mod:`.caching`: :class:`Allocator`, the state machine (pools, best fit, splitting,
  coalescing, out of memory, expandable segments);
* :mod:`.stats`: counters, snapshots, :class:`OutOfMemoryError`;
* :mod:`.replay`: :class:`Replay` and :func:`replay` over a capture's events, :class:`Trace`.

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
"""

from .caching import Allocator
from .replay import OOM, Replay, Trace, replay
from .sizes import (
    get_allocation_size, kLargeBuffer, kMinBlockSize, kMinLargeAlloc, kRoundLarge, kSmallBuffer, kSmallSize,
    round_size,
)
from .stats import BlockInfo, OutOfMemoryError, SegmentInfo, Stats

__all__ = [
    "Allocator", "OOM", "Replay", "Trace", "replay", "get_allocation_size", "kLargeBuffer", "kMinBlockSize",
    "kMinLargeAlloc", "kRoundLarge", "kSmallBuffer", "kSmallSize", "round_size", "BlockInfo", "OutOfMemoryError",
    "SegmentInfo", "Stats",
]

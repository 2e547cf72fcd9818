"""The bytes a traced step needs on the GPU at another size, from traces that share their op sequence.

A search traces a step at two or three sizes (:meth:`estimator.plan.planner.Planner.solve`).  Between traces
with the same op sequence every storage's size is a polynomial of the batch (degree 1) or of the sequence
(degree 2), and so is every allocation the CUDA libraries add (:func:`estimator.workspace.library_memory`:
workspaces, kernel temporaries).  :func:`need_at` interpolates both (:func:`.search.lagrange`) and runs the
caching allocator on them (:func:`estimator.memory.simulate`): the allocator's peak and its fragmentation
reserve at that size, which are not polynomials (block rounding, segment reuse) and so are simulated rather
than interpolated.  Where the libraries' allocations differ in kind between the traces (an op that takes
another kernel at another size), there is no interpolation: ``None``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..memory import simulate
from ..workspace import LibraryMemory, library_memory
from .search import lagrange


def _library_key(lib: LibraryMemory) -> tuple:
    """What must agree between two traces' library memory to interpolate it entry by entry."""
    return tuple(sorted(lib.transients)), tuple((i, what) for i, _, what in lib.persistent), tuple(sorted(lib.resize))


def _library_vector(lib: LibraryMemory) -> list[int]:
    """Every size of ``lib``, in the order of :func:`_library_key`."""
    return ([lib.transients[i] for i in sorted(lib.transients)] + [n for _, n, _ in lib.persistent]
            + [lib.resize[s] for s in sorted(lib.resize)])


def _library_from(like: LibraryMemory, values: Sequence[float]) -> LibraryMemory:
    """A :class:`LibraryMemory` shaped as ``like`` with the sizes ``values`` (:func:`_library_vector`'s order)."""
    sizes = [max(0, int(round(x))) for x in values]
    transients = sorted(like.transients)
    k, p = len(transients), len(like.persistent)
    return LibraryMemory(transients=dict(zip(transients, sizes[:k])),
                         persistent=[(i, n, what) for (i, _, what), n in zip(like.persistent, sizes[k:k + p])],
                         resize=dict(zip(sorted(like.resize), sizes[k + p:])))


def need_at(steps: Sequence[Any], points: Sequence[int], target: Any = None) -> Callable[[int], int] | None:
    """``need(v)``: the bytes of the card the step needs at size ``v`` (the caching allocator's peak, the CUDA
    context and the fragmentation reserve, as :meth:`Planner.needed` counts a trace at ``v``), from ``steps``
    traced at ``points`` with one op sequence on the CUDA device; None when their libraries' allocations
    differ in kind.  ``target``: the :class:`~estimator.target.CudaTarget` the steps were simulated for."""
    from ..target import CudaTarget

    target = target or CudaTarget()
    libs = [library_memory(s.cap, target) for s in steps]
    if any(_library_key(lib) != _library_key(libs[0]) for lib in libs[1:]):
        return None
    per = [list(s.cap.storage_bytes) for s in steps]
    lib_per = [_library_vector(lib) for lib in libs]
    cap = steps[0].cap
    known: dict[int, int] = {}

    def need(v: int) -> int:
        if v not in known:
            sizes = [max(0, int(round(x))) for x in lagrange(points, per, v)]
            lib = _library_from(libs[0], lagrange(points, lib_per, v) if lib_per[0] else [])
            for sid, nbytes in lib.resize.items():  # the bytes on the GPU, not the fake kernel's
                sizes[sid] = nbytes
            prof = simulate(cap, "cuda", resize=dict(enumerate(sizes)), target=target, library=lib)
            known[v] = prof.peak + sum(prof.reserve.values())
        return known[v]

    return need


def searched_allocator(planner: Any, layout: Any, checkpoint: tuple, what: str, unit: int, steps: Sequence[Any],
                       points: Sequence[int]) -> tuple[Any, Any]:
    """``(exact, anchor)`` for :func:`.search.largest_fitting` in a search of ``planner`` (``steps`` traced at
    ``points`` x ``unit``, one op sequence): :func:`need_at` of the steps, and of the traces at other values;
    ``(None, None)`` where the peak is not the simulated caching allocator's (another device than CUDA,
    ZeRO laid out by hand, FSDP2's CPU offload, whose model states leave the timeline)."""
    first = steps[0]
    if not (layout.traced and not layout.offload and planner.device == "cuda" and first.profile.device == "cuda"
            and first.lazy_need):
        return None, None

    def anchor(values: list[int]) -> Callable[[int], int] | None:
        """The bytes needed interpolated from the (already made) traces at ``values``."""
        near = [planner.traced(layout, checkpoint, what, v * unit) for v in values]
        if any(s.structure() != near[0].structure() for s in near[1:]):
            return None
        return need_at(near, values, near[0].cuda_target)

    # two traces around a miss interpolate a batch (degree 1), not a sequence (degree 2: three would be needed)
    return need_at(steps, points, first.cuda_target), anchor if what == "batch" else None

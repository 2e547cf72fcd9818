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


class NeedAt:
    """``need(v)``: the bytes of the card the step needs at size ``v`` (the caching allocator's peak, the CUDA
    context and the fragmentation reserve, as :meth:`Planner.needed` counts a trace at ``v``), from ``steps``
    traced at ``points`` with one op sequence on the CUDA device (:func:`need_at`); ``peak(v)``: the allocator's
    peak there; ``reproduces(step, v)``: whether a trace at ``v`` is what the interpolation gives."""

    def __init__(self, steps: Sequence[Any], points: Sequence[int], target: Any, libs: list[LibraryMemory]):
        self.first, self.points, self.target, self.lib = steps[0], list(points), target, libs[0]
        self.per = [list(s.cap.storage_bytes) for s in steps]
        self.lib_per = [_library_vector(lib) for lib in libs]
        self.known: dict[int, tuple[int, int]] = {}  # v -> (need, peak)

    def sizes(self, v: int) -> tuple[list[int], list[int]]:
        """Every storage's bytes and every library allocation's at ``v``, interpolated."""
        return ([max(0, int(round(x))) for x in lagrange(self.points, self.per, v)],
                [max(0, int(round(x))) for x in lagrange(self.points, self.lib_per, v)] if self.lib_per[0] else [])

    def __call__(self, v: int) -> int:
        if v not in self.known:
            sizes, lib_sizes = self.sizes(v)
            lib = _library_from(self.lib, lib_sizes)
            for sid, nbytes in lib.resize.items():  # the bytes on the GPU, not the fake kernel's
                sizes[sid] = nbytes
            prof = simulate(self.first.cap, "cuda", resize=dict(enumerate(sizes)), target=self.target, library=lib)
            self.known[v] = (prof.peak + sum(prof.reserve.values()), prof.peak)
        return self.known[v][0]

    def peak(self, v: int) -> int:
        self(v)
        return self.known[v][1]

    def reproduces(self, step: Any, v: int) -> bool:
        """``step``, traced at ``v``, has the points' op sequence, and every storage and library allocation the
        size the interpolation gives there: the bytes of every size between the traces are then a trace's."""
        if step.structure() != self.first.structure():
            return False
        lib = library_memory(step.cap, self.target)
        if _library_key(lib) != _library_key(self.lib):
            return False
        return (list(step.cap.storage_bytes), _library_vector(lib)) == self.sizes(v)


def need_at(steps: Sequence[Any], points: Sequence[int], target: Any = None) -> NeedAt | None:
    """:class:`NeedAt` of ``steps`` traced at ``points`` with one op sequence on the CUDA device; None when
    their libraries' allocations differ in kind.  ``target``: the :class:`~estimator.target.CudaTarget` the
    steps were simulated for."""
    from ..target import CudaTarget

    target = target or CudaTarget()
    libs = [library_memory(s.cap, target) for s in steps]
    if any(_library_key(lib) != _library_key(libs[0]) for lib in libs[1:]):
        return None
    return NeedAt(steps, points, target, libs)


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

"""The bytes a traced step needs on the GPU at another size, from traces that share their op sequence.

A search traces a step at two or three sizes (:meth:`estimator.plan.planner.Planner.solve`).  Between traces
with the same op sequence every storage's size is a polynomial of the batch (degree 1) or of the sequence
(degree 2), and so is every allocation the CUDA libraries add (:func:`estimator.workspace.library_memory`:
workspaces, kernel temporaries).  :func:`need_at` interpolates both (:func:`.search.lagrange`) and runs the
caching allocator on them (:func:`estimator.memory.simulate`): the allocator's peak and its fragmentation
reserve at that size, which are not polynomials (block rounding, segment reuse) and so are simulated rather
than interpolated.  A kernel's temporary is not always a polynomial either (a reduction's partial sums are
capped by its grid, cuDNN rounds its workspace): it is the workspace rule (:data:`estimator.workspace.TRANSIENT`)
evaluated on the op's arguments at that size, whose shapes and strides are polynomials of it (interpolated
argument by argument, :func:`_at`); an argument that is not (a float that changes) leaves that temporary
interpolated.  Where the libraries' allocations differ in kind between the traces (an op that takes another
kernel at another size), there is no interpolation: ``None``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..memory import simulate
from ..rules import OpCall, TensorSpec
from ..tally import op_call
from ..workspace import TRANSIENT, Layout, LibraryMemory, layout_of, library_memory
from .search import lagrange


class _NotPolynomial(Exception):
    """An argument whose values at the traced sizes are not those of one polynomial (see :func:`_at`)."""


def _at(values: Sequence[Any], points: Sequence[int], v: int) -> Any:
    """An op argument at size ``v`` from its values at ``points`` (one per trace, alike in structure): equal
    values are kept, integers (sizes, shapes, strides) interpolated and required to stay integers, tuples,
    lists, mappings and tensor specs element by element; anything else that differs raises
    :class:`_NotPolynomial`."""
    first = values[0]
    if all(x == first for x in values[1:]):
        return first
    if isinstance(first, TensorSpec) and all(x.dtype == first.dtype for x in values):
        return TensorSpec(_at([x.shape for x in values], points, v), first.dtype)
    if isinstance(first, int) and not isinstance(first, bool):
        y = lagrange(points, [[float(x)] for x in values], v)[0]
        if abs(y - round(y)) > 1e-6:
            raise _NotPolynomial(values)
        return int(round(y))
    if isinstance(first, (tuple, list)) and all(type(x) is type(first) and len(x) == len(first) for x in values):
        out = [_at([x[k] for x in values], points, v) for k in range(len(first))]
        return tuple(out) if isinstance(first, tuple) else out
    if isinstance(first, dict) and all(x.keys() == first.keys() for x in values):
        return {k: _at([x[k] for x in values], points, v) for k in first}
    raise _NotPolynomial(values)


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
        # each temporary's op as every trace calls it: (rule, calls, layouts), in _library_vector's order
        self.calls = [(TRANSIENT[steps[0].cap.nodes[i].target.overloadpacket],
                       [op_call(s.cap.nodes[i]) for s in steps], [layout_of(s.cap.nodes[i]) for s in steps])
                      for i in sorted(self.lib.transients)]

    def _transient(self, k: int, v: int) -> int | None:
        """Temporary ``k``'s bytes at ``v``: its rule on the op's arguments there; None where they are not
        polynomials of the size or the rule does not take them (the temporary is then interpolated)."""
        rule, calls, layouts = self.calls[k]
        try:
            call = OpCall(calls[0].op, _at([c.args for c in calls], self.points, v),
                          _at([c.outputs for c in calls], self.points, v))
            layout = Layout(_at([dict(x.args) for x in layouts], self.points, v),
                            _at([x.outputs for x in layouts], self.points, v))
            return int(rule(call, self.target, layout))
        except Exception:  # (_NotPolynomial, or a rule that cannot take sizes no trace had): the line instead
            return None

    def sizes(self, v: int) -> tuple[list[int], list[int]]:
        """Every storage's bytes and every library allocation's at ``v``: interpolated, the kernels' temporaries
        by their rules where the op's arguments interpolate."""
        lib = [max(0, int(round(x))) for x in lagrange(self.points, self.lib_per, v)] if self.lib_per[0] else []
        for k in range(len(self.calls)):
            nbytes = self._transient(k, v)
            if nbytes is not None:
                lib[k] = nbytes
        return [max(0, int(round(x))) for x in lagrange(self.points, self.per, v)], lib

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
        if not set(lib.transients) <= set(self.lib.transients):
            return False
        lib = _aligned([self.lib, lib])[1]
        if _library_key(lib) != _library_key(self.lib):
            return False
        return (list(step.cap.storage_bytes), _library_vector(lib)) == self.sizes(v)


def need_at(steps: Sequence[Any], points: Sequence[int], target: Any = None) -> NeedAt | None:
    """:class:`NeedAt` of ``steps`` traced at ``points`` with one op sequence on the CUDA device; None when
    their libraries' allocations differ in kind.  ``target``: the :class:`~estimator.target.CudaTarget` the
    steps were simulated for."""
    from ..target import CudaTarget

    target = target or CudaTarget()
    libs = _aligned([library_memory(s.cap, target) for s in steps])
    if any(_library_key(lib) != _library_key(libs[0]) for lib in libs[1:]):
        return None
    return NeedAt(steps, points, target, libs)


def _aligned(libs: list[LibraryMemory]) -> list[LibraryMemory]:
    """``libs`` with one set of kernel temporaries: an op whose temporary is none at one traced size and some at
    another (embedding_dense_backward sorts its indices above 3,072 of them, a batch of 8 x 256 tokens does not,
    16 x 256 does) has it at every size, 0 where it is none; :meth:`NeedAt.sizes` evaluates its rule at each
    size, the threshold included (the traces are one op sequence: the op is at the same index in each)."""
    ops = sorted(set().union(*(lib.transients for lib in libs)))
    return [LibraryMemory({i: lib.transients.get(i, 0) for i in ops}, lib.persistent, lib.resize) for lib in libs]


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

"""Peak memory of a training step from tensor lifetimes.

The capture (:mod:`estimator.capture`) records, in execution order, when each
storage is allocated (the op that first produced it; views and in-place ops
alias it and add nothing) and when it is freed (its last reference dropped:
Python variables, autograd's saved tensors once their backward node has run,
``.grad`` after ``zero_grad(set_to_none=True)``).  This module replays those
events and answers the questions users ask:

* ``peak_first_step``: the first iteration, optimizer state created lazily
  inside ``optimizer.step()``;
* ``peak`` (steady state): a later iteration, whose optimizer state exists
  from the start (its storages are allocated before the first op), gradients
  ``None`` at the start, inputs alive throughout, and what the loop still holds from
  the previous iteration: its loss in training (``keep = step()``), its output in
  inference (``out = model(x)`` replaced only when the new output is assigned).  The
  model output of the step itself is held to the end of the step (``out = model(x);
  loss = loss_fn(out); loss.backward(); opt.step()``);
* the timeline of live bytes by category (parameters, buffers, inputs,
  gradients, optimizer state, saved activations, temporaries) at every op,
  with phase and module, and where the peak occurs.

For CUDA targets the events go through a simulation of PyTorch's caching
allocator (:mod:`estimator.allocator`: 512-byte rounding, segments, blocks handed
out whole when the remainder would be 1 MiB or less), over the model's own load
(``model.to("cuda")``, parameter by parameter in ``Module._apply`` order), a first
step and a second one, so the peaks compare with ``torch.cuda.max_memory_allocated()``
and the reserved memory with ``max_memory_reserved()``.  The memory the CUDA
libraries take inside the allocator (:mod:`estimator.workspace`) is part of the
timeline; what the allocator does not see (the CUDA context) is reported apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .capture import Capture
from .compat import StrEnum
from .graph import target_text

CUDA_BLOCK = 512  # bytes; c10 CUDACachingAllocator kMinBlockSize


class Category(StrEnum):
    """What a live storage is.  Members are strings (``Category.SAVED == "saved"``)."""

    PARAMETER = "parameter"
    BUFFER = "buffer"
    KV_CACHE = "kv_cache"  # generation: the keys and values of past tokens (transformers' Cache)
    INPUT = "input"
    OPTIMIZER_STATE = "optimizer_state"
    GRADIENT = "gradient"
    SAVED = "saved"  # held by autograd for backward at the end of the forward pass
    WORKSPACE = "workspace"  # CUDA library memory no op returns (cuBLAS, cuDNN, kernel temporaries)
    TEMPORARY = "temporary"  # everything else: intermediate values
    ALLOCATOR = "allocator"  # CUDA: cached blocks handed out whole, beyond the requests (estimator.allocator)


# Precedence when a storage falls in several categories (an input saved for backward is an input).
CATEGORIES = tuple(Category)

# What a GPU must have beyond what PyTorch's caching allocator reserves, reported as the reserve of CUDA targets.
CUDA_RESERVE = {
    # The CUDA context outside the caching allocator: the driver and the loaded kernels of CUDA, cuBLAS and
    # cuDNN.  Measured on one H100 80GB HBM3 (torch 2.11, CUDA 13.0, cuDNN 9.19; benchmarks/record_context.py,
    # tests/data/h100_loops/context.jsonl): total - free - memory_reserved() is 527 MiB after CUDA's
    # initialisation and 767-773 MiB once a training step has loaded cuBLAS and cuDNN (six models).
    "cuda_context": 773 << 20,
}
# The planners' first guess of the caching allocator's need beyond its allocated peak (blocks it cannot hand
# to a large request), as a fraction of the peak, where no allocator simulation is at hand (an interpolated
# size, a ZeRO layout laid out by hand).  Every answer a trace confirms uses the simulation instead
# (:func:`allocator_need`).
FRAGMENTATION = 0.025


def needed_for_peak(peak: int) -> int:
    """A first guess of what a GPU must have for a step whose caching-allocator peak
    (``max_memory_allocated``) is ``peak``: the peak, :data:`FRAGMENTATION` of it and the CUDA context.
    Searches locate their answer with it and confirm it with the allocator simulation of a trace
    (:func:`gpu_bytes_needed`)."""
    return peak + sum(CUDA_RESERVE.values()) + int(FRAGMENTATION * peak)


def gpu_bytes_needed(profile: "MemoryProfile") -> int:
    """What a GPU must have for the step to run: on a CUDA target, the smallest capacity at which the
    simulated caching allocator runs the load and two steps (:func:`allocator_need`; the ``fragmentation``
    row is what it needs beyond the higher peak) plus the CUDA context (:data:`CUDA_RESERVE`)."""
    return max(profile.peak, profile.peak_first_step) + sum(profile.reserve.values())


def round_cuda(nbytes: int) -> int:
    """Bytes the CUDA caching allocator hands out for a request of ``nbytes`` (0 stays 0)."""
    if nbytes <= 0:
        return 0
    return -(-nbytes // CUDA_BLOCK) * CUDA_BLOCK


@dataclass
class Snapshot:
    """Live bytes by category just after one op."""

    index: int  # index into Capture.nodes (-1: before the first op)
    phase: str
    module: str
    op: str
    total: int
    by_category: dict[str, int]


@dataclass
class MemoryProfile:
    peak: int  # steady-state iteration
    peak_first_step: int
    peak_at: Snapshot  # steady state
    peak_first_step_at: Snapshot
    timeline: list[Snapshot]  # steady state, one point per op
    device: str
    reserve: dict[str, int] = field(default_factory=dict)
    workspaces: dict[str, int] = field(default_factory=dict)  # persistent library workspaces (name -> bytes)
    peak_reserved: int | None = None  # CUDA: max_memory_reserved() of the simulated allocator, steady state
    out_of_memory: Snapshot | None = None  # CUDA with a capacity: where the simulated allocator ran out
    # simulated with need=False: computes the ``fragmentation`` need later from this run's allocator traces
    # (what :func:`fragmentation` computes from scratch)
    deferred_need: Callable[[], int] | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        at = self.peak_at
        return {
            "peak": self.peak,
            "peak_first_step": self.peak_first_step,
            "peak_phase": at.phase,
            "peak_module": at.module,
            "peak_op": at.op,
            "peak_breakdown": {str(getattr(k, "value", k)): v for k, v in at.by_category.items()},  # plain keys
            "allocator": "cuda caching allocator (simulated)" if self.device == "cuda" else "exact bytes",
            "reserve": dict(self.reserve),
            "workspaces": dict(self.workspaces),
            "peak_reserved": self.peak_reserved,
        }


def categories(cap: Capture) -> list[Category]:
    """The category of every storage of ``cap`` (index: storage id), by :data:`CATEGORIES` precedence."""
    cat = [Category.TEMPORARY] * len(cap.storage_bytes)
    for name in reversed(CATEGORIES[:-1]):  # earlier categories win
        for sid in cap.sids.get(name, ()):
            cat[sid] = name
    return cat


def _replay(events: list[tuple[int, int, int]], sizes: list[int], cats: list[str], preallocated: set[int],
            timeline: bool):
    """Replay the events; storages in ``preallocated`` are live from the start."""
    live = {c: 0 for c in CATEGORIES}
    for sid in preallocated:
        live[cats[sid]] += sizes[sid]
    total = sum(live.values())
    best = (total, -1, dict(live))
    points: list[tuple[int, int, dict[str, int]]] = []
    last_index = -1
    for index, sid, delta in events:
        if delta > 0 and sid in preallocated:
            continue
        if timeline and index != last_index:
            points.append((last_index, total, dict(live)))
            last_index = index
        size = sizes[sid] if delta > 0 else -sizes[sid]
        live[cats[sid]] += size
        total += size
        if total > best[0]:
            best = (total, index, dict(live))
    if timeline:
        points.append((last_index, total, dict(live)))
    return best, points


def carried_gradients(cap: Capture) -> tuple[int, list[int]] | None:
    """``(index, gradient sids)`` when the loop frees the gradients before the backward (``zero_grad=
    "before_backward"``): the previous step's gradients, one storage per gradient of this step, live from the start
    of the steady-state step and are freed after the op of ``index`` (the last before the first backward op); None
    when the loop frees them after the step (nothing carried) or the step has no backward."""
    if cap.zero_grad != "before_backward":
        return None
    first = next((i for i, n in enumerate(cap.nodes) if n.meta.get("phase") == "backward"), None)
    grads = sorted(set(cap.sids.get("gradient", ())) - added_into(cap))  # (those no zero_grad reaches: kept apart)
    if first is None or not grads:
        return None
    return first - 1, grads


def added_into(cap: Capture) -> set[int]:
    """Gradients kept, the next backward adding into them (``grad += new``): the parameters' when zeroed in place;
    inputs' (fed again) and those of parameters outside the optimizer always: no ``optimizer.zero_grad()`` frees them."""
    kept = set(cap.sids.get("input_gradient", ())) | set(cap.sids.get("gradient_kept", ()))
    return kept | set(cap.sids.get("gradient", ())) if cap.zero_grad == "in_place" else kept


def _added_in_place(events: list[tuple[int, Any, int]], sizes: list[int], cats: list[str], previous: set[int],
                    cap: Capture) -> list[tuple[int, Any, int]]:
    """The steady-state events of a loop whose gradients are kept and added into (:func:`added_into`): one
    storage per kept gradient, live from the start and never freed (added to ``sizes``, ``cats`` and
    ``previous``), and each such gradient this step makes a temporary of its size, freed after the op that makes it
    (AccumulateGrad adds it into the kept gradient: ``grad += new``)."""
    temp: dict[int, int] = {}
    for sid in sorted(added_into(cap)):
        sizes.append(sizes[sid])
        cats.append(Category.GRADIENT)
        previous.add(len(sizes) - 1)
        sizes.append(sizes[sid])
        cats.append(Category.TEMPORARY)
        temp[sid] = len(sizes) - 1
    return in_place_events(events, temp)


def in_place_events(events: list[tuple[int, Any, int]], temp: dict[int, Any]) -> list[tuple[int, Any, int]]:
    """``events`` with each storage of ``temp`` (a gradient -> its temporary's id) allocated as its temporary and
    freed after all of the op's events, its other events dropped."""
    out: list[tuple[int, Any, int]] = []
    pending: list[tuple[int, Any, int]] = []  # the op's new gradients, freed after all of its events
    for index, sid, delta in events:
        if pending and pending[0][0] != index:
            out += pending
            pending = []
        if sid not in temp:
            out.append((index, sid, delta))
        elif delta > 0:
            out.append((index, temp[sid], delta))
            pending.append((index, temp[sid], -delta))
    return out + pending


def with_carried(events: list[tuple[int, Any, int]], index: int, frees: list[tuple[int, Any, int]]) -> list:
    """``events`` with ``frees`` (each at ``index``) after every event of an op up to ``index``."""
    at = next((k for k, e in enumerate(events) if e[0] > index), len(events))
    return events[:at] + frees + events[at:]


def _snapshot(cap: Capture, index: int, total: int, by_category: dict[str, int]) -> Snapshot:
    if index < 0:
        return Snapshot(index, "start", "", "", total, by_category)
    node = cap.nodes[index]
    return Snapshot(index, node.meta.get("phase", ""), node.meta.get("module", ""), target_text(node.target), total,
                    by_category)


def with_library_memory(cap: Capture, target: Any, sizes: list[int], cats: list[str], library: Any = None):
    """The events of ``cap`` with the CUDA libraries' memory (:mod:`estimator.workspace`) inserted:
    each op's temporaries allocated after its outputs and freed before anything else happens, and the
    persistent workspaces allocated at the op that first needs them.  ``sizes`` and ``cats`` are
    extended with the new storages; returns (events, persistent storage ids, {name: bytes}).
    ``library``: that memory when the caller has it (a :class:`~estimator.workspace.LibraryMemory`
    interpolated to another size), else :func:`~estimator.workspace.library_memory` of ``cap``."""
    from .workspace import library_memory

    lib = library if library is not None else library_memory(cap, target)
    for sid, nbytes in lib.resize.items():
        sizes[sid] = nbytes
    extra: dict[int, list[tuple[int, int, int]]] = {}

    def new(nbytes: int) -> int:
        sizes.append(nbytes)
        cats.append(Category.WORKSPACE)
        return len(sizes) - 1

    persistent: set[int] = set()
    named: dict[str, int] = {}
    for index, nbytes, what in lib.persistent:
        sid = new(nbytes)
        persistent.add(sid)
        named[what] = nbytes
        extra.setdefault(index, []).append((index, sid, nbytes))
    for index, nbytes in lib.transients.items():
        sid = new(nbytes)
        extra.setdefault(index, []).extend([(index, sid, nbytes), (index, sid, -nbytes)])
    if not extra:
        return list(cap.events), persistent, named
    pending = sorted(extra)
    out: list[tuple[int, int, int]] = []
    p = 0
    for event in cap.events:
        index, _, delta = event
        while p < len(pending) and (pending[p] < index or (pending[p] == index and delta < 0)):
            out.extend(extra[pending[p]])
            p += 1
        out.append(event)
    for k in pending[p:]:
        out.extend(extra[k])
    return out, persistent, named


def _load_order(cap: Capture) -> list[str]:
    """Parameter and buffer names in the order ``model.to("cuda")`` moves them: ``Module._apply`` visits
    a module's children first, then its own parameters, then its own buffers."""
    tree: dict[str, list[str]] = {}
    for path in cap.module_types:
        if path:
            tree.setdefault(path.rpartition(".")[0], []).append(path)
    own: dict[str, list[str]] = {}
    for name in list(cap.params) + list(cap.buffers):
        own.setdefault(cap.param_owner[name], []).append(name)
    order: list[str] = []

    def visit(path: str) -> None:
        for child in tree.get(path, ()):
            visit(child)
        order.extend(own.get(path, ()))

    visit("")
    seen = set(order)
    return order + [n for n in list(cap.params) + list(cap.buffers) if n not in seen]


def _allocator_streams(cap: Capture, events: list[tuple[int, int, int]], raw: list[int], persistent: set[int],
                       held: set[int]) -> list[list[tuple[int, object, int]]]:
    """The event streams the caching allocator replays: the model's load, then for each of a first and a
    second (steady-state) step its events and what the loop drops at its end.

    Storages of the model, the inputs, the optimizer state and the library workspaces persist from
    the step that makes them; every other storage is the step's own (a new block each step).  At the
    end of a step the loop drops what it no longer holds: the gradients (``zero_grad(set_to_none=
    True)``), the output, everything but ``held`` (the loss kept for logging, or in inference the
    output kept until the next one replaces it).  The previous step's gradients, when the loop frees them before the
    backward (:func:`carried_gradients`), are not dropped at the end of the first step: the second frees them there."""
    carry = carried_gradients(cap)
    names = {n.target: n.meta["storage"][0] for n in cap.records if n.op == "placeholder"}
    loaded: list[int] = []
    for name in _load_order(cap):
        sid = names.get(f"param_{name}", names.get(f"buffer_{name}"))
        if sid is not None and sid not in loaded:
            loaded.append(sid)
    at_start = [sid for index, sid, delta in events if index < 0 and delta > 0]
    # a constant the forward makes (``torch.tensor(...)`` in the model's code) and the step frees is
    # made again by every step; inputs and the rest of what exists before the step stay
    remade = {sid for index, sid, delta in events if index >= 0 and delta < 0} & set(at_start) - set(loaded)
    loaded += [sid for sid in at_start if sid not in set(loaded) and sid not in remade]  # inputs, constants
    before_loop = set(cap.sids.get("before_loop", ()))  # made with the optimizer, before the loop
    loaded += [sid for sid in sorted(before_loop) if sid not in set(loaded)]
    stays = set(loaded) | set(cap.sids.get("optimizer_state", ())) | persistent
    # zero_grad(set_to_none=False): the first step's gradients stay; the second's are temporaries added into them,
    # each freed after its op (in_place_events, as the live-byte replay has them)
    in_place = added_into(cap)
    streams: list[list[tuple[int, object, int]]] = [[(-2, sid, raw[sid]) for sid in loaded]]
    for step in (1, 2):
        stream, live = [], set()
        for index, sid, delta in (in_place_events(events, {g: g for g in in_place}) if step == 2 else events):
            if (index < 0 and delta > 0 and sid not in remade) or not raw[sid] or (delta > 0 and sid in before_loop):
                continue  # loaded above; or takes no memory on the device
            key = sid if sid in stays else (step, sid)
            if delta > 0:
                if step == 2 and sid in stays:
                    continue  # made by the first step and kept
                live.add(key)
                stream.append((index, key, raw[sid]))
            else:
                live.discard(key)
                stream.append((index, key, -raw[sid]))
        end = len(cap.nodes)
        kept = set(held) | (set(carry[1]) if carry is not None and step == 1 else set()) | in_place
        if carry is not None and step == 2:  # the first step's gradients, freed by zero_grad before this backward
            stream = with_carried(stream, carry[0], [(carry[0], (1, sid), -raw[sid]) for sid in carry[1] if raw[sid]])
        drop = [(end, key, -raw[key[1]]) for key in sorted(k for k in live if isinstance(k, tuple)
                                                            and k[1] not in kept)]
        streams += [stream, drop]
    return streams


def _allocator_run(streams: list[list[tuple[int, object, int]]], capacity: int | None = None,
                   every: list | None = None) -> tuple[list, int]:
    """The caching allocator of ``capacity`` bytes over :func:`_allocator_streams`: the traces of the two
    steps (fewer where the load or a step runs out of memory; the load's alone where it does), and the
    most it reserved over the run.  ``every``: a list that gets the trace of each stream run, in order."""
    from .allocator import Allocator, Replay

    sim = Replay(Allocator(capacity))
    every = every if every is not None else []
    load = sim.run(streams[0])
    every.append(load)
    if load.oom is not None:
        return [load], load.peak_reserved
    traces, most = [], load.peak_reserved
    for stream, drop in (streams[1:3], streams[3:5]):
        traces.append(sim.run(stream))
        every.append(traces[-1])
        most = max(most, traces[-1].peak_reserved)
        if traces[-1].oom is not None:
            break
        every.append(sim.run(drop))
    return traces, most


def _shared_prefix(streams: list[list[tuple[int, object, int]]], low: int,
                   unlimited: list | None = None) -> tuple[int, int, Any]:
    """``(k, j, replay)``: the unlimited allocator after the events of ``streams`` before event ``j`` of stream ``k``,
    the last point where it has reserved no more than ``low`` bytes.  A run at any capacity of at least ``low``
    is this run up to there (its segments all fitted, so it released nothing), so it can start from a copy.

    The unlimited run reserves ever more (it never releases a segment): the first op after which it holds more
    than ``low`` is found on one run (``unlimited``: its traces, one per stream, when the caller has them), and
    the replay is made again up to that op's first event."""
    from .allocator import Allocator, Replay

    sim = Replay(Allocator())
    if unlimited is not None and len(unlimited) != len(streams):
        unlimited = None
    at = None
    for k, stream in enumerate(streams):
        trace = unlimited[k] if unlimited is not None else sim.run(stream)
        over = next((op for op, reserved in zip(trace.index, trace.reserved) if reserved > low), None)
        if over is not None:
            at = (k, next(j for j, event in enumerate(stream) if event[0] == over))
            break
    if at is None:  # never more than low: every run at least that large is the unlimited one
        at = (len(streams), 0)
    sim = Replay(Allocator())
    for stream in streams[:at[0]]:
        sim.run(stream)
    if at[0] < len(streams):
        sim.run(streams[at[0]][:at[1]])
    return at[0], at[1], sim


def allocator_need(streams: list[list[tuple[int, object, int]]], low: int, high: int, step: int = 8 << 20,
                   unlimited: list | None = None) -> int:
    """The smallest capacity (to ``step`` bytes, rounded up) at which the simulated caching allocator runs the model's
    load and two steps without running out of memory.  A failed ``cudaMalloc`` makes it free its cached
    blocks and retry (``release_cached_blocks``), so near the limit it needs less than it reserves when
    unlimited, and more than it allocates (free blocks inside segments still in use cannot serve a large
    request).  Bisection between ``low`` (the allocated peak) and ``high`` (what it reserves unlimited);
    a capacity at which it runs lowers ``high`` to the most it reserved there (the run at that capacity
    is the same one: every segment it reserved fitted, and every release it made is still forced).

    Checked on an H100 (tests/data/h100_loops/maxbatch.jsonl, tests/test_h100_loops.py): with the measured
    context, the largest micro-batches of GPT-2 124M bf16-mixed (53), BERT-base fp32 at 512 tokens (146) and
    a 155M Llama bf16-mixed (90) are the ones that ran, and one more ran out of memory.  ``streams``: the
    events the allocator replays (:func:`_allocator_streams`); ``unlimited``: the traces of their unlimited run,
    one per stream (``_allocator_run(streams, every=...)``), when the caller has them."""

    low = min(low, high)
    start: list = []  # (stream, event, replay there), made at the first run

    def runs(capacity: int) -> int | None:
        """The most reserved at ``capacity`` when the load and both steps run, else None."""
        if not start:
            start.append(_shared_prefix(streams, low, unlimited))
        k0, j0, at = start[0]
        sim, most = at.clone(capacity), at.allocator.reserved  # the most so far: it only grew
        for k in range(k0, len(streams)):
            trace = sim.run(streams[k][j0:] if k == k0 else streams[k])
            if trace.oom is not None:
                return None
            most = max(most, trace.peak_reserved)
        return most

    guess = low + (low >> 3)  # within 12.5 % of the allocated peak in every step measured (4.2-10.9 %)
    if guess < high:
        most = runs(guess)
        if most is not None:
            high = min(guess, most)
        else:
            low = guess
    while high - low > step:
        mid = (low + high) // 2
        most = runs(mid)
        low, high = (low, min(mid, most)) if most is not None else (mid, high)
    return high


def _fragmentation(streams: list, traces, every: list | None = None) -> int:
    """What the simulated caching allocator needs beyond its allocated peak (:func:`allocator_need`), given
    the ``traces`` of its unlimited run of ``streams`` (``every``: that run's trace of each stream)."""
    high = max(t.peak_allocated for t in traces)
    return max(0, allocator_need(streams, high, max(t.peak_reserved for t in traces), unlimited=every) - high)


def fragmentation(cap: Capture, target: Any = None) -> int:
    """The ``fragmentation`` reserve of :func:`simulate` on the CUDA device with ``need=True``, on its own:
    for a trace simulated with ``need=False`` whose fit is asked later (a search's points are not)."""
    from .target import CudaTarget

    raw = list(cap.storage_bytes)
    events, persistent, _ = with_library_memory(cap, target or CudaTarget(), raw, categories(cap))
    held = set(cap.sids.get("loss") or cap.sids.get("output", set()))
    streams = _allocator_streams(cap, events, raw, persistent, held)
    every: list = []
    return _fragmentation(streams, _allocator_run(streams, every=every)[0], every)


def simulate(cap: Capture, device: str = "cuda", resize: dict[int, int] | None = None,
             target: Any = None, allocator: bool = True, capacity: int | None = None,
             need: bool = True, library: Any = None) -> MemoryProfile:
    """Peak and timeline of one training step, first and steady-state iterations.

    ``resize`` (storage id -> bytes) replaces some storages' sizes: a what-if on the same
    lifetimes (see :func:`estimator.precision.fp8_what_if`).  For ``device="cuda"`` the memory
    the CUDA libraries take (:mod:`estimator.workspace`) is part of the timeline, for ``target``
    (a :class:`~estimator.target.CudaTarget`; default: an H100 with this torch), and the peaks are
    those of the caching allocator (``allocator=False``: every request rounded to 512 bytes, no
    block left whole; faster, for searches).  ``capacity``: the bytes the allocator may reserve on
    the GPU; the profile then says where (if anywhere) the load or a step runs out of memory.  ``need``:
    the reserve's ``fragmentation`` is the simulated allocator's need (:func:`allocator_need`), else the
    :data:`FRAGMENTATION` guess (a step whose fit nothing asks).  ``library``: the CUDA libraries'
    memory to insert (:func:`with_library_memory`), when not that of ``cap`` at its traced sizes."""
    raw = list(cap.storage_bytes)
    cats = categories(cap)
    events, persistent, workspaces = list(cap.events), set(), {}
    if device == "cuda":
        from .target import CudaTarget

        events, persistent, workspaces = with_library_memory(cap, target or CudaTarget(), raw, cats, library)
    for sid, nbytes in (resize or {}).items():
        raw[sid] = nbytes
    sizes = [round_cuda(n) for n in raw] if device == "cuda" else list(raw)
    # (and the state the optimizer's constructor made, before the loop: Adagrad's sums, the EMA's copy)
    pre_first = {sid for index, sid, delta in events if index < 0 and delta > 0} | set(cap.sids.get("before_loop", ()))
    # what the previous iteration left referenced: its loss (training) or its output (inference)
    held = set(cap.sids.get("loss") or cap.sids.get("output", set()))
    streams = (_allocator_streams(cap, events, raw, persistent, held)
               if device == "cuda" and (allocator or capacity) else None)
    every: list = []  # the trace of each stream
    traces = _allocator_run(streams, capacity, every)[0] if streams is not None else None
    oom = None
    if traces is not None and traces[-1].oom is not None:
        failed = traces[-1].oom
        oom = _snapshot(cap, failed.index, failed.allocated, {}) if failed.index >= 0 else \
            Snapshot(-1, "load", "", "", failed.allocated, {})
    first, _ = _replay(events, sizes, cats, pre_first, timeline=False)
    previous = set()
    for sid in sorted(held):
        sizes.append(sizes[sid])
        cats.append(Category.TEMPORARY)
        previous.add(len(sizes) - 1)
    steady_events = events
    carry = carried_gradients(cap)
    if added_into(cap):  # kept (zeroed in place, or an input's): the previous step's gradients live through this
        steady_events = _added_in_place(events, sizes, cats, previous, cap)  # one, its new ones added into them
    if carry is not None:  # the previous step's gradients, live until zero_grad before this step's backward
        frees = []
        for sid in carry[1]:
            sizes.append(sizes[sid])
            cats.append(Category.GRADIENT)
            previous.add(len(sizes) - 1)
            frees.append((carry[0], len(sizes) - 1, -1))
        steady_events = with_carried(steady_events, carry[0], frees)
    steady_pre = pre_first | set(cap.sids.get("optimizer_state", ())) | persistent | previous
    steady, points = _replay(steady_events, sizes, cats, steady_pre, timeline=True)
    reserve: dict[str, int] = {}
    reserved = deferred = None
    if traces is not None and len(traces) == 2:
        first = _with_allocator(first, traces[0], events)
        steady, points = _with_allocator(steady, traces[1], events, points)
        reserved = traces[1].peak_reserved
    if device == "cuda":
        reserve = dict(CUDA_RESERVE)
        high = max(steady[0], first[0])
        if need and traces is not None and len(traces) == 2 and capacity is None:
            reserve["fragmentation"] = _fragmentation(streams, traces, every)
        else:
            reserve["fragmentation"] = int(FRAGMENTATION * high)
            if traces is not None and len(traces) == 2 and capacity is None:
                deferred = lambda: _fragmentation(streams, traces, every)  # noqa: E731
    return MemoryProfile(
        peak=steady[0],
        peak_first_step=first[0],
        peak_at=_snapshot(cap, steady[1], steady[0], steady[2]),
        peak_first_step_at=_snapshot(cap, first[1], first[0], first[2]),
        timeline=[_snapshot(cap, i, t, c) for i, t, c in points],
        device=device,
        reserve=reserve,
        workspaces=workspaces,
        peak_reserved=reserved,
        out_of_memory=oom,
        deferred_need=deferred,
    )


def _with_allocator(best, trace, events, points=None):
    """The replay's peak (and timeline) with the allocator's totals: the peak is ``max_memory_allocated``
    of the simulated allocator, at the op where it is reached; the blocks it hands out beyond the
    requests show as the ``allocator`` category."""
    index = trace.peak_allocated_index if trace.peak_allocated_index is not None else best[1]
    after = dict(zip(trace.index, trace.allocated))
    breakdown = dict(best[2]) if index == best[1] else None
    if points is not None:
        timeline = []
        for i, total, live in points:
            measured = after.get(i, total)
            live = dict(live)
            live[Category.ALLOCATOR] = max(0, measured - total)
            timeline.append((i, max(total, measured), live))
            if i == index and breakdown is None:
                breakdown = dict(live)
        points = timeline
    if breakdown is None:
        breakdown = dict(best[2])
    breakdown[Category.ALLOCATOR] = 0
    breakdown[Category.ALLOCATOR] = max(0, trace.peak_allocated - sum(breakdown.values()))
    result = (trace.peak_allocated, index, breakdown)
    return (result, points) if points is not None else result

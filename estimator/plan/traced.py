"""A traced step read for planning: every storage's row in the per-GPU table, the collectives,
and the replay of the memory timeline with those rows.

The rows partition the storages, so at any point of the step (the peak included) they add up
to the live total.  Each storage's row is :func:`estimator.memory.categories`'s category,
refined only for the storages memory counts as saved or temporary:

* ``gathered_parameters``: FSDP2's unsharded parameters (the all-gather outputs it copies the
  parameters into, freed and re-allocated in place each time a unit is resharded and unsharded);
* ``comm_buffers``: FSDP2's flat all-gather and reduce-scatter buffers, and the storages an
  engine set up before the step (DDP's gradient buckets);
* ``weight_copies``: autocast's low-precision copies of the weights (cached for the forward pass);
* ``activations``: the rest of what autograd saves for backward; ``temporaries``: the rest;
* ``workspaces``: what the libraries and the caching allocator add at the peak (CUDA: cuBLAS and
  cuDNN workspaces, kernel temporaries, blocks handed out whole; both: the previous step's loss): :func:`estimator.memory.simulate`'s
  peak of the traced step minus the replay of its storages, so the rows add up to memory's peak.
"""

from __future__ import annotations

import operator
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.utils._pytree as pytree

from ..capture import Capture
from ..graph import OpNode
from ..memory import (CUDA_BLOCK, Category, MemoryProfile, carried_gradients, categories, in_place_events,
                      round_cuda, simulate, with_carried)
from ..memory import fragmentation as memory_fragmentation
from ..tally import Tally

ROWS = ("parameters", "gradients", "optimizer_state", "gathered_parameters", "weight_copies", "comm_buffers",
        "activations", "temporaries", "inputs_and_buffers", "workspaces")
ROW_TITLES = {
    "parameters": "Parameters (this rank)",
    "gradients": "Gradients",
    "optimizer_state": "Optimizer state",
    "gathered_parameters": "Gathered parameters (FSDP)",
    "weight_copies": "Low-precision weight copies",
    "comm_buffers": "Communication buffers",
    "activations": "Activations (saved for backward)",
    "temporaries": "Temporaries",
    "inputs_and_buffers": "Inputs and buffers",
    "workspaces": "CUDA workspaces and allocator rounding",
}
_FROM_CATEGORY = {
    Category.PARAMETER: "parameters", Category.BUFFER: "inputs_and_buffers", Category.INPUT: "inputs_and_buffers",
    Category.OPTIMIZER_STATE: "optimizer_state", Category.GRADIENT: "gradients", Category.SAVED: "activations",
    Category.TEMPORARY: "temporaries",
}
_REFINABLE = ("activations", "temporaries")


def _op_name(node: OpNode) -> str:
    packet = getattr(node.target, "overloadpacket", None)
    return str(packet) if packet is not None else str(node.target)


@dataclass(frozen=True)
class Collective:
    """One collective of the traced step, as this rank runs it."""

    kind: str  # all_gather, reduce_scatter, all_reduce, broadcast, all_to_all
    nbytes: int  # S: the full buffer (all-gather output, reduce-scatter input, all-reduce tensor)
    group_size: int
    nodes: int = 1  # the nodes the group's ranks sit in
    per_node: int = 1  # the most ranks of the group in one node (each with its own NIC rail)
    tp: bool = False  # on this rank's tensor-parallel group

    @property
    def spans_nodes(self) -> bool:
        """The group's ranks sit in more than one node (inter-node link)."""
        return self.nodes > 1


_COLLECTIVE_KINDS = {
    "c10d._allgather_base_": "all_gather", "c10d.allgather_": "all_gather",
    "c10d.allgather_into_tensor_coalesced_": "all_gather",
    "c10d._reduce_scatter_base_": "reduce_scatter", "c10d.reduce_scatter_": "reduce_scatter",
    "c10d.reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "c10d.allreduce_": "all_reduce", "c10d.allreduce_coalesced_": "all_reduce", "c10d.broadcast_": "broadcast",
    "c10d.alltoall_base_": "all_to_all",
    "_c10d_functional.all_gather_into_tensor": "all_gather",
    "_c10d_functional.all_gather_into_tensor_coalesced": "all_gather",
    "_c10d_functional.reduce_scatter_tensor": "reduce_scatter",
    "_c10d_functional.reduce_scatter_tensor_coalesced": "reduce_scatter",
    "_c10d_functional.all_reduce": "all_reduce", "_c10d_functional.all_reduce_coalesced": "all_reduce",
    "_c10d_functional.all_to_all_single": "all_to_all", "_c10d_functional.broadcast": "broadcast",
}
COMM_BUFFER_OPS = frozenset({"fsdp.all_gather_copy_in", "fsdp.chunk_cat"})


def _nbytes(value: Any) -> int:
    total = 0
    for leaf in pytree.tree_leaves(value):
        if isinstance(leaf, OpNode):
            total += sum(s.nbytes for s in leaf.meta.get("spec", ()) if s is not None)
    return total


def find_collectives(cap: Capture, gpus_per_node: int, tp_ranks: frozenset[int] = frozenset()) -> dict[int, Collective]:
    """The collectives of ``cap`` (node index -> :class:`Collective`); call it while the (fake)
    process group of the trace is alive: each op's group is resolved to its ranks (``tp_ranks``: this rank's
    tensor-parallel group, whose collectives are marked)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    out: dict[int, Collective] = {}
    for i, node in enumerate(cap.nodes):
        kind = _COLLECTIVE_KINDS.get(_op_name(node))
        if kind is None:
            continue
        group = None
        pg_class = torch._C._distributed_c10d.ProcessGroup
        for a in (*node.args, *node.kwargs.values()):
            if isinstance(a, pg_class):
                group = a
            elif isinstance(a, torch.ScriptObject) and hasattr(pg_class, "unbox"):
                try:  # the c10d ops take the group boxed as a TorchScript object
                    group = pg_class.unbox(a)
                except (RuntimeError, TypeError):
                    pass
            elif isinstance(a, str) and _op_name(node).startswith("_c10d_functional"):
                try:
                    group = c10d._resolve_process_group(a)
                except (KeyError, RuntimeError, ValueError):
                    pass
        ranks = dist.get_process_group_ranks(group) if group is not None else [0]
        payload = node.args[0] if kind in ("all_reduce", "broadcast", "all_to_all") or \
            _op_name(node).startswith("_c10d_functional") else node.args[1 if kind == "reduce_scatter" else 0]
        nbytes = _nbytes(payload)
        if kind == "all_gather" and _op_name(node).startswith("_c10d_functional"):
            nbytes *= len(ranks)  # the input is this rank's part
        per_node = Counter(r // gpus_per_node for r in ranks)
        out[i] = Collective(kind, nbytes, len(ranks), len(per_node), max(per_node.values()),
                            tp=bool(tp_ranks) and set(ranks) == tp_ranks)
    return out


def storage_rows(cap: Capture) -> list[str]:
    """The per-GPU row of every storage of ``cap`` (index: storage id); see the module docstring."""
    rows = [_FROM_CATEGORY[c] for c in categories(cap)]
    engine = set(cap.sids.get("engine", ()))
    setup = {n.meta["storage"][0] for n in cap.records if n.op == "placeholder" and n.meta.get("kind") == "engine"}
    gathered: set[int] = {s for s in engine if s not in setup}  # re-allocated in place: FSDP2's unsharded params
    comm: set[int] = set(setup)
    params = {s for s, r in enumerate(rows) if r == "parameters"}
    copies: set[int] = set()
    for node in cap.nodes:
        name = _op_name(node)
        if name in COMM_BUFFER_OPS:
            comm.update(node.meta.get("storage", ()))
        elif name == "fsdp.split_with_sizes_copy":
            for a in pytree.tree_leaves((node.args, node.kwargs)):
                if isinstance(a, OpNode):
                    gathered.update(a.meta.get("storage", ()))
        elif node.target is torch.ops.aten._to_copy.default and node.meta.get("phase") == "forward" and node.args:
            src = node.args[0]
            src_sids = set(src.meta.get("storage", ())) if isinstance(src, OpNode) else set()
            if src_sids & (params | gathered):
                copies.update(node.meta.get("storage", ()))
        elif node.target is torch.ops.aten.copy_.default and len(node.args) > 1 and isinstance(node.args[1], OpNode):
            # FSDP2 over one rank (``FSDPParamGroup.wait_for_unshard``, world size 1): no all-gather, the
            # unsharded parameters copied from the sharded ones (or their cast) into the all-gather outputs
            src_sids = set(node.args[1].meta.get("storage", ()))
            dst = node.args[0].meta.get("storage", ()) if isinstance(node.args[0], OpNode) else ()
            if src_sids & (params | copies) and not set(dst) & params:
                gathered.update(dst)
    for group, row in ((copies, "weight_copies"), (gathered, "gathered_parameters"), (comm, "comm_buffers")):
        for sid in group:
            if rows[sid] in _REFINABLE:
                rows[sid] = row
    return rows


@dataclass
class Peak:
    total: int
    index: int  # node index (-1: before the first op)
    by_row: dict[str, int]


class Timeline:
    """A capture's allocation/free events as arrays, for replays at other storage sizes."""

    def __init__(self, cap: Capture, rows: Sequence[str]):
        events = cap.events
        self.n = len(cap.storage_bytes)
        pre = {sid for index, sid, delta in events if index < 0 and delta > 0}
        pre |= set(cap.sids.get("optimizer_state", ()))
        # the previous step's gradients when the loop frees them before the backward: storages n, n + 1, ... of
        # the sizes of this step's gradients (``carried``), live from the start, freed at zero_grad
        carry = carried_gradients(cap)
        self.carried = torch.tensor(carry[1] if carry else [], dtype=torch.long)
        if carry is not None:
            extra = list(range(self.n, self.n + len(carry[1])))
            events = with_carried(list(events), carry[0], [(carry[0], sid, -1) for sid in extra])
            pre |= set(extra)
            rows = list(rows) + [rows[sid] for sid in carry[1]]
            self.n += len(extra)
        elif cap.zero_grad == "in_place":  # set_to_none=False: this step's gradients kept from the start, never
            # freed (storages n, ...), each gradient the step makes a temporary (n + G, ...) freed after its op
            grads = sorted(cap.sids.get("gradient", ()))
            self.carried = torch.tensor(grads + grads, dtype=torch.long)
            kept, temp = range(self.n, self.n + len(grads)), range(self.n + len(grads), self.n + 2 * len(grads))
            events = in_place_events(list(events), dict(zip(grads, temp)))
            pre |= set(kept)
            rows = list(rows) + [rows[sid] for sid in grads] + ["temporaries"] * len(grads)
            self.n += 2 * len(grads)
        self.sid = torch.tensor([s for _, s, _ in events], dtype=torch.long)
        self.sign = torch.tensor([1 if d > 0 else -1 for _, _, d in events], dtype=torch.long)
        self.index = [i for i, _, _ in events]
        self.pre = torch.zeros(self.n, dtype=torch.bool)
        if pre:
            self.pre[list(pre)] = True
        # an allocation of a storage live from the start is not an event of the steady-state step
        self.skip = (self.sign > 0) & self.pre[self.sid] if len(events) else torch.zeros(0, dtype=torch.bool)
        self.row = torch.tensor([ROWS.index(r) for r in rows], dtype=torch.long)


def running_bytes(timeline: Timeline, sizes: Sequence[float], device: str, extra: dict[str, float] | None = None,
                  drop: frozenset[str] = frozenset()) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(bytes by row live from the start, each event's change, the live bytes after each event) of a timeline
    with each storage of ``sizes`` bytes: the optimizer state live from the start, each size rounded as the CUDA
    caching allocator does for ``device="cuda"``; ``extra``: storages live for the whole step (bytes by row);
    rows in ``drop`` count 0."""
    size = torch.round(torch.clamp(torch.as_tensor(sizes, dtype=torch.float64), min=0)).to(torch.long)
    if len(timeline.carried):  # the previous step's gradients: this step's sizes
        size = torch.cat([size, size[timeline.carried]])
    if device == "cuda":
        size = torch.where(size > 0, (size + CUDA_BLOCK - 1) // CUDA_BLOCK * CUDA_BLOCK, size)
    for r in drop:
        size[timeline.row == ROWS.index(r)] = 0
    extra_rows = torch.zeros(len(ROWS), dtype=torch.long)
    for r, b in (extra or {}).items():
        extra_rows[ROWS.index(r)] += round_cuda(int(round(b))) if device == "cuda" else int(round(b))
    start_rows = extra_rows.index_add(0, timeline.row[timeline.pre], size[timeline.pre])
    deltas = size[timeline.sid] * timeline.sign
    deltas[timeline.skip] = 0
    return start_rows, deltas, int(start_rows.sum()) + torch.cumsum(deltas, 0)


def replay(timeline: Timeline, sizes: Sequence[float], device: str, extra: dict[str, float] | None = None,
           drop: frozenset[str] = frozenset()) -> Peak:
    """The steady-state peak of a timeline with each storage of ``sizes`` bytes, by row.

    As :func:`estimator.memory.simulate`: the optimizer state is live from the start, each size is
    rounded as the CUDA caching allocator does for ``device="cuda"`` (:func:`~estimator.memory.round_cuda`),
    the peak is the first maximum.  ``extra`` adds storages live for the whole step (bytes by row);
    rows in ``drop`` live elsewhere (host memory) and count 0."""
    start_rows, deltas, running = running_bytes(timeline, sizes, device, extra, drop)
    start = int(start_rows.sum())
    best_index, best_rows = -1, start_rows
    total = start
    if len(deltas):
        k = int(torch.argmax(running))
        if int(running[k]) > start:
            total = int(running[k])
            best_index = timeline.index[k]
            best_rows = start_rows.index_add(0, timeline.row[timeline.sid[:k + 1]], deltas[:k + 1])
    return Peak(total, best_index, {r: int(best_rows[i]) for i, r in enumerate(ROWS)})


@dataclass
class Step:
    """A traced step at one size (batch or sequence), with what the planner reads from it."""

    cap: Capture
    tally: Tally
    profile: MemoryProfile
    rows: list[str]
    value: int | None = None  # the batch size (or sequence length) it was traced at
    collectives: dict[int, Collective] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    streams: dict[int, str] = field(default_factory=dict)  # node index -> the side stream it runs on
    _timeline: Timeline | None = field(default=None, repr=False)
    _library: dict[str, int] = field(default_factory=dict, repr=False)
    lazy_need: bool = field(default=False, repr=False)  # simulated with need=False: fragmentation() computes it
    cuda_target: Any = field(default=None, repr=False)  # the CudaTarget it was simulated for
    _fragmentation: int | None = field(default=None, repr=False)

    def fragmentation(self) -> int:
        """What the simulated caching allocator needs beyond the allocated peak on the CUDA device
        (:func:`estimator.memory.fragmentation`), computed when first asked: a search's points never are."""
        if self._fragmentation is None:
            if not self.lazy_need:
                self._fragmentation = self.profile.reserve.get("fragmentation", 0)
            elif self.profile.deferred_need is not None:  # the simulation's own allocator run, reused
                self._fragmentation = self.profile.deferred_need()
                self.profile.deferred_need = None  # (its event streams and traces are let go)
            else:
                self._fragmentation = memory_fragmentation(self.cap, self.cuda_target)
        return self._fragmentation

    def peak(self, device: str, sizes: Sequence[float] | None = None, extra: dict[str, float] | None = None,
             drop: frozenset[str] = frozenset()) -> Peak:
        """The steady-state peak at the traced sizes (or ``sizes``), by row (see :func:`replay`)."""
        if self._timeline is None:
            self._timeline = Timeline(self.cap, self.rows)
        pk = replay(self._timeline, self.cap.storage_bytes if sizes is None else sizes, device, extra, drop)
        library = self.library_bytes(device)
        if not library:
            return pk
        return Peak(pk.total + library, pk.index, {**pk.by_row, "workspaces": pk.by_row["workspaces"] + library})

    def first_step_peak(self, device: str, layout: Any) -> int:
        """The first step's peak at the traced sizes on ``device`` (the optimizer's state made inside its
        ``step()`` while the gradients live can top the steady state's), 0 where not simulated for it or not this
        ``layout``'s own (ZeRO's, laid out by hand on the single-device step; an offloaded one): a plan's fit is
        checked at the higher of the two, as an estimate's is (``estimator.memory.gpu_bytes_needed``)."""
        if not layout.traced or layout.offload or self.profile is None or self.profile.device != device:
            return 0
        return self.profile.peak_first_step

    def library_bytes(self, device: str) -> int:
        """The bytes the libraries and the caching allocator add to the traced step's peak on ``device``
        (the ``workspaces`` row; on CPU, the previous step's loss the loop still holds): the simulated
        peak (:func:`estimator.memory.simulate`) minus the replay of the step's own storages.  Taken
        from the traced size for replays at other sizes too; a search's answer is confirmed by tracing
        it, which measures its own."""
        if device not in self._library:
            if self._timeline is None:
                self._timeline = Timeline(self.cap, self.rows)
            own = replay(self._timeline, self.cap.storage_bytes, device).total
            simulated = self.profile.peak if self.profile.device == device else simulate(self.cap, device).peak
            self._library[device] = max(0, simulated - own)
        return self._library[device]

    def structure(self) -> tuple:
        """What must agree between two traces for their storages to be interpolated sid by sid: the ops,
        the rows, every allocation in order and the set of frees after each op (storages freed together,
        when a Python object holding several dies, may be freed in another order)."""
        cap = self.cap
        return (len(cap.nodes), len(cap.storage_bytes), tuple(self.rows),
                tuple((i, s) for i, s, d in cap.events if d > 0),
                frozenset((i, s) for i, s, d in cap.events if d < 0))


def getitem_source(node: OpNode) -> OpNode:
    """The op record a ``getitem`` record takes its value from (itself otherwise)."""
    if node.target is operator.getitem and node.args and isinstance(node.args[0], OpNode):
        return node.args[0]
    return node

"""Which block of a stack of identical blocks each record, storage and event of a capture belongs to,
and each described relative to its block (:func:`check_alike`): what :mod:`.replicate` copies."""

from __future__ import annotations

import operator
from typing import Any

import torch

from ..graph import OpNode
from .blocks import Repeats
from .options import Capture

PARAM_KINDS = ("param_", "buffer_")


class NotReplicable(Exception):
    """The traced blocks do not run alike (or the trace has a shape the replication does not handle)."""


class Layout:
    """Which block each record, storage and event of a capture of ``n`` blocks belongs to."""

    def __init__(self, cap: Capture, repeats: Repeats, n: int):
        self.cap, self.repeats, self.n = cap, repeats, n
        self.index = {id(node): i for i, node in enumerate(cap.nodes)}
        self.segment_of_node: list[tuple | None] = [None] * len(cap.nodes)
        self._segments()
        self.segment_of_record: dict[int, tuple | None] = {}
        self.records_of: dict[tuple, list[OpNode]] = {}
        for r in cap.records:
            if r.op == "placeholder":
                continue
            src = r.args[0] if r.target is operator.getitem and r.args and isinstance(r.args[0], OpNode) else r
            seg = self.segment_of_node[self.index[id(src)]] if id(src) in self.index else None
            self.segment_of_record[id(r)] = seg
            if seg is not None:
                self.records_of.setdefault(seg, []).append(r)
        self._owners()
        before = None
        for _ in range(4):  # per-block runs of optimizer ops, until the records they make are owned too
            for i, seg in enumerate(self.segment_of_node):
                if seg is not None and seg[0].startswith("opt"):
                    self.segment_of_node[i] = None
            for r in list(self.segment_of_record):
                seg = self.segment_of_record[r]
                if seg is not None and seg[0].startswith("opt"):
                    del self.segment_of_record[r]
            self.records_of = {k: v for k, v in self.records_of.items() if not k[0].startswith("opt")}
            if not self._optimizer_runs():
                break
            self._owners()
            now = tuple(self.segment_of_node)
            if now == before:
                break
            before = now

    # -- segments ---------------------------------------------------------------------------------
    def _block(self, node: OpNode) -> int | None:
        hit = self.repeats.block_of(node.meta.get("module", ""))
        return hit[0] if hit is not None else None

    def _segments(self) -> None:
        """Forward: block k's segment runs from after block k-1's last op to its own last op; backward
        likewise in reverse block order; each micro-step of gradient accumulation its own pass ("fwd",
        "bwd"; "fwd1", "bwd1"; ...); optimizer: runs of ops on one block's tensors."""
        cap, n = self.cap, self.n
        passes: dict[str, dict[int, list[int]]] = {}
        for i, node in enumerate(cap.nodes):
            b = self._block(node)
            if b is None:
                continue
            phase = node.meta.get("phase")
            kind = "bwd" if phase == "backward" else "fwd" if phase in ("forward", "loss") else None
            if kind is not None:
                step = node.meta.get("micro_step") or 0
                passes.setdefault(f"{kind}{step or ''}", {}).setdefault(b, []).append(i)
        if not passes or any(sorted(blocks) != list(range(n)) for blocks in passes.values()):
            raise NotReplicable("a block runs no op in a pass")
        self.training = any(kind.startswith("bwd") for kind in passes)
        for kind, ops in passes.items():
            backward = kind.startswith("bwd")
            order = list(reversed(range(n))) if backward else list(range(n))
            for j, k in enumerate(order):
                before = order[j - 1] if j else None
                start = ops[k][0] if before is None else ops[before][-1] + 1
                if before is not None and ops[k][0] <= ops[before][-1]:
                    raise NotReplicable(f"blocks interleave in a pass ({kind})")
                for i in range(start, ops[k][-1] + 1):
                    if self.segment_of_node[i] is not None:
                        raise NotReplicable("passes overlap")
                    self.segment_of_node[i] = (kind, k)
        # The blocks that start a pass (block 0 in forward, block n-1 in backward) have no block before
        # them, so their segment would start at their first op; an engine's ops for them (the all-gather of
        # their parameters) run in the head's region.  Their segments take as many ops before them as a
        # middle block's has (unless those belong to another segment), so that what the next block frees of
        # theirs is theirs.
        for kind, ops in passes.items():
            if kind.startswith("bwd"):
                self._extend_back(kind, n - 1, ops[n - 1][0], len(self.nodes_of(kind, n - 3)))
            else:
                self._extend_back(kind, 0, ops[0][0], len(self.nodes_of(kind, 1)))

    def _extend_back(self, kind: str, block: int, first: int, length: int) -> None:
        """Block ``block``'s segment of ``kind`` extended back over the ops before ``first`` (up to ``length`` in
        all), as long as they are the stack's container's (an engine's hooks on the block run there), not
        another module's (a rotary embedding computed before the first block is shared by all)."""
        end = max(i for i, seg in enumerate(self.segment_of_node) if seg == (kind, block))
        container = self.repeats.path
        for i in range(first - 1, max(-1, end - length), -1):
            module = self.cap.nodes[i].meta.get("module", "")
            if self.segment_of_node[i] is not None or not (module == "" or container.startswith(module + ".")):
                break
            self.segment_of_node[i] = (kind, block)

    def _blocks_read(self, node: OpNode, made_by: dict[int, int] | None = None) -> set[int]:
        """The blocks whose records ``node`` reads (``made_by``: blocks of records the optimizer made)."""
        found: set[int] = set()
        _owners_read(node.args, self.rec_owner, made_by, found)
        _owners_read(node.kwargs, self.rec_owner, made_by, found)
        return found

    def _optimizer_runs(self) -> bool:
        """Optimizer ops on one block's tensors (a parameter's state made, a per-parameter update) as the
        segments ("opt<pass>", block), a pass being one sweep over the parameters (a for-loop optimizer
        makes the state in one and updates in another): from after block b-1's last op of the pass to
        block b's last (so a state made from no tensor, ``torch.tensor(0.)`` for a step count, goes with
        the parameter after it).  Ops on several blocks' tensors (foreach) stay shared; their lists are
        extended."""
        passes: list[dict[int, list[int]]] = []
        previous: int | None = None
        made_by: dict[int, int] = {}  # id of a record an optimizer op made -> the block of the tensors it read
        outputs: dict[int, list[OpNode]] = {}
        for r in self.cap.records:
            if r.op != "placeholder" and r.target is operator.getitem and r.args and isinstance(r.args[0], OpNode):
                outputs.setdefault(id(r.args[0]), []).append(r)
        for i, node in enumerate(self.cap.nodes):
            if node.meta.get("phase") != "optimizer" or self.segment_of_node[i] is not None:
                continue
            blocks = self._blocks_read(node, made_by)
            if len(blocks) == 1:  # what it makes is that block's (exp_avg_sq.sqrt(): the block of exp_avg_sq)
                only = next(iter(blocks))
                for r in [node, *outputs.get(id(node), ())]:
                    made_by[id(r)] = only
            if len(blocks) > 1:  # a foreach op over every block: a new pass after it
                previous = None
                continue
            if not blocks:
                continue
            b = blocks.pop()
            if previous is None or b < previous:
                passes.append({})
            elif b != previous and b in passes[-1]:
                raise NotReplicable(f"the optimizer's ops on block {b} are not one run")
            passes[-1].setdefault(b, []).append(i)
            previous = b
        for k, runs in enumerate(passes):
            if sorted(runs) != list(range(self.n)):
                raise NotReplicable("an optimizer pass skips a block")
            for b in range(self.n):
                start = runs[b][0] if b == 0 else runs[b - 1][-1] + 1
                for i in range(start, runs[b][-1] + 1):
                    if self.segment_of_node[i] is not None or self._blocks_read(self.cap.nodes[i], made_by) - {b}:
                        raise NotReplicable(f"the optimizer's ops on block {b} are not one run")
                    self.segment_of_node[i] = (f"opt{k}", b)
        for r in self.cap.records:
            if r.op != "placeholder" and self.segment_of_record.get(id(r)) is None:
                src = r.args[0] if r.target is operator.getitem and r.args and isinstance(r.args[0], OpNode) else r
                seg = self.segment_of_node[self.index[id(src)]] if id(src) in self.index else None
                if seg is not None:
                    self.segment_of_record[id(r)] = seg
                    self.records_of.setdefault(seg, []).append(r)
        return bool(passes)

    def nodes_of(self, kind: str, block: int) -> list[int]:
        return [i for i, seg in enumerate(self.segment_of_node) if seg == (kind, block)]

    # -- owners -----------------------------------------------------------------------------------
    def kinds(self) -> tuple[str, ...]:
        """The kinds of segment present: fwd, bwd, opt0, opt1, ..."""
        return tuple(dict.fromkeys(seg[0] for seg in self.segment_of_node if seg is not None))

    def _owners(self) -> None:
        """``rec_owner`` (id of a record -> (block, role)) and ``sid_owner`` (storage id -> (block, role))."""
        cap = self.cap
        self.rec_owner: dict[int, tuple[int, tuple]] = {}
        self.sid_owner: dict[int, tuple[int, tuple]] = {}
        first_event: dict[int, int] = {}
        for index, sid, _ in cap.events:  # a storage's first event is its allocation (0 bytes for an empty one)
            first_event.setdefault(sid, index)
        for r in cap.records:
            if r.op != "placeholder":
                continue
            name = str(r.target)
            kind = next((k for k in PARAM_KINDS if name.startswith(k)), None)
            hit = self.repeats.block_of(name[len(kind):]) if kind else None
            if hit is not None:
                role = (kind, hit[1])
                self.rec_owner[id(r)] = (hit[0], role)
                self.sid_owner[r.meta["storage"][0]] = (hit[0], role)
        # Records and storages made in a segment are numbered from the segment's end: the first block's
        # segment has no gap before it (an engine's all-gather of it runs with the model's head), so only
        # from the end do "the previous block's output" of block 1 and of block 2 read alike.
        made: dict[tuple, list[int]] = {}
        for index, sid, delta in cap.events:  # storages made in a segment, in order of allocation
            if delta >= 0 and first_event.get(sid) == index and sid not in self.sid_owner and index >= 0:
                seg = self.segment_of_node[index]
                if seg is not None:
                    made.setdefault(seg, []).append(sid)
        for seg, sids in made.items():
            for k, sid in enumerate(sids):
                self.sid_owner[sid] = (seg[1], (seg[0], "sid", k - len(sids)))
        for seg, records in self.records_of.items():
            for k, r in enumerate(records):
                self.rec_owner[id(r)] = (seg[1], (seg[0], "rec", k - len(records)))
        self.first_event = first_event
        self._shared_constants()

    def _shared_constants(self) -> None:
        """Constants: tensors the model holds outside its parameters and buffers (a rotary table), or that
        an op meets without having made them (the alias autograd hands back of a saved one; FSDP2's
        padded shard of a parameter), recorded as placeholders when an op first reads them.

        A constant on a block's storage (a parameter's shard, a tensor the block made) is that block's,
        the j-th such alias of that storage; any other belongs to the one block that reads it (so each
        copy gets its own, as a full trace makes one per block) or, read by several, is shared.  A
        storage first met through constants that several blocks read (a rotary table) is shared."""
        readers: dict[int, set[int]] = {}  # constant record -> blocks reading it
        first: dict[int, tuple] = {}  # constant record -> the segment of its first reader
        storage_readers: dict[int, set[int]] = {}

        def visit(v: Any, seg: tuple) -> None:
            if isinstance(v, OpNode):
                if v.op == "placeholder" and v.meta.get("kind") == "constant":
                    readers.setdefault(id(v), set()).add(seg[1])
                    first.setdefault(id(v), seg)
                    storage_readers.setdefault(v.meta["storage"][0], set()).add(seg[1])
            elif isinstance(v, (list, tuple)):
                for x in v:
                    visit(x, seg)
            elif isinstance(v, dict):
                for x in v.values():
                    visit(x, seg)

        for r in self.cap.records:
            seg = self.segment_of_record.get(id(r))
            if seg is not None:
                visit(r.args, seg)
                visit(r.kwargs, seg)
        constants = [r for r in self.cap.records if r.op == "placeholder" and r.meta.get("kind") == "constant"]
        for r in constants:  # storages first met through constants, read by several blocks: shared
            sid = r.meta["storage"][0]
            owner = self.sid_owner.get(sid)
            if owner is not None and owner[1][1] == "sid" and len(storage_readers.get(sid, ())) > 1 \
                    and self.first_event.get(sid) is not None and self._made_by_constant(sid):
                del self.sid_owner[sid]
        aliases: dict[tuple, int] = {}
        own: dict[tuple, list[OpNode]] = {}
        for r in constants:
            sid = r.meta["storage"][0]
            owner = self.sid_owner.get(sid)
            if owner is not None:
                j = aliases.get(owner, 0)
                aliases[owner] = j + 1
                self.rec_owner[id(r)] = (owner[0], ("alias", owner[1], j))
            elif id(r) in first and len(readers[id(r)]) == 1:
                own.setdefault(first[id(r)], []).append(r)
        for seg, records in own.items():
            for k, r in enumerate(records):
                self.rec_owner[id(r)] = (seg[1], (seg[0], "const", k - len(records)))

    def _made_by_constant(self, sid: int) -> bool:
        """Whether ``sid`` was first allocated when a constant placeholder met it (no op made it)."""
        return any(r.op == "placeholder" and r.meta.get("kind") == "constant" and r.meta["storage"][0] == sid
                   for r in self._constant_firsts())

    def _constant_firsts(self) -> list[OpNode]:
        if not hasattr(self, "_firsts"):
            made_by_ops = {s for r in self.cap.records if r.op != "placeholder" for s in r.meta.get("storage", ())}
            self._firsts = [r for r in self.cap.records if r.op == "placeholder" and r.meta.get("kind") == "constant"
                            and r.meta["storage"][0] not in made_by_ops]
        return self._firsts


def _describe(value: Any, block: int | None, layout: Layout) -> Any:
    """A value of a record's arguments with every record replaced by its description relative to
    ``block`` (None: absolute)."""
    if isinstance(value, OpNode):
        owner = layout.rec_owner.get(id(value))
        if owner is None or block is None:
            if value.op == "placeholder" and value.meta.get("kind") == "constant":
                return ("const", _sid_description(value.meta["storage"][0], block, layout))
            return ("abs", id(value))
        return ("rel", owner[0] - block, owner[1])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_describe(v, block, layout) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _describe(v, block, layout)) for k, v in value.items()))
    if isinstance(value, torch.ScriptObject):  # a process group: the same group whatever the block
        return ("script", str(value._type()) if hasattr(value, "_type") else type(value).__name__)
    if isinstance(value, str) and block is not None:  # a profiler range named after the block ("FSDP::pre_forward
        return ("str", layout.repeats.relative_text(value, block))  # (layers.1)")
    return ("value", repr(value))


def _sid_description(sid: int, block: int | None, layout: Layout) -> tuple:
    owner = layout.sid_owner.get(sid)
    if owner is None or block is None:
        return ("abs", sid)
    return ("rel", owner[0] - block, owner[1])


def _record_description(r: OpNode, block: int, layout: Layout) -> tuple:
    meta = r.meta
    module = meta.get("module", "")
    hit = layout.repeats.block_of(module)
    rel_module = ("block", hit[0] - block, hit[1]) if hit is not None else ("abs", module)
    fwd = meta.get("forward_node")
    return (r.op, str(r.target), _describe(r.args, block, layout), _describe(r.kwargs, block, layout), rel_module,
            str(meta.get("phase")), meta.get("spec"), meta.get("stride"), "stream" in meta,
            tuple(_sid_description(s, block, layout) for s in meta.get("storage", ())),
            _describe(fwd, block, layout) if fwd is not None else None)


def check_alike(layout: Layout, a: int, b: int) -> None:
    """Blocks ``a`` and ``b`` run alike: their segments' records, storages and events have the same
    descriptions relative to each block; and what happens to their storages outside the block
    segments happens at the same places.  Raises :class:`NotReplicable` otherwise."""
    cap = layout.cap
    for kind in layout.kinds():
        ra, rb = layout.records_of.get((kind, a), []), layout.records_of.get((kind, b), [])
        if len(ra) != len(rb):
            raise NotReplicable(f"{kind} segments of blocks {a} and {b} differ in length")
        for x, y in zip(ra, rb):
            if _record_description(x, a, layout) != _record_description(y, b, layout):
                raise NotReplicable(f"{kind} ops of blocks {a} and {b} differ: {x.format_node()}")
    events: dict[int, list] = {}
    for index, sid, delta in cap.events:
        events.setdefault(index, []).append((sid, delta))
    for kind in layout.kinds():
        for i, j in zip(layout.nodes_of(kind, a), layout.nodes_of(kind, b)):
            ea = [(_sid_description(s, a, layout), d) for s, d in events.get(i, ())]
            eb = [(_sid_description(s, b, layout), d) for s, d in events.get(j, ())]
            if ea != eb:
                raise NotReplicable(f"events of blocks {a} and {b} differ at {cap.nodes[i].format_node()}")
    outside: dict[int, list] = {a: [], b: []}
    for index, sid, delta in cap.events:
        owner = layout.sid_owner.get(sid)
        if owner is None or owner[0] not in outside:
            continue
        if index < 0 or layout.segment_of_node[index] is None:
            outside[owner[0]].append((index, owner[1], delta))
    if sorted(outside[a], key=repr) != sorted(outside[b], key=repr):
        raise NotReplicable(f"storages of blocks {a} and {b} live differently outside the blocks")


def _owners_read(v: Any, rec_owner: dict, made_by: dict[int, int] | None, found: set[int]) -> None:
    """The blocks of the records in argument ``v`` into ``found`` (:meth:`Layout._blocks_read`; a module-level
    recursion: a nested function calling itself is a reference cycle per call)."""
    if isinstance(v, OpNode):
        owner = rec_owner.get(id(v))
        if owner is not None:
            found.add(owner[0])
        elif made_by is not None and id(v) in made_by:
            found.add(made_by[id(v)])
    elif isinstance(v, (list, tuple)):
        for x in v:
            _owners_read(x, rec_owner, made_by, found)
    elif isinstance(v, dict):
        for x in v.values():
            _owners_read(x, rec_owner, made_by, found)

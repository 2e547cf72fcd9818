"""A step of ``L`` identical blocks from a trace of six of them (``blocks.TRACED_BLOCKS``): the records of a
middle block copied ``L - 6`` times, as a trace of the whole model would have recorded them.

A model's step runs its stack of identical blocks (:mod:`.blocks`) as the same op sequence, block
after block in forward and in reverse in backward; everything a block makes or reads is either
its own (its parameters, what its ops produce), a neighbour's at a fixed distance (the residual
stream it takes from the block before, the gradient it takes from the block after, an engine's
prefetch of the next block's parameters) or shared by all (position embeddings, the attention
mask).  So the capture traces the first six blocks and builds the step of all ``L``:

* each record, storage and event of a block's segments (its forward ops, with the gap before them:
  an engine's all-gather; its backward ops, likewise; under gradient accumulation each micro-step's forward
  and backward are passes of their own) is described relative to the block: "the
  k-th storage made in my forward", "my parameter ``mlp.up.weight``", "the j-th record of the
  previous block's forward", or an absolute reference to something shared;
* the two middle blocks (2 and 3) must have the same descriptions, op for op and event for event,
  else nothing is replicated (a full trace is taken instead): that is the proof that a block's
  step does not depend on its index;
* block 3's segments are copied ``L - 6`` times between block 3 and block 4, each reference
  resolved against the copy's own neighbours; the last block now reads from the last copy; the
  optimizer's per-parameter ops of block 3 are copied likewise, and its multi-tensor (foreach)
  ops get the copies' tensors in their lists;
* storage ids are renumbered in order of allocation and records renamed in order, as a full trace
  numbers them.

The result is a :class:`~.options.Capture` indistinguishable from the full trace's for everything
downstream (tallies, memory, the caching allocator, timing, the planner's schedule); the tests
compare every number of both on models small enough to trace in full.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from ..graph import OpNode
from ..rules.registry import TensorSpec
from .block_layout import PARAM_KINDS, Layout, NotReplicable, check_alike
from .blocks import Repeats
from .options import Capture


_JOINS = (torch.ops.aten.stack.default, torch.ops.aten.cat.default)


class _Expansion:
    """The capture of ``count`` blocks built from a capture of ``n`` (see the module docstring): block
    ``t = n - 3`` is copied ``m = count - n`` times between itself and block ``t + 1``."""

    def __init__(self, layout: Layout, count: int):
        cap, n = layout.cap, layout.n
        self.layout, self.cap = layout, cap
        self.t, self.m = n - 3, count - n
        self.repeats = layout.repeats
        self.orig_rec: dict[tuple, OpNode] = {}
        for r in cap.records:
            owner = layout.rec_owner.get(id(r))
            if owner is not None:
                self.orig_rec[owner] = r
        self.orig_sid = {owner: sid for sid, owner in layout.sid_owner.items()}
        self._moved: dict[tuple[str, int], str] = {}  # (module path, blocks moved by) -> the moved path
        self.copy_rec: dict[tuple, OpNode] = {}
        self.copy_sid: dict[tuple, int] = {}
        self.sizes = list(cap.storage_bytes)
        self.dtypes = list(cap.storage_dtype)

    # -- block numbers ----------------------------------------------------------------------------------
    def expanded(self, b: int) -> int:
        return b if b <= self.t else b + self.m

    def _copy(self, e: int) -> bool:
        return self.t < e <= self.t + self.m

    def _original(self, e: int) -> int:
        return e if e <= self.t else e - self.m

    # -- resolving descriptions ------------------------------------------------------------------------
    def sid(self, e: int, role: tuple) -> int:
        if not self._copy(e):
            return self.orig_sid[(self._original(e), role)]
        key = (e, role)
        if key not in self.copy_sid:
            template = self.orig_sid[(self.t, role)]
            self.copy_sid[key] = len(self.sizes)
            self.sizes.append(self.sizes[template])
            self.dtypes.append(self.dtypes[template])
        return self.copy_sid[key]

    def record(self, e: int, role: tuple) -> OpNode:
        if not self._copy(e):
            return self.orig_rec[(self._original(e), role)]
        key = (e, role)
        if key not in self.copy_rec:
            if role[0] in PARAM_KINDS or role[1] == "const" or role[0] == "alias":
                self.copy_rec[key] = self._placeholder(e, role)
            else:
                raise NotReplicable(f"a record of block {e} is read before it is made")
        return self.copy_rec[key]

    def _placeholder(self, e: int, role: tuple) -> OpNode:
        template = self.orig_rec[(self.t, role)]
        meta = dict(template.meta)
        meta["module"] = self.repeats.renamed(meta.get("module", ""), e)
        sid = template.meta["storage"][0]
        owner = self.layout.sid_owner.get(sid)
        meta["storage"] = (self.sid(e, owner[1]) if owner is not None else sid,)
        name = str(template.target)
        kind = next((k for k in PARAM_KINDS if name.startswith(k)), None)
        target = kind + self.repeats.renamed(name[len(kind):], e) if kind else f"{name}_copy{e}"
        return OpNode("placeholder", "".join(c if c.isalnum() else "_" for c in target), target, meta=meta)

    def map_value(self, value: Any, ctx: int | None, e: int | None) -> Any:
        """``value`` with its records resolved: described relative to original block ``ctx`` and resolved
        for expanded block ``e`` (None: shared, left as it is)."""
        if isinstance(value, OpNode):
            owner = self.layout.rec_owner.get(id(value)) if ctx is not None else None
            return value if owner is None else self.record(e + owner[0] - ctx, owner[1])
        if isinstance(value, list):
            return [self.map_value(v, ctx, e) for v in value]
        if isinstance(value, tuple):
            return tuple(self.map_value(v, ctx, e) for v in value)
        if isinstance(value, dict):
            return {k: self.map_value(v, ctx, e) for k, v in value.items()}
        if isinstance(value, str) and ctx is not None:
            return self.repeats.moved_text(value, ctx, e)
        return value

    def map_sid(self, sid: int, ctx: int | None, e: int | None) -> int:
        owner = self.layout.sid_owner.get(sid) if ctx is not None else None
        return sid if owner is None else self.sid(e + owner[0] - ctx, owner[1])

    def map_meta(self, meta: dict, ctx: int | None, e: int | None) -> dict:
        out = dict(meta)
        out.pop("cost", None)
        if ctx is None:
            return out
        module = meta.get("module", "")
        key = (module, e - ctx)
        moved = self._moved.get(key)
        if moved is None:  # a few hundred module paths, each moved by a few distances: computed once
            hit = self.repeats.block_of(module)
            moved = self._moved[key] = self.repeats.renamed(module, e + hit[0] - ctx) if hit is not None else module
        if moved is not module:
            out["module"] = moved
        out["storage"] = tuple([self.map_sid(s, ctx, e) for s in meta.get("storage", ())])
        if meta.get("forward_node") is not None:
            out["forward_node"] = self.map_value(meta["forward_node"], ctx, e)
        return out

    # -- shared ops over every block's tensors (the optimizer's foreach lists) -------------------------
    def _runs(self, items: list, owner_of) -> list[tuple[int, int]]:
        """(start, end) of the runs of consecutive ``items`` that block t owns."""
        runs, start = [], None
        for i, item in enumerate(items + [None]):
            owned = item is not None and (owner_of(item) or (None,))[0] == self.t
            if owned and start is None:
                start = i
            elif not owned and start is not None:
                runs.append((start, i))
                start = None
        return runs

    def _extend(self, items: list, owner_of, resolve) -> list:
        """``items`` with, after each run that block t owns, the same run for every copy."""
        out, last = [], 0
        for start, end in self._runs(items, owner_of):
            out += items[last:end]
            for e in range(self.t + 1, self.t + self.m + 1):
                out += [resolve(e, owner_of(x)[1]) for x in items[start:end]]
            last = end
        return out + items[last:]

    def shared_args(self, value: Any) -> Any:
        """A shared op's arguments with every list that holds block t's records extended by the copies'."""
        if isinstance(value, (list, tuple)):
            items = [self.shared_args(v) for v in value]
            if any(isinstance(v, OpNode) for v in items):
                items = self._extend(items, lambda x: self.layout.rec_owner.get(id(x)) if isinstance(x, OpNode)
                                     else None, self.record)
            return type(value)(items)
        if isinstance(value, dict):
            return {k: self.shared_args(v) for k, v in value.items()}
        return value

    def shared_outputs(self, node: OpNode, getitems: list[OpNode]) -> list[OpNode]:
        """A shared op with one output per element of its first tensor list (``_foreach_sqrt``): the
        outputs of block t's elements get the copies' outputs after them (records, storages and
        positions in the op's metadata); the outputs become block-owned for the events that follow."""
        lists = [a for a in node.args if isinstance(a, (list, tuple)) and a and isinstance(a[0], OpNode)]
        if not getitems or not lists or len(lists[0]) != len(getitems):
            return getitems
        elements = lists[0]

        def owner_of(g: OpNode):
            return self.layout.rec_owner.get(id(elements[g.args[1]]))

        if not self._runs(list(getitems), owner_of):
            return getitems
        for g in getitems:  # the outputs of block t's elements: owned by it from here on
            owner = owner_of(g)
            if owner is not None and owner[0] == self.t:
                role = ("shared_out", id(node), owner[1])
                self.layout.sid_owner[g.meta["storage"][0]] = (self.t, role)
                self.orig_sid[(self.t, role)] = g.meta["storage"][0]
                self.layout.rec_owner[id(g)] = (self.t, role)
                self.orig_rec[(self.t, role)] = g

        def copy_output(e: int, role: tuple) -> OpNode:
            template = self.orig_rec[(self.t, role)]
            g = OpNode("call_function", template.name, operator.getitem, (node, -1),
                       meta={**template.meta, "storage": (self.sid(e, role),)})
            self.copy_rec[(e, role)] = g
            return g

        new_getitems = self._extend(list(getitems), lambda g: self.layout.rec_owner.get(id(g)), copy_output)
        spec = []
        for k, g in enumerate(new_getitems):
            g.args = (node, k)
            spec.append((g.meta["spec"][0], g.meta["stride"][0], g.meta["storage"][0]))
        node.meta["spec"] = tuple(s for s, _, _ in spec)
        node.meta["stride"] = tuple(s for _, s, _ in spec)
        node.meta["storage"] = tuple(s for _, _, s in spec)
        return new_getitems

    # -- the expanded step ------------------------------------------------------------------------------
    def _units(self) -> list[tuple[OpNode, list[OpNode]]]:
        """Each recorded op with the ``getitem`` records that follow it."""
        units: list[tuple[OpNode, list[OpNode]]] = []
        for r in self.cap.records:
            if r.op == "placeholder":
                continue
            if r.target is operator.getitem and units and r.args and r.args[0] is units[-1][0]:
                units[-1][1].append(r)
            else:
                units.append((r, []))
        return units

    def _copy_unit(self, node: OpNode, getitems: list[OpNode], e: int) -> tuple[OpNode, list[OpNode]]:
        t = self.t
        new = OpNode(node.op, node.name, node.target, self.map_value(node.args, t, e), self.map_value(node.kwargs, t, e),
                     self.map_meta(node.meta, t, e))
        self.copy_rec[(e, self.layout.rec_owner[id(node)][1])] = new
        outs = []
        for g in getitems:
            copy = OpNode(g.op, g.name, g.target, (new, g.args[1]), None, self.map_meta(g.meta, t, e))
            self.copy_rec[(e, self.layout.rec_owner[id(g)][1])] = copy
            outs.append(copy)
        return new, outs

    def build(self) -> Capture:
        layout, cap, t, m = self.layout, self.cap, self.t, self.m
        seg = layout.segment_of_node
        index = layout.index
        events: dict[int, list[tuple[int, int]]] = {}
        for i, sid, delta in cap.events:
            events.setdefault(i, []).append((sid, delta))
        units = self._units()
        template = {kind: [u for u in units if layout.segment_of_record.get(id(u[0])) == (kind, t)]
                    for kind in layout.kinds()}
        last = {kind: max(layout.nodes_of(kind, t)) for kind in layout.kinds()}
        # a backward pass's copies go before block t's segment (blocks run in reverse), the others' after it
        first_bwd = {min(layout.nodes_of(kind, t)): kind for kind in template if kind.startswith("bwd")}
        for p in (r for r in cap.records if r.op == "placeholder"):  # every copy has all of block t's parameters
            owner = layout.rec_owner.get(id(p))
            if owner is not None and owner[0] == t and owner[1][0] in PARAM_KINDS:
                for e in range(t + 1, t + m + 1):
                    self.record(e, owner[1])
        records: list[OpNode] = []
        nodes: list[OpNode] = []
        new_events: list[tuple[int, int, int]] = []

        def emit(node: OpNode, getitems: list[OpNode], node_events: list[tuple[int, int]]) -> None:
            nodes.append(node)
            records.append(node)
            records.extend(getitems)
            new_events.extend((len(nodes) - 1, sid, delta) for sid, delta in node_events)

        def emit_copies(kind: str, order) -> None:
            for e in order:
                for node, getitems in template[kind]:
                    new, outs = self._copy_unit(node, getitems, e)
                    emit(new, outs, [(self.map_sid(s, t, e), d) for s, d in events.get(index[id(node)], ())])

        new_events.extend((-1, s, d) for s, d in self._shared_events(events.get(-1, [])))
        for node, getitems in units:
            i = index[id(node)]
            where = seg[i]
            if i in first_bwd:
                emit_copies(first_bwd[i], range(t + m, t, -1))
            if where is not None:
                ctx, e = where[1], self.expanded(where[1])
                node_events = [(self.map_sid(s, ctx, e), d) for s, d in events.get(i, ())]
                node.args, node.kwargs = self.map_value(node.args, ctx, e), self.map_value(node.kwargs, ctx, e)
                node.meta = self.map_meta(node.meta, ctx, e)
                for g in getitems:
                    g.meta = self.map_meta(g.meta, ctx, e)
                emit(node, getitems, node_events)
            else:
                getitems = self.shared_outputs(node, getitems)
                joined = node.args[0] if node.target in _JOINS and node.args else None
                node.args, node.kwargs = self.shared_args(node.args), self.shared_args(node.kwargs)
                if joined is not None:
                    self._grown_join(node, joined)
                emit(node, getitems, self._shared_events(events.get(i, [])))
            for kind, end in last.items():
                if not kind.startswith("bwd") and i == end:
                    emit_copies(kind, range(t + 1, t + m + 1))
        return self._assemble(records, nodes, new_events)

    def _grown_join(self, node: OpNode, before: list) -> None:
        """A stack or cat of a list the copies extended (clip_grad_norm_'s stack of the per-tensor norms): its
        output grows along the joined dimension, as the full trace's does, and its storage with it."""
        added = [x for x in node.args[0] if not any(x is y for y in before)]
        spec = node.meta["spec"][0]
        if not added or not spec.shape:
            return
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        d = dim % len(spec.shape)
        shape = list(spec.shape)
        if node.target is torch.ops.aten.stack.default:
            shape[d] += len(added)  # each element one slice
        else:
            shape[d] += sum(x.meta["spec"][0].shape[d] for x in added)
        strides, step = [0] * len(shape), 1
        for k in range(len(shape) - 1, -1, -1):  # (the output of a join is contiguous)
            strides[k], step = step, step * shape[k]
        node.meta["spec"] = (TensorSpec(tuple(shape), spec.dtype),) + tuple(node.meta["spec"][1:])
        node.meta["stride"] = (tuple(strides),) + tuple(node.meta["stride"][1:])
        self.sizes[node.meta["storage"][0]] = step * spec.dtype.itemsize

    def _shared_events(self, node_events: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """A shared op's events with, after each run of events on block t's storages, the copies'."""
        def owner_of(ev):
            return self.layout.sid_owner.get(ev[0])

        out, last = [], 0
        for start, end in self._runs(list(node_events), owner_of):
            out += node_events[last:end]
            for e in range(self.t + 1, self.t + self.m + 1):
                out += [(self.sid(e, owner_of(ev)[1]), ev[1]) for ev in node_events[start:end]]
            last = end
        return out + node_events[last:]

    def _assemble(self, records: list[OpNode], nodes: list[OpNode], events: list[tuple[int, int, int]]) -> Capture:
        """The Capture: placeholders with the copies' (after block t's), storage ids renumbered in order of
        allocation and records renamed in order, as a trace of the whole model numbers them; the
        parameters, gradients, optimizer state and module tables of every block."""
        cap, t, m, rep = self.cap, self.t, self.m, self.repeats
        orig = [r for r in cap.records if r.op == "placeholder"]
        # the copies' parameters, buffers and constants after block t's (each copy's in turn)
        placeholders = self._extend(orig, lambda p: self.layout.rec_owner.get(id(p)), self.record)
        for p in orig:
            name = str(p.target)
            kind = next((k for k in PARAM_KINDS if name.startswith(k)), None)
            hit = rep.block_of(name[len(kind):]) if kind else None
            if hit is not None and hit[0] > t:  # a later block's parameter: renamed
                p.target = kind + rep.renamed(name[len(kind):], self.expanded(hit[0]))
                p.name = "".join(c if c.isalnum() else "_" for c in p.target)
                p.meta["module"] = rep.renamed(p.meta.get("module", ""), self.expanded(hit[0]))
        renumber: dict[int, int] = {}
        for _, sid, _ in events:  # in order of allocation (a storage's first event), as the recorder numbers them
            if sid not in renumber:
                renumber[sid] = len(renumber)
        for sid in range(len(self.sizes)):  # never allocated (a zero-byte view's base): after the rest
            renumber.setdefault(sid, len(renumber))
        sizes, dtypes = [0] * len(renumber), [None] * len(renumber)
        for old, new in renumber.items():
            sizes[new], dtypes[new] = self.sizes[old], self.dtypes[old]
        for r in placeholders + records:
            if "storage" in r.meta:
                r.meta["storage"] = tuple(renumber[s] for s in r.meta["storage"])
        for k, r in enumerate(records):
            r.name = f"op_{k}"

        def copies_of(sid: int) -> list[int]:
            owner = self.layout.sid_owner.get(sid)
            if owner is None or owner[0] != t:
                return []
            return [self.copy_sid[(e, owner[1])] for e in range(t + 1, t + m + 1) if (e, owner[1]) in self.copy_sid]

        sids = {k: {renumber[s] for old in v for s in [old, *copies_of(old)] if s in renumber}
                for k, v in cap.sids.items()}
        saved: dict[int, tuple[int, str]] = {}
        for sid, (nbytes, module) in cap.saved.items():
            hit = rep.block_of(module)
            saved[renumber[sid]] = (nbytes, rep.renamed(module, self.expanded(hit[0])) if hit else module)
            for e, copy in zip(range(t + 1, t + m + 1), copies_of(sid)):
                saved[renumber[copy]] = (nbytes, rep.renamed(module, e))
        return Capture(
            records=placeholders + records, nodes=nodes, outputs=cap.outputs, mode=cap.mode,
            loss_source=cap.loss_source, module_types=self._named(cap.module_types, like=False),
            module_outputs=self._named(cap.module_outputs, like=False), params=self._named(cap.params),
            param_owner=self._owners_renamed(cap.param_owner), buffers=self._named(cap.buffers),
            inputs=cap.inputs, saved=saved, grads=self._named(cap.grads),
            optimizer_state=self._named(cap.optimizer_state), optimizer_name=cap.optimizer_name,
            storage_bytes=sizes, storage_dtype=dtypes, events=[(i, renumber[s], d) for i, s, d in events],
            sids=sids, fallback_reason=cap.fallback_reason, assumptions=list(cap.assumptions),
            keep_output=cap.keep_output, grad_accum=cap.grad_accum, clip_grad_norm=cap.clip_grad_norm,
            zero_grad=cap.zero_grad, linear_classes=cap.linear_classes)

    def _owners_renamed(self, table: dict[str, str]) -> dict[str, str]:
        """Parameter name -> owning module path, for every block."""
        rep = self.repeats
        return {name: (rep.renamed(owner, rep.block_of(name)[0]) if rep.block_of(name) else owner)
                for name, owner in self._named(table, like=False).items()}

    def _named(self, table: dict, like: bool = True) -> dict:
        """``table`` (keyed by module path or parameter name) for every block: later blocks renamed, block t's
        entries followed by each copy's (tensors as meta tensors of the same shape: ``like``)."""
        rep, t = self.repeats, self.t
        out: dict = {}
        pending: list[tuple[str, Any]] = []

        def flush() -> None:
            for e in range(t + 1, t + self.m + 1):
                for key, value in pending:
                    out[rep.renamed(key, e)] = _like(value) if like else value
            pending.clear()

        for key, value in table.items():
            hit = rep.block_of(key)
            if pending and (hit is None or hit[0] != t):
                flush()
            if hit is None:
                out[key] = value
            elif hit[0] == t:
                out[key] = value
                pending.append((key, value))
            else:
                out[rep.renamed(key, self.expanded(hit[0]))] = value
        flush()
        return out


def _like(value: Any) -> Any:
    """A stand-in of the same shape and dtype (a meta tensor) for a copy's tensor; other values as they are."""
    if isinstance(value, torch.Tensor):
        out = torch.empty(tuple(value.shape), dtype=value.dtype, device="meta")
        return out.requires_grad_(value.requires_grad) if value.is_floating_point() else out
    if isinstance(value, dict):
        return {k: _like(v) for k, v in value.items()}
    return value


def expand(cap: Capture, repeats: Repeats, n: int) -> Capture:
    """The capture of ``repeats.count`` blocks from ``cap``, a capture of the first ``n`` of them (raises
    :class:`NotReplicable` where the blocks do not run alike)."""
    if repeats.count == n:
        return cap
    layout = Layout(cap, repeats, n)
    check_alike(layout, n - 4, n - 3)
    return _Expansion(layout, repeats.count).build()

"""Apply the rule registry to every node of a captured step and add the costs up.

Per node: FLOPs and their kind (matmul-class, other, zero) stored as
``node.meta["cost"]``.  Per module and in total: parameters, buffers,
gradients, optimizer state, saved activations, forward/backward FLOPs by
dtype.  Ops with no rule are collected as ``unsupported`` (op, count, module)
and never counted as zero silently.
"""

from __future__ import annotations

import logging
import operator
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from .capture import INPUT_MODULE, Capture
from .graph import OpNode, map_args
from .rules import MATMUL, ZERO, OpCall, TensorSpec, bind, lookup  # the package: every built-in rule registered
from .said import warn

log = logging.getLogger(__name__)

FORWARD_PHASES = ("forward", "loss")


@dataclass(frozen=True, slots=True)
class NodeCost:
    """The cost of one node: FLOPs, their kind and the dtype they run in."""

    flops: int
    kind: str  # MATMUL, OTHER, ZERO, or "unsupported"
    dtype: str | None


@dataclass
class ModuleTally:
    path: str
    type: str
    params: int = 0
    trainable: int = 0
    param_bytes: int = 0
    saved_bytes: int = 0
    flops_forward: int = 0
    flops_backward: int = 0
    matmul_forward: int = 0
    matmul_backward: int = 0


@dataclass
class Tally:
    params_total: int
    params_trainable: int
    parameters_bytes: int
    buffers_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    activations_bytes: int
    inputs_bytes: int
    flops: dict[str, int]  # forward, backward, optimizer, matmul_forward, matmul_backward
    flops_by_dtype: dict[str, int]  # forward + backward
    modules: dict[str, ModuleTally]  # every module path (and (loss), (input)) -> its own costs
    memory_by_dtype: dict[str, dict[str, int]]  # category -> dtype -> bytes
    unsupported: list[dict[str, Any]] = field(default_factory=list)
    # trainable parameters the step gives no gradient, one row per module: {"module", "params": [names],
    # "count": elements, "bytes"} (training steps only)
    no_gradient: list[dict[str, Any]] = field(default_factory=list)
    # per aten op (overload packet): {"op", "count", "flops_forward", "flops_backward", "flops_optimizer",
    # "saved_bytes"}, most FLOPs first
    by_operator: list[dict[str, Any]] = field(default_factory=list)


def _spec_of(node: OpNode) -> TensorSpec | None:
    specs = node.meta.get("spec") or ()
    return specs[0] if len(specs) == 1 else None


def op_call(node: OpNode) -> OpCall:
    """The :class:`OpCall` a rule sees for ``node``: arguments bound by name, tensors as specs."""
    args, kwargs = map_args(node, _spec_of)
    return OpCall(node.target, bind(node.target, args, kwargs), tuple(node.meta.get("spec") or ()))


def _compute_dtype(call: OpCall) -> str | None:
    """The dtype an op computes in: its first floating-point tensor input, else its output."""
    for v in call.args.values():
        if isinstance(v, TensorSpec) and v.dtype.is_floating_point:
            return str(v.dtype).removeprefix("torch.")
    for o in call.outputs:
        if o is not None:
            return str(o.dtype).removeprefix("torch.")
    return None


def node_cost(node: OpNode) -> NodeCost | None:
    """Cost of one call_function node; None for bookkeeping nodes (getitem)."""
    target = node.target
    if node.op != "call_function" or target is operator.getitem:
        return None
    if node.meta.get("wrapper"):  # a tensor subclass ran it as the ops recorded inside it (recorder.is_wrapper)
        return NodeCost(0, ZERO, None)
    rule = lookup(target)
    if rule is None:
        return NodeCost(0, "unsupported", None)
    if rule.kind == ZERO:
        return NodeCost(0, ZERO, None)
    call = op_call(node)
    try:
        flops = int(rule.fn(call))
    except Exception as exc:  # a rule that cannot handle these arguments is a bug: say where
        raise RuntimeError(f"rule for {target} failed on {node.format_node()}: {exc}") from exc
    return NodeCost(flops, rule.kind, _compute_dtype(call))


def _sid_bytes(cap: Capture, category: str) -> int:
    """Bytes of the distinct storages of one category (views and tied tensors once)."""
    return sum(cap.storage_bytes[sid] for sid in cap.sids[category])


def _bytes_by_dtype(cap: Capture) -> dict[str, dict[str, int]]:
    """Bytes per dtype of each category of storages (parameters, gradients, optimizer state, activations...)."""
    out: dict[str, dict[str, int]] = {}
    for category in ("parameter", "buffer", "gradient", "optimizer_state", "saved", "input"):
        per: Counter[str] = Counter()
        # the activations of one micro-batch (cap.saved: the first micro-step's; "saved" holds every traced one's)
        for sid in (cap.saved if category == "saved" else cap.sids.get(category, ())):
            per[str(cap.storage_dtype[sid]).removeprefix("torch.")] += cap.storage_bytes[sid]
        out[category] = dict(per)
    return out


def _no_gradient(cap: Capture) -> list[dict[str, Any]]:
    """Trainable parameters without a gradient after backward, one row per outermost module all of whose
    trainable parameters get none (a whole vision tower is one row), else per owning module."""
    trainable = {name: p for name, p in cap.params.items() if p.requires_grad}
    missing = [name for name in trainable if name not in cap.grads]
    if not missing:
        return []

    def ancestors(path: str) -> list[str]:  # "" (the root) first, then each prefix, the path itself last
        parts = path.split(".") if path else []
        return [""] + [".".join(parts[:i]) for i in range(1, len(parts) + 1)]

    total: Counter[str] = Counter()
    unused: Counter[str] = Counter()
    no_grad = set(missing)
    for name in trainable:
        for a in ancestors(cap.param_owner[name]):
            total[a] += 1
            unused[a] += name in no_grad
    rows: dict[str, dict[str, Any]] = {}
    for name in missing:
        owner = cap.param_owner[name]
        module = next((a for a in ancestors(owner) if unused[a] == total[a]), owner)
        row = rows.setdefault(module, {"module": module, "type": cap.module_types.get(module, ""), "params": [],
                                       "count": 0, "bytes": 0})
        p = trainable[name]
        row["params"].append(name)
        row["count"] += p.numel()
        row["bytes"] += p.numel() * p.element_size()
    return sorted(rows.values(), key=lambda r: -r["count"])


# bitsandbytes' 4-bit layers (and estimator.qlora's stand-in): two weights per byte of the packed uint8 weight
PACKED_VALUES = {"Linear4bit": 2}


def param_values(cap: Capture, name: str, p: torch.Tensor) -> int:
    """The values a parameter holds: its elements, or two per byte of a 4-bit layer's packed weight (as peft's
    ``print_trainable_parameters`` counts bitsandbytes' ``Params4bit``)."""
    if p.dtype != torch.uint8:
        return p.numel()
    return p.numel() * PACKED_VALUES.get(cap.module_types.get(cap.param_owner.get(name, ""), ""), 1)


def _op_name(target: Any) -> str:
    packet = getattr(target, "overloadpacket", None)
    return str(packet if packet is not None else target)


def _op_row(name: str, kind: str) -> dict[str, Any]:
    return {"op": name, "count": 0, "flops_forward": 0, "flops_backward": 0, "flops_optimizer": 0,
            "saved_bytes": 0, "kind": kind}


class _Tallier:
    """The running totals of :func:`tally`: per module, per op, per phase and dtype."""

    def __init__(self, cap: Capture):
        self.cap = cap
        self.modules: dict[str, ModuleTally] = {}
        self.flops: Counter[str] = Counter()
        self.by_dtype: Counter[str] = Counter()
        self.unsupported: Counter[tuple[str, str]] = Counter()
        self.ops: dict[str, dict[str, Any]] = {}
        self.op_of_sid: dict[int, str] = {}  # storage id -> the op that produced it (for saved bytes per op)
        for path in cap.module_types:
            self.mod(path)

    def mod(self, path: str) -> ModuleTally:
        m = self.modules.get(path)
        if m is None:
            m = self.modules[path] = ModuleTally(path, self.cap.module_types.get(path, path))
        return m

    def add_params(self) -> None:
        """Each distinct parameter once, to the module that owns it (first name of a tied weight)."""
        cap = self.cap
        for name, p in cap.params.items():
            m = self.mod(cap.param_owner[name])
            m.params += param_values(cap, name, p)
            m.param_bytes += p.numel() * p.element_size()
            if p.requires_grad:
                m.trainable += p.numel()

    def add_node(self, node: Any) -> None:
        """One recorded op's cost, to its op row, its module and its phase (``node.meta["cost"]``)."""
        cost = node_cost(node)
        if cost is None:
            return
        node.meta["cost"] = cost
        if node.meta.get("micro_step") or node.meta.get("wrapper"):
            return  # a later micro-step of an accumulation: the tallies are one micro-batch's (and the optimizer's)
        phase = node.meta["phase"]
        module = node.meta["module"]
        name = _op_name(node.target)
        row = self.ops.get(name)
        if row is None:
            row = self.ops[name] = _op_row(name, cost.kind)
        row["count"] += 1
        if phase in FORWARD_PHASES:
            for sid in node.meta.get("storage", ()):
                self.op_of_sid.setdefault(sid, name)
        if cost.kind == "unsupported":
            self.unsupported[(name, module)] += 1
            return
        if not cost.flops:
            return
        flops = self.flops
        row["flops_" + ("forward" if phase in FORWARD_PHASES else phase)] += cost.flops
        if phase in FORWARD_PHASES:
            flops["forward"] += cost.flops
            self.mod(module).flops_forward += cost.flops
            if cost.kind == MATMUL:
                flops["matmul_forward"] += cost.flops
                self.mod(module).matmul_forward += cost.flops
        elif phase == "backward":
            flops["backward"] += cost.flops
            self.mod(module).flops_backward += cost.flops
            if cost.kind == MATMUL:
                flops["matmul_backward"] += cost.flops
                self.mod(module).matmul_backward += cost.flops
        else:
            flops[phase] += cost.flops
            return
        if cost.dtype is not None:
            self.by_dtype[cost.dtype] += cost.flops

    def add_saved(self) -> None:
        """Bytes autograd saves, to the module and the op that made them."""
        cap = self.cap
        for sid, (nbytes, module) in cap.saved.items():
            self.mod(INPUT_MODULE if sid in cap.sids["input"] else module).saved_bytes += nbytes
            producer = self.op_of_sid.get(sid)
            if producer is not None:
                self.ops[producer]["saved_bytes"] += nbytes
            else:  # an input, a buffer or a constant that autograd keeps
                self.ops.setdefault("(input)", _op_row("(input)", "input"))["saved_bytes"] += nbytes

    def by_operator(self) -> list[dict[str, Any]]:
        return sorted(self.ops.values(), key=lambda r: (-(r["flops_forward"] + r["flops_backward"]),
                                                        -r["flops_optimizer"], -r["saved_bytes"], r["op"]))

    def unsupported_rows(self) -> list[dict[str, Any]]:
        """Ops without a rule, by name and module, with a warning naming them."""
        rows = [{"op": op, "count": n, "module": module} for (op, module), n in sorted(self.unsupported.items())]
        if rows:
            names = sorted({r["op"] for r in rows})
            warn(log, "%d op(s) have no cost rule and are listed as unsupported: %s", len(names), ", ".join(names))
        return rows


def _warn_no_gradient(no_gradient: list[dict[str, Any]]) -> None:
    if no_gradient:
        count = sum(r["count"] for r in no_gradient)
        where = ", ".join(f"{r['module'] or '(root)'} ({r['count']:,})" for r in no_gradient[:4])
        warn(log, "%s trainable parameters get no gradient in this step: %s%s; check that the inputs feed every "
                    "part of the model, or freeze what is not trained (requires_grad=False)", f"{count:,}", where,
                    ", ..." if len(no_gradient) > 4 else "")


def tally(cap: Capture, train: bool = True) -> Tally:
    """The costs of a captured step; ``train``: it is a training step (else trainable parameters
    without a gradient are expected and not reported)."""
    t = _Tallier(cap)
    t.add_params()
    for node in cap.records:
        t.add_node(node)
    t.add_saved()
    unsupported_rows = t.unsupported_rows()
    no_gradient = _no_gradient(cap) if train else []
    _warn_no_gradient(no_gradient)
    params = list(cap.params.values())
    trainable = [p for p in params if p.requires_grad]
    return Tally(
        params_total=sum(param_values(cap, n, p) for n, p in cap.params.items()),
        params_trainable=sum(p.numel() for p in trainable),
        parameters_bytes=_sid_bytes(cap, "parameter"),
        buffers_bytes=_sid_bytes(cap, "buffer"),
        gradients_bytes=_sid_bytes(cap, "gradient"),
        optimizer_state_bytes=_sid_bytes(cap, "optimizer_state"),
        activations_bytes=sum(nbytes for nbytes, _ in cap.saved.values()),
        inputs_bytes=_sid_bytes(cap, "input"),
        flops={k: t.flops.get(k, 0) for k in ("forward", "backward", "optimizer", "matmul_forward", "matmul_backward")},
        flops_by_dtype=dict(t.by_dtype),
        modules=t.modules,
        memory_by_dtype=_bytes_by_dtype(cap),
        unsupported=unsupported_rows,
        no_gradient=no_gradient,
        by_operator=t.by_operator(),
    )

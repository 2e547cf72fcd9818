"""Capacity planning: one training step of a model on N GPUs, before renting them.

    estimator plan examples/gpt.py:build --gpu H100 --gpus 16 --strategy fsdp --tokens 20B

Everything is derived from the captured step (:mod:`estimator.capture`): the traced
parameters, gradients and optimizer state (real per-tensor shapes and dtypes), the
observed allocation/free timeline of every storage (:mod:`estimator.memory`), and the
per-node costs (:mod:`estimator.tally`).  No per-model constant is typed anywhere.

**Data-parallel strategies** (``dp = gpus / tp`` ranks, the *shard group* is all of
them, or one node for ``hsdp``):

* ``ddp``: ``DistributedDataParallel``: parameters, gradients and optimizer state
  replicated, plus the reducer's gradient buckets (``gradient_as_bucket_view=False``,
  the default: buckets as large as the gradients, allocated once).
* ``zero1`` / ``zero2`` / ``zero3``: ZeRO stages 1-3 (Rajbhandari et al. 2020):
  optimizer state; + gradients; + parameters partitioned over the ranks.  With a
  ``*-mixed`` precision the model states follow the paper's mixed-precision layout:
  the working parameters and gradients in the autocast dtype, the fp32 master
  weights with the optimizer state, so Adam gives 16P, 4P+12P/N, 2P+14P/N and 16P/N
  bytes per rank (plus Adam's ``step`` scalars).
* ``fsdp``: FSDP2 ``fully_shard`` on every *unit* (``--wrap CLASS``, by default the
  class of the largest repeated block list, e.g. transformer blocks) and on the root,
  with its defaults: ``reshard_after_forward=True`` (ZeRO-3-like; ``False`` keeps
  the gathered parameters from forward to backward, ZeRO-2-like), the root not
  resharded after forward, implicit backward prefetch of the previous unit, one
  reduce-scatter input buffer kept in flight.  Each parameter's dim 0 is padded to a
  multiple of the shard group (``ceil(d0/N)`` rows per rank; the last ranks may hold
  fewer real rows, the optimizer state has the real local rows).  ``*-mixed`` means
  ``MixedPrecisionPolicy(param_dtype=autocast dtype)``: all-gathers in that dtype.
* ``hsdp``: FSDP2 on a 2-D mesh: sharded within a node (``--gpus-per-node``),
  replicated across nodes (gradients all-reduced across replicas).

The per-GPU **peak** replays the captured step's allocation/free events with each
storage re-sized for the rank (sharded parameters, optimizer state and optimizer
temporaries cut along dim 0, TP-split tensors) and the strategy's own storages
inserted where its hooks run: FSDP's all-gather buffer and gathered unit before a
unit's forward and backward, the gathered unit freed after (unless not resharded),
unsharded gradients freed at the unit's post-backward, the reduce-scatter input and
the sharded gradient allocated there.  The tests check this against a real 2-rank
gloo run of DDP and FSDP2 (model states exact, peaks within 2 %).

**Tensor parallelism** (``--tp``, Megatron-style with sequence parallelism,
Korthikanti et al. 2022 §4.2.2): the weight matrices of ``nn.Linear`` /
``nn.Embedding`` (and HF ``Conv1D``) are split in ``tp``; norms and biases are
replicated; the forward/backward activations and temporaries are split in ``tp``
(sequence parallelism splits the parts plain TP replicates).  Per transformer unit
and step, 4 all-reduce-sized collectives of the unit's output (2 forward, 2
backward; Korthikanti §3) go over the intra-node link.  TP is an approximation
checked only by arithmetic.

**Time.**  Per node of the captured graph, a roofline: ``max(flops / peak, bytes /
bandwidth)`` where ``peak`` is the GPU's dense peak for the dtype the op computes in
for matmul-class ops (fp32 for the rest) and ``bytes`` = bytes of the node's tensor
inputs + bytes of its tensor outputs (views and aliases: 0).  Forward and backward
node times are divided by ``tp``; optimizer node times scale with the rank's share of
the optimizer state.  Communication (ring algorithms; bytes sent per GPU: all-reduce
``2(n-1)/n*S``, all-gather and reduce-scatter ``(n-1)/n*S``) goes over the intra-node
link when the group fits in a node, else the inter-node link (presets in
:data:`LINKS`).  ``step_time = compute + exposed communication`` (``--overlap``: the
fraction hidden behind compute, default 0: nothing hidden).  Time to train =
steps x step time, where a given ``--mfu`` replaces the roofline by
``matmul FLOPs / (mfu x peak)``.  Beside it, for transformers, the PaLM (Chowdhery et
al. 2022, appendix B) count ``6N + 12 L H Q T`` FLOPs per token (N: parameters that
enter a matmul; L H Q T from the traced attention ops).
"""

from __future__ import annotations

import argparse
import json
import math
import operator
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from .capture import INPUT_MODULE, LOSS_MODULE, OPTIMIZER_MODULE, Capture, StepOptions, capture
from .errors import UserError
from .api import resolve_classes
from .graph import OpNode
from .hardware import GPU, lookup
from .memory import CUDA_RESERVE, FRAGMENTATION, MemoryProfile, round_cuda, simulate
from .precision import parse_precision
from .rules.registry import MATMUL
from .tally import Tally, tally

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "hsdp")
SHARDED_PARAMS = frozenset({"zero3", "fsdp", "hsdp"})
SHARDED_GRADS = frozenset({"zero2", "zero3", "fsdp", "hsdp"})
SHARDED_OPTIM = frozenset({"zero1", "zero2", "zero3", "fsdp", "hsdp"})
OFFLOADS = ("optimizer", "params")
_getitem = operator.getitem


def _is_node(value: Any) -> bool:
    return isinstance(value, (OpNode, fx.Node))


def _records(cap: Capture) -> list:
    """Placeholders and op records of a capture (``Capture.records``; older captures: the fx graph)."""
    records = getattr(cap, "records", None)
    return list(records) if records is not None else list(cap.graph.nodes)
_SPECIAL_MODULES = frozenset({LOSS_MODULE, INPUT_MODULE, OPTIMIZER_MODULE})
_TP_MODULES = ("Linear", "Embedding", "Conv1D")  # class names (and subclasses of nn.Linear / nn.Embedding)
_HEAD_ATTRS = ("num_heads", "n_head", "n_heads", "num_attention_heads", "nhead", "num_key_value_heads", "n_kv_heads")


# -- interconnects ------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    name: str
    bandwidth: float  # bytes/s per GPU, one direction
    source: str


LINKS: dict[str, Link] = {link.name: link for link in (
    Link("nvlink2", 150e9, "V100 SXM2: 6 NVLink2 links, 300 GB/s both directions (NVIDIA V100 datasheet)"),
    Link("nvlink3", 300e9, "A100 SXM: 12 NVLink3 links, 600 GB/s both directions (NVIDIA A100 datasheet)"),
    Link("nvlink4", 450e9, "H100/H200 SXM: 18 NVLink4 links, 900 GB/s both directions (NVIDIA H100 datasheet)"),
    Link("nvlink5", 900e9, "B200: NVLink5, 1.8 TB/s both directions (NVIDIA DGX B200 datasheet)"),
    Link("xgmi", 448e9, "MI300X: 7 Infinity Fabric links x 64 GB/s per direction (AMD MI300X datasheet)"),
    Link("pcie3", 16e9, "PCIe 3.0 x16: ~16 GB/s per direction"),
    Link("pcie4", 32e9, "PCIe 4.0 x16: ~32 GB/s per direction"),
    Link("pcie5", 64e9, "PCIe 5.0 x16: ~64 GB/s per direction"),
    Link("ib-hdr", 25e9, "InfiniBand HDR, 200 Gb/s per GPU (one NIC per GPU)"),
    Link("ib-ndr", 50e9, "InfiniBand NDR, 400 Gb/s per GPU (DGX H100: 8 x ConnectX-7)"),
    Link("ib-xdr", 100e9, "InfiniBand XDR, 800 Gb/s per GPU"),
    Link("eth-100g", 12.5e9, "100 Gb/s Ethernet per GPU"),
)}
# GPU -> (link between the GPUs of a node, host link used by offloading)
GPU_LINKS = {
    "V100": ("nvlink2", "pcie3"), "A100-40GB": ("nvlink3", "pcie4"), "A100-80GB": ("nvlink3", "pcie4"),
    "H100-SXM": ("nvlink4", "pcie5"), "H100-PCIe": ("pcie5", "pcie5"), "H200": ("nvlink4", "pcie5"),
    "B200": ("nvlink5", "pcie5"), "L4": ("pcie4", "pcie4"), "L40S": ("pcie4", "pcie4"),
    "RTX3090": ("pcie4", "pcie4"), "RTX4090": ("pcie4", "pcie4"), "MI300X": ("xgmi", "pcie5"),
}
INTER_NODE_DEFAULT = "ib-ndr"


def link(name: str) -> Link:
    found = LINKS.get(name.strip().lower())
    if found is None:
        raise UserError(f"unknown interconnect {name!r}; choose one of {', '.join(LINKS)}")
    return found


# -- sharding arithmetic ------------------------------------------------------


def shard_rows(d0: int, world: int, rank: int = 0) -> tuple[int, int]:
    """(real rows on ``rank``, padded rows per rank) when dim 0 of size ``d0`` is split in ``world``.

    As FSDP2 (``torch.chunk`` + padding to a multiple of the world size): every rank
    stores ``ceil(d0 / world)`` rows; rank ``r`` holds the real rows
    ``[r*c, min((r+1)*c, d0))``, possibly none.
    """
    if world <= 1:
        return d0, d0
    c = -(-d0 // world)
    return max(0, min(c, d0 - rank * c)), c


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


# -- one traced step and its indexes ------------------------------------------


@dataclass
class Step:
    """A captured step at one batch size / sequence length, with the indexes the planner reads."""

    cap: Capture
    tally: Tally
    profile: MemoryProfile
    value: int  # the batch size (or sequence length) it was traced at
    note: str | None = None

    def __post_init__(self) -> None:
        cap = self.cap
        self.alloc_index: dict[int, int] = {}
        for index, sid, delta in cap.events:
            if delta > 0 and sid not in self.alloc_index:
                self.alloc_index[sid] = index
        self.alloc_spec: dict[int, Any] = {}
        for sid, index in self.alloc_index.items():
            if index >= 0:
                node = cap.nodes[index]
                for s, spec in zip(node.meta.get("storage", ()), node.meta.get("spec", ())):
                    if s == sid:
                        self.alloc_spec[sid] = spec
                        break
        holders = {n.target: n for n in _records(cap) if n.op == "placeholder" and n.meta.get("kind") == "parameter"}
        self.param_node: dict[str, Any] = {name: holders[f"param_{name}"] for name in cap.params}
        self.param_sid: dict[str, int] = {name: n.meta["storage"][0] for name, n in self.param_node.items()}
        cats = ["temporary"] * len(cap.storage_bytes)
        for name in ("saved", "gradient", "optimizer_state", "input", "buffer", "parameter"):  # later wins
            for sid in cap.sids.get(name, ()):
                cats[sid] = name
        self.cats = cats

    def structure(self) -> tuple:
        """What must agree between two traces for their storages to be interpolated sid by sid."""
        return (len(self.cap.nodes), len(self.cap.storage_bytes),
                tuple((i, s, d > 0) for i, s, d in self.cap.events))


def trace_step(model, inputs, options: StepOptions, device: str, trace: str, value: int) -> Step:
    cap = capture(model, inputs, options, mode=trace)
    t = tally(cap)
    return Step(cap, t, simulate(cap, device), value)


# -- units (FSDP2 fully_shard targets) and per-step analysis ---------------------


def _in_subtree(module: str, unit: str) -> bool:
    if unit == "":
        return module not in _SPECIAL_MODULES
    return module == unit or module.startswith(unit + ".")


def default_wrap(model: torch.nn.Module) -> tuple[tuple[type, ...], list[str]]:
    """The blocks of the largest list of repeated blocks (a ModuleList/Sequential of >= 2 children of one
    class, e.g. transformer blocks): (their class, their paths); none: ((), [])."""
    best, best_params = None, 0
    for path, mod in model.named_modules():
        if isinstance(mod, (torch.nn.ModuleList, torch.nn.Sequential)):
            kids = list(mod.named_children())
            if len(kids) >= 2 and len({type(k) for _, k in kids}) == 1:
                n = sum(p.numel() for p in mod.parameters())
                if n > best_params:
                    best, best_params = (type(kids[0][1]), [f"{path}.{k}" if path else k for k, _ in kids]), n
    return ((best[0],), best[1]) if best is not None else ((), [])


def wrap_paths(model: torch.nn.Module, classes: tuple[type, ...]) -> list[str]:
    """Paths of every instance of ``classes`` (not the root)."""
    return [p for p, m in model.named_modules() if p and classes and isinstance(m, classes)]


@dataclass
class Unit:
    path: str
    depth: int
    params: list[str] = field(default_factory=list)  # names (deduplicated) the unit shards
    fwd: tuple[int, int] | None = None  # first and last forward node of the subtree
    bwd: tuple[int, int] | None = None
    grads: list[int] = field(default_factory=list)  # gradient sids of its parameters
    inputs_require_grad: bool = False


class Analysis:
    """A Step read in terms of the model: FSDP units, TP-split parameters, gradient owners."""

    def __init__(self, step: Step, model: torch.nn.Module, unit_paths: Sequence[str]):
        self.step = step
        cap = step.cap
        paths = [""] + [p for p in unit_paths if p]
        self.units = {p: Unit(p, 0 if p == "" else p.count(".") + 1) for p in paths}
        cache: dict[str, list[str]] = {}

        def containing(module: str) -> list[str]:
            hit = cache.get(module)
            if hit is None:
                hit = cache[module] = [u for u in paths if _in_subtree(module, u)]
            return hit

        def innermost(module: str) -> str:
            return max(containing(module) or [""], key=len)

        self.innermost = innermost
        self.param_unit = {name: innermost(cap.param_owner.get(name, "")) for name in cap.params}
        for name, unit in self.param_unit.items():
            self.units[unit].params.append(name)
        for i, node in enumerate(cap.nodes):
            phase = node.meta.get("phase")
            attr = "fwd" if phase in ("forward", "loss") else "bwd" if phase == "backward" else None
            if attr is None:
                continue
            for u in containing(node.meta.get("module", "")):
                unit = self.units[u]
                span = getattr(unit, attr)
                setattr(unit, attr, (i, i) if span is None else (span[0], i))
        # TP-split parameters: weight matrices of Linear / Embedding modules.
        modules = dict(model.named_modules())
        self.tp_params: set[str] = set()
        for name, p in cap.params.items():
            mod = modules.get(cap.param_owner.get(name, ""))
            if mod is not None and p.ndim >= 2 and (
                    isinstance(mod, (torch.nn.Linear, torch.nn.Embedding)) or type(mod).__name__ in _TP_MODULES):
                self.tp_params.add(name)
        self.tp_shapes = {tuple(cap.params[n].shape) for n in self.tp_params}
        # Gradients: each gradient storage to the parameter it belongs to (shape, then module).
        self.grad_param: dict[int, str] = {}
        free = {n: p for n, p in cap.params.items() if p.requires_grad}
        for sid in sorted(cap.sids.get("gradient", ()), key=lambda s: step.alloc_index.get(s, -1)):
            index = step.alloc_index.get(sid, -1)
            module = cap.nodes[index].meta.get("module", "") if index >= 0 else ""
            nbytes = cap.storage_bytes[sid]  # a bias gradient may come as a (1, n) view: match sizes
            pick = next((n for n, p in free.items() if p.numel() * p.element_size() == nbytes and
                         (_in_subtree(module, cap.param_owner.get(n, "")) or
                          _in_subtree(cap.param_owner.get(n, ""), module))), None)
            if pick is None:
                pick = next((n for n, p in free.items() if p.numel() * p.element_size() == nbytes), None)
            if pick is not None:
                del free[pick]
                self.grad_param[sid] = pick
                self.units[self.param_unit[pick]].grads.append(sid)
            else:
                self.units[innermost(module)].grads.append(sid)
        # Does a unit's forward take a tensor that requires grad (else FSDP's post-backward runs at the end)?
        input_rg = {id(n): t.requires_grad for n, t in zip(
            [n for n in _records(cap) if n.op == "placeholder" and n.meta.get("kind") == "input"], cap.inputs)}
        for unit in self.units.values():
            if unit.path == "" or unit.fwd is None:
                continue
            lo, hi = unit.fwd
            inside = set()
            for node in cap.nodes[lo:hi + 1]:
                if not _in_subtree(node.meta.get("module", ""), unit.path):
                    continue
                inside.add(node)
                for a in pytree.tree_leaves((node.args, node.kwargs)):
                    if not _is_node(a) or a in inside:
                        continue
                    src = a.args[0] if a.target is _getitem and a.args else a
                    if src.op == "placeholder":
                        if input_rg.get(id(src)):
                            unit.inputs_require_grad = True
                    elif src.meta.get("phase") in ("forward", "loss") and not _in_subtree(
                            src.meta.get("module", ""), unit.path):
                        specs = a.meta.get("spec") or ()
                        if any(s is not None and s.dtype.is_floating_point for s in specs):
                            unit.inputs_require_grad = True
                if unit.inputs_require_grad:
                    break
        # Autocast's weight casts (forward _to_copy of a parameter): absent when the parameters already
        # are in the low-precision dtype (ZeRO's mixed layout, FSDP2 MixedPrecisionPolicy).
        param_nodes = set(step.param_node.values())
        self.weight_casts: set[int] = set()
        for node in cap.nodes:
            if node.meta.get("phase") == "forward" and node.target is torch.ops.aten._to_copy.default \
                    and node.args and node.args[0] in param_nodes:
                self.weight_casts.update(node.meta.get("storage", ()))

    @property
    def ordered_units(self) -> list[Unit]:
        """Units that run forward, in order of their pre-forward hooks (outer first)."""
        return sorted((u for u in self.units.values() if u.fwd is not None), key=lambda u: (u.fwd[0], u.depth))


# -- layout: what one rank holds ------------------------------------------------


@dataclass(frozen=True)
class Layout:
    strategy: str
    gpus: int
    tp: int = 1
    gpus_per_node: int = 8
    rank: int = 0  # rank within the shard group (0 holds the most real rows)
    reshard_after_forward: bool = True
    offload: str | None = None
    device: str = "cuda"
    mixed: torch.dtype | None = None  # autocast dtype of a *-mixed precision

    @property
    def dp(self) -> int:
        return self.gpus // self.tp

    @property
    def shard(self) -> int:
        if self.strategy == "ddp":
            return 1
        if self.strategy == "hsdp":
            return max(1, min(self.dp, self.gpus_per_node // self.tp))
        return self.dp

    @property
    def replicate(self) -> int:
        return self.dp // self.shard

    @property
    def shard_params(self) -> bool:
        return self.strategy in SHARDED_PARAMS

    @property
    def shard_grads(self) -> bool:
        return self.strategy in SHARDED_GRADS

    @property
    def shard_optim(self) -> bool:
        return self.strategy in SHARDED_OPTIM

    @property
    def zero_mixed(self) -> bool:
        """ZeRO's mixed-precision layout: working params/grads in the low dtype, fp32 master in the optimizer."""
        return self.mixed is not None and self.strategy in ("zero1", "zero2", "zero3")

    @property
    def fsdp_mixed(self) -> bool:
        return self.mixed is not None and self.strategy in ("fsdp", "hsdp")


@dataclass
class States:
    """Per-rank sizes: every captured storage re-sized, plus the strategy's totals (bytes, unrounded)."""

    sizes: list[float]  # per captured storage
    parameters: int
    gradients: int
    optimizer_state: int
    master: int  # fp32 master weights (ZeRO mixed layout), part of optimizer_state
    buckets: int  # DDP's gradient buckets
    cpu: int  # offloaded to host memory
    unit_gathered: dict[str, list[int]]  # unit -> per-parameter gathered bytes
    unit_shard: dict[str, int]  # unit -> numel of its padded shard (trainable parameters)
    unit_gather_itemsize: int
    reduce_itemsize: int
    local_params: int  # real (unpadded) parameter bytes on this rank (checkpoint shard)
    optim_fraction: float  # this rank's share of the optimizer work


def _rows(shape: Sequence[int]) -> int:
    return shape[0] if len(shape) else 1


def rank_states(an: Analysis, layout: Layout) -> States:
    """Re-size every captured storage for one rank of ``layout``."""
    step, cap = an.step, an.step.cap
    sizes: list[float] = [float(b) for b in cap.storage_bytes]
    ws, rank, tp = layout.shard, layout.rank, layout.tp
    low = _itemsize(layout.mixed) if layout.mixed is not None else None

    def tp_rows(d0: int, split: bool) -> int:
        return -(-d0 // tp) if split and tp > 1 else d0

    params = gradients = optim = master = local_params = 0.0
    cpu = 0.0
    unit_gathered: dict[str, list[int]] = defaultdict(list)
    unit_shard: dict[str, int] = defaultdict(int)
    gather_itemsize = 0
    grad_itemsize = 0
    for name, p in cap.params.items():
        sid = step.param_sid[name]
        full = cap.storage_bytes[sid]
        d0 = _rows(p.shape)
        rows = tp_rows(d0, name in an.tp_params)
        row_bytes = full / d0
        item = p.element_size()
        if layout.zero_mixed and p.is_floating_point():
            row_work = row_bytes * low / item  # the working copy in the low dtype
        else:
            row_work = row_bytes
        real, padded = shard_rows(rows, ws, rank) if layout.shard_params else (rows, rows)
        size = padded * row_work
        local_params += real * row_bytes
        if layout.offload == "params":
            cpu += size
            size = 0.0
        sizes[sid] = size
        params += size
        if layout.zero_mixed and p.requires_grad:
            m_real, _ = shard_rows(rows, ws, rank)
            master += m_real * row_bytes
        g_item = _itemsize(layout.mixed) if layout.fsdp_mixed and p.is_floating_point() else \
            (low if layout.zero_mixed and p.is_floating_point() else item)
        gather_itemsize = max(gather_itemsize, g_item)
        elems = row_bytes / item  # elements per row
        unit = an.param_unit[name]
        unit_gathered[unit].append(int(round(padded * ws * elems * g_item)) if layout.shard_params else 0)
        if p.requires_grad:
            unit_shard[unit] += int(round(shard_rows(rows, ws, rank)[1] * elems))
            grad_itemsize = max(grad_itemsize, int(low if layout.zero_mixed and p.is_floating_point() else item))
    # Gradients as autograd produces them (unsharded), in the rank's TP slice and the working dtype.
    for sid in cap.sids.get("gradient", ()):
        name = an.grad_param.get(sid)
        p = cap.params.get(name) if name else None
        if p is None:
            continue
        d0 = _rows(p.shape)
        size = cap.storage_bytes[sid] * tp_rows(d0, name in an.tp_params) / d0
        if layout.zero_mixed and p.is_floating_point():
            size = size * low / p.element_size()
        sizes[sid] = size
        gradients += size
    # Optimizer state and optimizer temporaries: split along dim 0 like the parameter they belong to.
    optim_full = optim_rank = 0.0
    state_sids = set(cap.sids.get("optimizer_state", ()))
    for sid, index in step.alloc_index.items():
        if index < 0 or step.cats[sid] in ("parameter", "gradient", "buffer", "input"):
            continue
        node = cap.nodes[index]
        if node.meta.get("phase") != "optimizer" and sid not in state_sids:
            continue
        spec = step.alloc_spec.get(sid)
        shape = tuple(spec.shape) if spec is not None else ()
        size = float(cap.storage_bytes[sid])
        if shape and len(shape) >= 1:
            d0 = shape[0]
            rows = tp_rows(d0, shape in an.tp_shapes)
            real = shard_rows(rows, ws, rank)[0] if layout.shard_optim else rows
            size = size * real / d0 if d0 else size
        if sid in state_sids:
            optim_full += cap.storage_bytes[sid]
            optim_rank += size
        if layout.offload is not None:
            if sid in state_sids:
                cpu += size
            size = 0.0
        sizes[sid] = size
        if sid in state_sids:
            optim += size
    if layout.offload is not None:
        cpu += master
    # Forward/backward activations and temporaries: split in tp (sequence parallelism).
    if tp > 1:
        for sid, index in step.alloc_index.items():
            if index >= 0 and step.cats[sid] in ("saved", "temporary") and \
                    cap.nodes[index].meta.get("phase") in ("forward", "loss", "backward"):
                sizes[sid] = sizes[sid] / tp
    if layout.zero_mixed or layout.fsdp_mixed:
        for sid in an.weight_casts:
            sizes[sid] = 0.0
    buckets = gradients if layout.strategy in ("ddp", "zero1") and layout.dp > 1 else 0.0
    if layout.shard_grads:
        gradients = sum(unit_shard.values()) * (grad_itemsize or 4)
        if layout.offload is not None:  # reduced on the GPU, then kept in host memory
            cpu += gradients
            gradients = 0
    return States(
        sizes=sizes, parameters=int(round(params)), gradients=int(round(gradients)),
        optimizer_state=int(round(optim + (0 if layout.offload else master))), master=int(round(master)),
        buckets=int(round(buckets)), cpu=int(round(cpu)), unit_gathered=dict(unit_gathered),
        unit_shard=dict(unit_shard), unit_gather_itemsize=gather_itemsize or 4,
        reduce_itemsize=grad_itemsize or 4, local_params=int(round(local_params)),
        optim_fraction=(optim_rank / optim_full) if optim_full else 1.0,
    )


# -- the strategy's timeline ----------------------------------------------------


@dataclass
class Schedule:
    events: list[tuple[int, int, int]]  # (node index, key, +1/-1); keys < n_cap are captured storages
    n_cap: int
    syn_sizes: list[int]
    syn_cats: list[str]
    syn_names: list[str]
    pre: set[int]  # alive at the start of the steady-state step


def build_schedule(an: Analysis, layout: Layout, st: States) -> Schedule:
    """The rank's allocation/free events: the captured ones plus the strategy's own storages.

    Hooks run after all captured events of a node index (``before node i`` = after ``i-1``).
    FSDP2 (``_fsdp_param_group.py``, ``_fsdp_collectives.py``): pre-forward all-gathers into a
    flat buffer, copies out into the per-parameter unsharded storages and keeps the flat buffer
    until the next unit's copy-out (the root's post-forward frees the last); post-forward frees
    the gathered unit (not the root's); pre-backward gathers again (prefetched by the previous
    pre-backward) and prefetches the unit that ran forward before it; post-backward frees the
    gathered unit, frees the oldest reduce-scatter input, allocates this unit's (padded full
    size), frees the unsharded gradients and allocates the sharded ones; units whose inputs need
    no gradient (the root) run post-backward at the end of backward, which then frees the
    remaining reduce-scatter input.
    """
    step, cap = an.step, an.step.cap
    n_cap = len(cap.storage_bytes)
    cuda = layout.device == "cuda"
    rnd = (lambda n: round_cuda(int(round(n)))) if cuda else (lambda n: int(round(n)))
    syn_sizes: list[int] = []
    syn_cats: list[str] = []
    syn_names: list[str] = []

    def new(name: str, size: float, cat: str) -> int:
        syn_sizes.append(rnd(size))
        syn_cats.append(cat)
        syn_names.append(name)
        return n_cap + len(syn_sizes) - 1

    pre = {sid for index, sid, delta in cap.events if index < 0 and delta > 0}
    pre |= set(cap.sids.get("optimizer_state", ()))
    if st.buckets:
        pre.add(new("ddp gradient buckets", st.buckets, "comm"))
    if st.master and not layout.offload:
        pre.add(new("fp32 master weights", st.master, "optimizer_state"))

    hooks: list[tuple[int, tuple, str, Unit]] = []
    ws = layout.shard
    units = an.ordered_units
    if (layout.shard_params or layout.shard_grads) and ws > 1:
        last_bwd = max((i for i, n in enumerate(cap.nodes) if n.meta.get("phase") == "backward"), default=-1)
        for u in units:
            if layout.shard_params:
                hooks.append((u.fwd[0] - 1, (1, u.depth), "pre_fwd", u))
                hooks.append((u.fwd[1], (0, -u.depth), "post_fwd", u))
                if u.bwd is not None:
                    hooks.append((u.bwd[0] - 1, (1, u.depth), "pre_bwd", u))
            if u.bwd is not None and u.inputs_require_grad:
                pos = max([u.bwd[1]] + [step.alloc_index.get(s, -1) for s in u.grads])
                hooks.append((pos, (0, -u.depth), "post_bwd", u))
        # The root's final callback: the units not yet done, in module order (the root first).
        for k, u in enumerate(u for u in an.units.values() if not u.inputs_require_grad or u.bwd is None):
            hooks.append((last_bwd, (2, k), "post_bwd", u))
        hooks.append((last_bwd, (3, 0), "end_bwd", None))
    hooks.sort(key=lambda h: (h[0], h[1]))

    # Synthetic storages per unit.
    gathered: dict[str, int] = {}
    flat: dict[str, float] = {}
    copyin: dict[str, float] = {}
    for u in an.units.values():
        per_param = st.unit_gathered.get(u.path, [])
        if layout.shard_params and per_param:
            gathered[u.path] = sum(rnd(b) for b in per_param)
            flat[u.path] = sum(per_param)
            if layout.fsdp_mixed or layout.offload == "params":
                copyin[u.path] = sum(per_param) / ws
    root = ""
    post_forward_order = sorted((u for u in units), key=lambda u: (u.fwd[1], -u.depth))
    index_of = {u.path: i for i, u in enumerate(post_forward_order)}
    events: list[tuple[int, int, int]] = []
    state = {"held": None, "unsharded": set(), "pending": {}, "rs": [], "done": set()}
    resharded_after_forward = {u.path: layout.reshard_after_forward and u.path != root for u in units}
    grads_freed: set[int] = set()

    def emit(pos: int, key: int, sign: int) -> None:
        events.append((pos, key, sign))

    def all_gather(pos: int, u: Unit) -> int:
        c = new(f"{u.path or '(root)'} all-gather copy-in", copyin[u.path], "comm") if u.path in copyin else None
        if c is not None:
            emit(pos, c, +1)
        f = new(f"{u.path or '(root)'} all-gather buffer", flat[u.path], "comm")
        emit(pos, f, +1)
        if c is not None:
            emit(pos, c, -1)
        return f

    def copy_out(pos: int, u: Unit) -> None:
        g = new(f"{u.path or '(root)'} gathered parameters", gathered[u.path], "gathered")
        emit(pos, g, +1)
        state["unsharded"].add(u.path)
        state.setdefault("gkey", {})[u.path] = g

    def reshard(pos: int, u: Unit) -> None:
        if u.path in state["unsharded"]:
            emit(pos, state["gkey"][u.path], -1)
            state["unsharded"].discard(u.path)

    for pos, _, kind, u in hooks:
        if kind == "pre_fwd":
            if u.path not in gathered:
                continue
            f = all_gather(pos, u)
            copy_out(pos, u)
            if state["held"] is not None:  # the previous unit's buffer, released after this copy-out
                emit(pos, state["held"], -1)
            state["held"] = f
        elif kind == "post_fwd":
            if u.path in gathered and resharded_after_forward.get(u.path):
                reshard(pos, u)
            if u.path == root and state["held"] is not None:
                emit(pos, state["held"], -1)
                state["held"] = None
        elif kind == "pre_bwd":
            if u.path in gathered and u.path not in state["unsharded"]:
                f = state["pending"].pop(u.path, None)
                if f is None:
                    f = all_gather(pos, u)
                copy_out(pos, u)
                emit(pos, f, -1)
            i = index_of.get(u.path, 0)
            if i > 0:
                target = post_forward_order[i - 1]
                if target.path in gathered and target.path not in state["unsharded"] \
                        and target.path not in state["pending"]:
                    state["pending"][target.path] = all_gather(pos, target)
        elif kind == "post_bwd":
            if u.path in state["done"]:
                continue
            state["done"].add(u.path)
            if layout.shard_params:
                reshard(pos, u)
            for old in state["rs"]:
                emit(pos, old, -1)
            state["rs"] = []
            grads = [s for s in u.grads if s not in grads_freed]
            if not layout.shard_grads or not grads:
                continue
            shard_numel = st.unit_shard.get(u.path, 0)
            rs = new(f"{u.path or '(root)'} reduce-scatter input", shard_numel * ws * st.reduce_itemsize, "comm")
            emit(pos, rs, +1)
            for s in grads:
                emit(pos, s, -1)
                grads_freed.add(s)
            out = new(f"{u.path or '(root)'} sharded gradients", shard_numel * st.reduce_itemsize, "gradient")
            emit(pos, out, +1)
            if layout.offload is not None:  # copied to host memory, then dropped
                emit(pos, out, -1)
            state["rs"].append(rs)
        elif kind == "end_bwd":
            for old in state["rs"]:
                emit(pos, old, -1)
            state["rs"] = []
            for f in state["pending"].values():
                emit(pos, f, -1)
            state["pending"] = {}

    # Merge: captured events of index i, then the hooks placed after i.
    merged: list[tuple[int, int, int]] = []
    k = 0
    hook_events = events  # already in hook order, positions nondecreasing
    for index, sid, delta in cap.events:
        while k < len(hook_events) and hook_events[k][0] < index:
            merged.append(hook_events[k])
            k += 1
        if sid in grads_freed and delta < 0:
            continue
        merged.append((index, sid, 1 if delta > 0 else -1))
    merged.extend(hook_events[k:])
    return Schedule(merged, n_cap, syn_sizes, syn_cats, syn_names, pre)


@dataclass
class Peak:
    total: int
    index: int
    by_category: dict[str, int]


def replay(sched: Schedule, cap_sizes: Sequence[int], cats: Sequence[str]) -> Peak:
    """Live bytes over the rank's step; the maximum and its breakdown."""
    sizes = list(cap_sizes) + sched.syn_sizes
    all_cats = list(cats) + sched.syn_cats
    live: dict[str, int] = defaultdict(int)
    alive: set[int] = set()
    total = 0
    for k in sched.pre:
        if sizes[k]:
            live[all_cats[k]] += sizes[k]
            total += sizes[k]
        alive.add(k)
    best = Peak(total, -1, dict(live))
    for index, k, sign in sched.events:
        if sign > 0:
            if k in alive:
                continue
            alive.add(k)
            total += sizes[k]
            live[all_cats[k]] += sizes[k]
            if total > best.total:
                best = Peak(total, index, dict(live))
        else:
            if k not in alive:
                continue
            alive.discard(k)
            total -= sizes[k]
            live[all_cats[k]] -= sizes[k]
    return best


def _rounded(sizes: Sequence[float], device: str) -> list[int]:
    if device == "cuda":
        return [round_cuda(int(round(max(0.0, s)))) for s in sizes]
    return [int(round(max(0.0, s))) for s in sizes]


# -- time -------------------------------------------------------------------------


def _views() -> frozenset:
    try:
        from .rules.zero import VIEWS
    except ImportError:  # pragma: no cover
        VIEWS = ()
    return frozenset(VIEWS)


def _spec_bytes(specs) -> int:
    return sum(s.numel * s.dtype.itemsize for s in specs or () if s is not None)


def node_bytes(node: fx.Node, views: frozenset) -> int:
    """Bytes a node moves: its tensor inputs (each distinct input once) + its tensor outputs; views move 0."""
    packet = getattr(node.target, "overloadpacket", None)
    if packet is not None and packet.__name__ in views:
        return 0
    seen = set()
    moved = 0
    for a in pytree.tree_leaves((node.args, node.kwargs)):
        if _is_node(a) and a not in seen:
            seen.add(a)
            moved += _spec_bytes(a.meta.get("spec"))
    return moved + _spec_bytes(node.meta.get("spec"))


def roofline(step: Step, gpu: GPU) -> dict[str, Any]:
    """Per-phase seconds: sum over nodes of max(flops / peak(dtype), bytes / bandwidth)."""
    views = _views()
    fp32 = gpu.peak_flops("fp32")
    by_phase: dict[str, float] = defaultdict(float)
    mm_by_dtype: dict[str, int] = defaultdict(int)
    for node in step.cap.nodes:
        cost = node.meta.get("cost")
        flops = cost.flops if cost is not None and cost.kind not in ("unsupported",) else 0
        if cost is not None and cost.kind == MATMUL:
            peak = gpu.peak_flops(cost.dtype or "fp32") or fp32
            if node.meta.get("phase") != "optimizer":
                mm_by_dtype[cost.dtype or "float32"] += flops
        else:
            peak = fp32
        t = max(flops / peak if flops else 0.0, node_bytes(node, views) / gpu.bandwidth)
        by_phase[node.meta.get("phase", "forward")] += t
    return {"by_phase": dict(by_phase), "matmul_flops_by_dtype": dict(mm_by_dtype)}


def _ring(kind: str, n: int, size: float) -> float:
    """Bytes each GPU sends in a ring collective over ``n`` GPUs (S: the full buffer)."""
    if n <= 1:
        return 0.0
    return (2 if kind == "all_reduce" else 1) * (n - 1) / n * size


# -- inputs at another batch size / sequence length -------------------------------


def input_dims(inputs: Any) -> tuple[int | None, int | None]:
    """(batch size, sequence length) read from the inputs: dim 0 of the first tensor; dim 1 of the
    first integer tensor with >= 2 dims (else of the first tensor with >= 2 dims)."""
    leaves = [t for t in pytree.tree_leaves(_plain(inputs)) if isinstance(t, torch.Tensor)]
    batch = next((t.shape[0] for t in leaves if t.ndim >= 1), None)
    two = [t for t in leaves if t.ndim >= 2]
    ints = [t for t in two if not t.is_floating_point()]
    seq = (ints or two)[0].shape[1] if two else None
    return batch, seq


def tokens_per_sample(inputs: Any) -> int | None:
    """Tokens in one sample: dim 1 of the first integer input with 2 dims (B, T), else None."""
    for t in pytree.tree_leaves(_plain(inputs)):
        if isinstance(t, torch.Tensor) and not t.is_floating_point() and t.ndim == 2:
            return int(t.shape[1])
    return None


def _plain(inputs: Any) -> Any:
    if isinstance(inputs, Mapping) and type(inputs) is not dict:
        return dict(inputs)
    return inputs


def resize_inputs(inputs: Any, dim: int, old: int, new: int) -> Any:
    """The inputs with every tensor's ``dim`` of size ``old`` set to ``new`` (as meta tensors)."""

    def one(t: torch.Tensor) -> torch.Tensor:
        if t.ndim > dim and t.shape[dim] == old:
            shape = list(t.shape)
            shape[dim] = new
            return torch.empty(shape, dtype=t.dtype, device="meta").requires_grad_(t.requires_grad)
        return t

    return pytree.tree_map_only(torch.Tensor, one, _plain(inputs))


class Tracer:
    """Captures the step at other batch sizes (dim 0) or sequence lengths (dim 1); cached."""

    def __init__(self, model, inputs, options: StepOptions, device: str, trace: str):
        self.model, self.inputs, self.options, self.device, self.trace = model, inputs, options, device, trace
        self.batch, self.seq = input_dims(inputs)
        self.cache: dict[tuple, Step] = {}
        self.ckpt_on_cpu_kernels = False

    CKPT_NOTE = ("the checkpointed step was traced with the CPU kernels: with the CUDA kernels the capture "
                 "failed under recomputation")

    def base(self, what: str) -> int:
        value = self.batch if what == "batch" else self.seq
        if value is None:
            raise UserError(f"cannot solve for the {'batch size' if what == 'batch' else 'sequence length'}: "
                            f"the inputs have no {'dimension 0' if what == 'batch' else 'dimension 1'}")
        return value

    def original(self, checkpoint: tuple[type, ...] = ()) -> Step:
        """The step at the inputs as given."""
        if self.batch is not None:
            return self.at("batch", self.batch, checkpoint)
        key = ("original", 0, checkpoint)
        if key not in self.cache:
            self.cache[key] = self._trace(self.inputs, checkpoint, 0)
        return self.cache[key]

    def at(self, what: str, value: int, checkpoint: tuple[type, ...] = ()) -> Step:
        key = (what, value, checkpoint)
        hit = self.cache.get(key)
        if hit is None:
            base = self.base(what)
            dim = 0 if what == "batch" else 1
            inputs = self.inputs if value == base else resize_inputs(self.inputs, dim, base, value)
            hit = self.cache[key] = self._trace(inputs, checkpoint, value)
        return hit

    def _trace(self, inputs, checkpoint: tuple[type, ...], value: int) -> Step:
        opts = replace(self.options, checkpoint=checkpoint)
        if checkpoint and self.ckpt_on_cpu_kernels:
            opts = replace(opts, target="cpu")
        try:
            step = trace_step(self.model, inputs, opts, self.device, self.trace, value)
            if self.trace == "auto" and step.cap.mode == "fake":
                self.trace = "fake"  # other sizes: never fall back to a (large) real trace
            if checkpoint and self.ckpt_on_cpu_kernels:
                step.note = self.CKPT_NOTE
            return step
        except UserError as exc:
            # Workaround: the CUDA kernel routing of the capture (StepOptions.target="cuda") can fail when
            # torch.utils.checkpoint recomputes a region; trace that step with the CPU kernels instead.
            if not checkpoint or getattr(opts, "target", "cpu") != "cuda":
                raise
            try:
                step = trace_step(self.model, inputs, replace(opts, target="cpu"), self.device, self.trace, value)
            except UserError:
                raise exc from None
            self.ckpt_on_cpu_kernels = True
            step.note = self.CKPT_NOTE
            return step


# -- the plan -------------------------------------------------------------------


@dataclass
class Plan:
    """The plan of one strategy: per-GPU memory, fits or not, largest batch, time."""

    config: dict[str, Any]
    per_gpu: dict[str, Any]
    capacity: int
    reserve: dict[str, int]
    fits: bool
    margin: int
    max_batch: int | None
    max_batch_check: dict[str, Any] | None
    max_seq: int | None
    max_seq_check: dict[str, Any] | None
    min_gpus: int | None
    time: dict[str, Any]
    flops: dict[str, Any]
    checkpoint_size: dict[str, int]
    units: list[dict[str, Any]]
    notes: list[str]

    @property
    def step_time_s(self) -> float:
        return self.time["step_time_s"]

    @property
    def time_to_train_s(self) -> float | None:
        return self.time["time_to_train_s"]

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "gpu": c["gpu"], "gpus": c["gpus"], "strategy": c["strategy"], "tp": c["tp"], "dp": c["dp"],
            "shard_group": c["shard_group"], "precision": c["precision"], "optimizer": c["optimizer"],
            "checkpoint": c["checkpoint"], "offload": c["offload"], "wrap": c["wrap"],
            "micro_batch": c["micro_batch"], "global_batch": c["global_batch"], "seq": c["seq"],
            "per_gpu": dict(self.per_gpu), "capacity": self.capacity, "reserve": dict(self.reserve),
            "fits": self.fits, "margin": self.margin, "max_batch": self.max_batch,
            "max_batch_check": self.max_batch_check, "max_seq": self.max_seq, "max_seq_check": self.max_seq_check,
            "min_gpus": self.min_gpus,
            "step_time_s": self.time["step_time_s"], "time_to_train_s": self.time["time_to_train_s"],
            "time": dict(self.time), "flops": dict(self.flops), "checkpoint_size": dict(self.checkpoint_size),
            "units": list(self.units), "notes": list(self.notes),
        }

    def render(self, tablefmt: str = "simple") -> str:
        from tabulate import tabulate

        from .report import fmt_bytes, fmt_flops

        c, g, t = self.config, self.per_gpu, self.time
        tp_text = f" x tp {c['tp']}" if c["tp"] > 1 else ""
        ck_text = ", checkpoint " + ", ".join(c["checkpoint"]) if c["checkpoint"] else ""
        off_text = ", offload " + c["offload"] if c["offload"] else ""
        head = (f"Plan: {c['model']} on {c['gpus']} x {c['gpu']}, {c['strategy']}{tp_text}, {c['precision']}"
                f"{ck_text}{off_text}")
        verdict = (f"FITS with {fmt_bytes(self.margin)} to spare" if self.fits
                   else f"DOES NOT FIT: {fmt_bytes(-self.margin)} over"
                   + (f" (fits on {self.min_gpus} GPUs)" if self.min_gpus else ""))
        mem = [
            ("Parameters (this rank)", fmt_bytes(g["parameters"])),
            ("Gradients", fmt_bytes(g["gradients"])),
            ("Optimizer state", fmt_bytes(g["optimizer_state"])),
            ("Gathered parameters (largest unit)", fmt_bytes(g["gathered_parameters"])),
            ("Activations (saved for backward)", fmt_bytes(g["activations"])),
            ("Temporaries at the peak", fmt_bytes(g["temporaries"])),
            ("Communication buffers (largest)", fmt_bytes(g["comm_buffers"])),
            ("Peak (steady-state step)", f"{fmt_bytes(g['peak'])} in {g['peak_phase']}"
                                         f"{', ' + g['peak_module'] if g['peak_module'] else ''}"),
            ("Reserve (CUDA context, cuBLAS, fragmentation)", fmt_bytes(sum(self.reserve.values()))),
            ("Capacity", fmt_bytes(self.capacity)),
            ("Verdict", verdict),
            ("Largest micro-batch that fits", _fmt_solve(self.max_batch, self.max_batch_check)),
        ]
        if g.get("cpu_offloaded"):
            mem.insert(7, ("Offloaded to host memory", fmt_bytes(g["cpu_offloaded"])))
        if self.max_seq is not None or self.max_seq_check is not None:
            mem.append(("Longest sequence that fits", _fmt_solve(self.max_seq, self.max_seq_check)))
        tm = [
            ("Micro-batch per GPU / global batch", f"{c['micro_batch']} / {c['global_batch']}"),
            ("Compute (roofline)", f"{t['compute_s'] * 1e3:.2f} ms"),
            ("Communication", f"{t['comm_s'] * 1e3:.2f} ms over {t['links']}"),
            ("Step time", f"{t['step_time_s'] * 1e3:.2f} ms"
                          + (f" (MFU {t['mfu_estimated'] * 100:.1f}%)" if t.get("mfu_estimated") else "")),
        ]
        if t.get("steps"):
            tm.append(("Steps", f"{t['steps']:,}"))
        if t.get("time_to_train_s") is not None:
            at_mfu = f" at MFU {t['mfu_used'] * 100:.0f}%" if t.get("mfu_given") else ""
            tm.append(("Time to train", _fmt_duration(t["time_to_train_s"]) + at_mfu))
        f = self.flops
        if f.get("six_nd_per_token"):
            tm.append(("FLOPs per token: traced / 6N+12LHQT",
                       f"{fmt_flops(f['traced_per_token'])} / {fmt_flops(f['six_nd_per_token'])}"))
            if f.get("six_nd_time_s") is not None:
                tm.append(("Time to train by 6N+12LHQT", _fmt_duration(f["six_nd_time_s"])))
        ck = self.checkpoint_size
        tm.append(("Checkpoint on disk: full / per rank", f"{fmt_bytes(ck['full'])} / {fmt_bytes(ck['per_rank'])}"))
        parts = [head, tabulate(mem, tablefmt=tablefmt, disable_numparse=True),
                 tabulate(tm, tablefmt=tablefmt, disable_numparse=True)]
        if self.notes:
            parts.append("Notes:\n" + "\n".join(f"  - {n}" for n in self.notes))
        return "\n\n".join(parts) + "\n"

    def __str__(self) -> str:
        return self.render()


def _fmt_solve(value, check) -> str:
    if value is None:
        return "-"
    text = f"{value}"
    if check and check.get("limited_by"):
        text += f" (the model's limit, {check['limited_by']}; memory allows {check['interpolated_answer']})"
    elif check:
        text += " (confirmed by tracing it and the next)" if check.get("confirmed") else " (interpolated)"
    return text


def _fmt_duration(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 3 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


class Planner:
    """Plans for one model and batch: traces once, then evaluates strategies and batch sizes."""

    def __init__(self, model, inputs, *, gpu: str | GPU, optimizer: Any = "adamw",
                 optimizer_kwargs: Mapping[str, Any] | None = None, loss_fn=None, precision: str = "fp32",
                 wrap: Any = None, device: str = "cuda", trace: str = "auto", gpus_per_node: int = 8,
                 interconnect: str | None = None, inter_node: str | None = None, overlap: float = 0.0,
                 model_name: str | None = None):
        if not isinstance(model, torch.nn.Module):
            raise UserError(f"model must be a torch.nn.Module, not {type(model).__name__}")
        if device not in ("cuda", "cpu"):
            raise UserError(f"device must be 'cuda' or 'cpu', not {device!r}")
        self.gpu = gpu if isinstance(gpu, GPU) else lookup(gpu)
        if gpus_per_node < 1:
            raise UserError(f"--gpus-per-node must be >= 1, not {gpus_per_node}")
        if not 0.0 <= overlap <= 1.0:
            raise UserError(f"--overlap must be between 0 and 1, not {overlap}")
        self.model, self.inputs, self.device = model, inputs, device
        self.model_name = model_name or type(model).__name__
        self.precision = parse_precision(precision)
        self.gpus_per_node, self.overlap = gpus_per_node, overlap
        intra, host = GPU_LINKS.get(self.gpu.name, ("pcie4", "pcie4"))
        self.intra = link(interconnect) if interconnect else LINKS[intra]
        self.inter = link(inter_node) if inter_node else LINKS[INTER_NODE_DEFAULT]
        self.host = LINKS[host]
        options = StepOptions(loss_fn=loss_fn, optimizer=optimizer, optimizer_kwargs=optimizer_kwargs,
                              foreach=True if device == "cuda" else None, precision=self.precision, train=True,
                              target=device)
        self.tracer = Tracer(model, inputs, options, device, trace)
        if wrap:
            self.wrap = resolve_classes(model, wrap, "--wrap")
            self.unit_paths = wrap_paths(model, self.wrap)
        else:
            self.wrap, self.unit_paths = default_wrap(model)
        self._analyses: dict[int, Analysis] = {}

    # -- pieces ---------------------------------------------------------------
    def analysis(self, step: Step) -> Analysis:
        an = self._analyses.get(id(step))
        if an is None:
            an = self._analyses[id(step)] = Analysis(step, self.model, self.unit_paths)
        return an

    def layout(self, strategy: str, gpus: int, tp: int, offload: str | None, reshard_after_forward: bool,
               rank: int = 0) -> Layout:
        return Layout(strategy, gpus, tp, self.gpus_per_node, rank, reshard_after_forward, offload, self.device,
                      self.precision.autocast)

    def peak(self, step: Step, layout: Layout) -> tuple[Peak, States, Schedule]:
        """The rank's peak over the steady-state step, its sizes and its timeline."""
        an = self.analysis(step)
        st = rank_states(an, layout)
        sched = build_schedule(an, layout, st)
        return replay(sched, _rounded(st.sizes, self.device), step.cats), st, sched

    def reserve(self, peak: int) -> dict[str, int]:
        out = dict(CUDA_RESERVE)
        out["fragmentation"] = int(FRAGMENTATION * peak)
        return out

    def fits(self, peak: int) -> bool:
        return peak + sum(self.reserve(peak).values()) <= self.gpu.memory

    def check(self, strategy: str, gpus: int, tp: int, offload: str | None, heads_from: Step | None = None) -> None:
        """Impossible combinations: one line saying what to change (heads and TP layers once traced)."""
        if strategy not in STRATEGIES:
            raise UserError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if gpus < 1:
            raise UserError(f"--gpus must be >= 1, not {gpus}")
        if tp < 1:
            raise UserError(f"--tp must be >= 1, not {tp}")
        if gpus % tp:
            raise UserError(f"--tp {tp} does not divide --gpus {gpus}: the GPUs form tp x dp groups; "
                            f"use a multiple of {tp} GPUs")
        if tp > self.gpus_per_node:
            raise UserError(f"--tp {tp} spans more than one node of {self.gpus_per_node} GPUs; "
                            f"keep tensor parallelism inside a node (--tp <= {self.gpus_per_node})")
        dp = gpus // tp
        if strategy != "ddp" and dp < 2:
            raise UserError(f"{strategy} with {dp} data-parallel GPU{'s' if dp != 1 else ''} shards nothing: "
                            f"use --strategy ddp, or at least {2 * tp} GPUs")
        if strategy == "hsdp" and dp <= max(1, self.gpus_per_node // tp):
            raise UserError(f"hsdp shards within a node and replicates across nodes: with {dp} data-parallel "
                            f"GPUs and {self.gpus_per_node} per node it is fsdp; use --strategy fsdp or more GPUs")
        if offload not in (None, *OFFLOADS):
            raise UserError(f"--offload must be one of {', '.join(OFFLOADS)}, not {offload!r}")
        if offload == "optimizer" and strategy == "ddp":
            raise UserError("--offload optimizer needs a sharded optimizer: use zero1, zero2, zero3, fsdp or hsdp")
        if offload == "params" and strategy not in SHARDED_PARAMS:
            raise UserError("--offload params needs sharded parameters: use zero3, fsdp or hsdp")
        if tp > 1 and heads_from is not None:
            heads = model_heads(self.model, heads_from)
            bad = sorted({h for h in heads.values() if h % tp})
            if bad:
                where = next(k for k, v in heads.items() if v == bad[0])
                raise UserError(f"--tp {tp} does not divide the {bad[0]} attention heads ({where}); "
                                f"use a divisor of {bad[0]}")
            an = self.analysis(heads_from)
            if not an.tp_params:
                raise UserError(f"--tp {tp}: the model has no Linear or Embedding weights to split; use --tp 1")

    # -- solve ----------------------------------------------------------------
    def solve(self, what: str, layout: Layout, checkpoint: tuple[type, ...] = (), confirm: bool = True,
              limit: int = 1 << 24) -> tuple[int | None, dict[str, Any]]:
        """Largest batch size (``what="batch"``) or sequence length that fits one GPU of ``layout``.

        Storage sizes are polynomials of the batch size (degree 1) or sequence length (degree 2,
        attention scores): traced at 2 (3) values with the same graph, each storage's size is
        interpolated and the rank's timeline replayed, so the peak at any value costs a replay.
        The answer is then confirmed by tracing it and the next value (it fits, the next does not);
        if the interpolation was wrong, the search goes on with traces only.
        """
        base = self.tracer.base(what)
        if what == "batch":
            points = [base, 2 * base]
        else:  # at and below the given length: a model may reject longer sequences
            points = [base // 4, base // 2, base] if base >= 4 else [base, 2 * base, 3 * base]
        steps = [self.tracer.at(what, v, checkpoint) for v in points]
        info: dict[str, Any] = {"method": "interpolated", "traced": list(points)}

        def traced_fits(v: int) -> tuple[bool, int]:
            s = self.tracer.at(what, v, checkpoint)
            pk = self.peak(s, layout)[0].total
            return self.fits(pk), pk

        same = all(s.structure() == steps[0].structure() for s in steps[1:])
        if same:
            an0 = self.analysis(steps[0])
            per = [rank_states(self.analysis(s), layout).sizes for s in steps]
            sched = build_schedule(an0, layout, rank_states(an0, layout))

            def fits_at(v: int) -> bool:
                sizes = _lagrange(points, per, v)
                return self.fits(replay(sched, _rounded(sizes, self.device), steps[0].cats).total)
        else:
            info["method"] = "traced (the graph changes with the size)"

            def fits_at(v: int) -> bool:
                return traced_fits(v)[0]

        if not fits_at(1):
            best = 0
        else:
            lo, hi = 1, 2
            while hi <= limit and fits_at(hi):
                lo, hi = hi, hi * 2
            if hi > limit:
                info["unbounded"] = True
                return None, info
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if fits_at(mid):
                    lo = mid
                else:
                    hi = mid
            best = lo
        if what == "seq":
            limit = position_limit(self.model)
            if limit is not None and best > limit[0]:
                info.update(limited_by=f"{limit[1]} = {limit[0]}", interpolated_answer=best)
                return limit[0], info
        if not confirm:
            return best, info
        # Confirm with traces: best fits, best + 1 does not; else search with traces from there.
        trace_budget = 16
        ok_best, peak_best = traced_fits(best) if best >= 1 else (True, 0)
        ok_next, peak_next = traced_fits(best + 1)
        if ok_best and not ok_next:
            info.update(confirmed=True, peak_at_answer=peak_best, peak_at_next=peak_next)
            return best, info
        info["interpolation_missed"] = best
        if not ok_best:
            lo, hi = 0, best
        else:
            lo, hi = best + 1, 2 * (best + 1)
            while traced_fits(hi)[0] and trace_budget > 0:
                lo, hi, trace_budget = hi, hi * 2, trace_budget - 1
        while hi - lo > 1 and trace_budget > 0:
            mid = (lo + hi) // 2
            if traced_fits(mid)[0]:
                lo = mid
            else:
                hi = mid
            trace_budget -= 1
        best = lo
        ok_best, peak_best = traced_fits(best) if best >= 1 else (True, 0)
        ok_next, peak_next = traced_fits(best + 1)
        info.update(confirmed=ok_best and not ok_next, peak_at_answer=peak_best, peak_at_next=peak_next)
        return best, info

    # -- one strategy -----------------------------------------------------------
    def plan(self, strategy: str = "ddp", gpus: int = 1, *, tp: int = 1, checkpoint: Any = None,
             offload: str | None = None, tokens: float | None = None, samples: float | None = None,
             steps: int | None = None, mfu: float | None = None, solve: Sequence[str] | str = ("batch",),
             reshard_after_forward: bool = True, rank: int = 0, confirm: bool = True,
             raise_if_impossible: bool = True) -> Plan:
        strategy = strategy.lower()
        self.check(strategy, gpus, tp, offload)
        ckpt = resolve_classes(self.model, checkpoint, "--checkpoint")
        base = self.tracer.original(())
        step = self.tracer.original(ckpt) if ckpt else base
        self.check(strategy, gpus, tp, offload, step)
        if sum(x is not None for x in (tokens, samples, steps)) > 1:
            raise UserError("give one budget: --tokens, --samples or --steps")
        for name, v in (("--tokens", tokens), ("--samples", samples), ("--steps", steps)):
            if v is not None and v <= 0:
                raise UserError(f"{name} must be > 0, not {v}")
        if mfu is not None and not 0.0 < mfu <= 1.0:
            raise UserError(f"--mfu must be in (0, 1], e.g. 0.4, not {mfu}")
        if rank < 0:
            raise UserError(f"rank must be >= 0, not {rank}")
        layout = self.layout(strategy, gpus, tp, offload, reshard_after_forward, rank)
        pk, st, sched = self.peak(step, layout)
        an = self.analysis(step)
        reserve = self.reserve(pk.total)
        margin = self.gpu.memory - pk.total - sum(reserve.values())
        fits = margin >= 0
        notes: list[str] = [step.note] if step.note else []
        min_gpus = None
        if not fits:
            min_gpus = self._min_gpus(step, layout)
            if min_gpus is None and raise_if_impossible:
                from .report import fmt_bytes

                inf = replace(layout, gpus=tp * (1 << 16)) if strategy != "ddp" else layout
                floor = self.peak(step, inf)[0].total if strategy != "ddp" else pk.total
                raise UserError(
                    f"this fits on no number of GPUs with {strategy}: even with the model states spread over "
                    f"any number of ranks one GPU needs {fmt_bytes(floor)} + reserve > {self.gpu.name}'s "
                    f"{fmt_bytes(self.gpu.memory)}; use a smaller micro-batch, --checkpoint CLASS, --tp, "
                    f"a sharded strategy (fsdp/zero3) or a larger GPU")
        # Solves.
        solve = (solve,) if isinstance(solve, str) else tuple(solve or ())
        max_batch = max_seq = None
        batch_info = seq_info = None
        if "batch" in solve:
            max_batch, batch_info = self.solve("batch", layout, ckpt, confirm)
        if "seq" in solve:
            max_seq, seq_info = self.solve("seq", layout, ckpt, confirm)
        # Time.
        time_info, flops_info = self._time(step, base, an, layout, st, tokens, samples, steps, mfu, notes)
        # Checkpoint on disk: parameters + buffers + optimizer state.
        t = step.tally
        full = t.parameters_bytes + t.buffers_bytes + t.optimizer_state_bytes
        if layout.shard_params:
            per_rank_params = st.local_params
        else:
            per_rank_params = sum(step.cap.storage_bytes[s] for s in step.param_sid.values())
            if tp > 1:
                per_rank_params = int(sum(
                    step.cap.storage_bytes[step.param_sid[n]] * (1 / tp if n in an.tp_params else 1)
                    for n in step.cap.params))
        opt_rank = sum(int(round(st.sizes[s])) for s in step.cap.sids.get("optimizer_state", ())) \
            if not offload else int(round(st.optim_fraction * t.optimizer_state_bytes))
        per_rank = per_rank_params + t.buffers_bytes + opt_rank + (st.master if layout.zero_mixed else 0)
        ckpt_size = {"full": full, "per_rank": per_rank if (layout.shard_params or layout.shard_optim or tp > 1)
                     else full}
        gathered = max((sum(v) for v in st.unit_gathered.values()), default=0) if layout.shard_params else 0
        comm = [sched.syn_sizes[i] for i, c in enumerate(sched.syn_cats) if c == "comm"]
        at = pk.by_category
        node = step.cap.nodes[pk.index] if pk.index >= 0 else None
        per_gpu = {
            "parameters": st.parameters,
            "gradients": st.gradients,
            "optimizer_state": st.optimizer_state,
            "activations": int(t.activations_bytes / tp),
            "gathered_parameters": int(gathered),
            "temporaries": int(at.get("temporary", 0)),
            "comm_buffers": int(max(comm, default=0)),
            "peak": pk.total,
            "peak_phase": node.meta.get("phase", "") if node is not None else "start",
            "peak_module": node.meta.get("module", "") if node is not None else "",
            "peak_op": str(node.target) if node is not None else "",
            "peak_breakdown": {k: int(v) for k, v in at.items() if v},
            "cpu_offloaded": st.cpu,
        }
        if strategy == "hsdp":
            notes.append(f"hsdp: sharded over {layout.shard} GPUs per node, replicated {layout.replicate} times")
        if tp > 1:
            notes.append("tensor parallelism: Linear/Embedding weight matrices and activations split in "
                         f"{tp} (Megatron with sequence parallelism); an approximation, not traced")
        if offload:
            notes.append(f"offload {offload}: the optimizer step runs on the CPU (its time is not modelled)")
        if self.device == "cpu":
            notes.append("device cpu: exact bytes, no CUDA allocator rounding")
        units = [{"path": u.path or "(root)", "parameters": sum(step.cap.params[n].numel() for n in u.params),
                  "gathered": int(sum(st.unit_gathered.get(u.path, []))) if layout.shard_params else 0}
                 for u in sorted(an.units.values(), key=lambda u: (u.fwd or (1 << 60, 0))[0])]
        batch, seq = input_dims(self.inputs)
        config = {
            "model": self.model_name, "gpu": self.gpu.name, "gpus": gpus, "strategy": strategy, "tp": tp,
            "dp": layout.dp, "shard_group": layout.shard, "precision": self.precision.name,
            "optimizer": step.cap.optimizer_name, "checkpoint": [c.__name__ for c in ckpt], "offload": offload,
            "wrap": [c.__name__ for c in self.wrap], "micro_batch": batch,
            "global_batch": batch * layout.dp if batch else None, "seq": seq,
        }
        return Plan(config, per_gpu, self.gpu.memory, reserve, fits, int(margin), max_batch, batch_info,
                    max_seq, seq_info, min_gpus, time_info, flops_info, ckpt_size, units, notes)

    def _min_gpus(self, step: Step, layout: Layout) -> int | None:
        """Fewest GPUs (a multiple of tp) on which ``layout``'s strategy fits, or None."""
        if layout.strategy == "ddp":
            return None
        lo_dp = max(2, layout.dp)
        hi_dp = 1 << 16

        def ok(dp: int) -> bool:
            lay = replace(layout, gpus=dp * layout.tp)
            if lay.strategy == "hsdp" and dp <= max(1, lay.gpus_per_node // lay.tp):
                lay = replace(lay, strategy="fsdp")
            return self.fits(self.peak(step, lay)[0].total)

        if not ok(hi_dp):
            return None
        if ok(lo_dp):
            return lo_dp * layout.tp
        while hi_dp - lo_dp > 1:
            mid = (lo_dp + hi_dp) // 2
            if ok(mid):
                hi_dp = mid
            else:
                lo_dp = mid
        return hi_dp * layout.tp

    def _time(self, step: Step, base: Step, an: Analysis, layout: Layout, st: States, tokens, samples, steps,
              mfu, notes) -> tuple[dict[str, Any], dict[str, Any]]:
        gpu = self.gpu
        roof = roofline(step, gpu)
        ph = roof["by_phase"]
        tp = layout.tp
        fwd = (ph.get("forward", 0.0) + ph.get("loss", 0.0)) / tp
        bwd = ph.get("backward", 0.0) / tp
        opt = 0.0 if layout.offload else ph.get("optimizer", 0.0) * st.optim_fraction
        compute = fwd + bwd + opt
        # Communication volumes (bytes each GPU sends), per collective.
        cap = step.cap
        grads = sum(int(round(st.sizes[s])) for s in cap.sids.get("gradient", ()))
        dp, shard, rep = layout.dp, layout.shard, layout.replicate
        spans = dp * tp > self.gpus_per_node
        dp_link = self.inter if spans else self.intra
        shard_link = self.inter if shard * tp > self.gpus_per_node else self.intra
        volumes: dict[str, float] = {}
        seconds: dict[str, float] = {}

        def add(name: str, kind: str, n: int, size: float, lk: Link) -> None:
            v = _ring(kind, n, size)
            if v:
                volumes[name] = volumes.get(name, 0.0) + v
                seconds[name] = seconds.get(name, 0.0) + v / lk.bandwidth

        s = layout.strategy
        if s == "ddp":
            add("all_reduce gradients", "all_reduce", dp, grads, dp_link)
        elif s in ("zero1", "zero2"):
            params_bytes = sum(int(round(st.sizes[step.param_sid[n]])) for n in cap.params)
            add("reduce_scatter gradients", "reduce_scatter", dp, grads, dp_link)
            add("all_gather parameters", "all_gather", dp, params_bytes, dp_link)
        else:
            units = an.ordered_units
            for u in units:
                size = sum(st.unit_gathered.get(u.path, []))
                add("all_gather parameters (forward)", "all_gather", shard, size, shard_link)
                if layout.reshard_after_forward and u.path != "":
                    add("all_gather parameters (backward)", "all_gather", shard, size, shard_link)
            add("reduce_scatter gradients", "reduce_scatter", shard, grads, shard_link)
            if rep > 1:
                add("all_reduce gradients across replicas", "all_reduce", rep, st.gradients, self.inter)
        if tp > 1:
            act_item = _itemsize(self.precision.autocast or self.precision.cast or torch.float32)
            for u in an.units.values():
                shapes = cap.module_outputs.get(u.path) if u.path else None
                if u.path and shapes:
                    numel = math.prod(shapes[0])
                    add("tensor-parallel activations", "all_reduce", tp, 4 * numel * act_item, self.intra)
        offload_s = 0.0
        grad_shard = sum(st.unit_shard.values()) * st.reduce_itemsize
        param_shard = st.local_params if layout.shard_params else st.local_params / layout.dp
        if layout.offload == "params":  # parameter shards in for each all-gather (forward, backward), gradients out
            offload_s = (2 * param_shard + grad_shard) / self.host.bandwidth
        elif layout.offload == "optimizer":  # sharded gradients out, updated parameter shards in
            offload_s = (grad_shard + param_shard) / self.host.bandwidth
        comm = sum(seconds.values())
        exposed = max(comm * (1 - self.overlap), comm - compute)
        step_time = compute + exposed + offload_s
        # FLOPs and MFU: matmul-class FLOPs of the step without recomputation, this GPU's share.
        mm = roofline(base, gpu)["matmul_flops_by_dtype"] if base is not step else roof["matmul_flops_by_dtype"]
        model_flops = sum(mm.values()) / tp
        dtype = max(mm, key=mm.get) if mm else "float32"
        peak = gpu.peak_flops(dtype) or gpu.peak_flops("fp32")
        mfu_est = model_flops / (step_time * peak) if step_time > 0 and peak else None
        batch, _ = input_dims(self.inputs)
        tps = tokens_per_sample(self.inputs)
        samples_per_step = (batch or 0) * dp
        tokens_per_step = samples_per_step * tps if tps else None
        n_steps = None
        if steps is not None:
            n_steps = int(steps)
        elif tokens is not None:
            if not tokens_per_step:
                raise UserError("--tokens needs integer token inputs of shape (batch, seq); use --samples or --steps")
            n_steps = math.ceil(tokens / tokens_per_step)
        elif samples is not None:
            n_steps = math.ceil(samples / samples_per_step)
        train_step = model_flops / (mfu * peak) if mfu else step_time
        time_to_train = n_steps * train_step if n_steps is not None else None
        # PaLM appendix B: 6N + 12 L H Q T per token (transformers: attention ops traced).
        n_mm = matmul_params(base)
        attn = attention_term(base)
        flops_info: dict[str, Any] = {
            "model_flops_per_step_per_gpu": int(model_flops), "matmul_dtype": dtype,
            "peak_flops_per_s": peak, "matmul_params": n_mm,
        }
        if attn is not None and tps:
            traced_per_token = sum(mm.values()) / ((batch or 1) * tps)
            six = 6 * n_mm + attn
            flops_info.update(traced_per_token=traced_per_token, six_nd_per_token=six, attention_per_token=attn,
                              six_nd_over_traced=six / traced_per_token if traced_per_token else None)
            if n_steps is not None:
                total_tokens = n_steps * tokens_per_step
                used = mfu if mfu else mfu_est
                flops_info["six_nd_total"] = six * total_tokens
                flops_info["six_nd_time_s"] = (six * total_tokens / (layout.gpus * peak * used)
                                               if used else None)
        links = sorted({dp_link.name if dp > 1 else None, shard_link.name if shard > 1 else None,
                        self.intra.name if tp > 1 else None} - {None})
        time_info = {
            "compute_s": compute, "by_phase_s": {"forward": fwd, "backward": bwd, "optimizer": opt},
            "comm_s": comm, "comm_exposed_s": exposed, "comm_bytes": {k: int(v) for k, v in volumes.items()},
            "comm_by_collective_s": seconds, "offload_s": offload_s, "overlap": self.overlap,
            "links": ", ".join(links) or "none", "step_time_s": step_time, "mfu_estimated": mfu_est,
            "mfu_given": mfu, "mfu_used": mfu if mfu else mfu_est, "tokens_per_step": tokens_per_step,
            "samples_per_step": samples_per_step, "steps": n_steps, "time_to_train_s": time_to_train,
        }
        return time_info, flops_info

    # -- comparison -------------------------------------------------------------
    def compare(self, gpus: int, *, strategies: Sequence[str] | None = None, tp: int = 1, checkpoint: Any = None,
                offload: str | None = None, tokens=None, samples=None, steps=None, mfu=None,
                confirm: bool = True) -> "Comparison":
        """One row per strategy, without and with activation checkpointing (``checkpoint`` classes,
        by default the wrap class)."""
        ckpt_sets = [()]
        ck = resolve_classes(self.model, checkpoint, "--checkpoint") if checkpoint else self.wrap
        if ck:
            ckpt_sets.append(tuple(ck))
        names = list(strategies) if strategies else list(STRATEGIES)
        rows = []
        skipped = []
        for s in names:
            for ckset in ckpt_sets:
                try:
                    p = self.plan(s, gpus, tp=tp, checkpoint=list(ckset) or None, offload=offload, tokens=tokens,
                                  samples=samples, steps=steps, mfu=mfu, confirm=confirm, raise_if_impossible=False)
                except UserError as exc:
                    if strategies:
                        raise
                    if not ckset:
                        skipped.append(f"{s}: {exc}")
                    continue
                rows.append(p)
        if not rows:
            raise UserError("no strategy applies: " + "; ".join(skipped))
        return Comparison(rows, skipped)


def _lagrange(xs: Sequence[int], ys: Sequence[Sequence[float]], x: float) -> list[float]:
    """Per-element Lagrange interpolation of the vectors ``ys`` (taken at ``xs``) at ``x``."""
    weights = []
    for i, xi in enumerate(xs):
        w = 1.0
        for j, xj in enumerate(xs):
            if j != i:
                w *= (x - xj) / (xi - xj)
        weights.append(w)
    n = len(ys[0])
    return [sum(w * y[k] for w, y in zip(weights, ys)) for k in range(n)]


def matmul_params(step: Step) -> int:
    """Parameters that enter a matmul-class op in forward (through views and casts): the N of 6N."""
    cap = step.cap
    users: dict[int, list] = defaultdict(list)
    for rec in _records(cap):
        for a in pytree.tree_leaves((rec.args, rec.kwargs)):
            if _is_node(a):
                users[id(a)].append(rec)
    count = 0
    for name, holder in step.param_node.items():
        frontier, seen, hit = [holder], set(), False
        while frontier and not hit:
            node = frontier.pop()
            for user in users.get(id(node), ()):
                if user in seen or user.meta.get("phase") not in ("forward", "loss"):
                    continue
                seen.add(user)
                cost = user.meta.get("cost")
                if cost is not None and cost.kind == MATMUL:
                    hit = True
                    break
                if user.target is _getitem or (cost is not None and cost.kind == "zero"):
                    frontier.append(user)
        if hit:
            count += cap.params[name].numel()
    return count


def attention_term(step: Step) -> int | None:
    """12 * sum over attention ops of H * Q * T_k (PaLM's 12 L H Q T per token), None without attention."""
    total, found = 0, False
    for node in step.cap.nodes:
        packet = getattr(node.target, "overloadpacket", None)
        name = packet.__name__ if packet is not None else ""
        if node.meta.get("phase") != "forward" or "scaled_dot_product" not in name or "backward" in name:
            continue
        args = [a for a in node.args[:2] if _is_node(a)]
        if len(args) < 2:
            continue
        q, k = (args[0].meta.get("spec") or (None,))[0], (args[1].meta.get("spec") or (None,))[0]
        if q is None or k is None or len(q.shape) < 4:
            continue
        found = True
        total += 12 * q.shape[-3] * q.shape[-1] * k.shape[-2]
    return total if found else None


_POSITION_ATTRS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "max_sequence_length",
                   "block_size", "seq_length")


def position_limit(model: torch.nn.Module) -> tuple[int, str] | None:
    """The longest sequence the model accepts, if it says: a config / module attribute (max_position_embeddings,
    n_positions, block_size...) or the rows of a position-embedding table; None if it does not say."""
    found: list[tuple[int, str]] = []
    cfg = getattr(model, "config", None)
    for holder, prefix in [(cfg, "config")] + [(m, p or "(root)") for p, m in model.named_modules()]:
        for attr in _POSITION_ATTRS:
            v = getattr(holder, attr, None) if holder is not None else None
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                found.append((v, f"{prefix}.{attr}"))
    for path, mod in model.named_modules():
        last = path.rpartition(".")[2].lower()
        if isinstance(mod, torch.nn.Embedding) and ("pos" in last or last == "wpe"):
            found.append((mod.num_embeddings, f"{path}.num_embeddings"))
    return min(found) if found else None


def model_heads(model: torch.nn.Module, step: Step | None) -> dict[str, int]:
    """Attention head counts: module attributes (n_head, num_heads, ...), config, traced attention ops."""
    out: dict[str, int] = {}
    for path, mod in model.named_modules():
        for attr in _HEAD_ATTRS:
            v = getattr(mod, attr, None)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                out[f"{path or '(root)'}.{attr}"] = v
    cfg = getattr(model, "config", None)
    for attr in _HEAD_ATTRS:
        v = getattr(cfg, attr, None)
        if isinstance(v, int) and v > 0:
            out[f"config.{attr}"] = v
    if step is not None:
        for node in step.cap.nodes:
            packet = getattr(node.target, "overloadpacket", None)
            if packet is not None and "scaled_dot_product" in packet.__name__ and node.args \
                    and _is_node(node.args[0]):
                spec = (node.args[0].meta.get("spec") or (None,))[0]
                if spec is not None and len(spec.shape) == 4:
                    out.setdefault(f"{node.meta.get('module', '')} (traced attention)", spec.shape[1])
    return out


@dataclass
class Comparison:
    rows: list[Plan]
    skipped: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [_row(p) for p in self.rows], "skipped": list(self.skipped),
                "plans": [p.to_dict() for p in self.rows]}

    def render(self, tablefmt: str = "simple") -> str:
        from tabulate import tabulate

        from .report import fmt_bytes

        body = []
        for p in self.rows:
            r = _row(p)
            body.append([r["strategy"], ", ".join(r["checkpoint"]) or "-", fmt_bytes(r["peak"]),
                         "yes" if r["fits"] else "no", "-" if r["max_batch"] is None else str(r["max_batch"]),
                         f"{r['step_time_s'] * 1e3:.2f} ms", _fmt_duration(r["time_to_train_s"])])
        first = self.rows[0].config
        head = f"Strategies for {first['model']} on {first['gpus']} x {first['gpu']} ({first['precision']})"
        parts = [head, tabulate(body, headers=["Strategy", "Checkpoint", "Peak / GPU", "Fits", "Max batch",
                                               "Step time", "Time to train"], tablefmt=tablefmt,
                                disable_numparse=True)]
        if self.skipped:
            parts.append("Not applicable:\n" + "\n".join(f"  - {s}" for s in self.skipped))
        return "\n\n".join(parts) + "\n"

    def __str__(self) -> str:
        return self.render()


def _row(p: Plan) -> dict[str, Any]:
    return {"strategy": p.config["strategy"], "checkpoint": p.config["checkpoint"], "peak": p.per_gpu["peak"],
            "fits": p.fits, "max_batch": p.max_batch, "step_time_s": p.step_time_s,
            "time_to_train_s": p.time_to_train_s}


# -- API ------------------------------------------------------------------------


def plan(model: torch.nn.Module, inputs: Any, *, gpu: str, gpus: int = 1, strategy: str = "ddp", tp: int = 1,
         optimizer: Any = "adamw", optimizer_kwargs: Mapping[str, Any] | None = None, loss_fn=None,
         precision: str = "fp32", checkpoint: Any = None, offload: str | None = None, wrap: Any = None,
         tokens: float | None = None, samples: float | None = None, steps: int | None = None,
         mfu: float | None = None, solve: Sequence[str] | str = ("batch",), gpus_per_node: int = 8,
         interconnect: str | None = None, inter_node: str | None = None, overlap: float = 0.0,
         reshard_after_forward: bool = True, device: str = "cuda", rank: int = 0, trace: str = "auto",
         confirm: bool = True, model_name: str | None = None) -> Plan:
    """Plan a training step of ``model`` on ``gpus`` GPUs called ``gpu`` with ``strategy``.

    ``inputs`` are one GPU's micro-batch.  Returns a :class:`Plan`: per-GPU memory (rank
    ``rank`` of the shard group; rank 0 holds the most), peak vs capacity, fits or not
    and the margin, the largest micro-batch that fits (``solve`` may add ``"seq"``),
    step time, time to train for the budget (``tokens`` / ``samples`` / ``steps``),
    checkpoint size.  ``device="cpu"`` plans exact bytes without CUDA rounding (tests).
    Raises :class:`UserError` for impossible combinations and when no number of GPUs fits.
    """
    planner = Planner(model, inputs, gpu=gpu, optimizer=optimizer, optimizer_kwargs=optimizer_kwargs,
                      loss_fn=loss_fn, precision=precision, wrap=wrap, device=device, trace=trace,
                      gpus_per_node=gpus_per_node, interconnect=interconnect, inter_node=inter_node,
                      overlap=overlap, model_name=model_name)
    return planner.plan(strategy, gpus, tp=tp, checkpoint=checkpoint, offload=offload, tokens=tokens,
                        samples=samples, steps=steps, mfu=mfu, solve=solve,
                        reshard_after_forward=reshard_after_forward, rank=rank, confirm=confirm)


def compare(model: torch.nn.Module, inputs: Any, *, gpu: str, gpus: int, strategies: Sequence[str] | None = None,
            tp: int = 1, optimizer: Any = "adamw", loss_fn=None, precision: str = "fp32", checkpoint: Any = None,
            offload: str | None = None, wrap: Any = None, tokens=None, samples=None, steps=None, mfu=None,
            gpus_per_node: int = 8, interconnect: str | None = None, inter_node: str | None = None,
            overlap: float = 0.0, device: str = "cuda", trace: str = "auto", confirm: bool = True,
            model_name: str | None = None) -> Comparison:
    """Side-by-side plans: one row per strategy, without and with activation checkpointing."""
    planner = Planner(model, inputs, gpu=gpu, optimizer=optimizer, loss_fn=loss_fn, precision=precision, wrap=wrap,
                      device=device, trace=trace, gpus_per_node=gpus_per_node, interconnect=interconnect,
                      inter_node=inter_node, overlap=overlap, model_name=model_name)
    return planner.compare(gpus, strategies=strategies, tp=tp, checkpoint=checkpoint, offload=offload,
                           tokens=tokens, samples=samples, steps=steps, mfu=mfu, confirm=confirm)


# -- command line -----------------------------------------------------------------

EPILOG = """examples:
  estimator plan examples/gpt.py:build --gpu H100 --gpus 8 --strategy fsdp
  estimator plan examples/gpt.py:build --gpu A100-40GB --gpus 64 --strategy zero3 --precision bf16-mixed --tokens 20B
  estimator plan examples/gpt.py:build --gpu L4 --gpus 4 --compare --checkpoint Block --format json
  estimator plan examples/gpt.py:build --gpu H100 --gpus 16 --tp 2 --strategy fsdp --mfu 0.4 --steps 10000
  estimator plan examples/gpt.py:build --gpu RTX4090 --gpus 2 --strategy fsdp --offload optimizer --solve seq
"""

_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "p": 1e15}


def parse_count(text: str) -> float:
    """``300B``, ``1.5T``, ``2e12``, ``10M``, ``500k`` -> a number."""
    s = str(text).strip().lower().replace("_", "").replace(",", "")
    mult = 1.0
    if s and s[-1] in _SUFFIX:
        mult, s = _SUFFIX[s[-1]], s[:-1]
    try:
        value = float(s) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count; write e.g. 300B, 1.5T, 2e12 or 10000") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def add_plan_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``estimator plan`` on ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    p = subparsers.add_parser(
        "plan", help="plan a run on N GPUs: memory per GPU, fits or not, largest batch, time "
                     "(e.g. estimator plan examples/gpt.py:build --gpu H100 --gpus 8 --strategy fsdp)",
        description="Plan one training step on a cluster: per-GPU memory under a data-parallel strategy "
                    "(DDP, ZeRO 1-3, FSDP2, HSDP) and tensor parallelism, peak vs capacity, the largest "
                    "micro-batch that fits, step time and time to train. Derived from the traced step.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", metavar="SPEC",
                   help="path/to/file.py:callable or package.module:callable returning an nn.Module or a "
                        "(module, inputs) pair; the inputs are ONE GPU's micro-batch (e.g. examples/gpt.py:build)")
    p.add_argument("--input", action="append", metavar="SHAPE[:DTYPE]", default=[],
                   help="an input's shape (one GPU's micro-batch), repeatable; overrides inputs from SPEC "
                        "(e.g. --input 8x1024:int64)")
    p.add_argument("--gpu", required=True, metavar="NAME",
                   help="the GPU (see 'estimator hardware'), e.g. --gpu H100 or --gpu A100-40GB")
    p.add_argument("--gpus", type=int, default=1, metavar="N", help="number of GPUs (default: 1), e.g. --gpus 64")
    p.add_argument("--strategy", default="ddp", choices=STRATEGIES,
                   help="data parallelism: ddp, zero1, zero2, zero3, fsdp (FSDP2 fully_shard) or hsdp "
                        "(sharded in a node, replicated across nodes) (default: ddp), e.g. --strategy fsdp")
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor-parallel degree inside a node (default: 1), e.g. --tp 2")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16", "bf16-mixed", "fp16-mixed"),
                   help="fp32; bf16/fp16 (model cast); bf16-mixed/fp16-mixed (autocast, fp32 master weights) "
                        "(default: fp32), e.g. --precision bf16-mixed")
    p.add_argument("--optimizer", default="adamw", metavar="NAME[:k=v,...]",
                   help="optimizer as in 'estimator estimate' (default: adamw), e.g. --optimizer sgd:momentum=0.9")
    p.add_argument("--checkpoint", action="append", metavar="CLASS", default=[],
                   help="run every instance of this module class under activation checkpointing; repeatable, "
                        "e.g. --checkpoint Block")
    p.add_argument("--wrap", action="append", metavar="CLASS", default=[],
                   help="FSDP unit class (fully_shard on each instance and on the root); default: the class "
                        "of the largest list of repeated blocks, e.g. --wrap Block")
    p.add_argument("--offload", choices=OFFLOADS,
                   help="keep the optimizer state (optimizer) or also the sharded parameters and gradients "
                        "(params) in host memory, e.g. --offload optimizer")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--tokens", type=parse_count, metavar="N",
                        help="training budget in tokens (suffixes K M B T), e.g. --tokens 300B")
    budget.add_argument("--samples", type=parse_count, metavar="N",
                        help="training budget in samples, e.g. --samples 1.2M")
    budget.add_argument("--steps", type=parse_count, metavar="N", help="training budget in steps, e.g. --steps 10000")
    p.add_argument("--mfu", type=float, metavar="F",
                   help="model FLOPs utilisation to assume for the time to train instead of the roofline "
                        "estimate, e.g. --mfu 0.4")
    p.add_argument("--solve", action="append", choices=("batch", "seq"), default=[],
                   help="also solve the longest sequence (seq) that fits; the largest micro-batch (batch) is "
                        "always solved, e.g. --solve seq")
    p.add_argument("--compare", action="store_true",
                   help="one row per strategy, without and with activation checkpointing (of --checkpoint or "
                        "the wrap class), e.g. --compare")
    p.add_argument("--gpus-per-node", type=int, default=8, metavar="N",
                   help="GPUs per node: groups larger than this use the inter-node link (default: 8), "
                        "e.g. --gpus-per-node 4")
    p.add_argument("--interconnect", metavar="LINK",
                   help=f"link between the GPUs of a node ({', '.join(LINKS)}); default from the GPU, "
                        f"e.g. --interconnect nvlink4")
    p.add_argument("--inter-node", metavar="LINK",
                   help=f"link between nodes (default: {INTER_NODE_DEFAULT}), e.g. --inter-node ib-hdr")
    p.add_argument("--overlap", type=float, default=0.0, metavar="F",
                   help="fraction of communication hidden behind compute (default: 0), e.g. --overlap 0.8")
    p.add_argument("--reshard-after-forward", type=_bool, default=True, metavar="BOOL",
                   help="FSDP: free gathered parameters after forward (true, ZeRO-3-like) or keep them for "
                        "backward (false, ZeRO-2-like) (default: true), e.g. --reshard-after-forward false")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="allocator model: cuda (512-byte blocks, the default) or cpu (exact bytes), e.g. --device cpu")
    p.add_argument("--format", default="table", choices=("table", "json"), help="output format, e.g. --format json")
    p.add_argument("--output", metavar="FILE", help="write to FILE instead of stdout, e.g. --output plan.json")
    p.add_argument("--debug", action="store_true", help="show the full traceback of errors, e.g. --debug")
    p.set_defaults(run=run_plan)
    return p


def run_plan(args: argparse.Namespace) -> int:
    """The ``plan`` subcommand; user errors raise :class:`UserError` (the CLI prints one line, exit 2)."""
    from .specs import load

    model, inputs = load(args.spec, args.input)
    planner = Planner(model, inputs, gpu=args.gpu, optimizer=args.optimizer, precision=args.precision,
                      wrap=args.wrap or None, device=args.device, gpus_per_node=args.gpus_per_node,
                      interconnect=args.interconnect, inter_node=args.inter_node, overlap=args.overlap,
                      model_name=args.spec)
    steps = int(args.steps) if args.steps is not None else None
    if args.compare:
        result = planner.compare(args.gpus, tp=args.tp, checkpoint=args.checkpoint or None, offload=args.offload,
                                 tokens=args.tokens, samples=args.samples, steps=steps, mfu=args.mfu)
    else:
        result = planner.plan(args.strategy, args.gpus, tp=args.tp, checkpoint=args.checkpoint or None,
                              offload=args.offload, tokens=args.tokens, samples=args.samples, steps=steps,
                              mfu=args.mfu, solve=("batch", *args.solve),
                              reshard_after_forward=args.reshard_after_forward)
    from .cli import _write  # the CLI's writer: stdout, or the file written atomically

    text = json.dumps(result.to_dict(), indent=2) if args.format == "json" else result.render()
    _write(text, args.output)
    return 0

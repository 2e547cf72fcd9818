"""Tensor parallelism's pairs read from the traced dataflow (:func:`derive_tp_plan`): which Linear layers split how
(colwise, rowwise, or gathered), which norms run on sequence shards, which parts of a block stay whole.  Applied by
:mod:`.tp` with PyTorch's own ``parallelize_module``; the method is described there."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch

from ..capture import Capture
from ..graph import OpNode
from .expert import expert_paths
from .traced import getitem_source

_HEAD_ATTRS = ("num_heads", "n_head", "n_heads", "num_attention_heads", "nhead", "num_key_value_heads", "n_kv_heads")


@dataclass
class TPPlan:
    """Module paths and how each is split."""

    colwise: list[str] = field(default_factory=list)
    rowwise: list[str] = field(default_factory=list)
    embedding: str | None = None
    head: str | None = None
    norms: list[str] = field(default_factory=list)  # sequence parallel: norms on sequence shards
    gather_at: list[str] = field(default_factory=list)  # sequence parallel: all-gather the sequence here
    moe: list[str] = field(default_factory=list)  # mixture-of-experts blocks: their rowwise Linears sum partially
    tied: tuple[str, str] | None = None  # (embedding, head) sharing their weight: both replicated
    post_norms: list[str] = field(default_factory=list)  # sequence parallel: block norms feeding a residual sum
    cross_head_norms: list[str] = field(default_factory=list)  # norms over all heads' features inside an attention
    per_head: list[str] = field(default_factory=list)  # an attention's own parameters of one value per head (sinks)
    whole: list[str] = field(default_factory=list)  # a block's parts with Linears none of which is split
    gathered: list[str] = field(default_factory=list)  # Linears of groups whose outputs are gathered (OLMo 2)
    notes: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.colwise or self.rowwise or self.embedding or self.head)


def _within(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")


def _ancestors(path: str) -> Iterator[str]:
    """``path`` and the module paths it lies within, innermost first (``"a.b.c"``, ``"a.b"``, ``"a"``): each
    ``prefix`` with ``_within(path, prefix)``."""
    yield path
    while "." in path:
        path = path.rpartition(".")[0]
        yield path


def _innermost(path: str, paths: set[str] | dict) -> str | None:
    """The longest of ``paths`` that ``path`` lies within (None: none): a walk up the path, not a scan of
    ``paths`` (a 126-layer model has 882 Linears, read for each of its ~40,000 forward ops)."""
    return next((p for p in _ancestors(path) if p in paths), None)


def _common(paths: list[str]) -> str:
    parts = [p.split(".") for p in paths]
    out = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        out.append(level[0])
    return ".".join(out)


def derive_tp_plan(model: torch.nn.Module, cap: Capture, unit_paths: list[str]) -> TPPlan:
    """Megatron's colwise/rowwise pairs of ``model``, read from its single-device step ``cap``."""
    modules = dict(model.named_modules())
    linears = {p for p, m in modules.items() if isinstance(m, torch.nn.Linear)}
    norms = {p for p, m in modules.items() if "norm" in type(m).__name__.lower()}
    norms -= per_head_norms(cap, norms)

    units = set(unit_paths)

    def unit_of(path: str) -> str | None:
        return _innermost(path, units)

    def linear_of(path: str) -> str | None:
        return _innermost(path, linears)

    first, inputs = _linear_inputs(cap, linear_of)
    cut = cut_on_features(cap, linears)
    plan = TPPlan()
    colwise: set[str] = set()
    rowwise: set[str] = set()
    for lp in sorted(first, key=first.get):
        unit = unit_of(lp)
        if unit is None:
            continue
        partners: set[str] = set()
        inner_norms: list[str] = []  # norms inside lp's own module, between lp and its partners
        through: list[bool] = [False]  # walk through those norms (a gathered group's second walk)
        joins: set[int] = set()  # features of elementwise ops joining a tensor from outside the block

        def ends_walk(node: OpNode, lp: str = lp, unit: str = unit) -> bool:
            module = node.meta.get("module", "")
            if not _within(module, unit):
                return True
            joins.update(_outside_joins(node, unit))
            norm = next((n for n in _ancestors(module) if n in norms and _within(n, unit)), None)
            if norm is not None:
                inner = _within(norm, lp.rpartition(".")[0])
                if inner and norm not in inner_norms:
                    inner_norms.append(norm)
                return not (inner and through[0])
            other = linear_of(module)
            if other is not None and other != lp:
                partners.add(other)
                return True
            return False

        _walk_back(inputs.get(lp, ()), ends_walk)
        if joins & {getattr(modules[p], "out_features", None) for p in partners}:
            continue  # a partner's whole output meets a tensor from outside the block (Gemma 4's per-layer input)
        if partners and not partners & rowwise and lp not in colwise:
            if inner_norms:
                # a norm between the colwise group and its rowwise Linear normalizes over all the heads split between
                # them (OLMo 2's q_norm and k_norm; one before a Linear that pairs with nothing is on the unsplit
                # input side: MLA's q_a_layernorm before q_b_proj): the group's outputs are gathered, as
                # transformers' plan for OLMo 2 runs them (colwise_gather_output, rowwise_split_input); the walk
                # goes on through those norms to the projections behind them
                plan.cross_head_norms += [n for n in inner_norms if n not in plan.cross_head_norms]
                through[0] = True
                _walk_back(inputs.get(lp, ()), ends_walk)
                plan.gathered += sorted(partners | {lp})
            elif partners & cut:  # a fused projection cut at fixed offsets (Phi-3's qkv_proj, GLM's gate_up_proj)
                plan.gathered += sorted(partners | {lp})
            rowwise.add(lp)
            colwise |= partners
            group = sorted(partners)
            plan.gather_at.append(_common(group) if len(group) > 1 else group[0])
    _drop_side_pairs(cap, modules, units, colwise, rowwise, plan, linear_of)
    plan.colwise = sorted(colwise, key=lambda p: first.get(p, 0))
    plan.rowwise = sorted(rowwise, key=lambda p: first.get(p, 0))
    plan.gather_at = sorted(set(plan.gather_at), key=lambda p: min(first.get(c, 0) for c in colwise if _within(c, p)))
    _outside_blocks(plan, modules, sorted(first, key=first.get), unit_of)
    plan.moe = sorted({p.rpartition(".")[0] for p in expert_paths(model)})
    plan.whole = whole_parts(modules, units, colwise | rowwise, plan.moe)
    _sequence_norms(plan, cap, norms, unit_of, linear_of, [first.get(c, 0) for c in colwise | rowwise], inputs)
    plan.per_head = per_head_parameters(model, colwise)
    plan.notes += _notes(plan)
    return plan


def _drop_side_pairs(cap: Capture, modules: dict[str, torch.nn.Module], units: set[str], colwise: set[str],
                     rowwise: set[str], plan: TPPlan, linear_of: Callable[[str], str | None]) -> None:
    """A block part whose output comes from a Linear left whole, while pairs lie inside it (Kimi Linear's and OLMo
    hybrid's low-rank gates beside their unsplit q, k, v and o projections), runs whole: its pairs are dropped (split,
    a gate's sum over the tp ranks would meet whole tensors)."""
    last: dict[str, int] = {}
    for i, node in enumerate(cap.nodes):
        if node.meta.get("phase") == "forward":
            for a in _ancestors(node.meta.get("module", "")):
                last[a] = i
    for unit in sorted(units):
        module = modules.get(unit)
        for name, _ in (module.named_children() if module is not None else ()):
            part = f"{unit}.{name}"
            if part not in last or not any(_within(p, part) for p in rowwise):
                continue
            out = linear_of(cap.nodes[last[part]].meta.get("module", ""))
            if out is not None and out not in rowwise:
                drop = {p for p in colwise | rowwise if _within(p, part)}
                colwise -= drop
                rowwise -= drop
                plan.gather_at = [g for g in plan.gather_at if not _within(g, part)]
                plan.gathered = [g for g in plan.gathered if g not in drop]
                plan.cross_head_norms = [n for n in plan.cross_head_norms if not _within(n, part)]


def _sequence_norms(plan: TPPlan, cap: Capture, norms: set[str], unit_of: Callable, linear_of: Callable,
                    starts: list[int], inputs: dict[str, list]) -> None:
    """The norms sequence parallelism runs on sequence shards (``plan.norms``) and those of them that return their
    local shard (``plan.post_norms``), given the first op of each split Linear (``starts``)."""
    # a norm inside a group's module runs on the gathered sequence, not on shards (MLA's q_a_layernorm, kv_a_layernorm)
    in_units = [n for n in norms if unit_of(n) is not None and linear_of(n) is None
                and not any(_within(n, g) for g in plan.gather_at + plan.whole)]
    final = [n for n in norms if unit_of(n) is None and n in _forward_modules(cap, after=max(starts, default=0))]
    plan.norms = sorted(in_units) + final
    residual = _norms_in_residual_sums(cap, in_units, unit_of, linear_of)
    plan.post_norms = sorted((set(in_units) - _norms_read_by(set(plan.colwise), inputs, in_units)) | residual)
    # a final norm that also runs before the blocks (nanochat's model.norm, on the embeddings) feeds the residual
    # stream there: its local shard, as the blocks' outputs are
    early = {n.meta.get("module", "") for n in cap.nodes[:min(starts, default=0)] if n.meta.get("phase") == "forward"}
    plan.post_norms += [n for n in final if n in early]


def _norms_in_residual_sums(cap: Capture, norms: list[str], unit_of: Callable, linear_of: Callable) -> set[str]:
    """The norms whose output is itself a term of a residual sum (MiniMax keeps the normed input as the residual:
    ``residual = norm(x); x = residual * alpha + attn(residual) * beta``): under sequence parallelism they return
    their local shard, as the residual stream is.  Walking back from every residual sum in the blocks, stopping at
    Linears (what they make is not the norm's output) and at the blocks' edges."""
    sums = [n for n in cap.nodes if n.meta.get("phase") == "forward" and _residual_sum(n)
            and unit_of(n.meta.get("module", "")) is not None]
    return _norms_reached([a for n in sums for a in n.args[:2] if isinstance(a, OpNode)], norms,
                          lambda module, _node: unit_of(module) is None or linear_of(module) is not None)


def _outside_blocks(plan: TPPlan, modules: dict[str, torch.nn.Module], linears_in_order: list[str],
                    unit_of: Callable[[str], str | None]) -> None:
    """Outside the blocks: the token embedding (the largest) and the LM head (the last Linear run), unless they
    share a weight (then both replicated)."""
    outside_linears = [p for p in linears_in_order if unit_of(p) is None]
    embeddings = [(p, m) for p, m in modules.items() if isinstance(m, torch.nn.Embedding) and unit_of(p) is None]
    embedding = max(embeddings, key=lambda pm: pm[1].num_embeddings, default=(None, None))
    head = outside_linears[-1] if outside_linears else None
    if embedding[0] is not None and head is not None and modules[head].weight is embedding[1].weight:
        plan.notes.append(f"the embedding {embedding[0]} and the head {head} share their weight: both replicated")
        plan.tied = (embedding[0], head)
    else:
        plan.embedding = embedding[0]
        plan.head = head


def _notes(plan: TPPlan) -> list[str]:
    """What the plan leaves whole or splits beyond the Linear pairs, for the report."""
    notes = []
    if plan.whole:
        kinds = sorted({re.sub(r"\.\d+\.", ".*.", p) for p in plan.whole})
        notes.append(f"tensor parallelism: {len(plan.whole)} block part{'s' if len(plan.whole) > 1 else ''} with "
                     f"Linear layers that pair with none ({', '.join(kinds[:3])}{' ...' if len(kinds) > 3 else ''}) "
                     f"run whole on every tp rank: their compute and parameters are not divided by tp; under "
                     f"sequence parallelism they take the whole sequence (their input all-gathered)")
    if plan.per_head:
        more = f" and {len(plan.per_head) - 1} more" if len(plan.per_head) > 1 else ""
        notes.append(f"parameters of one value per attention head split with the heads over the tp ranks: "
                     f"{plan.per_head[0]}{more}")
    return notes


def whole_parts(modules: dict[str, torch.nn.Module], units: set[str], split: set[str], moe: list[str]) -> list[str]:
    """The parts of each block (its direct children) that hold Linear layers none of which is split: a mixer the plan
    leaves whole on every rank (Qwen3-Next's and Kimi Linear's linear attention, a gate).  Under sequence parallelism
    such a part needs the whole sequence: its input is gathered and its output cut back to the rank's shard."""
    found = []
    for unit in sorted(units):
        module = modules.get(unit)
        for name, child in (module.named_children() if module is not None else ()):
            path = f"{unit}.{name}"
            linears = [f"{path}.{n}" if n else path for n, m in child.named_modules() if isinstance(m, torch.nn.Linear)]
            if linears and not set(linears) & split and not any(_within(path, b) or _within(b, path) for b in moe):
                found.append(path)
    return found


_CUTS = {"slice.Tensor": 1, "narrow.default": 1, "split.Tensor": 2, "split_with_sizes.default": 2}  # op -> dim's arg


def cut_on_features(cap: Capture, linears: set[str]) -> set[str]:
    """The Linears whose output the traced forward cuts along its features (the last dimension) at fixed offsets:
    a fused projection (Phi-3's ``qkv_proj`` sliced at ``num_heads * head_dim``, GLM's ``gate_up_proj`` chunked in
    two).  Split colwise, a rank's shard would be cut at the whole tensor's offsets, so such a group's outputs are
    gathered first, as transformers' plans for those models run them (colwise_gather_output)."""
    found: set[str] = set()
    for node in cap.nodes:
        packet = getattr(node.target, "overloadpacket", None)
        arg = _CUTS.get(f"{getattr(packet, '__name__', '')}.{getattr(node.target, '_overloadname', '')}")
        if arg is None or node.meta.get("phase") != "forward" or not node.args or not isinstance(node.args[0], OpNode):
            continue
        source = getitem_source(node.args[0])
        lp = _innermost(source.meta.get("module", ""), linears)
        spec = node.args[0].meta.get("spec")
        if lp is None or _within(node.meta.get("module", ""), lp) or not spec:
            continue
        dim = node.args[arg] if len(node.args) > arg else node.kwargs.get("dim", 0)
        if isinstance(dim, int) and dim % len(spec[0].shape) == len(spec[0].shape) - 1:
            found.add(lp)
    return found


def _linear_inputs(cap: Capture, linear_of: Callable[[str], str | None]) -> tuple[dict[str, int], dict[str, list]]:
    """For each Linear the traced forward runs: the index of its first op, and the ops outside it that it reads."""
    first: dict[str, int] = {}
    inputs: dict[str, list[OpNode]] = {}
    for i, node in enumerate(cap.nodes):
        if node.meta.get("phase") != "forward":
            continue
        lp = linear_of(node.meta.get("module", ""))
        if lp is None:
            continue
        first.setdefault(lp, i)
        for a in (*node.args, *node.kwargs.values()):
            for leaf in (a if isinstance(a, (list, tuple)) else (a,)):
                if isinstance(leaf, OpNode) and leaf.op != "placeholder":
                    src = getitem_source(leaf)
                    if not _within(src.meta.get("module", ""), lp):
                        inputs.setdefault(lp, []).append(src)
    return first, inputs


def per_head_parameters(model: torch.nn.Module, colwise: set[str]) -> list[str]:
    """The 1-D parameters, one value per attention head, that a module holding colwise Linears (the attention) has
    of its own: GPT-OSS's and Granite MoE SWA's attention ``sinks`` (``[num_attention_heads]``, joined to each head's
    scores).  A rank computes its own heads only, so it holds their values only (transformers' plan for Granite MoE
    SWA: ``"layers.*.self_attn.sinks": "colwise"``); a head count is one the model states (:func:`model_heads`)."""
    heads = set(model_heads(model).values())
    modules = dict(model.named_modules())
    found = []
    for parent in sorted({c.rpartition(".")[0] for c in colwise}):
        module = modules.get(parent)
        for name, param in (module.named_parameters(recurse=False) if module is not None else ()):
            if param.dim() == 1 and param.numel() in heads:
                found.append(f"{parent}.{name}" if parent else name)
    return found


def _norms_read_by(linears: set[str], inputs: dict[str, list[OpNode]], norms: list[str]) -> set[str]:
    """The norms whose output reaches one of ``linears`` (walking back from their inputs, stopping at the first
    norm): under sequence parallelism their output stays a sequence-sharded DTensor, which the group's gather
    redistributes; a norm that feeds a residual sum instead (Gemma 2's post-attention and post-feed-forward norms)
    returns its local shard, as the residual stream is."""
    return _norms_reached([a for lp in linears for a in inputs.get(lp, ())], norms,
                          lambda _module, node: _residual_sum(node))  # a norm before it feeds the residual stream


def _norms_reached(starts: list[OpNode], norms: list[str], stop: Callable[[str, OpNode], bool]) -> set[str]:
    """The norms met walking back from ``starts`` (the walk ends at the first norm on each path, and where ``stop``
    of the op's module and the op is true)."""
    found: set[str] = set()
    norm_set = set(norms)

    def ends_walk(node: OpNode) -> bool:
        module = node.meta.get("module", "")
        norm = _innermost(module, norm_set)
        if norm is not None:
            found.add(norm)
            return True
        return stop(module, node)

    _walk_back(starts, ends_walk)
    return found


_ELEMENTWISE = ("aten.mul.", "aten.add.", "aten.sub.", "aten.div.")


def _outside_joins(node: OpNode, unit: str) -> list[int]:
    """The feature size of an elementwise op inside ``unit`` that joins a tensor made outside it of the same last
    dimension (Gemma 4 multiplies its per-layer gate's output by a per-layer input computed before the blocks): a
    Linear whose whole output meets it cannot be split colwise.  (Broadcast operands, as rotary cos/sin over heads,
    are not joins of the same features.)"""
    spec = node.meta.get("spec")
    if not str(node.target).startswith(_ELEMENTWISE) or not spec or not spec[0].shape:
        return []
    last = spec[0].shape[-1]
    for a in node.args[:2]:
        if isinstance(a, OpNode) and not _within(getitem_source(a).meta.get("module", ""), unit):
            other = a.meta.get("spec")
            if other and other[0].shape and other[0].shape[-1] == last and last > 1:
                return [last]
    return []


def _carries_features(node: OpNode) -> bool:
    """Whether a traced value can hold features: not when every tensor it is is integer or boolean (indices, a mask
    built from them: DeepSeek-V3.2's indexer selects keys by top-k indices, its scores do not flow into the heads)."""
    spec = node.meta.get("spec")
    return not spec or any(s.dtype.is_floating_point or s.dtype.is_complex for s in spec if s is not None)


def _walk_back(starts: Iterable[OpNode], ends: Callable[[OpNode], bool]) -> None:
    """Visit the traced ops ``starts`` are computed from, each once, back to the placeholders, along values that
    carry features (:func:`_carries_features`); an op for which ``ends`` is true is not walked past."""
    stack, seen = [s for s in starts if _carries_features(s)], set()
    while stack:
        node = stack.pop()
        if id(node) in seen or node.op == "placeholder":
            continue
        seen.add(id(node))
        if ends(node):
            continue
        for a in (*node.args, *node.kwargs.values()):
            for leaf in (a if isinstance(a, (list, tuple)) else (a,)):
                if isinstance(leaf, OpNode) and _carries_features(leaf):
                    stack.append(getitem_source(leaf))


def _residual_sum(node: OpNode) -> bool:
    """An addition of two traced tensors (``residual + hidden_states``)."""
    name = str(node.target)
    return name.startswith(("aten.add.", "aten.add_.")) and sum(isinstance(a, OpNode) for a in node.args[:2]) == 2


def per_head_norms(cap: Capture, norms: set[str]) -> set[str]:
    """The norms that normalize each attention head's features on its own (Qwen3's and Gemma 3's ``q_norm`` and
    ``k_norm``: their input ``[batch, sequence, heads, head_dim]``, read in the traced forward): they mix no
    features across heads, so a head split over tensor-parallel ranks needs nothing from the others.  Such a
    norm neither ends a Megatron pair's walk nor runs on sequence shards (it runs inside the attention, after the
    sequence is gathered)."""
    found: set[str] = set()
    seen: set[str] = set()
    for node in cap.nodes:
        if node.meta.get("phase") != "forward":
            continue
        module = node.meta.get("module", "")
        owner = _innermost(module, norms)
        if owner is None or owner in seen:
            continue
        seen.add(owner)
        first = next((a for a in node.args if isinstance(a, OpNode)), None)
        spec = first.meta.get("spec") if first is not None else None
        if spec and len(spec[0].shape) >= 4:  # (batch, sequence, heads, head_dim): per head
            found.add(owner)
    return found


def _forward_modules(cap: Capture, after: int) -> set[str]:
    return {n.meta.get("module", "") for n in cap.nodes[after:] if n.meta.get("phase") == "forward"}


def model_heads(model: torch.nn.Module) -> dict[str, int]:
    """Attention head counts the model states (module attributes such as n_head, its config)."""
    out: dict[str, int] = {}
    for path, mod in model.named_modules():
        for attr in _HEAD_ATTRS:
            v = getattr(mod, attr, None)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                out[f"{path or '(root)'}.{attr}"] = v
    cfg = getattr(model, "config", None)
    for attr in _HEAD_ATTRS:
        v = getattr(cfg, attr, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            out[f"config.{attr}"] = v
    return out

"""The captured step as a graph: light op records while tracing, torch.fx and networkx on demand.

Recording a node with ``fx.Graph.create_node`` costs ~0.2 ms (name
generation, argument checks); a 7B model's step has ~10k ops, so the capture
records :class:`OpNode` objects (the same fields as ``fx.Node``: ``op``,
``target``, ``args``, ``kwargs``, ``meta``) and :func:`to_fx` builds the
``torch.fx.Graph`` the first time a user asks for it (``report.graph``).  The
fx nodes share the records' ``meta`` dicts.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable

import torch.fx as fx


def target_text(target: Any) -> str:
    """``str(target)``, remembered per target: an ``OpOverload`` formats its name on every ``str`` (10^4-10^5
    calls in a plan's timeline and time model)."""
    try:
        return _target_text(target)
    except TypeError:  # unhashable
        return str(target)


@functools.lru_cache(maxsize=8192)
def _target_text(target: Any) -> str:
    return str(target)


class OpNode:
    """One recorded op (or placeholder), duck-typed like ``fx.Node`` for the rules and tallies."""

    __slots__ = ("op", "name", "target", "args", "kwargs", "meta")

    def __init__(self, op: str, name: str, target: Any, args: tuple = (), kwargs: dict | None = None,
                 meta: dict | None = None):
        self.op = op
        self.name = name
        self.target = target
        self.args = args
        self.kwargs = kwargs or {}
        self.meta = meta if meta is not None else {}

    @property
    def all_input_nodes(self) -> list["OpNode"]:
        found: list[OpNode] = []
        _collect(self.args, found)
        _collect(self.kwargs, found)
        return found

    def format_node(self) -> str:
        return f"%{self.name} : {self.op}[target={self.target}](args = {self.args!r}, kwargs = {self.kwargs!r})"

    def __repr__(self) -> str:
        return self.name


def map_args(node: OpNode, fn: Callable[[OpNode], Any],
             other: Callable[[Any], Any] = lambda v: v) -> tuple[tuple, dict[str, Any]]:
    """``node``'s arguments with every OpNode in them replaced by ``fn(op_node)`` (lists as tuples)
    and every other value by ``other(value)`` (kept by default): what rules bind by name."""
    return tuple(_map_one(a, fn, other) for a in node.args), {k: _map_one(v, fn, other) for k, v in node.kwargs.items()}


def _map_one(value: Any, fn: Callable[[OpNode], Any], other: Callable[[Any], Any]) -> Any:
    # a module-level recursion: a nested function that calls itself is a reference cycle (function -> cell ->
    # function) that only the cyclic collector frees, once per call (see estimator.collect)
    if isinstance(value, OpNode):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return tuple(_map_one(v, fn, other) for v in value)
    return other(value)


def _collect(value: Any, found: list[OpNode]) -> None:
    if isinstance(value, OpNode):
        if value not in found:
            found.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _collect(v, found)
    elif isinstance(value, dict):
        for v in value.values():
            _collect(v, found)


def to_fx(nodes: Iterable[OpNode], outputs: tuple[OpNode, ...] = ()) -> fx.Graph:
    """An ``fx.Graph`` with one node per record, in order (placeholders first)."""
    graph = fx.Graph()
    env: dict[int, fx.Node] = {}

    def lift(value: Any) -> Any:
        if isinstance(value, OpNode):
            return env[id(value)]
        if isinstance(value, (list, tuple)):
            return type(value)(lift(v) for v in value)
        if isinstance(value, dict):
            return {k: lift(v) for k, v in value.items()}
        return value

    for rec in nodes:
        if rec.op == "placeholder":
            node = graph.placeholder(rec.name)
        else:
            node = graph.create_node(rec.op, rec.target, lift(rec.args), lift(rec.kwargs))
        node.meta = rec.meta
        env[id(rec)] = node
    graph.output(tuple(env[id(o)] for o in outputs))
    return graph


def to_networkx(nodes: Iterable[OpNode]):
    """A ``networkx.DiGraph``: one vertex per op (attributes: op, target, module, phase, shapes,
    flops, kind), one edge per data dependency, vertices in execution order."""
    import networkx as nx

    g = nx.DiGraph()
    for node in nodes:
        cost = node.meta.get("cost")
        g.add_node(
            node.name,
            op=node.op,
            target=str(node.target),
            module=node.meta.get("module"),
            phase=node.meta.get("phase"),
            shapes=[tuple(s.shape) for s in node.meta.get("spec") or ()],
            flops=cost.flops if cost else 0,
            kind=cost.kind if cost else None,
        )
        for inp in node.all_input_nodes:
            g.add_edge(inp.name, node.name)
    return g

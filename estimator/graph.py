"""The captured step as a graph users can walk: fx (``report.graph``) or networkx."""

from __future__ import annotations

import torch.fx as fx


def to_networkx(graph: fx.Graph):
    """A ``networkx.DiGraph``: one vertex per fx node (attributes: op, target, module, phase,
    shapes, flops, kind), one edge per data dependency, vertices in execution order."""
    import networkx as nx

    g = nx.DiGraph()
    for node in graph.nodes:
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

"""FLOPs per token as PaLM counts them (Chowdhery et al. 2022, appendix B): ``6N + 12 L H Q T``, N the parameters
that enter a matmul (a mixture of experts' at the share a token uses), the attention term from the traced
scaled-dot-product ops; read off the single-device step the planner traces."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from ..rules.registry import MATMUL
from .traced import Step


def matmul_params(step: Step, tokens: int | None = None) -> int:
    """Parameters that enter a matmul-class op in forward (through views and casts): the N of 6N.  With
    ``tokens`` (the step's), a mixture of experts' weights count as much as a token uses of them: a grouped
    GEMM of ``S`` routed rows over ``G`` experts' weights uses ``S / (G x tokens)`` of them per token (top-k / E:
    the "active" parameters)."""
    cap = step.cap
    users: dict[int, list] = defaultdict(list)
    from ..graph import OpNode
    import torch.utils._pytree as pytree

    for rec in cap.records:
        for a in pytree.tree_leaves((rec.args, rec.kwargs)):
            if isinstance(a, OpNode):
                users[id(a)].append(rec)
    holders = {n.target: n for n in cap.records if n.op == "placeholder" and n.meta.get("kind") == "parameter"}
    count = 0
    for name, p in cap.params.items():
        holder = holders.get(f"param_{name}")
        frontier, seen, hit, share = [holder] if holder is not None else [], set(), False, 1.0
        while frontier and not hit:
            node = frontier.pop()
            for user in users.get(id(node), ()):
                if id(user) in seen or user.meta.get("phase") not in ("forward", "loss"):
                    continue
                seen.add(id(user))
                cost = user.meta.get("cost")
                if cost is not None and cost.kind == MATMUL:
                    hit = True
                    share = _routed_share(user, p, tokens)
                    break
                if user.op == "call_function" and (cost is None or cost.kind == "zero"):
                    frontier.append(user)
        if hit:
            count += round(p.numel() * share)
    return count


def _routed_share(node: Any, p: torch.Tensor, tokens: int | None) -> float:
    """The share of ``p`` one token uses when ``node`` (its first matmul) is a grouped GEMM over its dimension 0
    (a mixture of experts): routed rows / (experts x tokens); 1 for any other matmul."""
    if tokens is None or "grouped_mm" not in str(node.target) or p.ndim != 3 or not node.args:
        return 1.0
    spec = getattr(node.args[0], "meta", {}).get("spec", (None,))[0]
    if spec is None or len(spec.shape) != 2:
        return 1.0
    return min(1.0, spec.shape[0] / (p.shape[0] * tokens))


def attention_term(step: Step) -> int | None:
    """12 * sum over attention ops of H * Q * T_k (PaLM's 12 L H Q T per token), None without attention."""
    from ..graph import OpNode

    total, found = 0, False
    for node in step.cap.nodes:
        packet = getattr(node.target, "overloadpacket", None)
        name = packet.__name__ if packet is not None else ""
        if node.meta.get("phase") != "forward" or node.meta.get("micro_step") or "scaled_dot_product" not in name \
                or "backward" in name:  # (one micro-batch's: a later micro-step of an accumulation repeats it)
            continue
        args = [a for a in node.args[:2] if isinstance(a, OpNode)]
        if len(args) < 2:
            continue
        q, k = (args[0].meta.get("spec") or (None,))[0], (args[1].meta.get("spec") or (None,))[0]
        if q is None or k is None or len(q.shape) < 4:
            continue
        found = True
        total += 12 * q.shape[-3] * q.shape[-1] * k.shape[-2]
    return total if found else None

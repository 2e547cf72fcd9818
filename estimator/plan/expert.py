"""Expert parallelism: a mixture-of-experts layer's experts sharded over ranks, tokens dispatched by all-to-all.

Under ``--ep N`` each of ``N`` ranks holds ``E / N`` of a layer's ``E`` experts and computes them for the tokens
every rank of the group routes to them, as torchtitan's ``ExpertParallel`` does
(``torchtitan/distributed/expert_parallel.py``, ``torchtitan/models/common/moe/utils.py``), traced here on
torch's own pieces over the fake process group:

* the experts' weights become DTensors sharded on the expert dimension over the ``ep`` mesh
  (``distribute_module``, ``Shard(0)``); the forward takes each rank's local experts (``to_local``);
* dispatch: the token copies sorted by expert (transformers' own grouped-GEMM path, ``grouped_mm_experts_forward``
  in ``transformers/integrations/moe.py``), the per-expert counts exchanged by an all-to-all, the token rows by
  ``all_to_all_single_autograd`` (its backward an all-to-all of the gradients), then permuted from rank-major to
  expert-major order for the grouped GEMMs;
* combine: un-permuted, sent back by the reverse all-to-all, weighted by the router's scores and summed per token;
* FSDP2 shards each experts module on its own mesh of the ranks holding the same experts (torchtitan's
  ``efsdp`` = data-parallel ranks x cp / ep, kept even when it is 1: its FSDP wrapping casts the experts under
  a mixed-precision policy), on the expert dimension, or on dimension 1 when there are more ranks than local
  experts; its gradients divided by all the data-parallel ranks (``set_gradient_divide_factor``).

Routing is data-dependent and a plan has no data: **balanced routing is assumed** (every rank sends
``tokens x top-k / N`` rows to each peer and receives as many from each), the case a load-balancing loss aims
at; a real run's busiest rank receives more.  The experts modules are those of transformers' fused layout
(``@use_experts_implementation``: 3-D expert weights, e.g. ``MixtralExperts``, ``Qwen3MoeExperts``).
"""

from __future__ import annotations

import types
from typing import Any

import torch

from ..errors import UserError


def is_experts(module: torch.nn.Module) -> bool:
    """transformers' fused experts (``@use_experts_implementation``): ``num_experts`` and 3-D expert weights."""
    down = getattr(module, "down_proj", None)
    return (isinstance(getattr(module, "num_experts", None), int) and hasattr(module, "has_gate")
            and isinstance(down, torch.nn.Parameter) and down.ndim == 3 and down.shape[0] == module.num_experts)


def find_experts(model: torch.nn.Module, ep: int) -> list[str]:
    """The paths of the model's experts modules, checked for ``--ep``; a one-line error when there are none or
    their experts do not divide over the ranks."""
    paths = [p for p, m in model.named_modules() if is_experts(m)]
    if not paths:
        raise UserError(f"--ep {ep} shards the experts of mixture-of-experts layers: this model has no experts "
                        f"module of transformers' fused layout (3-D expert weights, e.g. MixtralExperts); use --ep 1")
    modules = dict(model.named_modules())
    for path in paths:
        m = modules[path]
        if m.num_experts % ep:
            raise UserError(f"--ep {ep} does not divide the {m.num_experts} experts of {path}: use a divisor of "
                            f"{m.num_experts}")
    return paths


def balanced_splits(rows: int, ep: int) -> list[int]:
    """Rows sent to each of ``ep`` ranks under balanced routing (the remainder to the first ranks)."""
    return [rows // ep + (1 if i < rows % ep else 0) for i in range(ep)]


def expert_major(counts: torch.Tensor, local: int, ep: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices, tokens per local expert): the gather that turns the received rows, grouped by source rank then
    local expert, into rows grouped by local expert then source rank (what the grouped GEMM's offsets need).
    ``counts``: (ep x local,) rows from each rank for each local expert, rank-major."""
    by_rank = counts.view(ep, local)  # (ep, local)
    starts = (counts.cumsum(0) - counts).view(ep, local).t().reshape(-1)  # where each group starts, expert-major
    lengths = by_rank.t().reshape(-1)  # (local x ep,) expert-major
    ends = lengths.cumsum(0)
    position = torch.arange(rows, device=counts.device)
    group = torch.searchsorted(ends, position, right=True).clamp_(max=lengths.numel() - 1)
    return position + (starts - (ends - lengths))[group], by_rank.sum(0)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def ep_forward(mesh) -> Any:
    """The experts' forward under expert parallelism on ``mesh`` (1-D, the ``ep`` ranks): transformers' grouped
    path with the dispatch and combine all-to-alls between the sort and the grouped GEMMs."""
    import torch.distributed as dist
    from torch.distributed._functional_collectives import all_to_all_single, all_to_all_single_autograd
    from transformers.integrations.moe import _grouped_linear

    group, ep = mesh.get_group(), mesh.size()

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        tokens, top_k = top_k_index.shape
        experts, rows = self.num_experts, tokens * top_k
        local = experts // ep
        expert_ids, order = torch.sort(top_k_index.reshape(-1))  # (rows,) token copies sorted by expert
        routed = hidden_states[order // top_k]  # (rows, hidden)
        scores = top_k_weights.reshape(-1)[order]  # (rows,)
        with torch.no_grad():
            counts = torch.histc(expert_ids.float(), bins=experts, min=0, max=experts - 1).int()  # (experts,)
            counts = torch.ops._c10d_functional.wait_tensor(all_to_all_single(counts, None, None, group))
        sent = balanced_splits(rows, ep)  # balanced routing: the same split on every rank
        received = [sent[dist.get_rank(group)]] * ep
        routed = all_to_all_single_autograd(routed, received, sent, group)  # (sum(received), hidden)
        with torch.no_grad():
            index, per_expert = expert_major(counts, local, ep, routed.shape[0])
        shape, routed = routed.shape, routed[index]
        offsets = torch.cumsum(per_expert, 0, dtype=torch.int32)
        up = _local(self.gate_up_proj if self.has_gate else self.up_proj)
        up_bias = down_bias = None
        if self.has_bias:  # each row's local expert's bias rows, gathered as transformers gathers them
            with torch.no_grad():
                row_expert = torch.repeat_interleave(torch.arange(local, device=per_expert.device), per_expert,
                                                     output_size=routed.shape[0])  # (rows received,)
            up_bias = _local(self.gate_up_proj_bias if self.has_gate else self.up_proj_bias)[row_expert]
            down_bias = _local(self.down_proj_bias)[row_expert]
        h = _grouped_linear(routed, up, offsets, bias=up_bias, is_transposed=self.is_transposed)
        h = self._apply_gate(h) if self.has_gate else self.act_fn(h)
        out = _grouped_linear(h, _local(self.down_proj), offsets, bias=down_bias, is_transposed=self.is_transposed)
        back = out.new_empty(shape)
        back[index] = out
        back = all_to_all_single_autograd(back, sent, received, group)  # (rows, hidden), in this rank's order
        weighted = back * scores.unsqueeze(-1)
        restore = torch.empty_like(order)
        restore[order] = torch.arange(rows, device=order.device)
        final = weighted[restore].view(tokens, top_k, -1).sum(dim=1)
        return final.to(hidden_states.dtype)

    return forward


def apply_ep(model: torch.nn.Module, paths: list[str], mesh) -> None:
    """Shard each experts module's weights on the expert dimension over ``mesh`` and give it the dispatching
    forward (torchtitan's ``ExpertParallel._partition_fn`` and token dispatch/combine)."""
    from torch.distributed.tensor import Shard, distribute_module, distribute_tensor

    def partition(_name: str, module: torch.nn.Module, device_mesh) -> None:
        for name, p in list(module.named_parameters(recurse=False)):
            module.register_parameter(name, torch.nn.Parameter(distribute_tensor(p, device_mesh, [Shard(0)]),
                                                               requires_grad=p.requires_grad))

    modules = dict(model.named_modules())
    forward = ep_forward(mesh)
    for path in paths:
        module = modules[path]
        distribute_module(module, mesh, partition_fn=partition)
        module.forward = types.MethodType(forward, module)


def expert_meshes(replicate: int, efsdp: int, ep: int, world: int):
    """(FSDP mesh of the experts, ep mesh): torchtitan's expert region ``(dp_replicate, efsdp, ep)``, ep the
    innermost ranks; the replicate dimension only when there is one (HSDP)."""
    from torch.distributed.device_mesh import init_device_mesh

    names = (("replicate",) if replicate > 1 else ()) + ("efsdp", "ep")
    shape = ((replicate,) if replicate > 1 else ()) + (efsdp, ep)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=tuple(f"{n}.e{world}" for n in names))
    outer = tuple(n for n in mesh.mesh_dim_names if not n.startswith("ep."))
    return (mesh[outer] if len(outer) > 1 else mesh[outer[0]]), mesh[mesh.mesh_dim_names[-1]]


def shard_experts(model: torch.nn.Module, paths: list[str], mesh, ep: int, divide: int, **fsdp: Any) -> None:
    """FSDP2 on each experts module over ``mesh`` (before its block's), as torchtitan's ``apply_fsdp``: on the
    expert dimension, or dimension 1 when the ranks outnumber the experts; gradients divided by ``divide``."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    modules = dict(model.named_modules())
    for path in paths:
        module = modules[path]
        placement = None
        if mesh.size(mesh.ndim - 1) * ep > module.num_experts:
            placement = lambda _p: Shard(1)  # noqa: E731
        fully_shard(module, mesh=mesh, shard_placement_fn=placement, **fsdp)
        module.set_gradient_divide_factor(float(divide))


def dense_expert_placement(model: torch.nn.Module, ranks: int) -> tuple[Any, list[str]]:
    """Without expert parallelism, torchtitan's ``apply_fsdp`` shards the experts' weights on dimension 1 when the
    sharded ranks outnumber the experts (dimension 0 would be padded to the rank count: 8 experts over 32 ranks
    would leave each rank a whole expert, 1/8 of the tensor instead of 1/32).  (``shard_placement_fn`` or None,
    notes)."""
    from torch.distributed.tensor import Shard

    few = [m for m in model.modules() if is_experts(m) and ranks > m.num_experts]
    if not few:
        return None, []
    params = {id(p) for m in few for p in m.parameters(recurse=False)}
    note = (f"mixture of experts: the experts' weights sharded on dimension 1 (torchtitan's apply_fsdp: their "
            f"{few[0].num_experts} experts are fewer than the {ranks} sharded ranks, and dimension 0 would be "
            f"padded to {ranks})")
    return (lambda p: Shard(1) if id(p) in params else None), [note]


def ep_notes(ep: int) -> list[str]:
    return [f"expert parallelism over {ep} ranks: balanced routing assumed (each rank sends tokens x top-k / {ep} "
            f"rows to every rank of its group and receives as many); with uneven routing the busiest rank "
            f"receives, computes and holds more"]

"""Mixture-of-experts pieces of a real run (tests/dist_worker.py): transformers' Mixtral with balanced routing, and
expert parallelism as torchtitan applies it.  Independent of estimator's code: nothing from ``estimator`` is
imported here.

* :func:`balanced_router`: each router still computes its logits and softmax, but token ``t``'s ``j``-th choice
  is expert ``(t x top-k + j) mod E``, so every expert receives the same number of rows (the plan's stated
  assumption), and the scores are the softmax's values at those experts, renormalised as Mixtral's router does.
* :func:`expert_parallel`: torchtitan's ``ExpertParallel`` (``torchtitan/distributed/expert_parallel.py``) on
  transformers' fused experts: their weights ``distribute_tensor(..., [Shard(0)])`` over the ``ep`` mesh; the
  forward sorts the token copies by expert (transformers' grouped path), exchanges the per-expert counts
  (all-to-all), sends the rows with ``all_to_all_single_autograd`` on the splits those counts give (a device-to-
  host read, as torchtitan's ``.tolist()``), permutes them from rank-major to expert-major order, runs the local
  experts' grouped GEMMs, and undoes each step (``new_empty`` + index assignment, the reverse all-to-all).
* :func:`shard_experts`: torchtitan's ``apply_fsdp`` for the experts: ``fully_shard`` on the ``efsdp`` mesh
  before the blocks, ``Shard(1)`` when ``efsdp x ep`` exceeds the experts.
"""

from __future__ import annotations

import types

import torch
import torch.distributed as dist


def build_mixtral(config: dict):
    from transformers import MixtralConfig, MixtralForCausalLM
    from transformers.models.mixtral.modeling_mixtral import MixtralDecoderLayer

    model = MixtralForCausalLM(MixtralConfig(**config))
    balanced_router(model)
    return model, MixtralDecoderLayer


def balanced_router(model: torch.nn.Module) -> None:
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter

    def forward(self, hidden_states):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        logits = torch.nn.functional.linear(hidden_states, self.weight)
        probs = torch.softmax(logits.float(), dim=-1)
        tokens = hidden_states.shape[0]
        choice = (torch.arange(tokens * self.top_k, device=logits.device) % self.num_experts).view(tokens, self.top_k)
        scores = probs.gather(1, choice)
        scores = scores / scores.sum(dim=-1, keepdim=True)
        return logits, scores, choice

    for m in model.modules():
        if isinstance(m, MixtralTopKRouter):
            m.forward = types.MethodType(forward, m)


def _to_local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def expert_parallel(model: torch.nn.Module, ep_mesh) -> list[torch.nn.Module]:
    """torchtitan's ExpertParallel on every experts module; returns them."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd
    from torch.distributed.tensor import Shard, distribute_tensor
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    group, ep = ep_mesh.get_group(), ep_mesh.size()

    def forward(self, hidden_states, top_k_index, top_k_weights):
        tokens, k = top_k_index.shape
        n_local = self.num_experts // ep
        flat = top_k_index.reshape(-1)
        order = torch.argsort(flat, stable=True)
        rows = hidden_states[order // k]
        scores = top_k_weights.reshape(-1)[order]
        with torch.no_grad():
            counts = torch.bincount(flat, minlength=self.num_experts)
            counts_in = torch.empty_like(counts)
            dist.all_to_all_single(counts_in, counts, group=group)
            send = counts.view(ep, n_local).sum(1).tolist()
            recv = counts_in.view(ep, n_local).sum(1).tolist()
        rows = all_to_all_single_autograd(rows, recv, send, group)
        with torch.no_grad():  # rank-major (source rank, local expert) -> expert-major
            sizes = counts_in.view(ep, n_local)
            starts = (counts_in.cumsum(0) - counts_in).view(ep, n_local)
            index = torch.cat([torch.arange(int(starts[r, e]), int(starts[r, e] + sizes[r, e]))
                               for e in range(n_local) for r in range(ep)])
            offsets = sizes.sum(0).cumsum(0).to(torch.int32)
        shape, rows = rows.shape, rows[index]
        w_up, w_down = _to_local(self.gate_up_proj), _to_local(self.down_proj)
        up = torch.nn.functional.grouped_mm(rows.to(w_up.dtype), w_up.transpose(-2, -1), offs=offsets)
        gate, lin = up.chunk(2, dim=-1)
        down = torch.nn.functional.grouped_mm((self.act_fn(gate) * lin).to(w_down.dtype), w_down.transpose(-2, -1),
                                              offs=offsets)
        back = down.new_empty(shape)
        back[index] = down
        back = all_to_all_single_autograd(back, send, recv, group)
        weighted = back * scores.unsqueeze(-1)
        restore = torch.empty_like(order)
        restore[order] = torch.arange(order.numel())
        return weighted[restore].view(tokens, k, -1).sum(dim=1).to(hidden_states.dtype)

    found = [m for m in model.modules() if isinstance(m, MixtralExperts)]
    for m in found:
        for name, p in list(m.named_parameters(recurse=False)):
            m.register_parameter(name, torch.nn.Parameter(distribute_tensor(p, ep_mesh, [Shard(0)])))
        m.forward = types.MethodType(forward, m)
    return found


def shard_experts(experts: list[torch.nn.Module], efsdp_mesh, ep: int, policy, reduce_scatter,
                  reshard_after_forward: bool = True) -> None:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    for m in experts:
        dim1 = efsdp_mesh.size() * ep > m.num_experts
        fully_shard(m, mesh=efsdp_mesh, mp_policy=policy, shard_placement_fn=(lambda _p: Shard(1)) if dim1 else None,
                    reshard_after_forward=reshard_after_forward)  # (torchtitan: the blocks' own policy)
        # (torchtitan divides these gradients by the world with set_gradient_divide_factor, a PREMUL_SUM reduction
        # that gloo lacks; the division is in place either way, so the memory is the same without it)
        m.set_custom_reduce_scatter(reduce_scatter())

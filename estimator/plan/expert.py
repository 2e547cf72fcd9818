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
from typing import Any, Callable

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


def _token_slice(tokens: int, tp_mesh) -> tuple[int, int]:
    """(start, count) of the tokens a tensor-parallel rank routes under ``etp = 1`` (torchtitan's
    ``ReordererSequenceParallel``: the ``batch x sequence`` tokens split evenly over the tp ranks)."""
    tp = tp_mesh.size()
    if tokens % tp:
        raise UserError(f"--ep with --tp {tp} splits each MoE layer's {tokens} tokens (batch x sequence) evenly "
                        f"over the tensor-parallel ranks, as torchtitan does: use a batch x sequence divisible by {tp}")
    share = tokens // tp
    return tp_mesh.get_local_rank() * share, share


def experts_forward(mesh=None, tp_mesh=None) -> Any:
    """The experts' forward: transformers' grouped path (``grouped_mm_experts_forward``) on the local experts.

    * ``mesh`` (1-D, the ``ep`` ranks): expert parallelism, the dispatch and combine all-to-alls between the sort
      and the grouped GEMMs; with ``tp_mesh`` too (torchtitan's ``etp = 1``: ep borrows the tp ranks), each tp rank
      first takes its own slice of the tokens (``ReordererSequenceParallel``) and returns every token's row,
      zeros but its own: a partial sum over the tp ranks, which the MoE block's output reduces
      (:func:`moe_block_tp`);
    * ``tp_mesh`` alone: the experts tensor-parallel (``TensorParallel``: each rank holds a slice of every expert's
      intermediate dimension), all tokens, the output a partial sum over the tp ranks."""
    import torch.distributed as dist
    from torch.distributed._functional_collectives import all_to_all_single, all_to_all_single_autograd
    from transformers.integrations.moe import _grouped_linear

    group, ep = (mesh.get_group(), mesh.size()) if mesh is not None else (None, 1)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        every = hidden_states
        if mesh is not None and tp_mesh is not None:  # this tp rank's tokens
            start, share = _token_slice(hidden_states.shape[0], tp_mesh)
            hidden_states = hidden_states[start:start + share]
            top_k_index, top_k_weights = top_k_index[start:start + share], top_k_weights[start:start + share]
        tokens, top_k = top_k_index.shape
        experts, rows = self.num_experts, tokens * top_k
        local = experts // ep
        expert_ids, order = torch.sort(top_k_index.reshape(-1))  # (rows,) token copies sorted by expert
        routed = hidden_states[order // top_k]  # (rows, hidden)
        scores = top_k_weights.reshape(-1)[order]  # (rows,)
        with torch.no_grad():
            counts = torch.histc(expert_ids.float(), bins=experts, min=0, max=experts - 1).int()  # (experts,)
            if group is not None:
                counts = torch.ops._c10d_functional.wait_tensor(all_to_all_single(counts, None, None, group))
        if group is not None:
            sent = balanced_splits(rows, ep)  # balanced routing: the same split on every rank
            received = [sent[dist.get_rank(group)]] * ep
            routed = all_to_all_single_autograd(routed, received, sent, group)  # (sum(received), hidden)
            with torch.no_grad():
                index, per_expert = expert_major(counts, local, ep, routed.shape[0])
            shape, routed = routed.shape, routed[index]
        else:
            per_expert = counts
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
        if group is not None:
            back = out.new_empty(shape)
            back[index] = out
            out = all_to_all_single_autograd(back, sent, received, group)  # (rows, hidden), in this rank's order
        weighted = out * scores.unsqueeze(-1)
        restore = torch.empty_like(order)
        restore[order] = torch.arange(rows, device=order.device)
        final = weighted[restore].view(tokens, top_k, -1).sum(dim=1).to(hidden_states.dtype)
        if final.shape[0] == every.shape[0]:
            return final
        full = every.new_zeros(every.shape)  # every token's row, zeros but this tp rank's (a partial sum over tp)
        full[start:start + share] = final
        return full

    return forward


def apply_ep(model: torch.nn.Module, paths: list[str], mesh, tp_mesh=None, ep_etp_mesh=None) -> None:
    """Shard each experts module's weights on the expert dimension over ``mesh`` and give it the dispatching
    forward (torchtitan's ``ExpertParallel._partition_fn`` and token dispatch/combine); ``tp_mesh``: the ep ranks
    include the tensor-parallel ones, each routing its slice of the tokens (:func:`experts_forward`);
    ``ep_etp_mesh`` (the 2-D (ep, etp) mesh): torchtitan's ``ExpertTensorParallel``, each expert also split on its
    intermediate dimension over the tp ranks, every tp rank dispatching all the tokens over its own ep group."""
    from torch.distributed.tensor import Shard

    modules = dict(model.named_modules())
    forward = experts_forward(mesh, tp_mesh)
    for path in paths:
        module = modules[path]
        if ep_etp_mesh is None:
            _shard_parameters(module, mesh, lambda _name: [Shard(0)])
        else:
            if module.has_bias:
                raise UserError(f"--etp with the biased experts of {path} is not planned (a partial sum would add "
                                f"each down-projection bias once per tensor-parallel rank): use --etp 1")
            dims = _intermediate_dims(module)
            _shard_parameters(module, ep_etp_mesh, lambda name, dims=dims: [Shard(0), Shard(dims[name])])
        module.forward = types.MethodType(forward, module)


def _shard_parameters(module: torch.nn.Module, mesh, placements: Callable[[str], list]) -> None:
    """Each of ``module``'s own parameters a DTensor on ``mesh`` with ``placements(name)`` (``distribute_module``)."""
    from torch.distributed.tensor import distribute_module, distribute_tensor

    def partition(_name: str, m: torch.nn.Module, device_mesh) -> None:
        for name, p in list(m.named_parameters(recurse=False)):
            m.register_parameter(name, torch.nn.Parameter(distribute_tensor(p, device_mesh, placements(name)),
                                                          requires_grad=p.requires_grad))

    distribute_module(module, mesh, partition_fn=partition)


def expert_paths(model: torch.nn.Module) -> list[str]:
    """The paths of the model's experts modules (transformers' fused layout), none when it has no MoE layer."""
    return [p for p, m in model.named_modules() if is_experts(m)]


def _intermediate_dims(module: torch.nn.Module) -> dict[str, int]:
    """Parameter name -> its intermediate (``I``) dimension: ``gate_up_proj`` (E, 2I, H) and ``down_proj`` (E, H, I),
    transposed (E, H, 2I) and (E, I, H) when ``is_transposed``."""
    t = bool(getattr(module, "is_transposed", False))
    up = "gate_up_proj" if module.has_gate else "up_proj"
    return {up: 2 if t else 1, "down_proj": 1 if t else 2}


def apply_expert_tp(model: torch.nn.Module, paths: list[str], tp_mesh) -> None:
    """torchtitan's ``TensorParallel`` for grouped experts (tensor parallelism without expert parallelism): every
    expert's up (gate and up) projection split on its output (intermediate) dimension, its down projection on its
    input one, over ``tp_mesh``; each rank runs all tokens through its slices (:func:`experts_forward`) and the
    MoE block sums the partial outputs (:func:`moe_block_tp`).  transformers' concatenated ``gate_up_proj`` is
    split as one tensor: the sizes of torchtitan's separately split ``w1`` and ``w3``."""
    from torch.distributed.tensor import Shard

    modules = dict(model.named_modules())
    for path in paths:
        module = modules[path]
        if module.has_bias:
            raise UserError(f"--tp with the biased experts of {path} is not planned (a partial sum would add each "
                            f"down-projection bias once per tensor-parallel rank): use --ep, or --tp 1")
        dims = _intermediate_dims(module)
        _shard_parameters(module, tp_mesh, lambda name, dims=dims: [Shard(dims[name])])
        module.forward = types.MethodType(experts_forward(None, tp_mesh), module)


def moe_block_tp(model: torch.nn.Module, paths: list[str], tp_mesh, sequence_parallel: bool) -> list[str]:
    """torchtitan's ``PrepareModuleInputOutput`` on each MoE block (the module holding an experts module) under
    tensor parallelism: its input all-gathered from sequence shards (sequence parallelism), its router computed in
    full on every rank (``NoParallel``), its output (a partial sum: each rank computed a slice of every expert, or
    its own tokens) reduce-scattered back to sequence shards, or all-reduced.  Returns the blocks' paths."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    modules = dict(model.named_modules())
    blocks = sorted({p.rpartition(".")[0] for p in paths})
    placement = Shard(1) if sequence_parallel else Replicate()

    def gather(_module, args, kwargs):
        def full(a):
            if isinstance(a, DTensor):
                return a.redistribute(placements=[Replicate()]).to_local()
            if sequence_parallel and isinstance(a, torch.Tensor) and a.dim() >= 2:
                return DTensor.from_local(a, tp_mesh, [Shard(1)], run_check=False).redistribute(
                    placements=[Replicate()]).to_local()
            return a

        return tuple(full(a) for a in args), {k: full(v) for k, v in kwargs.items()}

    def reduce(_module, _args, out):
        def summed(o):
            if isinstance(o, torch.Tensor) and not isinstance(o, DTensor):
                return DTensor.from_local(o, tp_mesh, [Partial()], run_check=False).redistribute(
                    placements=[placement]).to_local()
            return o

        return (summed(out[0]), *out[1:]) if isinstance(out, tuple) else summed(out)  # (router logits stay whole)

    for block in blocks:
        if block in modules:
            modules[block].register_forward_pre_hook(gather, with_kwargs=True)
            modules[block].register_forward_hook(reduce)
    return blocks


def expert_meshes(replicate: int, efsdp: int, ep: int, world: int, etp: int = 1):
    """(FSDP mesh of the experts, ep mesh, the experts' (ep, etp) mesh or None): torchtitan's expert region
    ``(dp_replicate, efsdp, ep[, etp])``, ep the innermost ranks but the experts' tensor-parallel ones; the
    replicate dimension only when there is one (HSDP)."""
    from torch.distributed.device_mesh import init_device_mesh

    names = (("replicate",) if replicate > 1 else ()) + ("efsdp", "ep") + (("etp",) if etp > 1 else ())
    shape = ((replicate,) if replicate > 1 else ()) + (efsdp, ep) + ((etp,) if etp > 1 else ())
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=tuple(f"{n}.e{world}" for n in names))
    named = {n.partition(".")[0]: n for n in mesh.mesh_dim_names}
    outer = tuple(named[n] for n in ("replicate", "efsdp") if n in named)
    fsdp_mesh = mesh[outer] if len(outer) > 1 else mesh[outer[0]]
    return fsdp_mesh, mesh[named["ep"]], (mesh[named["ep"], named["etp"]] if etp > 1 else None)


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


def ep_notes(ep: int, tp: int = 1, etp: int = 1) -> list[str]:
    notes = [f"expert parallelism over {ep} ranks: balanced routing assumed (each rank sends tokens x top-k / {ep} "
             f"rows to every rank of its group and receives as many); with uneven routing the busiest rank "
             f"receives, computes and holds more"]
    if etp > 1:
        notes.append(f"the experts split over the {etp} tensor-parallel ranks as well (torchtitan's etp = {etp}, "
                     f"ExpertTensorParallel): each MoE layer's input is gathered in full, every tp rank dispatches "
                     f"all its tokens over its own ep group, and the layer's output is summed over the tp ranks")
    elif tp > 1:
        notes.append(f"expert parallelism borrows the {tp} tensor-parallel ranks (torchtitan's etp = 1): each MoE "
                     f"layer's input is gathered in full, each tp rank routes 1/{tp} of its tokens, and the layer's "
                     f"output is summed over the tp ranks")
    return notes


def expert_tp_notes(tp: int) -> list[str]:
    return [f"mixture of experts under tensor parallelism (torchtitan's TensorParallel for experts): every expert's "
            f"intermediate dimension split over the {tp} tp ranks, each MoE layer's input gathered in full and its "
            f"output summed over them; the router computed in full on every rank"]

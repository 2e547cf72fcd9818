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
* :func:`mixtral_tensor_parallel`, :func:`expert_tensor_parallel`: torchtitan's tensor parallelism on Mixtral
  (``apply_moe_ep_tp``): the MoE block's input gathered, its output a partial sum reduced over tp; the experts
  split on their intermediate dimension without ep, or (ep borrowing the tp ranks, ``etp = 1``) each tp rank
  routing its slice of the tokens (``expert_parallel(..., tp_mesh)``).
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


def _grouped_experts(self, rows, offsets):
    """The local experts' grouped GEMMs on rows grouped by expert (``offsets``: cumulative rows per expert)."""
    w_up, w_down = _to_local(self.gate_up_proj), _to_local(self.down_proj)
    up = torch.nn.functional.grouped_mm(rows.to(w_up.dtype), w_up.transpose(-2, -1), offs=offsets)
    gate, lin = up.chunk(2, dim=-1)
    return torch.nn.functional.grouped_mm((self.act_fn(gate) * lin).to(w_down.dtype), w_down.transpose(-2, -1),
                                          offs=offsets)


def expert_parallel(model: torch.nn.Module, ep_mesh, tp_mesh=None, ep_etp_mesh=None) -> list[torch.nn.Module]:
    """torchtitan's ExpertParallel on every experts module; returns them.  ``tp_mesh``: ep borrows the tensor-parallel
    ranks (torchtitan's etp = 1, ``ReordererSequenceParallel``): each tp rank routes its contiguous 1/tp of the
    tokens and returns a tensor of every token's row, zeros but its own (a partial sum over tp).  ``ep_etp_mesh``
    (the 2-D (ep, etp) mesh, torchtitan's ExpertTensorParallel): every expert also split on its intermediate
    dimension over the tp ranks (``[Shard(0), Shard(1)]``, ``[Shard(0), Shard(2)]``), each tp rank dispatching all
    the tokens over its own ep group; the output a partial sum over tp."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd
    from torch.distributed.tensor import Shard, distribute_tensor
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    group, ep = ep_mesh.get_group(), ep_mesh.size()

    def forward(self, hidden_states, top_k_index, top_k_weights):
        every = hidden_states
        if tp_mesh is not None:
            share = hidden_states.shape[0] // tp_mesh.size()
            start = tp_mesh.get_local_rank() * share
            hidden_states = hidden_states[start:start + share]
            top_k_index, top_k_weights = top_k_index[start:start + share], top_k_weights[start:start + share]
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
        down = _grouped_experts(self, rows, offsets)
        back = down.new_empty(shape)
        back[index] = down
        back = all_to_all_single_autograd(back, send, recv, group)
        weighted = back * scores.unsqueeze(-1)
        restore = torch.empty_like(order)
        restore[order] = torch.arange(order.numel())
        out = weighted[restore].view(tokens, k, -1).sum(dim=1).to(hidden_states.dtype)
        if tp_mesh is None:
            return out
        full = every.new_zeros(every.shape)
        full[start:start + share] = out
        return full

    found = [m for m in model.modules() if isinstance(m, MixtralExperts)]
    split = {"gate_up_proj": 1, "down_proj": 2}  # the intermediate dimension of (E, 2I, H) and (E, H, I)
    for m in found:
        for name, p in list(m.named_parameters(recurse=False)):
            if ep_etp_mesh is not None:
                p = distribute_tensor(p, ep_etp_mesh, [Shard(0), Shard(split[name])])
            else:
                p = distribute_tensor(p, ep_mesh, [Shard(0)])
            m.register_parameter(name, torch.nn.Parameter(p))
        m.forward = types.MethodType(forward, m)
    return found


def expert_tensor_parallel(model: torch.nn.Module, tp_mesh) -> None:
    """torchtitan's TensorParallel for the experts (tp without ep): ``w1``/``w3`` (here the fused ``gate_up_proj``,
    E x 2I x H) split on dimension 1, ``w2`` (``down_proj``, E x H x I) on dimension 2; all tokens through the
    local slices, the output a partial sum over tp.  (The fused gate/up tensor's rows are split as one: the
    sizes of torchtitan's; the random weights make the rows' meaning moot.)"""
    from torch.distributed.tensor import Shard, distribute_tensor
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    def forward(self, hidden_states, top_k_index, top_k_weights):
        tokens, k = top_k_index.shape
        flat = top_k_index.reshape(-1)
        order = torch.argsort(flat, stable=True)
        rows = hidden_states[order // k]
        scores = top_k_weights.reshape(-1)[order]
        with torch.no_grad():
            offsets = torch.bincount(flat, minlength=self.num_experts).cumsum(0).to(torch.int32)
        weighted = _grouped_experts(self, rows, offsets) * scores.unsqueeze(-1)
        restore = torch.empty_like(order)
        restore[order] = torch.arange(order.numel())
        return weighted[restore].view(tokens, k, -1).sum(dim=1).to(hidden_states.dtype)

    for m in model.modules():
        if isinstance(m, MixtralExperts):
            for name, dim in (("gate_up_proj", 1), ("down_proj", 2)):
                p = getattr(m, name)
                m.register_parameter(name, torch.nn.Parameter(distribute_tensor(p, tp_mesh, [Shard(dim)])))
            m.forward = types.MethodType(forward, m)


def _attention_styles(outer) -> dict:
    """Megatron's attention pairs on transformers' names: q, k, v colwise, o rowwise to ``outer``."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(output_layouts=outer)}


def embedding_and_head(model: torch.nn.Module, tp_mesh, sp: bool) -> None:
    """torchtitan's styles outside the blocks: the embedding rowwise, the head colwise with its logits gathered, with
    sequence parallelism the embedding's output on sequence shards and the final norm on them."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

    outer = Shard(1) if sp else Replicate()
    top = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=outer),
           "lm_head": ColwiseParallel(input_layouts=outer, output_layouts=Replicate())}
    if sp:
        top["model.norm"] = SequenceParallel()
    parallelize_module(model, tp_mesh, top)


def mixtral_tensor_parallel(model: torch.nn.Module, tp_mesh, sp: bool) -> None:
    """torchtitan's tensor parallelism (``torchtitan/models/llama3/parallelize.py`` and ``apply_moe_ep_tp``) on
    transformers' Mixtral names: q, k, v colwise and o rowwise, the embedding rowwise and the head colwise, with
    sequence parallelism (``sp``) the norms on sequence shards and the attention's input gathered; each MoE block's
    input gathered in full and its output (a partial sum) reduce-scattered to sequence shards (all-reduced
    without ``sp``), the router computed in full on every rank."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.parallel import (
        PrepareModuleInput,
        PrepareModuleInputOutput,
        SequenceParallel,
        parallelize_module,
    )

    seq = Shard(1)
    outer = seq if sp else Replicate()
    for layer in model.model.layers:
        styles = {**_attention_styles(outer),
                  "mlp": PrepareModuleInputOutput(input_layouts=(outer,), desired_input_layouts=(Replicate(),),
                                                  use_local_input=True, output_layouts=(Partial(),),
                                                  desired_output_layouts=(outer,))}
        if sp:
            styles.update({"input_layernorm": SequenceParallel(), "post_attention_layernorm": SequenceParallel(),
                           "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": seq},
                                                           desired_input_kwarg_layouts={"hidden_states": Replicate()})})
        parallelize_module(layer, tp_mesh, styles)
    embedding_and_head(model, tp_mesh, sp)


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


def build_gemma2(config: dict):
    """transformers' Gemma 2 (embedding and head tied, norms before and after the attention and the MLP)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM
    from transformers.models.gemma2.modeling_gemma2 import Gemma2DecoderLayer

    return Gemma2ForCausalLM(Gemma2Config(**config)), Gemma2DecoderLayer


def gemma2_tensor_parallel(model: torch.nn.Module, tp_mesh, sp: bool) -> None:
    """Megatron's pairs on transformers' Gemma 2 names (its shipped ``base_model_tp_plan``: q, k, v, gate, up
    colwise, o, down rowwise), the tied embedding and head left whole; with sequence parallelism (torchtitan's
    recipe) the pre-norms on sequence shards feeding the gathered attention and MLP, the post-norms on sequence
    shards returning local tensors to the residual sum, the embedding's output cut to the rank's sequence shard
    and the head's input gathered."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    seq = Shard(1)
    outer = seq if sp else Replicate()
    for layer in model.model.layers:
        styles = {**_attention_styles(outer), "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                  "mlp.down_proj": RowwiseParallel(output_layouts=outer)}
        if sp:
            styles.update({
                "input_layernorm": SequenceParallel(), "pre_feedforward_layernorm": SequenceParallel(),
                "post_attention_layernorm": SequenceParallel(use_local_output=True),
                "post_feedforward_layernorm": SequenceParallel(use_local_output=True),
                "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": seq},
                                                desired_input_kwarg_layouts={"hidden_states": Replicate()}),
                "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))})
        parallelize_module(layer, tp_mesh, styles)
    if sp:
        parallelize_module(model, tp_mesh, {
            "model.embed_tokens": PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=seq),
            "model.norm": SequenceParallel(),
            "lm_head": PrepareModuleInput(input_layouts=seq, desired_input_layouts=Replicate(), use_local_output=True)})


def gemma2_masks(model: torch.nn.Module, batch: int, seq: int, position_ids: torch.Tensor) -> dict:
    """Gemma 2's attention masks for the whole sequence, as its forward builds them from unsharded embeddings (it
    takes them ready-made as a dict): under sequence parallelism its own would be the local shard's."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    kw = dict(config=model.config, inputs_embeds=torch.empty(batch, seq, model.config.hidden_size),
              attention_mask=None, past_key_values=None, position_ids=position_ids)
    return {"full_attention": create_causal_mask(**kw), "sliding_attention": create_sliding_window_causal_mask(**kw)}


def build_deepseek(config: dict):
    """transformers' DeepSeek-V3 (multi-head latent attention: low-rank q and kv projections with their norms)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer

    return DeepseekV3ForCausalLM(DeepseekV3Config(**config)), DeepseekV3DecoderLayer


def deepseek_tensor_parallel(model: torch.nn.Module, tp_mesh, sp: bool) -> None:
    """torchtitan's DeepSeek-V3 recipe (``torchtitan/models/deepseek_v3/infra/parallelize.py``) on transformers'
    names, dense layers: ``wq_b`` (q_b_proj) and ``wkv_b`` (kv_b_proj) colwise, ``wo`` (o_proj) rowwise; ``wq_a``,
    ``wkv_a`` (kv_a_proj_with_mqa) and their norms whole on every rank (NoParallel) on the attention's input, which
    under sequence parallelism is gathered from the norm's sequence shards (PrepareModuleInput; as plain tensors:
    transformers' code mixes them with the whole projections' outputs); the MLP's gate and up colwise, down rowwise;
    the embedding rowwise, the head colwise."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    seq = Shard(1)
    outer = seq if sp else Replicate()
    for layer in model.model.layers:
        styles = {"self_attn.q_b_proj": ColwiseParallel(), "self_attn.kv_b_proj": ColwiseParallel(),
                  "self_attn.o_proj": RowwiseParallel(output_layouts=outer),
                  "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                  "mlp.down_proj": RowwiseParallel(output_layouts=outer)}
        if sp:
            styles.update({
                "input_layernorm": SequenceParallel(), "post_attention_layernorm": SequenceParallel(),
                "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": seq},
                                                desired_input_kwarg_layouts={"hidden_states": Replicate()},
                                                use_local_output=True),
                "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))})
        parallelize_module(layer, tp_mesh, styles)
    embedding_and_head(model, tp_mesh, sp)


def build_qwen3_next(config: dict):
    """transformers' Qwen3-Next (Gated DeltaNet linear-attention layers)."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextDecoderLayer

    return Qwen3NextForCausalLM(Qwen3NextConfig(**config)), Qwen3NextDecoderLayer


def qwen3_next_tensor_parallel(model: torch.nn.Module, tp_mesh, sp: bool) -> None:
    """Megatron's pairs on a Qwen3-Next with dense MLPs (its shipped plan: gate and up colwise, down rowwise) and the
    linear attention whole on every rank, as the shipped plan leaves it; with sequence parallelism the norms on
    sequence shards, the linear attention's input gathered to the whole sequence and its output cut back to the
    rank's shard (PrepareModuleInputOutput), the MLP's input gathered."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleInputOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    seq = Shard(1)
    outer = seq if sp else Replicate()
    for layer in model.model.layers:
        styles = {"mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                  "mlp.down_proj": RowwiseParallel(output_layouts=outer)}
        if sp:
            styles.update({
                "input_layernorm": SequenceParallel(), "post_attention_layernorm": SequenceParallel(),
                "linear_attn": PrepareModuleInputOutput(
                    input_kwarg_layouts={"hidden_states": seq},
                    desired_input_kwarg_layouts={"hidden_states": Replicate()}, use_local_input=True,
                    output_layouts=(Replicate(),), desired_output_layouts=(seq,), use_local_output=True),
                "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))})
        parallelize_module(layer, tp_mesh, styles)
    embedding_and_head(model, tp_mesh, sp)


def build_olmo2(config: dict):
    """transformers' OLMo 2 (q and k normalized over all heads; norms after the attention and the MLP only)."""
    from transformers import Olmo2Config, Olmo2ForCausalLM
    from transformers.models.olmo2.modeling_olmo2 import Olmo2DecoderLayer

    return Olmo2ForCausalLM(Olmo2Config(**config)), Olmo2DecoderLayer


def olmo2_tensor_parallel(model: torch.nn.Module, tp_mesh, sp: bool) -> None:
    """transformers' shipped plan for OLMo 2: q, k, v ``colwise_gather_output`` (sharded projections, outputs
    all-gathered), o ``rowwise_split_input`` (its whole input cut to the rank's slice), the MLP colwise/rowwise; with
    sequence parallelism (torchtitan's recipe) the attention's and the MLP's inputs (the residual stream: OLMo 2 has
    no norm before them) gathered from sequence shards, the post-norms on shards returning local tensors."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    seq = Shard(1)
    outer = seq if sp else Replicate()
    for layer in model.model.layers:
        styles = {f"self_attn.{n}": ColwiseParallel(output_layouts=Replicate()) for n in ("q_proj", "k_proj", "v_proj")}
        styles.update({"self_attn.o_proj": RowwiseParallel(input_layouts=Replicate(), output_layouts=outer),
                       "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                       "mlp.down_proj": RowwiseParallel(output_layouts=outer)})
        if sp:
            styles.update({
                "post_attention_layernorm": SequenceParallel(use_local_output=True),
                "post_feedforward_layernorm": SequenceParallel(use_local_output=True),
                "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": seq},
                                                desired_input_kwarg_layouts={"hidden_states": Replicate()},
                                                use_local_output=True),
                "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),),
                                          use_local_output=True)})
        parallelize_module(layer, tp_mesh, styles)
    embedding_and_head(model, tp_mesh, sp)

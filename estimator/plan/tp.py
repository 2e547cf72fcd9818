"""Tensor parallelism: which Linear layers split how, derived from the traced dataflow, applied with
PyTorch's own ``parallelize_module`` (``torch/distributed/tensor/parallel/style.py``).

Megatron's layout (Shoeybi et al. 2019, §3): in each transformer block, a Linear whose input is
computed from other Linears' outputs through per-feature work only (activations, attention,
element-wise products, views) is split **rowwise** (``RowwiseParallel``: input features split,
outputs summed by an all-reduce), and those Linears **colwise** (``ColwiseParallel``: output
features split, no communication in between).  The pairs are read from the single-device step:
walking back from each Linear's input through the ops of its block, stopping at a norm module
(it mixes the features), the block's input or a placeholder; a Linear reached is a partner.
This finds Megatron's pairs in GPT (qkv -> proj, fc1 -> fc2) and Llama (q, k, v -> o;
gate, up -> down) models without a table of names (:mod:`.tp_dataflow`).  The walk follows values that can
hold features only (top-k indices carry none).  Where the plain split would be wrong, the dataflow says so: a
norm between a colwise group and its rowwise Linear (OLMo 2's q_norm over all heads) or a fused projection cut
at fixed offsets (Phi-3's qkv_proj) has the group's outputs gathered (transformers' colwise_gather_output and
rowwise_split_input); a Linear whose whole output meets a tensor from outside the block (Gemma 4's per-layer
gate), or pairs inside a part whose output is an unsplit Linear (Kimi Linear's gates), stay whole; a block's
part with no split Linear runs whole on every rank (under sequence parallelism on the gathered sequence).

Outside the blocks: the token embedding is split by rows of its vocabulary (``RowwiseParallel``
on ``nn.Embedding``: the output all-reduced) and the LM head by output features with its logits
gathered (``ColwiseParallel(output_layouts=Replicate())``), unless they share a weight (tied:
both left replicated).

**Sequence parallelism** (Korthikanti et al. 2022, §4.2.2), as torchtitan applies it: norms run
on sequence shards (``SequenceParallel``), the rowwise Linears reduce-scatter to sequence shards
(``output_layouts=Shard(1)``), and the sequence is all-gathered once before each group of
colwise Linears (at their closest common module, as ``PrepareModuleInput`` does); the embedding
reduce-scatters its output and the head gathers its input (tied, replicated: the embedding's output is cut to the
rank's sequence shard and the head's input gathered).

**Loss parallelism** (``torch.distributed.tensor.parallel.loss_parallel``), as torchtitan applies it:
the head's logits stay sharded by vocabulary (``ColwiseParallel(output_layouts=Shard(-1),
use_local_output=False)``) and the step's forward, loss and backward run under ``loss_parallel()``,
whose cross-entropy computes the log-softmax and the NLL on the local vocabulary shard with
all-reduces of the row maxima, sums and picked logits: no rank holds the full-vocabulary logits or
their gradient.

A model whose forward does not run on local shards (a view with a fixed head count, a
position embedding added to sequence shards) fails its trace: the planner reports it in one line.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

from .tp_dataflow import TPPlan, _within

def apply_tp(model: torch.nn.Module, plan: TPPlan, mesh, sequence_parallel: bool, loss_parallel: bool = False) -> None:
    """``parallelize_module`` ``model`` (built on meta) over the 1-D ``mesh`` with ``plan``; ``loss_parallel``:
    the head's output left a DTensor sharded by vocabulary (the step then runs under ``loss_parallel()``)."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    seq = Shard(1)
    styles: dict[str, object] = {}
    # (a group inside a MoE block, a shared expert, reads the block's input, which the block gathers in full)
    in_moe = {g for g in plan.gather_at if any(_within(g, block) for block in plan.moe)}
    gathers_itself = (set(plan.gather_at) & set(plan.colwise)) - in_moe if sequence_parallel else set()
    gathered = set(plan.gathered)  # (transformers' colwise_gather_output and rowwise_split_input)
    for p in plan.colwise:  # a single colwise Linear after sequence shards gathers its own input
        styles[p] = ColwiseParallel(input_layouts=seq if p in gathers_itself else Replicate(),
                                    output_layouts=Replicate() if p in gathered else Shard(-1))
    for p in plan.rowwise:
        inputs = Replicate() if p in gathered else Shard(-1)
        if any(_within(p, block) for block in plan.moe):  # a shared expert: summed with the routed experts' partial
            styles[p] = RowwiseParallel(input_layouts=inputs, output_layouts=Partial())  # output, reduced once by
        else:  # the MoE block
            styles[p] = RowwiseParallel(input_layouts=inputs, output_layouts=seq if sequence_parallel else Replicate())
    if plan.embedding:
        styles[plan.embedding] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq if sequence_parallel
                                                 else Replicate())
    if plan.head:
        styles[plan.head] = ColwiseParallel(input_layouts=seq if sequence_parallel else Replicate(),
                                            output_layouts=Shard(-1) if loss_parallel else Replicate(),
                                            use_local_output=not loss_parallel)
    if sequence_parallel:
        for p in plan.norms:
            # a norm inside a block that no colwise group reads (it feeds a residual sum) returns its local shard
            styles[p] = SequenceParallel(use_local_output=p in plan.post_norms)
        if plan.tied:  # replicated: the embedding's output cut to this rank's sequence shard, the head's input gathered
            styles[plan.tied[0]] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=seq)
            styles[plan.tied[1]] = PrepareModuleInput(input_layouts=seq, desired_input_layouts=Replicate(),
                                                      use_local_output=True)
    present = dict(model.named_modules())  # a model traced with fewer of its repeated blocks has fewer layers
    parallelize_module(model, mesh, {p: style for p, style in styles.items() if p in present})
    _split_per_head(present, plan.per_head, mesh)
    if sequence_parallel:
        modules = dict(model.named_modules())

        split = set(plan.colwise) | set(plan.rowwise)

        def gather_sequence(local: bool):
            def hook(module, args, kwargs):
                """All-gather the sequence shards entering a group of colwise Linears (PrepareModuleInput): a DTensor
                on sequence shards (a norm's output), or the hidden states themselves as a local shard (the first
                argument or ``hidden_states``: a block without a norm before it, as the post-norm Exaone 4 and OLMo 2
                run).  ``local``: the gathered sequence as a plain tensor, for a group whose module also runs Linears
                of its own on it (MLA's q_a_proj and kv_a_proj_with_mqa, torchtitan's NoParallel): its gradient is
                each rank's partial sum, reduce-scattered as the DTensor's would be."""
                def gather(a, hidden=False):
                    if isinstance(a, DTensor) and tuple(a.placements) == (seq,):
                        full = a.redistribute(placements=[Replicate()])
                    elif hidden and isinstance(a, torch.Tensor) and not isinstance(a, DTensor) and a.dim() >= 2:
                        shard = DTensor.from_local(a, mesh, [seq], run_check=False)
                        full = shard.redistribute(placements=[Replicate()])
                    else:
                        return a
                    return full.to_local(grad_placements=[Partial()]) if local else full

                return (tuple(gather(a, i == 0) for i, a in enumerate(args)),
                        {k: gather(v, k == "hidden_states") for k, v in kwargs.items()})
            return hook

        for p in plan.whole:
            if p in modules:
                modules[p].register_forward_pre_hook(_whole_sequence_in(mesh), with_kwargs=True)
                modules[p].register_forward_hook(_shard_sequence_out(mesh))
        for p in plan.gather_at:
            if p not in gathers_itself and p not in in_moe and p in modules:
                own = any(isinstance(m, torch.nn.Linear) and f"{p}.{n}" not in split
                          for n, m in modules[p].named_modules() if n)
                modules[p].register_forward_pre_hook(gather_sequence(own), with_kwargs=True)


def _whole_sequence_in(mesh) -> Callable:
    """A whole part's hidden input (the first argument or ``hidden_states``, a sequence shard, plain or a DTensor)
    all-gathered to the whole sequence as a plain tensor; every rank computes the part in full, so the input's
    gradient is whole on each and is cut back to the shard (no communication)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    def gather(a: Any) -> Any:
        if not isinstance(a, torch.Tensor) or a.dim() < 2:
            return a
        shard = a if isinstance(a, DTensor) else DTensor.from_local(a, mesh, [Shard(1)], run_check=False)
        return shard.redistribute(placements=[Replicate()]).to_local()

    def hook(module, args, kwargs):
        args = (gather(args[0]), *args[1:]) if args else args
        return args, {k: gather(v) if k == "hidden_states" else v for k, v in kwargs.items()}
    return hook


def _shard_sequence_out(mesh) -> Callable:
    """A whole part's output (the first if several) cut to the rank's sequence shard; in backward the shards'
    gradients are all-gathered for the part's whole-sequence backward."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    def cut(o: Any) -> Any:
        if not isinstance(o, torch.Tensor) or isinstance(o, DTensor) or o.dim() < 2:
            return o
        whole = DTensor.from_local(o, mesh, [Replicate()], run_check=False)
        return whole.redistribute(placements=[Shard(1)]).to_local()

    def hook(module, args, out):
        return (cut(out[0]), *out[1:]) if isinstance(out, tuple) else cut(out)
    return hook


def _split_per_head(modules: dict[str, torch.nn.Module], names: list[str], mesh) -> None:
    """Each per-head parameter (:func:`per_head_parameters`) replaced by this rank's heads' values, a plain tensor
    as the attention's other operands are local shards (transformers' local sharding); its gradient needs no
    reduction over tp (no other rank computes those heads)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    for name in names:
        parent, _, attr = name.rpartition(".")
        module = modules.get(parent)
        param = module._parameters.get(attr) if module is not None else None
        if param is None:
            continue
        local = distribute_tensor(param.detach(), mesh, [Shard(0)]).to_local()
        module._parameters[attr] = torch.nn.Parameter(local, requires_grad=param.requires_grad)


@contextlib.contextmanager
def full_length_masks(model: torch.nn.Module) -> Iterator[None]:
    """Under sequence parallelism, transformers' attention masks built for the whole sequence.

    A transformers model builds its attention masks (``create_causal_mask``, ``create_sliding_window_causal_mask``,
    ... of ``transformers.masking_utils``, imported into each modeling module) from the embeddings' length, which
    under sequence parallelism is the rank's shard, while its attention runs on the gathered sequence: a model with
    an explicit mask (a sliding window shorter than the sequence, a padding mask) fails.  For the trace, each mask
    function the model's modules import sees a stand-in of the embeddings as long as the ``position_ids`` it is given
    (a zero-stride view: nothing allocated), as a correct sequence-parallel run builds them."""
    import sys

    names = {type(m).__module__ for m in model.modules() if type(m).__module__.startswith("transformers.models.")}
    patched: list[tuple[Any, str, Any]] = []
    for name in names:
        module = sys.modules.get(name)
        for attr in [a for a in dir(module) if a.startswith("create_") and a.endswith("mask")]:
            original = getattr(module, attr)
            if callable(original):
                patched.append((module, attr, original))
                setattr(module, attr, _with_full_length(original))
    try:
        yield
    finally:
        for module, attr, original in patched:
            setattr(module, attr, original)


def _with_full_length(create: Any) -> Any:
    def create_for_the_whole_sequence(*args: Any, **kwargs: Any) -> Any:
        embeds, positions = kwargs.get("inputs_embeds"), kwargs.get("position_ids")
        if isinstance(embeds, torch.Tensor) and isinstance(positions, torch.Tensor) and embeds.dim() >= 2 \
                and positions.shape[-1] > embeds.shape[1]:
            kwargs["inputs_embeds"] = embeds[:, :1].expand(embeds.shape[0], positions.shape[-1], *embeds.shape[2:])
        return create(*args, **kwargs)

    return create_for_the_whole_sequence

"""One rank of a real pipeline-parallel training run on CPU (gloo), for tests/test_pipeline.py.

Run as ``python tests/pp_worker.py RANK WORLD_SIZE INIT_FILE OUT_JSON CONFIG_JSON``; the test starts one process
per rank (one pipeline stage each).  ``CONFIG_JSON``: ``{"config": {...} (examples/llama.py's LlamaConfig),
"batch", "seq", "microbatches", "schedules": ["gpipe", "1f1b"], "tp": int, "sp": bool, "dp": int, "cp": int,
"mixed": bool, "model": "llama" | "mixtral", "ep": int, "wide": [layer indices]}`` (``wide``: those layers' MLP
twice as wide, a stack of unlike layers; ``mixed``: FSDP2 with bf16 parameters and fp32
reduction; ``mixtral``: transformers' Mixtral, tests/moe_worker.py's, with ``ep`` > 1 its experts sharded over
each stage's data-parallel ranks as torchtitan's ``ExpertParallel`` shards them):
with ``tp`` > 1 the ranks form a (pp, tp) mesh, each stage split by tests/dist_worker.py's Megatron plan for the example
Llama (torchtitan's sequence parallelism with ``sp``); with ``dp`` > 1 a (pp, dp) mesh, each stage's layers and
the stage itself under FSDP2's ``fully_shard``; with ``cp`` > 1 a (pp, cp) mesh, each stage under FSDP2 over
the cp ranks (torchtitan's ``dp_shard_cp``) and each step under ``context_parallel`` (the batch and targets
sharded on the sequence, attention torch's ring with tests/dist_worker.py's CPU flash kernels); the stages talk
over the mesh's pp groups.  Independent of estimator's code: nothing from
``estimator`` is imported here.

For each schedule the rank builds the example Llama with real weights and keeps its stage, as torchtitan's
``pipeline_llm`` splits a decoder: the layers divided evenly by rank, the token embedding on the first stage,
the final norm and the output head on the last (:class:`Stage`).  It wraps the stage in
``torch.distributed.pipelining.PipelineStage``, builds the schedule (``ScheduleGPipe`` or ``Schedule1F1B``) with
the cross-entropy of the logits as its loss function, and runs five steps (``schedule.step``: the first stage
feeds the batch, the last passes the targets, with ``return_outputs=False`` as torchtitan calls it), each
followed by ``AdamW.step()`` and ``zero_grad(set_to_none=True)``.  It records the peak of live bytes of each of
the last three steps with tests/dist_worker.py's tracker (every storage a dispatched op reads or makes; the
pipeline's receive buffers, made by ``torch.empty``, included) and reports the smallest: gloo holds a sent tensor
until its worker thread completes the send, at a time that varies from run to run (now and then a step's peak
is a few sent activations higher); and the bytes of its parameters, gradients and optimizer state after the
last ``step()``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

from dist_worker import ResizeAwareTracker, _distinct_bytes, in_place_reduce_scatter  # noqa: E402

import llama  # noqa: E402


class Stage(torch.nn.Module):
    """Layers ``lo``..``hi`` of the example Llama, with its embedding when first and its norm and head when last."""

    def __init__(self, model: llama.Llama, lo: int, hi: int, first: bool, last: bool, seq: int, cp: int = 1):
        super().__init__()
        self.cfg, self.seq = model.cfg, seq // cp  # (under context parallelism: the rank's share of the sequence)
        self.tok_embeddings = model.tok_embeddings if first else None
        self.layers = torch.nn.ModuleList(model.layers[lo:hi])
        self.norm = model.norm if last else None
        self.output = model.output if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = self.seq  # (a later stage's input is a sequence shard under sequence parallelism)
        head_dim = self.cfg.dim // self.cfg.n_heads
        inv_freq = 1.0 / self.cfg.rope_theta ** (torch.arange(0, head_dim, 2) / head_dim)
        angles = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)  # as examples/llama.py
        cos, sin = angles.cos(), angles.sin()
        if self.tok_embeddings is not None:
            x = self.tok_embeddings(x)
        for layer in self.layers:
            x = layer(x, cos, sin)
        if self.output is not None:
            x = self.output(self.norm(x))
        return x


class MixtralStage(torch.nn.Module):
    """Layers ``lo``..``hi`` of transformers' Mixtral (tests/moe_worker.py's, routing balanced), with its embedding
    when first and its final norm and head when last; each stage computes the rotary angles of its positions, as
    the model's own forward does (no mask: causal attention)."""

    def __init__(self, model: torch.nn.Module, lo: int, hi: int, first: bool, last: bool):
        super().__init__()
        inner = model.model
        self.embed_tokens = inner.embed_tokens if first else None
        self.layers = torch.nn.ModuleList(inner.layers[lo:hi])
        self.rotary_emb = inner.rotary_emb
        self.norm = inner.norm if last else None
        self.lm_head = model.lm_head if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed_tokens is not None:
            x = self.embed_tokens(x)
        positions = torch.arange(x.shape[1]).unsqueeze(0)
        angles = self.rotary_emb(x, position_ids=positions)
        for layer in self.layers:
            x = layer(x, position_embeddings=angles, position_ids=positions)
        if self.lm_head is not None:
            x = self.lm_head(self.norm(x))
        return x


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def layer_ranges(n_layers: int, n_stages: int) -> list[tuple[int, int]]:
    """torchtitan's ``generate_llm_fqn_per_model_part`` with its default weights: the embedding and the head
    count as one layer each, ``n_layers + 2`` dealt evenly, the first stages one more when uneven."""
    per, extra = divmod(n_layers + 2, n_stages)
    sizes = [per + (i < extra) for i in range(n_stages)]
    sizes[0] -= 1
    sizes[-1] -= 1
    bounds = [0]
    for size in sizes:
        bounds.append(bounds[-1] + size)
    return list(zip(bounds[:-1], bounds[1:]))


MULTI = {"interleaved-1f1b": "loop", "zbv": "v"}  # torchtitan's two stages per rank


def run(rank: int, world: int, cfg: dict, schedule_name: str) -> dict:
    """Why this length: one real pipelined training run, set up as torchtitan sets it up (split, parallelize,
    stage, schedule, optimizer) and measured over its steady-state steps, reads best in one piece."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, schedules

    tp, dp, cp = cfg.get("tp", 1), cfg.get("dp", 1), cfg.get("cp", 1)
    pp = world // (tp * dp * cp)
    inner, name = (dp, "dp") if dp > 1 else (cp, "cp") if cp > 1 else (tp, "tp")
    mesh = init_device_mesh("cpu", (pp, inner), mesh_dim_names=("pp", name))
    if cp > 1:
        from dist_worker import flash_attention_on_cpu

        flash_attention_on_cpu()
    r = rank // inner  # this rank's place in the pipeline
    style = MULTI.get(schedule_name)
    n_stages = pp * (2 if style else 1)
    mine = (r, 2 * pp - 1 - r) if style == "v" else (r, r + pp) if style else (r,)
    torch.manual_seed(0)
    ep = cfg.get("ep", 1)
    if cfg.get("model") == "mixtral":
        import torchvision_env  # (this script's folder): transformers beside PyPI's torchvision and the CPU torch
        from moe_worker import build_mixtral

        torchvision_env.load()
        model, _ = build_mixtral(cfg["config"])
        ranges = layer_ranges(cfg["config"]["num_hidden_layers"], n_stages)
        modules = [MixtralStage(model, *ranges[s], s == 0, s == n_stages - 1) for s in mine]
        vocab, hf_loss = cfg["config"]["vocab_size"], model.loss_function

        def loss(logits, targets):  # transformers' causal-LM loss, as the model's own forward computes it
            return hf_loss(logits, targets, vocab_size=vocab)
        schedule_loss = loss
    else:
        model = llama.Llama(llama.LlamaConfig(**cfg["config"]))
        for i in cfg.get("wide", ()):  # layers unlike the others (DeepSeek-V3's dense first layers): a wider MLP
            model.layers[i].feed_forward = llama.FeedForward(
                llama.LlamaConfig(**{**cfg["config"], "hidden_dim": 2 * cfg["config"]["hidden_dim"]}))
        ranges = layer_ranges(cfg["config"]["n_layers"], n_stages)
        modules = [Stage(model, *ranges[s], s == 0, s == n_stages - 1, cfg["seq"], cp) for s in mine]
        schedule_loss = loss_fn
    if ep > 1:  # torchtitan's expert region: (pp, efsdp, ep), the ep ranks innermost
        ep_region = init_device_mesh("cpu", (pp, inner // ep, ep), mesh_dim_names=("pp", "efsdp", "ep"))
    del model
    idx = torch.randint(0, cfg["config"]["vocab_size"], (cfg["batch"], cfg["seq"]))
    tracker = ResizeAwareTracker()
    if ep > 1:  # (sharded as torchtitan applies it: ep, then FSDP2 on the experts, the layers and the stage)
        from moe_worker import expert_parallel, shard_experts
    with tracker:
        for module in modules:
            if tp > 1:
                from dist_worker import tensor_parallel

                tensor_parallel(module, mesh["tp"], cfg.get("sp", False))
            if dp > 1 or cp > 1:  # FSDP2 on each layer and the stage, as torchtitan shards a stage (its default
                from torch.distributed.fsdp import fully_shard  # policy under pp: not resharded after forward; under
                # cp over the cp ranks, its dp_shard_cp)
                keep = cfg.get("reshard_after_forward", False)
                from torch.distributed.fsdp import MixedPrecisionPolicy

                mp = {"mp_policy": MixedPrecisionPolicy()}
                if cfg.get("mixed"):  # torchtitan's policy: bf16 parameters, gradients reduced in fp32
                    mp = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)}
                if ep > 1:
                    experts = expert_parallel(module, ep_region["ep"])
                    shard_experts(experts, ep_region["efsdp"], ep, mp["mp_policy"], in_place_reduce_scatter, keep)
                for layer in module.layers:
                    fully_shard(layer, mesh=mesh[name], reshard_after_forward=keep, **mp)
                fully_shard(module, mesh=mesh[name], reshard_after_forward=keep, **mp)

                for m in (*module.layers, module):
                    m.set_custom_reduce_scatter(in_place_reduce_scatter())
        stages = [PipelineStage(m, s, n_stages, torch.device("cpu"), group=mesh["pp"].get_group())
                  for m, s in zip(modules, mine)]
        cls = {"gpipe": schedules.ScheduleGPipe, "1f1b": schedules.Schedule1F1B,
               "interleaved-1f1b": schedules.ScheduleInterleaved1F1B,
               "zbv": schedules.ScheduleZBVZeroBubble}[schedule_name]
        schedule = cls(stages if style else stages[0], cfg["microbatches"], loss_fn=schedule_loss)
        params = [p for m in modules for p in m.parameters()]
        opt = torch.optim.AdamW(params, lr=1e-3)
        for p in params:
            tracker.register(p)
        first, last = 0 in mine, n_stages - 1 in mine
        out: dict = {}
        peaks = []
        for it in range(5):
            if it == 2:
                for state in opt.state.values():
                    for v in state.values():
                        if isinstance(v, torch.Tensor):
                            tracker.register(v)
            if it >= 2:
                tracker.reset_peak()
            batch, target, ring = idx, idx, contextlib.nullcontext()
            if cp > 1:  # a fresh batch and targets, sharded in place on the sequence (torchtitan's train_context)
                from torch.distributed.tensor.experimental import context_parallel

                batch, target = idx.clone(), idx.clone()
                ring = context_parallel(mesh["cp"], buffers=[batch, target], buffer_seq_dims=[1, 1],
                                        no_restore_buffers={batch, target})
            with ring:
                schedule.step(*((batch,) if first else ()), **(dict(target=target, losses=[], return_outputs=False)
                                                                if last else {}))
            opt.step()
            if it >= 2:
                peaks.append((tracker.peak, tracker.peak_op))
            if it == 4:
                peak, op = min(peaks)
                out = {"peak": peak, "peak_op": op, "peaks": [p for p, _ in peaks],
                       "parameters": _distinct_bytes(params),
                       "gradients": _distinct_bytes([p.grad for p in params if p.grad is not None]),
                       "optimizer_state": _distinct_bytes(
                           [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)])}
            opt.zero_grad(set_to_none=True)
    return out


def main(argv: list[str]) -> int:
    """One configuration (``CONFIG_JSON`` as the module docstring gives it; results by schedule) or several
    (``{"runs": {label: configuration}}``; results by label, then schedule), run one after another in this
    process (one start and one import of torch for all: the test's fixtures launch them together)."""
    rank, world, init_file, out_path, cfg = int(argv[0]), int(argv[1]), argv[2], argv[3], json.loads(argv[4])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    try:
        if "runs" in cfg:
            result = {label: _schedules(rank, world, one) for label, one in cfg["runs"].items()}
        else:
            result = _schedules(rank, world, cfg)
    finally:
        dist.destroy_process_group()
    with open(out_path + ".part", "w") as f:
        json.dump(result, f)
    os.replace(out_path + ".part", out_path)
    return 0


def _schedules(rank: int, world: int, cfg: dict) -> dict:
    result = {}
    for name in cfg["schedules"]:
        result[name] = run(rank, world, cfg, name)
        dist.barrier()
    return result


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""One rank of a real pipeline-parallel training run on CPU (gloo), for tests/test_pipeline.py.

Run as ``python tests/pp_worker.py RANK WORLD_SIZE INIT_FILE OUT_JSON CONFIG_JSON``; the test starts one process
per rank (one pipeline stage each).  ``CONFIG_JSON``: ``{"config": {...} (examples/llama.py's LlamaConfig),
"batch", "seq", "microbatches", "schedules": ["gpipe", "1f1b"], "tp": int, "sp": bool, "dp": int}``: with ``tp``
> 1 the ranks form a (pp, tp) mesh, each stage split by tests/dist_worker.py's Megatron plan for the example
Llama (torchtitan's sequence parallelism with ``sp``); with ``dp`` > 1 a (pp, dp) mesh, each stage's layers and
the stage itself under FSDP2's ``fully_shard``; the stages talk over the mesh's pp groups.  Independent of estimator's code: nothing from
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

from dist_worker import ResizeAwareTracker, _distinct_bytes  # noqa: E402

import llama  # noqa: E402


class Stage(torch.nn.Module):
    """Layers ``lo``..``hi`` of the example Llama, with its embedding when first and its norm and head when last."""

    def __init__(self, model: llama.Llama, lo: int, hi: int, first: bool, last: bool, seq: int):
        super().__init__()
        self.cfg, self.seq = model.cfg, seq
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


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def run(rank: int, world: int, cfg: dict, schedule_name: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    tp, dp = cfg.get("tp", 1), cfg.get("dp", 1)
    stages = world // (tp * dp)
    inner, name = (dp, "dp") if dp > 1 else (tp, "tp")
    mesh = init_device_mesh("cpu", (stages, inner), mesh_dim_names=("pp", name))
    s = rank // inner  # this rank's stage
    torch.manual_seed(0)
    model = llama.Llama(llama.LlamaConfig(**cfg["config"]))
    per = cfg["config"]["n_layers"] // stages
    module = Stage(model, s * per, (s + 1) * per, s == 0, s == stages - 1, cfg["seq"])
    del model
    idx = torch.randint(0, cfg["config"]["vocab_size"], (cfg["batch"], cfg["seq"]))
    tracker = ResizeAwareTracker()
    with tracker:
        if tp > 1:
            from dist_worker import tensor_parallel

            tensor_parallel(module, mesh["tp"], cfg.get("sp", False))
        if dp > 1:  # FSDP2 on each layer and the stage, as torchtitan shards a stage
            from torch.distributed.fsdp import fully_shard

            for layer in module.layers:
                fully_shard(layer, mesh=mesh["dp"])
            fully_shard(module, mesh=mesh["dp"])
        stage = PipelineStage(module, s, stages, torch.device("cpu"), group=mesh["pp"].get_group())
        schedule = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule_name](stage, cfg["microbatches"],
                                                                                 loss_fn=loss_fn)
        opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
        for p in module.parameters():
            tracker.register(p)
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
            if s == 0:
                schedule.step(idx)
            elif s == stages - 1:
                schedule.step(target=idx, losses=[], return_outputs=False)
            else:
                schedule.step()
            opt.step()
            if it >= 2:
                peaks.append((tracker.peak, tracker.peak_op))
            if it == 4:
                params = list(module.parameters())
                peak, op = min(peaks)
                out = {"peak": peak, "peak_op": op, "peaks": [p for p, _ in peaks],
                       "parameters": _distinct_bytes(params),
                       "gradients": _distinct_bytes([p.grad for p in params if p.grad is not None]),
                       "optimizer_state": _distinct_bytes(
                           [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)])}
            opt.zero_grad(set_to_none=True)
    return out


def main(argv: list[str]) -> int:
    rank, world, init_file, out_path, cfg = int(argv[0]), int(argv[1]), argv[2], argv[3], json.loads(argv[4])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    try:
        result = {}
        for name in cfg["schedules"]:
            result[name] = run(rank, world, cfg, name)
            dist.barrier()
    finally:
        dist.destroy_process_group()
    with open(out_path + ".part", "w") as f:
        json.dump(result, f)
    os.replace(out_path + ".part", out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

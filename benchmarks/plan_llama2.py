"""Time to train a published run: Llama-2-7B on 1,024 A100-80GB, planned against Meta's figure.

Touvron et al. 2023, "Llama 2: Open Foundation and Fine-Tuned Chat Models", Table 2: the 7B model
took 184,320 GPU-hours of A100-80GB (400 W) to pretrain on 2.0T tokens; section 2.2: global batch
4M tokens, sequence length 4,096 (1,024 GPUs x 1 sequence); Meta's Research Super Cluster
connects the GPUs with 200 Gb/s InfiniBand endpoints.

The plan: FSDP2 (``fully_shard`` on each LlamaDecoderLayer and the root) with its bf16
``MixedPrecisionPolicy`` (``--precision fsdp-bf16``), each decoder layer checkpointed, AdamW,
one 4,096-token sequence per GPU, default links (NVLink3 inside a DGX A100, 8 x HDR across
nodes), no ``--mfu``: step time from the per-op time model and the traced schedule.

    .venv/bin/python benchmarks/plan_llama2.py                 # ~2 minutes on 2 cores
    .venv/bin/python benchmarks/plan_llama2.py --precision bf16-mixed
    .venv/bin/python benchmarks/plan_llama2.py --layers 2      # smoke run (ratio meaningless)

Goal (issue 13): planned GPU-hours within 15 % of 184,320.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

META_GPU_HOURS = 184_320  # Llama 2 paper, Table 2, 7B
TOKENS = 2.0e12


def run(layers: int = 32, precision: str = "fsdp-bf16", gpus: int = 1024) -> dict:
    from estimator.plan import Planner
    from estimator.specs import load

    model, inputs = load("hf:llama", batch=1, seq=4096, overrides=dict(
        hidden_size=4096, intermediate_size=11008, num_hidden_layers=layers, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096))
    start = time.perf_counter()
    p = Planner(model, inputs, gpu="A100-80GB", precision=precision).plan(
        "fsdp", gpus, checkpoint="LlamaDecoderLayer", tokens=TOKENS, solve=())
    t = p.time
    gpu_hours = p.time_to_train_s * gpus / 3600
    return {"layers": layers, "precision": precision, "gpus": gpus, "step_time_s": p.step_time_s,
            "compute_s": t.compute_s, "comm_s": t.comm_s, "exposed_comm_s": t.exposed_comm_s,
            "steps": p.training.steps, "gpu_hours": gpu_hours, "meta_gpu_hours": META_GPU_HOURS,
            "ratio": gpu_hours / META_GPU_HOURS, "plan_seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--precision", default="fsdp-bf16")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    r = run(args.layers, args.precision)
    print(f"Llama-2-7B shape ({r['layers']} layers), {r['gpus']} x A100-80GB, fsdp, {r['precision']}, "
          f"checkpoint LlamaDecoderLayer, 2T tokens")
    print(f"  step {r['step_time_s'] * 1e3:.1f} ms = compute {r['compute_s'] * 1e3:.1f} ms + exposed communication "
          f"{r['exposed_comm_s'] * 1e3:.1f} ms (of {r['comm_s'] * 1e3:.1f} ms)")
    print(f"  {r['steps']:,} steps -> {r['gpu_hours']:,.0f} GPU-hours; Meta: {META_GPU_HOURS:,} "
          f"-> {r['ratio']:.3f}x ({'PASS' if abs(r['ratio'] - 1) <= 0.15 else 'MISS'}: goal within 15 %)")
    print(f"  planned in {r['plan_seconds']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

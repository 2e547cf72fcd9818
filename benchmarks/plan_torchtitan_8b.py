"""torchtitan's published Llama 3.1 8B rows on 8 and 128 H100s, eager, compiled and float8, planned against them.

torchtitan docs/performance.md, Table 1 (1D parallelism): Llama 3.1 8B, 8 GPUs, FSDP, local batch 2 (global
16), sequence 8,192, selective activation checkpointing (torchtitan's per-op policy), on Grand Teton hosts:
H100 96 GB HBM2e at 2.4 TB/s, default 500 W power limit, NVLink inside the host.

    | Techniques                     | TPS/GPU | Memory (GiB) |
    | FSDP                           |   5,762 |         82.4 |
    | FSDP + torch.compile           |   6,667 |         77.0 |
    | FSDP + torch.compile + Float8  |   8,532 |         76.8 |

Table 3, the same on 128 GPUs (16 hosts, 400 Gb/s RDMA per GPU between them), global batch 256:

    | FSDP                           |   5,605 |         67.0 |
    | FSDP + torch.compile           |   6,514 |         62.0 |
    | FSDP + torch.compile + Float8  |   8,380 |         61.8 |

The plan: FSDP2 on each decoder layer and the root with torchtitan's bf16 MixedPrecisionPolicy (fp32 reduce,
torchtitan's default: ``--precision fsdp-bf16 --reduce-dtype fp32``; reduced in bf16 until
2026-11-29), every decoder layer under the ``op`` checkpoint policy, AdamW, torch.compile per
block (``compile="block"``), float8 tensorwise (torchao, every Linear but the output head; float8 all-gather
not modelled).  The card is given as a GPU file (the hardware table's H100-SXM with the measured card's
96 GB, 2.4 TB/s and 500 W).  Memory is compared as torchtitan logs it (the allocator's reserved bytes: the
plan's need less the CUDA context).  This machine's figures are printed, not asserted: torchtitan's runs are
how the planner is judged, never what it is fitted to.

    .venv/bin/python benchmarks/plan_torchtitan_8b.py            # ~3 minutes on 2 cores
    .venv/bin/python benchmarks/plan_torchtitan_8b.py --layers 4 # smoke run (ratios meaningless)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PUBLISHED = {8: {"eager": (5762, 82.4), "compile": (6667, 77.0), "compile+float8": (8532, 76.8)},
             128: {"eager": (5605, 67.0), "compile": (6514, 62.0), "compile+float8": (8380, 61.8)}}
ROWS = {"eager": {}, "compile": {"compile": "block"}, "compile+float8": {"compile": "block", "float8": "tensorwise"}}
SEQ, LOCAL_BATCH = 8192, 2
# The torch release of the published runs (torchtitan's performance tables of late 2024 - early 2025, torch
# nightlies 2.6-2.7): decides the attention kernel.  Those releases run PyTorch's flash kernel (FlashAttention-2)
# on H100s; cuDNN's, twice as fast at 8,192 tokens (tests/data/h200/attention.csv), comes first only from the
# releases that ship cuDNN > 9.15 (estimator.target: check_prefer_cudnn_attention)
CUDA_TORCH = "2.6"


def gpu_file(folder: str) -> str:
    """The Grand Teton H100 as a --gpu file: the table's H100-SXM with 96 GB, 2.4 TB/s, 500 W."""
    from estimator.hardware import lookup

    spec = lookup("H100").to_json()
    spec.update(name="H100-96GB-HBM2e-500W", memory_gb=96.0, total_memory_bytes=None, bandwidth_gbs=2400.0,
                tdp_w=500, aliases=[])
    spec.pop("total_memory_source", None)
    path = Path(folder) / "h100_96gb.json"
    path.write_text(json.dumps(spec))
    return str(path)


def run(layers: int, row: str, gpu: str, gpus: int) -> dict:
    from estimator.plan import Planner
    from estimator.specs import load

    model, inputs = load("hf:llama", batch=LOCAL_BATCH, seq=SEQ, overrides=dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=SEQ))
    start = time.perf_counter()
    p = Planner(model, inputs, gpu=gpu, precision="fsdp-bf16", reduce_dtype="fp32", checkpoint_policy="op",
                cuda_torch=CUDA_TORCH, **ROWS[row]).plan(
        "fsdp", gpus, checkpoint="LlamaDecoderLayer", solve=())
    tps = LOCAL_BATCH * SEQ / p.step_time_s
    reserved = (p.verdict.needed - p.verdict.reserve.get("cuda_context", 0)) / 2**30
    return {"row": row, "layers": layers, "tps_per_gpu": tps, "reserved_gib": reserved,
            "step_time_s": p.step_time_s, "compute_s": p.time.compute_s, "exposed_comm_s": p.time.exposed_comm_s,
            "plan_seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--rows", nargs="*", default=list(ROWS))
    ap.add_argument("--gpus", nargs="*", type=int, default=list(PUBLISHED), choices=list(PUBLISHED))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        gpu = gpu_file(folder)
        print(f"Llama 3.1 8B shape ({args.layers} layers), H100 96GB 500 W, FSDP, local batch 2 x 8192, "
              f"op checkpointing")
        print(f"{'GPUs':>4s} {'row':16s} {'TPS/GPU':>8s} {'published':>9s} {'ratio':>6s}   {'GiB':>6s} {'published':>9s} "
              f"{'ratio':>6s}   planned in")
        for gpus in args.gpus:
            for row in args.rows:
                r = run(args.layers, row, gpu, gpus)
                tps, mem = PUBLISHED[gpus][row]
                print(f"{gpus:4d} {row:16s} {r['tps_per_gpu']:8,.0f} {tps:9,} {r['tps_per_gpu'] / tps:6.3f}   "
                      f"{r['reserved_gib']:6.1f} {mem:9.1f} {r['reserved_gib'] / mem:6.3f}   {r['plan_seconds']:.0f} s "
                      f"(step {r['step_time_s'] * 1e3:.0f} ms: compute {r['compute_s'] * 1e3:.0f} ms, exposed "
                      f"communication {r['exposed_comm_s'] * 1e3:.0f} ms)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

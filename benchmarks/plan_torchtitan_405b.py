"""torchtitan's published Llama 3.1 405B 3D rows on 512 H100s (FSDP 8 x TP 8 x PP 8, 1F1B and interleaved 1F1B).

torchtitan docs/performance.md, Table 5 (3D parallelism + torch.compile + Float8 + AsyncTP): Llama 3.1 405B,
512 GPUs (FSDP 8, TP 8, PP 8), local batch 32 (global 256), sequence 8,192, full activation checkpointing, on
Grand Teton hosts (H100 96 GB HBM2e, 2.4 TB/s, 500 W, NVLink inside the host, 400 Gb/s RDMA per GPU):

    | Schedule         | TPS/GPU | Memory (GiB) |
    | 1F1B             |     100 |         82.5 |
    | Interleaved 1F1B |     128 |         72.7 |

"Different PP ranks can have different peak memory usages. We take the maximum across all GPUs."  The plan:
the 126 decoder layers dealt as torchtitan deals them (the embedding and the head count as a layer each: 8
stages of 15, 16 x 6, 15 for 1F1B; 16 stages of 7, 8 x 14, 7 for interleaved, two per rank), 32 micro-batches of
one sequence (torchtitan's default micro-batch), tensor parallelism 8 with sequence and loss parallelism, FSDP2
over the 8 data-parallel ranks of each stage with torchtitan's MixedPrecisionPolicy (bf16 parameters, fp32 reduce:
``mixed_precision_reduce = "float32"``, its default), not resharded after
forward (torchtitan's default under pipeline parallelism), every decoder layer checkpointed, torch.compile per
block, float8 tensorwise.  Not expressible: asynchronous TP, torchao's float8 tensor-parallel styles.  Memory as
torchtitan logs it (reserved: the plan's need less the CUDA context).  Printed, not asserted: the published
runs judge the planner, never fit it.

Measured on 2026-11-29 (2 cores): 1F1B 115 TPS/GPU (1.146 of 100), 60.9 GiB on rank 0 (0.738 of 82.5), planned in
39 s; interleaved 1F1B 127 TPS/GPU (0.990 of 128), 65.6 GiB on rank 0 (0.902 of 72.7), 38 s (83 s and 89 s before the
tensor-parallel plan's module lookups walked up paths instead of scanning every Linear, and the model's own figures
were read from the eager single-device step instead of a second, compiled trace).  Until 2026-11-29 the
plan took FSDP2's reduce dtype (the parameters', bf16) where torchtitan reduces in fp32: under pipeline parallelism
FSDP2 does not reduce-scatter until the last micro-batch (``set_requires_gradient_sync(False)``), and with a
reduce dtype unlike the parameters' it accumulates the stage's unsharded gradients in that dtype
(``FSDPParam.to_accumulated_grad_if_needed``): fp32, held through the step.  The rows then read 43.7 and 49.7 GiB
(0.530 and 0.684), 120 and 133 TPS/GPU (the latter also before the attention kernels took the 500 W card's power
factor).  The step is the schedule's actions simulated on every rank (bubble 6.4 s of 35.7 s for 1F1B, 2.9 s of
32.3 s interleaved); the published runs gain 28 % from interleaving where the plan gains 10 %, the bubble's
(pp - 1)/(v M) share.  The 1F1B memory is still under the published figure (rank 0 at the backward of its first
micro-batch with 8 in flight: sharded states 8.7 GiB, the stage's unsharded bf16 parameters 11.6 GiB, unreduced
fp32 gradients and temporaries 34.3 GiB, checkpointed inputs 3.8 GiB; candidates: asynchronous TP's
symmetric-memory buffers, float8 all-gather buffers, the allocator's reserve at these sizes, which the composed
peak takes as its 2.5 % first guess); and the published interleaved row uses less memory than 1F1B where the
plan's uses more (twice the receive buffers and the runtime's sends, held to the end of the step).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PUBLISHED = {"1f1b": (100, 82.5), "interleaved-1f1b": (128, 72.7)}  # TPS/GPU, GiB
SEQ, LOCAL_BATCH, GPUS, TP, PP = 8192, 32, 512, 8, 8


def main(argv: list[str] | None = None) -> int:
    from plan_torchtitan_8b import gpu_file

    from estimator.plan import Planner
    from estimator.specs import load

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=126)
    ap.add_argument("--eager", action="store_true", help="without torch.compile and float8")
    ap.add_argument("--schedule", choices=sorted(PUBLISHED), action="append",
                    help="the published rows to plan (default: both)")
    args = ap.parse_args(argv)
    extra = {} if args.eager else {"compile": "block", "float8": "tensorwise"}
    for schedule in args.schedule or list(PUBLISHED):
        with tempfile.TemporaryDirectory() as folder:
            gpu = gpu_file(folder)
            model, inputs = load("hf:llama", batch=LOCAL_BATCH, seq=SEQ, overrides=dict(
                hidden_size=16384, intermediate_size=53248, num_hidden_layers=args.layers, num_attention_heads=128,
                num_key_value_heads=8, vocab_size=128256, max_position_embeddings=SEQ))
            start = time.perf_counter()
            p = Planner(model, inputs, gpu=gpu, precision="fsdp-bf16", reduce_dtype="fp32", **extra).plan(
                "fsdp", GPUS, tp=TP, sequence_parallel=True, loss_parallel=True, pp=PP, pp_schedule=schedule,
                microbatches=LOCAL_BATCH, checkpoint="LlamaDecoderLayer", solve=())
            seconds = time.perf_counter() - start
        _report(p, schedule, args, seconds)
    return 0


def _report(p, schedule: str, args, seconds: float) -> None:
    published = PUBLISHED[schedule]
    tps = LOCAL_BATCH * SEQ / (TP * PP) / p.step_time_s  # a pp x tp group of 64 GPUs shares one local batch
    reserved = (p.verdict.needed - p.verdict.reserve.get("cuda_context", 0)) / 2**30
    print(f"Llama 3.1 405B shape ({args.layers} layers), 512 x H100 96GB 500 W, FSDP 8 x TP 8 x PP 8 ({schedule}, "
          f"32 micro-batches), {'eager' if args.eager else 'compile + float8'}")
    print(f"{tps:,.0f} TPS/GPU (published {published[0]}, {tps / published[0]:.3f}), {reserved:.1f} GiB on the "
          f"highest rank {p.pipeline['worst_rank']} (published {published[1]}, {reserved / published[1]:.3f}); step "
          f"{p.step_time_s:.1f} s, bubble {p.pipeline['bubble_s']:.1f} s; planned in {seconds:.0f} s")
    print("  rows of the highest rank: " + ", ".join(f"{k} {v / 2**30:.1f}" for k, v in p.per_gpu.rows.items() if v)
          + f" GiB; at {p.per_gpu.peak_phase}")
    for rk in p.pipeline["per_rank"]:
        blocks = ", ".join(f"{lo}-{hi - 1}" for lo, hi in rk["blocks"])
        print(f"  rank {rk['rank']}: stages {rk['stages']} (blocks {blocks}), peak {rk['peak'] / 2**30:.1f} GiB, "
              f"{rk['in_flight']} in flight, busy {rk['busy_s']:.1f} s")


if __name__ == "__main__":
    sys.exit(main())

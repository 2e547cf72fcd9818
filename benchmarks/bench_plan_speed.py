"""Benchmark: how long a plan takes against one estimate of the same model, measured in the same run.

Issue 23's goal: a 7B plan within 2x the time of one estimate; issue 22's: a 7B FSDP plan under 10 s on the
2-core machine.  The model is bench_llama7b.py's Llama-7B shape (meta weights, batch 1 x 2048 token ids as
labels too).  Two measurements, each in a fresh subprocess with ``torch.set_num_threads(2)``, imports and the
meta model built before the clock, alternated (ABBA) and repeated:

* ``estimate``: ``estimate(model, inputs, optimizer="adamw")`` and ``str(report)``;
* ``plan``: ``plan(model, inputs, gpu="H100", gpus=8, strategy="fsdp")`` and ``str(plan)``: FSDP2 traced on
  a fake process group of 8 ranks, the largest micro-batch searched (the default ``solve``).

Printed, not asserted: the medians and the ratio plan / estimate.

Usage::

    .venv/bin/python benchmarks/bench_plan_speed.py               # 3 repetitions, 32 layers
    .venv/bin/python benchmarks/bench_plan_speed.py --layers 8 --reps 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

GOAL_RATIO = 2.0  # plan time / estimate time (issue 23)
GOAL_PLAN_S = 10.0  # a 7B FSDP plan on 2 cores (issue 22)
KINDS = ("estimate", "plan")


def child(kind: str, layers: int) -> None:
    import logging
    import warnings

    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("estimator").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(2)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_llama7b import _torchvision_beside_cpu_torch

    _torchvision_beside_cpu_torch()
    import transformers

    transformers.logging.set_verbosity_error()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_llama7b import _build

    from estimator import estimate
    from estimator.plan import plan

    model, inputs = _build(layers, 2048)
    start, cpu = time.perf_counter(), time.process_time()
    if kind == "estimate":
        text = str(estimate(model, inputs, optimizer="adamw"))
    else:
        text = str(plan(model, inputs, gpu="H100", gpus=8, strategy="fsdp"))
    print("RESULT " + json.dumps({"kind": kind, "seconds": time.perf_counter() - start,
                                  "cpu_seconds": time.process_time() - cpu, "chars": len(text)}), flush=True)


def run_child(kind: str, layers: int) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH")
                                              else ""))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--_child", kind, "--layers", str(layers)],
                          capture_output=True, text=True, cwd=root, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"{kind} child failed (exit {proc.returncode})")
    return json.loads(lines[-1][len("RESULT "):])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--_child", choices=KINDS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._child:
        child(args._child, args.layers)
        return 0
    print(f"Llama-7B shape, {args.layers} layers, batch 1 x 2048; {args.reps} repetition(s), alternating, fresh "
          f"process each, 2 threads; load average {os.getloadavg()[0]:.2f}")
    runs: dict[str, list[dict]] = {k: [] for k in KINDS}
    for rep in range(args.reps):
        for kind in KINDS if rep % 2 == 0 else KINDS[::-1]:
            r = run_child(kind, args.layers)
            runs[kind].append(r)
            print(f"  rep {rep + 1} {kind:8s}: {r['seconds']:6.2f} s wall, {r['cpu_seconds']:6.2f} s CPU", flush=True)
    med = {k: statistics.median(r["seconds"] for r in runs[k]) for k in KINDS}
    ratio = med["plan"] / med["estimate"]
    print(f"median: estimate {med['estimate']:.2f} s, plan {med['plan']:.2f} s; plan / estimate {ratio:.2f}x "
          f"(goal <= {GOAL_RATIO:.0f}x: {'met' if ratio <= GOAL_RATIO else 'not met'}); plan under "
          f"{GOAL_PLAN_S:.0f} s: {'met' if med['plan'] <= GOAL_PLAN_S else 'not met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The zoo sweep's models again, for the peak: ``estimate(device="cpu")``'s first-step and steady-state peaks
against a live-tensor tracker on two real CPU steps of the same loop.

    .venv/bin/python benchmarks/peak_sweep.py --n 60                               # 60 transformers types
    .venv/bin/python benchmarks/peak_sweep.py --zoo timm --loop '{"precision": "bf16-mixed"}'
    .venv/bin/python benchmarks/peak_sweep.py --loop '{"keep_output": true, "grad_accum": 2}' --n 40 --seed 1

The zoo sweep (``zoo_sweep.py``) compares parameters, gradients, optimizer state, saved activations and FLOPs
with a real step; the peak, the number a user sizes a GPU with, needs the whole step's lifetimes.  Here each
model the zoo sweep found exact (its ``zoo_sweep*.jsonl`` record: the same shrunk configuration, batch and
inputs) runs in its own process: two real AdamW steps of random weights under ``tests/livetracker.py``
(every storage's bytes from when an op first returns it until ``weakref.finalize`` sees it freed; parameters,
buffers and inputs from the start), in the loop ``--loop`` gives (``keep_output``, ``grad_accum``,
``precision``: ``"bf16-mixed"`` runs the real step under CPU autocast), and the estimate of the same loop on the
CPU target.  One thread per process, ``--jobs`` processes.  A model whose real peaks differ is measured again
with Python's cyclic garbage collector off: where that changes the real peak, the model keeps tensors in
reference cycles, freed whenever the collector happens to run (``gc-dependent``; the estimate follows reference
counts).  Records: ``--out`` (JSON lines); the summary on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ZOOS = {"transformers": "zoo_sweep.jsonl", "torchvision": "zoo_sweep_torchvision.jsonl",
        "timm": "zoo_sweep_timm.jsonl"}


def child(rec: dict, loop: dict) -> dict:
    """One model: the real peaks (gc on, and off where they differ from the estimate) and the estimate's."""
    import gc
    import warnings

    warnings.filterwarnings("ignore")
    sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
    import torch

    torch.set_num_threads(1)
    import torchvision_env

    torchvision_env.load()
    import sweep
    from groundtruth import default_loss
    from livetracker import measure_peaks

    from estimator import estimate
    from estimator.specs import load_spec

    loop = dict(loop)
    precision = loop.pop("precision", "fp32")
    t = rec["type"]
    loaded = load_spec(t, batch=sweep.BATCH, **rec.get("options", {})) if ":" in t else \
        sweep._load(load_spec, t, rec.get("overrides") or {})
    loss_of = loaded.loss_fn or default_loss
    autocast = torch.bfloat16 if precision == "bf16-mixed" else None

    def real() -> list[int]:
        model = sweep.without_layerdrop(sweep.materialize(loaded.model))
        torch.manual_seed(0)
        return measure_peaks(model, sweep.real_inputs(loaded.inputs), lambda p: torch.optim.AdamW(p, lr=1e-3),
                             loss_of, steps=2, autocast_dtype=autocast, **loop)

    first, steady = real()
    mem = estimate(loaded.model, loaded.inputs, loss_fn=loaded.loss_fn, device="cpu", precision=precision,
                   optimizer="adamw", **loop).memory
    out = {"type": t, "loop": {"precision": precision, **loop}, "first": first, "steady": steady,
           "estimate_first": mem.peak_first_step, "estimate": mem.peak}
    out["outcome"] = "exact" if (first, steady) == (mem.peak_first_step, mem.peak) else "differs"
    if out["outcome"] == "differs":
        gc.disable()
        try:
            again = real()
        finally:
            gc.enable()
        if again != [first, steady]:
            out.update(outcome="gc-dependent", without_gc=again)
    return out


def run_one(rec: dict, loop: dict, timeout: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", json.dumps(rec), "--loop", json.dumps(loop)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"type": rec["type"], "outcome": "timeout"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        message = tail[-1][:300] if tail else f"exit {proc.returncode}"
        return {"type": rec["type"], "outcome": "error", "message": message}
    return json.loads(lines[-1][len("RESULT "):])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zoo", choices=sorted(ZOOS), default="transformers")
    ap.add_argument("--loop", default="{}", help='the loop as JSON: keep_output, grad_accum, precision '
                                                 '(e.g. \'{"keep_output": true, "grad_accum": 2}\')')
    ap.add_argument("--n", type=int, default=0, help="models sampled (default: every exact one)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--out", default=None, help="records (JSON lines; default: none)")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    loop = json.loads(args.loop)
    if args._child:
        print("RESULT " + json.dumps(child(json.loads(args._child), loop)), flush=True)
        return 0
    with open(os.path.join(HERE, ZOOS[args.zoo])) as f:
        recs = [r for r in map(json.loads, f) if r.get("outcome") == "exact"]
    if args.n:
        random.Random(args.seed).shuffle(recs)
        recs = recs[:args.n]
    results = []
    out = open(args.out, "w") if args.out else None
    with ThreadPoolExecutor(args.jobs) as pool:
        for i, r in enumerate(pool.map(lambda rec: run_one(rec, loop, args.timeout), recs)):
            results.append(r)
            if out:
                out.write(json.dumps(r) + "\n")
                out.flush()
            if r["outcome"] == "exact":
                miss = ""
            elif "steady" in r:
                miss = (f" (steady {r['estimate'] - r['steady']:+,} B, first "
                        f"{r['estimate_first'] - r['first']:+,} B)")
            else:
                miss = f": {r.get('message', '')}"
            print(f"{i + 1:4d}/{len(recs)} {r['type']}: {r['outcome']}{miss}", flush=True)
    if out:
        out.close()
    counts: dict[str, int] = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    print(f"{args.zoo}, loop {json.dumps(loop)}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())

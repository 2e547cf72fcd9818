"""Benchmark: a Llama-2-70B-shaped model estimated end to end, beside FlopCounterMode on the same model.

The model is ``hf:llama`` with the Llama-2-70B shape (hidden 8192, 80 layers, 64 attention
heads, 8 key/value heads, MLP 28672, vocabulary 32000), built without weights by the
estimator's own SPEC loader (:func:`estimator.specs.load_spec`, which uses
:func:`estimator.build.empty_weights`); the batch is 1 x 4096 token ids, used as labels too.

Measurements, each in a fresh subprocess, alternated and repeated:

* ``peer``: ``torch.utils.flop_counter.FlopCounterMode(display=False)`` under
  ``FakeTensorMode(allow_non_fake_inputs=True)``, running forward + loss + backward of the
  same model through ``torch.func.functional_call`` on fake copies of its parameters and
  buffers.  FLOPs only.
* ``estimate``: ``estimate(model, inputs, optimizer="adamw")`` then ``str(report)`` and
  ``report.to_dict()``: FLOPs, memory with the optimizer step, the report.

In both, the child imports everything and builds the model *before* the clock starts; the
timed section is only the measurement.  Peak RSS is ``getrusage(RUSAGE_SELF).ru_maxrss`` of
the whole child process (Python, torch, transformers, the module objects, the measurement).

``cli`` (once, after the pairs): the command a user types, timed from outside, import and
model construction included::

    estimator estimate hf:llama --set hidden_size=8192 ... --seq 4096 --format json

Usage::

    .venv/bin/python benchmarks/bench_llama70b.py                 # 1 repetition, 80 layers, + cli
    .venv/bin/python benchmarks/bench_llama70b.py --reps 3 --json results.json
    .venv/bin/python benchmarks/bench_llama70b.py --layers 2 --no-cli   # quick smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

GOAL_RATIO = 1.0  # estimate time / peer time
GOAL_RSS_MIB = 1024.0  # 1 GiB peak RSS of the estimate's process
SEQ = 4096
SHAPE = {  # Llama-2-70B (config.json of meta-llama/Llama-2-70b-hf)
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
}
KINDS = ("peer", "estimate")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _maxrss_mib(who=resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024.0  # Linux: KiB


def _overrides(layers: int) -> dict:
    return {**SHAPE, "num_hidden_layers": layers}


def _build(layers: int, seq: int):
    from estimator.specs import load_spec

    loaded = load_spec("hf:llama", seq=seq, batch=1, overrides=_overrides(layers))
    return loaded.model, loaded.inputs


def _peer(model, inputs) -> dict:
    """The peer pass, exactly as benchmarks/bench_llama7b.py times it (one definition for both)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_llama7b import _peer as peer

    return peer(model, inputs)


def _estimate(model, inputs) -> dict:
    """The estimate, exactly as benchmarks/bench_llama7b.py times it."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_llama7b import _estimate as run

    return run(model, inputs)


def child(kind: str, layers: int, seq: int) -> None:
    import logging
    import warnings

    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("estimator").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(2)
    import estimator  # noqa: F401  (imported before the clock)

    t0 = time.perf_counter()
    model, inputs = _build(layers, seq)
    build_s = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    rss_before = _maxrss_mib()
    w0, c0 = time.perf_counter(), time.process_time()
    result = _peer(model, inputs) if kind == "peer" else _estimate(model, inputs)
    result.update(kind=kind, seconds=time.perf_counter() - w0, cpu_seconds=time.process_time() - c0,
                  maxrss_mib=_maxrss_mib(), maxrss_before_mib=rss_before, build_seconds=build_s,
                  params_meta=int(params))
    print("RESULT " + json.dumps(result), flush=True)


def run_child(kind: str, layers: int, seq: int) -> dict:
    """One measurement in a fresh process, run as benchmarks/bench_llama7b.py runs its own."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_llama7b import run_child as run

    return run(kind, layers, seq, script=__file__)


def run_cli(layers: int, seq: int) -> dict:
    """The CLI from outside: wall time and peak RSS of the whole command (a fresh process)."""
    sets = [a for k, v in _overrides(layers).items() for a in ("--set", f"{k}={v}")]
    cmd = [sys.executable, "-m", "estimator", "estimate", "hf:llama", *sets, "--seq", str(seq), "--batch", "1",
           "--format", "json"]
    code = ("import resource, subprocess, sys, time, json\n"
            "t = time.perf_counter(); p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
            "print(json.dumps({'rc': p.returncode, 'seconds': time.perf_counter() - t, 'stdout': p.stdout,\n"
            "  'stderr': p.stderr[-2000:], 'maxrss_mib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))")
    proc = subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True, text=True, cwd=ROOT)
    out = json.loads(proc.stdout)
    if out["rc"] != 0:
        raise SystemExit(f"cli failed: {out['stderr']}")
    d = json.loads(out["stdout"])
    return {"seconds": out["seconds"], "maxrss_mib": out["maxrss_mib"], "params": d["params"]["total"],
            "flops_total": d["flops"]["total"], "peak": d["memory"]["peak"], "command": " ".join(cmd[1:])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=1, help="repetitions of each measurement (default 1)")
    ap.add_argument("--layers", type=int, default=80, help="decoder layers (default 80: Llama-2-70B)")
    ap.add_argument("--seq", type=int, default=SEQ, help="sequence length (default 4096)")
    ap.add_argument("--no-cli", action="store_true", help="skip the end-to-end CLI measurement")
    ap.add_argument("--json", metavar="FILE", help="write all results to FILE as JSON")
    ap.add_argument("--_child", choices=KINDS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._child:
        child(args._child, args.layers, args.seq)
        return 0

    print(f"Llama-2-70B-shaped model ({args.layers} layers), batch 1 x seq {args.seq}, no weights; "
          f"{args.reps} repetition(s), fresh subprocess each; {os.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    runs: dict[str, list[dict]] = {k: [] for k in KINDS}
    for rep in range(args.reps):
        for kind in (KINDS if rep % 2 == 0 else KINDS[::-1]):
            r = run_child(kind, args.layers, args.seq)
            runs[kind].append(r)
            print(f"  rep {rep + 1} {kind:8s}: {r['seconds']:7.2f} s wall, {r['cpu_seconds']:7.2f} s CPU, "
                  f"peak RSS {r['maxrss_mib']:7.1f} MiB (before: {r['maxrss_before_mib']:.1f} MiB; "
                  f"model built in {r['build_seconds']:.2f} s)", flush=True)
    med = {k: {f: statistics.median(r[f] for r in runs[k]) for f in ("seconds", "cpu_seconds", "maxrss_mib")}
           for k in KINDS}
    est, peer = runs["estimate"][-1], runs["peer"][-1]
    ratio = med["estimate"]["seconds"] / med["peer"]["seconds"]
    rss = med["estimate"]["maxrss_mib"]
    print()
    print(f"{'':32s} {'peer (FlopCounterMode)':>24s} {'estimate':>16s}")
    print(f"{'time, wall (median)':32s} {med['peer']['seconds']:>22.2f} s {med['estimate']['seconds']:>14.2f} s"
          f"   {ratio:.2f}x")
    print(f"{'time, CPU (median)':32s} {med['peer']['cpu_seconds']:>22.2f} s {med['estimate']['cpu_seconds']:>14.2f} s")
    print(f"{'peak RSS (median)':32s} {med['peer']['maxrss_mib']:>20.1f} MiB {rss:>12.1f} MiB")
    print(f"{'params (sum of numel)':32s} {peer['params_meta']:>24,} {est['params_counted']:>16,}")
    print(f"{'FLOPs fwd+bwd':32s} {peer['flops_total']:>24,} {est['flops_total']:>16,}")
    print(f"{'FLOPs fwd+bwd, matmul-class':32s} {'':>24s} {est['flops_matmul_fwd_bwd']:>16,}")
    print(f"{'estimated peak memory':32s} {'':>24s} {est['memory_peak_bytes'] / 2**30:>12.2f} GiB")
    print(f"{'captured ops':32s} {'':>24s} {est['graph_nodes']:>16,}")
    if est["unsupported_ops"]:
        print(f"ops without a cost rule: {est['unsupported_ops']}")
    print(f"Goal: estimate time <= {GOAL_RATIO:.1f}x peer: {ratio:.2f}x -> {'PASS' if ratio <= GOAL_RATIO else 'MISS'}")
    print(f"Goal: estimate peak RSS <= {GOAL_RSS_MIB:.0f} MiB: {rss:.1f} MiB -> "
          f"{'PASS' if rss <= GOAL_RSS_MIB else 'MISS'}")
    cli = None
    if not args.no_cli:
        cli = run_cli(args.layers, args.seq)
        print(f"End to end: {cli['command']}\n  {cli['seconds']:.2f} s wall, peak RSS {cli['maxrss_mib']:.1f} MiB; "
              f"params {cli['params']:,}, peak memory {cli['peak'] / 2**30:.2f} GiB")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count(),
                       "layers": args.layers, "seq": args.seq, "median": med, "ratio_wall": ratio, "runs": runs,
                       "cli": cli}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

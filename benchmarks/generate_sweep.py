"""The generation sweep: every causal LM of the zoo sweep, ``--mode generate`` against a real ``generate()``.

    python benchmarks/generate_sweep.py                   # every causal LM type the zoo sweep ran exactly
    python benchmarks/generate_sweep.py --types gpt2,llama
    python benchmarks/generate_sweep.py --table-only

The types are those of ``benchmarks/zoo_sweep.jsonl`` whose class is a causal LM (``...ForCausalLM``,
``...LMHeadModel``) and whose training step the sweep found exact, built with the same shrunk configuration
(its ``overrides``: 2 layers of width 64).  Each runs in its own process: the estimate of transformers'
``generate()`` (CPU target, fp32, batch 2, a prompt of 16 tokens and 8 new ones, the dynamic cache) beside a real
greedy ``generate()`` of the same model with random weights, measured with ``tests/instruments.py``'s live-tensor
tracker and fixed FlopCounterMode: the peak of the prefill (the first forward, with its token selection) and of the
last decode step (the 8th forward to the end), the matmul FLOPs of the first and of the 8th forward (read at each
forward's start and end), and the bytes of the storages the returned cache's layers hold.  Outcomes: ``exact``
(all five within 1 %), ``differs``, ``refused`` (the estimator
said in one line that it cannot size it), ``no-truth`` (the real ``generate()`` fails too), ``crash`` (a
traceback: a defect).  Records go to ``benchmarks/generate_sweep.jsonl``, the table to ``generate_sweep.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
P, N, B = 16, 8, 2  # prompt tokens, new tokens, batch
TOLERANCE = 0.01


def causal_types() -> list[tuple[str, dict]]:
    out = []
    with open(os.path.join(HERE, "zoo_sweep.jsonl"), encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            cls = r.get("cls") or ""
            if r.get("outcome") == "exact" and (cls.endswith("ForCausalLM") or cls.endswith("LMHeadModel")):
                out.append((r["type"], r.get("overrides") or {}))
    return out


def live_generate(model, ids):
    """(prefill peak, last decode step peak, prefill matmul FLOPs, last decode step matmul FLOPs, cache bytes) of a
    real greedy ``generate()`` of N tokens (tests/livetracker.py's ``measure_generate``)."""
    from livetracker import measure_generate

    got = measure_generate(model, ids, N)
    return tuple(got[k] for k in ("peak_prefill", "peak_decode", "flops_prefill", "flops_decode", "kv_cache"))


def try_estimate(rec: dict, figures) -> tuple:
    """(``figures()``, None): the estimate's figures; (None, None) with the one-line refusal in ``rec["message"]``;
    (None, the record of a crash) where it raised anything else (a defect)."""
    from estimator.errors import UserError

    try:
        return figures(), None
    except UserError as exc:
        rec["message"] = str(exc)[:300]
        return None, None
    except Exception as exc:  # noqa: BLE001
        return None, {**rec, "outcome": "crash", "message": f"{type(exc).__name__}: {exc}"[:300],
                      "trace": traceback.format_exc()[-1500:]}


def one(model_type: str, overrides: dict) -> dict:
    """The record of one type (in the child process); never raises."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import torch
    from sweep import import_torchvision, materialize

    import_torchvision()
    from estimator import estimate
    from estimator.specs import load_spec

    rec: dict = {"type": model_type}
    try:
        loaded = load_spec(f"hf:{model_type}", batch=B, seq=P, overrides=overrides, labels=False)
    except Exception as exc:  # noqa: BLE001
        return {**rec, "outcome": "unbuilt", "message": f"{type(exc).__name__}: {exc}"[:300]}
    rec["cls"] = type(loaded.model).__name__
    def peaks():
        g = estimate(loaded.model, loaded.inputs, device="cpu", precision="fp32", mode="generate",
                     new_tokens=N).generation
        pre, dec = g.stages["prefill"], g.stages["decode"]
        return (pre.peak, dec.peak, pre.tally.flops["matmul_forward"], dec.tally.flops["matmul_forward"],
                g.kv_cache_bytes)

    est, crashed = try_estimate(rec, peaks)
    if crashed:
        return crashed
    try:
        torch.manual_seed(0)
        real = materialize(loaded.model).eval()
        ids = torch.randint(1, 100, (B, P))
        with torch.no_grad():
            truth = live_generate(real, ids)
    except Exception as exc:  # noqa: BLE001 - the model's own generate() fails
        return {**rec, "outcome": "no-truth" if est is None else "estimated-no-truth",
                "truth_error": f"{type(exc).__name__}: {exc}"[:300]}
    if est is None:
        return {**rec, "outcome": "refused", "truth": truth}
    rel = [(e - t) / t if t else float(e != 0) for e, t in zip(est, truth)]
    ok = all(abs(x) <= TOLERANCE for x in rel)
    return {**rec, "outcome": "exact" if ok else "differs", "estimate": est, "truth": truth,
            "rel": [round(x, 5) for x in rel]}


def run_child(module: str, model_type: str, overrides: dict, timeout: float) -> dict:
    """``module.one(model_type, overrides)`` in a process of its own (a crash or a hang is one record)."""
    code = f"import json, sys; sys.path.insert(0, {HERE!r}); import {module} as g; " \
           f"print('RESULT ' + json.dumps(g.one({model_type!r}, json.loads({json.dumps(overrides)!r}))))"
    env = dict(os.environ, PYTHONPATH=ROOT)
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"type": model_type, "outcome": "timeout"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        return {"type": model_type, "outcome": "crash", "message": (proc.stderr or proc.stdout)[-300:]}
    return json.loads(lines[-1][len("RESULT "):])


def table(records: list[dict]) -> str:
    counts = Counter(r["outcome"] for r in records)
    lines = [f"# Generation sweep: {len(records)} causal LM types", "",
             f"`estimate --mode generate` (CPU target, fp32, batch {B}, prompt {P}, {N} new tokens, dynamic cache) "
             f"against a real greedy `generate()`: the live-tensor tracker's peaks of the prefill and of the last "
             f"decode step, FlopCounterMode's matmul FLOPs of each, the bytes the returned cache holds (exact: all "
             f"five within {TOLERANCE:.0%}).", "",
             "| outcome | types |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(counts.items())]
    lines += ["", "| type | outcome | class | peaks prefill / decode; FLOPs prefill / decode; cache "
                  "(estimate / real - 1) or message |", "|---|---|---|---|"]
    for r in sorted(records, key=lambda r: (r["outcome"] == "exact", r["type"])):
        if r["outcome"] == "exact":
            continue
        detail = ("{:+.2%} / {:+.2%}; {:+.2%} / {:+.2%}; {:+.2%}".format(*r["rel"]) if len(r.get("rel", ())) == 5
                  else " / ".join(f"{x:+.2%}" for x in r["rel"]) if "rel" in r
                  else (r.get("message") or r.get("truth_error") or "")[:160].replace("|", "/"))
        lines.append(f"| {r['type']} | {r['outcome']} | {r.get('cls', '')} | {detail} |")
    return "\n".join(lines) + "\n"


def sweep_main(module: str, types, table_of, description: str, argv: list[str] | None = None) -> int:
    """A sweep's command line: ``module.one`` over ``types()`` ((type, overrides) pairs), each in its own process,
    records appended to ``benchmarks/<module>.jsonl`` (resumable) and ``table_of(records)`` written to ``.md``."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--types", help="comma-separated model types (default: every type of the sweep)")
    ap.add_argument("--out", default=os.path.join(HERE, f"{module}.jsonl"))
    ap.add_argument("--table", default=os.path.join(HERE, f"{module}.md"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args(argv)
    done = {}
    if os.path.exists(args.out):
        with open(args.out, encoding="utf-8") as f:
            done = {r["type"]: r for r in map(json.loads, f)}
    if not args.table_only:
        todo = types()
        if args.types:
            wanted = set(args.types.split(","))
            todo = [(t, o) for t, o in todo if t in wanted]
            for t in wanted:
                done.pop(t, None)
        todo = [(t, o) for t, o in todo if t not in done]
        with ThreadPoolExecutor(args.jobs) as pool:
            for rec in pool.map(lambda to: run_child(module, *to, args.timeout), todo):
                done[rec["type"]] = rec
                print(f"{rec['type']}: {rec['outcome']} {rec.get('rel', '')} {rec.get('message', '')[:120]}",
                      flush=True)
                with open(args.out, "w", encoding="utf-8") as f:
                    for r in done.values():
                        f.write(json.dumps(r) + "\n")
    with open(args.table, "w", encoding="utf-8") as f:
        f.write(table_of(list(done.values())))
    return 0


if __name__ == "__main__":
    sys.exit(sweep_main("generate_sweep", causal_types, table, __doc__.split("\n")[0]))

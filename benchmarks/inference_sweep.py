"""The inference sweep: every model type the zoo sweep ran exactly, ``--mode inference`` against a real forward.

    python benchmarks/inference_sweep.py                  # every type benchmarks/zoo_sweep.jsonl found exact
    python benchmarks/inference_sweep.py --types gpt2,vit
    python benchmarks/inference_sweep.py --table-only

Each type is built as the zoo sweep built it (its ``overrides``: 2 layers of width 64; batch 2 x 32 tokens or the
model's own image/audio size) without labels, in its own process: the estimate (CPU target, fp32,
``mode="inference"``: forward under ``torch.no_grad()``, eval mode, the previous output held until the new one
replaces it) beside the same loop run for real with random weights under ``tests/livetracker.py``'s live-tensor
tracker (two iterations; the second, steady-state peak compared), and the forward's matmul FLOPs against
``tests/instruments.py``'s fixed FlopCounterMode on a third real forward (eval mode: a model's inference branches,
as dropout and layer drop off, may run other matmuls than its training step does).  Outcomes as
``generate_sweep.py``'s; records in
``benchmarks/inference_sweep.jsonl``, the table in ``inference_sweep.md``.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from generate_sweep import TOLERANCE, sweep_main, try_estimate  # noqa: E402


def exact_types() -> list[tuple[str, dict]]:
    with open(os.path.join(HERE, "zoo_sweep.jsonl"), encoding="utf-8") as f:
        return [(r["type"], r.get("overrides") or {}) for r in map(json.loads, f) if r.get("outcome") == "exact"]


def one(model_type: str, overrides: dict) -> dict:
    """The record of one type (in the child process); never raises."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import functools

    from sweep import _load, import_torchvision, materialize, real_inputs, without_layerdrop

    import_torchvision()
    from livetracker import measure_peaks

    from estimator import estimate
    from estimator.specs import load_spec

    rec: dict = {"type": model_type}
    try:
        loaded = _load(functools.partial(load_spec, labels=False), model_type, overrides)
    except Exception as exc:  # noqa: BLE001
        return {**rec, "outcome": "unbuilt", "message": f"{type(exc).__name__}: {exc}"[:300]}
    rec["cls"] = type(loaded.model).__name__
    def figures():
        r = estimate(loaded.model, loaded.inputs, device="cpu", precision="fp32", mode="inference")
        return r.memory.peak, r.tally.flops["matmul_forward"]

    est, crashed = try_estimate(rec, figures)
    if crashed:
        return crashed
    try:
        real = without_layerdrop(materialize(loaded.model))
        inputs = real_inputs(loaded.inputs)
        truth = (measure_peaks(real, inputs, None, None, train=False, steps=2)[-1], None)
    except Exception as exc:  # noqa: BLE001 - the model's own forward fails
        return {**rec, "outcome": "no-truth" if est is None else "estimated-no-truth",
                "truth_error": f"{type(exc).__name__}: {exc}"[:300]}
    try:  # FlopCounterMode's module tracker fails on some models' no-grad forwards: the peak alone then
        truth = (truth[0], forward_flops(real, inputs))
    except Exception as exc:  # noqa: BLE001
        rec["flops_truth_error"] = f"{type(exc).__name__}: {exc}"[:200]
    if est is None:
        return {**rec, "outcome": "refused", "truth": truth}
    rel = [(e - t) / t if t else float(e != 0) for e, t in zip(est, truth) if t is not None]
    return {**rec, "outcome": "exact" if all(abs(x) <= TOLERANCE for x in rel) else "differs", "estimate": est,
            "truth": truth, "rel": [round(x, 5) for x in rel]}


def forward_flops(model, inputs) -> int:
    """Matmul-class FLOPs of one real forward under ``no_grad`` in eval mode (tests/instruments.py's counter)."""
    import torch
    from instruments import flop_counter

    args, kwargs = ((), dict(inputs)) if isinstance(inputs, dict) else (
        (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs), {})
    model.eval()
    counter = flop_counter()
    with torch.no_grad(), counter:
        model(*args, **kwargs)
    return counter.get_total_flops()


def table(records: list[dict]) -> str:
    counts = Counter(r["outcome"] for r in records)
    lines = [f"# Inference sweep: {len(records)} model types", "",
             f"`estimate --mode inference` (CPU target, fp32) against the same loop run for real (forward under "
             f"`torch.no_grad()`, eval mode, the previous output held) measured by the live-tensor tracker (the "
             f"second iteration's peak) and FlopCounterMode (the forward's matmul FLOPs); exact: both within "
             f"{TOLERANCE:.0%}.", "", "| outcome | types |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(counts.items())]
    lines += ["", "| type | outcome | class | peak; FLOPs (estimate / real - 1), or message |", "|---|---|---|---|"]
    for r in sorted(records, key=lambda r: r["type"]):
        if r["outcome"] != "exact":
            rel = r.get("rel")
            detail = ("; ".join(f"{x:+.2%}" for x in rel) if isinstance(rel, list) else f"{rel:+.2%}" if rel is not None
                      else (r.get("message") or r.get("truth_error") or "")[:160].replace("|", "/"))
            lines.append(f"| {r['type']} | {r['outcome']} | {r.get('cls', '')} | {detail} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(sweep_main("inference_sweep", exact_types, table, __doc__.split("\n")[0]))

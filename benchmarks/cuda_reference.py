"""The estimate against the H100 reference steps: peak of a steady-state step and of the first step.

    python benchmarks/cuda_reference.py                    # every case, a markdown table
    python benchmarks/cuda_reference.py --only gpt2_124m --json out.json

For each case of ``tests/data/cuda_reference/memory`` (H100, torch 2.11; see its README), the model
is rebuilt (``tests/cuda_cases.py``) and estimated for the CUDA target on fake tensors; the
table gives ``max_memory_allocated()`` of the measured steps, the estimate (cuBLAS workspaces
included) and their ratio.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import logging
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)

import cuda_cases  # noqa: E402

MiB = 2**20


def reference_files(only=None):
    for path in sorted(glob.glob(os.path.join(cuda_cases.DATA, "memory", "*.json.gz"))):
        name = os.path.basename(path)[: -len(".json.gz")]
        case, precision, *mode = name.split("__")
        if only and case not in only:
            continue
        yield path, case, precision, (mode[0] if mode else "train")


def compare(path, case, precision, mode):
    from estimator import estimate

    with gzip.open(path, "rt") as f:
        ref = json.load(f)
    model, inputs, loss_fn = cuda_cases.CASES[case]()
    if mode == "hf-checkpoint":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if mode == "inference" and isinstance(inputs, dict):
        inputs = {k: v for k, v in inputs.items() if k != "labels"}
    t0 = time.perf_counter()
    # the recorder's loop holds ``out = model(...)`` through backward (training options for training only)
    loop = dict(optimizer="adamw:lr=0.0001", keep_output=True) if mode != "inference" else {}
    report = estimate(model, inputs, loss_fn=loss_fn, device="cuda", precision=precision,
                      mode="inference" if mode == "inference" else "train", gpu="H100", cuda_torch=ref["torch"],
                      solve_batch=False, **loop)
    seconds = time.perf_counter() - t0
    mem = report.to_dict()["memory"]
    return {"case": case, "precision": precision, "mode": mode,
            "measured_peak": ref["steps"][1]["peak"], "measured_first": ref["steps"][0]["peak"],
            "estimated_peak": mem["peak"], "estimated_first": mem["peak_first_step"],
            "workspace": ref["ws"], "seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--precision", nargs="*")
    ap.add_argument("--mode", nargs="*")
    ap.add_argument("--json")
    a = ap.parse_args()
    logging.getLogger("estimator").setLevel(logging.ERROR)
    rows = []
    print("| case | precision | mode | measured peak (MiB) | estimate | ratio | measured step 1 | estimate | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path, case, precision, mode in reference_files(a.only):
        if (a.precision and precision not in a.precision) or (a.mode and mode not in a.mode):
            continue
        try:
            r = compare(path, case, precision, mode)
        except Exception as exc:  # noqa: BLE001 - a table row says what failed
            print(f"| {case} | {precision} | {mode} | error: {type(exc).__name__}: {str(exc)[:120]} |", flush=True)
            continue
        rows.append(r)
        print(f"| {case} | {precision} | {mode} | {r['measured_peak'] / MiB:,.1f} | {r['estimated_peak'] / MiB:,.1f} | "
              f"{r['estimated_peak'] / r['measured_peak']:.4f} | {r['measured_first'] / MiB:,.1f} | "
              f"{r['estimated_first'] / MiB:,.1f} | {r['estimated_first'] / r['measured_first']:.4f} |", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

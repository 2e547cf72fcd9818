"""The estimator against one NVIDIA H200 that none of its constants was fitted on (``tests/data/h200``).

    python benchmarks/h200.py [--compiled]   # ~3 min on 2 cores: 16 steps, 9 peaks, 3 searches, 13 compiled steps

Every case of ``tests/h100_cases.py`` that the H200 recording measured is estimated on CPU fake tensors with
``gpu="H200"`` (the H100's measured constants on the H200's datasheet) and the recorder's loop, and printed
beside the measurement: step time (and whether it falls in the estimate's likely range), the steady-state
peak, the largest micro-batch and the compiled steps.  The H100's measurement of the same case
(``tests/data/h100_loops``), where there is one, is printed beside it.  Markdown tables on stdout; the
kernel tables are ``benchmarks/fit_kernels.py``'s (``--unseen``).
"""

from __future__ import annotations

import json
import logging
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import h100_cases  # noqa: E402

from estimator import estimate  # noqa: E402

DATA, H100 = "h200", "h100_loops"  # recordings under tests/data
lines = h100_cases.recorded


def run(case_fn, precision: str, gpu: str = "H200", **kwargs):
    model, inputs, loss_fn = case_fn()
    if kwargs.get("mode", "train") == "train":  # (an optimizer shapes training steps only)
        kwargs.setdefault("optimizer", "adamw:lr=1e-05")
    return estimate(model, inputs, loss_fn=loss_fn, device="cuda", precision=precision, gpu=gpu, cuda_torch="2.11",
                    **kwargs)


def steps() -> None:
    h100 = {(r["case"], r["precision"]): r["step_s_median"] for r in lines(H100, "timing.jsonl")}
    print("| case | precision | H200 measured ms | estimated ms | ratio | likely range / measured | H100 measured ms "
          "| measured H200 / H100 | estimated H200 / H100 |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|")
    inside = 0
    timing = lines(DATA, "timing.jsonl")
    for r in timing:
        key, m = (r["case"], r["precision"]), r["step_s_median"]
        st = run(h100_cases.MODELS[r["case"]], r["precision"], solve_batch=False).step_time
        lo, hi = st.likely
        inside += lo <= m <= hi
        h1 = h100.get(key)
        ref = run(h100_cases.MODELS[r["case"]], r["precision"], gpu="H100", solve_batch=False).step_time.total
        print(f"| {key[0]} | {key[1]} | {m * 1e3:.2f} | {st.total * 1e3:.2f} | {st.total / m:.3f} | "
              f"{lo / m:.2f}-{hi / m:.2f}{'' if lo <= m <= hi else ' (out)'} | "
              f"{f'{h1 * 1e3:.2f}' if h1 else 'n/a'} | {f'{m / h1:.3f}' if h1 else 'n/a'} | {st.total / ref:.3f} |",
              flush=True)
    print(f"\nmeasured step inside the likely range: {inside} of {len(timing)}\n")


def peaks() -> None:
    print("| case | precision | loop | measured peak MiB | estimated / measured (steady) | (first step) |")
    print("|---|---|---|---:|---:|---:|")
    for r in lines(DATA, "memory.jsonl"):
        mem = run(h100_cases.MODELS[r["case"]], r["precision"], solve_batch=False, **r["loop"]).memory
        steady, first = r["steps"][1]["peak"], r["steps"][0]["peak"]
        print(f"| {r['case']} | {r['precision']} | {json.dumps(r['loop'])} | {steady / 2**20:.1f} | "
              f"{mem.peak / steady:.5f} | {mem.peak_first_step / first:.5f} |", flush=True)


def searches() -> None:
    print("\n| search | precision | largest that ran | estimated |\n|---|---|---:|---:|")
    for r in lines(DATA, "maxbatch.jsonl"):
        report = run(h100_cases.SEARCHES[r["case"]](8), r["precision"])
        print(f"| {r['case']} | {r['precision']} | {r['largest']} | {report.max_batch} |", flush=True)


def compiled() -> None:
    print("\n| case | compile | float8 | measured peak MiB | estimated / measured | measured ms | estimated / measured "
          "| likely range / measured |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    for r in lines(DATA, "compile.jsonl"):
        report = run(h100_cases.MODELS[r["case"]], r["precision"], solve_batch=False, compile=r["compile"],
                     float8=r["float8"])
        peak, t = r["steps"][1]["peak"], r["step_s_median"]
        lo, hi = report.step_time.likely
        print(f"| {r['case']} | {r['compile'] or 'eager'} | {r['float8'] or '-'} | {peak / 2**20:.1f} | "
              f"{report.memory.peak / peak:.3f} | {t * 1e3:.2f} | {report.step_time.total / t:.3f} | "
              f"{lo / t:.2f}-{hi / t:.2f}{'' if lo <= t <= hi else ' (out)'} |", flush=True)


def main() -> None:
    logging.getLogger("estimator").setLevel(logging.ERROR)
    if "--compiled" in sys.argv:  # the compiled and float8 steps only
        return compiled()
    steps()
    peaks()
    searches()
    compiled()


if __name__ == "__main__":
    main()

"""Op-by-op: the estimate's CUDA-target step against a reference step (a tool for modelling work).

    python benchmarks/cuda_diff.py gpt2_124m bf16-mixed [--mode train] [--limit 40]

Aligns the estimate's ops with the reference's (per phase, by op name) and prints where the
memory each op leaves allocated differs, and where ops exist on one side only.
"""

from __future__ import annotations

import argparse
import difflib
import gzip
import json
import logging
import os
import sys
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)

import cuda_cases  # noqa: E402


def short(op: str) -> str:
    return op.removeprefix("aten.").rsplit(".", 1)[0]


def _cumulative(report, ref, limit) -> None:
    """Live bytes after each op, estimate (steady-state timeline) vs reference (memory_allocated()),
    aligned by op name over the whole step; prints each place the difference moves by > 1 MiB."""
    cap = report.capture
    live = {p.index: p.total for p in report.memory.timeline}
    ours, last = [], 0
    for i, n in enumerate(cap.nodes):
        last = live.get(i, last)
        ours.append((short(str(n.target)), last, str(n.meta.get("module", "")), n.meta.get("phase")))
    theirs = [(short(r["op"]), r["after"], r["module"], r["phase"]) for r in ref["ops"]]
    sm = difflib.SequenceMatcher(a=[x[0] for x in ours], b=[x[0] for x in theirs], autojunk=False)
    prev, shown = None, 0
    print("\n== live bytes after aligned ops (estimate - reference), changes > 1 MiB")
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag != "equal":
            continue
        for i, j in zip(range(i1, i2), range(j1, j2)):
            d = ours[i][1] - theirs[j][1]
            if prev is None or abs(d - prev) > 2**20:
                if shown < limit:
                    print(f"  {theirs[j][3]:9s} {ours[i][0]:34s} est {ours[i][1] / 2**20:10.1f} ref {theirs[j][1] / 2**20:10.1f}"
                          f" diff {d / 2**20:+9.1f} MiB ({theirs[j][2] or ours[i][2]})")
                shown += 1
                prev = d


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("case")
    ap.add_argument("precision")
    ap.add_argument("--mode", default="train")
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--phase")
    ap.add_argument("--cumulative", action="store_true",
                    help="print where the live bytes after aligned ops start to differ (estimate - reference)")
    a = ap.parse_args()
    logging.getLogger("estimator").setLevel(logging.ERROR)
    from estimator import estimate
    from estimator.memory import round_cuda

    suffix = "" if a.mode == "train" else f"__{a.mode}"
    with gzip.open(os.path.join(cuda_cases.DATA, "memory", f"{a.case}__{a.precision}{suffix}.json.gz"), "rt") as f:
        ref = json.load(f)
    model, inputs, loss_fn = cuda_cases.CASES[a.case]()
    if a.mode == "hf-checkpoint":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if a.mode == "inference" and isinstance(inputs, dict):
        inputs = {k: v for k, v in inputs.items() if k != "labels"}
    # the recorder's loop holds ``out = model(...)`` through backward (training options for training only)
    loop = dict(optimizer="adamw:lr=0.0001", keep_output=True) if a.mode != "inference" else {}
    report = estimate(model, inputs, loss_fn=loss_fn, device="cuda", precision=a.precision,
                      mode="inference" if a.mode == "inference" else "train", gpu="H100", cuda_torch=ref["torch"],
                      **loop)
    cap = report.capture
    alloc, freed = defaultdict(int), defaultdict(int)
    for index, sid, delta in cap.events:
        if delta > 0:
            alloc[index] += round_cuda(delta)
        else:
            freed[index] += round_cuda(-delta)
    # (phase, op, bytes the op allocates, module, transient, bytes freed after it before the next op)
    ours = [(n.meta["phase"] if n.meta["phase"] != "loss" else "forward", short(str(n.target)), alloc[i],
             str(n.meta.get("module", "")), 0, freed[i]) for i, n in enumerate(cap.nodes)]
    rows = ref["ops"]
    theirs = [(r["phase"], short(r["op"]), r["after"] - r["before"], r["module"],
               r["peak"] - max(r["before"], r["after"]),
               (r["after"] - rows[k + 1]["before"]) if k + 1 < len(rows) else 0) for k, r in enumerate(rows)]
    # views and detaches allocate nothing and differ in count between the traces: left out of the alignment
    trivial = {"detach", "view", "_unsafe_view", "t", "transpose", "expand", "permute", "unsqueeze", "squeeze",
               "alias", "lift_fresh", "as_strided", "slice", "select", "split", "unbind", "reshape"}
    ours = [x for x in ours if not (x[1] in trivial and x[2] == 0)]
    theirs = [x for x in theirs if not (x[1] in trivial and x[2] == 0)]
    print(f"ops: estimate {len(ours)}, reference {len(theirs)}")
    print("steps:", [(s["start"] >> 20, s["peak"] >> 20) for s in ref["steps"]], "ws", ref["ws"] >> 20,
          "| estimate peak", report.memory.peak >> 20, "first", report.memory.peak_first_step >> 20,
          "at", report.memory.peak_at.phase, report.memory.peak_at.module, report.memory.peak_at.op)
    only_ours, only_theirs, diff_net = Counter(), Counter(), Counter()
    shown = 0
    for phase in ("forward", "backward", "optimizer"):
        if a.phase and phase != a.phase:
            continue
        o = [x for x in ours if x[0] == phase]
        t = [x for x in theirs if x[0] == phase]
        sm = difflib.SequenceMatcher(a=[x[1] for x in o], b=[x[1] for x in t], autojunk=False)
        sum_o, sum_t = sum(x[2] for x in o), sum(x[2] for x in t)
        print(f"\n== {phase}: net alloc estimate {sum_o / 2**20:,.1f} MiB, reference {sum_t / 2**20:,.1f} MiB; "
              f"transient max ref {max([x[4] for x in t] or [0]) / 2**20:,.1f} MiB")
        for tag, i1, i2, j1, j2 in sm.get_opcodes():
            if tag == "equal":
                for i, j in zip(range(i1, i2), range(j1, j2)):
                    if o[i][2] != t[j][2] or o[i][5] != t[j][5]:
                        diff_net[o[i][1]] += o[i][2] - t[j][2]
                        if shown < a.limit:
                            shown += 1
                            print(f"  {o[i][1]:34s} alloc est {o[i][2]:>11,} ref {t[j][2]:>11,} | freed after est "
                                  f"{o[i][5]:>11,} ref {t[j][5]:>11,} | transient {t[j][4]:>10,} ({t[j][3] or o[i][3]})")
            else:
                for i in range(i1, i2):
                    only_ours[o[i][1]] += 1
                for j in range(j1, j2):
                    only_theirs[t[j][1]] += 1
                if shown < a.limit:
                    shown += 1
                    print(f"  {tag}: est {[x[1] for x in o[i1:i2]][:6]} {sum(x[2] for x in o[i1:i2]):,} | "
                          f"ref {[x[1] for x in t[j1:j2]][:6]} {sum(x[2] for x in t[j1:j2]):,} ({t[j1][3] if j1 < len(t) else ''})")
    if a.cumulative:
        _cumulative(report, ref, a.limit)
    print("\nonly in the estimate:", dict(only_ours.most_common(12)))
    print("only in the reference:", dict(only_theirs.most_common(12)))
    print("allocation difference by op (estimate - reference, bytes):",
          {k: v for k, v in sorted(diff_net.items(), key=lambda kv: -abs(kv[1]))[:12]})


if __name__ == "__main__":
    main()

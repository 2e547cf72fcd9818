"""Fit the bf16 attention kernels' efficiency per backend and direction (``estimator/timing/attention.py``) on
the H200's measured ``scaled_dot_product_attention`` calls (``tests/data/h200/attention.csv``,
``benchmarks/record_attention.py``).

Each configuration's FLOPs are the estimator's own (``OpWork.from_record``: the rules' counts, causal blocks
skipped by ``causal_fraction``).  A measured call is the harness's dispatch floor (the host launching the op on
an idle GPU; for the backward, autograd's engine too) plus the kernel:

    measured = floor + FLOPs / (bf16 peak * e_max * s / (s + s0) * d / (d + d0))

fitted in log space (least squares of log(model / measured)), per backend and direction; only the kernel term
is shipped.  Printed: the fit, the median error of all calls and of those over 1 ms, and the same held out
(fitted on the even rows, tested on the odd).

    python benchmarks/fit_attention.py [--write]   # --write: estimator/data/attention.json
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT]

import estimator.timing as T  # noqa: E402
from estimator.hardware import lookup  # noqa: E402
from estimator.timing import attention  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data", "h200", "attention.csv")
OUT = os.path.join(ROOT, "estimator", "data", attention.DATA_FILE)
OPS = {"cudnn": "_scaled_dot_product_cudnn_attention", "flash": "_scaled_dot_product_flash_attention",
       "efficient": "_scaled_dot_product_efficient_attention"}
PARAMS = ("e_max", "s0", "d0", "floor")
START = (0.5, 100.0, 32.0, 5e-5)


def rows(path: str = DATA) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def work(r: dict, backward: bool) -> T.OpWork:
    """The estimator's OpWork of one measured call (bf16 q, k, v [B, H, S, D])."""
    shape = [int(r["batch"]), int(r["heads"]), int(r["seq"]), int(r["head_dim"])]
    name = f"aten.{OPS[r['backend']]}{'_backward' if backward else ''}.default"
    ins = [[shape, "bfloat16"]] * (4 if backward else 3)  # (grad_out,) q, k, v
    return T.OpWork.from_record({"op": name, "phase": "backward" if backward else "forward", "in": ins},
                                causal=r["causal"] == "1")


def features(rs: list[dict], backward: bool) -> dict[str, torch.Tensor]:
    f = lambda xs: torch.tensor(xs, dtype=torch.float64)  # noqa: E731
    ws = [work(r, backward) for r in rs]
    return {"flops": f([w.flops * (T.causal_fraction(w.m, w.n) if w.causal else 1.0) for w in ws]),
            "s": f([w.m for w in ws]), "d": f([w.k for w in ws]),
            "measured": f([float(r["backward_ms" if backward else "forward_ms"]) * 1e-3 for r in rs])}


def predict(theta: torch.Tensor, x: dict, peak: float, with_floor: bool = True) -> torch.Tensor:
    e_max, s0, d0, floor = theta.exp()
    eff = e_max * x["s"] / (x["s"] + s0) * x["d"] / (x["d"] + d0)
    return (floor if with_floor else 0.0) + x["flops"] / (peak * eff)


def fit(x: dict, peak: float, steps: int = 3000) -> dict[str, float]:
    theta = torch.tensor([math.log(v) for v in START], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([theta], lr=0.03)
    for _ in range(steps):
        loss = (predict(theta, x, peak) / x["measured"]).log().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return dict(zip(PARAMS, theta.detach().exp().tolist()))


def errors(p: dict, x: dict, peak: float) -> tuple[float, float]:
    """(median error of all calls, of the calls over 1 ms)."""
    theta = torch.tensor([math.log(p[k]) for k in PARAMS], dtype=torch.float64)
    e = (predict(theta, x, peak) / x["measured"]).log().abs()
    big = x["measured"] > 1e-3
    return math.expm1(e.median().item()), math.expm1(e[big].median().item()) if big.any() else math.nan


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args(argv)
    peak = lookup("H200").peak_flops("bf16")
    data, fitted = rows(), {}
    print("| backend / direction | calls | e_max | s0 | d0 | floor us | median error (over 1 ms) | held out |")
    print("|---|---:|---:|---:|---:|---:|---|---|")
    for backend in OPS:
        for backward in (False, True):
            rs = [r for r in data if r["backend"] == backend]
            x = features(rs, backward)
            p = fit(x, peak)
            train = {k: v[0::2] for k, v in x.items()}
            test = {k: v[1::2] for k, v in x.items()}
            held = errors(fit(train, peak), test, peak)
            e = errors(p, x, peak)
            key = f"{backend}/{'backward' if backward else 'forward'}"
            fitted[key] = {k: p[k] for k in ("e_max", "s0", "d0")} | {"harness_floor_s": p["floor"]}
            print(f"| {key} | {len(rs)} | {p['e_max']:.3f} | {p['s0']:.0f} | {p['d0']:.1f} | {p['floor'] * 1e6:.0f} | "
                  f"{e[0]:.1%} ({e[1]:.1%}) | {held[0]:.1%} ({held[1]:.1%}) |")
    if a.write:
        doc = {"source": "tests/data/h200/attention.csv (benchmarks/record_attention.py, one H200, torch 2.11, "
                         "cuDNN 9.19, 2026-11-28); benchmarks/fit_attention.py", "peak": "bf16", "fit": fitted}
        with open(OUT, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
        print("wrote", os.path.relpath(OUT, ROOT))


if __name__ == "__main__":
    main()

"""Fit the float8 GEMMs' efficiency relative to bf16's per variant (``estimator/timing/float8.py``) on the
H200's float8 kernels (``tests/data/h200/float8_gemms.csv.gz``, ``benchmarks/record_float8.py``).

Each kernel is read as ``fit_kernels.shipped_errors`` reads any: the shipped time model's ``gpu_seconds`` (the
H200's: the H100's constants on the H200's datasheet; size and alignment factors, library floor, bytes) less
its launch floor, through the H200's measurement harness (its floor and launch offsets, fitted on its fp32
kernels); kernels under three harness floors are left out (the harness, not the GEMM).  Per variant the
fraction is the one whose median log ratio (model / measured) is zero, found by bisection.  Printed: the
errors before (the bf16 GEMMs' fraction at the float8 peak, the model until 2026-11-28), after, and held out
(fitted on every other shape, tested on the rest); the bf16 GEMMs of the same run beside them.

    python benchmarks/fit_float8.py [--write]   # --write: estimator/data/float8.json
"""

from __future__ import annotations

import argparse
import csv
import gzip
import math
import os
import sys
from contextlib import contextmanager
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

import fit_kernels as FK  # noqa: E402
import public_kernels as PK  # noqa: E402

import estimator.timing as T  # noqa: E402
from estimator.timing import float8  # noqa: E402

H200 = os.path.join(ROOT, "tests", "data", "h200")
GEMMS = os.path.join(H200, "float8_gemms.csv.gz")
OUT = os.path.join(ROOT, "estimator", "data", float8.DATA_FILE)


class F8Kernel:
    """A measured ``_scaled_mm`` (or its bf16 pair): [M, K] @ [K, N], bf16 output (``PK.Kernel``'s interface)."""

    family = "gemm"

    def __init__(self, m: int, n: int, k: int, variant: str, latency_s: float):
        self.shape, self.variant, self.latency_s = (m, n, k), variant, latency_s
        self.dtype = "bfloat16" if variant == "bf16" else "float8_e4m3fn"

    @property
    def work(self) -> T.OpWork:
        m, n, k = self.shape
        item = 2 if self.variant == "bf16" else 1
        # [M, K] @ [K, N]: 2*M*N*K FLOPs; operands read once, the bf16 result written once
        return T.OpWork("aten._scaled_mm.default" if item == 1 else "aten.mm.default", "forward", T.MATMUL,
                        flops=2 * m * n * k, bytes_read=item * (m * k + k * n), bytes_written=2 * m * n,
                        dtype=self.dtype, m=m, n=n, k=k, library="cublas",
                        backend="" if item == 2 else self.variant)


def load(path: str = GEMMS) -> list[F8Kernel]:
    with gzip.open(path, "rt") as f:
        return [F8Kernel(int(r["m"]), int(r["n"]), int(r["k"]), r["variant"], float(r["latency_ms"]) / 1e3)
                for r in csv.DictReader(f)]


def harness() -> dict[str, float]:
    """The H200's measurement harness (floor, launch offsets), fitted on its own fp32 kernels."""
    fp32 = PK.load_sample(os.path.join(H200, "kernels.csv.gz"))
    return FK.fit_gpu(FK.Features(fp32, "H200"))


@contextmanager
def ratios(table: dict[str, float] | None):
    """The time model with these float8 ratios in place of the shipped file's (None: the shipped ones)."""
    shipped = float8.relative
    if table is not None:
        float8.relative = table.get
    try:
        yield
    finally:
        float8.relative = shipped


def errors(kernels, model, h, table: dict[str, float] | None = None) -> dict:
    """``fit_kernels.shipped_errors`` of GEMMs, with the float8 ratios ``table`` (None: as shipped)."""
    with ratios(table):
        return FK.shipped_errors(kernels, model, h).get("gemm", {"n": 0, "bias": math.nan, "error": math.nan})


def fit_variant(kernels, model, h, lo: float = 0.05, hi: float = 1.5) -> float:
    """The fraction whose median log ratio (model / measured) is zero (bisection in log space): of the float8
    peak for a float8 variant, of the bf16 peak for bf16 (the model's ``matmul.half`` replaced)."""
    variant = kernels[0].variant
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        if variant == "bf16":
            bias = errors(kernels, replace(model, eff={**model.eff, "matmul.half": mid}), h)["bias"]
        else:  # the model multiplies the ratio by its bf16 fraction
            bias = errors(kernels, model, h, {variant: mid / model.eff["matmul.half"]})["bias"]
        lo, hi = (lo, mid) if bias < 1 else (mid, hi)  # bias < 1: predicted too fast, a lower fraction
    return math.sqrt(lo * hi)


def _row(name, before, after, held) -> str:
    cell = lambda e: f"{e['bias']:.3f}, {e['error']:.1%}"  # noqa: E731
    return f"| {name} | {before['n']} | {cell(before)} | {cell(after)} | {cell(held)} |"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args(argv)
    model, h = T.load_model("H200"), harness()
    kernels = load()
    split = lambda ks: (ks[::2], ks[1::2])  # noqa: E731  (every other shape: fit, test)
    bf16 = [k for k in kernels if k.variant == "bf16"]
    f_bf16, f_bf16_train = fit_variant(bf16, model, h), fit_variant(split(bf16)[0], model, h)
    print(f"bf16 GEMMs: the shipped H200 model's fraction {model.eff['matmul.half']:.3f}, fitted here {f_bf16:.3f}")
    print("\n| variant | kernels | before: bias, median error | after | held out (fitted on half the shapes) |")
    print("|---|---:|---|---|---|")
    print(_row("bf16 (as shipped)", errors(bf16, model, h), errors(bf16, model, h), errors(split(bf16)[1], model, h)))
    fitted = {}
    for variant in float8.VARIANTS:
        ks = [k for k in kernels if k.variant == variant]
        before = errors(ks, model, h, {})  # no ratio: the bf16 fraction at the float8 peak
        fitted[variant] = fit_variant(ks, model, h) / f_bf16
        after = errors(ks, model, h, {variant: fitted[variant]})
        train, test = split(ks)
        held = errors(test, model, h, {variant: fit_variant(train, model, h) / f_bf16_train})
        print(_row(variant, before, after, held) + f" ratio {fitted[variant]:.3f}")
    if a.write:
        doc = {"source": "tests/data/h200/float8_gemms.csv.gz (benchmarks/record_float8.py, one H200, torch 2.11, "
                         "2026-11-28); benchmarks/fit_float8.py", "bf16_fraction": f_bf16, "relative": fitted}
        FK._dump(doc, OUT, sort_keys=True)
        print("wrote", os.path.relpath(OUT, ROOT))


if __name__ == "__main__":
    main()

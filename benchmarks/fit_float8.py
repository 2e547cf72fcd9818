"""Fit the float8 GEMMs' efficiency relative to bf16's per variant (``estimator/timing/float8.py``) on the
H200's float8 kernels (``tests/data/h200/float8_gemms.csv.gz``, ``benchmarks/record_float8.py``).

Each kernel is read as ``fit_kernels.shipped_errors`` reads any: the shipped time model's ``gpu_seconds`` (the
H200's: the H100's constants on the H200's datasheet; size and alignment factors, library floor, bytes) less
its launch floor, through the H200's measurement harness (its floor and launch offsets, fitted on its fp32
kernels); kernels under three harness floors are left out (the harness, not the GEMM).  Per variant the
fraction is the one whose median log ratio (model / measured) is zero, found by bisection.  Printed: the
errors before (the bf16 GEMMs' fraction at the float8 peak, the model until 2026-11-28), after, and held out
(fitted on every other shape, tested on the rest); the bf16 GEMMs of the same run beside them.

Also the host time of eager float8 layers (``estimator.timing.host.subclass_factor``): torchao's
``Float8Linear`` runs its ops on a Python tensor subclass, so in eager each op costs more host time than a plain
op; a layer whose bf16 forward + backward is host-bound (``float8_layers.csv``: 0.31-0.46 ms for 1,024-8,192
tokens, widths 768-4,096) took 2.6-3.4 ms in float8.  The factor is fitted on those layers alone (module
docstring of :func:`eager_host_factors`), each held out in turn.

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
LAYERS = os.path.join(H200, "float8_layers.csv")
HOST_BOUND_S = 0.5e-3  # a bf16 layer's forward + backward under this is its host's time (the GEMMs take less)
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


def _layer_ops(t: int, k: int, n: int, recipe: str) -> list:
    """The model's timed ops of one ``nn.Linear(k, n)`` on [t, k] in bf16, forward and backward (the input's gradient
    included: a Linear(k, k) before it), in float8 ``recipe`` or bf16; without the eager float8 factors (what they are
    fitted against)."""
    import torch

    from estimator import estimate
    from estimator.timing import float8 as f8
    from estimator.timing import host
    from estimator.timing.simulate import work_nodes

    with torch.device("meta"):
        m = torch.nn.Sequential(torch.nn.Linear(k, k, bias=False), torch.nn.Linear(k, n, bias=False))
    shipped = host.subclass_factor, f8.scaling_factor
    host.subclass_factor = f8.scaling_factor = lambda: 1.0
    try:
        rep = estimate(m, torch.empty(t, k, device="meta"), device="cuda", precision="bf16", gpu="H200",
                       optimizer="sgd", solve_batch=False, float8=None if recipe == "bf16" else recipe,
                       loss_fn=lambda out: out.float().sum())
    finally:
        host.subclass_factor, f8.scaling_factor = shipped
    nodes, at = rep.capture.nodes, work_nodes(rep)  # (an op's index is its place among the timed ops)
    return [o for o in rep.step_time.ops
            if nodes[at[o.index]].meta.get("module") == "1" and o.phase in ("forward", "backward")]


def layer_host(t: int, k: int, n: int, recipe: str) -> float:
    """The host seconds of :func:`_layer_ops`."""
    return sum(o.cpu_s for o in _layer_ops(t, k, n, recipe))


def layer_gpu(t: int, k: int, n: int, recipe: str) -> tuple[float, float]:
    """The GPU seconds of :func:`_layer_ops`: (its GEMMs', its memory-bound ops')."""
    ops = _layer_ops(t, k, n, recipe)
    return sum(o.gpu_s for o in ops if o.kind == "matmul"), sum(o.gpu_s for o in ops if o.kind == "memory")


def _measured_layers() -> dict[tuple[int, int, int, str], float]:
    """``float8_layers.csv``: (tokens, in, out, recipe) -> the measured forward + backward in seconds."""
    with open(LAYERS) as fh:
        rows = list(csv.DictReader(fh))
    return {(int(r["tokens"]), int(r["in_features"]), int(r["out_features"]), r["recipe"]):
            float(r["fwd_bwd_ms"]) / 1e3 for r in rows}


def eager_host_factors() -> list[tuple[tuple, float]]:
    """Per host-bound layer shape and recipe of ``float8_layers.csv`` (the bf16 layer's forward + backward
    under HOST_BOUND_S): the factor f on the float8 layer's modelled host time H8 that makes the measured
    difference, M8 - M16 = f H8 - H16 (the call's other host work, the same in both, cancels)."""
    measured = _measured_layers()
    out = []
    for t, k, n in sorted({key[:3] for key in measured}):
        m16 = measured[(t, k, n, "bf16")]
        if m16 >= HOST_BOUND_S:
            continue
        h16 = layer_host(t, k, n, "bf16")
        for recipe in ("tensorwise", "rowwise"):
            out.append(((t, k, n, recipe), (measured[(t, k, n, recipe)] - m16 + h16) / layer_host(t, k, n, recipe)))
    return out


def eager_scaling_factors() -> list[tuple[tuple, float]]:
    """Per GPU-bound layer shape and recipe of ``float8_layers.csv`` (the bf16 layer's forward + backward at or over
    HOST_BOUND_S): the factor f on the float8 layer's modelled memory-bound ops' time C8 that makes the measured
    time, M8 = G8 + f C8 (G8: its GEMMs' modelled time, the float8 GEMMs fitted on the kernels above)."""
    measured = _measured_layers()
    out = []
    for t, k, n in sorted({key[:3] for key in measured}):
        if measured[(t, k, n, "bf16")] < HOST_BOUND_S:
            continue
        for recipe in ("tensorwise", "rowwise"):
            gemms, memory = layer_gpu(t, k, n, recipe)
            out.append(((t, k, n, recipe), (measured[(t, k, n, recipe)] - gemms) / memory))
    return out


def _median_fit(factors: list[tuple[tuple, float]], title: str) -> float:
    """The median of ``factors``, printed with each and held out shape by shape."""
    import statistics

    f = statistics.median(v for _, v in factors)
    print(f"\neager float8 layers, {title} {f:.3f} (median of {len(factors)})")
    print("| tokens, in, out, recipe | factor | the median of the others / this one |\n|---|---:|---:|")
    for i, (key, v) in enumerate(factors):
        others = statistics.median(w for j, (_, w) in enumerate(factors) if j != i)
        print(f"| {', '.join(map(str, key))} | {v:.3f} | {others / v:.3f} |")
    return f


def fit_eager_scaling() -> float:
    """The median factor of :func:`eager_scaling_factors`."""
    return _median_fit(eager_scaling_factors(), "GPU-bound shapes: scaling ops' factor")


def fit_eager_host() -> float:
    """The median factor of :func:`eager_host_factors`."""
    return _median_fit(eager_host_factors(), "host-bound shapes: factor")


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
    eager = fit_eager_host()
    scaling = fit_eager_scaling()
    if a.write:
        doc = {"source": "tests/data/h200/float8_gemms.csv.gz (benchmarks/record_float8.py, one H200, torch 2.11, "
                         "2026-11-28); benchmarks/fit_float8.py", "bf16_fraction": f_bf16, "relative": fitted,
               "eager_host_factor": eager,
               "eager_host_source": "tests/data/h200/float8_layers.csv: the host-bound shapes (bf16 forward + "
                                    "backward under 0.5 ms), both recipes; benchmarks/fit_float8.py",
               "eager_scaling_factor": scaling,
               "eager_scaling_source": "tests/data/h200/float8_layers.csv: the GPU-bound shapes (bf16 forward + "
                                       "backward at or over 0.5 ms), both recipes; benchmarks/fit_float8.py"}
        FK._dump(doc, OUT, sort_keys=True)
        print("wrote", os.path.relpath(OUT, ROOT))


if __name__ == "__main__":
    main()

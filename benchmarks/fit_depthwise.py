"""The depthwise-convolution rates of the time model (``estimator/timing/depthwise.py``) from kernel measurements.

    python benchmarks/fit_depthwise.py            # write estimator/data/depthwise.json and print the table

Data: ``tests/data/h200/depthwise.csv`` (contiguous inputs: ATen's ``CudaDepthwise2d``) and
``depthwise_channels_last.csv`` (cuDNN), measured on one H200 by ``benchmarks/record_depthwise.py``:
busy-GPU time of the forward and of ``convolution_backward`` (input, weight and bias gradients) per layer
shape.  Per (backend, dtype, stride, kernel size, direction): the median over the shapes of FLOPs / time
(``rules/conv.py``'s FLOPs: ``2 N C_out H_o W_o k^2`` forward, twice that backward, as the time model counts
the op), as a fraction of the H200's fp32 peak (the hardware table's).  Kernels only: no step enters.
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from estimator.hardware import lookup  # noqa: E402
from estimator.rules.conv import conv_flops  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data", "h200")
FILES = {"native": "depthwise.csv", "cudnn": "depthwise_channels_last.csv"}
OUT = os.path.join(ROOT, "estimator", "data", "depthwise.json")


def rows() -> list[dict]:
    """Every measured row with its class key, FLOPs and seconds."""
    out = []
    for backend, name in FILES.items():
        with open(os.path.join(DATA, name)) as f:
            for r in csv.DictReader(f):
                n, c, size, k, s = (int(r[x]) for x in ("batch", "channels", "size", "kernel", "stride"))
                o = (size + 2 * (k // 2) - k) // s + 1
                flops = conv_flops((n, c, size, size), (c, 1, k, k), (n, c, o, o)) * (2 if r["direction"] == "backward"
                                                                                       else 1)
                half = "bf16" if r["dtype"] == "bfloat16" else "fp32"
                key = f"{backend}/{half}/s{s}/k{k}/{r['direction']}"
                out.append({"key": key, "flops": flops, "s": float(r["ms"]) * 1e-3, "backend": r["backend"],
                            "shape": (n, c, size)})
    return out


def fit() -> dict:
    peak = lookup("H200").peak["fp32"]
    groups: dict[str, list[float]] = {}
    for r in rows():
        groups.setdefault(r["key"], []).append(r["flops"] / r["s"])
    eff = {k: statistics.median(v) / peak for k, v in sorted(groups.items())}
    spread = {k: [min(v) / peak, max(v) / peak] for k, v in sorted(groups.items())}
    return {"eff": eff, "range": spread, "provenance": {
        "measured": "tests/data/h200/depthwise.csv, depthwise_channels_last.csv (benchmarks/record_depthwise.py; "
                    "one NVIDIA H200, torch 2.11.0+cu130, cuDNN 9.19, 2026-11-28)",
        "statistic": "median over the layer shapes of FLOPs / busy-GPU time, over the H200's fp32 peak "
                     f"({peak / 1e12:g} TFLOP/s)",
        "shapes": {k: len(v) for k, v in sorted(groups.items())},
        "fitted_on": datetime.date.today().isoformat(), "script": "benchmarks/fit_depthwise.py"}}


def main() -> None:
    import argparse

    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # --help answers, writes nothing
    doc = fit()
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    peak = lookup("H200").peak["fp32"]
    print("| class | shapes | median TFLOP/s | range TFLOP/s |\n|---|---:|---:|---|")
    for k, e in doc["eff"].items():
        lo, hi = doc["range"][k]
        print(f"| {k} | {doc['provenance']['shapes'][k]} | {e * peak / 1e12:.2f} | {lo * peak / 1e12:.2f}-"
              f"{hi * peak / 1e12:.2f} |")
    print("wrote", os.path.relpath(OUT, ROOT))


if __name__ == "__main__":
    main()

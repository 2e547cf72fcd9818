"""Measure float8 GEMMs (``torch._scaled_mm``) and torchao's float8 Linear layers on the CUDA GPU at hand,
beside bf16 at the same shapes, so the time model's float8 GEMM efficiency is fitted on kernels
(``benchmarks/fit_float8.py``) and the layers' casts are checked against the estimate.

``gemms.csv``: per shape (M, N, K: [M, K] @ [K, N], the second operand column-major as ``_scaled_mm`` needs it)
the bf16 ``torch.mm`` and four float8 GEMMs with a bf16 output: tensorwise scales (one fp32 scalar per operand)
with fast accumulation (torchao's output GEMM) and without (its gradient GEMMs, the first operand
``float8_e5m2`` as a gradient is), rowwise scales (fp32 [M, 1] and [1, N]) with and without fast accumulation.
Shapes: the GEMMs of a transformer layer's forward and backward at the widths of GPT-2, Llama-155M, Llama 3 8B
and 70B for 1,024-16,384 tokens, and a seeded random sample of multiples of 16 between 16 and 16,384.
Timing as ``record_kernels.py`` (NeuSight's method): CUDA events around each call, the mean of the fastest
half of ``--runs`` calls after three warm-ups.

``layers.csv``: one ``nn.Linear(K, N, bias=False)`` in bf16 on [T, K] bf16 input, forward and backward
(``out.backward(grad)``), as it is and converted by torchao's ``convert_to_float8_training`` (tensorwise and
rowwise): the float8 casts, amax reductions and ``_scaled_mm`` as eager torchao runs them.  Events around
the whole forward + backward, the same statistic.

    python benchmarks/record_float8.py --out DIR [--budget SECONDS]
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import time

import torch

from record_kernels import time_ms

WIDTHS = {"gpt2": (768, 3072), "llama155m": (1024, 2816), "llama3_8b": (4096, 14336), "llama3_70b": (8192, 28672)}
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
DEV = "cuda"


def layer_gemms(tokens: int, d: int, ff: int) -> list[tuple[int, int, int]]:
    """(M, N, K) of a layer's projections [tokens, d] -> d and the MLP's d -> ff -> d: forward, input gradient
    and weight gradient of each."""
    out = []
    for k, n in ((d, d), (d, ff), (ff, d)):
        out += [(tokens, n, k), (tokens, k, n), (n, k, tokens)]
    return out


def shapes(seed: int = 0, sample: int = 160) -> list[tuple[int, int, int]]:
    chosen = []
    for tokens in (1024, 4096, 8192, 16384):
        for d, ff in WIDTHS.values():
            chosen += layer_gemms(tokens, d, ff)
    rng = random.Random(seed)
    dims = [16 * 2 ** (i / 4) for i in range(41)]  # 16 .. 16384, four per octave
    for _ in range(sample):
        chosen.append(tuple(int(round(rng.choice(dims) / 16)) * 16 for _ in range(3)))
    seen, order = set(), []
    for s in chosen:
        if s not in seen and s[0] * s[1] * s[2] <= 2**41:  # at most ~4.4 TFLOP per GEMM
            seen.add(s)
            order.append(s)
    rng.shuffle(order)  # a budget cut keeps a balanced sample
    return order


def gemm_calls(m: int, n: int, k: int) -> dict:
    """name -> zero-argument callable of each GEMM variant at (m, n, k)."""
    a = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    b_t = torch.randn(n, k, device=DEV, dtype=torch.bfloat16)  # b = b_t.t(): column-major [K, N]
    a8, a8_e5, b8 = a.to(E4M3), a.to(E5M2), b_t.to(E4M3).t()
    one = torch.ones((), device=DEV)
    ra, rb = torch.ones(m, 1, device=DEV), torch.ones(1, n, device=DEV)
    mm = torch._scaled_mm
    return {
        "bf16": lambda: torch.mm(a, b_t.t()),
        "tensorwise_fast": lambda: mm(a8, b8, one, one, out_dtype=torch.bfloat16, use_fast_accum=True),
        "tensorwise": lambda: mm(a8_e5, b8, one, one, out_dtype=torch.bfloat16, use_fast_accum=False),
        "rowwise_fast": lambda: mm(a8, b8, ra, rb, out_dtype=torch.bfloat16, use_fast_accum=True),
        "rowwise": lambda: mm(a8, b8, ra, rb, out_dtype=torch.bfloat16, use_fast_accum=False),
    }


def layer_calls(t: int, k: int, n: int) -> dict:
    """name -> a forward + backward of one Linear(k, n) on [t, k], bf16, as it is and in float8."""
    import copy

    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    base = torch.nn.Sequential(torch.nn.Linear(k, n, bias=False)).to(DEV, torch.bfloat16)
    x = torch.randn(t, k, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(t, n, device=DEV, dtype=torch.bfloat16)
    calls = {}
    for recipe in ("bf16", "tensorwise", "rowwise"):
        layer = copy.deepcopy(base)
        if recipe != "bf16":
            convert_to_float8_training(layer, config=Float8LinearConfig.from_recipe_name(recipe))

        def run(layer=layer):
            layer(x).backward(grad)
            layer[0].weight.grad = None
            x.grad = None
        calls[recipe] = run
    return calls


LAYERS = [(8192, 4096, 4096), (8192, 4096, 14336), (8192, 14336, 4096), (4096, 1024, 2816), (4096, 2816, 1024),
          (8192, 768, 3072), (16384, 8192, 8192), (16384, 8192, 28672), (2048, 4096, 1024), (1024, 1024, 1024)]


def measure(out: str, gpu: str, budget: float, runs: int) -> None:
    t0 = time.time()
    with open(os.path.join(out, "layers.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["gpu", "tokens", "in_features", "out_features", "recipe", "fwd_bwd_ms"])
        for t, k, n in LAYERS:
            for recipe, fn in layer_calls(t, k, n).items():
                w.writerow([gpu, t, k, n, recipe, f"{time_ms(fn, runs, grad=True):.6g}"])
            torch.cuda.empty_cache()
    print(f"layers: {len(LAYERS)} in {time.time() - t0:.0f} s", flush=True)
    todo, done = shapes(), 0
    with open(os.path.join(out, "gemms.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["gpu", "m", "n", "k", "variant", "latency_ms"])
        for m, n, k in todo:
            if time.time() - t0 > budget:
                break
            try:
                for name, fn in gemm_calls(m, n, k).items():
                    w.writerow([gpu, m, n, k, name, f"{time_ms(fn, runs):.6g}"])
            except torch.OutOfMemoryError:
                pass
            torch.cuda.empty_cache()
            done += 1
    print(f"gemms: {done} of {len(todo)} shapes in {time.time() - t0:.0f} s", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpu", default="H200", help="the name written in the gpu column")
    ap.add_argument("--budget", type=float, default=120.0)
    ap.add_argument("--runs", type=int, default=10)
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    measure(a.out, a.gpu, a.budget, a.runs)


if __name__ == "__main__":
    main()

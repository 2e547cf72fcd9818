"""Measure ``scaled_dot_product_attention`` kernels on the CUDA GPU at hand, forward and backward, per backend
(cuDNN, flash, memory-efficient), over sequence lengths, head sizes, head counts and causal masking, so the time
model's attention efficiency is fitted on kernels, not on whole steps.

Per configuration (batch, heads, sequence, head dim, causal, backend; bf16, q/k/v [B, H, S, D] as
``transformers`` passes them): CUDA events around the forward (grad enabled, as in training: the backward's
statistics are saved) and around ``out.backward(grad)``; the mean of the fastest half of ``--runs`` calls after
three warm-ups, as ``record_kernels.py``.  A backend that refuses a configuration is skipped (no row).

    python benchmarks/record_attention.py --out FILE.csv [--budget SECONDS] [--groups G]
"""

from __future__ import annotations

import argparse
import csv
import itertools
import random
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}
SEQS = (256, 512, 1024, 2048, 4096, 8192, 16384)
BATCH_HEADS = ((1, 32), (4, 16), (8, 12))
HEAD_DIMS = (64, 128)


def configs(groups: int = 1):
    """(batch, heads, kv heads, seq, head dim, causal, backend); ``groups`` > 1: grouped-query attention, causal
    only (``heads / groups`` key and value heads, ``enable_gqa``)."""
    masks = (True,) if groups > 1 else (True, False)
    for s, (b, h), d, causal, backend in itertools.product(SEQS, BATCH_HEADS, HEAD_DIMS, masks, BACKENDS):
        if h % groups == 0:
            yield b, h, h // groups, s, d, causal, backend


def time_pair(b, h, h_kv, s, d, causal, backend, runs):
    """(forward ms, backward ms) of one configuration."""
    q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(b, h_kv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    grad = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    fwd, bwd = [], []
    with sdpa_kernel([BACKENDS[backend]]):
        for i in range(runs + 3):
            e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            e[0].record()
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=h_kv != h)
            e[1].record()
            out.backward(grad)
            e[2].record()
            e[2].synchronize()
            q.grad = k.grad = v.grad = None
            if i >= 3:
                fwd.append(e[0].elapsed_time(e[1]))
                bwd.append(e[1].elapsed_time(e[2]))
    half = lambda xs: sum(sorted(xs)[: max(1, runs // 2)]) / max(1, runs // 2)  # noqa: E731
    return half(fwd), half(bwd)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpu", default="H200")
    ap.add_argument("--budget", type=float, default=100.0)
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--groups", type=int, default=1, help="query heads per key/value head (grouped-query attention)")
    a = ap.parse_args(argv)
    t0, done, skipped = time.time(), 0, 0
    todo = list(configs(a.groups))
    random.Random(0).shuffle(todo)  # a budget cut keeps a balanced sample
    with open(a.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["gpu", "batch", "heads", "kv_heads", "seq", "head_dim", "causal", "backend", "forward_ms",
                    "backward_ms"])
        for b, h, h_kv, s, d, causal, backend in todo:
            if time.time() - t0 > a.budget:
                break
            try:
                fw, bw = time_pair(b, h, h_kv, s, d, causal, backend, a.runs)
                w.writerow([a.gpu, b, h, h_kv, s, d, int(causal), backend, f"{fw:.6g}", f"{bw:.6g}"])
                f.flush()
                done += 1
            except RuntimeError:  # this backend does not run this configuration
                skipped += 1
            torch.cuda.empty_cache()
    print(f"attention: {done} rows, {skipped} refused, of {len(todo)} in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()

"""Measure single kernels on the CUDA GPU at hand the way NeuSight's public dataset measured them, so a GPU
the dataset lacks joins the leave-one-GPU-out table (``benchmarks/fit_kernels.py``) as a held-out GPU.

The shapes are those of ``tests/data/public_kernels/kernels.csv.gz`` (every GPU's sample, each distinct
op and shape once, families taken in turn so a budget cut keeps them balanced).  The method is the
dataset's (its README): one PyTorch op at a time, **fp32 with TF32 off** (cuBLAS and cuDNN), CUDA events
around each call, the mean of the fastest half of ``--runs`` calls after three warm-up calls.  Ops as
``benchmarks/public_kernels.py`` reads them: ``bmm`` [B, M, K] @ [B, K, N]; ``linear`` ``nn.Linear(K, N)``
on [M, K]; elementwise on [B, H] (``add mul div pow`` of two tensors, the ``*u`` variants with a scalar,
``relu gelu tanh``); ``ln`` ``nn.LayerNorm(H)``; ``softmax`` over H; ``conv`` ``nn.Conv2d`` with bias on
square NCHW images.  ``--bf16`` also times every GEMM shape in bf16 (tensor cores), a second file.

Also written (``device.json``): the card as torch and ``nvidia-smi`` report it (``total_memory``, free
bytes after CUDA's initialisation, SMs, L2, clocks, power limit) and three ceilings measured here: a
device-to-device copy (bytes read + written), and 8192^3 GEMMs in bf16, tf32 and fp32 (random data).

    python benchmarks/record_kernels.py --out DIR [--budget SECONDS] [--bf16]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import subprocess
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = os.path.join(os.path.dirname(HERE), "tests", "data", "public_kernels", "kernels.csv.gz")
FAMILY = {"bmm": "gemm", "linear": "gemm", "conv": "conv", "ln": "norm", "softmax": "reduction"}
BINARY = {"add": torch.add, "mul": torch.mul, "div": torch.div, "pow": torch.pow}
UNARY = {"addu": lambda x: x + 1.5, "mulu": lambda x: x * 1.5, "divu": lambda x: x / 1.5, "powu": lambda x: x ** 1.5,
         "relu": torch.relu, "gelu": F.gelu, "tanh": torch.tanh}


def shapes() -> list[tuple[str, tuple[int, ...]]]:
    """Distinct (op, shape) of the sample, families interleaved (gemm, conv, elementwise, norm, reduction)."""
    seen, by_family = set(), {}
    with gzip.open(SAMPLE, "rt") as f:
        for row in csv.DictReader(f):
            key = (row["op"], tuple(int(v) for v in row["shape"].split("x")))
            if key not in seen:
                seen.add(key)
                by_family.setdefault(FAMILY.get(row["op"], "elementwise"), []).append(key)
    lists = list(by_family.values())
    return [lst[i] for i in range(max(map(len, lists))) for lst in lists if i < len(lst)]


def make(op: str, shape: tuple[int, ...], dtype=torch.float32, dev: str = "cuda"):
    """A zero-argument callable running the op once on fresh random tensors (``dev="meta"``: a dry run)."""
    r = lambda *s: torch.randn(*s, device=dev, dtype=dtype)  # noqa: E731
    if op == "bmm":
        b, m, n, k = shape
        x, y = r(b, m, k), r(b, k, n)
        return lambda: torch.bmm(x, y)
    if op == "linear":
        _, m, n, k = shape
        lin, x = torch.nn.Linear(k, n, device=dev, dtype=dtype), r(m, k)
        return lambda: lin(x)
    if op == "conv":
        b, c_in, c_out, k, size, stride, pad = shape
        conv, x = torch.nn.Conv2d(c_in, c_out, k, stride, pad, device=dev, dtype=dtype), r(b, c_in, size, size)
        return lambda: conv(x)
    b, h = shape
    x = r(b, h)
    if op == "ln":
        ln = torch.nn.LayerNorm(h, device=dev, dtype=dtype)
        return lambda: ln(x)
    if op == "softmax":
        return lambda: torch.softmax(x, -1)
    if op in BINARY:
        y = r(b, h).abs() + 0.5  # positive: pow and div stay finite
        return lambda: BINARY[op](x, y)
    if op == "powu":
        x = x.abs() + 0.5
    return lambda: UNARY[op](x)


def time_ms(fn, runs: int, grad: bool = False) -> float:
    """The dataset's statistic: the mean of the fastest half of ``runs`` event-timed calls after 3 warm-ups
    (``grad``: with autograd on, for a call that runs a backward)."""
    with torch.set_grad_enabled(grad):
        for _ in range(3):
            fn()
        times = []
        for _ in range(runs):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
    fastest = sorted(times)[: max(1, runs // 2)]
    return sum(fastest) / len(fastest)


def _smi() -> dict:
    fields = "name,memory.total,clocks.max.sm,clocks.max.mem,power.limit,driver_version"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": repr(e)}
    return dict(zip(fields.split(","), (v.strip() for v in out.split(","))))


def _gemm_tflops(dtype, tf32: bool, n: int = 8192) -> float:
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a, b = torch.randn(n, n, device="cuda", dtype=dtype), torch.randn(n, n, device="cuda", dtype=dtype)
    ms = time_ms(lambda: a @ b, 10)
    torch.backends.cuda.matmul.allow_tf32 = False
    return 2 * n**3 / ms / 1e9


def device_facts() -> dict:
    free, total = torch.cuda.mem_get_info()
    p = torch.cuda.get_device_properties(0)
    facts = {"name": p.name, "total_memory": p.total_memory, "mem_get_info_total": total, "free_after_init": free,
             "sms": p.multi_processor_count, "major": p.major, "minor": p.minor,
             "l2_bytes": getattr(p, "L2_cache_size", None), "torch": torch.__version__, "cuda": torch.version.cuda,
             "cudnn": torch.backends.cudnn.version(), "smi": _smi()}
    src = torch.empty(2**29, device="cuda", dtype=torch.float32)  # 2 GiB
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), 10)
    facts["copy_gbs"] = 2 * src.numel() * 4 / ms / 1e6  # bytes read + written
    del src, dst
    facts["gemm_tflops"] = {"bf16": _gemm_tflops(torch.bfloat16, False), "tf32": _gemm_tflops(torch.float32, True),
                            "fp32": _gemm_tflops(torch.float32, False)}
    torch.cuda.empty_cache()
    return facts


def measure(out: str, gpu: str, budget: float, runs: int, bf16: bool) -> None:
    t0 = time.time()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with open(os.path.join(out, "device.json"), "w") as f:
        json.dump(device_facts(), f, indent=1)
    fp32 = open(os.path.join(out, "kernels.csv"), "w", newline="")
    half = open(os.path.join(out, "kernels_bf16.csv"), "w", newline="") if bf16 else None
    rows = csv.writer(fp32)
    rows.writerow(["gpu", "op", "shape", "latency_ms"])
    if half:
        csv.writer(half).writerow(["gpu", "op", "shape", "dtype", "latency_ms"])
    done, todo = 0, shapes()
    for op, shape in todo:
        if time.time() - t0 > budget:
            break
        text = "x".join(map(str, shape))
        try:
            rows.writerow([gpu, op, text, f"{time_ms(make(op, shape), runs):.6g}"])
            if half and op in ("bmm", "linear"):
                ms = time_ms(make(op, shape, torch.bfloat16), runs)
                csv.writer(half).writerow([gpu, op, text, "bfloat16", f"{ms:.6g}"])
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
        done += 1
    fp32.close()
    if half:
        half.close()
    print(f"kernels: {done} of {len(todo)} shapes in {time.time() - t0:.0f} s", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpu", default="H200", help="the name written in the gpu column")
    ap.add_argument("--budget", type=float, default=90.0, help="seconds for the kernels (after the ceilings)")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--bf16", action="store_true")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    measure(a.out, a.gpu, a.budget, a.runs, a.bf16)


if __name__ == "__main__":
    main()

"""Public single-kernel measurements (NeuSight's dataset) as this project's OpWork records.

    python benchmarks/public_kernels.py --summary          # kernels per GPU and op in the shared folder
    python benchmarks/public_kernels.py --write-sample     # refresh tests/data/public_kernels/kernels.csv.gz

Source: ``../shared/public-kernels/neusight`` (its README): the dataset of NeuSight ("Forecasting GPU
Performance for Deep Learning Training and Inference", ASPLOS 2025), folder
``scripts/asplos/data/dataset`` of its public repository, MIT licence (``LICENSE`` there and in
``tests/data/public_kernels/``).  One PyTorch op at a time, torch 2.1.0, CUDA 12.1, cuDNN 8.9, **fp32
with TF32 off** (cuBLAS and cuDNN), CUDA events around each call, the mean of the fastest runs after
warm-up, ``Latency`` in milliseconds.

Each row becomes a :class:`Kernel`: the GPU (this project's name, :data:`DEVICES`), the op, its shape
columns and the measured latency, and the :class:`estimator.timing.OpWork` the time model reads:

* ``bmm`` (B, M, N, K): ``torch.bmm`` of [B, M, K] @ [B, K, N];
* ``linear`` (B = 1, M, N, K): ``nn.Linear(K, N)`` on [M, K], an ``addmm`` with its bias;
* elementwise ops on a [B, H] tensor: ``add mul div pow`` of two tensors (read 2, write 1), the
  ``*u`` variants with a scalar and ``relu gelu tanh`` (read 1, write 1);
* ``ln``: ``native_layer_norm`` over H with weight and bias (writes mean and rstd per row);
* ``softmax``: ``_softmax`` over H;
* ``conv`` (B, C_in, C_out, kernel, input size, stride, padding): ``nn.Conv2d`` on square NCHW
  images, its output size ``(I + 2P - k) // S + 1``.

Rows measured more than once (the dataset's files overlap: ``test/vec`` and ``test/habitat`` repeat
``test/elem``, ``ln`` and ``softmax``; ``train/collect/<op>.csv.gz`` repeats the per-GPU files) are
kept once, at the median of their latencies.
"""

from __future__ import annotations

import argparse
import csv
import glob
import gzip
import io
import os
import statistics
import sys
from dataclasses import dataclass, replace

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from estimator import timing as T  # noqa: E402
from estimator.rules.conv import conv_flops  # noqa: E402

SHARED = os.path.join(os.path.dirname(ROOT), "shared", "public-kernels", "neusight")
SAMPLE = os.path.join(ROOT, "tests", "data", "public_kernels", "kernels.csv.gz")

# NeuSight's device names -> this project's (estimator/hardware.py)
DEVICES = {
    "NVIDIA H100 80GB HBM3": "H100-SXM", "NVIDIA A100 80GB PCIe": "A100-80GB-PCIe",
    "NVIDIA A100-PCIE-40GB": "A100-40GB-PCIe", "NVIDIA L4": "L4", "Tesla T4": "T4",
    "Tesla V100-PCIE-32GB": "V100-PCIe", "Tesla P100-PCIE-16GB": "P100-PCIe", "Tesla P4": "P4",
}
GEMM_OPS = ("bmm", "linear")
BINARY_OPS = ("add", "mul", "div", "pow")  # two [B, H] tensors
UNARY_OPS = ("addu", "mulu", "divu", "powu", "relu", "gelu", "tanh")  # one tensor (and a scalar)
SHAPE_COLUMNS = {
    "bmm": ("B", "M", "N", "K"), "linear": ("B", "M", "N", "K"), "ln": ("B", "H"), "softmax": ("B", "H"),
    "conv": ("B", "Input_Channel", "Output_Channel", "Kernel_Szie", "Input_Size", "Stride", "Padding"),
    **{op: ("B", "H") for op in BINARY_OPS + UNARY_OPS},
}
FP32 = 4  # bytes


@dataclass(frozen=True)
class Kernel:
    """One measured kernel: GPU, op, shape (the dataset's shape columns) and latency (seconds)."""

    gpu: str
    op: str
    shape: tuple[int, ...]
    latency_s: float
    dtype: str = "float32"  # bfloat16: a GEMM of benchmarks/record_kernels.py --bf16

    @property
    def work(self) -> T.OpWork:
        return work_of(self.op, self.shape) if self.dtype == "float32" else half_gemm(self.op, self.shape, self.dtype)

    @property
    def family(self) -> str:
        """gemm, conv, elementwise, norm (layer norm) or reduction (softmax)."""
        if self.op in GEMM_OPS:
            return "gemm"
        if self.op == "conv":
            return "conv"
        return {"ln": "norm", "softmax": "reduction"}.get(self.op, "elementwise")


def work_of(op: str, shape: tuple[int, ...]) -> T.OpWork:
    """The OpWork of one dataset row (see the module docstring for each op)."""
    if op == "bmm":
        b, m, n, k = shape
        # [B, M, K] @ [B, K, N]: 2*B*M*N*K FLOPs; operands read once, the result written once
        return T.OpWork("aten.bmm.default", "forward", T.MATMUL, flops=2 * b * m * n * k,
                        bytes_read=FP32 * b * (m * k + k * n), bytes_written=FP32 * b * m * n, dtype="float32",
                        batch=b, m=m, n=n, k=k, library="cublas")
    if op == "linear":
        _, m, n, k = shape
        # addmm(bias [N], x [M, K], W^T [K, N])
        return T.OpWork("aten.addmm.default", "forward", T.MATMUL, flops=2 * m * n * k,
                        bytes_read=FP32 * (m * k + k * n + n), bytes_written=FP32 * m * n, dtype="float32",
                        m=m, n=n, k=k, library="cublas")
    if op == "conv":
        return _conv_work(*shape)
    b, h = shape
    numel = b * h
    if op == "ln":
        # reads x and the affine weight and bias; writes y and per-row mean and rstd
        return T.OpWork("aten.native_layer_norm.default", "forward", T.MEMORY, bytes_read=FP32 * (numel + 2 * h),
                        bytes_written=FP32 * (numel + 2 * b), dtype="float32", memory_class="norm")
    if op == "softmax":
        return T.OpWork("aten._softmax.default", "forward", T.MEMORY, bytes_read=FP32 * numel,
                        bytes_written=FP32 * numel, dtype="float32", memory_class="reduction")
    inputs = 2 if op in BINARY_OPS else 1
    return T.OpWork(f"aten.{op.rstrip('u')}.Tensor", "forward", T.MEMORY, bytes_read=FP32 * numel * inputs,
                    bytes_written=FP32 * numel, dtype="float32")


def half_gemm(op: str, shape: tuple[int, ...], dtype: str) -> T.OpWork:
    """A ``bmm`` or ``linear`` row timed in a 2-byte dtype (tensor cores): the fp32 row's FLOPs, half its bytes,
    and the leading dimensions' alignment (K of the left operand and of the weight, N of the right operand and
    of the result), as the capture's GEMM records have it."""
    w = work_of(op, shape)
    return replace(w, dtype=dtype, bytes_read=w.bytes_read // 2, bytes_written=w.bytes_written // 2,
                   align=T.alignment_bytes([w.k, w.n], 2))


def _conv_work(b, c_in, c_out, k, size, stride, pad) -> T.OpWork:
    out = (size + 2 * pad - k) // stride + 1
    x, w, y = (b, c_in, size, size), (c_out, c_in, k, k), (b, c_out, out, out)
    groups, m, n, kk = T.conv_gemm_dims(x, w, y)
    nbytes = FP32 * (b * c_in * size * size + c_out * c_in * k * k + c_out)
    return T.OpWork("aten.convolution.default", "forward", T.CONV, flops=conv_flops(x, w, y),
                    bytes_read=nbytes, bytes_written=FP32 * b * c_out * out * out, dtype="float32", batch=groups,
                    m=m, n=n, k=kk, align=T.alignment_bytes([c_in, c_out], FP32), library="cudnn")


# -- reading ----------------------------------------------------------------------------------


def _rows(path: str):
    with gzip.open(path, "rt", newline="") as fh:
        yield from csv.DictReader(fh)


def load(root: str = SHARED) -> list[Kernel]:
    """Every kernel of the dataset under ``root`` (the shared folder), once each (see the module docstring)."""
    paths = sorted(glob.glob(os.path.join(root, "**", "*.csv.gz"), recursive=True))
    if not paths:
        raise FileNotFoundError(f"no NeuSight CSV files under {root}")
    seen: dict[tuple, list[float]] = {}
    for path in paths:
        for r in _rows(path):
            op, device = r["OPName"], r["Device"]
            if device not in DEVICES or op not in SHAPE_COLUMNS:
                continue
            shape = tuple(int(float(r[c])) for c in SHAPE_COLUMNS[op])
            seen.setdefault((DEVICES[device], op, shape), []).append(float(r["Latency"]) * 1e-3)
    return [Kernel(gpu, op, shape, statistics.median(ts)) for (gpu, op, shape), ts in sorted(seen.items())]


def load_sample(path: str = SAMPLE) -> list[Kernel]:
    """The project's sample (``tests/data/public_kernels/kernels.csv.gz``: gpu, op, shape, latency_ms), or a file
    of ``benchmarks/record_kernels.py`` (the same columns; its bf16 GEMMs with a ``dtype`` column)."""
    out = []
    for r in _rows(path):
        out.append(Kernel(r["gpu"], r["op"], tuple(int(x) for x in r["shape"].split("x")), float(r["latency_ms"]) * 1e-3,
                          r.get("dtype", "float32")))
    return out


def sample(kernels: list[Kernel], per_family: int = 120) -> list[Kernel]:
    """A small, spread-out subset: per GPU and family, ``per_family`` kernels evenly spaced in latency
    (so small launch-bound kernels and large ones are both there)."""
    groups: dict[tuple[str, str], list[Kernel]] = {}
    for k in kernels:
        groups.setdefault((k.gpu, k.family), []).append(k)
    out = []
    for key in sorted(groups):
        ks = sorted(groups[key], key=lambda k: (k.latency_s, k.op, k.shape))
        step = max(1, len(ks) / per_family)
        out += [ks[int(i * step)] for i in range(min(per_family, len(ks)))]
    return out


def write_sample(kernels: list[Kernel], path: str = SAMPLE) -> None:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["gpu", "op", "shape", "latency_ms"])
    for k in kernels:
        w.writerow([k.gpu, k.op, "x".join(map(str, k.shape)), f"{k.latency_s * 1e3:.6g}"])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with gzip.GzipFile(path, "wb", compresslevel=9, mtime=0) as fh:
        fh.write(buf.getvalue().encode())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=SHARED)
    ap.add_argument("--summary", action="store_true")
    ap.add_argument("--write-sample", action="store_true")
    a = ap.parse_args(argv)
    kernels = load(a.root)
    if a.write_sample:
        picked = sample(kernels)
        write_sample(picked)
        print(f"wrote {len(picked)} of {len(kernels)} kernels to {os.path.relpath(SAMPLE, ROOT)}")
        return
    counts: dict[tuple[str, str], int] = {}
    for k in kernels:
        counts[(k.gpu, k.family)] = counts.get((k.gpu, k.family), 0) + 1
    for gpu in sorted({g for g, _ in counts}):
        print(f"{gpu:16s}", ", ".join(f"{f} {counts[(g, f)]}" for g, f in sorted(counts) if g == gpu))


if __name__ == "__main__":
    main()

"""Float8 GEMMs (``torch._scaled_mm``, what torchao's float8 training runs): which variant, how fast.

torchao's ``Float8LinearConfig`` runs three GEMMs per layer: the output with fast accumulation
(``use_fast_accum=True``: partial sums kept in the tensor cores' reduced precision), the input and weight
gradients without it (``Float8GemmConfig`` defaults); the tensorwise recipe scales each operand by one fp32
scalar, the rowwise recipe by one per row of A ([M, 1]) and per column of B ([1, N]).  cuBLASLt (tensorwise) and
CUTLASS (rowwise) run them at different rates: measured on an H200 (``tests/data/h200/float8_gemms.csv.gz``,
``benchmarks/record_float8.py``), GEMMs of at least 2^33 multiply-adds ran 1.59x (tensorwise, fast
accumulation), 1.51x (tensorwise), 1.51x (rowwise, fast) and 1.34x (rowwise) faster than bf16 at the same
shape, where the datasheets' peaks differ 2x.

So a float8 GEMM is timed as any GEMM (``kernels.gpu_seconds``: size and alignment factors, the library floor,
its bytes) against the GPU's float8 peak, at the bf16 GEMMs' achieved fraction of the bf16 peak (the time
model's ``matmul.half``, fitted per GPU) times its variant's *relative* fraction: float8's fraction of the
float8 peak over bf16's fraction of the bf16 peak, both fitted on the same run's kernels through the same
measurement harness (``estimator/data/float8.json``, written by ``benchmarks/fit_float8.py``), so a bias of the
harness or of the card's bf16 constant cancels.  The H100 and H200 share the chip (the ratio carries); on
another GPU with float8 tensor cores (Ada, Blackwell) it is an assumption.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

DATA_FILE = "float8.json"
VARIANTS = ("tensorwise_fast", "tensorwise", "rowwise_fast", "rowwise")


def variant(scale_a_numel: int, use_fast_accum: bool) -> str:
    """The variant of a ``_scaled_mm`` from its first scale's size (1: tensorwise) and its accumulation."""
    return ("tensorwise" if scale_a_numel <= 1 else "rowwise") + ("_fast" if use_fast_accum else "")


@lru_cache(maxsize=None)
def table() -> dict:
    return json.loads(resources.files("estimator").joinpath("data", DATA_FILE).read_text())


def scaling_factor() -> float:
    """GPU time of a memory-bound op of an eager float8 layer (torchao's amax, scale and cast kernels around its
    GEMMs: ``abs``, ``max``, ``mul``, ``clamp``, the casts to float8) over what the bandwidth model gives it:
    ``benchmarks/fit_float8.py``'s median over the single float8 layers whose forward and backward are GPU-bound
    (``tests/data/h200/float8_layers.csv``: 1.59-1.79 over 10 shapes and recipes)."""
    return table().get("eager_scaling_factor", 1.0)


def relative(kind: str) -> float | None:
    """A float8 GEMM of variant ``kind``: its fraction of the float8 peak over the bf16 GEMMs' fraction of the
    bf16 peak; None when the variant is unknown (the caller takes the bf16 fraction as it is)."""
    return table()["relative"].get(kind)

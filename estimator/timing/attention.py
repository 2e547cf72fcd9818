"""Fused attention kernels in bf16 / fp16 (``scaled_dot_product_attention``'s cuDNN, flash and memory-efficient
backends): how fast, by backend, direction, head size and sequence length.

Measured on an H200 (``tests/data/h200/attention.csv``, ``benchmarks/record_attention.py``: 252 configurations,
sequences of 256-16,384, head sizes 64 and 128, causal and not), the achieved rate depends on the backend (at
8,192 tokens and head size 128: cuDNN about 630 TFLOP/s forward, PyTorch's flash kernel (FlashAttention-2)
about 345, the memory-efficient one about 170), on the head size (64 runs 20-35 % slower than 128) and on the
sequence (cuDNN's forward at 1,024 tokens runs at 0.6 of its rate at 8,192); a single efficiency per backend
(the model until 2026-11-28, fitted on steps of 256-4,096 tokens whose in-step timings include the host's
dispatch) put cuDNN's long-sequence attention at a third of its rate.

So a bf16 / fp16 attention kernel is timed as its FLOPs (``rules.attention``; causal kernels skip the blocks
above the diagonal, ``geometry.causal_fraction``) over the GPU's bf16 peak times

    eff = e_max * s / (s + s0) * d / (d + d0)        (s: query length, d: head size)

per backend and direction (``estimator/data/attention.json``, fitted by ``benchmarks/fit_attention.py``; the
measurement harness's dispatch floor is a separate term there, since a step's host model prices the dispatch, and
is anchored on one shape whose kernel was profiled inside an H100 step).  ``e_max`` is a fitted constant of this
form, not a ceiling: the product is capped at the peak.  The
H100 and H200 share the chip (same SMs and clocks: the fractions carry); on other GPUs they are an assumption.
fp32 attention (the memory-efficient kernel on the CUDA cores) keeps the time model's fitted efficiency.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

DATA_FILE = "attention.json"


@lru_cache(maxsize=None)
def table() -> dict:
    return json.loads(resources.files("estimator").joinpath("data", DATA_FILE).read_text())


def efficiency(backend: str, backward: bool, head_dim: int, seq: int) -> float | None:
    """The fraction of the bf16 peak a half-precision attention kernel achieves (see the module docstring);
    None for a backend that was not measured."""
    p = table()["fit"].get(f"{backend}/{'backward' if backward else 'forward'}")
    if p is None:
        return None
    return min(1.0, p["e_max"] * seq / (seq + p["s0"]) * head_dim / (head_dim + p["d0"]))

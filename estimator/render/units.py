"""Units and names every format shares: memory in binary units (KiB, MiB, GiB = 2**10, 2**20,
2**30 bytes), FLOPs in decimal units (one multiply-add is 2 FLOPs), a GPU's datasheet capacity
in decimal gigabytes; the labels and colours of the memory categories, optimizers and phases.
"""

from __future__ import annotations

SCHEMA_VERSION = 1  # of Report.to_dict(); see docs/json.md


def fmt_bytes(n: float) -> str:
    """Binary units: 1536 -> '1.50 KiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # pragma: no cover


def fmt_flops(n: float) -> str:
    """Decimal units: 2.5e9 -> '2.50 GFLOP'."""
    n = float(n)
    for unit in ("", "K", "M", "G", "T", "P", "E"):
        if abs(n) < 1000 or unit == "E":
            return f"{n:.0f} FLOP" if unit == "" else f"{n:.2f} {unit}FLOP"
        n /= 1000
    return f"{n:.2f} EFLOP"  # pragma: no cover


def fmt_count(n: int) -> str:
    return f"{n:,}"


def fmt_gb(n: int) -> str:
    """A GPU's datasheet capacity in decimal gigabytes: 80e9 -> '80 GB'."""
    return f"{n / 1e9:g} GB"


CATEGORY_LABEL = {"parameter": "parameters", "buffer": "buffers", "kv_cache": "KV cache", "input": "inputs",
                  "optimizer_state": "optimizer state", "gradient": "gradients", "saved": "saved activations",
                  "workspace": "CUDA library workspaces", "temporary": "temporaries",
                  "allocator": "allocator blocks beyond requests"}

# One palette for the HTML chart, the legend and the PNG (Tableau 10).
CATEGORY_COLORS = {
    "parameter": "#4e79a7", "buffer": "#a0cbe8", "kv_cache": "#76b7b2", "input": "#f28e2b", "optimizer_state": "#59a14f",
    "gradient": "#e15759", "saved": "#b07aa1", "temporary": "#edc948", "workspace": "#9c755f",
    "allocator": "#bab0ac",
}

OPTIMIZER_NAMES = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD", "sgd-momentum": "SGD", "adagrad": "Adagrad",
                   "rmsprop": "RMSprop", "adamax": "Adamax", "adadelta": "Adadelta", "nadam": "NAdam",
                   "radam": "RAdam"}
PHASE_NAMES = {"start": "start of the step", "forward": "forward pass", "loss": "loss",
               "backward": "backward pass", "optimizer": "optimizer step"}


def dtype_note(per_dtype: dict[str, int]) -> str:
    """' (bfloat16 1.00 MiB, float32 2.00 MiB)' when several dtypes share a figure."""
    if len(per_dtype) < 2:
        return ""
    return " (" + ", ".join(f"{d} {fmt_bytes(n)}" for d, n in sorted(per_dtype.items(), key=lambda kv: -kv[1])) + ")"

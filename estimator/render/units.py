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


def fmt_seconds(t: float) -> str:
    """A duration with three significant figures: 0.1421 -> '142 ms', 5400 -> '1.50 h'."""
    for unit, scale in (("us", 1e-6), ("ms", 1e-3), ("s", 1.0), ("min", 60.0), ("h", 3600.0), ("days", 86400.0)):
        if t < 999.5 * scale or unit == "days":
            v = t / scale
            return f"{v:.3g} {unit}" if v >= 1 or unit == "us" else f"{v:.2g} {unit}"
    return f"{t:.3g} s"  # pragma: no cover


def step_time_words(total: float, likely: tuple[float, float], note: str) -> str:
    """'142 ms, likely 128-156 ms; extrapolated: no kernel measurements for this GPU' (the range from
    estimator.timing.band: the model's held-out errors for this GPU and this step's op mix)."""
    lo, hi = likely
    if not hi:
        return fmt_seconds(total)
    (lo_v, lo_u), (hi_v, hi_u) = fmt_seconds(lo).split(" "), fmt_seconds(hi).split(" ")
    span = f"{lo_v}-{hi_v} {hi_u}" if lo_u == hi_u else f"{lo_v} {lo_u} to {hi_v} {hi_u}"
    return f"{fmt_seconds(total)}, likely {span}; {note}"


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

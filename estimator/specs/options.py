"""What the user typed, parsed: input shapes (``8x3x224x224`` or ``8x1024:int64``, made on the
``meta`` device so no memory is allocated), dtypes, ``--set key=value`` values; the options every
SPEC loader takes (:class:`SpecOptions`) and what it gives back (:class:`Loaded`); one-line
error helpers (close matches of a misspelt name).
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from ..errors import UserError



PREFIXES = ("hf", "torchvision", "timm")
DEFAULT_SEQ = 2048  # token models: at most this, or the model's position limit when smaller
FALLBACK_SEQ = 512  # token models whose configuration states no position limit


def default_seq(limit: int | None) -> int:
    """Tokens per sample when ``--seq`` is not given: the model's position limit up to DEFAULT_SEQ."""
    return min(limit, DEFAULT_SEQ) if limit else FALLBACK_SEQ


def usable_positions(table: torch.nn.Embedding) -> int:
    """The positions a table of position embeddings gives a sequence: every row, or the rows after its padding
    row where positions are numbered from ``padding_idx + 1`` (RoBERTa and its kin: 514 rows, 512 tokens)."""
    pad = table.padding_idx
    return table.num_embeddings - pad - 1 if pad is not None and pad >= 0 else table.num_embeddings

DEFAULT_IMAGE_SIZE = 224

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float": torch.float32, "fp32": torch.float32, "f32": torch.float32,
    "float64": torch.float64, "double": torch.float64, "fp64": torch.float64,
    "float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "int64": torch.int64, "long": torch.int64, "int32": torch.int32, "int": torch.int32,
    "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name.strip().lower()]
    except KeyError:
        raise UserError(f"unknown dtype {name!r}; use one of {', '.join(sorted(DTYPES))}") from None


def parse_shape(text: str) -> torch.Tensor:
    """``"8x3x224x224"`` or ``"8x1024:int64"`` -> a meta tensor of that shape and dtype."""
    shape_text, _, dtype_text = text.partition(":")
    dtype = parse_dtype(dtype_text) if dtype_text else torch.float32
    parts = shape_text.strip().lower().replace(",", "x").split("x")
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise UserError(f"bad shape {text!r}: write dimensions joined by 'x', e.g. 8x3x224x224 or 8x1024:int64") from None
    if any(s < 0 for s in shape) or not shape_text.strip():
        raise UserError(f"bad shape {text!r}: dimensions must be non-negative integers, e.g. 8x3x224x224")
    return torch.empty(shape, dtype=dtype, device="meta")


def parse_value(text: str) -> Any:
    """A ``--set`` value: int, float, true/false, none/null, a JSON list or object, else the string."""
    s = text.strip()
    low = s.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for conv in (int, float):
        try:
            return conv(s)
        except ValueError:
            pass
    if s[:1] in "[{":
        try:
            return json.loads(s)
        except ValueError:
            pass
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    return s


def parse_overrides(items: list[str] | Mapping[str, Any] | None) -> dict[str, Any]:
    """``["num_hidden_layers=2", "vocab_size=32000"]`` -> ``{"num_hidden_layers": 2, ...}``."""
    if not items:
        return {}
    if isinstance(items, Mapping):
        return dict(items)
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(f"bad --set {item!r}: write key=value, e.g. --set num_hidden_layers=2")
        out[key] = parse_value(value)
    check_layer_counts(out)
    return out


_LAYER_COUNT = re.compile(r"(num_|n_)?(hidden_|encoder_|decoder_|transformer_)?layers?")


def check_layer_counts(overrides: Mapping[str, Any]) -> None:
    """Refuse a layer count below 1 (``--set num_hidden_layers=-1``, ``n_layer=0``; dotted keys of
    sub-configurations too): transformers builds a model with no layers from it, and the estimate would
    describe a model that does not exist."""
    for key, value in overrides.items():
        leaf = str(key).rpartition(".")[2]
        if not (_LAYER_COUNT.fullmatch(leaf) or leaf.endswith("_layers")):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"--set {key}={value!r}: a layer count must be an integer >= 1, e.g. --set {key}=2")


def close_matches(word: str, candidates: list[str] | set[str], n: int = 5) -> str:
    """``"; close matches: a, b"`` (or ``""``) for an error message."""
    cands = sorted(set(candidates))
    hits = difflib.get_close_matches(word, cands, n=n, cutoff=0.6)
    if not hits:
        low = word.lower()
        hits = [c for c in cands if low and (low in c.lower() or c.lower() in low)][:n]
    return f"; close matches: {', '.join(hits)}" if hits else ""


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def short_message(exc: BaseException) -> str:
    """The message of ``exc`` on one line (multi-line validation messages joined)."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    return " ".join(lines[:3]) if lines else type(exc).__name__


# -- what a SPEC gives ----------------------------------------------------------------------


@dataclass
class Loaded:
    """A model and its example inputs, with what the estimate needs to know about them."""

    model: torch.nn.Module
    inputs: Any
    loss_fn: Callable[[Any], torch.Tensor] | None = None
    name: str = ""  # the SPEC, for the report
    description: str = ""  # the class and the inputs, e.g. "LlamaForCausalLM; input_ids 1x2048, labels"
    config: Any = None  # the transformers configuration for hf: specs

    @property
    def title(self) -> str:
        return f"{self.name} ({self.description})" if self.description else self.name


@dataclass
class SpecOptions:
    input_shapes: list[str] = field(default_factory=list)
    batch: int | None = None
    seq: int | None = None
    image_size: int | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    empty: bool = True  # build user factories without weights (library models always are)
    labels: bool = True  # a training batch; False: the inputs of inference and generation, without labels
    new_tokens: int = 0  # generation: tokens generated after the prompt (``seq``), which need positions too


def prefix_of(spec: str) -> str | None:
    head, sep, _ = spec.partition(":")
    return head if sep and head in PREFIXES else None

"""Turn what the user typed into a model and inputs.

SPEC forms:

* ``path/to/file.py:callable`` or ``package.module:callable``: the callable
  (called with no arguments) returns an ``nn.Module`` (inputs then come from
  ``--input``) or a ``(module, inputs)`` pair.

Input shapes: ``8x3x224x224`` (float32) or ``8x1024:int64``; tensors are made
on the ``meta`` device, so no memory is allocated for them.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

import torch

from .errors import UserError

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


def _load_callable(spec: str) -> Any:
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise UserError(f"bad SPEC {spec!r}: write path/to/file.py:callable or package.module:callable")
    if target.endswith(".py") or os.sep in target or "/" in target:
        path = os.path.abspath(target)
        if not os.path.isfile(path):
            raise UserError(f"no such file: {target} (SPEC is path/to/file.py:callable)")
        name = f"_estimator_spec_{os.path.splitext(os.path.basename(path))[0]}"
        mod_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.path.insert(0, os.path.dirname(path))
        try:
            mod_spec.loader.exec_module(module)
        except Exception as exc:
            raise UserError(f"importing {target} failed: {type(exc).__name__}: {_first_line(exc)}") from exc
        finally:
            sys.path.remove(os.path.dirname(path))
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise UserError(f"cannot import module {target!r}: {_first_line(exc)}") from exc
        except Exception as exc:
            raise UserError(f"importing {target} failed: {type(exc).__name__}: {_first_line(exc)}") from exc
    fn = getattr(module, attr, None)
    if fn is None:
        names = [n for n in dir(module) if callable(getattr(module, n)) and not n.startswith("_")]
        raise UserError(f"{target} has no callable {attr!r}; it has: {', '.join(names[:12]) or 'none'}")
    if not callable(fn):
        raise UserError(f"{target}:{attr} is not callable")
    return fn


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def load(spec: str, input_shapes: list[str] | None = None) -> tuple[torch.nn.Module, Any]:
    """Build ``(model, inputs)`` from a SPEC and optional ``--input`` shapes."""
    fn = _load_callable(spec)
    try:
        built = fn()
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"{spec}() failed: {type(exc).__name__}: {_first_line(exc)}") from exc
    inputs: Any = None
    if isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], torch.nn.Module):
        model, inputs = built
    elif isinstance(built, torch.nn.Module):
        model = built
    else:
        raise UserError(f"{spec} must return an nn.Module or a (module, inputs) pair, not {type(built).__name__}")
    if input_shapes:
        tensors = tuple(parse_shape(s) for s in input_shapes)
        inputs = tensors[0] if len(tensors) == 1 else tensors
    if inputs is None:
        raise UserError(f"{spec} returns a model without inputs: pass --input SHAPE (e.g. --input 8x3x224x224)")
    return model, inputs

"""The ops of the CUDA reference steps (``tests/data/cuda_reference/memory``) as the transient rules
of :mod:`estimator.workspace` see them, and the temporary memory each measured.

A reference record lists an op's tensor inputs and outputs as ``[shape, dtype, stride(, bytes)]``
(in schema order, absent optional tensors left out, tensor lists flattened) and the allocator's
counters around it; ``measured`` is ``peak - max(before, after)``: what the op allocated and freed
before returning.  :func:`op_call` rebuilds the :class:`OpCall` and :class:`Layout` a rule gets for a
captured node; the non-tensor arguments, which the records leave out, are inferred from the shapes,
per op (see each ``_args_*``).
"""

from __future__ import annotations

import glob
import gzip
import json
import os
from functools import lru_cache
from typing import Any, Iterator

import torch

from estimator.rules.registry import OpCall, TensorSpec
from estimator.workspace import Layout

HERE = os.path.dirname(os.path.abspath(__file__))
MEMORY = os.path.join(HERE, "data", "cuda_reference", "memory")

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
           "int64": torch.int64, "int32": torch.int32, "bool": torch.bool, "uint8": torch.uint8, "int8": torch.int8}


@lru_cache(maxsize=None)
def load(name: str) -> dict:
    with gzip.open(os.path.join(MEMORY, name + ".json.gz"), "rt") as f:
        return json.load(f)


def names() -> list[str]:
    return sorted(os.path.basename(p)[: -len(".json.gz")] for p in glob.glob(os.path.join(MEMORY, "*.json.gz")))


def measured(rec: dict) -> int:
    """Bytes the op allocated and freed before returning."""
    return rec["peak"] - max(rec["before"], rec["after"])


def records(op: str | None = None) -> Iterator[tuple[str, int, dict]]:
    """(case file, index, record) of every reference op (named ``op``, e.g. ``aten.sum.dim_IntList``)."""
    for name in names():
        for i, rec in enumerate(load(name)["ops"]):
            if op is None or rec["op"] == op:
                yield name, i, rec


def _spec(t: list) -> TensorSpec:
    return TensorSpec(tuple(t[0]), _DTYPES[t[1]])


def _strides(t: list) -> tuple[int, ...]:
    return tuple(t[2])


def _reduced(x: list, y: list) -> tuple[list[int], bool]:
    """The dims a reduction took from ``x`` to give ``y``, and keepdim: with keepdim the dims that went
    to 1; without, the dims ``y`` lacks (matched left to right).  A size-1 dim reduced or kept is the
    same memory either way."""
    xs, ys = x[0], y[0]
    if len(xs) == len(ys):
        return [d for d, (a, b) in enumerate(zip(xs, ys)) if a != b], True
    dims, j = [], 0
    for d, size in enumerate(xs):
        if j < len(ys) and ys[j] == size:
            j += 1
        else:
            dims.append(d)
    return dims, False


def _conv_geometry(x: list, w: list, y: list) -> dict[str, Any]:
    """stride, padding, dilation and groups of a 2-D convolution from its shapes: groups = C_in / the
    weight's C_in; stride = round(H / H_out); padding the usual (k - 1) // 2 checked against the output
    size (else 0)."""
    n, c, h, wd = x[0]
    k, cg, r, s = w[0]
    _, _, p, q = y[0]
    groups = c // cg
    stride = [max(1, round(h / p)), max(1, round(wd / q))]
    padding = []
    for size, kern, out, st in ((h, r, p, stride[0]), (wd, s, q, stride[1])):
        pad = (kern - 1) // 2
        padding.append(pad if (size + 2 * pad - kern) // st + 1 == out else 0)
    return {"stride": stride, "padding": padding, "dilation": [1, 1], "transposed": False,
            "output_padding": [0, 0], "groups": groups}


def _args_reduction(rec: dict, args: dict) -> None:
    dims, keep = _reduced(rec["in"][0], rec["out"][0])
    args["dim"] = dims
    args["keepdim"] = keep
    if rec["out"][0][1] != rec["in"][0][1]:
        args["dtype"] = _DTYPES[rec["out"][0][1]]


def _args_softmax(rec: dict, args: dict) -> None:
    args["dim"] = -1  # every reference softmax is over the last dim (attention rows, router logits)


def _args_embedding_backward(rec: dict, args: dict) -> None:
    args["num_weights"] = rec["out"][0][0][0]
    args["padding_idx"] = -1
    args["scale_grad_by_freq"] = False


def _args_cumsum(rec: dict, args: dict) -> None:
    args["dim"] = len(rec["in"][0][0]) - 1  # position ids: a cumsum along the sequence (last) dim
    args["dtype"] = _DTYPES[rec["out"][0][1]]


def _args_sort(rec: dict, args: dict) -> None:
    args["dim"] = -1
    args["descending"] = False


# op -> (tensor argument names in record order, inferring function)
_OPS: dict[str, tuple[tuple[str, ...], Any]] = {
    "aten.sum.dim_IntList": (("self",), _args_reduction),
    "aten.mean.dim": (("self",), _args_reduction),
    "aten.all.default": (("self",), None),
    "aten._softmax_backward_data.default": (("grad_output", "output"), _args_softmax),
    "aten._log_softmax_backward_data.default": (("grad_output", "output"), _args_softmax),
    "aten._softmax.default": (("self",), _args_softmax),
    "aten._log_softmax.default": (("self",), _args_softmax),
    "aten._safe_softmax.default": (("self",), _args_softmax),
    "aten.embedding.default": (("weight", "indices"), None),
    "aten.embedding_dense_backward.default": (("grad_output", "indices"), _args_embedding_backward),
    "aten.cumsum.default": (("self",), _args_cumsum),
    "aten.sort.default": (("self",), _args_sort),
    "aten.index_put.default": (("self", "indices*", "values"), lambda rec, args: args.update(accumulate=True)),
    "aten.index_put_.default": (("self", "indices*", "values"), lambda rec, args: args.update(accumulate=False)),
    "aten.convolution.default": (("input", "weight", "bias"), None),
    "aten.convolution_backward.default": (("grad_output", "input", "weight"), None),
}


def supported(op: str) -> bool:
    return op in _OPS


def op_call(rec: dict) -> tuple[OpCall, Layout]:
    """The :class:`OpCall` and :class:`Layout` a transient rule sees for reference record ``rec``."""
    names, infer = _OPS[rec["op"]]
    packet, overload = rec["op"].removeprefix("aten.").rsplit(".", 1)
    op = getattr(getattr(torch.ops.aten, packet), overload)
    ins = rec["in"]
    args: dict[str, Any] = {}
    strides: dict[str, Any] = {}
    if "indices*" in names:  # self, the index tensors, values
        args["self"], strides["self"] = _spec(ins[0]), _strides(ins[0])
        args["indices"] = tuple(_spec(t) for t in ins[1:-1])
        strides["indices"] = tuple(_strides(t) for t in ins[1:-1])
        args["values"], strides["values"] = _spec(ins[-1]), _strides(ins[-1])
    else:
        for name, t in zip(names, ins):
            args[name], strides[name] = _spec(t), _strides(t)
    outputs = tuple(_spec(t) for t in rec["out"])
    if rec["op"] == "aten.convolution.default":
        args.update(_conv_geometry(ins[0], ins[1], rec["out"][0]))
    elif rec["op"] == "aten.convolution_backward.default":
        args.update(_conv_geometry(ins[1], ins[2], ins[0]))
        # outputs present: grad_input only when the input needs it (the stem's does not)
        args["output_mask"] = [len(rec["out"]) >= 2, True, len(rec["out"]) >= 3]
        outputs = ((None,) if len(rec["out"]) == 1 else ()) + outputs
        args["bias_sizes"] = None
    if infer is not None:
        infer(rec, args)
    return OpCall(op, args, outputs), Layout(strides, tuple(_strides(t) for t in rec["out"]))

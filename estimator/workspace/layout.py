"""What every kernel-temporary rule reads and how rules are registered: an op's tensor strides
(:class:`Layout`, which :class:`~estimator.rules.registry.OpCall` leaves out), the registry
(:func:`transient`: ``fn(call, target, layout) -> bytes`` per op, as ``rules/`` registers
costs), and the byte helpers the rules share.

Every temporary is a request to the caching allocator, which hands out 512-byte multiples
(``round_size``); a rule's figure is the sum of the rounded requests alive together at the op's
highest point.  The measured figures it reproduces are ``peak - max(before, after)`` of the
reference H100 steps (tests/data/cuda_reference); where a measured figure is higher by at most
1 MiB, that is the allocator handing out a cached or freshly rounded block whose remainder
(<= kSmallSize) it does not split (``should_split``), a property of the allocator's state, not of
the op.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, NamedTuple

import torch

from ..rules.registry import OpCall, TensorSpec, bind
from ..graph import OpNode, map_args
from ..target import CudaTarget


aten = torch.ops.aten
MiB = 1 << 20


# -- per-op temporaries ------------------------------------------------------------------------------

class Layout(NamedTuple):
    """The strides (in elements) of an op's tensors, which :class:`OpCall` leaves out: ``args`` by schema
    name (a stride tuple per tensor, a tuple of them for a tensor list, None for anything else),
    ``outputs`` one per tensor output, in order.  Rules that depend on memory layout (a reduction's
    launch configuration, a kernel's ``.contiguous()`` copies) read it; :func:`layout_of` builds it
    from a captured node's ``meta["stride"]``."""

    args: Mapping[str, Any]
    outputs: tuple[tuple[int, ...] | None, ...] = ()

    def stride(self, name: str, spec: TensorSpec | None = None) -> tuple[int, ...]:
        """The strides of argument ``name``; contiguous strides of ``spec`` where none were recorded."""
        value = self.args.get(name)
        if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
            return value
        return contiguous_strides(spec.shape) if spec is not None else ()


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of ``shape``."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def strides_of(node: OpNode) -> tuple[int, ...] | None:
    strides = node.meta.get("stride") or ()
    return tuple(strides[0]) if len(strides) == 1 else None


def layout_of(node: OpNode) -> Layout:
    """The :class:`Layout` of a captured node: its inputs' and outputs' recorded strides."""
    args, kwargs = map_args(node, strides_of, lambda _: None)
    outputs = tuple(tuple(s) for s in node.meta.get("stride") or ())
    return Layout(bind(node.target, args, kwargs), outputs)


TransientRule = Callable[[OpCall, CudaTarget, Layout], int]
TRANSIENT: dict[Any, TransientRule] = {}


def transient(*ops: Any) -> Callable[[TransientRule], TransientRule]:
    """Register ``fn(call, target, layout) -> bytes`` as the temporary memory ``ops`` take while they run
    (``layout``: the strides of the op's tensors, :class:`Layout`)."""

    def decorator(fn: TransientRule) -> TransientRule:
        for op in ops:
            TRANSIENT[getattr(op, "overloadpacket", op)] = fn
        return fn

    return decorator


def tensor_bytes(spec: TensorSpec | None, dtype: torch.dtype | None = None) -> int:
    if spec is None:
        return 0
    return spec.numel * (dtype or spec.dtype).itemsize


# -- kernel temporaries: shared helpers -----------------------------------------------------------------
#
# Every temporary below is a request to the caching allocator, which hands out 512-byte multiples
# (``round_size``); a rule's figure is the sum of the rounded requests alive together at the op's
# highest point.  The measured figures it reproduces are ``peak - max(before, after)`` of the reference
# H100 steps (tests/data/cuda_reference); where a measured figure is higher by at most 1 MiB, that is
# the allocator handing out a cached or freshly rounded block whose remainder (<= kSmallSize) it does
# not split (``should_split``), a property of the allocator's state, not of the op.

BLOCK = 512


def rounded(nbytes: int) -> int:
    """A request as the caching allocator rounds it (512-byte blocks); 0 stays 0."""
    return -(-int(nbytes) // BLOCK) * BLOCK if nbytes > 0 else 0


def numel_of(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def is_contiguous(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """``Tensor.is_contiguous()``: row-major strides, size-1 dimensions ignored."""
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size == 0:
            return True
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def copy_unless_contiguous(spec: TensorSpec | None, strides: tuple[int, ...]) -> int:
    """Bytes of ``t.contiguous()``: a dense copy unless ``t`` already is contiguous."""
    if spec is None or not strides or is_contiguous(spec.shape, strides):
        return 0
    return rounded(spec.nbytes)


def viewable_flat(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """``t.reshape(-1)`` is a view: the non-singleton dims are row-major with respect to each other."""
    dims = [(size, stride) for size, stride in zip(shape, strides) if size != 1]
    return all(dims[i][1] == dims[i + 1][1] * dims[i + 1][0] for i in range(len(dims) - 1))


def dtype_of(value: Any, default: torch.dtype) -> torch.dtype:
    return value if isinstance(value, torch.dtype) else default

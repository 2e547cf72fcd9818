"""The index check a real kernel makes, made on fake tensors where the indices' values are known.

A fake tensor has no values, so FakeTensorMode cannot check that an index is in range; a real step raises
there.  Token ids and the position ids a model derives from them are real during the capture (their values
are known: :func:`estimator.capture.fake._runs_on_known_values`), so an embedding, ``gather``,
``index_select`` or advanced index of a fake tensor by them can be checked as ATen checks it, and an input
that a real step cannot take (RoBERTa's positions past its table: ``padding_idx + 1 + seq`` of
``max_position_embeddings``) is refused as the real step would refuse it, instead of being estimated.  Not
under a process group (the planner's engines): its fake collectives leave real outputs unwritten.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..rules.registry import bind

aten = torch.ops.aten

# op -> (the indexed tensor's argument, the index's argument, the dimension's argument or a fixed dimension,
# whether negative indices count from the end as Python's do)
_INDEXED = {
    aten.embedding.default: ("weight", "indices", 0, False),
    aten.index_select.default: ("self", "index", "dim", False),
    aten.gather.default: ("self", "index", "dim", False),
}


def _known(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and type(t) is torch.Tensor and not t.is_meta \
        and not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool) and t.numel() > 0


def check_known_indices(func: Any, args: tuple, kwargs: dict) -> None:
    """Raise the real kernel's ``IndexError`` where ``func`` indexes a fake tensor with real indices that are
    out of its range; otherwise nothing (unknown indices, a real indexed tensor: the kernel checks)."""
    if func is not aten.index.Tensor and func not in _INDEXED:
        return
    if _collectives_leave_values_undefined():
        return
    if func is aten.index.Tensor:
        _check_advanced(args, kwargs)
        return
    spec = _INDEXED[func]
    source_name, index_name, dim_arg, negative = spec
    bound = bind(func, args, kwargs)
    source, index = bound.get(source_name), bound.get(index_name)
    if type(source) is not FakeTensor or not _known(index):
        return
    dim = bound.get(dim_arg, 0) if isinstance(dim_arg, str) else dim_arg
    _check(index, dim, source, negative)


def _collectives_leave_values_undefined() -> bool:
    """Whether a process group is up: the planner's fake one returns every collective at once, its outputs
    allocated and never written (a real tensor of undefined values: an all-gathered index under tensor
    parallelism), so no real tensor's values can be trusted there."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _check_advanced(args: tuple, kwargs: dict) -> None:
    bound = bind(aten.index.Tensor, args, kwargs)
    source, indices = bound.get("self"), bound.get("indices") or ()
    if type(source) is not FakeTensor:
        return
    for dim, index in enumerate(indices):
        if _known(index):
            _check(index, dim, source, True)


def _check(index: torch.Tensor, dim: int, source: torch.Tensor, negative: bool) -> None:
    size = source.shape[dim] if source.dim() else 1
    low, high = int(index.min()), int(index.max())
    if high >= size:
        raise IndexError(f"index {high} is out of bounds for dimension {dim} with size {size}")
    if low < (-size if negative else 0):
        raise IndexError(f"index {low} is out of bounds for dimension {dim} with size {size}")


# Ops whose kernels require the written values in the destination's dtype (no cast), which their fake kernels do not
# check: a step traced through them sized a run that fails (transformers' StaticCache under CPU autocast: keys in
# fp32 after the rotary step, values from v_proj in bf16, "index_copy_(): self and source expected to have the same
# dtype"): (the value argument, the real kernel's message).
_SAME_DTYPE = {
    aten.index_copy_.default: ("source", "index_copy_(): self and source expected to have the same dtype"),
    aten.index_copy.default: ("source", "index_copy(): self and source expected to have the same dtype"),
    aten.index_put_.default: ("values", "Index put requires the source and destination dtypes match"),
    aten.index_put.default: ("values", "Index put requires the source and destination dtypes match"),
    # (structured kernels whose C++ meta checks, as ATen's CPU and CUDA kernels do, where the Python meta does not:
    # a mixture of experts summing fp32 expert outputs into a bf16 buffer under autocast fails for real)
    **{op: ("source", "index_add_(): self and source must have the same scalar type")
       for op in (aten.index_add.default, aten.index_add_.default)},
    **{op: ("source", "index_reduce_(): self and source must have the same scalar type")
       for op in (aten.index_reduce.default, aten.index_reduce_.default)},
    **{op: ("source", "put_(): self and source expected to have the same dtype") for op in (aten.put.default,
                                                                                             aten.put_.default)},
}


# Matrix products whose two matrices must share a dtype in every real kernel (CPU and cuBLAS: "expected m1 and m2
# to have the same dtype", "mat1 and mat2 must have the same dtype"), which the meta kernels do not check: a forward
# multiplying bf16 activations by an fp32 weight, or a custom autograd Function's backward run outside autocast,
# was estimated where the real step fails. (The two matrices' arguments.)
_SAME_DTYPE_OPERANDS = {
    **{op: ("self", "mat2") for op in (aten.mm.default, aten.bmm.default)},
    # (addmm's bias too: "self and mat2 must have the same dtype, but got Float and BFloat16")
    **{op: ("mat1", "mat2", "self") for op in (aten.addmm.default, aten.addmm_.default)},
    **{op: ("batch1", "batch2") for op in (aten.baddbmm.default, aten.baddbmm_.default, aten.addbmm.default,
                                           aten.addbmm_.default)},
    aten.mv.default: ("self", "vec"),  # ("addmv input tensors must have the same dtype"; addr promotes: not here)
    # ("Input type (CPUBFloat16Type) and weight type (torch.FloatTensor) should be the same": the meta kernel
    # checks it only with a bias)
    aten.convolution.default: ("input", "weight"),
    # (TensorIterator's common dtype in the CPU and CUDA kernels: "Found dtype Float but expected BFloat16"; a bf16
    # model's loss against an fp32 target or class weight, a bf16 image sampled on an fp32 grid; optional ones
    # checked where given)
    aten.binary_cross_entropy.default: ("self", "target", "weight"),
    **{op: ("self", "weight") for op in (aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)},
    **{op: ("input", "grid") for op in (aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)},
    aten.linalg_cross.default: ("self", "other"),
    aten.complex.default: ("real", "imag"),
}


def _plain_tensor(t: Any) -> bool:
    return isinstance(t, FakeTensor) or type(t) in (torch.Tensor, torch.nn.Parameter)


_NLL = (aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
_TARGET_AT = {aten.nll_loss_forward.default: 1, aten.nll_loss_backward.default: 2}  # (the target's position)


def long_targets(func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``(args, kwargs)`` with a uint8 target of ``nll_loss_forward`` (and its backward) as int64: ATen's kernels
    take Long or Byte targets, the decompositions that are their fake kernels index with ``gather`` and ``scatter``,
    which refuse uint8 (a step that runs was refused). The outputs' shapes are the same."""
    at = _TARGET_AT.get(func)
    if at is not None and len(args) > at and isinstance(args[at], torch.Tensor) and args[at].dtype == torch.uint8:
        return (*args[:at], args[at].long(), *args[at + 1:]), kwargs
    return args, kwargs


def check_same_dtype(func: Any, args: tuple, kwargs: dict) -> None:
    """Raise the real kernel's ``RuntimeError`` where ``func`` writes values of another dtype than its
    destination's (see :data:`_SAME_DTYPE`), or multiplies matrices of two dtypes (:data:`_SAME_DTYPE_OPERANDS`)."""
    if func in _NLL:  # ("expected target dtype to be Long or Byte": int32 ids as targets fail on CPU and CUDA)
        target = bind(func, args, kwargs).get("target")
        if isinstance(target, torch.Tensor) and target.dtype not in (torch.long, torch.uint8):
            raise RuntimeError(f"{func.__name__}: expected target dtype to be Long or Byte, but got "
                               f"{str(target.dtype).removeprefix('torch.')}")
    operands = _SAME_DTYPE_OPERANDS.get(func)
    if operands is not None:
        bound = bind(func, args, kwargs)
        given = {name: bound[name] for name in operands if bound.get(name) is not None}
        # (a tensor subclass with its own dispatch, torchao's float8 wrapper, runs its own kernel: not checked)
        if not all(_plain_tensor(t) for t in given.values()):
            return
        dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in given.values()})
        if len(dtypes) > 1:
            raise RuntimeError(f"{func.__name__}: {', '.join(given)} must have the same dtype, but got "
                               f"{' and '.join(dtypes)}")
        return
    spec = _SAME_DTYPE.get(func)
    if spec is None:
        return
    bound = bind(func, args, kwargs)
    dest, value = bound.get("self"), bound.get(spec[0])
    if isinstance(dest, torch.Tensor) and isinstance(value, torch.Tensor) and dest.dtype != value.dtype:
        raise RuntimeError(f"{spec[1]}, but got (self) {str(dest.dtype).removeprefix('torch.')} and (source) "
                           f"{str(value.dtype).removeprefix('torch.')}")

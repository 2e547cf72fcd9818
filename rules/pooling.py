"""Pooling, resampling (upsample) and padding, forward and backward (OTHER).

* max pooling: one comparison per (output, window element); backward scatters
  each grad element to its argmax: 1 add per grad_output element.
* average pooling: window adds + 1 divide per output; backward: 1 divide per
  grad element + 1 add per window element it is spread over.
* adaptive pooling: windows are ``[floor(i*In/Out), ceil((i+1)*In/Out))`` per
  dim; their total size is computed exactly from the shapes.
* interpolation: a weighted sum of T taps per output element, ``2T - 1`` FLOPs
  (T = 2 linear, 4 bilinear, 8 trilinear, 16 bicubic; computing the weights is
  not counted); backward ``2T`` per grad element (multiply, accumulate).
  Nearest-neighbour upsampling is a copy (ZERO); its backward sums grads.
* padding: a copy (ZERO); reflection/replication backward adds the reflected
  grads: 1 add per grad_output element.
"""

from __future__ import annotations

from math import prod

import torch

from .registry import OTHER, aten_ops, lookup, register, register_late, register_zero

# -- math helpers (pure functions of shapes) ---------------------------------


def window_size(kernel_size, dims: int) -> int:
    """Elements in one pooling window (``kernel_size`` of one int means a square/cubic window)."""
    k = list(kernel_size)
    if len(k) == 1:
        k = k * dims
    return prod(k)


def pool_flops(out_numel: int, window: int, finish: int = 0) -> int:
    """``window`` operations per output (compares or adds), plus ``finish`` per output (the divide)."""
    # each output element reduces its window: window ops + finishing ops
    return out_numel * (window + finish)


def adaptive_window_total(in_size: int, out_size: int) -> int:
    """Total length of the ``out_size`` adaptive windows over ``in_size`` (overlaps counted)."""
    # window i = [floor(i*In/Out), ceil((i+1)*In/Out))
    return sum(-((-(i + 1) * in_size) // out_size) - (i * in_size) // out_size for i in range(out_size))


def adaptive_pool_reads(in_shape, out_spatial) -> int:
    """Input elements read by an adaptive pooling (each window element once per window)."""
    dims = len(out_spatial)
    leading = prod(in_shape[:-dims])
    return leading * prod(adaptive_window_total(i, o) for i, o in zip(in_shape[-dims:], out_spatial))


def interpolation_flops(out_numel: int, taps: int) -> int:
    """Weighted sum of ``taps`` inputs per output: ``taps`` multiplies and ``taps - 1`` adds."""
    return out_numel * (2 * taps - 1)


def interpolation_backward_flops(grad_numel: int, taps: int) -> int:
    """Each grad element is multiplied by ``taps`` weights and added into ``taps`` inputs."""
    return grad_numel * 2 * taps


def _spatial_dims(op) -> int:
    """Spatial dims of a pooling op, from its name (``..3d`` -> 3, ``..1d`` -> 1, else 2)."""
    name = getattr(op, "__name__", str(op))
    return 3 if "3d" in name else 1 if "1d" in name else 2


# -- max pooling ----------------------------------------------------------------


def _max_pool(dims: int):
    def rule(call):
        return pool_flops(call.out.numel, window_size(call["kernel_size"], dims))

    rule.__doc__ = f"out.numel * prod(kernel_size): one comparison per window element ({dims}d)."
    return rule


for _dims, _names in {
    1: ("max_pool1d", "max_pool1d_with_indices"),
    2: ("max_pool2d_with_indices", "max_pool2d", "mkldnn_max_pool2d", "fractional_max_pool2d"),
    3: ("max_pool3d_with_indices", "max_pool3d", "mkldnn_max_pool3d", "fractional_max_pool3d"),
}.items():
    for _op in aten_ops(*_names):
        register(_op, kind=OTHER)(_max_pool(_dims))


@register(
    *aten_ops("max_pool2d_with_indices_backward", "max_pool3d_with_indices_backward", "max_pool2d_backward",
              "adaptive_max_pool2d_backward", "adaptive_max_pool3d_backward",
              "fractional_max_pool2d_backward", "fractional_max_pool3d_backward",
              "mkldnn_max_pool2d_backward", "mkldnn_max_pool3d_backward"),
    kind=OTHER,
)
def max_pool_backward(call):
    """grad_output.numel: each grad element is added to its argmax input."""
    return call["grad_output"].numel


# -- average pooling ------------------------------------------------------------


def _avg_pool(dims: int):
    def rule(call):
        return pool_flops(call.out.numel, window_size(call["kernel_size"], dims), finish=1)

    rule.__doc__ = f"out.numel * (prod(kernel_size) + 1): window adds and one divide ({dims}d)."
    return rule


def _avg_pool_backward(dims: int):
    def rule(call):
        return pool_flops(call["grad_output"].numel, window_size(call["kernel_size"], dims), finish=1)

    rule.__doc__ = f"grad_output.numel * (prod(kernel_size) + 1): one divide, one add per window element ({dims}d)."
    return rule


for _dims, (_fwd, _bwd) in {2: ("avg_pool2d", "avg_pool2d_backward"), 3: ("avg_pool3d", "avg_pool3d_backward")}.items():
    for _op in aten_ops(_fwd):
        register(_op, kind=OTHER)(_avg_pool(_dims))
    for _op in aten_ops(_bwd):
        register(_op, kind=OTHER)(_avg_pool_backward(_dims))


@register(*aten_ops("avg_pool1d"), kind=OTHER)
def avg_pool1d(call):
    """out.numel * (kernel_size + 1): window adds and one divide (1d)."""
    return pool_flops(call.out.numel, window_size(call["kernel_size"], 1), finish=1)


# -- adaptive pooling -----------------------------------------------------------------


@register(
    *aten_ops("_adaptive_avg_pool2d", "_adaptive_avg_pool3d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
              "adaptive_avg_pool1d", "mkldnn_adaptive_avg_pool2d"),
    kind=OTHER,
)
def adaptive_avg_pool(call):
    """sum(window sizes) + out.numel: one add per element read, one divide per output."""
    out = call.out
    dims = len(call["output_size"])
    return adaptive_pool_reads(call["self"].shape, out.shape[-dims:]) + out.numel


@register(
    *aten_ops("_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d_backward", "adaptive_avg_pool3d_backward",
              "mkldnn_adaptive_avg_pool2d_backward"),
    kind=OTHER,
)
def adaptive_avg_pool_backward(call):
    """sum(window sizes) + grad_output.numel: one divide per grad element, one add per element it is spread to."""
    grad = call["grad_output"]
    dims = _spatial_dims(call.op)
    return adaptive_pool_reads(call["self"].shape, grad.shape[-dims:]) + grad.numel


@register(*aten_ops("adaptive_max_pool2d", "adaptive_max_pool3d", "adaptive_max_pool1d"), kind=OTHER)
def adaptive_max_pool(call):
    """sum(window sizes): one comparison per element read."""
    dims = len(call["output_size"])
    return adaptive_pool_reads(call["self"].shape, call.out.shape[-dims:])


# -- interpolation (upsampling) ------------------------------------------------------

INTERPOLATION_TAPS = {
    # op: taps per output element (the weighted sum's terms)
    "upsample_linear1d": 2,
    "upsample_bilinear2d": 4,
    "_upsample_bilinear2d_aa": 4,
    "upsample_trilinear3d": 8,
    "upsample_bicubic2d": 16,
    "_upsample_bicubic2d_aa": 16,
}


def _interpolation(taps: int):
    def rule(call):
        return interpolation_flops(call.out.numel, taps)

    rule.__doc__ = f"{2 * taps - 1} FLOPs per output element: a weighted sum of {taps} taps (weights not counted)."
    return rule


def _interpolation_backward(taps: int):
    def rule(call):
        return interpolation_backward_flops(call["grad_output"].numel, taps)

    rule.__doc__ = f"{2 * taps} FLOPs per grad_output element: multiply by {taps} weights, add into {taps} inputs."
    return rule


for _name, _taps in INTERPOLATION_TAPS.items():
    for _op in aten_ops(_name):
        register(_op, kind=OTHER)(_interpolation(_taps))
    for _op in aten_ops(f"{_name}_backward"):
        register(_op, kind=OTHER)(_interpolation_backward(_taps))

NEAREST = ("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
           "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d")

register_zero(*aten_ops(*NEAREST))  # copies of the nearest input element


@register(*aten_ops(*(f"{n}_backward" for n in NEAREST)), kind=OTHER)
def upsample_nearest_backward(call):
    """grad_output.numel: each grad element is added into its source input."""
    return call["grad_output"].numel


# -- padding and patches ----------------------------------------------------------------

register_zero(*aten_ops(
    "constant_pad_nd", "pad", "_pad_circular", "_pad_enum",
    "reflection_pad1d", "reflection_pad2d", "reflection_pad3d",
    "replication_pad1d", "replication_pad2d", "replication_pad3d",
    "im2col", "pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "native_channel_shuffle",
    "max_unpool2d", "max_unpool3d",
))  # copies: padding, patch extraction, shuffles, unpooling scatter


@register(
    *aten_ops("reflection_pad1d_backward", "reflection_pad2d_backward", "reflection_pad3d_backward",
              "replication_pad1d_backward", "replication_pad2d_backward", "replication_pad3d_backward"),
    kind=OTHER,
)
def pad_backward(call):
    """grad_output.numel: each grad element is added into the input element it copied."""
    return call["grad_output"].numel


@register(*aten_ops("col2im"), kind=OTHER)
def col2im(call):
    """self.numel: each column element is added into its (overlapping) output position."""
    return call["self"].numel


# -- grid sampling (spatial transformers, deformable attention: RT-DETR, Deformable DETR) ------------

GRID_SAMPLER_TAPS = {0: 4, 1: 1, 2: 16}  # interpolation_mode: bilinear, nearest, bicubic (2-D)


def grid_sample_taps(mode: int, dims: int) -> int:
    """Input elements one output element reads: bilinear 4 (trilinear 8 in 3-D), nearest 1, bicubic 16."""
    if mode == 0:
        return 2 ** dims
    return GRID_SAMPLER_TAPS.get(mode, 2 ** dims)


@register(*aten_ops("grid_sampler_2d", "grid_sampler_3d"), kind=OTHER)
def grid_sampler(call):
    """2T - 1 FLOPs per output element (a weighted sum of T taps; nearest: a copy, 0), plus 2 per
    sampling location and spatial dim to unnormalise the grid ((x + 1) * size / 2)."""
    dims = call["grid"].shape[-1]
    taps = grid_sample_taps(int(call["interpolation_mode"]), dims)
    out = call.out.numel
    locations = call["grid"].numel // dims
    return (interpolation_flops(out, taps) if taps > 1 else 0) + 2 * dims * locations


@register(*aten_ops("grid_sampler_2d_backward", "grid_sampler_3d_backward"), kind=OTHER)
def grid_sampler_backward(call):
    """Per grad_output element: 2T for the input's gradient (multiply by T weights, add into T inputs)
    and 4T for the grid's (each of T taps' value times the weight's derivative, accumulated, per
    spatial dim: 2 * dims * T with dims = 2), each counted when output_mask asks for it."""
    dims = call["grid"].shape[-1]
    taps = grid_sample_taps(int(call["interpolation_mode"]), dims)
    mask = call.get("output_mask") or (True, True)
    per = (2 * taps if mask[0] else 0) + (2 * dims * taps if mask[1] else 0)
    return call["grad_output"].numel * per


@register(*aten_ops("affine_grid_generator"), kind=OTHER)
def affine_grid_generator(call):
    """2K FLOPs per output coordinate: ATen multiplies the base grid of homogeneous coordinates (N, H*W, K) by
    theta transposed (N, K, dims), K = dims + 1, one multiply-add per inner element (the base grid's linspace
    is not counted).  Its backward is that batched matmul's (a ``bmm``, counted by its rule)."""
    return 2 * call["theta"].shape[-1] * call.out.numel


# -- Inductor's low-memory max pooling (the ops of a torch.compile graph, estimator.capture.compiled) --------


def _prims_op(name: str):
    return getattr(getattr(torch.ops.prims, name, None), "default", None)


def low_memory_max_pool(call):
    """out.numel * prod(kernel_size): max pooling that keeps int8 window offsets instead of int64 indices
    (Inductor's decomposition of ``max_pool2d_with_indices``; one comparison per window element)."""
    dims = len(call["kernel_size"])
    return pool_flops(call.out.numel, window_size(call["kernel_size"], dims))


def offsets_to_indices(call):
    """out.numel: one index computed per window offset (a few integer multiply-adds, counted once)."""
    return call.out.numel


def fma(call):
    """2 FLOPs per output element: a * b + c (Inductor's fused multiply-add prim, one multiply-add)."""
    return 2 * call.out.numel


def register_inductor_prims() -> None:
    """Inductor defines these prims when it is imported (a torch.compile estimate imports it)."""
    for name, rule in (("_low_memory_max_pool_with_offsets", low_memory_max_pool),
                       ("_low_memory_max_pool_offsets_to_indices", offsets_to_indices), ("fma", fma)):
        op = _prims_op(name)
        if op is not None and lookup(op) is None:
            register(op, kind=OTHER)(rule)
    # the random draws of a compiled graph's dropout (Inductor's seeds and its random prims): drawing, as
    # aten's rand and bernoulli, is not arithmetic (rules/zero.py)
    for name in ("inductor_seeds", "inductor_lookup_seed", "inductor_random", "inductor_randint"):
        op = _prims_op(name)
        if op is not None and lookup(op) is None:
            register_zero(op)


register_late("prims", register_inductor_prims)

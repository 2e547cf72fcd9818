"""Normalization layers, forward and backward (OTHER): batch, layer, group, RMS and weight norm.

One pair of helpers covers every mean/variance normalization; only the number
of statistic groups differs (``M``: rows for layer norm, channels for batch
norm, ``batch * groups`` for group norm).  With ``N`` input elements:

* forward: statistics ``4N + 4M`` (mean: N adds + M divides; variance: sub,
  square, add per element + M divides; ``rsqrt(var + eps)``: 2M), normalize
  ``(x - mean) * rstd``: 2N, affine: +N per weight/bias present.
* backward: recompute ``xhat`` (2N); grad_input ``dx = rstd * (dxhat - mean(dxhat)
  - xhat * mean(dxhat * xhat))``: 7N + 2M (+N for ``dxhat = g * w``); grad_weight
  ``sum(g * xhat)``: 2N; grad_bias ``sum(g)``: N; each only when its output_mask
  entry is set.
"""

from __future__ import annotations

from math import prod

from .registry import OTHER, aten_ops, register

# -- math helpers (pure functions of element counts) -------------------------


def norm_forward_flops(n: int, groups: int, affine_terms: int) -> int:
    """Mean/variance normalization of ``n`` elements in ``groups`` statistic groups."""
    # stats 4n + 4groups; normalize (x - mean) * rstd 2n; affine one mul/add per element per term
    return 4 * n + 4 * groups + 2 * n + affine_terms * n


def norm_apply_flops(n: int, groups: int, affine_terms: int) -> int:
    """Normalization with given statistics (batch norm in eval): rstd per group, then normalize and affine."""
    # rsqrt(var + eps) 2 per group; (x - mean) * rstd 2n; affine
    return 2 * groups + 2 * n + affine_terms * n


def norm_backward_flops(n: int, groups: int, output_mask, has_weight: bool) -> int:
    """Backward of :func:`norm_forward_flops` for the requested gradients."""
    want_input, want_weight, want_bias = (bool(m) for m in output_mask)
    flops = 2 * n if (want_input or want_weight) else 0  # xhat = (x - mean) * rstd
    if want_input:
        # dxhat = g*w (n); sum(dxhat) n, sum(dxhat*xhat) 2n; two means 2 per group; sub, mul, sub, mul 4n
        flops += (n if has_weight else 0) + 7 * n + 2 * groups
    if want_weight:
        flops += 2 * n  # sum over the batch of g * xhat
    if want_bias:
        flops += n  # sum over the batch of g
    return flops


def norm_apply_backward_flops(n: int, groups: int, output_mask) -> int:
    """Backward of :func:`norm_apply_flops` (fixed statistics): scaling only, no statistics terms."""
    want_input, want_weight, want_bias = (bool(m) for m in output_mask)
    flops = 2 * groups  # rstd per group
    if want_input:
        flops += 2 * n  # g * w * rstd
    if want_weight:
        flops += 4 * n  # xhat (2n), sum(g * xhat) (2n)
    if want_bias:
        flops += n
    return flops


def running_stats_flops(channels: int) -> int:
    """Running-average update: mean (1-m)*r + m*x (3C), var the same plus the unbiased correction (4C)."""
    return 7 * channels


def rms_norm_flops(n: int, groups: int, has_weight: bool) -> int:
    """RMS norm: sum of squares 2N, mean + eps + rsqrt 3M, x * rstd N, weight N."""
    return 3 * n + 3 * groups + (n if has_weight else 0)


def rms_norm_backward_flops(n: int, groups: int, output_mask, has_weight: bool) -> int:
    """RMS norm backward: xhat N; grad_input 5N + M (+N g*w); grad_weight sum(g * xhat) 2N."""
    want_input, want_weight = (bool(m) for m in output_mask[:2])
    flops = n if (want_input or want_weight) else 0  # xhat = x * rstd
    if want_input:
        # dxhat = g*w (n); sum(dxhat*xhat) 2n; mean 1 per group; rstd * (dxhat - xhat*mean) 3n
        flops += (n if has_weight else 0) + 5 * n + groups
    if want_weight:
        flops += 2 * n
    return flops


def _channels(x) -> int:
    return x.shape[1] if x.ndim >= 2 else 1


def _affine(call) -> int:
    return int(call.get("weight") is not None) + int(call.get("bias") is not None)


# -- batch norm -----------------------------------------------------------------


def _batch_norm(call, training: bool, running: bool) -> int:
    x = call["input"]
    c = _channels(x)
    if not training:
        return norm_apply_flops(x.numel, c, _affine(call))
    return norm_forward_flops(x.numel, c, _affine(call)) + (running_stats_flops(c) if running else 0)


@register(
    *aten_ops("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
              "cudnn_batch_norm", "miopen_batch_norm"),
    kind=OTHER,
)
def batch_norm(call):
    """training: 6N + 4C (+N per affine term) (+7C with running stats); eval: 2N + 2C (+N per affine term)."""
    training = bool(call.get("training", True))
    running = call.get("running_mean") is not None
    return _batch_norm(call, training, running)


@register(*aten_ops("_native_batch_norm_legit_no_training"), kind=OTHER)
def batch_norm_no_training(call):
    """2N + 2C (+N per affine term): normalize with the running statistics."""
    return _batch_norm(call, training=False, running=False)


@register(*aten_ops("_batch_norm_with_update", "_batch_norm_with_update_functional"), kind=OTHER)
def batch_norm_with_update(call):
    """6N + 4C (+N per affine term) + 7C: batch statistics, normalize, running-stat update."""
    return _batch_norm(call, training=True, running=True)


@register(*aten_ops("_batch_norm_no_update"), kind=OTHER)
def batch_norm_no_update(call):
    """eval (running stats given): 2N + 2C (+N per affine term); else batch statistics 6N + 4C (+N per affine term)."""
    return _batch_norm(call, training=call.get("running_mean") is None, running=False)


@register(*aten_ops("native_batch_norm_backward", "batch_norm_backward"), kind=OTHER)
def batch_norm_backward(call):
    """train: xhat 2N + grad_input 7N + 2C (+N with weight) + grad_weight 2N + grad_bias N per output_mask; eval: 2C + 2N + 4N + N."""
    x = call["input"]
    c = _channels(x)
    train = call.get("train")
    if train is None:  # batch_norm_backward: batch statistics unless running stats were used as is
        train = bool(call.get("update")) or call.get("running_mean") is None
    mask = call["output_mask"]
    if train:
        return norm_backward_flops(x.numel, c, mask, call.get("weight") is not None)
    return norm_apply_backward_flops(x.numel, c, mask)


@register(*aten_ops("cudnn_batch_norm_backward", "miopen_batch_norm_backward"), kind=OTHER)
def cudnn_batch_norm_backward(call):
    """13N + 2C: norm backward over C channel groups, all three gradients: xhat 2N + (8N + 2C) + 2N + N."""
    x = call["input"]
    return norm_backward_flops(x.numel, _channels(x), (True, True, True), True)


# -- layer, group and RMS norm -------------------------------------------------------


@register(*aten_ops("native_layer_norm"), kind=OTHER)
def layer_norm(call):
    """6N + 4M (+N per affine term), M = rows = N / prod(normalized_shape)."""
    x = call["input"]
    rows = x.numel // max(prod(call["normalized_shape"]), 1)
    return norm_forward_flops(x.numel, rows, _affine(call))


@register(*aten_ops("native_layer_norm_backward"), kind=OTHER)
def layer_norm_backward(call):
    """xhat 2N + grad_input 7N + 2M (+N with weight) + grad_weight 2N + grad_bias N, per output_mask."""
    x = call["input"]
    rows = x.numel // max(prod(call["normalized_shape"]), 1)
    return norm_backward_flops(x.numel, rows, call["output_mask"], call.get("weight") is not None)


@register(*aten_ops("native_group_norm"), kind=OTHER)
def group_norm(call):
    """6N + 4*B*G (+N per affine term): statistics per (batch, group)."""
    x = call["input"]
    return norm_forward_flops(x.numel, call["N"] * call["group"], _affine(call))


@register(*aten_ops("native_group_norm_backward"), kind=OTHER)
def group_norm_backward(call):
    """xhat 2N + grad_input 7N + 2*B*G (+N with weight) + grad_weight 2N + grad_bias N, per output_mask."""
    x = call["input"]
    return norm_backward_flops(x.numel, call["N"] * call["group"], call["output_mask"],
                               call.get("weight") is not None)


@register(*aten_ops("_fused_rms_norm", "rms_norm"), kind=OTHER)
def rms_norm(call):
    """3N + 3M (+N with weight): x*x and sum, mean + eps + rsqrt per row, x * rstd, * weight."""
    x = call["input"]
    rows = x.numel // max(prod(call["normalized_shape"]), 1)
    return rms_norm_flops(x.numel, rows, call.get("weight") is not None)


@register(*aten_ops("_fused_rms_norm_backward"), kind=OTHER)
def rms_norm_backward(call):
    """xhat N + grad_input 5N + M (+N with weight) + grad_weight 2N, per output_mask."""
    x = call["input"]
    rows = x.numel // max(prod(call["normalized_shape"]), 1)
    return rms_norm_backward_flops(x.numel, rows, call["output_mask"], call.get("weight") is not None)


# -- weight norm -------------------------------------------------------------------


@register(*aten_ops("_weight_norm_interface"), kind=OTHER)
def weight_norm(call):
    """3N + 2S: ||v|| per slice (2N + S), g / ||v|| (S), v * scale (N); S = v.shape[dim]."""
    v = call["v"]
    slices = v.shape[call["dim"]] if v.ndim else 1
    return 3 * v.numel + 2 * slices


@register(*aten_ops("_weight_norm_interface_backward"), kind=OTHER)
def weight_norm_backward(call):
    """5N + 3S: grad_g = sum(grad_w * v) / ||v|| (2N + S), grad_v = (g/||v||) * (grad_w - v * grad_g/||v||) (3N + 2S)."""
    v = call["saved_v"]
    slices = v.shape[call["dim"]] if v.ndim else 1
    return 5 * v.numel + 3 * slices

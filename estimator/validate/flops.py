"""``torch.utils.flop_counter.FlopCounterMode`` with its known defects fixed (:data:`FLOP_FIXES`): CPU flash
attention and grouped-query heads on every SDPA kernel, the CPU LSTM, grouped ``convolution_backward``, and the
ops it has no formula for.  The truth validate counts FLOPs with."""

from __future__ import annotations

import sys
from math import prod
from typing import Any, Callable

import torch
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count

aten = torch.ops.aten


# ---------------------------------------------------------------------------
# FlopCounterMode fixes (passed as ``custom_mapping``; formulas get shapes:
# every tensor argument is replaced by its ``torch.Size``; ``out_shape`` is the
# output's shape (tuple of shapes for multi-output ops)).
# ---------------------------------------------------------------------------


def _attention_flops(query, key, value) -> int:
    """Scaled-dot-product attention forward with grouped-query heads (K/V heads broadcast to the
    query's: torch 2.11's ``sdpa_flop_count`` asserts equal head counts and crashes on them):
      scores = q @ k^T : 2 * (b*h_q) * s_q * d_q * s_k
      out    = p @ v   : 2 * (b*h_q) * s_q * s_k * d_v
    (causal masking ignored, as torch does)."""
    b, h_q, s_q, d_q = query
    s_k, d_v = key[-2], value[-1]
    return 2 * b * h_q * s_q * s_k * (d_q + d_v)


def _attention_backward_flops(query, key, value) -> int:
    """Its backward, 5 products of the same sizes (torch's ``sdpa_backward_flop_count``):
      recompute scores q @ k^T : 2 * bh_q * s_q * d_q * s_k
      dP = dO @ v^T            : 2 * bh_q * s_q * d_v * s_k
      dV = P^T @ dO            : 2 * bh_q * s_k * s_q * d_v
      dQ = dS @ k              : 2 * bh_q * s_q * s_k * d_q
      dK = dS^T @ q            : 2 * bh_q * d_q * s_q * s_k"""
    b, h_q, s_q, d_q = query
    s_k, d_v = key[-2], value[-1]
    return 2 * b * h_q * s_q * s_k * (3 * d_q + 2 * d_v)


def sdpa_flop(query, key, value, *args, out_shape=None, **kwargs) -> int:
    """Every fused SDPA kernel: (query, key, value, ...) -> (output, logsumexp, ...)."""
    return _attention_flops(query, key, value)


def sdpa_backward_flop(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    """Every fused SDPA backward: (grad_out, query, key, value, ...) -> (grad_q, grad_k, grad_v, ...)."""
    return _attention_backward_flops(query, key, value)


def _rnn_layer_flops(input_shape, w_ih_shape, w_hh_shape) -> int:
    """One recurrent layer, one direction, over the whole sequence.

    input (T, B, I) [time-major after at::lstm's transpose; only T*B matters],
    w_ih (G*H, I), w_hh (G*H, H) with G = 4 gates for LSTM (i, f, g, o).
    Per time step and batch row: the input projection x_t @ w_ih^T is I*G*H
    multiply-adds, the hidden projection h_{t-1} @ w_hh^T is H*G*H.  So
      forward = 2 * T*B * (I + H) * G*H = 2 * T*B * (numel(w_ih) + numel(w_hh)).
    (Gate nonlinearities and bias adds are elementwise, not matmul-class.)
    """
    rows = prod(input_shape[:-1])  # T * B
    return 2 * rows * (prod(w_ih_shape) + prod(w_hh_shape))


def mkldnn_rnn_layer_flop(input, weight0, weight1, *args, out_shape=None, **kwargs) -> int:
    """aten::mkldnn_rnn_layer(Tensor input, Tensor weight0 [w_ih: (G*H, I)],
    Tensor weight1 [w_hh: (G*H, H)], Tensor weight2 [b_ih], Tensor weight3 [b_hh],
    Tensor hx_, Tensor cx_, bool reverse, int[] batch_sizes, int mode, int hidden_size,
    int num_layers, bool has_biases, bool bidirectional, bool batch_first, bool train)
    -> (output, hy, cy, workspace).   Verified with a dispatch trace: input (T, B, I).

    forward = 2 * T*B * (I + H) * G*H   (see _rnn_layer_flops)."""
    return _rnn_layer_flops(input, weight0, weight1)


def mkldnn_rnn_layer_backward_flop(input, weight1, weight2, *args, out_shape=None, **kwargs) -> int:
    """aten::mkldnn_rnn_layer_backward(Tensor input, Tensor weight1 [w_ih: (G*H, I)],
    Tensor weight2 [w_hh: (G*H, H)], Tensor weight3, Tensor weight4, Tensor hx_, ...)
    (note: the backward numbers its weights from 1).

    backward = 2 x forward = 4 * T*B * (I + H) * G*H:
      grad wrt input and hidden (dgates @ w_ih, dgates @ w_hh):   2 * T*B * (I + H) * G*H
      grad wrt weights (dgates^T @ x, dgates^T @ h):              2 * T*B * (I + H) * G*H
    """
    return 2 * _rnn_layer_flops(input, weight1, weight2)


def conv_backward_flop_groups(
    grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
    _output_padding, groups, output_mask, out_shape=None, **kwargs,
) -> int:
    """aten.convolution_backward with ``groups`` honoured.

    grad_input: torch's formula (correct for groups, since it reads the weight
    shape (C_out, C_in/g, *k)): a transposed conv of grad_out with the weight,
      2 * N * prod(out_spatial) * C_out * (C_in/g) * prod(k)   (= the forward FLOPs).
    grad_weight: each weight element accumulates over every batch row and every
    output position where it was used:
      normal conv     w (C_out, C_in/g, *k): 2 * N * prod(out_spatial) * C_out * (C_in/g) * prod(k)
      transposed conv w (C_in, C_out/g, *k): 2 * N * prod(in_spatial)  * C_in * (C_out/g) * prod(k)
    i.e. 2 * N * prod(spatial positions the kernel visits) * numel(w); torch's own
    formula computes it as conv(t(x), t(grad_out)) over ALL C_in x C_out channel pairs,
    i.e. ``groups`` times too many (C x for a depthwise conv).
    """
    flops = 0
    if output_mask[0]:
        grad_input_shape = out_shape[0]
        flops += conv_flop_count(grad_out_shape, w_shape, grad_input_shape, not transposed)
    if output_mask[1]:
        n = x_shape[0]
        visited = (x_shape if transposed else grad_out_shape)[2:]
        flops += 2 * n * prod(visited) * prod(w_shape)
    return flops


def grouped_mm_flop(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """aten._grouped_mm(self, mat2, offs, bias, out_dtype) (mixture-of-experts layers): no formula in
    FlopCounterMode.  (T, K) @ (G, K, N) -> (T, N): each token row meets one expert's K x N matrix,
    2 * T * K * N; (G, M, K) @ (G, K, N): 2 * G * M * K * N; (K, T) @ (T, N) split over T into G
    groups -> (G, K, N) (the weight gradient): 2 * K * T * N."""
    if len(a_shape) == 2 and len(b_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    return 2 * prod(out_shape) * a_shape[-1]


def trilinear_flop(i1_shape, i2_shape, i3_shape, expand1, expand2, expand3, sumdim, *args,
                   out_shape=None, **kwargs) -> int:
    """aten._trilinear (nn.Bilinear: x1^T A x2): no formula in FlopCounterMode.  It multiplies the
    three broadcast operands elementwise and sums over ``sumdim``: 2 multiply-adds per element
    of the broadcast product, i.e. 2 * prod(broadcast shape)."""
    full = [max(a, b, c) for a, b, c in zip(_expand(i1_shape, expand1), _expand(i2_shape, expand2),
                                                 _expand(i3_shape, expand3))]
    return 2 * prod(full)


def _expand(shape, expand_dims) -> list[int]:
    out = list(shape)
    for d in sorted(expand_dims):
        out.insert(d, 1)
    return out


_SDPA = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
         "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")
FLOP_FIXES: dict[Any, Callable[..., int]] = {
    **{getattr(aten, name): sdpa_flop for name in _SDPA if hasattr(aten, name)},
    **{getattr(aten, name + "_backward"): sdpa_backward_flop for name in _SDPA if hasattr(aten, name + "_backward")},
    aten.mkldnn_rnn_layer: mkldnn_rnn_layer_flop,
    aten.mkldnn_rnn_layer_backward: mkldnn_rnn_layer_backward_flop,
    aten.convolution_backward: conv_backward_flop_groups,
    aten._grouped_mm: grouped_mm_flop,
    aten._trilinear: trilinear_flop,
}


def bnb_4bit_flop(A, B, shapeB, *args, out_shape=None, **kwargs) -> int:
    """bitsandbytes' fused 4-bit matmuls (``gemm_4bit``, ``gemv_4bit``: ``A @ W.T`` with ``W`` of ``shapeB`` =
    [out, in], read in 4 bits): ``2 x rows x out x in``, as ``F.linear`` on the dequantized weight counts them."""
    return 2 * prod(A[:-1]) * shapeB[0] * shapeB[1]


def _bitsandbytes_fixes() -> dict[Any, Callable[..., int]]:
    """The fused 4-bit matmuls of bitsandbytes when it is loaded (FlopCounterMode has no formula for them)."""
    if "bitsandbytes" not in sys.modules:
        return {}
    ops = torch.ops.bitsandbytes
    return {getattr(ops, name): bnb_4bit_flop for name in ("gemm_4bit", "gemv_4bit") if hasattr(ops, name)}


def flop_counter() -> FlopCounterMode:
    """``FlopCounterMode`` with the fixes of :data:`FLOP_FIXES` (and bitsandbytes' 4-bit matmuls when loaded)."""
    return FlopCounterMode(display=False, custom_mapping={**FLOP_FIXES, **_bitsandbytes_fixes()})

"""Recurrent layers (matmul class for the gate projections).

What runs on CPU in torch 2.13 (checked with a dispatch trace, real and fake):

* ``nn.LSTM`` (no ``proj_size``): one ``aten.mkldnn_rnn_layer`` per layer and
  direction, and ``aten.mkldnn_rnn_layer_backward`` for each in backward.
  ``FlopCounterMode`` has no formula for either (it counts 0).
* ``nn.GRU``, ``nn.RNN``, ``nn.LSTM(proj_size=...)`` and the ``*Cell`` modules:
  decomposed into ``addmm``/``mm`` plus elementwise ops, covered by those rules.
* On CUDA the fused cells ``_thnn_fused_lstm_cell`` / ``_thnn_fused_gru_cell``
  run the gate nonlinearities after ``mm`` projections: elementwise, OTHER.

mkldnn_rnn_layer formula: per time step and batch row, the input projection
``x @ W_ih^T`` (``2*I*G*H``) and the hidden projection ``h @ W_hh^T``
(``2*H*G*H``), G = 4 gates for LSTM (3 GRU, 1 RNN) read from the weight
shapes.  Backward: grad wrt inputs/hidden (``dgates @ W``) plus grad wrt
weights (``dgates^T @ x``): twice the forward.  Gate nonlinearities and bias
adds are not counted (like the bias of addmm).
"""

from __future__ import annotations

from math import prod

from .registry import MATMUL, OTHER, aten_ops, register
from .matmul import mm_flops

# -- math helpers (pure functions of shapes) ---------------------------------


def rnn_layer_flops(x_shape, w_ih_shape, w_hh_shape) -> int:
    """Gate-projection FLOPs of one recurrent layer over a whole sequence."""
    # rows = T*B (padded) or sum(batch_sizes) (packed): every (step, batch row) pair, in any layout
    rows = prod(x_shape[:-1])
    gh, i = w_ih_shape  # W_ih [G*H, I]
    gh2, h = w_hh_shape  # W_hh [G*H, H]
    # x [rows, I] @ W_ih^T [I, G*H]  +  h [rows, H] @ W_hh^T [H, G*H] (one h per step and row)
    return mm_flops((rows, i), (i, gh)) + mm_flops((rows, h), (h, gh2))


def rnn_layer_backward_flops(x_shape, w_ih_shape, w_hh_shape) -> int:
    """Backward of :func:`rnn_layer_flops`: grad wrt inputs/hidden and wrt weights, each a forward's worth."""
    # dx = dgates @ W_ih, dh = dgates @ W_hh; dW_ih = dgates^T @ x, dW_hh = dgates^T @ h
    return 2 * rnn_layer_flops(x_shape, w_ih_shape, w_hh_shape)


# -- rules ---------------------------------------------------------------------


@register(*aten_ops("mkldnn_rnn_layer"), kind=MATMUL)
def mkldnn_rnn_layer(call):
    """2*T*B*G*H*(I + H): per step and row, x @ W_ih^T and h @ W_hh^T (G gates: LSTM 4, GRU 3)."""
    return rnn_layer_flops(call["input"].shape, call["weight0"].shape, call["weight1"].shape)


@register(*aten_ops("mkldnn_rnn_layer_backward"), kind=MATMUL)
def mkldnn_rnn_layer_backward(call):
    """4*T*B*G*H*(I + H): grad wrt input and hidden plus grad wrt W_ih and W_hh (2x forward)."""
    # the backward schema numbers its weights from 1: weight1 = W_ih, weight2 = W_hh
    return rnn_layer_backward_flops(call["input"].shape, call["weight1"].shape, call["weight2"].shape)


# Fused cells (CUDA): the gate projections were already counted by mm; these do the
# gate arithmetic per hidden element (transcendentals count 1, as everywhere).


@register(*aten_ops("_thnn_fused_lstm_cell"), kind=OTHER)
def fused_lstm_cell(call):
    """B*H*(13 + 8 if biases): 4 gate adds, 3 sigmoid + 1 tanh, c' = f*c + i*g (3), h' = o*tanh(c') (2)."""
    biased = call.get("input_bias") is not None
    # per element of cx [B, H]: input + hidden gates 4, gate nonlinearities 4, c' 3, h' 2; biases: 2 adds per gate
    return call["cx"].numel * (13 + (8 if biased else 0))


@register(*aten_ops("_thnn_fused_lstm_cell_backward_impl", "_thnn_fused_lstm_cell_backward"), kind=OTHER)
def fused_lstm_cell_backward(call):
    """B*H*(23 + 4 if has_bias): tanh(c'), do, dc, di, df, dg, dc_prev (+ bias-gradient sums)."""
    # per element of cx [B, H]: tanh(c') 1; do = dh*tanh(c')*o*(1-o) 4; dc = dh*o*(1-tanh^2) + dc' 5;
    # di = dc*g*i*(1-i) 4; df = dc*c*f*(1-f) 4; dg = dc*i*(1-g^2) 4; dc_prev = dc*f 1; bias grads: 4 adds
    return call["cx"].numel * (23 + (4 if call["has_bias"] else 0))


@register(*aten_ops("_thnn_fused_gru_cell"), kind=OTHER)
def fused_gru_cell(call):
    """B*H*(10 + 6 if biases): r, z = sigmoid(i + h) (4), n = tanh(i_n + r*h_n) (3), h' = n + z*(h - n) (3)."""
    biased = call.get("input_bias") is not None
    # per element of hx [B, H]; biases: one add per gate for input and hidden bias
    return call["hx"].numel * (10 + (6 if biased else 0))


@register(*aten_ops("_thnn_fused_gru_cell_backward"), kind=OTHER)
def fused_gru_cell_backward(call):
    """B*H*(16 + 6 if has_bias): dh*z (1), dz (5), dn (5), dr (4), dh_n = dn*r (1) (+ bias-gradient sums)."""
    # per element of grad_hy [B, H]: dz = dh*(h - n)*z*(1-z); dn = dh*(1-z)*(1-n^2); dr = dn*h_n*r*(1-r)
    return call["grad_hy"].numel * (16 + (6 if call["has_bias"] else 0))


# cuDNN (CUDA target): one op for every layer and direction of nn.LSTM / nn.GRU / nn.RNN.


def _cudnn_layers(call):
    """(W_ih shape, W_hh shape) of each layer and direction of a ``_cudnn_rnn`` call.

    ``weight`` holds ``weight_stride0`` tensors per layer-direction: W_ih, W_hh[, b_ih, b_hh][, W_hr]."""
    weights, stride = call["weight"], call["weight_stride0"]
    return [(weights[k].shape, weights[k + 1].shape) for k in range(0, len(weights), stride)]


def _cudnn_rows(call) -> tuple[int, int]:
    """(T*B rows every layer reads, hidden size): the input is (B, T, I) or (T, B, I), or packed (N, I)."""
    x = call["input"].shape
    return prod(x[:-1]), call["hidden_size"]


@register(*aten_ops("_cudnn_rnn"), kind=MATMUL)
def cudnn_rnn(call):
    """sum over layers and directions of 2*T*B*G*H*(I_l + H): each layer's x @ W_ih^T and h @ W_hh^T."""
    rows, _ = _cudnn_rows(call)
    # layer l reads rows x I_l (I_0 = the input size, then H per direction): W_ih [G*H, I_l] carries I_l
    return sum(rnn_layer_flops((rows, w_ih[1]), w_ih, w_hh) for w_ih, w_hh in _cudnn_layers(call))


@register(*aten_ops("_cudnn_rnn_backward"), kind=MATMUL)
def cudnn_rnn_backward(call):
    """2x :func:`cudnn_rnn` when both input and weight gradients are asked (output_mask), else one forward's worth per kind."""
    rows, _ = _cudnn_rows(call)
    mask = call["output_mask"]
    per_kind = sum(rnn_layer_flops((rows, w_ih[1]), w_ih, w_hh) for w_ih, w_hh in _cudnn_layers(call))
    # mask: (input, hx, cx, weights): data gradients (dgates @ W) if any of the first three, weight gradients if the last
    return per_kind * ((1 if any(mask[:3]) else 0) + (1 if mask[3] else 0))

"""Parameter counts of standard ``nn`` layers by formula, keyed by module class.

The estimator counts parameters from the tensors themselves; these formulas are
the independent, documented statement of what each layer holds (shown in the
report next to the count, and checked against ``sum(p.numel())`` in the tests).
A formula gives the module's whole parameter count, children included (only
``MultiheadAttention`` has a parametrized child, its ``out_proj``).  Buffers
(BatchNorm running statistics) are counted apart, by :func:`module_buffers`.

Register a formula for your own layer::

    @register_module(MyLayer)
    def my_layer(m):
        '''d*d + d: one square matrix and a bias.'''
        return m.d * m.d + m.d
"""

from __future__ import annotations

from math import prod
from typing import Callable

import torch.nn as nn

_PARAMS: dict[type, Callable[[nn.Module], int]] = {}
_BUFFERS: dict[type, Callable[[nn.Module], int]] = {}


def register_module(*classes: type, buffers: bool = False, override: bool = False) -> Callable:
    """Register ``fn(module) -> int`` as the parameter (or, ``buffers=True``, buffer) formula of ``classes``.

    Subclasses inherit the formula of their nearest registered base class.
    """
    table = _BUFFERS if buffers else _PARAMS

    def decorator(fn: Callable[[nn.Module], int]) -> Callable[[nn.Module], int]:
        for cls in classes:
            if cls in table and not override:
                raise ValueError(f"{cls.__name__} already has a formula; pass override=True to replace it")
            table[cls] = fn
        return fn

    return decorator


def _lookup(table: dict[type, Callable], module: nn.Module) -> Callable | None:
    for cls in type(module).__mro__:
        fn = table.get(cls)
        if fn is not None:
            return fn
    return None


def _uninitialized(module: nn.Module) -> bool:
    has = getattr(module, "has_uninitialized_params", None)  # lazy modules before their first call
    return bool(has and has())


def module_param_formula(module: nn.Module) -> int | None:
    """Parameter count of ``module`` by its class's formula, or None (no formula, or lazy and uninitialized)."""
    fn = _lookup(_PARAMS, module)
    if fn is None or _uninitialized(module):
        return None
    return int(fn(module))


def module_buffers(module: nn.Module) -> int | None:
    """Buffer element count of ``module`` by formula (BatchNorm running stats), or None."""
    fn = _lookup(_BUFFERS, module)
    if fn is None or _uninitialized(module):
        return None
    return int(fn(module))


def module_formula(module: nn.Module) -> str | None:
    """The parameter formula's text (its docstring's first line), or None."""
    fn = _lookup(_PARAMS, module)
    if fn is None:
        return None
    doc = (fn.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else None


# -- formulas ----------------------------------------------------------------------


@register_module(nn.Linear)
def linear(m: nn.Linear) -> int:
    """in*out + out (bias): weight [out, in]."""
    return m.in_features * m.out_features + (m.out_features if m.bias is not None else 0)


@register_module(nn.Bilinear)
def bilinear(m: nn.Bilinear) -> int:
    """out*in1*in2 + out (bias): weight [out, in1, in2]."""
    return m.out_features * m.in1_features * m.in2_features + (m.out_features if m.bias is not None else 0)


@register_module(nn.modules.conv._ConvNd)
def conv(m: nn.modules.conv._ConvNd) -> int:
    """C_in*C_out*prod(kernel)/groups + C_out (bias): weight [C_out, C_in/g, *k] ([C_in, C_out/g, *k] transposed)."""
    weight = m.in_channels * m.out_channels * prod(m.kernel_size) // m.groups
    return weight + (m.out_channels if m.bias is not None else 0)


@register_module(nn.modules.batchnorm._NormBase)
def batch_norm(m) -> int:
    """2*C if affine (weight, bias), else 0 (BatchNorm and InstanceNorm)."""
    return 2 * m.num_features if m.affine else 0


@register_module(nn.modules.batchnorm._NormBase, buffers=True)
def batch_norm_buffers(m) -> int:
    """2*C + 1 with track_running_stats (running_mean, running_var, num_batches_tracked), else 0."""
    return 2 * m.num_features + 1 if m.track_running_stats else 0


@register_module(nn.LayerNorm)
def layer_norm(m: nn.LayerNorm) -> int:
    """D + D (bias) if elementwise_affine, D = prod(normalized_shape)."""
    if not m.elementwise_affine:
        return 0
    d = prod(m.normalized_shape)
    return d + (d if m.bias is not None else 0)


@register_module(nn.GroupNorm)
def group_norm(m: nn.GroupNorm) -> int:
    """2*C if affine (per-channel weight and bias)."""
    return 2 * m.num_channels if m.affine else 0


if hasattr(nn, "RMSNorm"):

    @register_module(nn.RMSNorm)
    def rms_norm(m) -> int:
        """D if elementwise_affine (weight only), D = prod(normalized_shape)."""
        return prod(m.normalized_shape) if m.elementwise_affine else 0


@register_module(nn.Embedding, nn.EmbeddingBag)
def embedding(m) -> int:
    """num_embeddings * embedding_dim."""
    return m.num_embeddings * m.embedding_dim


@register_module(nn.PReLU)
def prelu(m: nn.PReLU) -> int:
    """num_parameters (one slope per channel, or 1)."""
    return m.num_parameters


def _gates(mode: str) -> int:
    return {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}[mode]


@register_module(nn.RNNBase)
def rnn(m: nn.RNNBase) -> int:
    """sum over layers and directions of G*H*(I_l + H_out) + 2*G*H (bias) + P*H (proj); G = 4 LSTM, 3 GRU, 1 RNN."""
    g, h, p = _gates(m.mode), m.hidden_size, m.proj_size
    h_out = p if p > 0 else h
    directions = 2 if m.bidirectional else 1
    total = 0
    for layer in range(m.num_layers):
        i = m.input_size if layer == 0 else h_out * directions  # layer l > 0 reads both directions' outputs
        per_direction = g * h * i + g * h * h_out  # W_ih [G*H, I_l], W_hh [G*H, H_out]
        per_direction += 2 * g * h if m.bias else 0  # b_ih, b_hh
        per_direction += p * h if p > 0 else 0  # W_hr [P, H]
        total += directions * per_direction
    return total


@register_module(nn.RNNCellBase)
def rnn_cell(m: nn.RNNCellBase) -> int:
    """G*H*(I + H) + 2*G*H (bias); G = 4 LSTMCell, 3 GRUCell, 1 RNNCell."""
    g = 4 if isinstance(m, nn.LSTMCell) else 3 if isinstance(m, nn.GRUCell) else 1
    gh = g * m.hidden_size
    return gh * (m.input_size + m.hidden_size) + (2 * gh if m.bias else 0)


@register_module(nn.MultiheadAttention)
def multihead_attention(m: nn.MultiheadAttention) -> int:
    """E*(E + kdim + vdim) in-projection + 3E (bias) + out_proj E*E + E (bias) + 2E (bias_k, bias_v)."""
    e = m.embed_dim
    total = e * (e + m.kdim + m.vdim)  # q, k, v projections (one packed [3E, E] when kdim = vdim = E)
    total += 3 * e if m.in_proj_bias is not None else 0
    total += e * e + (e if m.out_proj.bias is not None else 0)
    total += 2 * e if m.bias_k is not None else 0
    return total

"""The measuring instruments of the tests' ground truth, independent of the code they check.

Nothing here imports the estimator: a ground truth that shared code with the estimate could not
catch its mistakes.

* :func:`flop_counter`: ``torch.utils.flop_counter.FlopCounterMode`` with its known defects fixed
  (its formulas get tensor shapes; ``out_shape`` is the output's shape): CPU flash attention and
  grouped-query heads (no formula / an assertion on unequal head counts), the CPU LSTM layer (no
  formula), grouped ``convolution_backward`` (its weight gradient counts every channel pair:
  ``groups`` times too many), and the ops it has no formula for (``_grouped_mm``, ``_trilinear``).
* :class:`LiveTracker`: live bytes of real tensors, a ``weakref.finalize`` per storage.
"""

from __future__ import annotations

import weakref
from math import prod

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count

aten = torch.ops.aten


def _attention(query, key, value, *args, out_shape=None, **kwargs) -> int:
    """q @ k^T and p @ v with the query's heads (K/V heads broadcast): 2*b*h_q*s_q*s_k*(d_q + d_v)."""
    b, h, s_q, d_q = query
    return 2 * b * h * s_q * key[-2] * (d_q + value[-1])


def _attention_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    """Recomputed scores, dP, dV, dQ, dK: 2*b*h_q*s_q*s_k*(3*d_q + 2*d_v)."""
    b, h, s_q, d_q = query
    return 2 * b * h * s_q * key[-2] * (3 * d_q + 2 * value[-1])


def _rnn_layer(rows_shape, w_ih, w_hh) -> int:
    """One recurrent layer: x @ W_ih^T and h @ W_hh^T for every (step, row): 2*T*B*(numel W_ih + numel W_hh)."""
    return 2 * prod(rows_shape[:-1]) * (prod(w_ih) + prod(w_hh))


def _mkldnn_rnn_layer(input, weight0, weight1, *args, out_shape=None, **kwargs) -> int:
    return _rnn_layer(input, weight0, weight1)


def _mkldnn_rnn_layer_backward(input, weight1, weight2, *args, out_shape=None, **kwargs) -> int:
    """Data and weight gradients: twice the forward (the backward numbers its weights from 1)."""
    return 2 * _rnn_layer(input, weight1, weight2)


def _conv_backward(grad_out, x, w, _bias, _stride, _padding, _dilation, transposed, _output_padding, groups,
                   output_mask, out_shape=None, **kwargs) -> int:
    """grad_input: a forward's worth (torch's formula is right); grad_weight: 2*N*(visited positions)*numel(w)."""
    flops = 0
    if output_mask[0]:
        flops += conv_flop_count(grad_out, w, out_shape[0], not transposed)
    if output_mask[1]:
        flops += 2 * x[0] * prod((x if transposed else grad_out)[2:]) * prod(w)
    return flops


def _grouped_mm(a, b, *args, out_shape=None, **kwargs) -> int:
    """(T, K) @ experts -> (T, N): 2*T*K*N; 3-D operands: 2*numel(out)*K."""
    if len(a) == 2 and len(b) == 2:
        return 2 * a[0] * a[1] * b[1]
    return 2 * prod(out_shape) * a[-1]


def _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, *args, out_shape=None, **kwargs) -> int:
    """Elementwise product of the three broadcast operands summed over sumdim: 2*numel(broadcast)."""
    def expanded(shape, dims):
        out = list(shape)
        for d in sorted(dims):
            out.insert(d, 1)
        return out

    return 2 * prod(max(a, b, c) for a, b, c in zip(expanded(i1, expand1), expanded(i2, expand2),
                                                     expanded(i3, expand3)))


_SDPA = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
         "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")
FIXES = {
    **{getattr(aten, n): _attention for n in _SDPA if hasattr(aten, n)},
    **{getattr(aten, n + "_backward"): _attention_backward for n in _SDPA if hasattr(aten, n + "_backward")},
    aten.mkldnn_rnn_layer: _mkldnn_rnn_layer,
    aten.mkldnn_rnn_layer_backward: _mkldnn_rnn_layer_backward,
    aten.convolution_backward: _conv_backward,
    aten._trilinear: _trilinear,
}
if hasattr(aten, "_grouped_mm"):
    FIXES[aten._grouped_mm] = _grouped_mm


def flop_counter() -> FlopCounterMode:
    """``FlopCounterMode`` with :data:`FIXES`."""
    return FlopCounterMode(display=False, custom_mapping=FIXES)


class LiveTracker(TorchDispatchMode):
    """Live bytes of real tensors: each storage's bytes added when it first appears (as an op's input or
    output, or :meth:`register`-ed), subtracted when a ``weakref.finalize`` sees it freed."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self.known: dict[int, int] = {}

    def register(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key = st._cdata
        if key in self.known:
            return
        n = st.nbytes()
        self.known[key] = n
        self.live += n
        self.peak = max(self.peak, self.live)
        weakref.finalize(st, self._free, key).atexit = False

    def _free(self, key: int) -> None:
        n = self.known.pop(key, None)
        if n is not None:
            self.live -= n

    def reset_peak(self) -> None:
        self.peak = self.live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for t in pytree.tree_leaves((args, kwargs or {})):
            if isinstance(t, torch.Tensor):
                self.register(t)
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.register(t)
        return out

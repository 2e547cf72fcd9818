"""Loss functions, forward and backward (OTHER).

``F.cross_entropy`` reaches the dispatcher as ``_log_softmax`` +
``nll_loss_forward`` (see reduction.py for the softmax); ``l1_loss``,
``kl_div``, ``poisson_nll_loss``, margin/embedding losses decompose into
elementwise ops.  Per-element costs count each scalar operation (transcendentals
included) as 1 FLOP; both branches of a piecewise loss are counted, as
vectorized kernels evaluate both and select.

Reduction (``reduction``: 0 none, 1 mean, 2 sum): sum adds N, mean adds N + 1
(the divide); backward of mean scales each grad element: +N.
"""

from __future__ import annotations

import torch

from .registry import OTHER, aten_ops, register

aten = torch.ops.aten

NONE, MEAN, SUM = 0, 1, 2

# -- math helpers ---------------------------------------------------------------


def reduce_flops(n: int, reduction: int) -> int:
    """FLOPs of a loss reduction over ``n`` elements: none 0, sum n, mean n + 1."""
    return 0 if reduction == NONE else n + (1 if reduction == MEAN else 0)


def loss_flops(n: int, per_element: int, reduction: int) -> int:
    """``per_element`` FLOPs on each of ``n`` elements, then the reduction."""
    return n * per_element + reduce_flops(n, reduction)


def loss_backward_flops(n: int, per_element: int, reduction: int) -> int:
    """``per_element`` FLOPs on each of ``n`` grad elements (+1 each for the mean's 1/N)."""
    return n * (per_element + (1 if reduction == MEAN else 0))


def _weighted(call, name: str = "weight") -> int:
    return int(call.get(name) is not None)


# -- negative log likelihood (cross entropy after log_softmax) ----------------------


@register(*aten_ops("nll_loss_forward", "nll_loss2d_forward"), kind=OTHER)
def nll_loss_forward(call):
    """B*(1 + 1 if weight) + reduction (sum: B; mean: 2B + 1 with the total weight): -w[t]*x[t] per target."""
    b = call["target"].numel
    reduction = call["reduction"]
    # per target: negate the picked log-probability, times its class weight
    flops = b * (1 + _weighted(call))
    if reduction == SUM:
        flops += b
    elif reduction == MEAN:
        flops += 2 * b + 1  # sum of losses, sum of weights, one divide
    return flops


@register(*aten_ops("nll_loss_backward", "nll_loss2d_backward"), kind=OTHER)
def nll_loss_backward(call):
    """B*(1 + 1 if weight + 1 if mean): grad written at each target: -g (* w[t]) (/ total_weight); zeros elsewhere free."""
    b = call["target"].numel
    return b * (1 + _weighted(call) + (1 if call["reduction"] == MEAN else 0))


# -- regression losses -------------------------------------------------------------------


@register(*aten_ops("mse_loss"), kind=OTHER)
def mse_loss(call):
    """2N + reduction: (x - y)^2."""
    return loss_flops(call["self"].numel, 2, call["reduction"])


@register(*aten_ops("mse_loss_backward"), kind=OTHER)
def mse_loss_backward(call):
    """3N (+N for mean): 2 * (x - y) * g."""
    return loss_backward_flops(call["self"].numel, 3, call["reduction"])


@register(*aten_ops("l1_loss"), kind=OTHER)
def l1_loss(call):
    """2N + reduction: |x - y| (decomposed into sub and abs on CPU in torch 2.13)."""
    return loss_flops(call["self"].numel, 2, call["reduction"])


@register(*aten_ops("smooth_l1_loss", "huber_loss"), kind=OTHER)
def smooth_l1_loss(call):
    """8N + reduction: d = |x - y| (2), compare (1), quadratic branch (3), linear branch (1), select (1)."""
    return loss_flops(call["self"].numel, 8, call["reduction"])


@register(*aten_ops("smooth_l1_loss_backward", "huber_loss_backward"), kind=OTHER)
def smooth_l1_loss_backward(call):
    """7N (+N for mean): d = x - y, |d| compare (2), d/beta and sign(d) (2), select, * g."""
    return loss_backward_flops(call["self"].numel, 7, call["reduction"])


# -- classification losses -------------------------------------------------------------------


@register(*aten_ops("binary_cross_entropy"), kind=OTHER)
def binary_cross_entropy(call):
    """9N (+N weight) + reduction: (y - 1)*max(log1p(-x), -100) - y*max(log(x), -100)."""
    # neg, log1p, max, sub, mul, log, max, mul, sub
    return loss_flops(call["self"].numel, 9 + _weighted(call), call["reduction"])


@register(*aten_ops("binary_cross_entropy_backward"), kind=OTHER)
def binary_cross_entropy_backward(call):
    """6N (+N weight, +N mean): g * (x - y) / max((1 - x) * x, eps)."""
    return loss_backward_flops(call["self"].numel, 6 + _weighted(call), call["reduction"])


@register(*aten_ops("binary_cross_entropy_with_logits"), kind=OTHER)
def binary_cross_entropy_with_logits(call):
    """10N (+4N pos_weight, +N weight) + reduction: (1 - y)*x + lw*(log1p(exp(-|x|)) + max(-x, 0))."""
    # 1-y, mul, abs, neg, exp, log1p, neg, max, add, add; pos_weight: lw = (pw - 1)*y + 1 (3) and * lw (1)
    per = 10 + 4 * _weighted(call, "pos_weight") + _weighted(call)
    return loss_flops(call["self"].numel, per, call["reduction"])


@register(*aten_ops("kl_div"), kind=OTHER)
def kl_div(call):
    """3N + reduction: y * (log(y) - x), or exp(y) * (y - x) with log_target (decomposed in torch 2.13)."""
    return loss_flops(call["self"].numel, 3, call["reduction"])


@register(*aten_ops("soft_margin_loss"), kind=OTHER)
def soft_margin_loss(call):
    """4N + reduction: log1p(exp(-y * x))."""
    return loss_flops(call["self"].numel, 4, call["reduction"])


@register(*aten_ops("soft_margin_loss_backward"), kind=OTHER)
def soft_margin_loss_backward(call):
    """8N (+N mean): z = exp(-y*x) (3), -y * z / (1 + z) (4), * g (1)."""
    return loss_backward_flops(call["self"].numel, 8, call["reduction"])


@register(*aten_ops("multi_margin_loss"), kind=OTHER)
def multi_margin_loss(call):
    """B*C*(5 + 1 if weight) + B + reduction(B): max(0, margin - x[t] + x[c])^p summed over classes, / C."""
    x = call["self"]
    b = x.numel // x.shape[-1] if x.ndim else 1
    # per (sample, class): sub, add, max, pow, add (+ weight mul); per sample: divide by C
    return x.numel * (5 + _weighted(call)) + b + reduce_flops(b, call["reduction"])


@register(*aten_ops("multi_margin_loss_backward"), kind=OTHER)
def multi_margin_loss_backward(call):
    """B*C*(4 + 1 if weight): per (sample, class) margin test and the p-scaled grad, accumulated at the target."""
    return call["self"].numel * (4 + _weighted(call))


# -- connectionist temporal classification -------------------------------------------------


def ctc_cells(log_probs, targets) -> int:
    """T * N * (2*S + 1): the (time, batch, extended-label) cells of the alpha/beta recursions."""
    t, n = log_probs.shape[0], (log_probs.shape[1] if log_probs.ndim == 3 else 1)
    s = targets.shape[-1] if targets.ndim == 2 else targets.numel // max(n, 1)  # padded (N, S) or concatenated
    return t * n * (2 * s + 1)


@register(aten._ctc_loss, kind=OTHER)
def ctc_loss(call):
    """6*T*N*(2S+1): per cell, a log-sum-exp of up to three predecessors (max, 3 exp, sum, log) plus the emission."""
    return 6 * ctc_cells(call["log_probs"], call["targets"])


@register(aten._ctc_loss_backward, kind=OTHER)
def ctc_loss_backward(call):
    """6*T*N*(2S+1) for the beta recursion + 4*T*N*(2S+1) to combine alpha*beta + T*N*C for the gradient."""
    log_probs = call["log_probs"]
    return 10 * ctc_cells(log_probs, call["targets"]) + log_probs.numel

"""Fused scaled-dot-product attention kernels, forward and backward (matmul class).

The formulas are ``torch.utils.flop_counter``'s: forward = the two batched
matmuls ``Q @ K^T`` and ``P @ V`` (``4*b*h*s_q*s_kv*d`` when ``d_v == d``);
backward = five: the recomputed scores, ``dP = dO @ V^T``, ``dV = P^T @ dO``,
``dQ = dS @ K``, ``dK = dS^T @ Q``.  Softmax, scaling, masking and dropout are
not counted, and a causal mask is not discounted (as torch).  Grouped-query
attention (fewer key/value heads) is counted at the query's head count, as the
kernels broadcast K/V heads (as torch).

Fixed against ``FlopCounterMode``:

* ``_scaled_dot_product_flash_attention_for_cpu`` (what ``F.scaled_dot_product_attention``
  runs on CPU) and its backward: torch has no formula; the same sdpa formula applies.
* ``_flash_attention_forward`` / ``_efficient_attention_forward`` (and backward) take
  ``[batch, seq, heads, dim]`` dense inputs; torch's formula reads them as
  ``[batch, heads, seq, dim]`` (swapping heads and sequence).  Here the layout is
  read correctly; variable-length (nested) inputs ``[total, heads, dim]`` are
  counted as torch does on fake tensors: every sequence at the maximum length.
"""

from __future__ import annotations

from .registry import MATMUL, aten_ops, register
from .matmul import bmm_flops

# -- math helpers (pure functions of shapes) ---------------------------------


def sdpa_flops(q_shape, k_shape, v_shape) -> int:
    """FLOPs of attention forward on ``[b, h, s, d]`` inputs: Q @ K^T and P @ V."""
    b, h_q, s_q, d_q = q_shape
    _, h_kv, s_k, d_k = k_shape
    _, _, _, d_v = v_shape
    if d_q != d_k or h_q % h_kv:
        raise ValueError(f"attention shapes do not match: q={tuple(q_shape)} k={tuple(k_shape)} v={tuple(v_shape)}")
    # scores: [b*h_q, s_q, d] @ [b*h_q, d, s_k] -> [b*h_q, s_q, s_k]  (K/V heads broadcast to h_q)
    flops = bmm_flops((b * h_q, s_q, d_q), (b * h_q, d_q, s_k))
    # out: [b*h_q, s_q, s_k] @ [b*h_q, s_k, d_v] -> [b*h_q, s_q, d_v]
    flops += bmm_flops((b * h_q, s_q, s_k), (b * h_q, s_k, d_v))
    return flops


def sdpa_backward_flops(grad_out_shape, q_shape, k_shape, v_shape) -> int:
    """FLOPs of attention backward on ``[b, h, s, d]`` inputs: five batched matmuls."""
    b, h_q, s_q, d_q = q_shape
    _, _, s_k, _ = k_shape
    _, _, _, d_v = v_shape
    bh = b * h_q
    # recompute scores: [bh, s_q, d] @ [bh, d, s_k] -> [bh, s_q, s_k]
    flops = bmm_flops((bh, s_q, d_q), (bh, d_q, s_k))
    # dP = dO @ V^T: [bh, s_q, d_v] @ [bh, d_v, s_k] -> [bh, s_q, s_k]
    flops += bmm_flops((bh, s_q, d_v), (bh, d_v, s_k))
    # dV = P^T @ dO: [bh, s_k, s_q] @ [bh, s_q, d_v] -> [bh, s_k, d_v]
    flops += bmm_flops((bh, s_k, s_q), (bh, s_q, d_v))
    # dQ = dS @ K: [bh, s_q, s_k] @ [bh, s_k, d] -> [bh, s_q, d]
    flops += bmm_flops((bh, s_q, s_k), (bh, s_k, d_q))
    # dK = dS^T @ Q (as [bh, d, s_q] @ [bh, s_q, s_k]) -> [bh, d, s_k]
    flops += bmm_flops((bh, d_q, s_q), (bh, s_q, s_k))
    return flops


def bshd_to_bhsd(shape):
    """``[b, s, h, d]`` (flash/efficient kernel layout) -> ``[b, h, s, d]``."""
    b, s, h, d = shape
    return (b, h, s, d)


def varlen_shapes(q_shape, k_shape, v_shape, cum_seq_q, max_q: int, max_k: int):
    """Per-sequence ``[1, h, s, d]`` shapes of a variable-length batch, or the dense ones.

    Nested inputs are ``[total, h, d]`` with ``cum_seq_q`` offsets of ``batch + 1``
    entries; only their shape is known, so every sequence is taken at the maximum
    length (torch's count on fake tensors).  Dense inputs are ``[b, s, h, d]``.
    """
    if cum_seq_q is None:
        return [(bshd_to_bhsd(q_shape), bshd_to_bhsd(k_shape), bshd_to_bhsd(v_shape))]
    # [total, h, d] -> batch x [1, h, max_len, d]
    if len(q_shape) == 4:  # efficient attention keeps a leading 1: [1, total, h, d]
        q_shape, k_shape, v_shape = q_shape[1:], k_shape[1:], v_shape[1:]
    batch = cum_seq_q.shape[0] - 1
    one = ((1, q_shape[1], max_q, q_shape[2]), (1, k_shape[1], max_k, k_shape[2]), (1, v_shape[1], max_k, v_shape[2]))
    return [one] * batch


# -- rules: [b, h, s, d] sdpa-level ops ---------------------------------------


@register(
    *aten_ops(
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_fused_attention_overrideable",
    ),
    kind=MATMUL,
)
def sdpa(call):
    """4*b*h*s_q*s_kv*d (2*b*h*s_q*s_kv*(d + d_v)): Q @ K^T and P @ V; softmax and causal mask not counted."""
    return sdpa_flops(call["query"].shape, call["key"].shape, call["value"].shape)


@register(
    *aten_ops(
        "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_cudnn_attention_backward", "_scaled_dot_product_flash_attention_for_cpu_backward",
        "_scaled_dot_product_fused_attention_overrideable_backward",
    ),
    kind=MATMUL,
)
def sdpa_backward(call):
    """10*b*h*s_q*s_kv*d (d_v = d): recomputed Q @ K^T, dO @ V^T, P^T @ dO, dS @ K, Q^T @ dS."""
    grad_out = call.get("grad_out")
    if grad_out is None:
        grad_out = call["grad_out_"]
    return sdpa_backward_flops(grad_out.shape, call["query"].shape, call["key"].shape, call["value"].shape)


# -- rules: [b, s, h, d] kernel-level ops (dense or variable length) ---------


@register(*aten_ops("_flash_attention_forward", "_flash_attention_forward_no_dropout_inplace"), kind=MATMUL)
def flash_attention_forward(call):
    """4*b*h*s_q*s_kv*d with q/k/v read as [b, s, h, d]; varlen [total, h, d]: b sequences at max length."""
    shapes = varlen_shapes(call["query"].shape, call["key"].shape, call["value"].shape,
                           call["cum_seq_q"], call["max_q"], call["max_k"])
    return sum(sdpa_flops(q, k, v) for q, k, v in shapes)


@register(*aten_ops("_efficient_attention_forward"), kind=MATMUL)
def efficient_attention_forward(call):
    """4*b*h*s_q*s_kv*d with q/k/v read as [b, s, h, d]; varlen [1, total, h, d]: b sequences at max length."""
    shapes = varlen_shapes(call["query"].shape, call["key"].shape, call["value"].shape,
                           call["cu_seqlens_q"], call["max_seqlen_q"], call["max_seqlen_k"])
    return sum(sdpa_flops(q, k, v) for q, k, v in shapes)


@register(*aten_ops("_flash_attention_backward"), kind=MATMUL)
def flash_attention_backward(call):
    """10*b*h*s_q*s_kv*d with q/k/v read as [b, s, h, d]; varlen [total, h, d]: b sequences at max length."""
    shapes = varlen_shapes(call["query"].shape, call["key"].shape, call["value"].shape,
                           call["cum_seq_q"], call["max_q"], call["max_k"])
    # grad_out has the query's shape with d_v: [.., h, s_q, d_v]
    return sum(sdpa_backward_flops(q[:3] + v[3:], q, k, v) for q, k, v in shapes)


@register(*aten_ops("_efficient_attention_backward"), kind=MATMUL)
def efficient_attention_backward(call):
    """10*b*h*s_q*s_kv*d with q/k/v read as [b, s, h, d]; varlen [1, total, h, d]: b sequences at max length."""
    shapes = varlen_shapes(call["query"].shape, call["key"].shape, call["value"].shape,
                           call["cu_seqlens_q"], call["max_seqlen_q"], call["max_seqlen_k"])
    return sum(sdpa_backward_flops(q[:3] + v[3:], q, k, v) for q, k, v in shapes)


# -- rules: nn.MultiheadAttention's inference fast path (fused kernels) -------------------------------------------


def mha_fused_flops(q_shape, k_shape, embed_dim: int, self_attention: bool) -> int:
    """The matmuls of ``nn.MultiheadAttention`` on ``[b, t, e]`` queries and ``[b, s, e]`` keys: the input
    projections (3 x e x e on the queries when they are the keys and values, else e x e on the queries and 2 x e
    x e on the keys), attention (4 x b x t x s x e over the heads) and the output projection (e x e)."""
    b, t, e = q_shape
    s = k_shape[-2]
    proj_in = 2 * b * t * e * 3 * e if self_attention else 2 * b * t * e * e + 2 * b * s * e * 2 * e
    return proj_in + 4 * b * t * s * embed_dim + 2 * b * t * e * e


@register(*aten_ops("_native_multi_head_attention"), kind=MATMUL)
def native_multi_head_attention(call):
    """mha_fused_flops (2*b*t*e*3e + 4*b*t*s*e + 2*b*t*e*e): in-projections, Q @ K^T and P @ V, out-projection
    (``nn.MultiheadAttention``'s inference
    fast path, ``torch/nn/modules/activation.py``); softmax and masking not counted."""
    q, k = call["query"], call["key"]
    same = tuple(q.shape) == tuple(k.shape)  # (the fast path's self-attention: one input for q, k and v)
    return mha_fused_flops(q.shape, k.shape, call["embed_dim"], same)


@register(*aten_ops("_transformer_encoder_layer_fwd"), kind=MATMUL)
def transformer_encoder_layer_fwd(call):
    """mha_fused_flops + 2 * (2*b*t*e*f): ``nn.TransformerEncoderLayer``'s inference fast path, one kernel, its
    self-attention and its feed-forward (f: ``ffn_weight_1``'s rows); norms, activations and residuals not
    counted (the matmul-class FLOPs the standard path counts)."""
    src = call["src"].shape
    b, t, e = src
    f = call["ffn_weight_1"].shape[0]
    return mha_fused_flops(src, src, call["embed_dim"], True) + 2 * (2 * b * t * e * f)

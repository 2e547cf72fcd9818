"""Temporaries of the fused attention kernels (cuDNN, memory-efficient, flash), forward and backward.
"""

from __future__ import annotations

import torch

from ..rules.registry import OpCall
from ..target import CudaTarget
from .layout import Layout, tensor_bytes, transient

aten = torch.ops.aten

@transient(aten._scaled_dot_product_cudnn_attention)
def _cudnn_attention(call: OpCall, target: CudaTarget, layout: Layout | None = None) -> int:
    """512 B: the reference H100 steps show 512 bytes above the outputs in every cuDNN forward."""
    return 512


@transient(aten._scaled_dot_product_cudnn_attention_backward)
def _cudnn_attention_backward(call: OpCall, target: CudaTarget, layout: Layout | None = None) -> int:
    """2|Q| + |logsumexp| + 512 B, and 2|Q| more with grouped-query heads (the gradients of the K/V heads
    at the query's head count, summed after).  Fitted on the reference H100 steps: GPT-2 (B8 H12
    L1024 D64 bf16) 25,559,552 B; BERT, T5 (B8 H8 L512 D64) 8,520,192 B; Llama (B4, 16 query and 4
    KV heads, L1024 D64) 33,817,088 B: the formula gives each exactly."""
    q, k, lse = call["query"], call["key"], call["logsumexp"]
    gqa = k.shape[-3] != q.shape[-3]
    return (4 if gqa else 2) * tensor_bytes(q) + tensor_bytes(lse) + 512


@transient(aten._scaled_dot_product_efficient_attention_backward)
def _efficient_attention_backward(call: OpCall, target: CudaTarget, layout: Layout | None = None) -> int:
    """|Q in float32| + 2|logsumexp|: the float32 gradient accumulator and the row-wise delta.
    Reference H100 steps (fp32): GPT-2 (B8 H12 L1024 D64) 25,952,256 B, BERT/T5 (B8 H8 L512) 8,650,752 B,
    the examples' GPT (B8 H8 L256) 4,325,376 B: the formula gives each exactly."""
    q, lse = call["query"], call["logsumexp"]
    return tensor_bytes(q, torch.float32) + 2 * tensor_bytes(lse)


@transient(aten._scaled_dot_product_flash_attention_backward)
def _flash_attention_backward(call: OpCall, target: CudaTarget, layout: Layout | None = None) -> int:
    """flash-attn 2's backward buffers (``flash_api.cpp`` ``mha_bwd``): ``softmax_d`` (B, H, L rounded up to
    128) and ``dq_accum`` (B, L rounded to 128, H, D rounded to 32) in float32.  Not measured here (the
    reference GPU runs cuDNN attention)."""
    q = call["query"]
    b, h, length, d = q.shape
    l_r = -(-length // 128) * 128
    d_r = -(-d // 32) * 32
    return 4 * b * h * l_r + 4 * b * l_r * h * d_r

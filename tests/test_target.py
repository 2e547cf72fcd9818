"""Target-device kernels: CUDA's SDPA backend choice, modelled on CPU fake tensors.

The choice follows aten/src/ATen/native/transformers/cuda/sdp_utils.cpp (sm80+):
flash needs fp16/bf16, no mask, head dim <= 256; memory-efficient needs head dims
divisible by 8 (16-bit) or 4 (fp32); math takes the rest.  The saved tensors come
from the CUDA kernels' meta implementations in torch.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from estimator import estimate
from estimator.target import cuda_sdpa_backend


def _qkv(dtype, d=64, heads=4, q_len=32, k_len=32):
    return (torch.empty(2, heads, q_len, d, dtype=dtype, device="meta"),
            torch.empty(2, heads, k_len, d, dtype=dtype, device="meta"),
            torch.empty(2, heads, k_len, d, dtype=dtype, device="meta"))


@pytest.mark.parametrize("dtype,d,mask,causal,q_len,expected", [
    (torch.bfloat16, 64, False, True, 32, "flash"),
    (torch.float16, 256, False, False, 32, "flash"),
    (torch.bfloat16, 64, True, False, 32, "efficient"),  # flash takes no mask
    (torch.bfloat16, 64, False, True, 16, "efficient"),  # flash: causal needs square attention
    (torch.float32, 64, False, True, 32, "efficient"),  # flash is 16-bit only
    (torch.float32, 6, False, False, 32, "math"),  # 6 % 4 != 0
    (torch.bfloat16, 12, True, False, 32, "math"),  # 12 % 8 != 0 and a mask
    (torch.bfloat16, 320, False, False, 32, "efficient"),  # flash: head dim > 256
])
def test_backend_choice(dtype, d, mask, causal, q_len, expected):
    q, k, v = _qkv(dtype, d, q_len=q_len)
    m = torch.ones(q_len, 32, dtype=torch.bool, device="meta") if mask else None
    assert cuda_sdpa_backend(q, k, v, m, causal) == expected


class Attn(torch.nn.Module):
    def __init__(self, d=64, masked=False):
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.masked = masked

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 4, C // 4).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, hs)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril() if self.masked else None
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=not self.masked)  # (B, H, T, hs)
        return y.transpose(1, 2).reshape(B, T, C)


def _attention_ops(report):
    return {str(n.target.overloadpacket).removeprefix("aten.") for n in report.capture.nodes
            if "attention" in str(n.target)}


@pytest.mark.parametrize("precision,masked,forward_op", [
    ("bf16-mixed", False, "_scaled_dot_product_flash_attention"),
    ("fp32", False, "_scaled_dot_product_efficient_attention"),
    ("bf16-mixed", True, "_scaled_dot_product_efficient_attention"),
])
def test_cuda_target_records_the_cuda_kernels(precision, masked, forward_op):
    x = torch.randn(2, 32, 64)
    report = estimate(Attn(masked=masked), x, device="cuda", precision=precision)
    assert _attention_ops(report) == {forward_op, forward_op + "_backward"}
    cpu = estimate(Attn(masked=masked), x, device="cpu", precision=precision)
    assert _attention_ops(cpu) == {"_scaled_dot_product_flash_attention_for_cpu",
                                   "_scaled_dot_product_flash_attention_for_cpu_backward"}
    # The attention FLOPs do not depend on the kernel (torch's sdpa formulas).
    assert report.tally.flops["matmul_forward"] == cpu.tally.flops["matmul_forward"]


def test_math_backend_saves_the_attention_matrix():
    # fp32 with head dim 6: CUDA falls back to math, which saves the (B, H, T, T) probabilities.
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(24, 72)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.proj(x).view(B, T, 3, 4, 6).permute(2, 0, 3, 1, 4)  # 3 x (B, 4, T, 6)
            return F.scaled_dot_product_attention(q, k, v)

    x = torch.randn(2, 64, 24)
    saved = lambda r: sorted(nbytes for nbytes, _ in r.capture.saved.values())  # noqa: E731
    cuda, cpu = estimate(Odd(), x, device="cuda"), estimate(Odd(), x, device="cpu")
    probs = 2 * 4 * 64 * 64 * 4  # B * H * T * T fp32 bytes
    assert probs in saved(cuda) and probs not in saved(cpu)
    assert "_safe_softmax" in {str(n.target.overloadpacket).removeprefix("aten.") for n in cuda.capture.nodes}


def test_checkpointed_regions_use_the_same_kernels_in_recomputation():
    # torch-function modes are off while autograd recomputes a checkpointed region, so the
    # what-if enters the CUDA kernel model inside the region; a model that checkpoints by
    # itself is modelled with the CPU kernels (and says so) rather than failing.
    from torch.utils.checkpoint import checkpoint

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = Attn(), Attn()

        def forward(self, x):
            return checkpoint(self.b, checkpoint(self.a, x, use_reentrant=False), use_reentrant=False)

    x = torch.randn(2, 32, 64)
    what_if = estimate(torch.nn.Sequential(Attn(), Attn()), x, device="cuda", precision="bf16-mixed",
                       checkpoint=Attn, trace="fake")
    assert what_if.checkpoint.flops_added > 0
    own = estimate(Outer(), x, device="cuda", trace="fake")
    assert own.capture.mode == "fake" and "CPU kernels" in own.capture.fallback_reason
    assert _attention_ops(own) == {"_scaled_dot_product_flash_attention_for_cpu",
                                   "_scaled_dot_product_flash_attention_for_cpu_backward"}

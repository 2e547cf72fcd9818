"""Kernels of the target device that differ from the CPU kernels the trace runs.

The step is traced on CPU (fake) tensors.  Where the CUDA build of PyTorch
would run a different kernel with different saved tensors, a
``TorchFunctionMode`` routes the call to the CUDA kernel's aten op instead;
its meta implementation gives the CUDA output and saved-tensor shapes, and
autograd then records the CUDA backward op.

* ``F.scaled_dot_product_attention``: the backend CUDA's dispatcher picks
  (``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``, sm80+, default
  priority flash > memory-efficient > math):

  - flash (``_scaled_dot_product_flash_attention``): fp16/bf16, no
    ``attn_mask``, equal head dims <= 256, causal only for square attention;
    saves the output and a float32 logsumexp (B, H, L) - no L x S matrix;
  - memory-efficient (``_scaled_dot_product_efficient_attention``): fp32, fp16
    or bf16, head dims divisible by 8 (16-bit) or 4 (fp32), masks allowed
    (a boolean mask becomes an additive bias); logsumexp padded to 32 rows;
  - math (``_scaled_dot_product_attention_math``): everything else; saves the
    L x S attention probabilities.

  On sm90/sm100 with cuDNN >= 9.15.1 recent PyTorch prefers cuDNN attention,
  whose saved tensors (output, float32 logsumexp) have the sizes of flash's;
  the flash op stands for it.
* Batch norm: cuDNN's ``cudnn_batch_norm`` saves the same mean and inverse
  standard deviation as the native kernel the trace runs (its reserve space is
  empty for plain batch norm), so nothing is rerouted.
* Optimizers: CUDA defaults to the foreach implementation; the capture asks
  for it (``foreach=True``) when the target is CUDA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def cuda_sdpa_backend(query, key, value, attn_mask=None, is_causal=False) -> str:
    """``"flash"``, ``"efficient"`` or ``"math"``: what CUDA (sm80+) picks for these inputs."""
    dims = (query.shape[-1], key.shape[-1], value.shape[-1])
    dtype = query.dtype
    four_d = query.dim() == key.dim() == value.dim() == 4
    square = query.shape[-2] == key.shape[-2]
    if (four_d and attn_mask is None and dtype in _LOW_PRECISION and dims[0] == dims[1] == dims[2] <= 256
            and (square or not is_causal)):
        return "flash"
    alignment = 8 if dtype in _LOW_PRECISION else 4
    if (four_d and dtype in (torch.float32, *_LOW_PRECISION) and dims[0] == dims[1]
            and dims[0] % alignment == 0 and dims[2] % alignment == 0 and dims[0] > 0 and dims[2] > 0):
        return "efficient"
    return "math"


def _bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask as the additive bias the efficient kernel takes (True keeps, False masks)."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
    return mask


class CudaKernels(TorchFunctionMode):
    """Route the ops whose CUDA kernels save different tensors to those kernels' aten ops."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return self._sdpa(*args, **kwargs)
        return func(*args, **kwargs)

    @staticmethod
    def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if torch.is_autocast_enabled("cpu"):  # SDPA is on autocast's lower-precision list: cast as it would
            low = torch.get_autocast_dtype("cpu")
            query, key, value = (t.to(low) if t.is_floating_point() else t for t in (query, key, value))
        backend = cuda_sdpa_backend(query, key, value, attn_mask, is_causal)
        if backend == "flash":
            return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False,
                                                            scale=scale)[0]
        if backend == "efficient":
            if enable_gqa and key.shape[-3] != query.shape[-3]:  # the kernel wants as many K/V heads as Q heads
                repeat = query.shape[-3] // key.shape[-3]
                key = key.repeat_interleave(repeat, dim=-3)
                value = value.repeat_interleave(repeat, dim=-3)
            bias = None if attn_mask is None else _bias(attn_mask, query.dtype).expand(
                query.shape[0], query.shape[1], query.shape[2], key.shape[2])
            needs_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
            return aten._scaled_dot_product_efficient_attention(query, key, value, bias, needs_lse, dropout_p,
                                                                is_causal, scale=scale)[0]
        return aten._scaled_dot_product_attention_math(query, key, value, attn_mask, dropout_p, is_causal, None,
                                                       scale=scale, enable_gqa=enable_gqa)[0]

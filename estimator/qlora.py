"""Four-bit frozen base weights for QLoRA fine-tuning, as bitsandbytes' ``Linear4bit`` holds and runs them, on any
device (fake and meta tensors included): :class:`Linear4bit` stands in for ``bnb.nn.Linear4bit`` (bitsandbytes
0.50, ``bitsandbytes/nn/modules.py`` and ``autograd/_functions.py``), :func:`quantize_linears` puts one in place of
every Linear layer but the output head (transformers' ``replace_with_bnb_linear`` and ``get_keys_to_not_convert``).

What it holds, per layer of ``out x in`` weights (``functional.quantize_4bit``, blocks of 64):

* the packed weight, two 4-bit values per byte: a frozen uint8 parameter of ``ceil(out x in / 2) x 1``;
* without double quantization (``bnb_4bit_use_double_quant=False``, transformers' default): one float32 absmax per
  block; with it (QLoRA's recipe): one uint8 absmax per block, their float32 mean (``offset``) and, per 256 of
  them, one float32 absmax with its own 256-entry float32 code (``quantize_blockwise``, ``code.to(copy=True)``);
* the 16-entry float32 code of NF4 or FP4.

What it runs (the paths bitsandbytes takes on CUDA past 1,536 tokens per micro-batch, and on the CPU):

* forward: the input cast to the compute dtype; the absmax dequantized (double quantization: a new float32 tensor
  plus the offset), the weight dequantized to the compute dtype (a temporary of ``out x in``), ``F.linear``; saved
  for backward: nothing but the packed weight (``MatMul4Bit``: ``ctx.tensors = (None, B)``), and only when the input
  needs a gradient; the output cast back to the input's dtype;
* backward: the weight dequantized again, in the dtype it had when quantized (``F.dequantize_4bit``; the absmax
  plus the offset in place), cast to the gradient's dtype, ``grad_output @ W``; no weight gradient.

The two dequantizations are :data:`DEQUANTIZE_4BIT` and :data:`DEQUANTIZE_BLOCKWISE`, custom ops with a shape-only
implementation (the values are not modelled) and cost rules (one multiply per element: the code's value times its
block's absmax); timed as memory-bound kernels.  The statistics keep their dtype under a precision cast, as
bitsandbytes' ``QuantState`` (not a parameter or buffer) does.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .layers import linear_dims, linear_layers
from .precision import keep_dtype
from .rules import MATMUL, OTHER, register

BLOCKSIZE = 64  # bitsandbytes' default blocksize for 4-bit weights
NESTED_BLOCKSIZE = 256  # double quantization: absmax values per second-level block


@torch.library.custom_op("estimator::dequantize_4bit", mutates_args=())
def dequantize_4bit(packed: torch.Tensor, absmax: torch.Tensor, rows: int, cols: int,
                    dtype: torch.dtype) -> torch.Tensor:
    """``rows x cols`` weights of ``dtype`` from two 4-bit codes per byte of ``packed`` and one float32 ``absmax``
    per block (bitsandbytes' ``dequantize_4bit``); values not modelled."""
    return torch.zeros((rows, cols), dtype=dtype, device=packed.device)


@dequantize_4bit.register_fake
def _(packed, absmax, rows, cols, dtype):
    return packed.new_empty((rows, cols), dtype=dtype)


@torch.library.custom_op("estimator::dequantize_blockwise", mutates_args=())
def dequantize_blockwise(quantized: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """float32 values from 8-bit codes of ``quantized``, one ``absmax`` per 256 (bitsandbytes'
    ``dequantize_blockwise``: double quantization's absmax); values not modelled."""
    return torch.zeros(quantized.shape, dtype=torch.float32, device=quantized.device)


@dequantize_blockwise.register_fake
def _(quantized, absmax, code):
    return quantized.new_empty(quantized.shape, dtype=torch.float32)


@torch.library.custom_op("estimator::gemm_4bit", mutates_args=())
def gemm_4bit(x: torch.Tensor, packed: torch.Tensor, absmax: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``x @ W.T`` with ``W`` (``rows x cols``) read in its 4-bit form (bitsandbytes' fused ``gemm_4bit`` kernels: no
    dequantized copy of the weight); values not modelled."""
    return torch.zeros((*x.shape[:-1], rows), dtype=x.dtype, device=x.device)


@gemm_4bit.register_fake
def _(x, packed, absmax, rows, cols):
    return x.new_empty((*x.shape[:-1], rows))


DEQUANTIZE_4BIT = torch.ops.estimator.dequantize_4bit
DEQUANTIZE_BLOCKWISE = torch.ops.estimator.dequantize_blockwise
GEMM_4BIT = torch.ops.estimator.gemm_4bit
# bitsandbytes 0.50's fused inference kernel on CUDA takes at most this many rows (``_GEMM_4BIT_CUSTOM_FLOOR_M``:
# always fused up to 4; 5 to 1,536 by a per-architecture heuristic, taken here as the dequantize-and-F.linear
# fallback it picks on an H100 past a few rows; above 1,536 that fallback)
CUDA_FUSED_ROWS = 4


@register(GEMM_4BIT, kind=MATMUL)
def gemm_4bit_flops(call) -> int:
    """``2 x rows x out x in`` (a matmul's multiply-adds, as ``F.linear`` on the dequantized weight counts them)."""
    return 2 * call.out.numel * call["cols"]


@register(DEQUANTIZE_4BIT, DEQUANTIZE_BLOCKWISE, kind=OTHER)
def dequantize_flops(call) -> int:
    """One multiply per value made: its code's value times its block's absmax (bitsandbytes' kernels)."""
    return call.out.numel


def _stat(numel: int, device: Any, dtype: torch.dtype = torch.float32, shape: tuple[int, ...] | None = None):
    return keep_dtype(torch.empty(shape if shape is not None else (numel,), dtype=dtype, device=device))


class Linear4bit(nn.Module):
    """bitsandbytes' ``Linear4bit`` as it holds and runs a frozen 4-bit weight (see the module docstring)."""

    def __init__(self, in_features: int, out_features: int, bias: nn.Parameter | None, compute_dtype: torch.dtype,
                 quant_dtype: torch.dtype, double_quant: bool, device: Any = "meta", quant_type: str = "nf4",
                 fused_rows: float = 0):
        super().__init__()
        self.fused_rows = fused_rows  # inference: up to this many input rows run the fused kernel (gemm_4bit)
        self.in_features, self.out_features, self.quant_type = in_features, out_features, quant_type
        self.compute_dtype, self.quant_dtype, self.double_quant = compute_dtype, quant_dtype, double_quant
        n = in_features * out_features
        blocks = math.ceil(n / BLOCKSIZE)
        self.weight = nn.Parameter(torch.empty(((n + 1) // 2, 1), dtype=torch.uint8, device=device),
                                   requires_grad=False)
        self.bias = bias
        self.register_buffer("code", _stat(16, device))
        if double_quant:
            self.register_buffer("absmax", torch.empty(blocks, dtype=torch.uint8, device=device))
            self.register_buffer("offset", _stat(1, device, shape=()))
            self.register_buffer("absmax2", _stat(math.ceil(blocks / NESTED_BLOCKSIZE), device))
            self.register_buffer("code2", _stat(256, device))
        else:
            self.register_buffer("absmax", _stat(blocks, device))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, {self.quant_type}, "
                f"compute_dtype={self.compute_dtype}, double_quant={self.double_quant}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inp_dtype = x.dtype
        x = x.to(self.compute_dtype)
        bias = None if self.bias is None else self.bias.to(self.compute_dtype)
        needs_grad = torch.is_grad_enabled() and (x.requires_grad or (bias is not None and bias.requires_grad))
        out = _MatMul4Bit.apply(x, bias, self) if needs_grad else self.gemm(x, bias)
        return out.to(inp_dtype)

    def gemm(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``gemm_4bit``: the fused kernel up to :attr:`fused_rows` input rows (no gradient), else its
        dequantize-then-``F.linear`` path (``_dequant_linear_fallback``, the default impl)."""
        if x.numel() <= self.fused_rows * self.in_features and not torch.is_grad_enabled():
            absmax = self.absmax if not self.double_quant else self.absmax2
            out = GEMM_4BIT(x, self.weight, absmax, self.out_features, self.in_features)
            # (the bias added into the output: in place on the CPU, ``result += bias``; fused on CUDA)
            return out if bias is None else out.add_(bias)
        absmax = self.absmax
        if self.double_quant:
            absmax = DEQUANTIZE_BLOCKWISE(self.absmax, self.absmax2, self.code2) + self.offset
        w = DEQUANTIZE_4BIT(self.weight, absmax, self.out_features, self.in_features, x.dtype)
        return F.linear(x, w, bias)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """``F.dequantize_4bit(B, quant_state).to(dtype)``: the backward's weight."""
        absmax = self.absmax
        if self.double_quant:
            absmax = DEQUANTIZE_BLOCKWISE(self.absmax, self.absmax2, self.code2)
            absmax += self.offset
        w = DEQUANTIZE_4BIT(self.weight, absmax, self.out_features, self.in_features, self.quant_dtype)
        return w.to(dtype)


class _MatMul4Bit(torch.autograd.Function):
    """bitsandbytes' ``MatMul4Bit``: saves no activation; the input's gradient from the weight dequantized again."""

    @staticmethod
    def forward(ctx, x, bias, layer):
        ctx.layer, ctx.bias_dtype = layer, None if bias is None else bias.dtype
        return layer.gemm(x, bias)

    @staticmethod
    def backward(ctx, grad_output):
        grad_bias = grad_output.sum(0, dtype=ctx.bias_dtype) if ctx.needs_input_grad[1] else None
        grad_x = torch.matmul(grad_output, ctx.layer.dequantized(grad_output.dtype)) \
            if ctx.needs_input_grad[0] else None
        return grad_x, grad_bias, None


def quantized_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(path, layer) of every Linear layer of ``model`` bitsandbytes quantizes: all but the output head and the
    modules a transformers model keeps in float32 (``_keep_in_fp32_modules``, e.g. T5's ``wo``: transformers'
    bitsandbytes quantizer leaves them out too)."""
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ()) | \
        set(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    return [(path, m) for path, m in linear_layers(model) if not keep & set(path.split("."))]


def quantize_linears(model: nn.Module, compute_dtype: torch.dtype, quant_dtype: torch.dtype,
                     double_quant: bool, fused_rows: float = 0) -> dict[str, Linear4bit]:
    """:class:`Linear4bit` stand-ins, by path, for the layers of :func:`quantized_layers`; the replacements (the
    model is not changed)."""
    out = {}
    for path, m in quantized_layers(model):
        bias = m.bias
        if bias is not None:  # frozen with the base, as peft's bias="none" leaves it
            bias = nn.Parameter(bias.detach(), requires_grad=False)
        out[path] = Linear4bit(*linear_dims(m), bias, compute_dtype, quant_dtype, double_quant, device=m.weight.device,
                               fused_rows=fused_rows)
    return out

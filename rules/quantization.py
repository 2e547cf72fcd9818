"""Quantization-aware training's fake quantization (OTHER): ``torch.ao.quantization``'s ``FakeQuantize`` and
``FusedMovingAvgObsFakeQuantize`` (the default QAT qconfigs' module) and the learnable (LSQ) variant.

Per element of the input, as ATen's CPU and CUDA kernels compute it (``aten/src/ATen/native/quantized/
FakeQuantPerTensorAffine.cpp``, ``.../cpu/kernels/QuantizedOpKernels.cpp``)::

    q = clamp(round(x * inv_scale) + zero_point, quant_min, quant_max)      # mul, round, add, 2 compares
    y = (q - zero_point) * scale                                            # sub, mul

7 FLOPs (the cached mask is the clamp's two comparisons).  The moving-average observer fused in front of it
(``_fused_moving_avg_obs_fq_helper``) adds a min and a max over the input: 2 per element (the running statistics
and the scale are a few scalar ops).  The learnable variant's backward recomputes ``x * inv_scale + zero_point``
and its rounding and clamp mask (5), then per element the input's gradient (grad * mask: 1), the scale's
(grad times round(x/s) - x/s inside the range or the clamped bound minus zero_point outside: 4) and the zero
point's (grad times -scale outside the range: 2), and sums the two over the tensor (2): 14.
"""

from __future__ import annotations

from .registry import OTHER, aten_ops, register

FAKE_QUANT = 7  # mul, round, add, clamp (2), sub, mul
OBSERVER = 2  # min and max
LEARNABLE_BACKWARD = 14


@register(*aten_ops("fake_quantize_per_tensor_affine", "fake_quantize_per_tensor_affine_cachemask",
                    "_fake_quantize_per_tensor_affine_cachemask_tensor_qparams", "fake_quantize_per_channel_affine",
                    "fake_quantize_per_channel_affine_cachemask", "_fake_quantize_learnable_per_tensor_affine",
                    "_fake_quantize_learnable_per_channel_affine"), kind=OTHER)
def fake_quantize(call):
    """7 per element: quantize (scale, round, shift, clamp) and dequantize (shift, scale)."""
    return FAKE_QUANT * call["self"].numel


@register(*aten_ops("_fused_moving_avg_obs_fq_helper"), kind=OTHER)
def fused_observer_fake_quantize(call):
    """9 per element: the observer's min and max (counted as on: the training default; ``observer_on`` is a tensor
    whose value the trace does not read), then the fake quantization's 7."""
    return (OBSERVER + FAKE_QUANT) * call["self"].numel


@register(*aten_ops("_fake_quantize_learnable_per_tensor_affine_backward",
                    "_fake_quantize_learnable_per_channel_affine_backward"), kind=OTHER)
def learnable_fake_quantize_backward(call):
    """14 per element: the forward's scale, round and clamp mask recomputed, the input's, scale's and zero point's
    gradients, the latter two summed."""
    return LEARNABLE_BACKWARD * call["self"].numel

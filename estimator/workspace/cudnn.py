"""cuDNN workspaces of convolutions (forward and backward, by algorithm family) and recurrent layers.
"""

from __future__ import annotations

import torch

from ..rules.registry import OpCall, TensorSpec
from ..target import CudaTarget
from .layout import BLOCK, Layout, copy_unless_contiguous, is_contiguous, numel_of, rounded, transient
from .reductions import acc_bytes, reduction_bytes

aten = torch.ops.aten

@transient(aten._cudnn_rnn, aten._cudnn_rnn_backward)
def _cudnn_rnn_workspace(call: OpCall, target: CudaTarget, layout: Layout | None = None) -> int:
    """cuDNN's RNN workspace, scaled from the one configuration measured (reference H100 steps: a 2-layer
    LSTM, hidden 512, 128 steps, batch 16: forward 57,672,192 B in float32, 37,028,352 B in float16;
    backward 131,072 B / 65,536 B more): ``a + b x itemsize`` per layer, step, sequence and hidden unit
    (a = 16,384,512, b = 10,321,920 for those 2 x 128 x 16 x 512 = 2,097,152 units)."""
    input = call["input"]
    weight = call["weight"]
    hidden, layers = call["hidden_size"], call["num_layers"]
    directions = 2 if call["bidirectional"] else 1
    seq, batch = (input.shape[1], input.shape[0]) if call["batch_first"] else (input.shape[0], input.shape[1])
    units = layers * directions * seq * batch * hidden
    itemsize = input.dtype.itemsize
    forward = units / 2_097_152 * (16_384_512 + 10_321_920 * itemsize)
    backward = 65_536 * itemsize / 2 * units / 2_097_152 if call.op.overloadpacket is aten._cudnn_rnn_backward else 0
    return int(forward + backward) if weight else 0


# -- convolutions: cuDNN (Conv_v8.cpp), by algorithm family ---------------------------------------------
#
# cuDNN picks the convolution engine by heuristics that only a GPU can query, so these rules model
# the families the reference H100 steps show (torch 2.11, cuDNN 9.19, NCHW tensors, TF32 allowed for
# float32), each with the workspace its data layout implies:
#
# * **layout transform** (NHWC-native engines on NCHW tensors): the workspace holds the transposed
#   input, the transposed weight (a 1x1 weight has the same layout either way) and the output in
#   NHWC, transposed back at the end; plus one 512-byte block.  Forward: |x| + |w'| + |y| + 512;
#   backward (dgrad reads dy and w and writes dx; wgrad reads dy and x and writes dw; dx is
#   allocated before dgrad runs, dw after): |dy| + |x| + |w'| + 512 for either or both.
# * **pointwise GEMM** (1x1, stride 1): NCHW is already a per-image GEMM; forward needs nothing
#   (0, or 512 B for float32); wgrad accumulates one float partial dw per image: N * K * C * 4 B.
# * **depthwise / grouped** (ATen's own kernels or cuDNN's grouped ones): 0 in every reference step.
# * **few input channels** (C < 8, the stem): 3x3 kernels run on a direct kernel (0); larger kernels
#   pad the channels for tensor cores (bfloat16 to 8, float16 to 4: :func:`_stem_channels`):
#   |x| * pad / C + |w| * pad / C + |y| + 512; float32 keeps C in the forward (|x| + |w| + |y|) and
#   pads to 4 in wgrad.
#
# Which family a convolution gets (cuDNN's choice, fitted on the reference steps):
#
# * forward 1x1, stride 1: the transform when the image has 2..195 positions (below 14x14) and both
#   channel counts are >= 128 (ResNet's 7x7 layer4), else the GEMM; a 1x1 image is a plain GEMM (0);
#   1x1 with a stride: the transform without the weight, |x| + |y| + 512;
# * backward 1x1, stride 1: the family whose workspace is smaller, min(|dy| + |x| + 512, N*K*C*4):
#   per-image GEMMs win when the image is large against the channels (every 28x28 and larger ResNet
#   / MobileNet layer), the transform on 7x7;
# * every other kernel shape (3x3, 7x7 with C >= 8, strides): the transform.
#
# Figures (tests/test_workspace.py measures them on every reference op; "within": exact, or at most
# the allocator's unsplit 1 MiB above a prediction holding a large request):
#
# * forward: 451 of 597 ops exact, 490 within; |error| summed over the 597 ops 1,066 MiB = 6.2 % of
#   the 16.9 GiB measured (663 MiB over, 404 under); the largest misses: ResNet-50's float32 strided
#   1x1 downsample 56x56 -> 28x28 (cuDNN transforms the input and weight, not the output: +|y| - |w|,
#   391.5 MiB at batch 256, 97.5 at 64; the 28x28 and 14x14 ones do transform the output) and the
#   16-bit [N, 1024, 14, 14] -> 512 1x1 (transformed although 14x14: -(|x| + |y|), 147 MiB at 256);
# * backward: 205 of 491 exact, 298 within; |error| 1,055 MiB = 4.3 % of 24.0 GiB, all of it under:
#   a lower bound on every reference op, the engines adding split-K buffers of 0..16 MiB (most often
#   2, 6.8 or 8 MiB) that depend on the kernel chosen (ResNet-50 b256 bf16 layer3 3x3: +15.8 MiB
#   over 50.1 MiB; the largest, 16.0 MiB, on its strided 1x1 over 294 MiB).

_CONV_MIN_CHANNELS = 8  # fewer input channels: the stem families above
_POINTWISE_TRANSFORM_BELOW = 196  # positions per image (14x14) under which a 1x1 forward transforms
_POINTWISE_TRANSFORM_CHANNELS = 128


def _stem_channels(dtype: torch.dtype) -> int:
    """Channels a 16-bit stem is padded to: 4 for float16 (cuDNN's C=4 first-layer kernels), 8 for
    bfloat16.  Reference H100 ResNet-50 b64 stem forward: float16 |x|*4/3 + |w|*4/3 + |y| + 512 =
    128,476,160 B, bfloat16 |x|*8/3 + |w|*8/3 + |y| + 512 = 154,191,360 B (measured 155,189,248:
    the allocator's slack), exactly."""
    return 4 if dtype == torch.float16 else _CONV_MIN_CHANNELS


def _channels_last(spec: TensorSpec | None, strides: tuple[int, ...]) -> bool:
    """A 4-D/5-D tensor laid out channels-last (strides decreasing over N, spatial..., C) and not also
    contiguous (an [N, C, 1, 1] tensor is both: NCHW, as ``suggest_memory_format`` takes it)."""
    if spec is None or spec.ndim < 4 or len(strides) != spec.ndim or is_contiguous(spec.shape, strides):
        return False
    return strides[1] == 1 and is_contiguous(tuple(spec.shape[i] for i in (0, *range(2, spec.ndim), 1)),
                                              tuple(strides[i] for i in (0, *range(2, spec.ndim), 1)))


def _conv_geometry(x: TensorSpec, w: TensorSpec, transposed: bool) -> tuple[int, int, int, int, int]:
    """(N, C_in, C_out, positions per input image, kernel positions) of a convolution."""
    n = x.shape[0] if x.ndim == w.ndim else 1
    c_in = x.shape[1] if x.ndim == w.ndim else x.shape[0]
    k_out = w.shape[1] * (x.shape[1] // max(w.shape[0], 1)) if transposed else w.shape[0]
    positions = numel_of(x.shape[2:] if x.ndim == w.ndim else x.shape[1:])
    return n, c_in, k_out, positions, numel_of(w.shape[2:])


def _cudnn_eligible(x: TensorSpec, w: TensorSpec, groups: int) -> bool:
    """cuDNN runs it with the families above: a float/half/bfloat16 convolution without groups."""
    return groups == 1 and x.dtype in (torch.float32, torch.float16, torch.bfloat16) and w.ndim >= 3


def _stride_of(call: OpCall) -> int:
    stride = call.get("stride") or (1,)
    return max(stride) if isinstance(stride, (list, tuple)) else int(stride)


@transient(aten.convolution, aten.cudnn_convolution, aten._convolution)
def _convolution(call: OpCall, target: CudaTarget, layout: Layout) -> int:
    """cuDNN forward workspace by algorithm family (see the section comment): |x| + |w'| + |y| + 512
    for the layout transform (3x3 and larger kernels, strided or small-image 1x1 convolutions),
    0 / 512 for a stride-1 1x1 GEMM, 0 for grouped and depthwise ones, channel-padded for C < 8."""
    x = call.get("input", call.get("self"))  # cudnn_convolution names its input "self"
    w = call["weight"]
    if x is None or w is None or not call.outputs:
        return 0
    y = call.out
    groups = int(call.get("groups", 1) or 1)
    if not _cudnn_eligible(x, w, groups):
        return 0
    transposed = bool(call.get("transposed", False))
    strides_x = layout.stride("input" if "input" in call.args else "self", x)
    copy = 0 if _channels_last(x, strides_x) else copy_unless_contiguous(x, strides_x)
    if _channels_last(x, strides_x):
        return BLOCK  # NHWC engines take it as it is
    n, c, k, positions, kernel = _conv_geometry(x, w, transposed)
    xb, wb, yb = rounded(x.nbytes), rounded(w.nbytes), rounded(y.nbytes)
    if c < _CONV_MIN_CHANNELS and not transposed:
        if kernel <= 9:
            return copy  # direct kernel
        if x.itemsize != 2:
            return copy + xb + wb + yb  # float32: transposed as they are
        pad = _stem_channels(x.dtype)
        return copy + rounded(x.nbytes // c * pad) + rounded(w.nbytes // c * pad) + yb + BLOCK
    if kernel == 1:
        if positions == 1:
            return copy  # one position per image: a plain GEMM
        if _stride_of(call) > 1:
            return copy + xb + yb + BLOCK  # strided: transposed input and output
        if positions < _POINTWISE_TRANSFORM_BELOW and min(c, k) >= _POINTWISE_TRANSFORM_CHANNELS:
            return copy + xb + yb + BLOCK
        return copy + (BLOCK if x.dtype == torch.float32 else 0)
    return copy + xb + wb + yb + BLOCK


@transient(aten.convolution_backward)
def _convolution_backward(call: OpCall, target: CudaTarget, layout: Layout) -> int:
    """cuDNN backward workspaces by algorithm family (see the section comment): |dy| + |x| + |w'| + 512
    for the layout transform, min(that, N * K * C * 4) for a stride-1 1x1 (per-image float partial
    weight gradients), 0 for grouped/depthwise and 1x1-image convolutions; plus the grad-bias sum's
    buffer (:func:`reduction_bytes`) when asked for, whichever is larger."""
    dy, x, w = call["grad_output"], call["input"], call["weight"]
    if dy is None or x is None or w is None:
        return 0
    mask = list(call.get("output_mask") or (True, True, False))
    bias = 0
    if len(mask) > 2 and mask[2] and dy.ndim >= 2:
        dims = {0, *range(2, dy.ndim)}
        bias = reduction_bytes(dy.shape, layout.stride("grad_output", dy), dims, dy.itemsize,
                               acc_bytes(dy.dtype), dy.itemsize, target, 8 if dy.itemsize == 2 else 4)
    groups = int(call.get("groups", 1) or 1)
    if not _cudnn_eligible(x, w, groups) or not (mask[0] or mask[1]):
        return bias
    transposed = bool(call.get("transposed", False))
    sdy, sx = layout.stride("grad_output", dy), layout.stride("input", x)
    if _channels_last(x, sx):
        return max(bias, BLOCK)
    copies = copy_unless_contiguous(dy, sdy) + copy_unless_contiguous(x, sx)
    n, c, k, positions, kernel = _conv_geometry(x, w, transposed)
    dyb, xb, wb = rounded(dy.nbytes), rounded(x.nbytes), rounded(w.nbytes)
    if c < _CONV_MIN_CHANNELS and not transposed:
        if x.dtype == torch.float32 and kernel <= 9:
            return max(bias, copies)
        pad = 4 if x.dtype == torch.float32 else _stem_channels(x.dtype)
        return max(bias, copies + dyb + rounded(x.nbytes // c * pad) + BLOCK)
    if kernel == 1 and positions == 1:
        return max(bias, copies)
    transform = dyb + xb + (0 if kernel == 1 else wb) + BLOCK
    if kernel == 1 and _stride_of(call) == 1:
        per_image = n * k * c * 4 if mask[1] else 0  # wgrad: one float dw per image, then summed
        return max(bias, copies + min(transform, per_image))
    return max(bias, copies + transform)

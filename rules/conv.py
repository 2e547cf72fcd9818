"""Convolutions, forward and backward (matmul class).

On CPU in torch 2.13 every ``nn.Conv1d/2d/3d`` and ``nn.ConvTranspose1d/2d/3d``
(grouped, depthwise, dilated, strided alike) reaches the dispatcher as
``aten.convolution`` and ``aten.convolution_backward``; the backend-specific
forward ops (cudnn, mkldnn, miopen, slow/thnn) are covered too for captures
that reach them directly.

One multiply-add (2 FLOPs) per (output position, weight element) pair, as in
``torch.utils.flop_counter``; the bias add is not counted.  The weight shape
carries the groups (``[C_out, C_in/groups, *k]``, or ``[C_in, C_out/groups, *k]``
when transposed), so the formula is right for grouped and depthwise convs.

``convolution_backward`` differs from ``FlopCounterMode`` on purpose: torch's
grad-weight formula ignores ``groups`` (``groups`` times too many FLOPs: 17x
over on mobilenet_v3_small); here grad_weight, like grad_input, costs exactly
the forward convolution's FLOPs, groups included.
"""

from __future__ import annotations

from math import prod

from .registry import MATMUL, aten_ops, register

# -- math helpers (pure functions of shapes) ---------------------------------


def conv_flops(x_shape, w_shape, out_shape, transposed: bool = False) -> int:
    """FLOPs of a convolution: 2 * batch * prod(grid) * weight.numel.

    ``grid`` is the output's spatial grid for a convolution and the input's for
    a transposed convolution (each input position scatters the whole kernel).
    An unbatched input (one dim fewer than the weight) has batch 1.
    """
    # weight [C_out, C_in/g, *k]: each output position of each image does C_out*C_in/g*prod(k) multiply-adds
    batched = len(x_shape) == len(w_shape)
    grid_of = x_shape if transposed else out_shape
    batch = grid_of[0] if batched else 1
    grid = grid_of[2:] if batched else grid_of[1:]
    return 2 * batch * prod(grid) * prod(w_shape)


def conv_backward_flops(grad_out_shape, x_shape, w_shape, transposed: bool, output_mask) -> int:
    """FLOPs of a convolution's backward: one forward's worth per requested gradient.

    grad_input is the transposed convolution of grad_output with the weight and
    grad_weight the convolution of the input with grad_output: both pair every
    weight element with every output position once, like the forward.  grad_bias
    (a sum of grad_output) is not counted, like the bias add.
    """
    # grad_input: conv_transpose(grad_out, w); grad_weight: conv(x, grad_out); each = forward multiply-adds
    forward = conv_flops(x_shape, w_shape, grad_out_shape, transposed)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def _input(call):
    x = call.get("input")
    return x if x is not None else call["self"]


# -- rules ---------------------------------------------------------------------


@register(*aten_ops("convolution", "_convolution", "convolution_overrideable"), kind=MATMUL)
def convolution(call):
    """2*N*prod(out_spatial)*weight.numel (transposed: prod(in_spatial)); bias not counted."""
    return conv_flops(call["input"].shape, call["weight"].shape, call.out.shape, bool(call["transposed"]))


@register(
    *aten_ops(
        "cudnn_convolution", "cudnn_convolution_relu", "cudnn_convolution_add_relu",
        "mkldnn_convolution", "miopen_convolution", "miopen_depthwise_convolution",
        "miopen_convolution_relu", "miopen_convolution_add_relu", "_mps_convolution",
        "_slow_conv2d_forward", "thnn_conv2d", "slow_conv3d", "slow_conv3d_forward",
        "_conv_depthwise2d", "conv_depthwise3d", "slow_conv_dilated2d", "slow_conv_dilated3d",
        "_nnpack_spatial_convolution",
    ),
    kind=MATMUL,
)
def backend_convolution(call):
    """2*N*prod(out_spatial)*weight.numel; bias, add and relu not counted."""
    return conv_flops(_input(call).shape, call["weight"].shape, call.out.shape, transposed=False)


@register(
    *aten_ops(
        "cudnn_convolution_transpose", "miopen_convolution_transpose", "_mps_convolution_transpose",
        "slow_conv_transpose2d", "slow_conv_transpose3d",
    ),
    kind=MATMUL,
)
def backend_conv_transpose(call):
    """2*N*prod(in_spatial)*weight.numel: each input position scatters the whole kernel; bias not counted."""
    return conv_flops(_input(call).shape, call["weight"].shape, call.out.shape, transposed=True)


@register(*aten_ops("convolution_backward", "convolution_backward_overrideable"), kind=MATMUL)
def convolution_backward(call):
    """(output_mask[0] + output_mask[1]) * forward conv FLOPs (groups included); grad_bias not counted."""
    return conv_backward_flops(
        call["grad_output"].shape, call["input"].shape, call["weight"].shape,
        bool(call["transposed"]), call["output_mask"],
    )


@register(*aten_ops("_slow_conv2d_backward"), kind=MATMUL)
def slow_conv2d_backward(call):
    """(grad_input wanted + grad_weight wanted) * forward conv FLOPs; grad_bias not counted."""
    mask = call.get("output_mask")
    if mask is None:  # the .grad_input overload: the outputs requested are the ones passed
        mask = (call.get("grad_input") is not None, call.get("grad_weight") is not None)
    return conv_backward_flops(call["grad_output"].shape, call["self"].shape, call["weight"].shape, False, mask)

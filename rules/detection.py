"""torchvision's detection ops (OTHER): ``nms``, ``roi_align`` and its backward.

torchvision defines them in the ``torchvision`` op namespace when it is imported, which the estimator
never does itself (a 2-second import, and a torchvision built for another torch fails to import): the
registry calls :func:`register_torchvision` the first time it meets an op of that namespace.

* ``nms(dets [N, 4], scores [N], iou_threshold)``: the kernel sorts the scores and compares each box it
  keeps with every later box; counted is the upper bound, every pair compared once: N(N-1)/2 pairs of
  13 FLOPs (the intersection's corners: 4 min/max; its width and height: 2 subtractions, 2 clamps at
  0; its area: 1 multiply; the union: 2 add/subtract of the boxes' areas, computed once per box and not
  counted; the IoU: 1 divide; the threshold: 1 comparison).  The real count is lower by the boxes
  suppressed early, which depends on the boxes' values.
* ``roi_align(input [N, C, H, W], rois [K, 5], ..., pooled_height, pooled_width, sampling_ratio)``: each
  output element [K, C, ph, pw] averages s*s bilinear samples (4 taps: 7 FLOPs, plus 1 add into the
  sum) and divides once: 8*s*s + 1.  s is ``sampling_ratio``; when it is <= 0 the kernel takes
  ceil(roi size / pooled size) per roi, which depends on the boxes: 2 is assumed (torchvision's
  detection heads pass 2).
* ``_roi_align_backward(grad [K, C, ph, pw], ...)``: each grad element is spread over the same s*s
  samples' 4 taps, a multiply and an add each, and divided once: 8*s*s + 1.
"""

from __future__ import annotations

import torch

from .registry import OTHER, lookup, register, register_late

NMS_FLOPS_PER_PAIR = 13
ADAPTIVE_SAMPLING = 2  # samples per bin side assumed when sampling_ratio <= 0 (data-dependent)


def nms_flops(n: int) -> int:
    """Every pair of n boxes compared once: n(n-1)/2 IoUs of 13 FLOPs (the upper bound)."""
    return NMS_FLOPS_PER_PAIR * n * (n - 1) // 2


def roi_align_flops(out_numel: int, sampling_ratio: int) -> int:
    """8*s*s + 1 per output element: s*s bilinear samples (7 FLOPs each, 1 add into the sum), 1 divide."""
    s = sampling_ratio if sampling_ratio > 0 else ADAPTIVE_SAMPLING
    return out_numel * (8 * s * s + 1)


def nms(call):
    """13 * N(N-1)/2: every pair of N boxes' IoU (the upper bound; suppressed boxes are skipped)."""
    return nms_flops(call["dets"].shape[0])


def roi_align(call):
    """(8*s*s + 1) per output element: s*s bilinear samples averaged (s = sampling_ratio, 2 if <= 0)."""
    return roi_align_flops(call.out.numel, int(call["sampling_ratio"]))


def roi_align_backward(call):
    """(8*s*s + 1) per grad element: spread over s*s samples' 4 taps (multiply, add), 1 divide."""
    return roi_align_flops(call["grad"].numel, int(call["sampling_ratio"]))


TORCHVISION = {"nms": nms, "roi_align": roi_align, "_roi_align_backward": roi_align_backward}


def register_torchvision() -> None:
    """Register the rules above for the ops torchvision has defined (idempotent)."""
    ops = torch.ops.torchvision
    for name, fn in TORCHVISION.items():
        try:
            op = getattr(ops, name)
        except (AttributeError, RuntimeError):  # torchvision not imported, or an older one
            continue
        if lookup(op) is None:
            register(op, kind=OTHER)(fn)


register_late("torchvision", register_torchvision)

"""Depthwise convolutions (``groups`` = input channels) on CUDA: which kernels torch runs and how fast.

torch picks the backend from the input's layout (``aten/src/ATen/native/Convolution.cpp``,
``_select_conv_backend``, as ``torch._C._select_conv_backend`` reported it for every shape measured):

* a **channels-last** input runs **cuDNN** ("always use cudnn_depthwise for channels_last format");
  ConvNeXt's blocks, which permute to NHWC for their layer norm and back, feed their depthwise 7x7
  convolutions channels-last tensors;
* a **contiguous** (NCHW) input runs ATen's own ``CudaDepthwise2d`` kernels, in fp32 and in bf16 alike
  (cuDNN's depthwise path for NCHW inputs is for fp16 workloads it lists: assumed not taken).

The two differ by up to 9x on one shape (measured on an H200, ``tests/data/h200/depthwise*.csv``,
``benchmarks/record_depthwise.py``): cuDNN's fp32 7x7 backward runs at 0.68 TFLOP/s where its bf16 one runs
at 6.0, and ATen's kernels run bf16 no faster than fp32.  So the time of a depthwise convolution is its
FLOPs over a measured rate per (backend, dtype, stride 1 or 2, kernel 3, 5 or 7, direction): the median over
16 layer shapes of MobileNet- and ConvNeXt-like networks, kept as a fraction of the measuring GPU's fp32
peak (``estimator/data/depthwise.json``, written by ``benchmarks/fit_depthwise.py``) and applied to any GPU
as that fraction of its own fp32 peak (the H100 and H200 share the chip; elsewhere an assumption: these
kernels run on the CUDA cores, not the tensor cores).  A kernel size between the measured ones takes the
nearest; a multiplier above 1 (``C_out = m * C_in``) is timed as its FLOPs at the same rate.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

KERNEL_SIZES = (3, 5, 7)
DATA_FILE = "depthwise.json"


def classify(x: tuple[int, ...], w: tuple[int, ...], out: tuple[int, ...], channels_last: bool | None) -> str:
    """``backend/sS/kK`` of a 2-d depthwise convolution (input ``x`` [N, C, H, W], weight ``w`` [C*m, 1, kh,
    kw], output ``out`` [N, C*m, Ho, Wo]), or "" for any other convolution."""
    if len(x) != 4 or len(w) != 4 or len(out) != 4 or w[1] != 1 or x[1] < 2 or w[0] % x[1]:
        return ""
    backend = "cudnn" if channels_last else "native"
    stride = 2 if x[2] > 1.5 * max(out[2], 1) else 1  # (H + 2p - k) // s + 1: about H / s with "same" padding
    size = min(KERNEL_SIZES, key=lambda s: (abs(s - max(w[2], w[3])), s))
    return f"{backend}/s{stride}/k{size}"


def is_channels_last(shape: tuple[int, ...], stride: tuple[int, ...] | None) -> bool | None:
    """Whether a 4-d tensor is dense NHWC and not also dense NCHW (as ``suggest_memory_format``: an
    ambiguous layout, e.g. one channel or 1x1 images, is contiguous); None when the strides are unknown."""
    if stride is None or len(shape) != 4 or len(stride) != 4:
        return None
    n, c, h, w = shape
    nhwc, nchw = (h * w * c, 1, w * c, c), (c * h * w, h * w, w, 1)
    dense = lambda want: all(s == e for s, e, d in zip(stride, want, shape) if d > 1)  # noqa: E731
    return dense(nhwc) and not dense(nchw)


@lru_cache(maxsize=None)
def table() -> dict:
    return json.loads(resources.files("estimator").joinpath("data", DATA_FILE).read_text())


def efficiency(kind: str, dtype: str | None, backward: bool) -> float | None:
    """The measured rate of a depthwise convolution of class ``kind`` (:func:`classify`) as a fraction of the
    GPU's fp32 peak; None when the class was not measured."""
    half = "bf16" if dtype in ("bfloat16", "float16") else "fp32"
    backend, stride, size = kind.split("/")
    key = f"{backend}/{half}/{stride}/{size}/{'backward' if backward else 'forward'}"
    return table()["eff"].get(key)

"""Depthwise convolutions on CUDA (``estimator/timing/depthwise.py``): which backend torch runs and how fast.

Ground truth: ``tests/data/h200/depthwise.csv`` (contiguous inputs) and ``depthwise_channels_last.csv``, single
kernels on one H200 with the backend ``torch._C._select_conv_backend`` chose on the card (README there).  The
rates of ``estimator/data/depthwise.json`` are the medians of these rows (``benchmarks/fit_depthwise.py``);
the whole-model steps they are judged on are ``tests/test_h200.py``'s (ConvNeXt-Tiny, held out).
"""

from __future__ import annotations

import csv
import math
import os
import statistics

import pytest
import torch
from torch import nn

from estimator import estimate
from estimator import timing as T
from estimator.timing import depthwise
from estimator.timing.records import OpWork

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "h200")
FILES = {"contiguous": "depthwise.csv", "channels_last": "depthwise_channels_last.csv"}


def _rows(layout: str) -> list[dict]:
    with open(os.path.join(DATA, FILES[layout])) as f:
        return list(csv.DictReader(f))


def _strides(shape, layout):
    n, c, h, w = shape
    return [h * w * c, 1, w * c, c] if layout == "channels_last" else [c * h * w, h * w, w, 1]


def _work(r: dict, layout: str) -> OpWork:
    """The OpWork of one measured row, built from its shapes and strides as the reference records are."""
    n, c, s, k, st = (int(r[x]) for x in ("batch", "channels", "size", "kernel", "stride"))
    o = (s + 2 * (k // 2) - k) // st + 1  # PyTorch's output size, padding k // 2
    dt = r["dtype"]
    x = [[n, c, s, s], dt, _strides((n, c, s, s), layout)]
    w = [[c, 1, k, k], dt, [k * k, k * k, k, 1]]
    b = [[c], dt, [1]]
    y = [[n, c, o, o], dt, _strides((n, c, o, o), layout)]
    if r["direction"] == "forward":
        return OpWork.from_record({"op": "aten.convolution.default", "phase": "forward"},
                                  {"in": [x, w, b], "out": [y + [0]]})
    return OpWork.from_record({"op": "aten.convolution_backward.default", "phase": "backward"},
                              {"in": [y, x, w], "out": [x + [0], w + [0], b + [0]]})


@pytest.mark.parametrize("layout", list(FILES))
def test_backend_is_the_one_torch_chose(layout):
    """Every row's class names the backend torch picked on the card: ATen's CudaDepthwise2d for contiguous
    inputs (fp32 and bf16 alike), cuDNN for channels-last ones."""
    rows = _rows(layout)
    assert len(rows) >= 300
    for r in rows:
        backend = _work(r, layout).depthwise.split("/")[0]
        assert {"native": "CudaDepthwise2d", "cudnn": "Cudnn"}[backend] == r["backend"], r


@pytest.mark.parametrize("layout,error,within", [("contiguous", 0.052, 0.86), ("channels_last", 0.121, 0.67)])
def test_measured_kernels(layout, error, within):
    """The time model (the H200's) on the kernels its rates come from: median |error| 5.2 % for ATen's kernels
    (86 % within 20 %), 12.1 % for cuDNN's (67 %): one rate per class over 16 layer shapes (min-max within a
    class up to 5x for cuDNN's small maps).  Bound: + 3 points, - 6 points."""
    model = T.load_model("H200")
    logs = [math.log(T.gpu_seconds(_work(r, layout), model) / (float(r["ms"]) * 1e-3)) for r in _rows(layout)]
    assert math.exp(statistics.median(abs(x) for x in logs)) - 1 <= error + 0.03
    assert sum(abs(x) <= math.log(1.2) for x in logs) / len(logs) >= within - 0.06
    assert abs(statistics.median(logs)) <= math.log(1.05)


def test_cudnn_fp32_7x7_backward_is_the_slow_class():
    """The rows behind ConvNeXt-Tiny fp32 (0.71x before the rule): cuDNN's fp32 7x7 backward against its bf16
    one on the same shapes, measured (ratio of the medians) and as the model times them."""
    model = T.load_model("H200")
    rows = [r for r in _rows("channels_last")
            if r["kernel"] == "7" and r["stride"] == "1" and r["direction"] == "backward"]
    dtypes = ("float32", "bfloat16")
    measured = {dt: statistics.median(float(r["ms"]) for r in rows if r["dtype"] == dt) for dt in dtypes}
    model_s = {dt: statistics.median(T.gpu_seconds(_work(r, "channels_last"), model) for r in rows if r["dtype"] == dt)
               for dt in dtypes}
    assert measured["float32"] / measured["bfloat16"] > 5  # measured 7.9x
    ratio = measured["float32"] / measured["bfloat16"]
    assert model_s["float32"] / model_s["bfloat16"] == pytest.approx(ratio, rel=0.25)


class _Blocks(nn.Module):
    """A depthwise 7x7 convolution fed NCHW (``first``), then ConvNeXt's channels-first layer norm (permute to
    NHWC, normalise, permute back), so the next depthwise convolution sees a channels-last tensor."""

    def __init__(self, c=16):
        super().__init__()
        self.first = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c)
        self.second = nn.Conv2d(c, c, 7, padding=3, groups=c)

    def norm_channels(self, x):
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)

    def forward(self, x):
        return self.second(self.norm_channels(self.first(x))).sum()


def test_capture_sees_the_layout():
    """On this project's capture, the first convolution (contiguous input) is ATen's kernel and the second
    (the permuted layer norm's output, channels-last on real tensors too) is cuDNN's, in both directions."""
    model, x = _Blocks(), torch.randn(2, 16, 14, 14)
    assert model.norm_channels(model.first(x)).is_contiguous(memory_format=torch.channels_last)  # the real layout
    report = estimate(model, x, device="cuda", precision="fp32")
    convs = [w for w in T.works_of(report) if w.kind == T.CONV]
    assert [(w.backward, w.depthwise) for w in convs] == [
        (False, "native/s1/k7"), (False, "cudnn/s1/k7"), (True, "cudnn/s1/k7"), (True, "native/s1/k7")]
    note = T.step_time(report, "H100").band_note  # the report says what the time rests on
    assert "depthwise convolutions at rates measured on an H200" in note


def test_other_convolutions_are_not_depthwise():
    assert depthwise.classify((8, 16, 32, 32), (32, 16, 3, 3), (8, 32, 32, 32), False) == ""  # dense
    assert depthwise.classify((8, 1, 32, 32), (8, 1, 3, 3), (8, 8, 32, 32), False) == ""  # one input channel
    assert depthwise.classify((8, 64, 32, 32), (64, 2, 3, 3), (8, 64, 32, 32), False) == ""  # groups 32
    assert depthwise.classify((8, 64, 32, 32), (64, 1, 9, 9), (8, 64, 16, 16), None) == "native/s2/k7"
    assert depthwise.is_channels_last((2, 1, 5, 5), (25, 1, 5, 1)) is False  # one channel: both layouts

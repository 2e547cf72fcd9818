"""Time depthwise convolutions (groups = channels) on the GPU at hand: forward and ``convolution_backward``
(input, weight and bias gradients), fp32 and bf16, kernel 3, 5 and 7, stride 1 and 2, over the layer shapes of
MobileNet- and ConvNeXt-like networks, with the backend torch selects for each (cuDNN, or ATen's own
``CudaDepthwise2d`` kernels).  Busy-GPU time: CUDA events around 20 back-to-back calls after 3 warm-ups, the
median of 3 such runs, divided by 20.  One CSV row per (shape, dtype, direction).

    python benchmarks/record_depthwise.py --out FILE.csv [--channels-last]
"""

from __future__ import annotations

import argparse
import csv
import statistics

import torch

# (batch, channels, input size): MobileNetV2/V3- and ConvNeXt-like stages, and a few more
SHAPES = [(32, 96, 56), (32, 192, 28), (32, 384, 14), (32, 768, 7), (64, 16, 112), (64, 72, 56), (64, 96, 28),
          (64, 240, 14), (64, 576, 7), (128, 32, 112), (16, 64, 56), (32, 960, 7), (64, 144, 28), (8, 256, 56),
          (128, 512, 14), (256, 96, 56)]


def _busy_ms(fn, calls: int = 20) -> float:
    for _ in range(3):
        fn()
    runs = []
    for _ in range(3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(calls):
            fn()
        e.record()
        e.synchronize()
        runs.append(s.elapsed_time(e) / calls)
    return statistics.median(runs)


def _backend(x, w, stride, pad) -> str:
    try:
        return str(torch._C._select_conv_backend(x, w, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0],
                                                 x.shape[1], None)).split(".")[-1]
    except Exception as e:  # noqa: BLE001 (a private API: record why it failed)
        return f"unknown ({type(e).__name__})"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--channels-last", action="store_true", help="inputs and output gradients in channels_last")
    a = ap.parse_args(argv)
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    with open(a.out, "w", newline="") as f:
        w_csv = csv.writer(f)
        w_csv.writerow(["batch", "channels", "size", "kernel", "stride", "dtype", "layout", "direction", "backend",
                        "ms"])
        for (n, c, size), k, stride, dtype in ((s, k, st, dt) for s in SHAPES for k in (3, 5, 7) for st in (1, 2)
                                                for dt in (torch.float32, torch.bfloat16)):
            if stride == 2 and size < 14:
                continue
            pad = k // 2
            x = torch.randn(n, c, size, size, device="cuda", dtype=dtype).to(memory_format=fmt)
            w = torch.randn(c, 1, k, k, device="cuda", dtype=dtype)
            b = torch.randn(c, device="cuda", dtype=dtype)
            y = torch.nn.functional.conv2d(x, w, b, stride, pad, 1, c)
            gy = torch.randn_like(y).to(memory_format=fmt)
            fwd = _busy_ms(lambda: torch.nn.functional.conv2d(x, w, b, stride, pad, 1, c))
            bwd = _busy_ms(lambda: torch.ops.aten.convolution_backward(gy, x, w, [c], [stride] * 2, [pad] * 2, [1, 1],
                                                                       False, [0, 0], c, [True, True, True]))
            backend, name = _backend(x, w, stride, pad), str(dtype).removeprefix("torch.")
            for direction, ms in (("forward", fwd), ("backward", bwd)):
                w_csv.writerow([n, c, size, k, stride, name, "channels_last" if a.channels_last else "contiguous",
                                direction, backend, f"{ms:.5g}"])
            f.flush()
            print(n, c, size, k, stride, name, backend, f"{fwd:.4f} {bwd:.4f} ms", flush=True)


if __name__ == "__main__":
    main()

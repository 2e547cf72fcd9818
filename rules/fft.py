"""Fast Fourier transforms (OTHER): ``torch.fft``'s ops as ATen runs them (``_fft_r2c``, ``_fft_c2r``,
``_fft_c2c``), and ``torch.stft`` / ``istft``, which call them.

The count is the one FFT benchmarks report (FFTW's "mflops", Frigo and Johnson, *The Design and Implementation of
FFTW3*, Proc. IEEE 93(2), 2005; benchFFT's convention): a complex transform of N points costs ``5 N log2 N``
FLOPs (the radix-2 Cooley-Tukey count: N/2 log2 N butterflies of one complex multiply, 6 FLOPs, and two complex
adds, 4), a transform of N real points half of it, ``2.5 N log2 N``.  A multi-dimensional transform over
dimensions of sizes n_1..n_d is one of N = n_1 ... n_d points (the separable passes sum to the same N log2 N);
it is done once per batch element (the product of the other dimensions).  The normalization (``norm="ortho"``
or ``"forward"``/``"backward"`` where it scales) is one multiply per output element: 2 FLOPs for a complex one
(a real scale of both parts), 1 for a real one.  The backward of each is FFTs of the same sizes (autograd's
formulas call these ops), counted by the same rules.
"""

from __future__ import annotations

from math import log2, prod

from .registry import OTHER, aten_ops, register

# -- math helpers (pure functions of shapes) ---------------------------------


def fft_flops(points: int, batch: int, real: bool) -> float:
    """``batch`` transforms of ``points`` points: 5 N log2 N each (complex data), 2.5 N log2 N (real)."""
    if points <= 1:
        return 0
    per = 5 * points * log2(points)
    return batch * (per / 2 if real else per)


def _transformed(shape, dims) -> tuple[int, int]:
    """(points, batch): the product of ``shape`` over ``dims`` and over the other dimensions."""
    dims = [d % len(shape) for d in dims]
    points = prod(shape[d] for d in dims)
    return points, prod(shape) // max(points, 1)


def _scale(call, out, complex_out: bool) -> int:
    """The normalization's multiplies: none when ``normalization`` is 0 (unscaled)."""
    return (2 if complex_out else 1) * out.numel if int(call["normalization"]) else 0


# -- rules -------------------------------------------------------------------


@register(*aten_ops("_fft_r2c"), kind=OTHER)
def fft_r2c(call):
    """2.5 N log2 N per batch element over the real input's transformed dims (+ the normalization's scale)."""
    points, batch = _transformed(call["self"].shape, call["dim"])
    return int(fft_flops(points, batch, real=True)) + _scale(call, call.out, True)


@register(*aten_ops("_fft_c2r"), kind=OTHER)
def fft_c2r(call):
    """2.5 N log2 N per batch element over the real output's transformed dims (``last_dim_size`` points in the
    last; + the normalization's scale)."""
    points, batch = _transformed(call.out.shape, call["dim"])
    return int(fft_flops(points, batch, real=True)) + _scale(call, call.out, False)


@register(*aten_ops("_fft_c2c"), kind=OTHER)
def fft_c2c(call):
    """5 N log2 N per batch element over the transformed dims (+ the normalization's scale)."""
    points, batch = _transformed(call["self"].shape, call["dim"])
    return int(fft_flops(points, batch, real=False)) + _scale(call, call.out, True)

"""Check an estimate against a live run on the GPU (or CPU): a training step, or (``mode``) a forward under
``torch.no_grad()`` or transformers' ``generate()`` (:mod:`.serving`, which lists its measurements).

The measurements, independent of the estimator's rules and simulation:

* parameters, buffers, gradients, optimizer state: bytes of the real tensors
  after a real ``optimizer.step()``;
* activations: distinct storages that autograd saves during forward + loss
  (``torch.autograd.graph.saved_tensors_hooks``) and still holds when backward starts, parameters and
  buffers excluded;
* peak: ``torch.cuda.max_memory_allocated()`` after ``reset_peak_memory_stats()``
  over a steady-state iteration (CUDA), or a live-tensor tracker (CPU), less what
  was allocated before the run;
* FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` with its known defects fixed
  (:data:`FLOP_FIXES`: CPU flash attention and grouped-query heads on every SDPA kernel, the CPU
  LSTM, grouped ``convolution_backward``, and the ops it has no formula for);
* step time: median of ``steps`` synchronised iterations after a warm-up;
  achieved FLOP/s = measured matmul-class FLOPs (forward + backward) / step time;
  MFU = achieved / the device's dense peak for the dtype (PaLM, Chowdhery et al.
  2022, appendix B: model FLOPs utilisation).

The user's model is never changed: the run uses a deep copy.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..errors import UserError
from .flops import FLOP_FIXES, flop_counter
from .result import ROWS, Validation
from .tracker import LiveTracker
from .training import validate_training

__all__ = ["FLOP_FIXES", "LiveTracker", "ROWS", "Validation", "flop_counter", "validate"]

MODES = ("train", "inference", "generate")


def validate(model: torch.nn.Module, inputs: Any, *, optimizer: Any = "adamw",
             loss_fn: Callable[[Any], torch.Tensor] | None = None, device: str | None = None, precision: str = "fp32",
             steps: int = 5, tolerance: float = 5.0, force: bool = False, peak_tflops: float | None = None,
             keep_output: bool = False, grad_accum: int = 1, clip_grad_norm: float | None = None,
             ema: float | None = None, mode: str = "train", new_tokens: int | None = None, kv_cache: str = "dynamic",
             prompt_len: int | None = None, zero_grad: str = "after_step", quantize: str | None = None) -> Validation:
    """Estimate, then run the same thing for real and compare (see the module docstring).  ``mode``: "train" (the
    training loop: ``optimizer``, ``loss_fn``, ``keep_output``, ``grad_accum``, ``clip_grad_norm``, ``ema``,
    ``zero_grad``),
    "inference" or "generate" (``new_tokens``, ``kv_cache``, ``prompt_len``; ``quantize``: "int4" or "int4-dq", run
    on bitsandbytes' 4-bit layers), as :func:`estimator.estimate` takes them.  Exit status of the command: 0
    when every row is within ``tolerance`` percent."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but no CUDA device is available; use --device cpu")
    if steps < 1:
        raise UserError(f"--steps must be >= 1, not {steps}")
    if not tolerance > 0 or tolerance == float("inf"):  # (nan fails the first test)
        raise UserError(f"--tolerance is a percentage > 0, e.g. 5, not {tolerance}")
    if peak_tflops is not None and (not peak_tflops > 0 or peak_tflops == float("inf")):
        raise UserError(f"--peak-tflops must be > 0, e.g. 312, not {peak_tflops}")
    if mode not in MODES:
        raise UserError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    if str(precision).strip().lower() == "fp8":  # (its live run was a plain bf16-mixed one: -35 % read as a miss)
        raise UserError("--precision fp8 is a what-if over the bf16-mixed step, which no live run reproduces: validate "
                        "bf16-mixed, or train with torchao's float8 (--float8) under 'estimator estimate'")
    if mode == "train":
        if quantize is not None:
            raise UserError("validate runs quantized weights for inference and generation: add --mode inference or "
                            "generate (QLoRA's training step is sized by 'estimator estimate')")
        if new_tokens is not None or prompt_len is not None:
            raise UserError("new_tokens and prompt_len size generation: use mode='generate'")
        return validate_training(model, inputs, optimizer=optimizer, loss_fn=loss_fn, device=device,
                                 precision=precision, steps=steps, tolerance=tolerance, force=force,
                                 peak_tflops=peak_tflops, keep_output=keep_output, grad_accum=grad_accum,
                                 clip_grad_norm=clip_grad_norm, ema=ema, zero_grad=zero_grad)
    named = isinstance(optimizer, str) and optimizer.strip().lower() == "adamw"  # (the default)
    loop = [name for name, given in (("optimizer", optimizer is not None and not named),
                                     ("keep_output", keep_output), ("grad_accum", grad_accum != 1),
                                     ("clip_grad_norm", clip_grad_norm is not None), ("ema", ema is not None),
                                     ("zero_grad", zero_grad != "after_step")) if given]
    if loop:
        raise UserError(f"{', '.join(loop)} shape a training loop; mode={mode!r} runs none: drop {' and '.join(loop)}")
    from .serving import validate_serving

    return validate_serving(model, inputs, mode=mode, device=device, precision=precision, steps=steps,
                            tolerance=tolerance, force=force, peak_tflops=peak_tflops, new_tokens=new_tokens,
                            kv_cache=kv_cache, prompt_len=prompt_len, quantize=quantize)

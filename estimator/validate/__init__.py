"""Check an estimate against a live training run on the GPU (or CPU).

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

from .flops import FLOP_FIXES, flop_counter
from .result import ROWS, Validation
from .tracker import LiveTracker
from .training import validate_training as validate

__all__ = ["FLOP_FIXES", "LiveTracker", "ROWS", "Validation", "flop_counter", "validate"]

"""Ground truth for peak memory on CPU: a live-tensor tracker on a real training step.

The tracker (``instruments.LiveTracker``, the tests' own instrument) is a ``TorchDispatchMode`` that adds each output storage's bytes when it
first appears, and a ``weakref.finalize`` on the storage subtracts them when it is
freed; parameters, buffers and inputs are registered up front.  It shares nothing
with the estimator's lifetime simulation.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from instruments import LiveTracker


def measure_peaks(model, inputs, optimizer_factory, loss_of, *, autocast_dtype=None, train=True, steps=2,
                  keep_output=False, grad_accum=1, resident=(), clip=None):
    """Live-byte peaks of ``steps`` real CPU iterations: [first, second, ...].

    Each iteration, the loop as written (``keep_output``, ``grad_accum``)::

        for micro in range(grad_accum):
            out = model(...)                      # under CPU autocast when autocast_dtype
            loss = loss_of(out) / grad_accum      # (no division when grad_accum == 1)
            if not keep_output: del out           # loss = loss_fn(model(x)): only the loss is held
            loss.backward()
        optimizer.step(); optimizer.zero_grad(set_to_none=True)
        keep = loss                               # kept into the next iteration, as a loop that logs it

    ``keep_output``: ``out`` lives until the next micro-step replaces it (``out = model(x)``) or the
    iteration ends.  ``train=False``: ``out = model(...)`` under ``no_grad`` in eval mode, the previous
    output held until the new one replaces it.
    """
    import contextlib

    args, kwargs = ((), dict(inputs)) if isinstance(inputs, dict) else (
        (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs), {})
    tracker = LiveTracker()
    for t in list(model.parameters()) + list(model.buffers()) + list(resident):
        tracker.register(t)  # ``resident``: tensors the model holds beside them (bitsandbytes' quantization state)
    for t in pytree.tree_leaves((args, kwargs)):
        if isinstance(t, torch.Tensor):
            tracker.register(t)
    model.train(train)
    opt = optimizer_factory(model.parameters()) if train else None
    amp = (lambda: torch.autocast("cpu", dtype=autocast_dtype)) if autocast_dtype else contextlib.nullcontext
    peaks = []
    keep = None
    with tracker:
        for _ in range(steps):
            tracker.reset_peak()
            if train:
                out = None
                for _micro in range(grad_accum):
                    with amp():
                        out = model(*args, **kwargs)
                        loss = loss_of(out)
                    if grad_accum > 1:
                        loss = loss / grad_accum
                    if not keep_output:
                        out = None
                    loss.backward()
                if clip is not None:  # torch's own clip_grad_norm_ (foreach on CPU tensors, its default)
                    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], clip)
                opt.step()
                opt.zero_grad(set_to_none=True)
                keep = loss
                del out, loss
            else:
                with torch.no_grad(), amp():
                    keep = model(*args, **kwargs)
            peaks.append(tracker.peak)
    del keep
    return peaks

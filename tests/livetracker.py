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
                  keep_output=False, grad_accum=1, resident=(), clip=None, zero_grad="after_step"):
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
    iteration ends.  ``zero_grad="before_backward"``: ``optimizer.zero_grad(set_to_none=True)`` after the
    first micro-step's loss and before its backward (Lightning's automatic optimization; ``loss = ...;
    opt.zero_grad(); loss.backward(); opt.step()``), not after the step: the previous iteration's gradients
    live through the forward; ``"in_place"``: ``optimizer.zero_grad(set_to_none=False)`` after the step (the
    gradients kept, zeroed).  ``train=False``: ``out = model(...)`` under ``no_grad`` in eval mode, the previous
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
    amp = (lambda: torch.autocast("cpu", dtype=autocast_dtype)) if autocast_dtype else contextlib.nullcontext
    peaks = []
    keep = None
    with tracker:
        # built before the loop, tracked: state its constructor makes (Adagrad's) is live through the first step
        opt = optimizer_factory(model.parameters()) if train else None
        for _ in range(steps):
            tracker.reset_peak()
            if train:
                out = None
                for micro in range(grad_accum):
                    with amp():
                        out = model(*args, **kwargs)
                        loss = loss_of(out)
                    if grad_accum > 1:
                        loss = loss / grad_accum
                    if not keep_output:
                        out = None
                    if zero_grad == "before_backward" and micro == 0:
                        opt.zero_grad(set_to_none=True)
                    loss.backward()
                if clip is not None:  # torch's own clip_grad_norm_ (foreach on CPU tensors, its default)
                    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], clip)
                opt.step()
                if zero_grad in ("after_step", "in_place"):
                    opt.zero_grad(set_to_none=zero_grad == "after_step")
                keep = loss
                del out, loss
            else:
                with torch.no_grad(), amp():
                    keep = model(*args, **kwargs)
            peaks.append(tracker.peak)
    del keep
    return peaks


def measure_generate(model, ids, new_tokens: int, kv_cache: str = "dynamic") -> dict[str, int]:
    """A real greedy ``generate()`` of ``new_tokens`` tokens after the prompt ``ids`` (no end-of-sequence stop),
    measured: the live-byte peaks of the prefill (to where the 2nd forward starts) and of the last decode step
    (from where the last forward starts to the return), the matmul FLOPs of the 1st and the last forward (the fixed
    FlopCounterMode read at each forward's start and end), and the bytes of the distinct storages of every tensor
    the returned cache's layers hold.  Forward hooks are registered on ``model`` and left there."""
    from instruments import flop_counter

    tracker, counter, calls, marks, windows = LiveTracker(), flop_counter(), [0], {}, {}

    def pre(_module, _args, _kwargs):
        calls[0] += 1
        marks[("start", calls[0])] = counter.get_total_flops()
        if calls[0] in (2, new_tokens):
            windows[calls[0]] = tracker.peak
            tracker.reset_peak()

    def post(_module, _args, _kwargs, _out):
        marks[("end", calls[0])] = counter.get_total_flops()

    model.register_forward_pre_hook(pre, with_kwargs=True)
    model.register_forward_hook(post, with_kwargs=True)
    extra = {"cache_implementation": "static"} if kv_cache == "static" else {}
    with torch.no_grad(), tracker, counter:
        for t in [*model.parameters(), *model.buffers(), ids]:
            tracker.register(t)
        tracker.reset_peak()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None,
                             return_dict_in_generate=True, **extra)
    if out.sequences.shape[-1] != ids.shape[-1] + new_tokens or calls[0] != new_tokens:
        raise RuntimeError(f"generate() ran {calls[0]} forwards for {out.sequences.shape[-1] - ids.shape[-1]} tokens")
    cache = {}
    for layer in getattr(out.past_key_values, "layers", ()):  # (None without a cache)
        for v in vars(layer).values():
            for t in (v.values() if isinstance(v, dict) else [v]):
                if isinstance(t, torch.Tensor):
                    cache[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return {"peak_prefill": windows.get(2, tracker.peak), "peak_decode": tracker.peak, "kv_cache": sum(cache.values()),
            "flops_prefill": marks[("end", 1)] - marks[("start", 1)],
            "flops_decode": marks[("end", new_tokens)] - marks[("start", new_tokens)]}

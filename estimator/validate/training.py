"""validate's training run: the loop the estimate models (:class:`LiveRun`), its figures measured beside the
estimate's (:func:`validate_training`)."""

from __future__ import annotations

import contextlib
import statistics
import time
import weakref
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from ..api import estimate
from ..capture import select_loss, split_inputs
from ..hardware import match_device_name
from ..optim import build_optimizer
from ..precision import parse_precision
from .flops import flop_counter
from .live import check_room, device_peak, materialize_inputs, materialize_model
from .result import ROWS, Validation, _error
from .tracker import LiveTracker


class LiveRun:
    """The real training loop on a private copy of the model: ``step()`` is one iteration as the
    estimate models it: ``grad_accum`` micro-steps (each loss divided by it), the output dropped once the
    loss is computed or (``keep_output``) held until the next micro-step or the end of the step, one
    optimizer step; the loss returned (the caller keeps it into the next iteration, as a loop that logs it).
    ``zero_grad``: the gradients freed after the step (:meth:`end_step`) or, "before_backward", before the first
    micro-step's backward (the previous step's live through the forward), or "in_place": zeroed after the step and
    kept (``zero_grad(set_to_none=False)``)."""

    def __init__(self, model: torch.nn.Module, inputs: Any, optimizer: Any, loss_fn: Callable | None,
                 device: str, policy: Any, keep_output: bool = False, grad_accum: int = 1,
                 clip_grad_norm: float | None = None, ema: float | None = None, zero_grad: str = "after_step"):
        self.keep_output, self.grad_accum, self.clip = keep_output, grad_accum, clip_grad_norm
        self.zero_before = zero_grad == "before_backward"
        self.set_to_none = zero_grad != "in_place"  # (zero_grad(set_to_none=False): zeroed, kept)
        self.device, self.dev = device, torch.device(device)
        self.m = materialize_model(model, self.dev, policy.cast)
        self.args, self.kwargs = split_inputs(materialize_inputs(inputs, self.dev, policy.cast))
        self.opt, _ = build_optimizer(optimizer, dict(self.m.named_parameters()), dict(model.named_parameters()),
                                      None, None, model)
        self.scaler = torch.amp.GradScaler(device) if policy.grad_scaler else None
        self.amp = ((lambda: torch.autocast(device, dtype=policy.autocast)) if policy.autocast
                    else contextlib.nullcontext)
        self.sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        self.loss_fn = loss_fn
        if not self.m.training:  # (a model in training mode keeps the modules its user put in eval, as estimated)
            self.m.train()
        self.ema = None
        if ema is not None:  # the loop's moving average of the weights, as estimator.ema models it
            from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

            self.ema = AveragedModel(self.m, multi_avg_fn=get_ema_multi_avg_fn(ema))

    def step(self, pack_hook=None, counters=None, at_backward=None) -> torch.Tensor:
        """One optimizer step; ``pack_hook``, ``counters`` (forward, backward) and ``at_backward`` (called when
        its backward starts) watch its first micro-step."""
        opt, scaler = self.opt, self.scaler
        out = None
        for micro in range(self.grad_accum):
            watch = micro == 0
            hooks = (torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda t: t) if pack_hook and watch
                     else contextlib.nullcontext())
            fwd_counter, bwd_counter = counters if counters and watch else (contextlib.nullcontext(),) * 2
            with hooks, fwd_counter, self.amp():
                out = self.m(*self.args, **self.kwargs)
                loss, _ = select_loss(out, self.loss_fn)
            if self.grad_accum > 1:
                loss = loss / self.grad_accum
            if not self.keep_output:
                out = None
            if self.zero_before and watch:
                self.zero_grad()
            if at_backward is not None and watch:
                at_backward()
            with bwd_counter:
                (scaler.scale(loss) if scaler else loss).backward()
        if opt is not None:
            if scaler is not None:
                scaler.unscale_(opt)
            if self.clip is not None:  # the gradients' norm clipped before the step, unscaled first
                torch.nn.utils.clip_grad_norm_([p for p in self.m.parameters() if p.grad is not None], self.clip)
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            if self.ema is not None:
                self.ema.update_parameters(self.m)
        del out
        return loss

    def zero_grad(self) -> None:
        # (no optimizer: the model's own zero_grad, as the estimate's loop frees the gradients each step; they
        # were kept and added into, a loop the estimate does not model: peak -24 % read as a miss)
        (self.opt or self.m).zero_grad(set_to_none=self.set_to_none)

    def end_step(self) -> None:
        """What the loop does after the step: zero_grad, unless it does that before the next backward."""
        if not self.zero_before:
            self.zero_grad()

    def state_bytes(self) -> int:
        """The optimizer's state and the EMA's copies (AveragedModel copies the buffers too, as estimator.ema counts
        them), distinct storages."""
        opt = self.opt
        ts = [v for st in (opt.state.values() if opt else []) for v in st.values()
              if isinstance(v, torch.Tensor) and v.device.type == self.dev.type]
        ts += [*self.ema.module.parameters(), *self.ema.module.buffers()] if self.ema is not None else []
        return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in ts}.values())

    def first_step(self) -> tuple[dict[str, int], torch.Tensor]:
        """Iteration 1: saved activations and FLOPs; then the model states from the real tensors."""
        m = self.m
        state_storages = {t.untyped_storage().data_ptr() for t in list(m.parameters()) + list(m.buffers())}
        packed: list[tuple[weakref.ref, int, int]] = []
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            alias = t.detach()  # without history: a node that saves its own output makes no reference cycle
            ptr = t.untyped_storage().data_ptr()
            if ptr not in state_storages:
                packed.append((weakref.ref(alias), ptr, t.untyped_storage().nbytes()))
            return alias

        def at_backward() -> None:  # what autograd still holds when backward starts
            saved.update({ptr: nbytes for ref, ptr, nbytes in packed if ref() is not None})

        fwd_counter, bwd_counter = flop_counter(), flop_counter()
        keep = self.step(pack, (fwd_counter, bwd_counter), at_backward)
        nbytes = lambda ts: sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in ts}.values())  # noqa: E731
        params = list(m.parameters())
        measured = {
            "parameters": nbytes(params),
            "buffers": nbytes(list(m.buffers())),
            "gradients": nbytes([p.grad for p in params if p.grad is not None]),
            "optimizer_state": self.state_bytes(),
            "activations": sum(saved.values()),
            "flops_forward": fwd_counter.get_total_flops(),
            "flops_backward": bwd_counter.get_total_flops(),
        }
        self.end_step()
        return measured, keep

    def steady_peak(self, keep: torch.Tensor, base_allocated: int) -> tuple[int, torch.Tensor]:
        """Iteration 2: the steady-state peak (``max_memory_allocated`` on a GPU, the live tracker on CPU)."""
        if self.device == "cuda":
            self.sync()
            torch.cuda.reset_peak_memory_stats()
            keep = self.step()
            self.sync()
            peak = torch.cuda.max_memory_allocated() - base_allocated
        else:
            opt = self.opt
            tracker = LiveTracker()
            ema = list(self.ema.parameters()) + list(self.ema.buffers()) if self.ema is not None else []
            for t in list(self.m.parameters()) + list(self.m.buffers()) + ema + [
                    t for st in (opt.state.values() if opt else []) for t in st.values() if isinstance(t, torch.Tensor)]:
                tracker.register(t)
            for t in pytree.tree_leaves((self.args, self.kwargs)):
                if isinstance(t, torch.Tensor):
                    tracker.register(t)
            for p in self.m.parameters():  # the previous step's gradients, where zero_grad comes before backward
                if p.grad is not None:
                    tracker.register(p.grad)
            tracker.register(keep)  # the previous iteration's loss, still referenced
            with tracker:
                tracker.reset_peak()
                keep = self.step()
            peak = tracker.peak
        self.end_step()
        return peak, keep

    def median_step_time(self, steps: int) -> float:
        """The median of ``steps`` synchronised iterations."""
        times = []
        for _ in range(steps):
            self.sync()
            t0 = time.perf_counter()
            keep = self.step()
            self.end_step()
            self.sync()
            times.append(time.perf_counter() - t0)
        del keep
        return statistics.median(times)


def validate_training(
    model: torch.nn.Module,
    inputs: Any,
    *,
    optimizer: Any = "adamw",
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    device: str = "cpu",
    precision: str = "fp32",
    steps: int = 5,
    tolerance: float = 5.0,
    force: bool = False,
    peak_tflops: float | None = None,
    keep_output: bool = False,
    grad_accum: int = 1,
    clip_grad_norm: float | None = None,
    ema: float | None = None,
    zero_grad: str = "after_step",
) -> Validation:
    """Estimate, then run real training iterations and compare (see the module docstring); ``device`` and ``steps``
    as :func:`estimator.validate.validate` checked them."""
    policy = parse_precision(precision)
    # on a GPU the estimate is for that GPU (its architecture decides kernels and workspaces)
    here = match_device_name(torch.cuda.get_device_name()) if device == "cuda" else None
    report = estimate(model, inputs, optimizer=optimizer, loss_fn=loss_fn, device=device, precision=precision,
                      gpu=here, solve_batch=False, keep_output=keep_output, grad_accum=grad_accum,
                      clip_grad_norm=clip_grad_norm, ema=ema, zero_grad=zero_grad)
    est = report.to_dict()
    check_room(device, est, force)

    base_allocated = torch.cuda.memory_allocated() if device == "cuda" else 0
    run = LiveRun(model, inputs, optimizer, loss_fn, device, policy, keep_output, grad_accum, clip_grad_norm, ema,
                  zero_grad)
    measured, keep = run.first_step()
    # RAdam's steady state is its rectified step, from its 6th (the estimate's figure): iterations 2-5 run first
    for _ in range(4 if type(run.opt).__name__ == "RAdam" else 0):
        keep = run.step()
    if run.scaler is not None and run.opt is not None:  # GradScaler skips the steps whose gradients overflow (at
        for _ in range(30):  # its first scales): until one steps, the state is none of what a run holds
            if any(run.opt.state.values()):
                break
            keep = run.step()
        measured["optimizer_state"] = run.state_bytes()
    measured["peak"], keep = run.steady_peak(keep, base_allocated)
    del keep
    step_time = run.median_step_time(steps)

    estimated = {
        "parameters": est["memory"]["parameters"], "buffers": est["memory"]["buffers"],
        "gradients": est["memory"]["gradients"], "optimizer_state": est["memory"]["optimizer_state"],
        "activations": est["memory"]["activations"], "peak": est["memory"]["peak"],
        "flops_forward": est["flops"]["matmul_forward"], "flops_backward": est["flops"]["matmul_backward"],
    }
    rows = {k: {"estimated": estimated[k], "measured": measured[k], "error": _error(estimated[k], measured[k])}
            for k in ROWS}
    # every micro-batch's matmul FLOPs over the step (the measured ones are one micro-batch's)
    achieved = grad_accum * (measured["flops_forward"] + measured["flops_backward"]) / step_time
    name, peak, notes = device_peak(device, policy, here, peak_tflops)
    mfu = achieved / peak if peak else None
    predicted = report.step_time  # estimate's, for the GPU it runs on (None on CPU or an unknown GPU)
    return Validation(device, name, rows, step_time, achieved, mfu, peak, tolerance, notes,
                      predicted.total if predicted else None, predicted.calibrated if predicted else None)

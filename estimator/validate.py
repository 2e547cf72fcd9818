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

import contextlib
import copy
import statistics
import time
import weakref
from dataclasses import dataclass, field
from math import prod
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count

from .capture import select_loss, split_inputs
from .errors import UserError
from .api import estimate
from .hardware import match_device_name
from .optim import build_optimizer
from .precision import parse_precision

aten = torch.ops.aten

ROWS = ("parameters", "buffers", "gradients", "optimizer_state", "activations", "peak",
        "flops_forward", "flops_backward")


# ---------------------------------------------------------------------------
# FlopCounterMode fixes (passed as ``custom_mapping``; formulas get shapes:
# every tensor argument is replaced by its ``torch.Size``; ``out_shape`` is the
# output's shape (tuple of shapes for multi-output ops)).
# ---------------------------------------------------------------------------


def _attention_flops(query, key, value) -> int:
    """Scaled-dot-product attention forward with grouped-query heads (K/V heads broadcast to the
    query's: torch 2.11's ``sdpa_flop_count`` asserts equal head counts and crashes on them):
      scores = q @ k^T : 2 * (b*h_q) * s_q * d_q * s_k
      out    = p @ v   : 2 * (b*h_q) * s_q * s_k * d_v
    (causal masking ignored, as torch does)."""
    b, h_q, s_q, d_q = query
    s_k, d_v = key[-2], value[-1]
    return 2 * b * h_q * s_q * s_k * (d_q + d_v)


def _attention_backward_flops(query, key, value) -> int:
    """Its backward, 5 products of the same sizes (torch's ``sdpa_backward_flop_count``):
      recompute scores q @ k^T : 2 * bh_q * s_q * d_q * s_k
      dP = dO @ v^T            : 2 * bh_q * s_q * d_v * s_k
      dV = P^T @ dO            : 2 * bh_q * s_k * s_q * d_v
      dQ = dS @ k              : 2 * bh_q * s_q * s_k * d_q
      dK = dS^T @ q            : 2 * bh_q * d_q * s_q * s_k"""
    b, h_q, s_q, d_q = query
    s_k, d_v = key[-2], value[-1]
    return 2 * b * h_q * s_q * s_k * (3 * d_q + 2 * d_v)


def sdpa_flop(query, key, value, *args, out_shape=None, **kwargs) -> int:
    """Every fused SDPA kernel: (query, key, value, ...) -> (output, logsumexp, ...)."""
    return _attention_flops(query, key, value)


def sdpa_backward_flop(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    """Every fused SDPA backward: (grad_out, query, key, value, ...) -> (grad_q, grad_k, grad_v, ...)."""
    return _attention_backward_flops(query, key, value)


def _rnn_layer_flops(input_shape, w_ih_shape, w_hh_shape) -> int:
    """One recurrent layer, one direction, over the whole sequence.

    input (T, B, I) [time-major after at::lstm's transpose; only T*B matters],
    w_ih (G*H, I), w_hh (G*H, H) with G = 4 gates for LSTM (i, f, g, o).
    Per time step and batch row: the input projection x_t @ w_ih^T is I*G*H
    multiply-adds, the hidden projection h_{t-1} @ w_hh^T is H*G*H.  So
      forward = 2 * T*B * (I + H) * G*H = 2 * T*B * (numel(w_ih) + numel(w_hh)).
    (Gate nonlinearities and bias adds are elementwise, not matmul-class.)
    """
    rows = prod(input_shape[:-1])  # T * B
    return 2 * rows * (prod(w_ih_shape) + prod(w_hh_shape))


def mkldnn_rnn_layer_flop(input, weight0, weight1, *args, out_shape=None, **kwargs) -> int:
    """aten::mkldnn_rnn_layer(Tensor input, Tensor weight0 [w_ih: (G*H, I)],
    Tensor weight1 [w_hh: (G*H, H)], Tensor weight2 [b_ih], Tensor weight3 [b_hh],
    Tensor hx_, Tensor cx_, bool reverse, int[] batch_sizes, int mode, int hidden_size,
    int num_layers, bool has_biases, bool bidirectional, bool batch_first, bool train)
    -> (output, hy, cy, workspace).   Verified with a dispatch trace: input (T, B, I).

    forward = 2 * T*B * (I + H) * G*H   (see _rnn_layer_flops)."""
    return _rnn_layer_flops(input, weight0, weight1)


def mkldnn_rnn_layer_backward_flop(input, weight1, weight2, *args, out_shape=None, **kwargs) -> int:
    """aten::mkldnn_rnn_layer_backward(Tensor input, Tensor weight1 [w_ih: (G*H, I)],
    Tensor weight2 [w_hh: (G*H, H)], Tensor weight3, Tensor weight4, Tensor hx_, ...)
    (note: the backward numbers its weights from 1).

    backward = 2 x forward = 4 * T*B * (I + H) * G*H:
      grad wrt input and hidden (dgates @ w_ih, dgates @ w_hh):   2 * T*B * (I + H) * G*H
      grad wrt weights (dgates^T @ x, dgates^T @ h):              2 * T*B * (I + H) * G*H
    """
    return 2 * _rnn_layer_flops(input, weight1, weight2)


def conv_backward_flop_groups(
    grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
    _output_padding, groups, output_mask, out_shape=None, **kwargs,
) -> int:
    """aten.convolution_backward with ``groups`` honoured.

    grad_input: torch's formula (correct for groups, since it reads the weight
    shape (C_out, C_in/g, *k)): a transposed conv of grad_out with the weight,
      2 * N * prod(out_spatial) * C_out * (C_in/g) * prod(k)   (= the forward FLOPs).
    grad_weight: each weight element accumulates over every batch row and every
    output position where it was used:
      normal conv     w (C_out, C_in/g, *k): 2 * N * prod(out_spatial) * C_out * (C_in/g) * prod(k)
      transposed conv w (C_in, C_out/g, *k): 2 * N * prod(in_spatial)  * C_in * (C_out/g) * prod(k)
    i.e. 2 * N * prod(spatial positions the kernel visits) * numel(w); torch's own
    formula computes it as conv(t(x), t(grad_out)) over ALL C_in x C_out channel pairs,
    i.e. ``groups`` times too many (C x for a depthwise conv).
    """
    flops = 0
    if output_mask[0]:
        grad_input_shape = out_shape[0]
        flops += conv_flop_count(grad_out_shape, w_shape, grad_input_shape, not transposed)
    if output_mask[1]:
        n = x_shape[0]
        visited = (x_shape if transposed else grad_out_shape)[2:]
        flops += 2 * n * prod(visited) * prod(w_shape)
    return flops


def grouped_mm_flop(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """aten._grouped_mm(self, mat2, offs, bias, out_dtype) (mixture-of-experts layers): no formula in
    FlopCounterMode.  (T, K) @ (G, K, N) -> (T, N): each token row meets one expert's K x N matrix,
    2 * T * K * N; (G, M, K) @ (G, K, N): 2 * G * M * K * N; (K, T) @ (T, N) split over T into G
    groups -> (G, K, N) (the weight gradient): 2 * K * T * N."""
    if len(a_shape) == 2 and len(b_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    return 2 * prod(out_shape) * a_shape[-1]


def trilinear_flop(i1_shape, i2_shape, i3_shape, expand1, expand2, expand3, sumdim, *args,
                   out_shape=None, **kwargs) -> int:
    """aten._trilinear (nn.Bilinear: x1^T A x2): no formula in FlopCounterMode.  It multiplies the
    three broadcast operands elementwise and sums over ``sumdim``: 2 multiply-adds per element
    of the broadcast product, i.e. 2 * prod(broadcast shape)."""
    full = [max(a, b, c) for a, b, c in zip(_expand(i1_shape, expand1), _expand(i2_shape, expand2),
                                                 _expand(i3_shape, expand3))]
    return 2 * prod(full)


def _expand(shape, expand_dims) -> list[int]:
    out = list(shape)
    for d in sorted(expand_dims):
        out.insert(d, 1)
    return out


_SDPA = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
         "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")
FLOP_FIXES: dict[Any, Callable[..., int]] = {
    **{getattr(aten, name): sdpa_flop for name in _SDPA if hasattr(aten, name)},
    **{getattr(aten, name + "_backward"): sdpa_backward_flop for name in _SDPA if hasattr(aten, name + "_backward")},
    aten.mkldnn_rnn_layer: mkldnn_rnn_layer_flop,
    aten.mkldnn_rnn_layer_backward: mkldnn_rnn_layer_backward_flop,
    aten.convolution_backward: conv_backward_flop_groups,
    aten._grouped_mm: grouped_mm_flop,
    aten._trilinear: trilinear_flop,
}


def flop_counter() -> FlopCounterMode:
    """``FlopCounterMode`` with the fixes of :data:`FLOP_FIXES`."""
    return FlopCounterMode(display=False, custom_mapping=FLOP_FIXES)



# -- live-tensor tracker (CPU peak) -------------------------------------------


class LiveTracker(TorchDispatchMode):
    """Live bytes of real tensors: each output storage's bytes are added when it first appears
    and subtracted when a ``weakref.finalize`` sees it freed; :meth:`register` the tensors that
    exist before (parameters, buffers, inputs)."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self.known: dict[int, int] = {}  # storage _cdata -> bytes

    def register(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key = st._cdata
        if key in self.known:
            return
        n = st.nbytes()
        self.known[key] = n
        self.live += n
        self.peak = max(self.peak, self.live)
        weakref.finalize(st, self._free, key).atexit = False

    def _free(self, key: int) -> None:
        n = self.known.pop(key, None)
        if n is not None:
            self.live -= n

    def reset_peak(self) -> None:
        self.peak = self.live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for t in pytree.tree_leaves((args, kwargs or {})):
            if isinstance(t, torch.Tensor):
                self.register(t)
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.register(t)
        return out


# -- the run --------------------------------------------------------------------


@dataclass
class Validation:
    device: str
    device_name: str
    rows: dict[str, dict[str, float]]
    step_time_s: float
    achieved_flops_per_s: float
    mfu: float | None
    peak_flops_per_s: float | None
    tolerance: float  # percent
    notes: list[str] = field(default_factory=list)
    # the step time estimator.timing predicts for this GPU (CUDA runs), and whether it is calibrated
    predicted_step_time_s: float | None = None
    predicted_calibrated: bool | None = None

    @property
    def ok(self) -> bool:
        return all(abs(r["error"]) * 100 <= self.tolerance for r in self.rows.values())

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "device_name": self.device_name, "rows": self.rows,
                "step_time_s": self.step_time_s, "achieved_flops_per_s": self.achieved_flops_per_s,
                "mfu": self.mfu, "peak_flops_per_s": self.peak_flops_per_s, "tolerance_percent": self.tolerance,
                "ok": self.ok, "notes": self.notes, "predicted_step_time_s": self.predicted_step_time_s,
                "predicted_calibrated": self.predicted_calibrated}

    def render(self, tablefmt: str = "simple") -> str:
        from tabulate import tabulate

        from .render import fmt_bytes, fmt_flops

        def value(name: str, v: float) -> str:
            """Every figure with its unit: bytes in binary units, FLOPs in decimal ones, exact value beside."""
            if name.startswith("flops"):
                return fmt_flops(v) + (f" ({v:,.0f})" if abs(v) >= 1000 else "")
            return fmt_bytes(v) + (f" ({v:,.0f} B)" if abs(v) >= 1024 else "")

        body = [[name.replace("_", " "), value(name, r["estimated"]), value(name, r["measured"]),
                 f"{100 * r['error']:+.2f}%", "ok" if abs(r["error"]) * 100 <= self.tolerance else "OFF"]
                for name, r in self.rows.items()]
        head = tabulate(body, headers=["", "estimated", "measured", "error", f"within {self.tolerance:g}%"],
                        tablefmt=tablefmt, disable_numparse=True, colalign=("left", "right", "right", "right", "left"))
        mfu = "unknown (pass --peak-tflops)" if self.mfu is None else f"{100 * self.mfu:.1f}%"
        predicted = ""
        if self.predicted_step_time_s is not None:
            predicted = (f", predicted {self.predicted_step_time_s * 1e3:.2f} ms "
                         f"({100 * _error(self.predicted_step_time_s, self.step_time_s):+.1f}%"
                         f"{'' if self.predicted_calibrated else ', extrapolated constants'})")
        tail = (f"device: {self.device_name}\nstep time: {self.step_time_s * 1e3:.2f} ms (median){predicted}\n"
                f"achieved: {self.achieved_flops_per_s / 1e12:.3f} TFLOP/s, MFU {mfu}")
        return "\n".join([head, tail, *self.notes]) + "\n"


def _error(est: float, meas: float) -> float:
    if meas == 0:
        return 0.0 if est == 0 else 1.0
    return (est - meas) / meas


def _materialize_model(model: torch.nn.Module, device: torch.device, dtype: torch.dtype | None) -> torch.nn.Module:
    """A private copy of ``model`` on ``device`` with real weights (random if it had none)."""
    meta = any(t.device.type == "meta" for t in list(model.parameters()) + list(model.buffers()))
    m = copy.deepcopy(model)  # keeps tied weights tied
    if meta:
        tied: dict[int, list[str]] = {}
        for name, p in m.named_parameters(remove_duplicate=False):
            tied.setdefault(id(p), []).append(name)
        m = m.to_empty(device=device)  # makes one tensor per name: tie them again
        for names in tied.values():
            for name in names[1:]:
                owner, _, attr = name.rpartition(".")
                setattr(m.get_submodule(owner), attr, m.get_parameter(names[0]))
        with torch.no_grad():
            for mod in m.modules():
                if hasattr(mod, "reset_parameters"):
                    try:
                        mod.reset_parameters()
                        continue
                    except Exception:  # noqa: BLE001 - fall back to a plain init
                        pass
                for p in mod.parameters(recurse=False):
                    p.normal_(0, 0.02) if p.is_floating_point() else p.zero_()
                for b in mod.buffers(recurse=False):
                    b.fill_(1) if b.is_floating_point() else b.zero_()
    else:
        m = m.to(device)
    if dtype is not None:
        m = m.to(dtype)
    return m


def _materialize_inputs(inputs: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    def real(t: torch.Tensor) -> torch.Tensor:
        if t.device.type == "meta":
            t = torch.randn(t.shape, dtype=t.dtype) if t.is_floating_point() else torch.zeros(t.shape, dtype=t.dtype)
        t = t.detach().to(device)
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        return t

    return pytree.tree_map_only(torch.Tensor, real, inputs)


class _LiveRun:
    """The real training loop on a private copy of the model: ``step()`` is one iteration as the
    estimate models it: ``grad_accum`` micro-steps (each loss divided by it), the output dropped once the
    loss is computed or (``keep_output``) held until the next micro-step or the end of the step, one
    optimizer step; the loss returned (the caller keeps it into the next iteration, as a loop that logs it)."""

    def __init__(self, model: torch.nn.Module, inputs: Any, optimizer: Any, loss_fn: Callable | None,
                 device: str, policy: Any, keep_output: bool = False, grad_accum: int = 1,
                 clip_grad_norm: float | None = None, ema: float | None = None):
        self.keep_output, self.grad_accum, self.clip = keep_output, grad_accum, clip_grad_norm
        self.device, self.dev = device, torch.device(device)
        self.m = _materialize_model(model, self.dev, policy.cast)
        self.args, self.kwargs = split_inputs(_materialize_inputs(inputs, self.dev, policy.cast))
        self.opt, _ = build_optimizer(optimizer, dict(self.m.named_parameters()), dict(model.named_parameters()),
                                      None, None, model)
        self.scaler = torch.amp.GradScaler(device) if policy.grad_scaler else None
        self.amp = ((lambda: torch.autocast(device, dtype=policy.autocast)) if policy.autocast
                    else contextlib.nullcontext)
        self.sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        self.loss_fn = loss_fn
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
        if self.opt is not None:
            self.opt.zero_grad(set_to_none=True)

    def first_step(self) -> tuple[dict[str, int], torch.Tensor]:
        """Iteration 1: saved activations and FLOPs; then the model states from the real tensors."""
        m, opt = self.m, self.opt
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
            "optimizer_state": nbytes([v for st in (opt.state.values() if opt else []) for v in st.values()
                                       if isinstance(v, torch.Tensor) and v.device.type == self.dev.type]
                                      + (list(self.ema.module.parameters()) if self.ema is not None else [])),
            "activations": sum(saved.values()),
            "flops_forward": fwd_counter.get_total_flops(),
            "flops_backward": bwd_counter.get_total_flops(),
        }
        self.zero_grad()
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
            tracker.register(keep)  # the previous iteration's loss, still referenced
            with tracker:
                tracker.reset_peak()
                keep = self.step()
            peak = tracker.peak
        self.zero_grad()
        return peak, keep

    def median_step_time(self, steps: int) -> float:
        """The median of ``steps`` synchronised iterations."""
        times = []
        for _ in range(steps):
            self.sync()
            t0 = time.perf_counter()
            keep = self.step()
            self.zero_grad()
            self.sync()
            times.append(time.perf_counter() - t0)
        del keep
        return statistics.median(times)


def _check_room(device: str, est: dict[str, Any], force: bool) -> None:
    """Refuse a run that would not fit (unless ``force``)."""
    if device == "cuda":
        free, _total = torch.cuda.mem_get_info()
        need = est["memory"]["peak"] + sum(est["memory"].get("reserve", {}).values())
    else:
        import os

        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        need = 2 * est["memory"]["peak"]  # the model copy plus the step
    if need > free and not force:
        raise UserError(f"the run needs about {need / 2**30:.2f} GiB but {free / 2**30:.2f} GiB is free on {device}; "
                        f"use smaller inputs or --force")


def _device_peak(device: str, policy: Any, gpu: Any, peak_tflops: float | None) -> tuple[str, float | None, list[str]]:
    """(device name, dense peak FLOP/s for the step's matmul dtype or None, notes)."""
    notes = []
    if device != "cuda":
        return "cpu", (peak_tflops * 1e12 if peak_tflops else None), notes
    name = torch.cuda.get_device_name()
    key = {"bf16": "bf16", "fp16": "fp16", "bf16-mixed": "bf16", "fp16-mixed": "fp16"}.get(policy.name)
    if key is None:
        key = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"
    peak = peak_tflops * 1e12 if peak_tflops else (gpu.peak_flops(key) if gpu else None)
    if gpu is None and not peak_tflops:
        notes.append(f"unknown GPU {name!r}: MFU needs --peak-tflops")
    return name, peak, notes


def validate(
    model: torch.nn.Module,
    inputs: Any,
    *,
    optimizer: Any = "adamw",
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    device: str | None = None,
    precision: str = "fp32",
    steps: int = 5,
    tolerance: float = 5.0,
    force: bool = False,
    peak_tflops: float | None = None,
    keep_output: bool = False,
    grad_accum: int = 1,
    clip_grad_norm: float | None = None,
    ema: float | None = None,
) -> Validation:
    """Estimate, then run real training iterations and compare (see the module docstring)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but no CUDA device is available; use --device cpu")
    if steps < 1:
        raise UserError(f"--steps must be >= 1, not {steps}")
    policy = parse_precision(precision)
    # on a GPU the estimate is for that GPU (its architecture decides kernels and workspaces)
    here = match_device_name(torch.cuda.get_device_name()) if device == "cuda" else None
    report = estimate(model, inputs, optimizer=optimizer, loss_fn=loss_fn, device=device, precision=precision,
                      gpu=here, solve_batch=False, keep_output=keep_output, grad_accum=grad_accum,
                      clip_grad_norm=clip_grad_norm, ema=ema)
    est = report.to_dict()
    _check_room(device, est, force)

    base_allocated = torch.cuda.memory_allocated() if device == "cuda" else 0
    run = _LiveRun(model, inputs, optimizer, loss_fn, device, policy, keep_output, grad_accum, clip_grad_norm, ema)
    measured, keep = run.first_step()
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
    name, peak, notes = _device_peak(device, policy, here, peak_tflops)
    mfu = achieved / peak if peak else None
    predicted = report.step_time  # estimate's, for the GPU it runs on (None on CPU or an unknown GPU)
    return Validation(device, name, rows, step_time, achieved, mfu, peak, tolerance, notes,
                      predicted.total if predicted else None, predicted.calibrated if predicted else None)

"""validate's serving runs: ``mode="inference"`` (a forward under ``torch.no_grad()``) and ``mode="generate"``
(transformers' ``generate()`` with its KV cache), each measured beside the estimate of the same run.

The measurements, independent of the estimator's rules and simulation:

* parameters, buffers: bytes of the real tensors of the model as it runs (cast to the precision's dtype);
* inference peak: a steady-state forward (the previous forward's output still held, as ``out = model(x)`` in a
  loop holds it until the new one replaces it): ``max_memory_allocated()`` after ``reset_peak_memory_stats()``
  on a GPU, the live-tensor tracker on CPU, less what was allocated before the run;
* generate peaks: one greedy ``generate()`` of ``new_tokens`` tokens, its peak split where its forwards start
  (forward pre-hooks on the model): the **prefill** from the call to the second forward (the prompt's forward
  and its token selection), the **last decode step** from the last forward to the return; with one new token
  there is no decode step, and no decode rows;
* KV cache: the bytes of the distinct storages of every tensor the returned cache's layers hold (keys and
  values, a linear-attention layer's states) once ``generate()`` returns: the cache at its largest;
* FLOPs: FlopCounterMode (:mod:`.flops`, its defects fixed) over the forward, or over ``generate()`` read at each
  forward's start and end (the prefill's and the last decode step's own);
* times: the median of ``steps`` synchronised forwards, or of ``steps`` ``generate()`` calls with the prefill's
  and the last decode step's forward timed by hooks; on a GPU beside the time model's prediction.

The user's model is never changed: the run uses a deep copy.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from ..api import estimate
from ..capture import split_inputs
from ..errors import UserError
from ..hardware import match_device_name
from ..precision import parse_precision
from .flops import flop_counter
from .live import check_room, device_peak, materialize_inputs, materialize_model
from .result import GENERATE_ROWS, INFERENCE_ROWS, Validation, _error
from .tracker import LiveTracker


def validate_serving(model: torch.nn.Module, inputs: Any, *, mode: str, device: str, precision: str, steps: int,
                     tolerance: float, force: bool, peak_tflops: float | None, new_tokens: int | None = None,
                     kv_cache: str = "dynamic", prompt_len: int | None = None,
                     quantize: str | None = None) -> Validation:
    """Estimate ``mode`` ("inference" or "generate"), run it for real and compare (see the module doc); ``quantize``
    ("int4", "int4-dq"): the real model's Linear layers bitsandbytes' ``Linear4bit`` (:func:`_bnb_4bit`)."""
    if quantize is not None and quantize not in ("int4", "int4-dq"):
        raise UserError(f"validate runs 4-bit weights (--quantize int4 or int4-dq) with bitsandbytes; {quantize} is "
                        f"sized by 'estimator estimate' only")
    policy = parse_precision(precision)
    here = match_device_name(torch.cuda.get_device_name()) if device == "cuda" else None
    generation = dict(new_tokens=new_tokens, kv_cache=kv_cache, prompt_len=prompt_len) if mode == "generate" else {}
    report = estimate(model, inputs, device=device, precision=precision, gpu=here, solve_batch=False, mode=mode,
                      quantize=quantize, **generation)
    est = report.to_dict()
    check_room(device, est, force)
    base_allocated = torch.cuda.memory_allocated() if device == "cuda" else 0
    live = _Live(model, device, policy, quantize)
    if mode == "inference":
        estimated = {"parameters": est["memory"]["parameters"], "buffers": est["memory"]["buffers"],
                     "peak": est["memory"]["peak"], "flops_forward": est["flops"]["matmul_forward"]}
        measured, stages = _run_forward(live, inputs, steps, base_allocated), None
        seconds = measured.pop("seconds")
        achieved = measured["flops_forward"] / seconds
        predicted = report.step_time.total if report.step_time else None
        rows = INFERENCE_ROWS
    else:
        data = report.generation
        ids = _prompt_ids(report, model, inputs, device)
        measured, stages = _run_generate(live, ids, data.new_tokens, kv_cache, steps, base_allocated)
        seconds = measured.pop("seconds")
        estimated = {"parameters": est["memory"]["parameters"], "buffers": est["memory"]["buffers"],
                     "kv_cache": data.kv_cache_bytes,
                     "peak_prefill": data.stages["prefill"].peak,
                     "flops_prefill": data.stages["prefill"].tally.flops["matmul_forward"]}
        if "decode" in data.stages:  # (one new token: the prefill alone)
            estimated.update(peak_decode=data.stages["decode"].peak,
                             flops_decode=data.stages["decode"].tally.flops["matmul_forward"])
        achieved = measured["flops_prefill"] / stages["prefill"]
        predicted = None
        rows = tuple(r for r in GENERATE_ROWS if r in measured)
    table = {k: {"estimated": estimated[k], "measured": measured[k], "error": _error(estimated[k], measured[k])}
             for k in rows}
    name, peak, notes = device_peak(device, policy, here, peak_tflops)
    if mode == "generate" and data.new_tokens == 1:
        notes.append("one new token: generate() runs the prefill only (no decode step to measure)")
    result = Validation(device, name, table, seconds, achieved, achieved / peak if peak else None, peak, tolerance,
                        notes, predicted, report.step_time.calibrated if report.step_time else None, mode=mode)
    if stages is not None:
        result.stage_times_s = stages
        result.predicted_stage_times_s = {s: report.generation.stages[s].time_s for s in stages}
    return result


class _Live:
    """The model as it serves: a private copy with real weights on ``device`` in the precision's dtype, in eval
    mode, under autocast when the precision is a mixed one; ``sync`` waits for the GPU."""

    def __init__(self, model: torch.nn.Module, device: str, policy: Any, quantize: str | None = None):
        self.device, self.dev = device, torch.device(device)
        self.cast = policy.cast
        self.quant_state: list[torch.Tensor] = []
        if quantize is None:
            self.m = materialize_model(model, self.dev, policy.cast).eval()
        else:  # 16-bit weights on the host only: the device holds the quantized model, as from_pretrained loads it
            self.m = materialize_model(model, torch.device("cpu"), policy.cast).eval()
            self.m, self.quant_state = _bnb_4bit(self.m, self.dev, policy, quantize == "int4-dq")
        self.amp: Callable[[], Any] = ((lambda: torch.autocast(device, dtype=policy.autocast)) if policy.autocast
                                       else contextlib.nullcontext)
        self.sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def states(self) -> dict[str, int]:
        """Parameters and buffers; bitsandbytes' quantization state (absmax, code: no parameters or buffers of its
        modules) counted with the buffers, as the estimate's 4-bit layers hold it."""
        nbytes = lambda ts: sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in ts}.values())  # noqa: E731
        return {"parameters": nbytes(list(self.m.parameters())),
                "buffers": nbytes(list(self.m.buffers()) + self.quant_state)}

    def resident(self) -> list[torch.Tensor]:
        return list(self.m.parameters()) + list(self.m.buffers()) + self.quant_state

    @contextlib.contextmanager
    def peak_window(self, base_allocated: int, held: list[torch.Tensor]):
        """A :class:`_Peak` of the block: ``max_memory_allocated`` on a GPU (less ``base_allocated``), the live
        tracker on CPU (``held``: the tensors alive before it, registered first)."""
        if self.device == "cuda":
            self.sync()
            torch.cuda.reset_peak_memory_stats()
            peak = _Peak(self.sync, base_allocated, None)
            yield peak
            peak.close()
            return
        tracker = LiveTracker()
        for t in held:
            tracker.register(t)
        with tracker:
            tracker.reset_peak()
            peak = _Peak(self.sync, base_allocated, tracker)
            yield peak
        peak.close()


class _Peak:
    """The peak of a window so far (:meth:`split`: read it and start a new one; ``value`` once closed)."""

    def __init__(self, sync: Callable[[], None], base_allocated: int, tracker: LiveTracker | None):
        self.sync, self.base, self.tracker, self.value = sync, base_allocated, tracker, 0

    def split(self) -> int:
        if self.tracker is not None:
            seen = self.tracker.peak
            self.tracker.reset_peak()
            return seen
        self.sync()
        seen = torch.cuda.max_memory_allocated() - self.base
        torch.cuda.reset_peak_memory_stats()
        return seen

    def close(self) -> None:
        if self.tracker is not None:
            self.value = self.tracker.peak
        else:
            self.sync()
            self.value = torch.cuda.max_memory_allocated() - self.base


def _bnb_4bit(model: torch.nn.Module, device: torch.device, policy: Any, double: bool):
    """``model`` (on the host) with the Linear layers the estimate quantizes (:func:`estimator.qlora.quantized_layers`:
    all but the output head and the layers kept in float32) replaced by bitsandbytes' ``Linear4bit`` (NF4, compute in
    the precision's dtype), moved to ``device`` (which quantizes them); and the quantization state's tensors."""
    try:
        import bitsandbytes as bnb
    except ImportError:
        raise UserError("validate --quantize runs bitsandbytes' 4-bit layers: pip install bitsandbytes") from None
    from ..layers import linear_dims
    from ..qlora import quantized_layers

    compute = policy.cast or policy.autocast or torch.float32
    for path, lin in quantized_layers(model):  # (a list: the model's tree changes in the loop)
        fan_in, fan_out = linear_dims(lin)
        # (transformers' Conv1D stores its weight in x out: quantized transposed, as its bitsandbytes integration does)
        weight = lin.weight.data if isinstance(lin, torch.nn.Linear) else lin.weight.data.t().contiguous()
        q = bnb.nn.Linear4bit(fan_in, fan_out, bias=lin.bias is not None, compute_dtype=compute,
                              quant_type="nf4", compress_statistics=double, device="cpu")
        q.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type="nf4", compress_statistics=double)
        if lin.bias is not None:
            q.bias = torch.nn.Parameter(lin.bias.data, requires_grad=False)
        parent, _, child = path.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, q)
    model = model.to(device)  # Params4bit quantizes on the move
    model.is_loaded_in_4bit = True  # what from_pretrained(quantization_config=BitsAndBytesConfig(...)) sets
    state: list[torch.Tensor] = []
    for m in model.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            qs = m.weight.quant_state
            state += [qs.absmax, qs.code] + ([qs.offset, qs.state2.absmax, qs.state2.code] if qs.nested else [])
    return model, state


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _run_forward(live: _Live, inputs: Any, steps: int, base_allocated: int) -> dict[str, Any]:
    """Parameters, buffers, the steady-state peak, the forward's FLOPs and its median time."""
    args, kwargs = split_inputs(materialize_inputs(inputs, live.dev, live.cast))

    def forward():
        with torch.no_grad(), live.amp():
            return live.m(*args, **kwargs)

    counter = flop_counter()
    with counter:
        out = forward()
    measured: dict[str, Any] = {**live.states(), "flops_forward": counter.get_total_flops()}
    with live.peak_window(base_allocated, live.resident() + _tensors((args, kwargs))) as peak:
        out = forward()
        peak.split()
        out = forward()  # the previous output (with what it holds: a cache) held until this one replaces it
    measured["peak"] = peak.value
    times = []
    for _ in range(steps):
        live.sync()
        start = time.perf_counter()
        out = forward()
        live.sync()
        times.append(time.perf_counter() - start)
    del out
    measured["seconds"] = statistics.median(times)
    return measured


def _prompt_ids(report: Any, model: torch.nn.Module, inputs: Any, device: str) -> torch.Tensor:
    """Real prompt tokens of the estimate's shape: the given ids when real, else random ids in [1, 100) (0 is
    left to padding)."""
    from ..generation import prompt_inputs

    ids = prompt_inputs(inputs, report.generation.prompt_len)[0]["input_ids"]
    if ids.device.type == "meta":
        vocab = getattr(model.config.get_text_config(decoder=True), "vocab_size", 100) or 100
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(1, max(2, min(100, vocab)), tuple(ids.shape), dtype=ids.dtype, generator=gen)
    return ids.to(device)


def _run_generate(live: _Live, ids: torch.Tensor, new_tokens: int, kv_cache: str, steps: int,
                  base_allocated: int) -> tuple[dict[str, Any], dict[str, float]]:
    """(figures, stage times): parameters, buffers, the KV cache, the prefill's and the last decode step's peaks
    and FLOPs, the median generate() time; the prefill's and the last decode step's forward times."""
    calls, marks = [0], {}
    on_start: list[Callable[[int], None]] = []
    on_end: list[Callable[[int], None]] = []

    def pre(_module, _args, _kwargs):
        calls[0] += 1
        for f in on_start:
            f(calls[0])

    def post(_module, _args, _kwargs, _out):
        for f in on_end:
            f(calls[0])

    handles = [live.m.register_forward_pre_hook(pre, with_kwargs=True),
               live.m.register_forward_hook(post, with_kwargs=True)]
    last = new_tokens  # generate() runs one forward per new token: the prefill is the 1st, the last decode the N-th

    def generate():
        calls[0] = 0
        extra = {"cache_implementation": "static"} if kv_cache == "static" else {}
        with torch.no_grad(), live.amp():
            out = live.m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                  min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None,
                                  return_dict_in_generate=True, **extra)
        if out.sequences.shape[-1] != ids.shape[-1] + new_tokens or calls[0] != new_tokens:
            raise UserError(f"generate() ran {calls[0]} forwards for {out.sequences.shape[-1] - ids.shape[-1]} new "
                            f"tokens where {new_tokens} were asked: the model's generate() stops early or adds steps")
        return out

    try:
        counter = flop_counter()
        on_start.append(lambda i: marks.__setitem__(("start", i), counter.get_total_flops()))
        on_end.append(lambda i: marks.__setitem__(("end", i), counter.get_total_flops()))
        with counter:
            generate()
        on_start.clear()
        on_end.clear()
        measured: dict[str, Any] = {**live.states(), "flops_prefill": marks[("end", 1)] - marks[("start", 1)]}
        if last > 1:
            measured["flops_decode"] = marks[("end", last)] - marks[("start", last)]
        measured.update(_generate_peaks(live, generate, on_start, last, ids, base_allocated))
        times: dict[int, list[float]] = {1: [], last: []}
        started: dict[int, float] = {}

        def start_clock(i: int) -> None:
            if i in times:
                live.sync()
                started[i] = time.perf_counter()

        def stop_clock(i: int) -> None:
            if i in times:
                live.sync()
                times[i].append(time.perf_counter() - started[i])

        on_start.append(start_clock)
        on_end.append(stop_clock)
        whole = []
        for _ in range(steps):
            live.sync()
            t0 = time.perf_counter()
            generate()
            live.sync()
            whole.append(time.perf_counter() - t0)
    finally:
        for h in handles:
            h.remove()
    measured["seconds"] = statistics.median(whole)
    stages = {"prefill": statistics.median(times[1])}
    if last > 1:
        stages["decode"] = statistics.median(times[last])
    return measured, stages


def _generate_peaks(live: _Live, generate: Callable[[], Any], on_start: list, last: int, ids: torch.Tensor,
                    base_allocated: int) -> dict[str, int]:
    """The prefill's and the last decode step's peaks of one generate(), and the returned cache's bytes."""
    from ..capture.generate import cache_tensors

    windows: dict[int, int] = {}
    with live.peak_window(base_allocated, live.resident() + [ids]) as peak:
        def split(i: int) -> None:
            if i in (2, last):  # the prefill ends where the 2nd forward starts; the last decode step starts
                windows[i] = peak.split()

        on_start.append(split)
        out = generate()
        on_start.clear()
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for _, _, t in cache_tensors(out.past_key_values)}
    found = {"peak_prefill": windows.get(2, peak.value), "kv_cache": sum(storages.values())}
    if last > 1:
        found["peak_decode"] = peak.value
    return found

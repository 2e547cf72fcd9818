"""Record real training steps on a CUDA GPU: the loops, batches near the limit, compiled and float8 steps
that the reference set (``tests/data/cuda_reference``, one loop) lacks.  Writes JSON lines under ``--out``:

* ``memory.jsonl``: per case (``tests/h100_cases.py``: model, precision, loop), three real steps with
  ``start`` (``memory_allocated()`` before), ``peak`` (``max_memory_allocated()`` over the step, stats reset
  before it), ``at_backward`` (allocated just before the first ``backward()``), ``end`` and
  ``reserved_peak``; ``ws``: the cuBLAS workspaces released by ``_cuda_clearCublasWorkspaces()`` afterwards.
  ``ops.jsonl``: for the cases marked so, a fourth step op by op (as ``record/cuda_trace.py``: op, phase,
  shapes, allocated before/after, peak during).
* ``maxbatch.jsonl``: the largest micro-batch that runs three steps (bisection; each probe starts from the
  model and an empty cache, ``torch.OutOfMemoryError`` ends it).
* ``timing.jsonl``: median wall time of 5 synchronised steps after 3 warm-ups; ``optimes.jsonl``: for the
  cases marked so, one more step with a CUDA event pair around every aten op (``[op, phase, inputs, outputs,
  us]``, as ``tests/data/cuda_reference/timing``).
* ``kernels.jsonl``: one step under ``torch.profiler``, every GPU kernel's name and microseconds
  (compiled and eager), for a fused-kernel time model.
* ``compile.jsonl``: ``torch.compile`` (whole model, default mode, or per block as torchtitan applies it)
  beside eager: peaks, bytes held when backward starts, step time, Inductor's generated kernels and the
  graph breaks; float8 (torchao ``convert_to_float8_training``, tensorwise and rowwise) where torchao imports.

The loop (``step``): for each of ``grad_accum`` micro-steps ``out = model(...)`` under autocast for
bf16-mixed, ``loss = out.loss`` (HF) or ``ce_loss(out)``, divided by ``grad_accum`` when > 1; ``keep_output``
False drops ``out`` before ``backward()`` (HF Trainer, Lightning, torchtitan); then ``AdamW.step()`` (foreach)
and ``zero_grad(set_to_none=True)``; the last loss is kept into the next step, as a loop that logs it.

    python benchmarks/record_h100.py --out DIR [--budget SECONDS] [--phases memory maxbatch timing compile]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(os.path.dirname(HERE), "tests")]

import h100_cases  # noqa: E402

DEV = "cuda"
T0 = time.time()

# (model, precision, loop, trace the ops); loop: keep_output, grad_accum, checkpoint ("full" | "layer:N" | "op")
MEMORY = [
    ("gpt2_124m", "bf16-mixed", {"keep_output": True}, False),
    ("gpt2_124m", "bf16-mixed", {}, True),
    ("gpt2_124m_wrapped", "bf16-mixed", {}, True),
    ("gpt2_124m", "fp32", {}, False),
    ("gpt2_124m_b4", "bf16-mixed", {"grad_accum": 4}, False),
    ("gpt2_124m_b4", "bf16-mixed", {"grad_accum": 4, "keep_output": True}, False),
    ("gpt2_medium_b4", "fp32", {}, False),
    ("gpt2_medium_b4", "bf16-mixed", {}, False),
    ("qwen2_05b_b4", "fp32", {}, False),
    ("qwen2_05b_b4", "bf16-mixed", {}, False),
    ("bert_base_b16", "fp32", {}, False),
    ("bert_base_b16", "bf16-mixed", {}, False),
    ("llama_small", "bf16-mixed", {}, False),
    ("llama_small", "bf16-mixed", {"checkpoint": "op"}, False),
    ("llama_small", "bf16-mixed", {"checkpoint": "layer:2"}, False),
    ("llama_small", "bf16-mixed", {"checkpoint": "full"}, False),
    ("llama_small", "fp32", {"checkpoint": "op"}, False),
    ("small_cnn_b64", "fp32", {}, True),
    ("small_cnn_b64", "bf16-mixed", {}, False),
    ("lstm_emb_b32", "fp32", {}, True),
    ("lstm_emb_b32", "bf16-mixed", {}, True),
    ("resnet18_b32", "fp32", {}, False),
    ("resnet18_b32", "bf16-mixed", {}, False),
    ("mobilenet_v3_large_b64", "fp32", {}, False),
    ("convnext_tiny_b32", "bf16-mixed", {}, False),
    ("convnext_tiny_b32", "fp32", {}, False),
]
# (search, precision, low that runs, high that does not)
MAXBATCH = [
    ("gpt2_124m_wrapped", "bf16-mixed", 44, 60),
    ("bert_base_wrapped", "fp32", 120, 176),
    ("llama_small", "bf16-mixed", 48, 112),
]
TIMING = [
    ("qwen2_05b_b4", "bf16-mixed", True), ("qwen2_05b_b4", "fp32"), ("gpt2_medium_b4", "bf16-mixed"),
    ("gpt2_medium_b4", "fp32"), ("bert_base_b16", "fp32"), ("bert_base_b16", "bf16-mixed"),
    ("mobilenet_v3_large_b64", "fp32", True), ("convnext_tiny_b32", "bf16-mixed", True), ("convnext_tiny_b32", "fp32"),
    ("resnet18_b32", "fp32"), ("resnet18_b32", "bf16-mixed"), ("small_cnn_b64", "fp32"), ("lstm_emb_b32", "fp32"),
    ("gpt2_124m", "bf16-mixed"), ("llama_small", "bf16-mixed"), ("gpt2_124m", "fp32"),
]
# (model, precision, compile: "model" | "block" | None, float8: None | "tensorwise" | "rowwise"), in order of
# importance: a background pass compiles and measures memory while the memory phase runs (Inductor's cache
# then holds the kernels), an exclusive pass at the end times them
COMPILE = [
    ("llama_small", "bf16-mixed", None, None),
    ("llama_small", "bf16-mixed", "block", None),
    ("llama_small", "bf16-mixed", "block", "tensorwise"),
    ("gpt2_124m", "bf16-mixed", None, None),
    ("gpt2_124m", "bf16-mixed", "model", None),
    ("llama_small", "bf16-mixed", "model", None),
    ("llama_small", "bf16-mixed", "block", "rowwise"),
    ("llama_small", "bf16-mixed", None, "tensorwise"),
    ("resnet18_b32", "bf16-mixed", "model", None),
]

# (model, precision, compile) profiled kernel by kernel (phase "kernels")
KERNELS = [("gpt2_124m", "bf16-mixed", "model"), ("gpt2_124m", "bf16-mixed", None),
           ("llama_small", "bf16-mixed", "block"), ("llama_small", "bf16-mixed", None)]


def left() -> float:
    return BUDGET - (time.time() - T0)


def emit(out_dir: str, name: str, rec: dict) -> None:
    rec["t"] = round(time.time() - T0, 1)
    with open(os.path.join(out_dir, name), "a") as f:
        f.write(json.dumps(rec) + "\n")


def _to(x, device):
    return {k: v.to(device) for k, v in x.items()} if isinstance(x, dict) else tuple(a.to(device) for a in x)


def _blocks(model) -> list[tuple[torch.nn.Module, str, torch.nn.Module]]:
    """(parent, attribute, block) of every transformer block (HF ``*DecoderLayer`` / ``GPT2Block``)."""
    found = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child).__name__.endswith(("DecoderLayer", "Block")) and type(child).__name__ != "ConvNextBlock":
                found.append((parent, name, child))
    return found


def prepare(name, builder, precision, loop, compile_=None, float8=None):
    """The model on the GPU with its loop applied, its inputs, loss and a ``step()``."""
    model, inputs, loss_fn = builder(device="cpu")
    model = model.to(DEV).train()
    inputs = _to(inputs, DEV)
    policy = loop.get("checkpoint")
    if policy:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        every = int(policy.split(":")[1]) if policy.startswith("layer:") else 1
        kwargs = {"context_fn": h100_cases.torchtitan_op_context_fn} if policy == "op" else {}
        for k, (parent, attr, block) in enumerate(_blocks(model), start=1):
            if k % every == 0:
                setattr(parent, attr, checkpoint_wrapper(block, **kwargs))
    if float8:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        config = Float8LinearConfig.from_recipe_name(float8)
        convert_to_float8_training(model, config=config,
                                   module_filter_fn=lambda m, fqn: fqn not in ("lm_head", "inner.lm_head"))
    call = model
    if compile_ == "model":
        call = torch.compile(model)
    elif compile_ == "block":
        for parent, attr, block in _blocks(model):
            setattr(parent, attr, torch.compile(block))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    amp = {"bf16-mixed": torch.bfloat16}.get(precision)
    keep_output, accum = loop.get("keep_output", False), loop.get("grad_accum", 1)
    state = {"phase": "", "at_backward": None}

    def step():
        loss = None
        for _ in range(accum):
            state["phase"] = "forward"
            with torch.autocast(DEV, dtype=amp or torch.float32, enabled=amp is not None):
                out = call(**inputs) if isinstance(inputs, dict) else call(*inputs)
                loss = out if isinstance(out, torch.Tensor) and out.dim() == 0 else (
                    loss_fn(out) if loss_fn else out.loss)
            if accum > 1:
                loss = loss / accum
            if not keep_output:
                out = None
            if state["at_backward"] is None:
                state["at_backward"] = torch.cuda.memory_allocated()
            state["phase"] = "backward"
            loss.backward()
        state["phase"] = "optimizer"
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["phase"] = ""
        del out
        return loss

    return model, step, state


def _spec(t):
    return [list(t.shape), str(t.dtype).removeprefix("torch."), list(t.stride())]


class OpTrace(TorchDispatchMode):
    def __init__(self, state):
        super().__init__()
        self.rows, self.state = [], state

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = func(*args, **kwargs)
        after, peak = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
        ins = [_spec(a) for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        outs = [_spec(o) + [o.untyped_storage().nbytes()] for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        self.rows.append({"op": str(func), "phase": self.state["phase"], "in": ins, "out": outs, "before": before,
                          "after": after, "peak": peak})
        return out


def clean() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def memory_steps(step, state, n=3):
    steps, keep = [], None
    for _ in range(n):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        state["at_backward"] = None
        start = torch.cuda.memory_allocated()
        keep = step()
        torch.cuda.synchronize()
        steps.append({"start": start, "peak": torch.cuda.max_memory_allocated(), "at_backward": state["at_backward"],
                      "end": torch.cuda.memory_allocated(), "reserved_peak": torch.cuda.max_memory_reserved()})
    return steps, keep


def record_memory(out, name, precision, loop, trace):
    clean()
    model, step, state = prepare(name, h100_cases.MODELS[name], precision, loop)
    rec = {"case": name, "precision": precision, "loop": loop,
           "params": sum(p.numel() for p in model.parameters())}
    rec["steps"], keep = memory_steps(step, state)
    if trace:
        tr = OpTrace(state)
        state["at_backward"] = None
        with tr:
            keep = step()
        torch.cuda.synchronize()
        emit(out, "ops.jsonl", {"case": name, "precision": precision, "loop": loop, "ops": tr.rows})
    before = torch.cuda.memory_allocated()
    torch._C._cuda_clearCublasWorkspaces()
    rec["ws"] = before - torch.cuda.memory_allocated()
    del keep, model, step, state
    emit(out, "memory.jsonl", rec)
    s = rec["steps"]
    print(f"memory {name:24s} {precision:10s} {json.dumps(loop):40s} peak1 {s[0]['peak'] / 2**20:9.1f} "
          f"peak2 {s[1]['peak'] / 2**20:9.1f} peak3 {s[2]['peak'] / 2**20:9.1f} MiB", flush=True)


def runs(search, precision, batch) -> bool:
    """Whether ``batch`` runs three steps from a fresh model and an empty cache."""
    clean()
    model = step = state = None
    try:
        model, step, state = prepare(search, h100_cases.SEARCHES[search](batch), precision, {})
        memory_steps(step, state)
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        del model, step, state
        clean()


def record_maxbatch(out, search, precision, lo, hi):
    """Bisect between ``lo`` (runs) and ``hi`` (does not); bounds that are wrong (another card) are moved
    out by their gap until they hold."""
    tried = {}
    step = max(hi - lo, 2)
    while not runs(search, precision, lo) and left() > 20:
        tried[lo] = False
        lo, hi = max(1, lo - step), lo
        if lo == 1 and not runs(search, precision, 1):
            emit(out, "maxbatch.jsonl", {"case": search, "precision": precision, "error": "1 does not run"})
            return
    tried[lo] = True
    while hi not in tried and left() > 20:
        tried[hi] = ok = runs(search, precision, hi)
        if not ok:
            break
        lo, hi = hi, hi + step
    while hi - lo > 1 and left() > 20:
        mid = (lo + hi) // 2
        tried[mid] = ok = runs(search, precision, mid)
        lo, hi = (mid, hi) if ok else (lo, mid)
    free, total = torch.cuda.mem_get_info()
    emit(out, "maxbatch.jsonl", {"case": search, "precision": precision, "largest": lo, "smallest_failing": hi,
                                  "exact": hi - lo == 1, "tried": tried, "total_memory": total,
                                  "device_total": torch.cuda.get_device_properties(0).total_memory})
    print(f"maxbatch {search:24s} {precision:10s} largest {lo} (fails at {hi})", flush=True)


def timed(step, warmup=3, n=5):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


class OpTimer(TorchDispatchMode):
    """A CUDA event pair around every aten op (as ``record/cuda_timing.py``; launch gaps included)."""

    def __init__(self, state):
        super().__init__()
        self.rows, self.state = [], state

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        out = func(*args, **kwargs)
        e.record()
        ins = [_spec(a) for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        outs = [_spec(o) for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        self.rows.append([str(func), self.state["phase"], ins, outs, (s, e)])
        return out


def record_timing(out, name, precision, per_op=False):
    clean()
    model, step, state = prepare(name, h100_cases.MODELS[name], precision, {})
    median, times = timed(step)
    emit(out, "timing.jsonl", {"case": name, "precision": precision, "step_s_median": median, "step_s_all": times})
    if per_op:
        timer = OpTimer(state)
        with timer:
            step()
        torch.cuda.synchronize()
        rows = [r[:4] + [round(r[4][0].elapsed_time(r[4][1]) * 1e3, 2)] for r in timer.rows]
        emit(out, "optimes.jsonl", {"case": name, "precision": precision, "ops": rows})
    print(f"timing {name:24s} {precision:10s} {median * 1e3:8.2f} ms", flush=True)
    del model, step, state


def record_compile(out, name, precision, compile_, float8, timing=True):
    import torch._dynamo
    import torch._inductor.metrics as metrics

    clean()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    metrics.reset()
    t0 = time.time()
    model, step, state = prepare(name, h100_cases.MODELS[name], precision, {}, compile_, float8)
    step()  # compiles forward and backward
    compile_s = time.time() - t0
    steps, keep = memory_steps(step, state)
    del keep
    median, times = timed(step, warmup=2) if timing else (None, [])
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    rec = {"case": name, "precision": precision, "compile": compile_, "float8": float8, "steps": steps,
           "step_s_median": median, "step_s_all": times, "compile_s": compile_s, "pass": PASS,
           "generated_kernels": metrics.generated_kernel_count, "graph_breaks": breaks,
           "params": sum(p.numel() for p in model.parameters())}
    emit(out, "compile.jsonl", rec)
    print(f"compile {name:20s} {precision:10s} {str(compile_):6s} {str(float8):10s} peak2 "
          f"{steps[1]['peak'] / 2**20:9.1f} MiB at_backward {steps[1]['at_backward'] / 2**20:9.1f} MiB step "
          f"{(median or 0) * 1e3:8.2f} ms kernels {metrics.generated_kernel_count} breaks {breaks} "
          f"compile {compile_s:.0f} s", flush=True)
    del model, step, state


def record_kernels(out, name, precision, compile_, float8=None):
    """One step of a compiled (or eager) model under ``torch.profiler``: every GPU kernel with its name,
    duration and the op or Inductor kernel that launched it, for a fused-kernel time model."""
    from torch.profiler import ProfilerActivity, profile

    clean()
    model, step, state = prepare(name, h100_cases.MODELS[name], precision, {}, compile_, float8)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.events():
        if getattr(e, "is_user_annotation", False):
            continue  # a range on the GPU timeline (the optimizer's step), not a kernel
        if e.device_type.name == "CUDA" or getattr(e, "device_type", None) == "cuda":
            rows.append([e.name[:200], round(e.device_time if hasattr(e, "device_time") else e.cuda_time, 2)])
    emit(out, "kernels.jsonl", {"case": name, "precision": precision, "compile": compile_, "float8": float8,
                                "kernels": rows, "total_us": round(sum(r[1] for r in rows), 1)})
    print(f"kernels {name:20s} {precision:10s} {str(compile_):6s} {len(rows)} kernels "
          f"{sum(r[1] for r in rows) / 1e3:.2f} ms", flush=True)
    del model, step, state


def guarded(fn, out, *args, need=10):
    if left() < need:
        print(f"skip {fn.__name__}{args}: {left():.0f} s left", flush=True)
        return
    try:
        fn(out, *args)
    except Exception as e:  # record the failure and go on with the next case
        emit(out, "meta.jsonl", {"fn": fn.__name__, "args": [str(a) for a in args], "error": repr(e)[:2000],
                                   "trace": traceback.format_exc()[-3000:]})
        print(f"error {fn.__name__}{args}: {e!r}"[:400], flush=True)
        clean()


def _parsed(items: list[str] | None) -> list[tuple]:
    """CASE:PRECISION:COMPILE:FLOAT8 arguments as tuples ("none": None)."""
    return [tuple(None if v == "none" else v for v in item.split(":")) for item in items or ()]


def main():
    global BUDGET, PASS
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=480)
    ap.add_argument("--phases", nargs="*", default=["memory", "maxbatch", "timing", "compile"])
    ap.add_argument("--only", nargs="*", help="case names to keep")
    ap.add_argument("--per-op", nargs="*", help="CASE:PRECISION to time op by op")
    ap.add_argument("--maxbatch", nargs="*", help="CASE:PRECISION:LOW:HIGH searches instead of MAXBATCH's (another card)")
    ap.add_argument("--compile-rows", nargs="*", help="CASE:PRECISION:COMPILE:FLOAT8 rows instead of COMPILE's "
                    "('none' for None)")
    ap.add_argument("--kernel-rows", nargs="*", help="CASE:PRECISION:COMPILE:FLOAT8 profiles instead of KERNELS'")
    a = ap.parse_args()
    BUDGET = a.budget
    PASS = "warm" if "compile-warm" in a.phases else "main"
    os.makedirs(a.out, exist_ok=True)
    keep = (lambda n: n in a.only) if a.only else (lambda n: True)
    rows = _parsed(a.compile_rows) or COMPILE
    profiles = _parsed(a.kernel_rows) or [(*k, None) for k in KERNELS]
    emit(a.out, "meta.jsonl", {"pass": PASS, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                              "total_memory": torch.cuda.get_device_properties(0).total_memory})
    background = None
    if "memory" in a.phases and "compile" in a.phases:  # compile beside the memory phase (per-process counters)
        background = subprocess.Popen([sys.executable, __file__, "--out", a.out, "--phases", "compile-warm",
                                       "--budget", str(BUDGET * 0.5)] + (["--only", *a.only] if a.only else []))
    if "compile-warm" in a.phases:
        for name, precision, compile_, float8 in rows:
            if keep(name):
                guarded(record_compile, a.out, name, precision, compile_, float8, False, need=45)
    if "memory" in a.phases:
        for name, precision, loop, trace in MEMORY:
            if keep(name):
                guarded(record_memory, a.out, name, precision, loop, trace)
    if background is not None:
        try:
            background.wait(timeout=max(1.0, BUDGET * 0.5 - (time.time() - T0)))
        except subprocess.TimeoutExpired:
            background.kill()
            print("compile-warm: stopped at its budget", flush=True)
    if "maxbatch" in a.phases:
        searches = [(c, p, int(lo), int(hi)) for c, p, lo, hi in (m.split(":") for m in a.maxbatch)] if a.maxbatch \
            else MAXBATCH
        for search, precision, lo, hi in searches:
            if keep(search):
                guarded(record_maxbatch, a.out, search, precision, lo, hi, need=40)
    if "timing" in a.phases:
        for name, precision, *per_op in TIMING:
            if keep(name):
                guarded(record_timing, a.out, name, precision, *per_op)
    if "compile" in a.phases:
        for name, precision, compile_, float8 in rows:
            if keep(name):
                guarded(record_compile, a.out, name, precision, compile_, float8, need=30)
    for item in a.per_op or ():  # CASE:PRECISION, per-op CUDA-event timings
        name, precision = item.split(":")
        guarded(record_timing, a.out, name, precision, True)
    if "kernels" in a.phases:
        for name, precision, compile_, float8 in profiles:
            guarded(record_kernels, a.out, name, precision, compile_, float8, need=40)
    print(f"done in {time.time() - T0:.0f} s", flush=True)


BUDGET = 480.0
PASS = "main"

if __name__ == "__main__":
    main()

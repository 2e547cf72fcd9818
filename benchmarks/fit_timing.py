"""Fit the step-time model (``estimator/timing/``) on measured H100 training steps.

    python benchmarks/fit_timing.py                 # fit, write estimator/data/timing_h100.json
    python benchmarks/fit_timing.py --lomo          # leave-one-model-out table (markdown), no write
    python benchmarks/fit_timing.py --check         # the shipped constants vs the measurements
    python benchmarks/fit_timing.py --capture       # the shipped constants on this project's capture
    python benchmarks/fit_timing.py --report        # benchmarks/README.md's tables (leave-one-model-out
                                                    # on the reference ops and on the capture)
    python benchmarks/fit_timing.py --import-reference /path/to/cuda-reference
                                                    # refresh the compact copy the fit reads

Data: ``tests/data/cuda_reference/timing/CASE__PRECISION.json.gz``, a compact copy of the CUDA
reference measurements (H100 80GB HBM3, torch 2.11.0+cu130; see the README there): per case
the median step time (5 synced steps, no instrumentation) and one instrumented step, every aten
op with its inputs and outputs (shape, dtype, stride) and its CUDA-event time.

What is fitted, in two stages (about 1.5 s together):

1. **Kernels** (``launch_s``, ``library_s``, ``bandwidth``, ``memory_eff``, ``overlap_p``, the
   efficiencies ``eff``, ``attention_backward``, ``conv_backward``, ``fill_rows``, ``n0``, ``k0``,
   ``align_gamma``): a robust least squares (soft-L1 loss on the log of predicted / measured,
   scale 0.1, L-BFGS) of :func:`estimator.timing.gpu_seconds` against the per-op CUDA-event
   times.  The instrumented step runs its host side ~10x slower than a real one, so the GPU often
   idles and an event pair then times the host's dispatch as well.  An op counts as *timed on a
   busy GPU* when the op just before it launched no kernel and its own event pair read under
   2.5 us (so the queue was not empty), when its phase ran on a busy GPU throughout (90% of the
   phase's kernel-less ops read under 2.5 us), or when it took over 500 us (the host's share is
   then small); the other kernel ops give upper bounds (only predictions above them are
   penalised).  Each constant lives in a physical range (``_BOUNDS``) and is pulled weakly
   (``PRIOR``) to its middle, which matters only where no op constrains it.
2. **Host** (``cpu_view`` per phase from a dispatch and a forward-Python constant, ``cpu_inop``
   per op name, ``cpu_tensor``): first the per-op-name table of host time inside each op from the
   same instrumented steps (``inop_table``: event time minus predicted kernel time on an idle GPU,
   less a view's event time), then four constants from the median step times through the
   two-timeline simulation of :func:`estimator.timing.timeline` with the stage-1 kernel times,
   each case weighted by how precisely its median is measured (:func:`fit_host`).
   The simulated step is piecewise linear in the host constants (a max-plus recurrence); at given
   constants it equals ``a . c + b`` exactly (``a``: how much of each host constant lies on the
   critical path, ``b``: the kernel time on it), so the fit is Gauss-Newton: a non-negative
   least squares of the relative step errors, then the largest step towards it (1, 1/2, ...)
   that lowers the squared log errors of the true simulation.

Efficiencies without measurements (no case runs them) are set by stated assumptions and say
so in the data file: ``matmul.tf32`` = ``matmul.half`` (the same tensor-core kernels at the TF32
rate), ``conv.fp32`` = ``conv.tf32``, ``attention.flash.half`` = ``attention.efficient.half`` =
``attention.cudnn.half`` (FlashAttention-2-class kernels), ``attention.flash.fp32`` =
``attention.efficient.fp32``.

SDPA's ``is_causal`` is not in the records (only tensors were recorded): it is taken from the
model definitions (``CAUSAL`` below: the decoder-only models call SDPA with ``is_causal=True``).
"""

from __future__ import annotations

import argparse
import datetime
import glob
import gzip
import json
import math
import os
import sys
from dataclasses import dataclass, field, replace

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from estimator import timing as T  # noqa: E402
from estimator.compat import import_torchvision  # noqa: E402
from estimator.hardware import lookup as lookup_gpu  # noqa: E402

import_torchvision()  # transformers imports torchvision: PyPI's beside the CPU torch needs the schemas it defines

DATA = os.path.join(ROOT, "tests", "data", "cuda_reference", "timing")
OUT = os.path.join(ROOT, "estimator", "data", "timing_h100.json")
GPU_NAME = "H100-SXM"

# case -> model (leave-one-model-out holds out every case of a model: batch sizes, lengths, precisions)
MODELS = {
    "gpt2_124m": "gpt2", "gpt2_124m_b2": "gpt2", "gpt2_124m_b16_s512": "gpt2",
    "llama_small": "llama", "llama_small_b1": "llama", "llama_small_s4096": "llama",
    "resnet50_b16": "resnet50", "resnet50_b64": "resnet50", "resnet50_b256": "resnet50",
    "bert_small": "bert", "t5_small": "t5", "mixtral_small": "mixtral", "lstm_2x512": "lstm",
    "mobilenet_v3_small_b64": "mobilenet_v3", "example_gpt": "example_gpt", "example_vgg": "example_vgg",
}
# models whose SDPA calls pass is_causal=True (decoder-only LMs; record/cuda_trace.py:cases())
CAUSAL = {"gpt2", "llama", "mixtral", "example_gpt"}

BACKLOG_S = 2.5e-6  # an event pair around a kernel-less op reads ~1.2 us when the GPU queue is busy
LONG_S = 500e-6  # ops this long are timed on the GPU even when the host was late


# -- data ------------------------------------------------------------------------------------


def import_reference(src: str, dst: str = DATA) -> list[str]:
    """Write the compact copy: timing/*.timing.json.gz joined with memory/*.json.gz op by op."""
    os.makedirs(dst, exist_ok=True)
    written = []
    for f in sorted(glob.glob(os.path.join(src, "timing", "*.timing.json.gz"))):
        with gzip.open(f, "rt") as fh:
            tim = json.load(fh)
        with gzip.open(f.replace(os.sep + "timing" + os.sep, os.sep + "memory" + os.sep).replace(".timing", ""),
                       "rt") as fh:
            mem = json.load(fh)
        if len(tim["ops"]) != len(mem["ops"]):
            raise ValueError(f"{f}: {len(tim['ops'])} timed ops, {len(mem['ops'])} traced ops")
        ops = []
        for o, m in zip(tim["ops"], mem["ops"]):
            if o["op"] != m["op"] or o["phase"] != m["phase"]:
                raise ValueError(f"{f}: op order differs ({o['op']} / {m['op']})")
            # [op, phase, inputs [shape, dtype, stride], outputs [shape, dtype, stride], microseconds]
            ops.append([o["op"], o["phase"], [t[:3] for t in m["in"]], [t[:3] for t in m["out"]],
                        round(o["gpu_ms"] * 1e3, 2)])
        rec = {k: tim[k] for k in ("case", "precision", "device", "torch", "step_s_median", "step_s_all")}
        rec.update(cuda=mem.get("cuda"), cudnn=mem.get("cudnn"), ops=ops)
        out = os.path.join(dst, f"{tim['case']}__{tim['precision']}.json.gz")
        with gzip.open(out, "wt", compresslevel=9) as fh:
            json.dump(rec, fh, separators=(",", ":"))
        written.append(out)
    return written


def timed_ops(works: list[T.OpWork], measured: list[float]) -> list[bool]:
    """Which event times are kernel times (the GPU queue was not empty when the op was issued).

    A kernel-less op's event pair reads ~1.2 us when the queue is busy and the host's dispatch
    time (10-20 us here) when it is empty.  An op is timed when the op just before it is such a
    fast kernel-less op, when its phase ran on a busy GPU throughout (90% of its kernel-less ops
    read fast), or when it took over LONG_S."""
    busy_phase = {}
    for phase in T.PHASES:
        views = [m for w, m in zip(works, measured) if w.kind == T.VIEW and w.phase == phase]
        busy_phase[phase] = bool(views) and sum(m < BACKLOG_S for m in views) >= 0.9 * len(views)
    timed = [False] * len(works)
    for i, w in enumerate(works):
        if w.kind in T.NO_KERNEL:
            continue
        prev = works[i - 1] if i else None
        timed[i] = (busy_phase[w.phase] or measured[i] > LONG_S
                    or (prev is not None and prev.kind in (T.VIEW, T.HOST) and measured[i - 1] < BACKLOG_S))
    return timed


@dataclass
class Case:
    name: str
    precision: str
    model: str
    step_s: float
    works: list[T.OpWork]
    measured: list[float]  # seconds per op (CUDA events, instrumented step)
    timed: list[bool]  # the event pair timed the kernel (see the module docstring)
    meta: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.name}__{self.precision}"


def load_cases(data: str = DATA) -> list[Case]:
    cases = []
    for f in sorted(glob.glob(os.path.join(data, "*__*.json.gz"))):
        with gzip.open(f, "rt") as fh:
            rec = json.load(fh)
        model = MODELS[rec["case"]]
        causal = model in CAUSAL
        works, measured = [], []
        for op, phase, ins, outs, us in rec["ops"]:
            works.append(T.OpWork.from_record({"op": op, "phase": phase, "in": [t[:2] for t in ins]},
                                              {"in": ins, "out": outs}, causal=causal))
            measured.append(us * 1e-6)
        timed = timed_ops(works, measured)
        cases.append(Case(rec["case"], rec["precision"], model, rec["step_s_median"], works, measured, timed,
                          {k: rec.get(k) for k in ("device", "torch", "cuda", "cudnn", "step_s_all")}))
    return cases


# -- stage 1: kernels ---------------------------------------------------------------------------

_FITTED_EFF = ("matmul.fp32", "matmul.half", "conv.tf32", "conv.half", "conv.grouped", "attention.efficient.fp32")
_KERNEL_TIMED = ("unused: bf16 / fp16 attention is timed from its own kernel measurements "
                 "(estimator/timing/attention.py); kept equal to the GEMMs' for a model without them")
_ASSUMED_EFF = {  # key -> (source key, why)
    "matmul.tf32": ("matmul.half", "no fp32 case runs TF32 GEMMs (allow_tf32 is off by default): the "
                                   "tensor-core kernels' efficiency, at the TF32 peak"),
    "conv.fp32": ("conv.tf32", "cuDNN runs fp32 convolutions as TF32 by default; not measured without"),
    "attention.cudnn.half": ("matmul.half", _KERNEL_TIMED),
    "attention.flash.half": ("matmul.half", _KERNEL_TIMED),
    "attention.efficient.half": ("matmul.half", _KERNEL_TIMED),
    "attention.flash.fp32": ("attention.efficient.fp32", "flash has no fp32 kernel; SDPA falls back to efficient"),
}
# fitted keys that no op of the cases constrains: (source key, why)
_UNFITTED = {
    "conv.grouped": ("conv.tf32", "no grouped convolution but depthwise ones in the cases, and those are timed from "
                                  "their own kernels (estimator/timing/depthwise.py): the convolutions' efficiency, "
                                  "on the CUDA cores' peak"),
}


def _kernel_timed_attention(w: T.OpWork) -> bool:
    return w.kind == T.ATTENTION and T.precision_of(w)[1] == "half"


def _fitted_from(cases: list[Case], key: str) -> list[str]:
    """The cases with an op whose time the fit of efficiency ``key`` uses."""
    return sorted({c.key for c in cases for w in c.works if w.kind in (T.MATMUL, T.CONV, T.ATTENTION)
                   and not w.depthwise and T.efficiency_key(w, T.precision_of(w)[1]) == key})


class _Features:
    """The timed kernel ops of some cases as tensors (one row per op)."""

    def __init__(self, cases: list[Case], peaks: dict[str, float], timed: bool = True):
        # depthwise convolutions and half-precision attention are timed from their own kernel measurements
        # (estimator/timing/depthwise.py, attention.py)
        rows = [(w, m, c.key) for c in cases for w, m, t in zip(c.works, c.measured, c.timed)
                if t == timed and w.kind in (T.MEMORY, T.MATMUL, T.CONV, T.ATTENTION) and m > 0 and not w.depthwise
                and not _kernel_timed_attention(w)]
        self.rows = rows
        f = lambda xs: torch.tensor(xs, dtype=torch.float64)  # noqa: E731
        self.measured = f([m for _, m, _ in rows])
        self.memory = torch.tensor([w.kind == T.MEMORY for w, _, _ in rows], dtype=torch.bool)
        self.memory_class = torch.tensor([T.MEMORY_CLASSES.index(w.memory_class) for w, _, _ in rows],
                                         dtype=torch.long)
        self.launches = f([w.launches for w, _, _ in rows])
        self.bytes = f([w.bytes for w, _, _ in rows])
        self.streamed = f([w.streamed for w, _, _ in rows])
        flops, peak, size_rows, k, align, eff_idx, attn_bwd, conv_bwd = [], [], [], [], [], [], [], []
        mm, nn = [], []
        self.eff_keys = list(_FITTED_EFF)
        for w, _, _ in rows:
            if w.kind == T.MEMORY:
                flops.append(0.0), peak.append(1.0), size_rows.append(1.0), k.append(1.0), align.append(16.0)
                mm.append(1.0), nn.append(1.0)
                eff_idx.append(0), attn_bwd.append(False), conv_bwd.append(False)
                continue
            peak_key, prec = T.precision_of(w)
            key = T.efficiency_key(w, prec)
            flops.append(w.flops * (T.causal_fraction(w.m, w.n) if w.kind == T.ATTENTION and w.causal else 1.0))
            peak.append(peaks[peak_key])
            attention = w.kind == T.ATTENTION
            # attention has no size factor: rows and k far above the constants make it 1
            size_rows.append(1e30 if attention else float(w.batch * w.m * w.n))
            k.append(1e30 if attention else float(w.k))
            mm.append(1e30 if attention else float(w.m))
            nn.append(1e30 if attention else float(w.n))
            align.append(float(w.align) if prec not in ("fp32", "grouped") else 16.0)
            eff_idx.append(self.eff_keys.index(key))
            attn_bwd.append(attention and w.backward)
            conv_bwd.append(w.kind == T.CONV and w.backward)
        self.flops, self.peak, self.size_rows, self.k, self.align = f(flops), f(peak), f(size_rows), f(k), f(align)
        self.m, self.n = f(mm), f(nn)
        self.eff_idx = torch.tensor(eff_idx, dtype=torch.long)
        self.attn_bwd = torch.tensor(attn_bwd, dtype=torch.bool)
        self.conv_bwd = torch.tensor(conv_bwd, dtype=torch.bool)

    _TENSORS = ("measured", "memory", "memory_class", "launches", "bytes", "streamed", "flops", "peak", "size_rows",
                "k", "align", "m", "n", "eff_idx", "attn_bwd", "conv_bwd")

    @classmethod
    def of(cls, cases: list[Case], peaks: dict[str, float], timed: bool) -> "_Features":
        """The rows of ``cases``, built once per case and concatenated (a LOMO fold reuses them)."""
        parts = []
        for c in cases:
            cache = c.meta.setdefault("_features", {})
            if timed not in cache:
                cache[timed] = cls([c], peaks, timed)
            parts.append(cache[timed])
        out = cls.__new__(cls)
        out.rows = [r for part in parts for r in part.rows]
        out.eff_keys = list(_FITTED_EFF)
        for name in cls._TENSORS:
            setattr(out, name, torch.cat([getattr(part, name) for part in parts]))
        return out

    def predict(self, p: dict[str, torch.Tensor]) -> torch.Tensor:
        """:func:`estimator.timing.gpu_seconds` over the rows, with the constants as tensors."""
        bandwidth = p["bandwidth"] * p["memory_eff"][self.memory_class]
        t_memory = (self.launches * p["launch_s"] + (self.bytes - self.streamed) / bandwidth
                    + self.streamed / p["bandwidth"])
        eff = p["eff"][self.eff_idx]
        eff = eff * torch.where(self.attn_bwd, p["attention_backward"], 1.0)
        eff = eff * torch.where(self.conv_bwd, p["conv_backward"], 1.0)
        size = T.size_factor(self.size_rows, self.m, self.n, self.k, p["fill_rows"], p["n0"], p["k0"])
        align = T.align_factor(self.align, p["align_gamma"])
        compute = T.compute_seconds(self.flops, self.peak, eff, size, align)
        t_compute = self.launches * p["library_s"] + T.soft_max_p(compute, self.bytes / p["bandwidth"], p["overlap_p"])
        return torch.where(self.memory, t_memory, t_compute)


# Bounds of the kernel constants (physical ranges; a sigmoid maps the unconstrained parameters
# into them, on a log scale where the range spans decades).  The fit also pulls every parameter
# weakly towards the middle of its range (PRIOR), which only matters where no op constrains it.
_BOUNDS = {  # name: (low, high, log scale)
    "launch_s": (0.5e-6, 20e-6, True), "library_s": (1e-6, 60e-6, True), "bandwidth_frac": (0.3, 1.0, False),
    "overlap_p": (1.0, 16.0, True), "attention_backward": (0.25, 4.0, True), "conv_backward": (0.25, 4.0, True),
    "fill_rows": (1.0, 1e7, True), "n0": (0.1, 1024.0, True), "k0": (1.0, 1024.0, True), "align_gamma": (0.0, 2.0, False),
    "memory_eff": (0.03, 1.0, False), "eff": (0.01, 1.0, False),
}
PRIOR = 1e-3  # weight of the pull towards the middle of each range (the data's loss is ~0.01-1)
_SCALARS = ("launch_s", "library_s", "bandwidth_frac", "overlap_p", "attention_backward", "conv_backward",
            "fill_rows", "n0", "k0", "align_gamma")
_N_MEMORY = len(T.MEMORY_CLASSES) - 1  # elementwise is the reference


def _bounded(theta: torch.Tensor, name: str) -> torch.Tensor:
    lo, hi, log = _BOUNDS[name]
    if log:
        return torch.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * torch.sigmoid(theta))
    return lo + (hi - lo) * torch.sigmoid(theta)


def _unpack(theta: torch.Tensor, n_eff: int, datasheet_bw: float) -> dict[str, torch.Tensor]:
    """Unconstrained parameters -> constants in their physical ranges (_BOUNDS)."""
    p = {name: _bounded(theta[i], name) for i, name in enumerate(_SCALARS)}
    p["bandwidth"] = datasheet_bw * p.pop("bandwidth_frac")
    i = len(_SCALARS)
    # elementwise kernels are the reference class (1); the others are fractions of it
    p["memory_eff"] = torch.cat([torch.ones(1, dtype=theta.dtype), _bounded(theta[i:i + _N_MEMORY], "memory_eff")])
    p["eff"] = _bounded(theta[i + _N_MEMORY:i + _N_MEMORY + n_eff], "eff")
    return p


def fit_kernels(cases: list[Case], gpu=None) -> dict:
    """Stage 1: the kernel constants.

    Loss per op on r = log(predicted / measured): soft-L1 (scale 0.1) for the ops timed on a
    busy GPU; for the other kernel ops the event time is an upper bound of the kernel (the host's
    dispatch is added), so only r > 0 is penalised (soft-L1 of max(r, 0), half weight)."""
    gpu = gpu or lookup_gpu(GPU_NAME)
    peaks = T.datasheet_peaks(gpu)
    timed = _Features.of(cases, peaks, timed=True)
    bound = _Features.of(cases, peaks, timed=False)
    n_eff = len(timed.eff_keys)
    theta = torch.zeros(len(_SCALARS) + _N_MEMORY + n_eff, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([theta], lr=1.0, max_iter=300, tolerance_grad=1e-9, tolerance_change=1e-12,
                            history_size=30, line_search_fn="strong_wolfe")
    scale = 0.1

    def soft_l1(r):
        return torch.sqrt(1 + (r / scale) ** 2) - 1

    def loss_fn():
        opt.zero_grad()
        p = _unpack(theta, n_eff, gpu.bandwidth)
        r = torch.log(timed.predict(p) / timed.measured)
        r_bound = torch.clamp(torch.log(bound.predict(p) / bound.measured), min=0.0)
        loss = (soft_l1(r).sum() + 0.5 * soft_l1(r_bound).sum()) / len(r) + PRIOR * (theta ** 2).sum()
        loss.backward()
        return loss

    for _ in range(2):
        opt.step(loss_fn)
    with torch.no_grad():
        p = _unpack(theta, n_eff, gpu.bandwidth)
        r = torch.log(timed.predict(p) / timed.measured)
    out = {k: float(v) for k, v in p.items() if k not in ("eff", "memory_eff")}
    out["memory_eff"] = {c: float(v) for c, v in zip(T.MEMORY_CLASSES, p["memory_eff"])}
    out["eff"] = {key: float(p["eff"][i]) for i, key in enumerate(timed.eff_keys)}
    out["_residuals"] = r
    out["_features"] = timed
    return out


# -- stage 2: host ------------------------------------------------------------------------------

_HOST = ("dispatch", "python", "inop", "tensor")
MIN_SAMPLES = 3  # an op name enters the in-op table with at least this many idle-GPU samples


def inop_table(cases: list[Case], kernels: T.TimingModel,
               gpu_s: dict[str, list[float]] | None = None) -> tuple[dict[str, float], dict[str, float]]:
    """Host time spent inside each op beyond a view's, by aten op name, from the instrumented step.

    When the GPU is idle (the op is not ``timed``) an event pair reads the host's time from the
    first event to the second: the dispatcher, the op's own host work (allocation,
    TensorIterator set-up, library descriptors and plans, the launch) and the kernel if that is
    longer.  Per op name: median of (event time - predicted kernel time) over such ops, less the
    median event time of a view (the cost of the instrumentation itself).  Also per class
    (``kernel``, ``cublas``, ``cudnn``, ``foreach``), for op names without samples."""
    per: dict[str, list[float]] = {}
    per_class: dict[str, list[float]] = {}
    views = []
    for c in cases:
        g_s = gpu_s[c.key] if gpu_s else [T.gpu_seconds(w, kernels) for w in c.works]
        for w, m, t, g in zip(c.works, c.measured, c.timed, g_s):
            if w.kind == T.VIEW and m >= BACKLOG_S:
                views.append(m)
            if w.kind in T.NO_KERNEL or t:
                continue
            extra = m - g
            per.setdefault(w.op, []).append(extra)
            per_class.setdefault(T.host_class(w), []).append(extra)
    base = _median(views) if views else 0.0
    table = {op: max(0.0, _median(v) - base) for op, v in per.items() if len(v) >= MIN_SAMPLES}
    classes = {k: max(0.0, _median(v) - base) for k, v in per_class.items()}
    return dict(sorted(table.items())), dict(sorted(classes.items()))


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def host_counts(w: T.OpWork, table: dict[str, float], classes: dict[str, float]) -> list[float]:
    """How many of each host constant one op costs (cpu_seconds(w) = counts . constants).

    Every op pays the dispatcher (``dispatch``) and, in the forward, the model's Python around
    it (``python``: module calls, autograd recording); an op that launches kernels pays its
    measured in-op host time (``inop`` scales the table: 1 = as measured); foreach ops pay per
    tensor of their lists (``tensor``: the optimizer's per-parameter Python).  The optimizer's
    scalar reads (HOST) are inside ``tensor``; a sync op's wait is the timeline's."""
    c = [0.0] * len(_HOST)
    if w.kind == T.HOST:
        return c
    c[0] = 1.0
    if w.phase == "forward":
        c[1] = 1.0
    if w.kind in (T.VIEW, T.SYNC):
        return c
    c[2] = T.inop_seconds(w, table, classes)
    c[3] = float(w.tensors)
    return c


def host_constants(h: dict[str, float], table: dict[str, float], classes: dict[str, float]) -> dict:
    """The TimingModel host fields from the fitted constants."""
    view = {p: h["dispatch"] + (h["python"] if p == "forward" else 0.0) for p in T.PHASES}
    return {"cpu_view": view, "cpu_inop": {op: h["inop"] * v for op, v in table.items()},
            "cpu_inop_class": {k: h["inop"] * v for k, v in classes.items()},
            "cpu_tensor": h["tensor"], "cpu_sync": 0.0}


class _Timeline:
    """One case's ops for the host fit: host-cost counts, kernel times, sync positions."""

    def __init__(self, case: Case, gpu_s: list[float], table: dict[str, float], classes: dict[str, float]):
        self.case = case
        self.E = torch.tensor([host_counts(w, table, classes) for w in case.works], dtype=torch.float64)
        g = torch.tensor(gpu_s, dtype=torch.float64)
        zero = torch.zeros(1, self.E.shape[1], dtype=torch.float64)
        self.PE = torch.cat([zero, torch.cumsum(self.E, 0)])  # PE[i] = E[:i].sum(0)
        self.Pg = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(g, 0)]).tolist()  # Pg[i] = g[:i].sum()
        self.Pg_t = torch.tensor(self.Pg[:-1], dtype=torch.float64)
        self.no_kernel = torch.where(g > 0, 0.0, -math.inf).to(torch.float64)
        self.g = g.tolist()
        self.syncs = [i for i, w in enumerate(case.works) if w.sync]

    def linearise(self, c: torch.Tensor) -> tuple[torch.Tensor, float]:
        """(a, b) with the simulated step == a . c + b at these constants (see the module docstring).

        Each clock is kept as (a, b, value): host-constant counts, kernel seconds and their value
        at ``c``.  Between syncs the GPU clock after the last op is ``max(gpu0 + S,
        max_j (C_j + S - S_{j-1}))`` over the ops j that launch kernels (C: host clock after op j,
        S: kernel time since the segment start, S_{j-1}: before op j)."""
        Pc = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(self.E @ c, 0)])
        D = Pc[1:] - self.Pg_t + self.no_kernel  # C_j - S_{j-1} up to the segment's offsets
        Pc_l = Pc.tolist()
        Pg = self.Pg
        P = self.E.shape[1]
        cpu = [torch.zeros(P, dtype=torch.float64), 0.0, 0.0]  # a, b, value
        gpu = [torch.zeros(P, dtype=torch.float64), 0.0, 0.0]

        def run(lo, hi):  # ops lo..hi-1, no sync among them
            if lo >= hi:
                return
            s_end = Pg[hi] - Pg[lo]
            best, j = torch.max(D[lo:hi], 0)
            j = int(j) + lo
            from_cpu = cpu[2] - Pc_l[lo] + Pg[lo] + float(best) + s_end
            if from_cpu > gpu[2] + s_end:
                gpu[0] = cpu[0] + (self.PE[j + 1] - self.PE[lo])
                gpu[1] = cpu[1] + Pg[hi] - Pg[j]
                gpu[2] = from_cpu
            else:
                gpu[1] += s_end
                gpu[2] += s_end
            cpu[0] = cpu[0] + (self.PE[hi] - self.PE[lo])
            cpu[2] += Pc_l[hi] - Pc_l[lo]

        lo = 0
        for s in self.syncs:
            run(lo, s)
            cpu[0] = cpu[0] + self.E[s]  # the sync op's host work, then the wait for the GPU
            cpu[2] += Pc_l[s + 1] - Pc_l[s]
            if gpu[2] > cpu[2]:
                cpu = [gpu[0].clone(), gpu[1], gpu[2]]
            if self.g[s] > 0:  # its own kernels start now
                gpu = [cpu[0].clone(), cpu[1] + self.g[s], cpu[2] + self.g[s]]
            lo = s + 1
        run(lo, len(self.g))
        end = gpu if gpu[2] > cpu[2] else cpu
        return end[0], end[1]


def _nnls(A: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Non-negative least squares (active set: drop negative coefficients and solve again)."""
    active = torch.ones(A.shape[1], dtype=torch.bool)
    x = torch.zeros(A.shape[1], dtype=torch.float64)
    for _ in range(A.shape[1] + 1):
        sol = torch.linalg.lstsq(A[:, active], y.unsqueeze(1), driver="gelsd").solution.squeeze(1)
        x = torch.zeros_like(x)
        x[active] = sol
        if (x >= 0).all():
            return x
        active &= x > 0
    return x.clamp(min=0)


def step_noise(case: Case) -> float:
    """Relative standard error of a case's median step from the spread of its measured steps:
    the median absolute deviation of the log samples, scaled to a standard deviation (robust to
    the one slow step a host hiccup makes)."""
    samples = [s for s in (case.meta.get("step_s_all") or []) if s and s > 0]
    if len(samples) < 3:
        return 0.0
    deviations = sorted(abs(math.log(s / case.step_s)) for s in samples)
    return 1.4826 * deviations[len(deviations) // 2]


def fit_host(cases: list[Case], kernels: T.TimingModel, table: dict[str, float], classes: dict[str, float],
             gpu_s: dict[str, list[float]] | None = None, iterations: int = 40) -> dict[str, float]:
    """Stage 2: host constants from the median step times (see the module docstring).

    Gauss-Newton on the piecewise-linear simulated step: linearise at the current constants,
    solve the non-negative least squares of the relative step errors, then take the largest
    step towards that solution (1, 1/2, 1/4 ...) that lowers the sum of squared log errors of
    the true simulation.  Weighted least squares in two passes: the first weighs every case
    alike; its root-mean-square log error is the model's own error ``e``, and the second weighs
    each case by ``1 / (noise**2 + e**2)`` (``noise``: :func:`step_noise`), so a launch-bound
    case whose five steps spread by 20 % pulls less than one measured to 1 %."""
    gpu_s = gpu_s or {c.key: [T.gpu_seconds(w, kernels) for w in c.works] for c in cases}
    tls = [_Timeline(c, gpu_s[c.key], table, classes) for c in cases]
    y = torch.tensor([c.step_s for c in cases], dtype=torch.float64)
    noise = torch.tensor([step_noise(c) for c in cases], dtype=torch.float64)

    def linearise(c):
        ab = [tl.linearise(c) for tl in tls]
        A = torch.stack([a for a, _ in ab])
        b = torch.tensor([b for _, b in ab], dtype=torch.float64)
        return A, b

    def solve(sw, c):
        def objective(A, b, c):
            return float(torch.sum((sw * torch.log((A @ c + b) / y)) ** 2))

        A, b = linearise(c)
        best = objective(A, b, c)
        for _ in range(iterations):
            target = _nnls(sw.unsqueeze(1) * A / y.unsqueeze(1), sw * (1.0 - b / y))
            step, improved = 1.0, False
            while step > 1e-3:
                trial = c + step * (target - c)
                A_t, b_t = linearise(trial)
                value = objective(A_t, b_t, trial)
                if value < best - 1e-12:
                    c, A, b, best, improved = trial, A_t, b_t, value, True
                    break
                step /= 2
            if not improved:
                break
        return c, A, b

    c, A, b = solve(torch.ones_like(y), torch.tensor([5e-6, 5e-6, 1.0, 1e-6], dtype=torch.float64))
    model_error2 = float(torch.mean(torch.log((A @ c + b) / y) ** 2))
    c, _, _ = solve((1.0 / (noise ** 2 + model_error2)).sqrt(), c)
    return {k: float(v) for k, v in zip(_HOST, c)}


# -- the whole fit ---------------------------------------------------------------------------------


def fit(cases: list[Case], gpu=None) -> T.TimingModel:
    """Both stages on ``cases``: the constants of :class:`estimator.timing.TimingModel`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small tensors: one thread is several times faster
    try:
        return _fit(cases, gpu)
    finally:
        torch.set_num_threads(threads)


def _fit(cases: list[Case], gpu=None) -> T.TimingModel:
    gpu = gpu or lookup_gpu(GPU_NAME)
    k = fit_kernels(cases, gpu)
    eff = {key: v for key, v in k["eff"].items() if v is not None}
    for key, (src, _why) in _ASSUMED_EFF.items():
        eff.setdefault(key, eff.get(src, eff.get("matmul.half")))
    for key in _FITTED_EFF:  # fitted keys without data in these cases: the nearest family
        if key not in eff:
            eff[key] = eff.get(key.rsplit(".", 1)[0] + ".half") or eff.get("matmul.half")
    for key, (src, _why) in _UNFITTED.items():
        if not _fitted_from(cases, key):
            eff[key] = eff[src]
    host0 = {p: 0.0 for p in T.PHASES}
    model = T.TimingModel(
        gpu=gpu.name, calibrated=True, source="fitted", launch_s=k["launch_s"], library_s=k["library_s"],
        bandwidth=k["bandwidth"], memory_eff=k["memory_eff"], overlap_p=k["overlap_p"], eff=eff,
        attention_backward=k["attention_backward"], conv_backward=k["conv_backward"], fill_rows=k["fill_rows"],
        n0=k["n0"], k0=k["k0"], align_gamma=k["align_gamma"], peaks=T.datasheet_peaks(gpu), cpu_view=host0, cpu_inop={},
        cpu_inop_class={}, cpu_tensor=0.0, cpu_sync=0.0)
    gpu_s = {c.key: [T.gpu_seconds(w, model) for w in c.works] for c in cases}
    table, classes = inop_table(cases, model, gpu_s)
    return replace(model, **host_constants(fit_host(cases, model, table, classes, gpu_s), table, classes))


def provenance(cases: list[Case]) -> dict:
    """Where each constant comes from: the cases whose ops (or steps) constrain it."""
    def having(pred):
        return sorted({c.key for c in cases for w in c.works if pred(w)})

    all_keys = sorted(c.key for c in cases)
    compute = having(lambda w: w.kind in (T.MATMUL, T.CONV))
    eff = {}
    for key in _FITTED_EFF:
        eff[key] = {"fitted_from": _fitted_from(cases, key)}
        if not eff[key]["fitted_from"] and key in _UNFITTED:
            eff[key] = {"assumed_equal_to": _UNFITTED[key][0], "why": _UNFITTED[key][1]}
    for key, (src, why) in _ASSUMED_EFF.items():
        eff[key] = {"assumed_equal_to": src, "why": why}
    meta = cases[0].meta
    return {
        "fitted_on": datetime.date.today().isoformat(),
        "script": "benchmarks/fit_timing.py",
        "measurements": f"{meta.get('device')}, torch {meta.get('torch')}, CUDA {meta.get('cuda')}, "
                        f"cuDNN {meta.get('cudnn')} (tests/data/cuda_reference, copied from the project's "
                        f"CUDA reference data)",
        "cases": all_keys,
        "kernels": {
            "launch_s": {"fitted_from": having(lambda w: w.kind == T.MEMORY)},
            "bandwidth": {"fitted_from": having(lambda w: w.kind == T.MEMORY)},
            "memory_eff": {cls: {"fitted_from": having(lambda w, cls=cls: w.kind == T.MEMORY
                                                       and w.memory_class == cls)}
                           for cls in T.MEMORY_CLASSES[1:]},
            "library_s, overlap_p, fill_rows, n0, k0": {"fitted_from": compute},
            "align_gamma": {"fitted_from": having(lambda w: w.kind in (T.MATMUL, T.CONV) and w.align < 16
                                                  and T.precision_of(w)[1] in ("half", "tf32"))},
            "attention_backward": {"fitted_from": having(lambda w: w.kind == T.ATTENTION and w.backward)},
            "conv_backward": {"fitted_from": having(lambda w: w.kind == T.CONV and w.backward)},
            "eff": eff,
            "method": "robust least squares on per-op CUDA-event times (see the script's docstring)",
        },
        "host": {"fitted_from": all_keys,
                 "method": "cpu_inop: per aten op name, the median over ops timed on an idle GPU of (event time - "
                           "predicted kernel time), less the median event time of a view (ops with at least "
                           f"{MIN_SAMPLES} samples; cpu_inop_class the same by class); cpu_view and cpu_tensor: "
                           "Gauss-Newton / non-negative least squares on the median step times through the "
                           "two-timeline simulation, each case weighted by 1 / (spread of its measured steps^2 "
                           "+ the model's RMS error^2) (see the script's docstring)"},
        "rnn": "no constant of its own: cuDNN recurrent layers are timed with the GEMM constants",
    }


BAND_QUANTILE = 0.8  # the error band's "likely": 4 held-out steps in 5


def step_band(rows: list[dict]) -> float:
    """The error band's ``step`` figure (estimator.timing.band): the BAND_QUANTILE quantile of
    |log(predicted / measured)| over the held-out steps of :func:`lomo` (nearest rank)."""
    errors = sorted(abs(math.log(r["ratio"])) for r in rows)
    return errors[min(len(errors) - 1, math.ceil(BAND_QUANTILE * len(errors)) - 1)]


def write_model(model: T.TimingModel, cases: list[Case], path: str = OUT) -> None:
    rows = lomo(cases)
    prov = {**provenance(cases), "measured": "training steps",
            "band": f"step: the {BAND_QUANTILE:.0%} quantile of |log(predicted / measured)| over the "
                    f"{len(rows)} held-out steps of the leave-one-model-out fit"}
    model = replace(model, source=f"fitted on {len(cases)} measured H100 training steps "
                                  f"(torch {cases[0].meta.get('torch')}, {datetime.date.today().isoformat()})",
                    provenance=prov, band={"step": step_band(rows), "gemm": 0.0, "conv": 0.0, "memory": 0.0,
                                           "tensor": 0.0})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(model.to_json(), fh, indent=1)
        fh.write("\n")


def predict(case: Case, model: T.TimingModel) -> T.StepTime:
    return T.simulate(case.works, model)


BIG_SHARE = 0.8  # the "big" matmuls: the largest timed ones making up this share of timed matmul FLOPs


def big_matmuls(case: Case) -> list[int]:
    """Indices of the case's big matmuls: among the GEMMs timed on a busy GPU (the others' event
    times include host time), the largest by FLOPs that make up BIG_SHARE of their FLOPs.  (Chosen
    by FLOPs, not by measured time, so that an event pair that caught a stall does not select
    itself.)"""
    timed = sorted(((w.flops, i) for i, (w, t) in enumerate(zip(case.works, case.timed))
                    if t and w.kind == T.MATMUL), reverse=True)
    total = sum(f for f, _ in timed)
    out, acc = [], 0
    for f, i in timed:
        if acc >= BIG_SHARE * total:
            break
        out.append(i)
        acc += f
    return out


def lomo(cases: list[Case], models: list[str] | None = None) -> list[dict]:
    """Leave one model out: refit without all cases of a model, predict them (step and big matmuls)."""
    rows = []
    for held in models or sorted({c.model for c in cases}):
        model = fit([c for c in cases if c.model != held])
        for c in cases:
            if c.model == held:
                st = predict(c, model)
                mm = [(c.works[i], c.measured[i], T.gpu_seconds(c.works[i], model)) for i in big_matmuls(c)]
                rows.append({"case": c.name, "precision": c.precision, "model": held, "measured_s": c.step_s,
                             "samples_s": c.meta.get("step_s_all"), "predicted_s": st.total,
                             "ratio": st.total / c.step_s, "gpu_busy_s": st.gpu_busy, "host_s": st.host,
                             "matmuls": [{"op": w.op, "m": w.m, "n": w.n, "k": w.k, "batch": w.batch, "dtype": w.dtype,
                                          "measured_s": m, "predicted_s": p} for w, m, p in mm]})
    return rows


# -- the model on this project's capture ------------------------------------------------------------

# The reference cases this project can build here (record/cuda_trace.py:cases(), same configs,
# batch and sequence sizes; torchvision has no CPU build here, so resnet50/mobilenet are absent).
_HF = {  # case -> (config class, model class, vocab, batch, seq, config fields)
    "gpt2_124m": ("GPT2Config", "GPT2LMHeadModel", 50257, 8, 1024, dict(use_cache=False)),
    "gpt2_124m_b2": ("GPT2Config", "GPT2LMHeadModel", 50257, 2, 1024, dict(use_cache=False)),
    "gpt2_124m_b16_s512": ("GPT2Config", "GPT2LMHeadModel", 50257, 16, 512, dict(use_cache=False)),
    "llama_small": ("LlamaConfig", "LlamaForCausalLM", 32000, 4, 1024, dict(
        hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
        num_key_value_heads=4, vocab_size=32000, use_cache=False)),
    "llama_small_b1": ("LlamaConfig", "LlamaForCausalLM", 32000, 1, 1024, dict(
        hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
        num_key_value_heads=4, vocab_size=32000, use_cache=False)),
    "llama_small_s4096": ("LlamaConfig", "LlamaForCausalLM", 32000, 1, 4096, dict(
        hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
        num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096, use_cache=False)),
    "bert_small": ("BertConfig", "BertForMaskedLM", 30522, 8, 512, dict(
        hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=2048)),
    "t5_small": ("T5Config", "T5ForConditionalGeneration", 32128, 8, 512, dict(
        d_model=512, d_ff=2048, num_layers=6, num_heads=8, use_cache=False, decoder_start_token_id=0)),
    "mixtral_small": ("MixtralConfig", "MixtralForCausalLM", 32000, 4, 1024, dict(
        hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=4, num_local_experts=4, num_experts_per_tok=2, vocab_size=32000, use_cache=False)),
}


def build_case(name: str):
    """(model, inputs, loss_fn) of a reference case, built without weights (meta device)."""
    import torch.nn.functional as F_

    from estimator import empty_weights

    if name in _HF:
        import transformers

        cfg_cls, model_cls, vocab, b, s, cfg = _HF[name]
        with empty_weights():
            model = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**cfg))
        ids = torch.zeros(b, s, dtype=torch.long, device="meta")
        return model, {"input_ids": ids, "labels": ids}, None
    if name in ("example_gpt", "example_vgg"):
        import importlib

        sys.path.insert(0, ROOT)
        model, inputs = importlib.import_module(f"examples.{name.split('_')[1]}").build()
        return model, inputs, None
    if name == "lstm_2x512":
        class M(torch.nn.Module):  # record/cuda_trace.py:cases()["lstm_2x512"]
            def __init__(self):
                super().__init__()
                self.emb = torch.nn.Embedding(8000, 256)
                self.rnn = torch.nn.LSTM(256, 512, num_layers=2, batch_first=True)
                self.head = torch.nn.Linear(512, 8000)

            def forward(self, x):
                return self.head(self.rnn(self.emb(x))[0])

        def ce(out):  # the recorded loss: cross-entropy against class 0
            logits = out.float().reshape(-1, out.shape[-1])
            return F_.cross_entropy(logits, torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device))

        with empty_weights():
            model = M()
        return model, (torch.zeros(16, 128, dtype=torch.long, device="meta"),), ce
    raise KeyError(name)


CAPTURABLE = tuple(_HF) + ("example_gpt", "example_vgg", "lstm_2x512")


def capture_rows(cases: list[Case], model: T.TimingModel | None = None, held_out: bool = False) -> list[dict]:
    """The model applied to this project's capture (``estimate(..., device="cuda")``) of each
    buildable reference case, beside the measured step and the model on the reference's own ops.
    ``held_out``: the constants are refitted without the case's model (as ``lomo``)."""
    from estimator import estimate

    fold: dict[str, T.TimingModel] = {}
    rows = []
    for c in cases:
        if c.name not in CAPTURABLE:
            continue
        if held_out:
            if c.model not in fold:
                fold[c.model] = fit([o for o in cases if o.model != c.model])
            model = fold[c.model]
        else:
            model = model or T.load_model(GPU_NAME)
        net, inputs, loss_fn = build_case(c.name)
        report = estimate(net, inputs, loss_fn=loss_fn, device="cuda", precision=c.precision, keep_output=True)
        works = T.works_of(report)
        st = T.simulate(works, model)
        ref = predict(c, model)
        rows.append({"case": c.name, "precision": c.precision, "measured_s": c.step_s, "captured_s": st.total,
                     "ratio": st.total / c.step_s, "reference_ops_s": ref.total, "ops_captured": len(works),
                     "ops_reference": len(c.works), "gpu_busy_s": st.gpu_busy, "host_s": st.host,
                     "gpu_busy_reference_s": ref.gpu_busy, "host_reference_s": ref.host})
    return rows


def report_table(cases: list[Case]) -> None:
    """The benchmarks/README.md tables: per case, measured vs leave-one-model-out predictions on the
    reference's op records (a) and on this project's capture (b); then the big-matmul errors."""
    lo = {f"{r['case']}__{r['precision']}": r for r in lomo(cases)}
    cap = {f"{r['case']}__{r['precision']}": r for r in capture_rows(cases, held_out=True)}
    print("| case | precision | measured median (ms) | measured min-max (ms) | (a) reference ops (ms) | (a) / measured "
          "| (b) capture (ms) | (b) / measured | ops: capture / reference |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for key, r in lo.items():
        s_all = r["samples_s"] or [r["measured_s"]]
        b = cap.get(key)
        bcol = (f"{b['captured_s'] * 1e3:.1f} | {b['ratio']:.2f} | {b['ops_captured']} / {b['ops_reference']}"
                if b else "- | - | -")
        print(f"| {r['case']} | {r['precision']} | {r['measured_s'] * 1e3:.1f} | {min(s_all) * 1e3:.1f}-"
              f"{max(s_all) * 1e3:.1f} | {r['predicted_s'] * 1e3:.1f} | {r['ratio']:.2f} | {bcol} |")
    ratios = [r["ratio"] for r in lo.values()]
    within = lambda xs, t: sum(abs(x - 1) <= t for x in xs)  # noqa: E731
    print(f"\n(a): {within(ratios, 0.10)}/{len(ratios)} within 10%, {within(ratios, 0.15)}/{len(ratios)} within 15%, "
          f"{within(ratios, 0.25)}/{len(ratios)} within 25%; median |error| "
          f"{_median([abs(x - 1) for x in ratios]):.1%}")
    cr = [r["ratio"] for r in cap.values()]
    print(f"(b): {within(cr, 0.10)}/{len(cr)} within 10%, {within(cr, 0.15)}/{len(cr)} within 15%, "
          f"{within(cr, 0.25)}/{len(cr)} within 25%; median |error| {_median([abs(x - 1) for x in cr]):.1%}")
    errs = [abs(m["predicted_s"] / m["measured_s"] - 1) for r in lo.values() for m in r["matmuls"]]
    errs.sort()
    print(f"big matmuls (held out): {len(errs)} ops, {within([1 + e for e in errs], 0.15)} within 15% "
          f"({within([1 + e for e in errs], 0.15) / len(errs):.0%}), median |error| {_median(errs):.1%}, "
          f"90th percentile {errs[int(0.9 * len(errs))]:.1%}, max {errs[-1]:.0%}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--import-reference", metavar="DIR")
    ap.add_argument("--lomo", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--capture", action="store_true", help="the shipped constants on this project's capture")
    ap.add_argument("--report", action="store_true",
                    help="markdown table: leave-one-model-out on the reference ops and on the capture")
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args(argv)
    if a.import_reference:
        for path in import_reference(a.import_reference):
            print("wrote", os.path.relpath(path, ROOT))
        return
    cases = load_cases()
    if a.report:
        report_table(cases)
        return
    if a.capture:
        print("| case | precision | measured (ms) | capture (ms) | capture / measured | reference ops (ms) "
              "| ops captured / reference |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for r in capture_rows(cases):
            print(f"| {r['case']} | {r['precision']} | {r['measured_s'] * 1e3:.1f} | {r['captured_s'] * 1e3:.1f} "
                  f"| {r['ratio']:.2f} | {r['reference_ops_s'] * 1e3:.1f} | {r['ops_captured']} / {r['ops_reference']} |")
        return
    if a.lomo:
        rows = lomo(cases)
        print("| case | precision | measured (ms) | predicted (ms) | predicted / measured |")
        print("|---|---|---:|---:|---:|")
        for r in rows:
            print(f"| {r['case']} | {r['precision']} | {r['measured_s'] * 1e3:.1f} | {r['predicted_s'] * 1e3:.1f} "
                  f"| {r['ratio']:.2f} |")
        return
    if a.check:
        model = T.load_model(GPU_NAME)
    else:
        model = fit(cases)
    for c in cases:
        st = predict(c, model)
        print(f"{c.name:24s} {c.precision:10s} measured {c.step_s * 1e3:8.2f} ms predicted {st.total * 1e3:8.2f} ms "
              f"ratio {st.total / c.step_s:5.2f}  gpu busy {st.gpu_busy * 1e3:8.2f} host {st.host * 1e3:8.2f}")
    if not a.check:
        write_model(model, cases, a.out)
        print("wrote", os.path.relpath(a.out, ROOT))


if __name__ == "__main__":
    main()

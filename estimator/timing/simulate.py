"""A training step on two timelines (:func:`simulate`, :func:`step_time`).

The host issues op *i* at ``cpu_i = cpu_{i-1} + cpu_seconds(op_i)``; the GPU runs it from
``max(cpu_i, gpu_{i-1})`` for ``gpu_seconds(op_i)``; an op that reads a GPU value on the host
(``.item()`` outside the optimizer, ``nonzero``, the fp32 ``_grouped_mm`` fallback that copies
its offsets) first waits for the GPU.  The step ends when both are done.  So small steps are
launch-bound (Llama-small at batch 1 and 4 take the same 34 ms on an H100) and big ones are the
sum of their kernels.

MFU, as in PaLM (Chowdhery et al. 2022, appendix B): model FLOPs per second over the peak,
``MFU = model_flops / (step_seconds * peak)``, where model FLOPs are the FLOPs of the forward
and backward passes as counted by this project's rules (a multiply-add is 2 FLOPs, as
``torch.utils.flop_counter``; attention included, recomputation excluded) and the peak is the
datasheet dense peak of the dtype the matmuls run in (``hardware.GPU.peak``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from ..hardware import GPU
from ..hardware import lookup as lookup_gpu
from .band import half_width, likely_range, origin, shares
from .catalog import load_model
from .constants import TimingModel
from .geometry import op_base
from .host import cpu_seconds
from .kernels import gpu_seconds, precision_of
from .optable import COMPUTE_KINDS
from .records import OpWork

# -- the step: two timelines ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OpTime:
    """One op's share of the step: its kernel time and host time."""

    index: int
    op: str
    phase: str
    kind: str
    gpu_s: float
    cpu_s: float
    flops: int
    bytes: int


@dataclass
class StepTime:
    """Predicted time of one training step (seconds).

    ``forward + backward + optimizer == total``: the phases split the simulated timeline at the
    moment the last op of each phase is done (host and GPU).  ``gpu_busy`` is the sum of kernel
    times, ``host`` the sum of host issue times: when ``host`` is close to ``total`` the step is
    launch-bound.  MFU (PaLM, appendix B): ``model_flops / (total * peak)``, with model FLOPs the
    forward and backward matmul-class FLOPs (this project's rules: multiply-add = 2 FLOPs) and
    ``peak`` the datasheet dense peak of the precision most of those FLOPs run in.
    """

    gpu: str
    total: float
    forward: float
    backward: float
    optimizer: float
    gpu_busy: float
    host: float
    model_flops: int
    peak: float
    calibrated: bool
    source: str
    ops: list[OpTime] = field(default_factory=list, repr=False)
    likely: tuple[float, float] = (0.0, 0.0)  # the likely range of ``total`` (estimator.timing.band)
    band_note: str = ""  # what the range rests on (calibrated, from a sibling, extrapolated)
    shares: dict[str, float] = field(default_factory=dict)  # kernel time by band family over the step

    @property
    def achieved_flops(self) -> float:
        """Model FLOPs per second of the step."""
        return self.model_flops / self.total if self.total > 0 else 0.0

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: ``model_flops / (total * peak)`` (PaLM, appendix B)."""
        return self.achieved_flops / self.peak if self.peak > 0 else 0.0

    @property
    def bound(self) -> str:
        """"host" when the GPU waits for the host for more than half of the step, else "gpu"."""
        return "host" if self.gpu_busy < 0.5 * self.total else "gpu"

    def top(self, n: int = 10) -> list[OpTime]:
        """The ``n`` ops with the most GPU time."""
        return sorted(self.ops, key=lambda o: -o.gpu_s)[:n]

    def by_op(self) -> dict[str, float]:
        """GPU seconds per aten op name, largest first."""
        out: dict[str, float] = {}
        for o in self.ops:
            out[o.op] = out.get(o.op, 0.0) + o.gpu_s
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "total_s": self.total, "forward_s": self.forward, "backward_s": self.backward,
                "optimizer_s": self.optimizer, "gpu_busy_s": self.gpu_busy, "host_s": self.host,
                "bound": self.bound, "model_flops": self.model_flops, "achieved_flops": self.achieved_flops,
                "mfu": self.mfu, "calibrated": self.calibrated, "source": self.source,
                "likely_s": list(self.likely), "band_note": self.band_note,
                "band_shares": {k: round(v, 4) for k, v in self.shares.items()},
                "top_ops": [{"op": o.op, "phase": o.phase, "gpu_s": o.gpu_s} for o in self.top(10)],
                # (the report's "Top ops by GPU time": every call of an op summed)
                "by_op": [{"op": op, "gpu_s": sec} for op, sec in list(self.by_op().items())[:10]]}


def timeline(gpu_s: Sequence[float], cpu_s: Sequence[float], sync: Sequence[bool]) -> tuple[float, list[float]]:
    """The step's end and each op's completion on two timelines.

    The host issues op i at ``cpu_i = cpu_{i-1} + cpu_s[i]``; its kernels run from
    ``max(cpu_i, gpu_{i-1})`` for ``gpu_s[i]``; a sync op makes the host wait for the GPU work
    issued before it (a device -> host read) and then issues its own kernels.
    Op i is done at ``max(cpu_i, gpu_i)``.
    """
    cpu = gpu = 0.0
    done = []
    for g, c, s in zip(gpu_s, cpu_s, sync):
        cpu += c
        if s:
            cpu = max(cpu, gpu)
        if g > 0.0:
            gpu = max(cpu, gpu) + g
        done.append(max(cpu, gpu))
    return max(cpu, gpu), done


def _phase_seconds(works: Sequence[OpWork], done: Sequence[float], total: float) -> tuple[float, float, float]:
    """(forward, backward, optimizer) seconds that add up to ``total``: the timeline split where each phase's
    last op is done; with gradient accumulation (the phases alternate: forward, backward, forward, ...) each
    op's share of the timeline (its completion less the previous op's) goes to its phase."""
    runs = [w.phase for i, w in enumerate(works) if i == 0 or w.phase != works[i - 1].phase]
    if len(runs) == len(set(runs)):  # each phase one run of ops
        ends = {}
        for w, t in zip(works, done):
            ends[w.phase] = t
        fwd_end = ends.get("forward", 0.0)
        bwd_end = max(ends.get("backward", fwd_end), fwd_end)
        return fwd_end, bwd_end - fwd_end, total - bwd_end
    share = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    last = 0.0
    for w, t in zip(works, done):
        share[w.phase] = share.get(w.phase, 0.0) + t - last
        last = t
    share["optimizer"] += total - last
    return share["forward"], share["backward"], share["optimizer"]


def simulate(works: Sequence[OpWork], model: TimingModel, matmul_tf32: bool = False) -> StepTime:
    """The step time of ``works`` (one training step's ops in execution order) under ``model``."""
    gpu_s = [gpu_seconds(w, model, matmul_tf32) for w in works]
    cpu_s = [cpu_seconds(w, model) for w in works]
    total, done = timeline(gpu_s, cpu_s, [w.sync for w in works])
    forward, backward, optimizer = _phase_seconds(works, done, total)
    ops = [OpTime(i, w.op, w.phase, w.kind, g, c, w.flops, w.bytes)
           for i, (w, g, c) in enumerate(zip(works, gpu_s, cpu_s))]
    flops_by_peak: dict[str, int] = {}
    model_flops = 0
    for w in works:
        if w.kind in COMPUTE_KINDS and w.phase in ("forward", "backward"):
            model_flops += w.flops
            key = precision_of(w, matmul_tf32, model.tf32)[0]
            flops_by_peak[key] = flops_by_peak.get(key, 0) + w.flops
    peak_key = max(flops_by_peak, key=flops_by_peak.get) if flops_by_peak else "fp32"
    share = shares(works, gpu_s, total, model, matmul_tf32)
    note = _note(model, share, works)
    return StepTime(gpu=model.gpu, total=total, forward=forward, backward=backward,
                    optimizer=optimizer, gpu_busy=sum(gpu_s), host=sum(cpu_s), model_flops=model_flops,
                    peak=model.peaks.get(peak_key, 0.0), calibrated=model.calibrated, source=model.source, ops=ops,
                    likely=likely_range(total, half_width(model.band, share)), band_note=note, shares=share)


# optimizer-state initialisation that only the first step runs (the capture records step 1)
_FIRST_STEP_ONLY = frozenset({"zeros_like", "zeros", "full", "full_like", "ones_like", "empty_like", "empty",
                              "lift_fresh", "scalar_tensor", "new_zeros"})


def _first_step_only(w: OpWork) -> bool:
    """An op only the first step runs: the optimizer's state initialisation."""
    return w.phase == "optimizer" and op_base(w.op) in _FIRST_STEP_ONLY


def works_of(obj: Any, steady_state: bool = True) -> list[OpWork]:
    """OpWork records from a Report, a Capture, OpNodes or OpWork records (in order); a Capture of
    ``grad_accum`` micro-steps gives all of them (:meth:`~estimator.capture.Capture.node_order`).

    ``steady_state`` drops what only a first step runs: the optimizer's state initialisation
    (``zeros_like`` per state tensor and the step counters), which a capture records because it
    traces step 1, and which a steady-state step (the one timed) does not run.
    """
    if hasattr(obj, "capture"):
        obj = obj.capture
    if hasattr(obj, "node_order"):  # a Capture: its whole optimizer step (every micro-step of an accumulation)
        obj = [obj.nodes[i] for i in obj.node_order()]
    elif hasattr(obj, "nodes"):
        obj = obj.nodes
    works: list[OpWork] = []
    for item in obj:
        w = item if isinstance(item, OpWork) else OpWork.from_node(item)
        if w is None:
            continue
        if steady_state and _first_step_only(w):
            continue
        works.append(w)
    return works


def work_nodes(cap: Any, steady_state: bool = True) -> list[int]:
    """The index in ``cap.nodes`` of each op :func:`works_of` gives for the capture ``cap`` (a Report's too), in its
    order: what ``StepTime.ops[i].index`` (a position among the timed ops) stands for."""
    cap = getattr(cap, "capture", cap)
    out = []
    for i in cap.node_order():
        w = OpWork.from_node(cap.nodes[i])
        if w is not None and not (steady_state and _first_step_only(w)):
            out.append(i)
    return out


def node_times(nodes: Sequence[Any], gpu: GPU | str = "H100-SXM", model: TimingModel | None = None, *,
               matmul_tf32: bool = False, steady_state: bool = True) -> list[tuple[float, float, bool]]:
    """(kernel seconds, host seconds, waits for the GPU) of each of ``nodes`` (captured OpNodes, in
    order): the per-op model of this module, for schedules that place ops themselves (the planner's
    streams and links).  Placeholders, bookkeeping and (``steady_state``) the first step's
    optimizer-state initialisation take (0, 0, False)."""
    return node_times_of(node_works(nodes, steady_state), gpu, model, matmul_tf32=matmul_tf32)


def node_works(nodes: Sequence[Any], steady_state: bool = True) -> list[OpWork | None]:
    """The OpWork of each of ``nodes`` (None: no kernel, or (``steady_state``) a first step's state
    initialisation), for :func:`node_times_of` and :func:`node_band` to share."""
    works: list[OpWork | None] = []
    for node in nodes:
        w = OpWork.from_node(node)
        works.append(None if w is None or (steady_state and _first_step_only(w)) else w)
    return works


def node_times_of(works: Sequence[OpWork | None], gpu: GPU | str = "H100-SXM", model: TimingModel | None = None, *,
                  matmul_tf32: bool = False) -> list[tuple[float, float, bool]]:
    """:func:`node_times` of :func:`node_works`' records."""
    gpu = lookup_gpu(gpu) if isinstance(gpu, str) else gpu
    model = model or load_model(gpu)
    return [(0.0, 0.0, False) if w is None else (gpu_seconds(w, model, matmul_tf32), cpu_seconds(w, model), w.sync)
            for w in works]


def node_band(nodes: Sequence[Any], total: float, gpu: GPU | str = "H100-SXM", model: TimingModel | None = None, *,
              matmul_tf32: bool = False, works: Sequence[OpWork | None] | None = None,
              times: Sequence[tuple[float, float, bool]] | None = None) -> tuple[float, str]:
    """(log half-width, what it rests on) of the likely range of a step of ``total`` seconds whose
    compute is ``nodes`` (estimator.timing.band; the planner's schedules, whose step adds communication
    to the kernels: the range covers the kernels' and the host's error, not the links').  ``works`` and
    ``times``: :func:`node_works` and :func:`node_times_of` of ``nodes`` when the caller has them."""
    gpu = lookup_gpu(gpu) if isinstance(gpu, str) else gpu
    model = model or load_model(gpu)
    if works is None or times is None:
        ws = works_of(nodes)
        seconds = [gpu_seconds(w, model, matmul_tf32) for w in ws]
    else:
        ws = [w for w in works if w is not None]
        seconds = [t[0] for w, t in zip(works, times) if w is not None]
    share = shares(ws, seconds, total, model, matmul_tf32)
    return half_width(model.band, share), _note(model, share, ws)


def _note(model: TimingModel, share: dict[str, float], works: Sequence[OpWork]) -> str:
    """What a step's time rests on (band.origin), and the depthwise convolutions' measured rates if any."""
    note = origin(model, share)
    if any(w.depthwise for w in works):
        note += ("; depthwise convolutions at rates measured on an H200 (cuDNN's for channels-last inputs, "
                 "ATen's otherwise)")
    return note


def step_time(obj: Any, gpu: GPU | str = "H100-SXM", model: TimingModel | None = None, *,
              matmul_tf32: bool = False, steady_state: bool = True) -> StepTime:
    """Predicted time of one training step on ``gpu``.

    ``obj``: a :class:`~estimator.report.Report` (``estimate(..., device="cuda")``), its
    ``Capture``, the captured ``OpNode`` list, or :class:`OpWork` records.  ``model``: the
    constants (default :func:`load_model` for ``gpu``).  ``matmul_tf32``: fp32 GEMMs on TF32
    tensor cores (``torch.backends.cuda.matmul.allow_tf32 = True``).
    """
    gpu = lookup_gpu(gpu) if isinstance(gpu, str) else gpu
    model = model or load_model(gpu)
    return simulate(works_of(obj, steady_state), model, matmul_tf32)

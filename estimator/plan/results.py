"""Typed results of a plan: memory per GPU, the verdict, the searches, time; their JSON form.

Their text is :mod:`estimator.plan.report`, which imports these (not the reverse):
:class:`~estimator.plan.report.Plan` and :class:`~estimator.plan.report.Comparison` are
:class:`PlanData` and :class:`ComparisonData` with the views as methods.  Nothing here is read
back by string key.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from .traced import ROWS


@dataclass(frozen=True)
class StepTime:
    """One step's time on one GPU (see :mod:`estimator.plan.schedule`)."""

    step_time_s: float
    compute_s: float  # the compute stream's busy time
    comm_s: float  # the collectives' time on their links
    exposed_comm_s: float  # time the compute stream waits for communication
    by_phase_s: dict[str, float]
    comm_by_kind_s: dict[str, float]
    comm_bytes_per_gpu: dict[str, float]
    links: list[str]  # the links the collectives ran on, with their bus bandwidth
    model: str  # "traced schedule" or the ZeRO volume model
    offload_s: float = 0.0  # host transfers of an offloaded layout, not overlapped
    band_log: float = 0.0  # log half-width of the likely range of the step (estimator.timing.band)
    band_note: str = ""  # what the range rests on
    bubble_s: float = 0.0  # a pipeline rank idle for its neighbours (the schedule's bubble, the sends between stages)

    @property
    def launch_wait_s(self) -> float:
        """The GPU idle while the host launches kernels (a launch-bound step): what the step takes beyond its
        compute, exposed communication, host transfers and pipeline bubble, which with it add up to
        ``step_time_s``."""
        return max(self.step_time_s - self.compute_s - self.exposed_comm_s - self.offload_s - self.bubble_s, 0.0)

    @property
    def likely_s(self) -> tuple[float, float]:
        """The likely range of ``step_time_s`` (the compute's held-out errors; links not included)."""
        return self.step_time_s * math.exp(-self.band_log), self.step_time_s * math.exp(self.band_log)


@dataclass(frozen=True)
class PerGpu:
    """Memory of the planned rank.  ``rows`` are at the peak and add up to it."""

    rows: dict[str, int]
    peak: int
    peak_phase: str
    peak_module: str
    peak_op: str
    parameters: int  # model states held by this rank (steady state, end of the step)
    gradients: int
    optimizer_state: int
    saved_activations: int  # held by autograd at the end of the forward pass
    host: int = 0  # offloaded to host memory

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rows"] = {r: self.rows.get(r, 0) for r in ROWS}
        return d


@dataclass(frozen=True)
class Suggestion:
    """A layout that fits, proposed when the asked one does not."""

    strategy: str
    gpus: int
    tp: int
    checkpoint: list[str]
    peak: int
    needed: int
    step_time_s: float | None = None  # its step time (the same micro-batch per GPU)
    time_to_train_s: float | None = None  # the budget's time on it (None: no --tokens/--samples/--steps)
    cp: int = 1
    ep: int = 1

    def describe(self) -> str:
        ck = f", checkpoint {', '.join(self.checkpoint)}" if self.checkpoint else ""
        tp = f" x tp {self.tp}" if self.tp > 1 else ""
        cp = f" x cp {self.cp}" if self.cp > 1 else ""
        ep = f" x ep {self.ep}" if self.ep > 1 else ""
        return f"{self.gpus} GPUs, {self.strategy}{tp}{cp}{ep}{ck}"


@dataclass(frozen=True)
class Verdict:
    fits: bool
    capacity: int
    reserve: dict[str, int]  # outside the allocator: CUDA context, cuBLAS workspace, fragmentation
    needed: int  # peak + reserve
    margin: int  # capacity - needed
    suggestions: list[Suggestion] = field(default_factory=list)  # the smallest layouts that fit (when not)


@dataclass(frozen=True)
class Solve:
    """The largest micro-batch (or longest sequence) that fits one GPU."""

    what: str  # "batch" or "seq"
    value: int | None  # None: unbounded within the search
    method: str
    traced: list[int]
    # traced at the answer (fits) and the next (does not), or at the next only when that trace has every size the
    # interpolation gives (``by_next``: the answer's bytes, between traces, are then what its trace would give)
    confirmed: bool | None = None
    peak_at_answer: int | None = None
    peak_at_next: int | None = None
    needed_at_answer: int | None = None  # the card's bytes the step needs at the answer (allocator simulated)
    limited_by: str | None = None  # the model's own limit (position embeddings)
    memory_allows: int | None = None
    reason: str | None = None  # why there is no answer (``value`` None): not searched, or no limit found
    by_next: bool = False  # confirmed by the trace at the next value alone (see ``confirmed``)


@dataclass(frozen=True)
class Training:
    """The budget and how long it takes."""

    steps: int | None
    samples_per_step: int
    tokens_per_step: int | None
    time_to_train_s: float | None
    mfu_given: float | None  # --mfu replaces the schedule's step time for the time to train
    time_to_train_likely_s: tuple[float, float] | None = None  # the step's likely range x steps (no --mfu)


@dataclass(frozen=True)
class Flops:
    model_flops_per_step_per_gpu: float  # matmul-class forward + backward, without recomputation
    matmul_dtype: str
    peak_flops_per_s: float
    mfu: float | None  # model FLOPs / (step time x peak)
    matmul_params: int | None = None  # N of 6N (single-device step)
    traced_per_token: float | None = None
    six_n_per_token: float | None = None  # PaLM (Chowdhery et al. 2022, app. B): 6N + 12 L H Q T
    attention_per_token: float | None = None


def model_parallel_text(tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1) -> str:
    """" x tp 2 x pp 4 x cp 2 x ep 4": the degrees above 1 that split the model or its sequence."""
    return "".join(f" x {name} {n}" for name, n in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep)) if n > 1)


@dataclass(frozen=True)
class Config:
    model: str
    gpu: str
    gpus: int
    strategy: str
    tp: int
    sequence_parallel: bool
    loss_parallel: bool
    dp: int
    shard_group: int
    rank: int
    precision: str
    optimizer: str | None
    checkpoint: list[str]
    offload: str | None
    wrap: list[str]
    micro_batch: int | None
    global_batch: int | None
    seq: int | None
    engine: str  # how the layout was obtained: "traced: ..." or "ZeRO (DeepSpeed semantics)" ...
    device: str
    pp: int = 1  # pipeline stages
    async_tp: bool = False  # sequence parallelism's collectives pipelined with their matmuls
    pp_schedule: str | None = None
    microbatches: int | None = None
    cp: int = 1  # context-parallel ranks per sequence
    ep: int = 1  # expert-parallel ranks per mixture-of-experts layer
    etp: int = 1  # the experts' tensor-parallel degree under ep (1: ep borrows the tp ranks; tp: the experts split)

    def model_parallel(self) -> str:
        """" x tp 2 x pp 4 x cp 2 x ep 4": the degrees above 1 that split the model or its sequence."""
        return model_parallel_text(self.tp, self.pp, self.cp, self.ep) + (f" (etp {self.etp})" if self.etp > 1 else "")


@dataclass
class PlanData:
    """The plan of one layout: per-GPU memory, verdict, largest batch, time (the numbers of
    :class:`~estimator.plan.report.Plan`)."""

    config: Config
    per_gpu: PerGpu
    verdict: Verdict
    time: StepTime
    flops: Flops
    training: Training | None
    batch: Solve | None = None
    seq: Solve | None = None
    checkpoint_size: dict[str, int] = field(default_factory=dict)  # full, per_rank
    notes: list[str] = field(default_factory=list)
    pipeline: dict[str, Any] | None = None  # under pipeline parallelism: the schedule and every stage's peak

    @property
    def fits(self) -> bool:
        return self.verdict.fits

    @property
    def margin(self) -> int:
        return self.verdict.margin

    @property
    def max_batch(self) -> int | None:
        return self.batch.value if self.batch is not None else None  # searched whether the given size fits or not

    @property
    def max_seq(self) -> int | None:
        return self.seq.value if self.seq is not None else None

    @property
    def step_time_s(self) -> float:
        return self.time.step_time_s

    @property
    def time_to_train_s(self) -> float | None:
        return self.training.time_to_train_s if (self.training is not None and self.fits) else None

    def to_dict(self) -> dict[str, Any]:
        c = asdict(self.config)
        return {
            **c, "per_gpu": self.per_gpu.to_dict(), "capacity": self.verdict.capacity,
            "reserve": dict(self.verdict.reserve), "needed": self.verdict.needed, "fits": self.fits,
            "margin": self.margin, "suggestions": [asdict(s) for s in self.verdict.suggestions],
            "max_batch": self.max_batch, "max_batch_check": asdict(self.batch) if self.batch else None,
            "max_seq": self.max_seq, "max_seq_check": asdict(self.seq) if self.seq else None,
            "step_time_s": self.step_time_s, "step_time_likely_s": list(self.time.likely_s),
            "step_time_band_note": self.time.band_note, "time_to_train_s": self.time_to_train_s,
            "time_to_train_likely_s": (list(self.training.time_to_train_likely_s)
                                       if self.fits and self.training and self.training.time_to_train_likely_s
                                       else None),
            "time": {**asdict(self.time), "launch_wait_s": self.time.launch_wait_s}, "training": asdict(self.training) if self.training else None,
            "flops": asdict(self.flops), "checkpoint_size": dict(self.checkpoint_size), "notes": list(self.notes),
            "pipeline": self.pipeline,
        }


def samples_per_s(p: PlanData) -> float:
    """Samples (sequences, images) the whole run trains per second."""
    return p.training.samples_per_step / p.step_time_s if p.training and p.step_time_s > 0 else 0.0


def gpu_seconds_per_sample(p: PlanData) -> float:
    """GPU-seconds per sample: what a sample costs on this layout (GPUs x step time / samples per step)."""
    rate = samples_per_s(p)
    return p.config.gpus / rate if rate > 0 else float("inf")


def gpu_hours(p: PlanData) -> float | None:
    """GPU-hours of the budget (time to train x GPUs), None without a budget."""
    return p.time_to_train_s * p.config.gpus / 3600 if p.time_to_train_s is not None else None


def tokens_per_s_per_gpu(p: PlanData) -> float | None:
    """Tokens each GPU trains per second (None where a sample has no sequence length)."""
    t = p.training
    if t is None or not t.tokens_per_step or p.step_time_s <= 0:
        return None
    return t.tokens_per_step / p.step_time_s / p.config.gpus


@dataclass
class ComparisonData:
    """Plans side by side (strategies x checkpointing, GPU types, GPU counts); the recommended one
    is the fastest that fits (shortest time to train with a budget, else most samples per second)."""

    plans: list[PlanData]
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the rows assume alike (the precision semantics)

    @property
    def recommended(self) -> PlanData | None:
        """The fastest plan that fits (:attr:`answers`' ``fastest``)."""
        return self.answers.get("fastest")

    @property
    def answers(self) -> dict[str, PlanData]:
        """"How many GPUs do I need?", answered over the plans that fit, each with its layout:

        * ``fewest_gpus``: the fewest GPUs (of those the comparison tried), the fastest layout at that count;
        * ``fastest``: the shortest time to train with a budget (else the most samples per second);
        * ``cheapest``: the fewest GPU-hours for the budget (GPU-seconds per sample without one), the
          fewer GPUs on a tie.

        Empty when none fits."""
        fitting = [p for p in self.plans if p.fits]
        if not fitting:
            return {}
        speed = (lambda p: p.time_to_train_s) if all(p.time_to_train_s is not None for p in fitting) else (
            lambda p: -samples_per_s(p))
        fewest = min(p.config.gpus for p in fitting)
        return {"fewest_gpus": min((p for p in fitting if p.config.gpus == fewest), key=speed),
                "fastest": min(fitting, key=speed),
                "cheapest": min(fitting, key=lambda p: (gpu_seconds_per_sample(p), p.config.gpus))}

    def to_dict(self) -> dict[str, Any]:
        best = self.recommended
        rows = []
        for p in self.plans:
            c = p.config
            rows.append({"gpu": c.gpu, "gpus": c.gpus, "strategy": c.strategy, "tp": c.tp, "pp": c.pp, "cp": c.cp,
                         "ep": c.ep, "etp": c.etp,
                         "checkpoint": list(c.checkpoint), "micro_batch": c.micro_batch,
                         "global_batch": c.global_batch, "peak": p.per_gpu.peak, "needed": p.verdict.needed,
                         "fits": p.fits, "max_batch": p.max_batch, "step_time_s": p.step_time_s, "mfu": p.flops.mfu,
                         "time_to_train_s": p.time_to_train_s, "gpu_hours": gpu_hours(p),
                         "tokens_per_s_per_gpu": tokens_per_s_per_gpu(p), "recommended": p is best})
        answers = {k: self.plans.index(p) for k, p in self.answers.items()}
        return {"rows": rows, "recommended": self.plans.index(best) if best is not None else None, "answers": answers, "notes": list(self.notes),
                "skipped": list(self.skipped), "plans": [p.to_dict() for p in self.plans]}

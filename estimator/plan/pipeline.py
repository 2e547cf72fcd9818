"""Pipeline parallelism: each stage's step traced on its own layers, composed with its schedule.

How ``torch.distributed.pipelining`` runs a model over ``pp`` stages, and how the plan follows it:

* **Stages split by layer**, as torchtitan's ``pipeline_llm`` splits a decoder: the stack of identical blocks
  divided into ``pp`` contiguous runs (the first stages take one more when they do not divide evenly); the
  modules that run before the stack (embeddings) belong to the first stage, those after it (final norm, head,
  loss) to the last.  A stage is the model with only its run of blocks (as torchtitan deletes the others), the
  other stages' modules replaced by stand-ins without parameters; a stage after the first starts from the
  activation it receives (whose gradient it sends back), a stage before the last stops after its last block
  and sends its output.  ``PipelineStage`` receives into buffers it allocates once, one per micro-batch
  (``_prepare_forward_infra`` / ``_prepare_backward_infra``): they are counted for the whole step; in 1F1B's
  steady state a stage also holds the input gradient it sent for the previous micro-batch (the schedule keeps
  its send ops until the next backward).
* **Each stage's step is traced** like any layout's rank (its engine, precision, checkpointing and optimizer)
  on one micro-batch (the local batch split into ``microbatches``), with gradients accumulating over the
  micro-batches (two micro-steps traced, as gradient accumulation is; under FSDP2 neither the reduce-scatter
  nor the resharding after backward but on the last, as ``PipelineStage.backward_maybe_with_nosync`` runs it)
  and the stage's output held until its backward (the schedules keep it in ``fwd_cache``).
* **The schedule's micro-batches in flight** (``schedules.py``): GPipe runs every forward, then every backward,
  so a stage holds ``M`` micro-batches' activations at the first backward; 1F1B keeps ``min(M, pp - s)`` in
  flight on stage ``s``.  A stage's peak is its traced peak with the other micro-batches in flight held (the
  bytes one micro-batch holds from its forward to its backward: saved activations, the output, the received
  input), each phase's peak (forward, backward; first micro-step, later ones) with its own count in flight.
* **Time**: each stage's traced step (its ``M`` micro-steps, collectives and optimizer); the pipeline adds
  the bubble, ``pp - 1`` micro-batch slots of the slowest stage (GPipe and 1F1B alike), and the activation
  and gradient sends between stages of each micro-batch on the critical path.

The plan reports the stage with the highest peak.  Checked against real ``torch.distributed.pipelining`` runs
(tests/test_pipeline.py: 3 stages on gloo, GPipe and 1F1B): model states exact, every stage's peak within 1 %.
Tensor parallelism inside a stage: the whole model's plan with each stage's Linears (the activations between
stages are sequence shards under sequence parallelism).  Not modelled: interleaved and zero-bubble schedules,
context parallelism,
stages of unequal cost beyond the slowest one's bubble, the allocator's fragmentation of the composed peak
(its first guess).
"""

from __future__ import annotations

import copy
import inspect
import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..capture.blocks import Repeats, find_repeats, shortened
from ..errors import UserError



def stage_ranges(blocks: int, pp: int) -> list[tuple[int, int]]:
    """Contiguous runs of ``blocks`` blocks for ``pp`` stages, the first ones one longer when uneven."""
    base, extra = divmod(blocks, pp)
    out, lo = [], 0
    for s in range(pp):
        hi = lo + base + (1 if s < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def in_flight(schedule: str, stage: int, pp: int, microbatches: int) -> int:
    """Micro-batches whose activations ``stage`` holds at its first backward (``schedules.py``)."""
    if schedule == "gpipe":
        return microbatches
    return min(microbatches, pp - stage)


class _StageOutput(Exception):
    """Raised after a stage's last block: the stage's output, caught by :class:`StageModel`."""

    def __init__(self, output: Any):
        super().__init__("stage output")
        self.output = output


class _Unused(torch.nn.Module):
    """A module of another stage: no parameters; the stage never runs it."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - stopped before
        raise RuntimeError("a module of another pipeline stage ran")


class _Zeros(torch.nn.Module):
    """A module of another stage that runs before this stage's blocks (an embedding on a later stage): its
    output, of the recorded shape, is a broadcast zero (one element); the block input is replaced by the
    received activation."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype):
        super().__init__()
        self.shape, self.dtype = tuple(shape), dtype

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.zeros((), dtype=self.dtype).expand(self.shape)


class _Received(torch.autograd.Function):
    """The activation a stage receives: the traced micro-batch's receive buffer (the schedule's others are
    composed, see :func:`schedule_peak`); its gradient is what the stage sends back (made by the first block's
    backward, freed once sent)."""

    @staticmethod
    def forward(ctx, anchor: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return torch.empty(0), None, None


class _Sent(torch.autograd.Function):
    """A stage's output sent on: the loss of a stage before the last (a scalar), whose backward is the
    gradient the stage receives: the traced micro-batch's receive buffer (the others composed)."""

    @staticmethod
    def forward(ctx, output: torch.Tensor) -> torch.Tensor:
        ctx.shape, ctx.dtype = output.shape, output.dtype
        return output.new_zeros(())

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return torch.empty(ctx.shape, dtype=ctx.dtype)


def stage_backward(module: torch.nn.Module, micro_step: int, last: bool) -> Any:
    """Around one micro-batch of a stage, as ``PipelineStage.backward_maybe_with_nosync`` runs its backward: DDP's
    ``no_sync()`` but on the last micro-batch; FSDP2 neither reduce-scatters nor reshards after backward but on the
    last (``set_requires_gradient_sync``, ``set_reshard_after_backward``, ``set_is_last_backward``), so the
    stage's unsharded parameters and gradients stay from its first backward to its last."""
    import contextlib

    from torch.nn.parallel import DistributedDataParallel

    if isinstance(module, DistributedDataParallel):
        return contextlib.nullcontext() if last else module.no_sync()
    for name in ("set_is_last_backward", "set_reshard_after_backward", "set_requires_gradient_sync"):
        setter = getattr(module, name, None)
        if setter is not None:
            setter(last)
    return contextlib.nullcontext()


def sent_loss(output: Any) -> torch.Tensor:
    """The loss function of a stage before the last: send its output (the first tensor of it)."""
    tensor = output if isinstance(output, torch.Tensor) else next(
        t for t in (output.values() if isinstance(output, dict) else output) if isinstance(t, torch.Tensor))
    return _Sent.apply(tensor)


class StageModel(torch.nn.Module):
    """The model of one stage: the model with its run of blocks, stopped after the last one unless it is the
    last stage."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        # the model's own signature (the planner passes position ids to a model that takes them) and configuration
        # (the capture turns a transformers model's KV cache off under checkpointing, as transformers does)
        self.forward_signature = inspect.signature(model.forward)
        self.config = getattr(model, "config", None)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.model(*args, **kwargs)
        except _StageOutput as out:
            return out.output


@dataclass(frozen=True)
class Split:
    """Where a model splits: its stack of blocks, and the modules with parameters before and after it with
    their output shape and dtype (the first call's)."""

    repeats: Repeats
    before: dict[str, tuple[tuple[int, ...], torch.dtype]]
    after: list[str]
    block_input: tuple[tuple[int, ...], torch.dtype]


def find_split(model: torch.nn.Module, cap: Any) -> Split:
    """The stack of blocks of ``model`` and the modules before and after it, read from its traced step."""
    repeats = find_repeats(model, minimum=2)
    if repeats is None:
        raise UserError("--pp splits a stack of identical blocks (a transformer's layers) into stages; this "
                        "model has none: drop --pp")
    order: dict[str, int] = {}
    for i, node in enumerate(cap.nodes):
        if node.meta.get("phase") != "forward":
            continue
        path = node.meta.get("module", "")
        order.setdefault(path, i)
    inside = [i for p, i in order.items() if p == repeats.path or p.startswith(repeats.path + ".")]
    if not inside:
        raise UserError("--pp: the stack of blocks runs no op in forward; drop --pp")
    start, end = min(inside), max(inside)
    before: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    after: list[str] = []
    for path, module in model.named_modules():
        if not path or path == repeats.path or path.startswith(repeats.path + ".") \
                or repeats.path.startswith(path + "."):
            continue
        if not any(True for _ in module.parameters(recurse=False)):
            continue
        first = min((i for p, i in order.items() if p == path or p.startswith(path + ".")), default=None)
        if first is None:
            continue
        if first < start:
            shapes = cap.module_outputs.get(path)
            if not shapes:
                raise UserError(f"--pp: the output of {path} (before the stack of blocks) was not recorded")
            before[path] = (tuple(shapes[0]), _dtype_of(cap, path))
        elif first > end:
            after.append(path)
    block = cap.module_outputs.get(f"{repeats.path}.0")
    if not block:
        raise UserError("--pp: the first block's output was not recorded")
    return Split(repeats, before, after, (tuple(block[0]), _dtype_of(cap, f"{repeats.path}.0")))


def _dtype_of(cap: Any, path: str) -> torch.dtype:
    """The dtype of the last forward op of module ``path`` (its output's)."""
    last = None
    for node in cap.nodes:
        if node.meta.get("phase") == "forward" and node.meta.get("module", "") == path:
            last = node
    spec = (last.meta.get("spec") or (None,))[0] if last is not None else None
    return spec.dtype if spec is not None else torch.float32


def stage_model(model: torch.nn.Module, split: Split, stage: int, pp: int, batch: int | None = None,
                shards: int = 1, dtype: torch.dtype | None = None) -> StageModel:
    """A copy of ``model`` (sharing nothing the step changes: its own module objects, the same parameter
    tensors) as stage ``stage`` of ``pp`` runs it; ``batch``: the micro-batch (the recorded shapes' dim 0);
    ``shards``: the activation received holds 1/shards of the sequence (sequence parallelism); ``dtype``: its
    dtype where the engine's differs from the single-device step's (FSDP2's MixedPrecisionPolicy computes in
    its ``param_dtype``)."""
    lo, hi = stage_ranges(split.repeats.count, pp)[stage]
    if hi <= lo:
        raise UserError(f"--pp {pp}: more stages than the {split.repeats.count} blocks; use --pp "
                        f"{split.repeats.count} or fewer")
    first, last = stage == 0, stage == pp - 1
    memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    m = copy.deepcopy(model, memo)  # modules copied, tensors shared (the engine copies them to meta after)
    parent_path, _, attr = split.repeats.path.rpartition(".")
    parent = m.get_submodule(parent_path) if parent_path else m
    stack = parent._modules[attr] = shortened(parent._modules[attr], lo, hi)

    def resized(shape: tuple[int, ...]) -> tuple[int, ...]:
        return (batch, *shape[1:]) if batch is not None and shape else shape

    def put(path: str, new: torch.nn.Module) -> None:
        owner_path, _, name = path.rpartition(".")
        (m.get_submodule(owner_path) if owner_path else m)._modules[name] = new

    if not first:
        for path, (shape, made) in split.before.items():
            put(path, _Zeros(resized(shape), dtype or made))
        shape, recorded = split.block_input
        dtype = dtype or recorded

        def receive(module, args, kwargs):
            anchor = torch.empty(0, requires_grad=True)
            local = resized(shape)
            local = (local[0], local[1] // shards, *local[2:]) if shards > 1 and len(local) > 1 else local
            received = _Received.apply(anchor, local, dtype)
            if args:
                return (received, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": received}

        stack[0].register_forward_pre_hook(receive, with_kwargs=True)
    if not last:
        for path in split.after:
            put(path, _Unused())

        def stop(module, args, output):
            raise _StageOutput(output)

        stack[len(stack) - 1].register_forward_hook(stop)
    return StageModel(m)


def recv_sizes(split: Split, stage: int, pp: int, batch: int, shards: int = 1,
               dtype: torch.dtype | None = None) -> tuple[int, int]:
    """Bytes of one micro-batch's receive buffers ``PipelineStage`` allocates once per micro-batch and keeps
    (``stage.py``: ``_prepare_forward_infra`` / ``_prepare_backward_infra``): (its input activation, every stage
    but the first; its output's gradient, every stage but the last)."""
    shape, recorded = split.block_input
    one = math.prod((batch, *shape[1:])) // shards * torch.empty((), dtype=dtype or recorded).element_size()
    return one * (stage > 0), one * (stage < pp - 1)


def bubble_time(step_times: list[float], per_microbatch: list[float], pp: int) -> float:
    """The pipeline's step: the slowest stage's own step plus ``pp - 1`` micro-batch slots of the slowest
    stage (the fill and drain of GPipe and 1F1B alike)."""
    return max(step_times) + (pp - 1) * max(per_microbatch)



# -- a stage's peaks, and the plan ---------------------------------------------------------------------------

@dataclass(frozen=True)
class StagePeaks:
    """A traced stage step's peaks by phase (``(micro_step, "forward"|"backward")`` and ``"optimizer"``), each
    with its rows, and the bytes one micro-batch holds from its forward to its backward."""

    peaks: dict[Any, tuple[int, dict[str, int]]]
    held: int


def stage_peaks(step: Any, device: str) -> StagePeaks:
    """The running live bytes of ``step`` (as :func:`.traced.replay` counts them: the optimizer state live from
    the start, CUDA's block rounding), their maximum in each phase, and the bytes the first micro-step's
    forward makes and still holds at its end (its saved activations, autocast's weight copies, its output, the
    activation it received), which every other micro-batch in flight holds too."""
    from .traced import ROWS, Timeline, running_bytes

    cap = step.cap
    tl = Timeline(cap, step.rows)
    start_rows, deltas, live = running_bytes(tl, cap.storage_bytes, device)
    running = live.tolist()
    library = step.library_bytes(device)

    def key(index: int) -> Any:
        if index < 0:
            return None
        meta = cap.nodes[index].meta
        phase = meta.get("phase", "forward")
        if phase == "optimizer":
            return "optimizer"
        return meta.get("micro_step", 0), "backward" if phase == "backward" else "forward"

    best: dict[Any, int] = {}
    first_forward = last_forward = None
    for k, index in enumerate(tl.index):
        group = key(index)
        if group is None:
            continue
        if group not in best or running[k] > running[best[group]]:
            best[group] = k
        if group == (0, "forward"):
            first_forward = k if first_forward is None else first_forward
            last_forward = k
    peaks = {}
    for group, k in best.items():
        rows = start_rows.index_add(0, tl.row[tl.sid[:k + 1]], deltas[:k + 1])
        by_row = {r: int(rows[i]) for i, r in enumerate(ROWS)}
        by_row["workspaces"] += library
        peaks[group] = (running[k] + library, by_row)
    held = 0
    if first_forward is not None:  # what the first micro-batch's forward made and still holds at its end
        alive: dict[int, int] = {}  # storage -> its (rounded) bytes
        sids, changes = tl.sid.tolist(), deltas.tolist()
        for k in range(first_forward, last_forward + 1):
            if changes[k] > 0:
                alive[sids[k]] = changes[k]
            elif changes[k] < 0:
                alive.pop(sids[k], None)
        # its own tensors only: parameters gathered by the engine, gradients, buffers of collectives and the
        # libraries' workspaces are the stage's, not one per micro-batch in flight
        own = {"activations", "temporaries", "weight_copies", "inputs_and_buffers"}
        held = sum(b for sid, b in alive.items() if step.rows[sid] in own)
    return StagePeaks(peaks, held)


def schedule_peak(peaks: StagePeaks, schedule: str, stage: int, pp: int, microbatches: int,
                  sizes: tuple[int, int], input_grad: int) -> tuple[int, dict[str, int], str]:
    """A stage's peak under ``schedule``: each traced phase's peak with the micro-batches the schedule holds
    in flight at that moment (beyond the traced one) and the receive buffers of the others (``sizes``: one
    micro-batch's, :func:`recv_sizes`; the traced micro-batch's are in the trace, a received activation held
    with its micro-batch, a received gradient during its backward); in 1F1B's steady state a stage after the
    first also holds the input gradient it sent for the previous micro-batch (``input_grad`` bytes:
    ``Schedule1F1B`` keeps its send ops, and the tensor, until the next backward's replace them);
    (bytes, rows, where)."""
    k = in_flight(schedule, stage, pp, microbatches)
    extra_at: dict[Any, int] = {}
    sent_at = {g: input_grad if schedule == "1f1b" and stage > 0 and g != "optimizer" and g[0] > 0 else 0
               for g in peaks.peaks}
    for group in peaks.peaks:
        if group == "optimizer":
            extra_at[group] = 0
        elif schedule == "gpipe":  # every forward before any backward; backward j with M - j still held
            extra_at[group] = microbatches - 1 if group[0] == 0 else max(0, microbatches - 2)
        else:  # 1F1B: k in flight at the first backward and in the steady state
            extra_at[group] = k - 1
    act, grad = sizes

    def buffers(g: Any) -> int:  # the receive buffers not in the trace at that moment
        if g == "optimizer":
            return microbatches * (act + grad)
        return act * (microbatches - 1 - extra_at[g]) + grad * (microbatches - (g[1] == "backward"))

    group = max(peaks.peaks, key=lambda g: peaks.peaks[g][0] + extra_at[g] * peaks.held + sent_at[g] + buffers(g))
    total, rows = peaks.peaks[group]
    rows = dict(rows)
    rows["activations"] = rows.get("activations", 0) + extra_at[group] * peaks.held
    rows["comm_buffers"] = rows.get("comm_buffers", 0) + buffers(group) + sent_at[group]
    where = group if group == "optimizer" else f"{group[1]} of micro-batch {1 + group[0]} (traced), " \
                                               f"{1 + extra_at[group]} in flight"
    return total + extra_at[group] * peaks.held + buffers(group) + sent_at[group], rows, where


def stage_tp_plan(plan: Any, split: Split, stage: int, pp: int) -> Any:
    """The tensor-parallel plan of the whole model (module paths) for stage ``stage``: its blocks' Linears
    renumbered as the stage numbers them, the embedding on the first stage, the head and the norms after the
    stack on the last (``StageModel`` holds the model as ``model``)."""
    from dataclasses import replace as with_fields

    lo, hi = stage_ranges(split.repeats.count, pp)[stage]
    first, last = stage == 0, stage == pp - 1

    def moved(path: str | None) -> str | None:
        if path is None:
            return None
        hit = split.repeats.block_of(path)
        if hit is not None:
            index, rest = hit
            return f"model.{split.repeats.path}.{index - lo}" + (f".{rest}" if rest else "") if lo <= index < hi \
                else None
        if path in split.before or any(path.startswith(p + ".") for p in split.before):
            return f"model.{path}" if first else None
        return f"model.{path}" if last else None

    def moved_all(paths: list[str]) -> list[str]:
        return [q for q in (moved(p) for p in paths) if q is not None]

    return with_fields(plan, colwise=moved_all(plan.colwise), rowwise=moved_all(plan.rowwise),
                       embedding=moved(plan.embedding), head=moved(plan.head), norms=moved_all(plan.norms),
                       gather_at=moved_all(plan.gather_at))


def _trace_stages(planner: Any, layout: Any, group: Any, split: Split, inputs: Any, checkpoint: tuple[type, ...],
                  gpu: Any, microbatches: int, micro: int) -> tuple[list[dict[str, Any]], Any]:
    """Every stage traced on ``group`` (its own ranks) and composed with the schedule: one dict per stage, and
    the link between stages."""
    from .engine import trace_engine

    pp, schedule = layout.pp, layout.pp_schedule
    accumulate = microbatches * planner.options.grad_accum
    intra, _, inter = planner.links(gpu)
    hop = inter if layout.gpus // pp >= planner.gpus_per_node else intra  # stages placed outermost
    shards = layout.tp if layout.sequence_parallel else 1  # the activations between stages: sequence shards
    policy = planner.precision.param_dtype if layout.strategy in ("fsdp", "hsdp") else None  # FSDP2 computes in it
    ranges = stage_ranges(split.repeats.count, pp)
    traced: dict[tuple, tuple] = {}  # stages alike (as many blocks, neither first nor last) traced once
    stages = []
    for s in range(pp):
        key = (ranges[s][1] - ranges[s][0], s == 0, s == pp - 1)
        if key not in traced:
            model = stage_model(planner.model, split, s, pp, batch=micro, shards=shards, dtype=policy)
            units = [p for p, m in model.named_modules() if p and isinstance(m, tuple(planner.wrap))]
            options = replace(planner.options, checkpoint=checkpoint, keep_output=True, grad_accum=accumulate,
                              loss_fn=planner.options.loss_fn if s == pp - 1 else sent_loss, accumulate=stage_backward)
            planner.progress(f"tracing pipeline stage {s + 1} of {pp}", "")
            tp_plan = stage_tp_plan(planner.tp_plan(), split, s, pp) if layout.tp > 1 else None
            step = trace_engine(model, inputs, group, planner.precision, options, units, tp_plan, planner.device)
            traced[key] = (step, stage_peaks(step, planner.device), planner._time(group, step, gpu))
        step, peaks, time = traced[key]
        sizes = recv_sizes(split, s, pp, micro, shards, policy)
        buffers = microbatches * sum(sizes)
        sent = max(sizes)  # one activation (or its gradient) between stages
        total, rows, where = schedule_peak(peaks, schedule, s, pp, microbatches, sizes, sent)
        optimizer = time.by_phase_s.get("optimizer", 0.0)
        per_micro = (time.step_time_s - optimizer) / accumulate + 2 * sent / hop.bandwidth * (s < pp - 1)
        t = step.tally
        stages.append({"stage": s, "blocks": list(stage_ranges(split.repeats.count, pp)[s]), "peak": total,
                       "parameters": t.parameters_bytes, "gradients": t.gradients_bytes,
                       "optimizer_state": t.optimizer_state_bytes,
                       "rows": rows, "at": where, "in_flight": in_flight(schedule, s, pp, microbatches),
                       "recv_buffers": buffers, "step_s": time.step_time_s, "per_microbatch_s": per_micro,
                       "_step": step, "_time": time})
    return stages, hop


def plan_pipeline(planner: Any, layout: Any, checkpoint: tuple[type, ...], gpu: Any, budget: dict[str, Any]) -> Any:
    """The plan of ``layout`` with ``layout.pp`` stages (see the module docstring): every stage traced, the stage
    with the highest peak reported, the step time with the bubble."""
    from ..render.units import fmt_bytes
    from .report import Plan
    from .results import Config, PerGpu, Verdict
    from .schedule import matmul_flops
    from .search import resize_inputs

    pp, schedule = layout.pp, layout.pp_schedule
    batch = planner.base("batch")
    microbatches = layout.microbatches or batch  # torchtitan's default micro-batch: one sample
    if batch % microbatches:
        raise UserError(f"--microbatches {microbatches} does not divide the local batch of {batch}: use a divisor "
                        f"of {batch}")
    if schedule == "1f1b" and microbatches < pp:
        raise UserError(f"1F1B runs at least one micro-batch per stage: --microbatches {microbatches} < --pp {pp}; "
                        f"use --microbatches {pp} or more (a larger --batch)")
    micro = batch // microbatches
    split = find_split(planner.model, planner.single().cap)
    inputs = resize_inputs(planner.inputs, 0, batch, micro) if micro != batch else planner.inputs
    group = replace(layout, gpus=layout.gpus // pp, pp=1, microbatches=0)  # a stage's own ranks
    stages, hop = _trace_stages(planner, layout, group, split, inputs, checkpoint, gpu, microbatches, micro)
    worst = max(stages, key=lambda st: st["peak"])
    step, time = worst["_step"], worst["_time"]
    step_s = bubble_time([st["step_s"] for st in stages], [st["per_microbatch_s"] for st in stages], pp)
    bubble = step_s - max(st["step_s"] for st in stages)
    time = replace(time, step_time_s=step_s)
    reserve = planner.reserve(worst["peak"])  # composed, not simulated: the allocator's first guess
    needed = worst["peak"] + sum(reserve.values())
    fits = needed <= gpu.capacity
    model_flops, dtype = matmul_flops(planner.single())
    model_flops /= pp  # each stage's GPUs run 1/pp of the model's matmuls (even stages)
    peak_flops = gpu.peak_flops(dtype) or gpu.peak_flops("fp32")
    mfu = model_flops / (step_s * peak_flops) if step_s > 0 else None
    training = planner._training(layout, time, model_flops, peak_flops, **budget)
    flops = planner._flops(model_flops, dtype, peak_flops, mfu)
    t = step.tally
    per_gpu = PerGpu(rows=worst["rows"], peak=worst["peak"], peak_phase=worst["at"],
                     peak_module=f"stage {worst['stage']}", peak_op="", parameters=t.parameters_bytes,
                     gradients=t.gradients_bytes, optimizer_state=t.optimizer_state_bytes,
                     saved_activations=t.activations_bytes * worst["in_flight"], host=0)
    config = Config(
        model=planner.model_name, gpu=gpu.name, gpus=layout.gpus, strategy=layout.strategy, tp=layout.tp,
        sequence_parallel=False, loss_parallel=False, dp=layout.dp, shard_group=group.shard, rank=0,
        precision=planner.precision.name, optimizer=step.cap.optimizer_name, checkpoint=[c.__name__ for c in checkpoint],
        offload=layout.offload, wrap=[c.__name__ for c in planner.wrap], micro_batch=batch,
        global_batch=batch * layout.dp * planner.options.grad_accum, seq=planner.seq,
        engine=(planner._engine_text(group) if group.gpus > 1 else "traced: one GPU per stage")
        + f", {pp} pipeline stages ({schedule}, torch.distributed.pipelining's schedule composed)",
        device=planner.device, pp=pp, pp_schedule=schedule, microbatches=microbatches)
    notes = list(step.notes) + [
        f"pipeline: {pp} stages of {split.repeats.count} blocks ({split.repeats.path}) split as torchtitan splits "
        f"them, the modules before them on the first stage, after them on the last; {microbatches} micro-batches "
        f"of {micro} ({schedule}: the stage holds "
        + ", ".join(f"{st['in_flight']}" for st in stages) + " in flight, stage by stage)",
        "pipeline: per stage peak " + ", ".join(f"{st['stage']}: {fmt_bytes(st['peak'])}" for st in stages)
        + f"; the highest, stage {worst['stage']}, is reported",
        f"pipeline: bubble {bubble * 1e3:.1f} ms of the {step_s * 1e3:.1f} ms step (pp - 1 micro-batch slots of the "
        f"slowest stage, with the activation and gradient sends over {hop.name})",
        "pipeline: the stage's peak composes its traced micro-batch with the schedule's others in flight and the "
        "receive buffers PipelineStage keeps (one per micro-batch); its allocator reserve is the first guess",
    ] + planner.float8_notes
    pipeline = {"schedule": schedule, "stages": pp, "microbatches": microbatches, "micro_batch": micro,
                "bubble_s": bubble, "worst_stage": worst["stage"],
                "per_stage": [{k: v for k, v in st.items() if not k.startswith("_")} for st in stages]}
    return Plan(config, per_gpu, Verdict(fits, gpu.capacity, reserve, needed, gpu.capacity - needed, []), time, flops,
                training, None, None, {}, notes, pipeline)

"""Pipeline parallelism: each stage's step traced on its own layers, composed with its schedule.

How ``torch.distributed.pipelining`` runs a model over ``pp`` ranks, and how the plan follows it:

* **Stages split by layer**, as torchtitan's ``pipeline_llm`` splits a decoder (:func:`stage_ranges`): one stage
  per rank for GPipe and 1F1B, two for interleaved 1F1B and ZBV (torchtitan's default); the embedding counts as
  a block on the first stage, the final norm and head as one on the last.  A stage is the model with only its
  run of blocks (as torchtitan deletes the others), the other stages' modules replaced by stand-ins without
  parameters; a stage after the first starts from the activation it receives (whose gradient it sends back), a
  stage before the last stops after its last block and sends its output.  ``PipelineStage`` receives into
  buffers it allocates once, one per micro-batch (``_prepare_forward_infra`` / ``_prepare_backward_infra``).
* **Each stage's step is traced** like any layout's rank (its engine, precision, checkpointing and optimizer;
  FSDP2 not resharded after forward unless asked, torchtitan's default under pipeline parallelism) on one
  micro-batch (the local batch split into ``microbatches``), with gradients accumulating over the micro-batches
  (two micro-steps traced, as gradient accumulation is; under FSDP2 neither the reduce-scatter nor the
  resharding after backward but on the last, as ``PipelineStage.backward_maybe_with_nosync`` runs it) and the
  stage's output held until its backward (the schedules keep it in ``fwd_cache``).
* **Each rank composed with its schedule** (:mod:`.pipeline_schedule`): the order of actions PyTorch's schedule
  runs on that rank, the micro-batches each of its stages holds in flight at each action, its other stage at
  rest, the receive buffers and the sends not yet waited on; the step's time from the same orders simulated
  over all ranks with the sends between them.

The plan reports the rank with the highest peak.  Checked against real ``torch.distributed.pipelining`` runs
(tests/test_pipeline.py, gloo): model states exact, every rank's peak within 1 % (GPipe, 1F1B, interleaved 1F1B,
with tensor and sequence parallelism inside the stages; with context parallelism inside them, each stage's
attention torch's ring over its cp group and every activation between stages 1/cp of the sequence).  Not
modelled: stages whose blocks differ, the allocator's fragmentation of the composed peak (its first guess).
"""

from __future__ import annotations

import copy
import inspect
import math
from dataclasses import replace
from typing import Any, Callable

import torch

from ..capture.blocks import shortened
from ..errors import UserError
from .pipeline_split import Split, find_split  # noqa: F401  (find_split re-exported)



def stage_ranges(blocks: int, stages: int, input_weight: int = 1, output_weight: int = 1) -> list[tuple[int, int]]:
    """Contiguous runs of ``blocks`` blocks for ``stages`` stages as torchtitan's ``generate_llm_fqn_per_model_part``
    deals them: the embedding counts as ``input_weight`` blocks on the first stage, the norm and head as
    ``output_weight`` on the last (``pipeline_parallel_first_stage_less_layers`` / ``..._last_stage_less_layers``,
    1 each by default), the ``blocks + input_weight + output_weight`` evenly, the first stages one more when
    uneven."""
    if stages == 1:
        return [(0, blocks)]
    per, extra = divmod(blocks + input_weight + output_weight, stages)
    if per < max(1, input_weight, output_weight):
        raise UserError(f"--pp: {stages} stages of {blocks} blocks (the embedding and the head count as one each, "
                        f"as torchtitan deals them) leave a stage empty; use {max(1, (blocks + 2) // 2)} stages "
                        f"or fewer")
    sizes = [per + (s < extra) for s in range(stages)]
    sizes[0] -= input_weight
    sizes[-1] -= output_weight
    out, lo = [], 0
    for size in sizes:
        out.append((lo, lo + size))
        lo += size
    return out


def _unfilled(pp: int, schedule: str, n_stages: int, v: int, blocks: int, fills: Callable[[int], bool]) -> str:
    """Why ``n_stages`` stages leave one without a block, the layers each would get, and the deepest pipeline that
    fills (this schedule's, else one stage per rank)."""
    try:
        counts = ", ".join(str(hi - lo) for lo, hi in stage_ranges(blocks, n_stages))
        detail = f": blocks per stage {counts}"
    except UserError:
        detail = ""
    most = max((p for p in range(2, blocks + 1) if fills(p * v)), default=0)
    flat = max((p for p in range(2, blocks + 1) if fills(p)), default=0)
    if most:
        fix = f"use --pp {most} or fewer"
    elif flat:
        fix = f"use --pp-schedule 1f1b (one stage per rank) with --pp {flat} or fewer"
    else:
        fix = "the model is too shallow to pipeline: drop --pp"
    return (f"--pp {pp} ({schedule}: {n_stages} stages) leaves a stage without a block: the {blocks} blocks with "
            f"the embedding and the head (a block each, as torchtitan deals them) make {blocks + 2} over "
            f"{n_stages} stages{detail}; {fix}")


class _StageOutput(Exception):
    """Raised after a stage's last block: the stage's output, caught by :class:`StageModel`."""

    def __init__(self, output: Any):
        super().__init__("stage output")
        self.output = output


class _Unused(torch.nn.Module):
    """A module of a later stage, without parameters: the first of them to run stops the stage with its input
    (the output of the last block), so that every hook of the last block has run (an engine's post-forward)
    and a capture that traces a few blocks of a long stack (and replicates the rest) stops alike."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        if first is None:  # pragma: no cover - a module after the stack that takes no tensor
            raise RuntimeError("a module of another pipeline stage ran")
        raise _StageOutput(first)


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

    receive: Any = None  # makes the activation the stage receives, before its first block runs

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.receive is not None:
            self.receive()
        try:
            return self.model(*args, **kwargs)
        except _StageOutput as out:
            return out.output


def stage_model(model: torch.nn.Module, split: Split, stage: int, pp: int, batch: int | None = None,
                shards: int = 1, dtype: torch.dtype | None = None, cp: int = 1) -> StageModel:
    """A copy of ``model`` (sharing nothing the step changes: its own module objects, the same parameter
    tensors) as stage ``stage`` of ``pp`` runs it; ``batch``: the micro-batch (the recorded shapes' dim 0);
    ``shards``: the activation received holds 1/shards of the sequence (sequence parallelism); ``dtype``: its
    dtype where the engine's differs from the single-device step's (FSDP2's MixedPrecisionPolicy computes in
    its ``param_dtype``); ``cp``: each rank of a context-parallel group holds 1/cp of every sequence (the
    recorded shapes' dim 1, the activations received and the stand-ins' outputs alike)."""
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

    traced_batch, traced_seq = (split.block_input[0] + (None, None))[:2]

    def resized(shape: tuple[int, ...]) -> tuple[int, ...]:
        if not shape or shape[0] != traced_batch:  # an output without the batch dimension (position embeddings
            #                                         of the sequence, (T, C)): its sequence split, nothing else
            return (shape[0] // cp, *shape[1:]) if cp > 1 and shape and shape[0] == traced_seq else shape
        shape = (batch, *shape[1:]) if batch is not None else shape
        return (shape[0], shape[1] // cp, *shape[2:]) if cp > 1 and len(shape) > 1 else shape

    def put(path: str, new: torch.nn.Module) -> None:
        owner_path, _, name = path.rpartition(".")
        (m.get_submodule(owner_path) if owner_path else m)._modules[name] = new

    if not first:
        for path, (shape, made) in split.before.items():
            put(path, _Zeros(resized(shape), dtype or made))
        shape, recorded = split.block_input
        dtype = dtype or recorded

        box: dict[str, torch.Tensor] = {}

        def receive() -> None:  # at the start of the stage's forward, as PipelineStage receives before it runs
            anchor = torch.empty(0, requires_grad=True)
            local = resized(shape)
            local = (local[0], local[1] // shards, *local[2:]) if shards > 1 and len(local) > 1 else local
            box["received"] = _Received.apply(anchor, local, dtype)

        def substitute(module, args, kwargs):  # the first block takes it in place of the stand-ins' output
            received = box.pop("received")
            if args:
                return (received, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": received}

        stack[0].register_forward_pre_hook(substitute, with_kwargs=True)
    if not last:
        for path in split.after:  # the first to run stops the stage: after every hook of the last block (an
            put(path, _Unused())  # engine's post-forward: FSDP2's reshard) has run, as in the real stage
        if not split.after:
            def stop(module, args, output):
                raise _StageOutput(output)

            stack[len(stack) - 1].register_forward_hook(stop)
    stage = StageModel(m)
    if not first:
        stage.receive = receive
    return stage


def recv_sizes(split: Split, stage: int, pp: int, batch: int, shards: int = 1,
               dtype: torch.dtype | None = None) -> tuple[int, int]:
    """Bytes of one micro-batch's receive buffers ``PipelineStage`` allocates once per micro-batch and keeps
    (``stage.py``: ``_prepare_forward_infra`` / ``_prepare_backward_infra``): (its input activation, every stage
    but the first; its output's gradient, every stage but the last)."""
    shape, recorded = split.block_input
    one = math.prod((batch, *shape[1:])) // shards * torch.empty((), dtype=dtype or recorded).element_size()
    return one * (stage > 0), one * (stage < pp - 1)



# -- the plan ----------------------------------------------------------------------------------------------

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
                  gpu: Any, microbatches: int, micro: int, n_stages: int) -> tuple[list[dict[str, Any]], Any]:
    """Every stage traced on ``group`` (its own ranks): one dict per stage (its traced step and time, what the
    schedule's composition needs of it), and the link between stages."""
    from ..collect import settle
    from .engine import trace_engine
    from .pipeline_schedule import rank_stages
    from .stage_bytes import stage_bytes

    pp = layout.pp
    if getattr(planner, "grad_sync", "last") != "last":
        raise UserError("--grad-sync every with --pp is not modelled: a pipeline schedule syncs its stages' gradients "
                        "after its last micro-batch; plan it with --grad-sync last")
    accumulate = microbatches * planner.options.grad_accum
    intra, _, inter = planner.links(gpu)
    hop = inter if layout.gpus // pp >= planner.gpus_per_node else intra  # stages placed outermost
    shards = layout.tp if layout.sequence_parallel else 1  # the activations between stages: sequence shards
    policy = planner.precision.param_dtype if layout.strategy in ("fsdp", "hsdp") else None  # FSDP2 computes in it
    kept = layout.strategy in ("fsdp", "hsdp") and not layout.reshards_after_forward  # gathered in the 1st forward
    ranges = stage_ranges(split.repeats.count, n_stages)
    rank_of = {s: r for r in range(pp) for s in rank_stages(layout.pp_schedule, pp, r)}
    traced: dict[tuple, tuple] = {}  # stages alike (blocks of the same kinds, neither first nor last) traced once
    stages = []
    for s in range(n_stages):
        key = (split.kinds_of(*ranges[s]), s == 0, s == n_stages - 1)
        if key not in traced:
            model = stage_model(planner.model, split, s, n_stages, batch=micro, shards=shards, dtype=policy,
                                cp=layout.cp)
            units = [p for p, m in model.named_modules() if p and isinstance(m, tuple(planner.wrap))]
            options = replace(planner.options, checkpoint=checkpoint, keep_output=True, grad_accum=accumulate,
                              loss_fn=planner.options.loss_fn if s == n_stages - 1 else sent_loss,
                              accumulate=stage_backward)
            planner.progress(f"tracing pipeline stage {s + 1} of {n_stages}", "")
            tp_plan = stage_tp_plan(planner.tp_plan(), split, s, n_stages) if layout.tp > 1 else None
            step = trace_engine(model, inputs, group, planner.precision, options, units, tp_plan, planner.device)
            traced[key] = (step, planner._time(group, step, gpu))
            settle()  # the stage model's and its trace's garbage collected once (automatic collection is off)
        step, time = traced[key]
        sizes = recv_sizes(split, s, n_stages, micro, shards * layout.cp, policy)
        sent = max(sizes)  # one activation (or its gradient) between stages
        optimizer = time.by_phase_s.get("optimizer", 0.0)
        work = (time.step_time_s - optimizer) / accumulate  # one micro-batch's forward and backward
        fwd, bwd = time.by_phase_s.get("forward", 0.0), time.by_phase_s.get("backward", 0.0)
        f = work * fwd / (fwd + bwd) if fwd + bwd > 0 else work / 3
        w = min(f, (work - f) / 2)  # zero-bubble's weight gradient: its forward GEMMs' FLOPs again
        t = step.tally
        stages.append({"stage": s, "rank": rank_of[s], "blocks": list(ranges[s]),
                       "parameters": t.parameters_bytes, "gradients": t.gradients_bytes,
                       "optimizer_state": t.optimizer_state_bytes, "recv_buffers": microbatches * sum(sizes),
                       "step_s": time.step_time_s, "optimizer_s": optimizer,
                       "seconds": {"F": f, "B": work - f, "I": work - f - w if s else 0.0,  # the first stage:
                                   "W": w if s else work - f},  # its W is the whole backward (stage.py)
                       "send_s": sent / hop.bandwidth if s < n_stages - 1 else 0.0,
                       "_bytes": stage_bytes(step, planner.device, sizes, sent, kept=kept), "_step": step,
                       "_time": time})
    return stages, hop


def _compose_ranks(stages: list[dict[str, Any]], layout: Any, microbatches: int,
                   grad_accum: int) -> tuple[list[dict[str, Any]], float, float]:
    """Each pipeline rank's peak over its schedule's actions and the step's time (:mod:`.pipeline_schedule`):
    (one dict per rank, step seconds, bubble seconds)."""
    from .pipeline_schedule import orders, rank_peak, simulate

    pp, schedule, n_stages = layout.pp, layout.pp_schedule, len(stages)
    acts = orders(schedule, pp, microbatches)
    makespan, busy = simulate(acts, {st["stage"]: st["rank"] for st in stages},
                              {st["stage"]: st["seconds"] for st in stages}, {st["stage"]: st["send_s"] for st in stages})
    ranks = []
    for r in range(pp):
        mine = [st for st in stages if st["rank"] == r]
        total, rows, where, most = rank_peak(acts[r], {st["stage"]: st["_bytes"] for st in mine}, schedule,
                                             microbatches, n_stages)
        ranks.append({"rank": r, "stages": [st["stage"] for st in mine], "blocks": [st["blocks"] for st in mine],
                      "peak": total, "rows": rows, "at": where, "in_flight": [most[st["stage"]] for st in mine],
                      **{k: sum(st[k] for st in mine) for k in ("parameters", "gradients", "optimizer_state",
                                                                 "recv_buffers")},
                      "busy_s": busy[r] * grad_accum, "optimizer_s": sum(st["optimizer_s"] for st in mine)})
    step_s = makespan * grad_accum + max(rk["optimizer_s"] for rk in ranks)
    bubble = step_s - max(rk["busy_s"] + rk["optimizer_s"] for rk in ranks)
    return ranks, step_s, bubble


def _rank_time(mine: list[dict[str, Any]], step_s: float) -> Any:
    """The step time of the rank holding the stages ``mine``: their traced times summed (each stage's trace
    runs all of its micro-batches), the rest of the pipeline's ``step_s`` the rank's bubble."""
    times = [st["_time"] for st in mine]

    def summed(key: str) -> dict[str, float]:
        return {k: sum(getattr(t, key).get(k, 0.0) for t in times) for t in times for k in getattr(t, key)}

    busy = sum(t.step_time_s for t in times)
    return replace(times[0], step_time_s=step_s, compute_s=sum(t.compute_s for t in times),
                   comm_s=sum(t.comm_s for t in times), exposed_comm_s=sum(t.exposed_comm_s for t in times),
                   offload_s=sum(t.offload_s for t in times), by_phase_s=summed("by_phase_s"),
                   comm_by_kind_s=summed("comm_by_kind_s"), comm_bytes_per_gpu=summed("comm_bytes_per_gpu"),
                   bubble_s=max(step_s - busy, 0.0))


def plan_pipeline(planner: Any, layout: Any, checkpoint: tuple[type, ...], gpu: Any, budget: dict[str, Any],
                  search: bool = True) -> Any:
    """The plan of ``layout`` with ``layout.pp`` pipeline ranks (see the module docstring): every stage traced,
    each rank composed with its schedule, the rank with the highest peak reported, the step time simulated;
    ``search``: the largest local batch at the same micro-batch size (:mod:`.pipeline_search`).

    Why this length: the plan's every field (config, per-GPU rows, verdict, time, notes, the pipeline's
    table) is filled from the composed ranks here, once."""
    from ..render.units import fmt_bytes
    from .pipeline_schedule import stages_per_rank

    if planner.options.zero_grad != "after_step":
        raise UserError("--zero-grad before-backward: a pipeline schedule runs every micro-batch's forward and "
                        "backward inside its step(), and the loop's zero_grad() comes before it: drop --zero-grad")
    from .report import Plan
    from .results import Config, PerGpu, Verdict
    from .schedule import matmul_flops
    from .search import resize_inputs, sequence_shown

    pp, schedule = layout.pp, layout.pp_schedule
    v = stages_per_rank(schedule)
    n_stages = pp * v
    batch = planner.base("batch")
    microbatches = layout.microbatches or batch  # torchtitan's default micro-batch: one sample
    if batch % microbatches:
        raise UserError(f"--microbatches {microbatches} does not divide the local batch of {batch}: use a divisor "
                        f"of {batch}")
    if schedule == "1f1b" and microbatches < pp:
        raise UserError(f"1F1B runs at least one micro-batch per stage: --microbatches {microbatches} < --pp {pp}; "
                        f"use --microbatches {pp} or more (a larger --batch)")
    micro = batch // microbatches
    split = find_split(planner.model, planner.reference().cap)
    def fills(stages: int) -> bool:  # every stage holds a block (a stage of the embedding alone is not planned)
        try:
            return all(hi > lo for lo, hi in stage_ranges(split.repeats.count, stages))
        except UserError:
            return False

    if not fills(n_stages):
        raise UserError(_unfilled(pp, schedule, n_stages, v, split.repeats.count, fills))
    inputs = resize_inputs(planner.inputs, 0, batch, micro) if micro != batch else planner.inputs
    if layout.cp > 1:  # each rank of a context-parallel group feeds its stages 1/cp of every sequence
        from .context import shard_sequence

        inputs = shard_sequence(inputs, planner.seq, layout.cp)
    group = replace(layout, gpus=layout.gpus // pp, pp=1, microbatches=0,  # a stage's own ranks
                    reshard_after_forward=layout.reshards_after_forward)
    stages, hop = _trace_stages(planner, layout, group, split, inputs, checkpoint, gpu, microbatches, micro, n_stages)
    ranks, step_s, bubble = _compose_ranks(stages, layout, microbatches, planner.options.grad_accum)
    batch_solve = _search_batch(planner, stages, layout, micro, gpu) if search else None
    worst = max(ranks, key=lambda rk: rk["peak"])
    first = next(st for st in stages if st["rank"] == worst["rank"])
    step, time = first["_step"], _rank_time([st for st in stages if st["rank"] == worst["rank"]], step_s)
    reserve = planner.reserve(worst["peak"])  # composed, not simulated: the allocator's first guess
    needed = worst["peak"] + sum(reserve.values())
    fits = needed <= gpu.capacity
    model_flops = matmul_flops(planner.reference())[0]
    # the dtype of the stage's own matmuls: the single-device reference runs without the engine's policy (under
    # fsdp-bf16 it is fp32 there; FSDP2's param_dtype makes the stages' matmuls bf16)
    dtype = matmul_flops(step)[1]
    # each rank runs 1/pp of the model's matmuls (even stages), 1/tp of each, on 1/cp of each sequence
    model_flops /= pp * layout.tp * layout.cp
    peak_flops = gpu.matmul_peak(dtype)  # (a mode the GPU lacks: the time model's rate)
    mfu = model_flops / (step_s * peak_flops) if step_s > 0 else None
    training = planner._training(layout, time, model_flops, peak_flops, **budget)
    flops = planner._flops(model_flops, dtype, peak_flops, mfu)
    saved = sum(st["_step"].tally.activations_bytes * n for st, n in
                zip((st for st in stages if st["rank"] == worst["rank"]), worst["in_flight"]))
    per_gpu = PerGpu(rows=worst["rows"], peak=worst["peak"], peak_phase=worst["at"],
                     peak_module=f"pipeline rank {worst['rank']}", peak_op="", parameters=worst["parameters"],
                     gradients=worst["gradients"], optimizer_state=worst["optimizer_state"],
                     saved_activations=saved, host=0)
    shape = f"{pp} pipeline stages" if v == 1 else f"{n_stages} pipeline stages, {v} per rank"
    config = Config(
        model=planner.model_name, gpu=gpu.name, gpus=layout.gpus, strategy=layout.strategy, tp=layout.tp,
        sequence_parallel=layout.sequence_parallel, loss_parallel=layout.loss_parallel, dp=layout.dp,
        # the reported rank: the first of its pipeline rank's group (torchtitan's mesh puts pp outermost)
        shard_group=group.shard * (layout.cp if layout.strategy != "ddp" else 1), rank=worst["rank"] * group.gpus,
        precision=planner.precision.name, optimizer=step.cap.optimizer_name, checkpoint=[c.__name__ for c in checkpoint],
        offload=layout.offload, wrap=[c.__name__ for c in planner.wrap], micro_batch=batch,
        global_batch=batch * layout.dp * planner.options.grad_accum, seq=sequence_shown(planner.inputs),
        engine=(planner._engine_text(group) if group.gpus > 1 else "traced: one GPU per stage")
        + f", {shape} ({schedule}, torch.distributed.pipelining's schedule composed)",
        device=planner.device, pp=pp, async_tp=layout.async_tp, pp_schedule=schedule, microbatches=microbatches,
        cp=layout.cp, ep=layout.ep)
    notes = list(step.notes) + [
        f"pipeline: {n_stages} stages of {split.repeats.count} blocks ({split.repeats.path}) split as torchtitan "
        f"splits them (the embedding and the head count as a block each, on the first and the last stage); "
        f"{microbatches} micro-batches of {micro} ({schedule}"
        + (f", stages {', '.join('/'.join(map(str, rk['stages'])) for rk in ranks)} on ranks 0-{pp - 1}" if v > 1
           else "") + ")",
        "pipeline: per rank peak " + ", ".join(f"{rk['rank']}: {fmt_bytes(rk['peak'])}" for rk in ranks)
        + f"; the highest, rank {worst['rank']}, is reported",
        f"pipeline: bubble {bubble * 1e3:.1f} ms of the {step_s * 1e3:.1f} ms step (the schedule's actions simulated "
        f"on every rank, with the activation and gradient sends over {hop.name})",
        "pipeline: a rank's peak composes each stage's traced micro-batch with the schedule's others in flight, "
        "its resting stages, the receive buffers PipelineStage keeps (one per micro-batch) and the sends not yet "
        "waited on; its allocator reserve is the first guess",
    ] + (["pipeline: zero-bubble's input gradient (I) keeps its micro-batch's graph and the output gradients of "
          "its weight GEMMs until the weight gradient (W); W assumed to take the forward's time (a weight "
          "gradient GEMM has its forward GEMM's FLOPs)"] if schedule == "zbv" else []) \
        + (["pipeline: FSDP2 keeps each stage's parameters gathered after forward (reshard_after_forward false, "
            "torchtitan's default under pipeline parallelism; --reshard-after-forward true to change it)"]
           if layout.strategy != "ddp" and layout.reshard_after_forward is None else []) + planner.float8_notes
    pipeline = {"schedule": schedule, "stages": n_stages, "ranks": pp, "stages_per_rank": v,
                "microbatches": microbatches, "micro_batch": micro, "bubble_s": bubble, "worst_rank": worst["rank"],
                "per_rank": ranks,
                "per_stage": [{k: val for k, val in st.items() if not k.startswith("_")} for st in stages]}
    return Plan(config, per_gpu, Verdict(fits, gpu.capacity, reserve, needed, gpu.capacity - needed, []), time, flops,
                training, batch_solve, None, {}, notes, pipeline)


def _search_batch(planner: Any, stages: list[dict[str, Any]], layout: Any, micro: int, gpu: Any) -> Any:
    """The largest local batch whose highest pipeline rank fits ``gpu`` with its reserve (composed, no trace)."""
    from .pipeline_search import largest_local_batch

    def fits(count: int) -> bool:
        ranks, _, _ = _compose_ranks(stages, layout, count, planner.options.grad_accum)
        peak = max(rk["peak"] for rk in ranks)
        return peak + sum(planner.reserve(peak).values()) <= gpu.capacity

    return largest_local_batch(fits, layout.pp_schedule, layout.pp, micro)

"""The planner: traces a model once per layout and size, and answers for one layout (:meth:`Planner.plan`)
or many (:meth:`Planner.compare`): memory per GPU, fits or not, largest batch, step time, time to train.

Where each answer comes from: the engines' traced steps (:mod:`.engine`) or the ZeRO layouts
(:mod:`.zero`) for memory, :mod:`.schedule` for time, :mod:`.search` for the searches; the
rows, peak and reserve follow :mod:`estimator.memory` (its categories, its steady-state replay,
its CUDA reserve).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

import torch

from ..capture import StepOptions, capture, check_zero_grad
from ..capture.checkpoint import parse_policy, resolve_classes
from ..capture.compiled import check_checkpoint_regions, compiled_model
from ..caller import apart_from_caller_during
from ..collect import young_only_during
from ..errors import UserError
from ..lora import finetuned
from ..loop import check_loop
from ..ema import check_ema
from ..optim import check_clip
from ..hardware import GPU, gpu_links, link, lookup
from ..memory import CUDA_RESERVE, FRAGMENTATION, simulate
from ..tally import tally
from ..target import CudaTarget, parse_release
from .context import in_chunks, shard_sequence
from .describe import engine_text, layout_notes
from .engine import one_sequence_per_sample, trace_engine, with_grad_sync
from .interpolate import searched_allocator
from .layout import Layout, check_finetune, check_layout, check_tied_units, parse_plan_precision
from .model_flops import attention_term, matmul_params
from .report import Comparison, Plan
from .results import Config, Flops, PerGpu, Solve, StepTime, Suggestion, Training, Verdict
from .schedule import matmul_flops, traced_time, zero_time
from .search import (check_budget, check_not_empty, check_solve, fewest_gpus, input_dims, lagrange, largest_fitting,
                     position_limit, resize_inputs, sequence_shown, tokens_per_sample)
from .tp_dataflow import TPPlan, derive_tp_plan, model_heads
from .traced import Peak, Step, storage_rows
from .zero import ZeroStates, zero_peak

Progress = Callable[..., None]
MAX_GPUS = 16384  # the largest layout the suggestions search


def default_wrap(model: torch.nn.Module) -> tuple[tuple[type, ...], list[str]]:
    """The blocks of the largest list of repeated blocks (a ModuleList/Sequential of >= 2 children of one
    class, e.g. transformer blocks): (their class, their paths); none: ((), [])."""
    best, best_params = None, 0
    for path, mod in model.named_modules():
        if isinstance(mod, (torch.nn.ModuleList, torch.nn.Sequential)):
            kids = list(mod.named_children())
            if len(kids) >= 2 and len({type(k) for _, k in kids}) == 1:
                n = sum(p.numel() for p in mod.parameters())
                if n > best_params:
                    best, best_params = (type(kids[0][1]), [f"{path}.{k}" if path else k for k, _ in kids]), n
    return ((best[0],), best[1]) if best is not None else ((), [])


@dataclass
class _Memory:
    """One rank's memory under a layout: the peak by row and the model states it holds."""

    peak: Peak
    parameters: int
    gradients: int
    optimizer_state: int
    host: int
    zero: ZeroStates | None = None


class Planner:
    """Plans for one model and micro-batch: traces each layout once (cached), then answers."""

    def __init__(self, model: torch.nn.Module, inputs: Any, *, gpu: str | GPU, optimizer: Any = "adamw",
                 optimizer_kwargs: Mapping[str, Any] | None = None, loss_fn=None, precision: str = "bf16-mixed",
                 reduce_dtype: str | None = None, wrap: Any = None, device: str = "cuda", gpus_per_node: int = 8,
                 interconnect: str | None = None, inter_node: str | None = None, zero_semantics: str = "deepspeed",
                 model_name: str | None = None, progress: Progress | None = None, trace: str = "auto",
                 keep_output: bool = False, grad_accum: int = 1, checkpoint_policy: Any = "full",
                 replicate: bool = True, compile: Any = None, float8: Any = None, float8_all_gather: bool = False,
                 cuda_torch: str | None = None, lora: Any = None, quantize: str | None = None,
                 clip_grad_norm: float | None = None, ema: float | None = None, zero_grad: str = "after_step",
                 grad_sync: str = "last"):
        if not isinstance(model, torch.nn.Module):
            raise UserError(f"model must be a torch.nn.Module, not {type(model).__name__}")
        if device not in ("cuda", "cpu"):
            raise UserError(f"device must be 'cuda' or 'cpu', not {device!r}")
        if zero_semantics not in ("deepspeed", "paper"):
            raise UserError(f"--zero-semantics must be deepspeed or paper, not {zero_semantics!r}")
        if gpus_per_node < 1:
            raise UserError(f"--gpus-per-node must be >= 1, not {gpus_per_node}")
        from ..float8 import check_float8_gpu, check_recipe, converted

        model, compile, compiled_notes = compiled_model(model, compile)
        names = {id(p): n for n, p in model.named_parameters()}  # (an optimizer instance's, on the engines' copies)

        recipe, self.float8_notes = check_recipe(float8), []
        if float8_all_gather and recipe is None:
            raise UserError("--float8-all-gather gathers float8 weights: add --float8 tensorwise")
        self.float8_all_gather = bool(float8_all_gather)
        check_float8_gpu(recipe, gpu if isinstance(gpu, GPU) else lookup(gpu))
        if recipe is not None:  # torchao's Float8Linear on a meta copy (see estimator.float8)
            model, self.float8_notes = converted(model, recipe, self.float8_all_gather)
        self.model_name = model_name or type(model).__name__
        self.precision = parse_plan_precision(precision, reduce_dtype)
        # LoRA / QLoRA (estimator.lora): the model as the fine-tuning run trains it
        model, notes, _ = finetuned(model, lora, quantize, self.precision.step, optimizer=optimizer)
        self.float8_notes[:0], self.finetune = compiled_notes + notes, (lora is not None, quantize is not None)
        if not any(p.requires_grad for p in model.parameters()):
            raise UserError("no parameter of the model requires grad: a training plan has nothing to train; set "
                            "requires_grad on the parameters to train")
        self.model, self.inputs, self.device = model, inputs, device
        self.gpu = gpu if isinstance(gpu, GPU) else lookup(gpu)
        self.gpus_per_node = gpus_per_node
        self.interconnect, self.inter_node = interconnect, inter_node
        self.zero_semantics = zero_semantics
        self.progress = progress or (lambda stage, detail="": None)
        self.trace_mode = trace
        if not isinstance(grad_accum, int) or isinstance(grad_accum, bool) or grad_accum < 1:
            raise UserError(f"--grad-accum must be an integer >= 1, not {grad_accum!r}")
        check_loop("train", optimizer, optimizer_kwargs, keep_output, ema, clip_grad_norm)
        self.options = StepOptions(loss_fn=loss_fn, optimizer=optimizer, optimizer_kwargs=optimizer_kwargs,
                                   param_names=names, foreach=True if device == "cuda" else None,
                                   precision=self.precision.step, train=True, target=device, keep_output=keep_output,
                                   grad_accum=grad_accum, clip_grad_norm=check_clip(clip_grad_norm), ema=check_ema(ema),
                                   zero_grad=check_zero_grad(zero_grad), compile=compile,
                                   checkpoint_policy=parse_policy(checkpoint_policy), replicate=replicate,
                                   cuda=CudaTarget.for_gpu(self.gpu, parse_release(cuda_torch))
                                   if device == "cuda" else None)
        self.options, self.grad_sync = with_grad_sync(self.options, grad_sync), grad_sync
        if wrap:
            self.wrap = resolve_classes(model, wrap, "--wrap")
            self.unit_paths = [p for p, m in model.named_modules() if p and isinstance(m, self.wrap)]
            check_tied_units(model, self.unit_paths, wrap)
        else:
            self.wrap, self.unit_paths = default_wrap(model)
        check_not_empty(inputs)
        self.batch, self.seq = input_dims(inputs)
        self._steps: dict[tuple, Step] = {}
        self._tp_plan: TPPlan | None = None
        self._siblings: dict[str, Planner] = {}

    # -- links ----------------------------------------------------------------------------------------
    def links(self, gpu: GPU):
        intra, host, inter = gpu_links(gpu)
        return (link(self.interconnect) if self.interconnect else intra, host,
                link(self.inter_node) if self.inter_node else inter)

    # -- traces (cached) --------------------------------------------------------------------------------
    def _size_key(self, what: str | None, value: int | None) -> tuple[str | None, int | None]:
        """The cache key of a size: the inputs as given are one size whatever asked for them."""
        if what is not None and value == (self.batch if what == "batch" else self.seq):
            return None, None
        return what, value

    def inputs_at(self, what: str | None, value: int | None) -> Any:
        if what is None:
            return self.inputs
        base = self.base(what)
        return self.inputs if value == base else resize_inputs(self.inputs, 0 if what == "batch" else 1, base, value)

    def base(self, what: str) -> int:
        value = self.batch if what == "batch" else self.seq
        if value is None:
            raise UserError(f"cannot solve for the {'batch size' if what == 'batch' else 'sequence length'}: "
                            f"the inputs have no {'dimension 0' if what == 'batch' else 'dimension 1'}")
        return value

    def single(self, checkpoint: tuple[type, ...] = (), what: str | None = None, value: int | None = None,
               zero: bool = False, eager: bool = False) -> Step:
        """The single-device step (no engine): ZeRO's base and the reference for FLOPs and TP pairs.
        ``zero``: with a mixed policy, the model cast to the low dtype as DeepSpeed runs it; ``eager``: without
        torch.compile (the tensor-parallel pairs are read from the modules each op runs in)."""
        from ..precision import parse_precision

        precision = self.options.precision
        if zero and self.precision.master:
            precision = parse_precision({torch.bfloat16: "bf16", torch.float16: "fp16"}[self.precision.low])
        what, value = self._size_key(what, value)
        compiled = None if eager else self.options.compile
        # DeepSpeed's engine zeroes its gradients inside its step(): a ZeRO layout frees them after the step
        zero_grad = "after_step" if zero else self.options.zero_grad
        key = ("single", checkpoint, what, value, precision.name, compiled, zero_grad)
        hit = self._steps.get(key)
        if hit is None:
            self.progress("tracing the step on one device", f"{what or 'as given'} {value or ''}".strip())
            opts = replace(self.options, checkpoint=checkpoint, precision=precision, compile=compiled,
                           zero_grad=zero_grad)
            with one_sequence_per_sample():
                cap = capture(self.model, self.inputs_at(what, value), opts, mode=self.trace_mode,
                              progress=self.progress)
            # (its fit is never asked: ZeRO layouts take the FRAGMENTATION guess, so no allocator_need)
            hit = self._steps[key] = Step(cap, tally(cap), simulate(cap, self.device, target=opts.cuda, need=False),
                                          storage_rows(cap), value)
            if cap.fallback_reason:
                hit.notes.append(cap.fallback_reason)
            hit.notes.extend(n for n in cap.assumptions if n not in hit.notes)
        return hit

    def tp_plan(self) -> TPPlan:
        if self._tp_plan is None:
            # from the eager step: a compiled graph's ops run in its region's module, not in their Linear layers
            self._tp_plan = derive_tp_plan(self.model, self.single(eager=True).cap, self.unit_paths)
        return self._tp_plan

    def traced(self, layout: Layout, checkpoint: tuple[type, ...] = (), what: str | None = None,
               value: int | None = None) -> Step:
        """The rank's step under ``layout``: the engine traced (ddp, fsdp, hsdp), or ZeRO's base step."""
        if not layout.traced:
            return self.single(checkpoint, what, value, zero=True)
        what, value = self._size_key(what, value)
        key = ("engine", layout, checkpoint, what, value)
        hit = self._steps.get(key)
        if hit is None:
            label = f"{layout.describe()} on {layout.gpus} GPUs, rank {layout.rank}"
            self.progress(f"tracing {label}", f"{what} {value}" if what else "")

            def progress(stage: str, detail: str = "") -> None:
                self.progress(f"{stage} ({label})", detail)

            inputs = self.inputs_at(what, value)
            if layout.cp > 1:  # each rank of a context-parallel group holds 1/cp of every sequence
                inputs = shard_sequence(inputs, value if what == "seq" else self.seq, layout.cp)
            hit = self._steps[key] = trace_engine(
                self.model, inputs, layout, self.precision,
                replace(self.options, checkpoint=checkpoint), self.unit_paths,
                self.tp_plan() if layout.tp > 1 else None, self.device, value, progress)
        return hit

    # -- memory of one rank ------------------------------------------------------------------------------
    def largest_unit(self) -> int:
        modules = dict(self.model.named_modules())
        return max((sum(p.numel() for p in modules[u].parameters()) for u in self.unit_paths), default=0)

    def memory(self, layout: Layout, step: Step, sizes: list[float] | None = None) -> _Memory:
        if not layout.traced:
            peak, st = zero_peak(step, layout, self.precision, self.zero_semantics, self.device,
                                 self.largest_unit(), sizes)
            return _Memory(peak, int(round(st.parameters)), int(round(st.gradients)),
                           int(round(st.optimizer_state)), int(round(st.cpu)), st)
        t = step.tally
        states = {"parameters": t.parameters_bytes, "gradients": t.gradients_bytes,
                  "optimizer_state": t.optimizer_state_bytes}
        drop = frozenset(states) if layout.offload else frozenset()  # FSDP2 CPUOffloadPolicy: on the host
        peak = step.peak(self.device, sizes, drop=drop)
        host = sum(states.values()) if layout.offload else 0
        return _Memory(peak, states["parameters"], states["gradients"], states["optimizer_state"], host)

    def reserve(self, peak: int, layout: Layout | None = None, step: Step | None = None) -> dict[str, int]:
        """What the GPU needs beyond the allocator's peak: the CUDA context (:data:`estimator.memory.CUDA_RESERVE`)
        and what the caching allocator needs beyond its allocated peak: simulated on ``step``'s trace when the
        layout is traced for this device (:func:`estimator.memory.allocator_need`), else the first guess
        :data:`estimator.memory.FRAGMENTATION` of the peak (interpolated sizes, ZeRO laid out by hand)."""
        out = dict(CUDA_RESERVE)
        prof = step.profile if step is not None and layout is not None and layout.traced else None
        if prof is not None and prof.device == self.device == "cuda" and "fragmentation" in prof.reserve:
            out["fragmentation"] = step.fragmentation()
        else:
            out["fragmentation"] = int(FRAGMENTATION * peak)
        return out

    def needed(self, peak: int, layout: Layout | None = None, step: Step | None = None) -> int:
        """The card's bytes a step of this allocator ``peak`` needs: the peak and :meth:`reserve`."""
        return peak + sum(self.reserve(peak, layout, step).values())

    # -- searches -----------------------------------------------------------------------------------------
    def solve(self, what: str, layout: Layout, checkpoint: tuple[type, ...], gpu: GPU, confirm: bool = True,
              given: bool = True) -> Solve:
        """Largest micro-batch (``what="batch"``) or sequence length that fits one GPU of ``layout``.  Under
        context parallelism a sequence is searched in steps of ``2 x cp`` (the load-balanced chunks).
        ``given``: the step at the given size is traced anyway (a plan's own); without it, a micro-batch of one
        is searched from 2 and 4 at once (see below)."""
        unit = 2 * layout.cp if what == "seq" and layout.cp > 1 else 1
        base = self.base(what) // unit
        if what == "batch":
            points = [base, 2 * base] if given or base > 1 else [2, 4]
        else:  # at and below the given length: a model may reject longer sequences
            points = [base // 4, base // 2, base] if base >= 4 else [base, 2 * base, 3 * base]
        steps = [self.traced(layout, checkpoint, what, v * unit) for v in points]

        def traced(v: int) -> tuple[bool, int, int]:
            st = self.traced(layout, checkpoint, what, v * unit)
            pk = max(self.memory(layout, st).peak.total, st.first_step_peak(self.device, layout))
            need = self.needed(pk, layout, st)
            return need <= gpu.capacity, pk, need

        if what == "batch" and points == [1, 2] and steps[0].structure() != steps[1].structure() and traced(2)[0]:
            # a micro-batch of one takes views where larger ones copy (a slice of the logits reshaped for the
            # loss), so its op sequence is its own: the sizes are interpolated from 2 and 4
            points = [2, 4]
            steps = [steps[1], self.traced(layout, checkpoint, what, 4)]

        interpolated = recalibrate = None
        if all(s.structure() == steps[0].structure() for s in steps[1:]):
            per = [list(s.cap.storage_bytes) for s in steps]
            moved = [0]  # bytes a trace needed beyond the interpolation (the allocator's reserve at that size)

            def guess(v: int) -> int:
                return self.needed(self.memory(layout, steps[0], lagrange(points, per, v)).peak.total)

            def interpolated(v: int) -> bool:
                return guess(v) + moved[0] <= gpu.capacity

            def recalibrate(v: int, need: int) -> bool:
                before, moved[0] = moved[0], need - guess(v)
                return moved[0] != before

        exact, anchor = searched_allocator(self, layout, checkpoint, what, unit, steps, points) \
            if interpolated is not None else (None, None)
        limit = position_limit(self.model) if what == "seq" else None
        reproduced = None if exact is None else \
            (lambda v: exact.reproduces(self.traced(layout, checkpoint, what, v * unit), v))
        found = largest_fitting(what, base, interpolated, traced, points, confirm,
                                model_limit=limit and (limit[0] // unit, limit[1]),
                                real=any(s.cap.fallback_reason for s in steps), recalibrate=recalibrate,
                                capacity=gpu.capacity, exact=exact, anchor=anchor, reproduced=reproduced,
                                peak_at=exact.peak if exact is not None else None)
        return found if unit == 1 else in_chunks(found, unit, limit)

    def suggestions(self, layout: Layout, checkpoint: tuple[type, ...], gpu: GPU,
                    timed: Any = None) -> list[Suggestion]:
        """The smallest layouts that fit when ``layout`` does not: the fewest GPUs for its strategy (fsdp
        for ddp, which shards nothing), and the same with activation checkpointing of the wrap class.
        ``timed(layout, step)``: (step time, time to train) of a suggestion (None: not timed)."""
        out: list[Suggestion] = []
        strategy = layout.strategy if layout.strategy != "ddp" else "fsdp"
        options = [checkpoint] + ([tuple(self.wrap)] if not checkpoint and self.wrap else [])
        for ckpt in options:
            lay = replace(layout, strategy=strategy, rank=0)
            counts = []
            for n in sorted({layout.gpus, *[2 ** k for k in range(1, 15)],
                             *[self.gpus_per_node * k for k in range(1, MAX_GPUS // self.gpus_per_node + 1)]}):
                if n < layout.gpus:
                    continue
                try:
                    check_layout(replace(lay, gpus=n), self.precision)
                except UserError:
                    continue
                counts.append(n)
            try:
                n = self._fewest_gpus(lay, ckpt, gpu, counts)
            except UserError:  # (a layout the model cannot take, FSDP2 over scalar parameters: no suggestion)
                n = None
            if n is not None:
                at = replace(lay, gpus=n)
                st = self.traced(at, ckpt)
                peak = self.memory(at, st).peak.total
                step_s, train_s = timed(at, st) if timed is not None else (None, None)
                out.append(Suggestion(strategy, n, lay.tp, [c.__name__ for c in ckpt], peak, self.needed(peak, at, st),
                                      step_s, train_s, lay.cp, lay.ep))
        out.sort(key=lambda s: (s.gpus, bool(s.checkpoint)))
        return out

    def _fewest_gpus(self, lay: Layout, ckpt: tuple[type, ...], gpu: GPU, counts: list[int]) -> int | None:
        """The fewest of ``counts`` GPUs on which ``lay`` fits.  ZeRO: its arithmetic at each count.  An
        engine: sharded sizes go as 1/N (up to padding), so every storage is interpolated in 1/N between
        the traces at the first and last count, and the answer confirmed by tracing it and the count below."""
        if not counts:
            return None

        def traced_fits(n: int) -> bool:
            at = replace(lay, gpus=n)
            st = self.traced(at, ckpt)
            return self.needed(self.memory(at, st).peak.total, at, st) <= gpu.capacity

        if not lay.traced or len(counts) < 3:
            return fewest_gpus(counts, traced_fits)
        # two points of the 1/N fit: the first count and about 8 times it (far enough apart, and not so
        # many ranks that FSDP2's padding to a multiple of them dominates)
        second = next((n for n in counts if n >= 8 * counts[0]), counts[-1])
        ends = [self.traced(replace(lay, gpus=n), ckpt) for n in (counts[0], second)]
        if ends[0].structure() != ends[-1].structure():
            return fewest_gpus(counts, traced_fits)
        xs = [1 / counts[0], 1 / second]
        per = [list(s.cap.storage_bytes) for s in ends]

        def interpolated_fits(n: int) -> bool:
            sizes = lagrange(xs, per, 1 / n)
            return self.needed(self.memory(replace(lay, gpus=n), ends[0], sizes).peak.total) <= gpu.capacity

        guess = fewest_gpus(counts, interpolated_fits)
        if guess is None:
            return None
        i = counts.index(guess)
        if traced_fits(guess) and (i == 0 or not traced_fits(counts[i - 1])):
            return guess
        return fewest_gpus(counts, traced_fits)  # the interpolation missed: bisect with traces

    @young_only_during
    @apart_from_caller_during
    def largest_batch(self, gpu: str | GPU | None = None, checkpoint: tuple[type, ...] = ()) -> Solve:
        """The largest micro-batch that fits one ``gpu`` (default: the planner's) as DDP on one GPU runs it: the
        search of :meth:`plan` alone (``estimate --gpu``'s question), without the plan's step time, FLOPs per
        token or suggestions, whose traces it would not use; ``checkpoint``: with those classes checkpointed."""
        target = self.gpu if gpu is None else (gpu if isinstance(gpu, GPU) else lookup(gpu))
        layout = Layout("ddp", 1, gpus_per_node=self.gpus_per_node)
        check_layout(layout, self.precision)
        return self.solve("batch", layout, tuple(checkpoint), target, given=False)

    # -- one plan ------------------------------------------------------------------------------------------
    @young_only_during
    @apart_from_caller_during
    def plan(self, strategy: str = "ddp", gpus: int = 1, *, tp: int = 1, sequence_parallel: bool = False,
             checkpoint: Any = None, offload: str | None = None, tokens: float | None = None,
             samples: float | None = None, steps: int | None = None, mfu: float | None = None,
             solve: Sequence[str] | str = ("batch",), reshard_after_forward: bool | None = None, rank: int = 0,
             confirm: bool = True, gpu: str | GPU | None = None, solve_unfit: bool = False,
             loss_parallel: bool = False, async_tp: bool = False, pp: int = 1, pp_schedule: str = "1f1b",
             microbatches: int = 0, gradient_as_bucket_view: bool = False,
             cp: int = 1, cp_rotate: str = "allgather", ep: int = 1, suggest: bool = True, etp: int = 1) -> Plan:
        """One plan (:func:`plan`).  The largest micro-batch, and the longest sequence when ``solve`` asks, are
        searched whether the given size fits or not (``solve_unfit``: no effect, kept for callers); a plan that does not fit
        suggests the smallest layouts that do, each with its step time and time to train (``suggest=False``:
        not searched, as a comparison's rows, whose table answers that question, do)."""
        target = self.gpu if gpu is None else (gpu if isinstance(gpu, GPU) else lookup(gpu))
        layout = Layout(strategy.lower(), gpus, tp, sequence_parallel, self.gpus_per_node, rank,
                        reshard_after_forward, offload, loss_parallel, pp, str(pp_schedule).lower(),
                        microbatches or 0, cp, str(cp_rotate).lower(), ep, async_tp, etp, gradient_as_bucket_view)
        check_layout(layout, self.precision)
        check_finetune(layout, *self.finetune)
        if async_tp and self.options.compile is None:
            raise UserError("--async-tp is torch.compile's micro-pipeline pass (torchtitan requires compile for it): "
                            "add --compile")
        if self.float8_all_gather and layout.strategy not in ("fsdp", "hsdp"):
            raise UserError(f"--float8-all-gather is FSDP2's all-gather in float8: use --strategy fsdp or hsdp, "
                            f"not {layout.strategy}")
        check_budget(tokens, samples, steps, mfu)
        self._check_model_takes(tp, cp)
        ckpt = resolve_classes(self.model, checkpoint, "--checkpoint")
        check_checkpoint_regions(self.model, self.options.compile, ckpt)
        if layout.pp > 1:  # every stage traced and composed with its schedule (estimator.plan.pipeline)
            from .pipeline import plan_pipeline

            asked = check_solve(solve, self.inputs)
            piped = plan_pipeline(self, layout, ckpt, target, dict(tokens=tokens, samples=samples, steps=steps, mfu=mfu),
                                  search="batch" in asked)
            if "seq" in asked:
                piped.notes.append("--solve seq: the longest sequence is not searched under --pp (each stage is traced "
                                   "at the given sequence)")
            return piped
        step = self.traced(layout, ckpt)
        mem = self.memory(layout, step)
        pk = mem.peak
        reserve = self.reserve(pk.total, layout, step)
        needed = max(pk.total, step.first_step_peak(self.device, layout)) + sum(reserve.values())
        fits = needed <= target.capacity
        notes = list(step.notes)
        batch_solve = seq_solve = None
        solve = check_solve(solve, self.inputs)
        if "batch" in solve:  # also when the given micro-batch does not fit: the largest that does
            batch_solve = self._searched("batch", layout, ckpt, target, confirm)
        if "seq" in solve:  # (when the given one does not fit too: a shorter sequence may)
            seq_solve = self._searched("seq", layout, ckpt, target, confirm)
        time = self._time(layout, step, target)
        base_step = self.traced(layout, ()) if ckpt else step
        model_flops, dtype = matmul_flops(base_step)
        peak_flops = target.matmul_peak(dtype)  # (a mode the GPU lacks: the time model's rate)
        mfu_est = model_flops / (time.step_time_s * peak_flops) if time.step_time_s > 0 else None
        training = self._training(layout, time, model_flops, peak_flops, tokens, samples, steps, mfu)
        flops = self._flops(model_flops, dtype, peak_flops, mfu_est)

        def timed(at: Layout, st: Step) -> tuple[float, float | None]:
            """A suggested layout's step time and the budget's time to train on it (the same micro-batch per GPU
            and tensor-parallel degree: the same model FLOPs per GPU)."""
            t = self._time(at, st, target)
            return t.step_time_s, self._training(at, t, model_flops, peak_flops, tokens, samples, steps,
                                                 mfu).time_to_train_s

        suggestions = [] if fits or not suggest else self.suggestions(layout, ckpt, target, timed)
        node = step.cap.nodes[pk.index] if pk.index >= 0 else None
        per_gpu = PerGpu(rows=dict(pk.by_row), peak=pk.total, peak_phase=node.meta.get("phase", "") if node else "start",
                         peak_module=node.meta.get("module", "") if node else "",
                         peak_op=str(node.target) if node else "", parameters=mem.parameters,
                         gradients=mem.gradients, optimizer_state=mem.optimizer_state,
                         saved_activations=step.tally.activations_bytes, host=mem.host)
        config = Config(
            model=self.model_name, gpu=target.name, gpus=gpus, strategy=layout.strategy, tp=tp,
            sequence_parallel=sequence_parallel, loss_parallel=loss_parallel, async_tp=async_tp, dp=layout.dp,
            shard_group=layout.shard * (layout.cp if layout.strategy != "ddp" else 1), rank=rank,
            precision=self.precision.name, optimizer=step.cap.optimizer_name, checkpoint=[c.__name__ for c in ckpt],
            offload=offload, wrap=[c.__name__ for c in self.wrap], micro_batch=self.batch,
            global_batch=self.batch * layout.dp * self.options.grad_accum if self.batch else None,
            seq=sequence_shown(self.inputs),
            engine=self._engine_text(layout), device=self.device, cp=layout.cp, ep=layout.ep, etp=layout.etp)
        notes += self._notes(layout, mem, step) + self.float8_notes + [n for n in [target.lacks(dtype)] if n]
        return Plan(config, per_gpu, Verdict(fits, target.capacity, reserve, needed, target.capacity - needed,
                                             suggestions), time, flops, training, batch_solve, seq_solve,
                    self._checkpoint_size(layout, step, mem), notes)

    # -- pieces of a plan -------------------------------------------------------------------------------------
    def _searched(self, what: str, layout: Layout, ckpt: tuple[type, ...], gpu: GPU, confirm: bool) -> Solve:
        """:meth:`solve`, or why not (a failed trace at a size never given had failed the whole plan)."""
        try:
            return self.solve(what, layout, ckpt, gpu, confirm)
        except UserError as exc:
            size = "micro-batch (dimension 0" if what == "batch" else "sequence length (dimension 1"
            return Solve(what, None, "not searched", [],
                         reason=f"not searched: the step at another {size} of the inputs resized) failed: {exc}")

    def _check_model_takes(self, tp: int, cp: int) -> None:
        """One-line errors for degrees the model cannot take: ``tp`` not dividing its attention heads, ``cp`` on
        inputs without a sequence."""
        if tp > 1:
            heads = model_heads(self.model)
            bad = sorted({h for h in heads.values() if h % tp})
            if bad:
                where = next(k for k, v in heads.items() if v == bad[0])
                raise UserError(f"--tp {tp} does not divide the {bad[0]} attention heads ({where}); "
                                f"use a divisor of {bad[0]}")
        if cp > 1 and sequence_shown(self.inputs) is None:
            raise UserError(f"--cp {cp} shards a sequence: the inputs have none (token ids (batch, seq) or frames "
                            f"(batch, time, features); images and feature vectors are not split by --cp): drop --cp")

    def _engine_text(self, layout: Layout) -> str:
        return engine_text(layout, self.precision, self.zero_semantics)

    def _notes(self, layout: Layout, mem: _Memory, step: Step | None = None) -> list[str]:
        notes = layout_notes(self, layout, step)
        if not layout.traced and self.options.zero_grad != "after_step":
            notes.append("--zero-grad before-backward does not apply to DeepSpeed, whose engine zeroes its gradients "
                         "inside its step(): this ZeRO layout frees them after the step")
        return notes

    def _time(self, layout: Layout, step: Step, gpu: GPU) -> StepTime:
        intra, host, inter = self.links(gpu)
        if layout.traced:
            t = traced_time(step, gpu, intra, inter, optimizer_on_gpu=layout.offload is None, async_tp=layout.async_tp)
            if layout.offload:  # sharded parameters in and gradients out over the host link, each step
                moved = 2 * step.tally.parameters_bytes + step.tally.gradients_bytes
                t = replace(t, offload_s=moved / host.bandwidth, step_time_s=t.step_time_s + moved / host.bandwidth)
            return t
        t = step.tally
        scale = 0.0 if layout.offload else 1.0 / layout.dp
        out = zero_time(step, gpu, int(layout.strategy[-1]), layout.dp, self.gpus_per_node, intra, inter,
                        float(t.parameters_bytes), float(t.gradients_bytes), scale, units=self.unit_paths)
        if layout.offload:  # this rank's gradient partition out, its updated parameter partition in
            moved = float(t.gradients_bytes) / layout.dp + float(t.parameters_bytes) / layout.dp
            out = replace(out, offload_s=moved / host.bandwidth, step_time_s=out.step_time_s + moved / host.bandwidth)
        return out

    def _training(self, layout: Layout, time: StepTime, model_flops: float, peak: float, tokens, samples, steps,
                  mfu) -> Training:
        tps = tokens_per_sample(self.inputs)
        samples_per_step = (self.batch or 0) * layout.dp * self.options.grad_accum  # micro-batches accumulated
        tokens_per_step = samples_per_step * tps if tps else None
        n_steps = None
        if steps is not None:
            n_steps = int(steps)
        elif tokens is not None:
            if not tokens_per_step:
                raise UserError("--tokens needs integer token inputs of shape (batch, seq); use --samples or --steps")
            n_steps = math.ceil(tokens / tokens_per_step)
        elif samples is not None:
            n_steps = math.ceil(samples / samples_per_step)
        per_step = model_flops / (mfu * peak) if mfu else time.step_time_s
        likely = None if (mfu or n_steps is None) else tuple(n_steps * t for t in time.likely_s)
        return Training(n_steps, samples_per_step, tokens_per_step,
                        n_steps * per_step if n_steps is not None else None, mfu, likely)

    def reference(self) -> Step:
        """The single-device step the model's own figures are read from (its FLOPs per token, parameters, blocks):
        the eager one, which the tensor-parallel plan reads too (torch.compile changes kernels and saves, not the
        matmuls or parameters: a compiled plan need not trace it compiled, a third of a 70B TP plan's time)."""
        return self.single(eager=True)

    def _flops(self, model_flops: float, dtype: str, peak: float, mfu: float | None) -> Flops:
        base = self.reference()
        tps = tokens_per_sample(self.inputs)
        n_mm = matmul_params(base, (self.batch or 1) * tps if tps else None)
        attn = attention_term(base)
        traced_per_token = six = None
        if attn is not None and tps:
            traced_per_token = matmul_flops(base, per_step=False)[0] / ((self.batch or 1) * tps)
            six = 6 * n_mm + attn
        return Flops(model_flops, dtype, peak, mfu, n_mm, traced_per_token, six, attn)

    def _checkpoint_size(self, layout: Layout, step: Step, mem: _Memory) -> dict[str, int]:
        base = self.reference().tally
        full = base.parameters_bytes + base.buffers_bytes + base.optimizer_state_bytes
        if layout.traced:
            per_rank = step.tally.parameters_bytes + step.tally.buffers_bytes + step.tally.optimizer_state_bytes
        else:
            per_rank = mem.parameters + base.buffers_bytes + mem.optimizer_state
        return {"full": int(full), "per_rank": int(per_rank)}

    # -- many plans ------------------------------------------------------------------------------------------
    @young_only_during
    @apart_from_caller_during
    def compare(self, gpus: int | Sequence[int], **kwargs: Any) -> Comparison:
        """Plans side by side (:func:`.comparison.compare_layouts`): every GPU type x GPU count x strategy,
        without and with activation checkpointing, each row in its engine's precision policy."""
        from .comparison import compare_layouts

        return compare_layouts(self, gpus, **kwargs)

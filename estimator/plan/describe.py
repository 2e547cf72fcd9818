"""What a plan says about its layout: the engines traced (the report's title line) and the layout's notes."""

from __future__ import annotations

from typing import Any

from ..optim import elementwise
from ..render import fmt_bytes
from .layout import Layout, PlanPrecision


def engine_text(layout: Layout, precision: PlanPrecision, zero_semantics: str) -> str:
    """The engines a plan traced (or the hand layout), for the report's title line."""
    if not layout.traced:
        return f"ZeRO-{layout.strategy[-1]} laid out by hand, {zero_semantics} semantics"
    parts = {"ddp": "DistributedDataParallel", "fsdp": "FSDP2 fully_shard",
             "hsdp": "FSDP2 fully_shard on a 2-D mesh (HSDP)"}[layout.strategy]
    if precision.fsdp_policy:
        parts += f" (MixedPrecisionPolicy param {str(precision.param_dtype).removeprefix('torch.')}" \
                 f", reduce {str(precision.reduce_dtype or precision.param_dtype).removeprefix('torch.')})"
    if layout.tp > 1:
        extras = [w for w, on in (("sequence parallel", layout.sequence_parallel),
                                   ("loss parallel", layout.loss_parallel), ("async TP", layout.async_tp)) if on]
        parts += " + parallelize_module" + (f" ({', '.join(extras)})" if extras else "")
    if layout.cp > 1:
        parts += f" + context_parallel over {layout.cp} ranks (ring attention)"
    if layout.ep > 1:
        parts += f" + expert parallel over {layout.ep} ranks (all-to-all dispatch)"
    return f"traced: {parts} on a fake process group of {layout.gpus} ranks"


def _reduces_over_tensors(spec: Any) -> bool:
    """Whether the optimizer ``spec`` is one whose step is not element-wise (Muon, Adafactor, a subclass)."""
    if spec is None or (isinstance(spec, str) and spec.partition(":")[0].strip().lower() == "none"):
        return False
    return not elementwise(spec)


def _optimizer_name(spec: Any) -> str:
    if isinstance(spec, str):
        return spec.partition(":")[0]
    if isinstance(spec, (list, tuple)):
        return " + ".join(type(o).__name__ for o in spec)
    return spec.__name__ if isinstance(spec, type) else type(spec).__name__


def layout_notes(planner: Any, layout: Layout, step: Any = None) -> list[str]:
    """What the layout adds to a plan's notes (its mesh, tensor parallelism, ZeRO's semantics, offload)."""
    precision, zero_semantics = planner.precision, planner.zero_semantics
    notes = []
    first = step.first_step_peak(planner.device, layout) if step is not None else 0
    if step is not None and first > planner.memory(layout, step).peak.total:
        notes.append(f"the first step peaks higher ({fmt_bytes(first)}, its optimizer making its state inside step()) "
                     f"than the steady state shown: the fit is checked at it")
    accum = planner.options.grad_accum
    if accum > 1 and layout.traced and layout.pp == 1:
        notes.append(f"gradient accumulation over {accum} micro-batches, the gradients synced " + (
            "after every one (--grad-sync every)" if getattr(planner, "grad_sync", "last") == "every" else
            "on the last only (DDP's no_sync, FSDP2's set_requires_gradient_sync; --grad-sync every: after each)"))
    if layout.strategy == "hsdp":
        notes.append(f"hsdp: sharded over {layout.shard} GPUs per node, replicated {layout.replicate} times")
    if layout.tp > 1:
        plan = planner.tp_plan()
        notes.append(f"tensor parallelism: {len(plan.colwise)} colwise and {len(plan.rowwise)} rowwise Linear "
                     f"layers (Megatron pairs found in the traced dataflow), embedding "
                     f"{plan.embedding or 'replicated'}, head {plan.head or 'replicated'}")
        notes.extend(plan.notes)
        if layout.async_tp:
            notes.append("async TP: each all-gather of sequence parallelism pipelined with the matmuls that read it, "
                         "each reduce-scatter with the matmul that makes its input, one chunk per tensor-parallel "
                         "rank (torch.compile's micro-pipeline pass, torch's symmetric-memory kernels); memory as "
                         "without it, the symmetric-memory workspace (one shard) outside the caching allocator and "
                         "not counted")
        if layout.loss_parallel:
            notes.append("loss parallel: the logits stay sharded by vocabulary and the cross-entropy runs under "
                         "torch's loss_parallel() (all-reduces of the row maxima, sums and target logits)"
                         if plan.head else "--loss-parallel: the head is replicated (its weight is tied to the "
                         "embedding), so the loss is computed on full logits as without it")
    if layout.strategy in ("fsdp", "hsdp") and precision.step.autocast is not None and not precision.fsdp_policy:
        low = str(precision.step.autocast).removeprefix("torch.").replace("bfloat16", "bf16").replace("float16", "fp16")
        notes.append(f"{layout.strategy} under torch.autocast ({precision.name}): fp32 parameters gathered and cast "
                     f"to {low} per op; --precision fsdp-{low} is FSDP2's MixedPrecisionPolicy (torchtitan's, and "
                     f"--compare's fsdp rows), which gathers {low} parameters and needs less")
    if not layout.traced:
        notes.append(f"{layout.strategy}: PyTorch has no ZeRO engine; {zero_semantics} semantics "
                     f"(--zero-semantics deepspeed|paper; see estimator/plan/zero.py)")
        if _reduces_over_tensors(planner.options.optimizer):
            notes.append(f"{layout.strategy}: the optimizer's step and state divided over the ranks as an "
                         f"element-wise step on a flat partition; {_optimizer_name(planner.options.optimizer)} "
                         f"reduces over whole matrices, which DeepSpeed's flat partitions split: how DeepSpeed "
                         f"runs it (and its cost) is not modelled")
        if precision.master:
            notes.append(f"{layout.strategy} with {precision.name}: the model cast to "
                         f"{str(precision.low).removeprefix('torch.')} with fp32 master weights, as "
                         f"DeepSpeed's bf16/fp16 modes run it")
    if layout.offload:
        if layout.traced:
            notes.append("offload: FSDP2's CPUOffloadPolicy: sharded parameters, gradients and optimizer state "
                         "in host memory, the optimizer step on the CPU (its time is not modelled)")
        else:
            notes.append(f"offload {layout.offload}: DeepSpeed's ZeRO-Offload; the optimizer step runs on the "
                         f"CPU (its time is not modelled)")
    if planner.device == "cpu":
        notes.append("device cpu: exact bytes, no CUDA allocator rounding")
    unused = sum(r["count"] for r in step.tally.no_gradient) if step is not None else 0
    if layout.strategy == "ddp" and layout.gpus > 1 and unused:  # (DDP checks every parameter got its gradient)
        notes.append(f"ddp: {unused:,} trainable parameters get no gradient in this step, and a real "
                     f"DistributedDataParallel raises at the next iteration (\"Expected to have finished reduction in "
                     f"the prior iteration\") unless built with find_unused_parameters=True, whose traversal of the "
                     f"graph each step is not modelled; or freeze them")
    return notes


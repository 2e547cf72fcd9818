"""Strategies, layouts and precision policies: what one plan asks for, and which combinations exist.

A :class:`Layout` is a data-parallel strategy over ``gpus`` GPUs, optionally with tensor
parallelism inside a node, context parallelism and pipeline stages.  The GPUs form a mesh (outer
to inner dimension, torchtitan's order):

* ``ddp`` / ``fsdp`` / ``zero1-3``: ``(dp, cp, tp)``, ``dp = gpus / (tp x cp x pp)``;
* ``hsdp``: ``(replicate, shard, cp, tp)``, sharded within a node (``gpus_per_node / (tp x cp)``
  ranks) and replicated across nodes (PyTorch's HSDP: ``fully_shard`` on a 2-D data-parallel mesh).

Under context parallelism the ranks of a ``cp`` group hold one sequence between them, so FSDP2
shards the parameters over ``dp x cp`` ranks (torchtitan's ``dp_shard_cp`` mesh) and DDP
averages the gradients over them.  Expert parallelism (``ep``) borrows its ranks from those sharded
ranks and every cp and tp rank (torchtitan's ``ParallelDims`` with ``etp = 1``): the experts' region is a mesh
of its own, ``(replicate, efsdp, ep)`` (:mod:`estimator.plan.expert`).

``ddp``, ``fsdp`` and ``hsdp`` (and ``tp``) are traced on PyTorch's own engines
(:mod:`estimator.plan.engine`); ZeRO stages 1-3 have no engine in PyTorch and are laid out by
hand (:mod:`estimator.plan.zero`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..errors import UserError
from ..precision import Precision, parse_precision

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "hsdp")
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zbv")  # pipeline schedules planned (plan.pipeline_schedule)
CP_ROTATES = ("allgather", "alltoall")  # the ring's key/value exchanges (torchtitan's context_parallel_rotate_method)
ENGINE_STRATEGIES = frozenset({"ddp", "fsdp", "hsdp"})  # traced on torch's engines
ZERO_STRATEGIES = frozenset({"zero1", "zero2", "zero3"})  # laid out by hand (DeepSpeed or paper)
SHARDED_PARAMS = frozenset({"zero3", "fsdp", "hsdp"})
OFFLOADS = ("optimizer", "params")
ZERO_SEMANTICS = ("deepspeed", "paper")
PRECISIONS = ("fp32", "bf16", "fp16", "bf16-mixed", "fp16-mixed", "fsdp-bf16", "fsdp-fp16")
DEFAULT_PRECISION = "bf16-mixed"
_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
           "fp16": torch.float16, "float16": torch.float16}


@dataclass(frozen=True)
class Layout:
    """One strategy on a mesh of GPUs, and the rank whose memory is planned."""

    strategy: str
    gpus: int
    tp: int = 1
    sequence_parallel: bool = False
    gpus_per_node: int = 8
    rank: int = 0  # global rank traced (0 holds the most real rows of every unevenly split dimension)
    # None: torchtitan's "default" policy, True unless pp > 1; an int: FSDP2 reshards to groups of that many ranks
    reshard_after_forward: bool | int | None = None
    offload: str | None = None
    loss_parallel: bool = False  # the head's logits kept vocabulary-sharded, the loss under loss_parallel()
    pp: int = 1  # pipeline stages (estimator.plan.pipeline); the data-parallel ranks are gpus / (tp x cp x pp)
    pp_schedule: str = "1f1b"
    microbatches: int = 0  # micro-batches per step under pipeline parallelism (0: one per sample)
    cp: int = 1  # context-parallel ranks sharing each sequence (estimator.plan.context)
    cp_rotate: str = "allgather"  # the ring's key/value exchange (torchtitan's context_parallel_rotate_method)
    ep: int = 1  # ranks sharing a layer's experts (estimator.plan.expert), borrowed from the sharded ranks x cp
    async_tp: bool = False  # torch.compile's micro-pipelined TP: sequence parallelism's collectives inside the matmuls
    etp: int = 1  # experts' tensor-parallel degree (torchtitan's expert_tensor_parallel_degree): 1 or tp
    gradient_as_bucket_view: bool = False  # DDP option: the gradients are views into its all-reduce buckets

    @property
    def reshards_after_forward(self) -> bool | int:
        """FSDP2's ``reshard_after_forward``: as asked, else torchtitan's default (``fsdp_reshard_after_forward =
        "default"``: not under pipeline parallelism, where each micro-batch would gather the stage again)."""
        return self.pp == 1 if self.reshard_after_forward is None else self.reshard_after_forward

    @property
    def dp(self) -> int:
        """Data-parallel ranks: groups of ``tp x cp x pp`` GPUs that each see their own samples."""
        return self.gpus // (self.tp * self.pp * self.cp)

    @property
    def shard(self) -> int:
        """Data-parallel ranks a parameter is sharded over (1: replicated); FSDP2 shards over ``shard x cp``."""
        if self.strategy == "ddp":
            return 1
        if self.strategy == "hsdp":
            return max(1, min(self.dp, self.gpus_per_node // (self.tp * self.cp)))
        return self.dp

    @property
    def grad_group(self) -> int:
        """Ranks whose gradients are averaged: the data-parallel ranks and, under context parallelism, the
        ranks that share their sequences."""
        return self.dp * self.cp

    @property
    def replicate(self) -> int:
        return self.dp // self.shard

    @property
    def efsdp(self) -> int:
        """Ranks an experts module is sharded over by FSDP2 under expert parallelism (torchtitan's ``efsdp``):
        the sharded ranks x cp x tp that hold the same experts (ep borrows every tp rank: ``etp = 1``; with
        ``etp = tp`` the experts are split over tp instead, and ep borrows the sharded ranks x cp only)."""
        return self.shard * self.cp * (self.tp // self.etp) // self.ep

    @property
    def traced(self) -> bool:
        """Traced on a PyTorch engine (else laid out by hand: ZeRO)."""
        return self.strategy in ENGINE_STRATEGIES

    @property
    def mesh(self) -> tuple[tuple[str, int], ...]:
        """(dimension name, size) of the device mesh, outer first; size-1 dimensions left out."""
        if self.strategy == "hsdp":
            dims = (("replicate", self.replicate), ("shard", self.shard), ("cp", self.cp), ("tp", self.tp))
        else:
            dims = (("dp", self.dp), ("cp", self.cp), ("tp", self.tp))
        return tuple((n, s) for n, s in dims if s > 1) or (("dp", 1),)

    def describe(self) -> str:
        text = self.strategy
        if self.tp > 1:
            extras = [w for w, on in (("sequence parallel", self.sequence_parallel),
                                       ("loss parallel", self.loss_parallel), ("async", self.async_tp)) if on]
            text += f" x tp {self.tp}" + (f" ({', '.join(extras)})" if extras else "")
        if self.cp > 1:
            text += f" x cp {self.cp}"
        if self.ep > 1:
            text += f" x ep {self.ep}" + (f" (etp {self.etp})" if self.etp > 1 else "")
        if self.pp > 1:
            text += f" x pp {self.pp} ({self.pp_schedule})"
        return text


@dataclass(frozen=True)
class PlanPrecision:
    """A precision policy of the plan: the step's (autocast or a model cast) and, for FSDP2, its
    ``MixedPrecisionPolicy`` (``torch/distributed/fsdp/_fully_shard/_fsdp_api.py``)."""

    name: str
    step: Precision  # how the capture runs the step (autocast, model cast or neither)
    param_dtype: torch.dtype | None = None  # MixedPrecisionPolicy.param_dtype (None: no policy)
    reduce_dtype: torch.dtype | None = None  # MixedPrecisionPolicy.reduce_dtype (None: the param dtype)

    @property
    def fsdp_policy(self) -> bool:
        return self.param_dtype is not None

    @property
    def low(self) -> torch.dtype | None:
        """The low-precision dtype of a mixed policy (autocast's or the policy's param dtype)."""
        return self.param_dtype or self.step.autocast

    @property
    def master(self) -> bool:
        """fp32 master weights beside low-precision compute (a *-mixed or FSDP policy)."""
        return self.low is not None


def parse_plan_precision(name: str | PlanPrecision | None, reduce_dtype: str | torch.dtype | None = None
                         ) -> PlanPrecision:
    """``fp32``, ``bf16``/``fp16`` (model cast), ``bf16-mixed``/``fp16-mixed`` (autocast, fp32
    master weights), ``fsdp-bf16``/``fsdp-fp16`` (FSDP2 ``MixedPrecisionPolicy(param_dtype=...)``:
    parameters all-gathered and activations computed in that dtype, gradients reduced in
    ``reduce_dtype``, by default the same)."""
    if isinstance(name, PlanPrecision):
        return name
    key = (name or DEFAULT_PRECISION).strip().lower()
    reduce = _dtype(reduce_dtype, "--reduce-dtype") if reduce_dtype is not None else None
    if key.startswith("fsdp-"):
        low = _DTYPES.get(key.removeprefix("fsdp-"))
        if low is None or low is torch.float32:
            raise UserError(f"unknown precision {name!r}; choose one of {', '.join(PRECISIONS)}")
        return PlanPrecision(key, parse_precision("fp32"), param_dtype=low, reduce_dtype=reduce)
    if key not in PRECISIONS:
        raise UserError(f"unknown precision {name!r}; choose one of {', '.join(PRECISIONS)}")
    if reduce is not None:
        raise UserError(f"--reduce-dtype sets FSDP2's MixedPrecisionPolicy: use it with --precision fsdp-bf16 "
                        f"or fsdp-fp16, not {key}")
    return PlanPrecision(key, parse_precision(key))


def _dtype(value: str | torch.dtype, option: str) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    found = _DTYPES.get(str(value).strip().lower())
    if found is None:
        raise UserError(f"{option} must be fp32, bf16 or fp16, not {value!r}")
    return found


def check_layout(layout: Layout, precision: PlanPrecision) -> None:
    """Impossible combinations: one line saying what to change (UserError)."""
    s, gpus, tp = layout.strategy, layout.gpus, layout.tp
    for flag, value in (("--gpus", gpus), ("--tp", tp), ("--pp", layout.pp), ("--cp", layout.cp), ("--ep", layout.ep),
                        ("--etp", layout.etp), ("--microbatches", layout.microbatches),
                        ("--gpus-per-node", layout.gpus_per_node), ("rank", layout.rank)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{flag} takes a whole number, not {value!r} ({type(value).__name__})")
    if s not in STRATEGIES:
        raise UserError(f"unknown strategy {s!r}; choose one of {', '.join(STRATEGIES)}")
    if layout.gradient_as_bucket_view and layout.strategy != "ddp":
        raise UserError("--gradient-as-bucket-view is DistributedDataParallel's option: use --strategy ddp")
    raf = layout.reshard_after_forward
    if raf is not None and not isinstance(raf, bool) and (not isinstance(raf, int) or raf < 1):
        raise UserError(f"reshard_after_forward takes True, False or a number of ranks >= 1 (FSDP2's), not {raf!r}")
    if gpus < 1:
        raise UserError(f"--gpus must be >= 1, not {gpus}")
    if tp < 1:
        raise UserError(f"--tp must be >= 1, not {tp}")
    if layout.gpus_per_node < 1:
        raise UserError(f"--gpus-per-node must be >= 1, not {layout.gpus_per_node}")
    if gpus % tp:
        raise UserError(f"--tp {tp} does not divide --gpus {gpus}: the GPUs form dp x tp groups; "
                        f"use a multiple of {tp} GPUs")
    if layout.pp < 1:
        raise UserError(f"--pp must be >= 1, not {layout.pp}")
    if layout.cp < 1:
        raise UserError(f"--cp must be >= 1, not {layout.cp}")
    if layout.cp > 1:
        if layout.cp_rotate not in CP_ROTATES:
            raise UserError(f"--cp-rotate must be one of {', '.join(CP_ROTATES)}, not {layout.cp_rotate!r}")
        if gpus % (tp * layout.pp * layout.cp):
            raise UserError(f"--cp {layout.cp} x --tp {tp}{f' x --pp {layout.pp}' if layout.pp > 1 else ''} does not "
                            f"divide --gpus {gpus}: use a multiple of {tp * layout.pp * layout.cp} GPUs")
        if s not in ENGINE_STRATEGIES:
            raise UserError(f"--cp runs torch's context_parallel on the traced engines: use --strategy ddp, fsdp or "
                            f"hsdp, not {s}")
    if layout.ep != 1:
        _check_ep(layout)
    elif layout.etp != 1:
        raise UserError("--etp splits the experts of expert parallelism over the tp ranks: add --ep, or use --etp 1")
    if layout.pp > 1:
        if gpus % (tp * layout.pp):
            raise UserError(f"--pp {layout.pp} x --tp {tp} does not divide --gpus {gpus}: the GPUs form "
                            f"pp x dp x tp groups; use a multiple of {tp * layout.pp} GPUs")
        if layout.pp_schedule not in PP_SCHEDULES:
            raise UserError(f"--pp-schedule must be one of {', '.join(PP_SCHEDULES)}, not {layout.pp_schedule!r}")
        if layout.microbatches < 0:
            raise UserError(f"--microbatches must be >= 1, not {layout.microbatches}")
        if s not in ENGINE_STRATEGIES:
            raise UserError(f"--pp traces each stage on PyTorch's engines: use --strategy ddp, fsdp or hsdp, not {s}")

    if tp > layout.gpus_per_node:
        raise UserError(f"--tp {tp} spans more than one node of {layout.gpus_per_node} GPUs; "
                        f"keep tensor parallelism inside a node (--tp <= {layout.gpus_per_node})")
    if layout.sequence_parallel and tp == 1:
        raise UserError("--sequence-parallel needs tensor parallelism: add --tp 2 (or more)")
    if layout.async_tp and not layout.sequence_parallel:
        raise UserError("--async-tp overlaps sequence parallelism's all-gathers and reduce-scatters with their matmuls "
                        "(torch's micro-pipeline pass): add --tp 2 (or more) and --sequence-parallel")
    if layout.loss_parallel and tp == 1:
        raise UserError("--loss-parallel shards the head's logits over the tensor-parallel ranks: add --tp 2 (or more)")
    if s != "ddp" and layout.dp * layout.cp < 2:
        raise UserError(f"{s} with {layout.dp} data-parallel GPU{'s' if layout.dp != 1 else ''} shards nothing: "
                        f"use --strategy ddp, or at least {2 * tp} GPUs")
    if s == "hsdp" and layout.dp <= max(1, layout.gpus_per_node // (tp * layout.cp)):
        raise UserError(f"hsdp shards within a node and replicates across nodes: with {layout.dp} data-parallel "
                        f"GPUs and {layout.gpus_per_node} per node it is fsdp; use --strategy fsdp or more GPUs")
    if s in ZERO_STRATEGIES and tp > 1:
        raise UserError(f"{s} is laid out by hand for tp 1 only (PyTorch has no ZeRO engine to trace with "
                        f"tensor parallelism); use --strategy fsdp or hsdp with --tp {tp}")
    if layout.offload not in (None, *OFFLOADS):
        raise UserError(f"--offload must be one of {', '.join(OFFLOADS)}, not {layout.offload!r}")
    if layout.offload == "optimizer" and s == "ddp":
        raise UserError("--offload optimizer needs a sharded optimizer: use zero1, zero2, zero3, fsdp or hsdp")
    if layout.offload == "params" and s not in SHARDED_PARAMS:
        raise UserError("--offload params needs sharded parameters: use zero3, fsdp or hsdp")
    if precision.fsdp_policy and s not in ("fsdp", "hsdp"):
        raise UserError(f"--precision {precision.name} is FSDP2's MixedPrecisionPolicy: use --strategy fsdp or "
                        f"hsdp, or --precision {precision.name.removeprefix('fsdp-')}-mixed (autocast)")
    _check_rank(layout)


def _check_rank(layout: Layout) -> None:
    """The rank planned: one of the layout's GPUs; under --pp one of a stage's group (the plan composes every
    stage, its fake process group that group's size)."""
    gpus = layout.gpus
    if layout.pp > 1 and layout.rank >= gpus // layout.pp:
        raise UserError(f"--rank under --pp {layout.pp} picks a rank of one stage's {gpus // layout.pp} GPUs (the "
                        f"plan reports every stage, the busiest first): use 0 to {gpus // layout.pp - 1}")
    if layout.rank < 0 or layout.rank >= gpus:
        raise UserError(f"rank must be in [0, {gpus}), not {layout.rank}")


def _check_ep(layout: Layout) -> None:
    """Expert parallelism as torchtitan composes it (``ParallelDims``): ep borrows every cp rank, some of the sharded
    data-parallel ranks (of each pipeline stage) and, under ``etp = 1``, every tp rank; under ``etp = tp`` the experts
    are split over the tp ranks instead; planned with FSDP2 or HSDP."""
    ep = layout.ep
    if ep < 1:
        raise UserError(f"--ep must be >= 1, not {ep}")
    if layout.strategy not in ("fsdp", "hsdp"):
        raise UserError(f"--ep shards the experts as torchtitan does, with FSDP2 over the ranks that hold the same "
                        f"experts: use --strategy fsdp or hsdp, not {layout.strategy}")
    if layout.etp not in (1, layout.tp):
        raise UserError(f"--etp must be 1 (ep borrows the tp ranks) or --tp {layout.tp} (the experts split over the "
                        f"tp ranks, torchtitan's ExpertTensorParallel), not {layout.etp}")
    tp = layout.tp // layout.etp  # the tp ranks ep borrows: all of them under etp 1, none under etp = tp
    inner = layout.cp * tp
    ranks = layout.shard * inner
    if ranks % ep or ep % inner:
        borrowed = " x ".join(["sharded data-parallel"] + ["cp"] * (layout.cp > 1) + ["tp"] * (tp > 1))
        multiple = " x ".join([f"--cp {layout.cp}"] * (layout.cp > 1) + [f"--tp {tp}"] * (tp > 1))
        raise UserError(f"--ep {ep} borrows from the {ranks} {borrowed} ranks (torchtitan's ParallelDims, etp "
                        f"{layout.etp}): "
                        f"use an ep that divides {ranks}" + (f" and is a multiple of {multiple}" if inner > 1 else ""))


def check_finetune(layout: Layout, lora: bool, quantized: bool) -> None:
    """Fine-tuning layouts the plan models: LoRA under DDP, FSDP2 and HSDP (FSDP2 shards frozen and trainable
    parameters alike), QLoRA's 4-bit base under DDP (bitsandbytes' packed weights shard under FSDP only when
    stored in bf16, ``bnb_4bit_quant_storage``: not modelled); no tensor, pipeline, context or expert
    parallelism of the adapters."""
    if not lora:
        return
    if quantized and layout.strategy != "ddp":
        raise UserError(f"--quantize int4 with --lora (QLoRA) is planned under --strategy ddp: bitsandbytes' 4-bit "
                        f"weights shard under FSDP only stored as bf16, which is not modelled (not {layout.strategy})")
    if layout.strategy not in ENGINE_STRATEGIES:
        raise UserError(f"--lora is planned on PyTorch's engines: use --strategy ddp, fsdp or hsdp, "
                        f"not {layout.strategy}")
    if max(layout.tp, layout.pp, layout.cp, layout.ep) > 1:
        raise UserError("--lora is planned with data parallelism only (DDP, FSDP2, HSDP): drop --tp, --pp, --cp "
                        "and --ep")


def check_tied_units(model: torch.nn.Module, unit_paths: list[str], wrap: Any) -> None:
    """A one-line error when ``--wrap``'s units split a tied parameter between two FSDP groups (GPT's output head
    wrapped alone, its weight the embedding's): FSDP2's ``fully_shard`` refuses a parameter managed by two."""
    units = sorted(unit_paths, key=len, reverse=True)
    groups: dict[int, dict[str, str]] = {}  # id(parameter) -> {its group (a unit path, "" the root): its name}
    for path, module in model.named_modules(remove_duplicate=False):
        unit = next((u for u in units if path == u or path.startswith(u + ".")), "")
        for local, param in module.named_parameters(recurse=False, remove_duplicate=False):
            groups.setdefault(id(param), {}).setdefault(unit, f"{path}.{local}" if path else local)
    split = next((names for names in groups.values() if len(names) > 1), None)
    if split is not None:
        names = sorted(split.values())
        raise UserError(f"--wrap {' '.join(getattr(w, '__name__', str(w)) for w in _listed(wrap))} puts the tied "
                        f"parameters {' and '.join(names)} in two FSDP groups, which fully_shard refuses: wrap a "
                        "class that holds both, or leave --wrap to its default")


def _listed(wrap: Any) -> list:
    return list(wrap) if isinstance(wrap, (list, tuple)) else [wrap]

"""Layouts side by side (``estimator plan --compare``, several ``--gpus`` or ``--gpu``): every GPU type x GPU
count x strategy, without and with activation checkpointing, compared like with like.

Like with like: a 16-bit mixed precision is each engine's own way of computing in that dtype with fp32 master
weights and optimizer state (:func:`comparison_precision`), so that no row carries a cost another strategy would
not have under the same numerics (FSDP2 under autocast keeps a 16-bit copy of every weight it casts, which
``MixedPrecisionPolicy`` does not); the comparison states it.  Which answers it gives (the fewest GPUs that
fit, the fastest, the cheapest in GPU-hours): :class:`.results.ComparisonData`.
"""

from __future__ import annotations

import copy
import itertools
import time
from dataclasses import replace
from typing import Any, Iterable, Sequence

from ..capture.checkpoint import resolve_classes
from ..collect import settle
from ..errors import UserError
from ..hardware import GPU
from .layout import STRATEGIES, PlanPrecision, parse_plan_precision
from .report import Comparison, Plan
from .results import model_parallel_text

_LOW = {"bf16-mixed": "bf16", "fsdp-bf16": "bf16", "fp16-mixed": "fp16", "fsdp-fp16": "fp16"}

SEMANTICS = ("every row computes in {low} with fp32 master weights and optimizer state, as its engine does: DDP "
             "under autocast, FSDP2/HSDP with MixedPrecisionPolicy(param_dtype={low}, reduce_dtype=fp32) as "
             "torchtitan, ZeRO in DeepSpeed's {low} mode")


def comparison_precision(precision: PlanPrecision, strategy: str) -> str:
    """The precision of ``strategy``'s rows when a comparison asks for ``precision``: DDP under autocast (its
    only mixed precision), FSDP2 and HSDP with ``MixedPrecisionPolicy(param_dtype=16-bit, reduce_dtype=fp32)``
    (torchtitan's defaults: parameters gathered in 16 bits, no autocast cache of 16-bit weight copies), ZeRO
    in DeepSpeed's bf16/fp16 mode (the model cast, fp32 master weights in the optimizer).  fp32 and pure
    16-bit precisions are left as asked."""
    low = _LOW.get(precision.name)
    if low is None:
        return precision.name
    return f"fsdp-{low}" if strategy in ("fsdp", "hsdp") else f"{low}-mixed"


def for_strategy(planner: Any, strategy: str) -> Any:
    """The planner (:class:`.planner.Planner`) of ``strategy``'s rows: ``planner`` itself, or a sibling with the row's precision (the same
    model, inputs, links and options; its own traces), made once."""
    name = comparison_precision(planner.precision, strategy)
    if name == planner.precision.name:
        return planner
    if name not in planner._siblings:
        sibling = copy.copy(planner)
        sibling.precision = parse_plan_precision(name, "fp32" if name.startswith("fsdp-") else None)
        sibling.options = replace(planner.options, precision=sibling.precision.step)
        sibling._steps, sibling._tp_plan, sibling._siblings = {}, None, {}
        planner._siblings[name] = sibling
    return planner._siblings[name]


def _degrees(value: int | Sequence[int], flag: str) -> list[int]:
    """A parallel degree as a list of the values to compare (``2`` or ``[1, 2, 4]``), each checked once."""
    values = [value] if isinstance(value, int) else list(value)
    if not values:
        raise UserError(f"{flag} names no degree, e.g. {flag} 2 or {flag} 1,2,4")
    for v in values:
        if not isinstance(v, int) or v < 1:
            raise UserError(f"{flag} must be >= 1, not {v}")
    return list(dict.fromkeys(values))


def _listed(value: Any, name: str) -> list:
    """``value`` as a list (a sequence of them), or a one-line error naming ``name``."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise UserError(f"{name} must be one value or a list of them, not {type(value).__name__} {value!r}")
    return list(value)


def compare_layouts(planner: Any, gpus: int | Sequence[int], *, strategies: Sequence[str] | None = None,
                    tp: int | Sequence[int] = 1, sequence_parallel: bool = False, loss_parallel: bool = False,
                    async_tp: bool = False, cp: int | Sequence[int] = 1, cp_rotate: str = "allgather",
                    ep: int | Sequence[int] = 1, pp: int | Sequence[int] = 1, pp_schedule: str = "1f1b",
                    microbatches: int = 0, checkpoint: Any = None, offload: str | None = None,
                    tokens=None, samples=None, steps=None, mfu=None, confirm: bool = False,
                    gpu: str | GPU | Sequence[str | GPU] | None = None, with_checkpointing: bool = True,
                    etp: int = 1) -> Comparison:
    """Plans side by side: every GPU type x GPU count x strategy x parallel degrees, without and with activation
    checkpointing (``checkpoint`` classes, by default the wrap class); several strategies each in its engine's
    precision policy (:func:`for_strategy`), one strategy in the precision asked for.  ``tp``, ``pp``, ``cp`` and
    ``ep`` are a degree or a list of degrees to compare (torchtitan's tensor, pipeline, context and expert parallel
    degrees; the data-parallel degree is what the GPUs leave); a combination a layout cannot take (a degree that
    does not divide the GPUs, ZeRO with tensor parallelism, ...) is listed as skipped with its reason.  Sequence
    parallelism, loss parallelism and asynchronous TP apply to the rows with tensor parallelism, ``etp`` to the rows
    with expert parallelism whose tp it equals (the others take etp 1).  The progress
    line says which row of how many, and about how long the rest takes at the pace of the rows done."""
    gpu_list = [planner.gpu] if gpu is None else ([gpu] if isinstance(gpu, (str, GPU)) else _listed(gpu, "gpu"))
    counts = [gpus] if isinstance(gpus, int) else _listed(gpus, "gpus")
    if not counts or not gpu_list:
        raise UserError(f"{'gpus' if not counts else 'gpu'} names none: give at least one")
    strategies = [strategies] if isinstance(strategies, str) else strategies  # one name, not its letters
    degrees = list(itertools.product(_degrees(tp, "--tp"), _degrees(pp, "--pp"), _degrees(cp, "--cp"),
                                     _degrees(ep, "--ep")))
    ck = resolve_classes(planner.model, checkpoint, "--checkpoint") if checkpoint else tuple(planner.wrap)
    ckpt_sets = [()] + ([ck] if ck and with_checkpointing else [])
    names = list(strategies) if strategies else list(STRATEGIES)
    plans: list[Plan] = []
    skipped: list[str] = []
    rows = [(g, n, s, d, ckset) for g in gpu_list for n in counts for s in names for d in degrees
            for ckset in ckpt_sets]
    one_layout = len(rows) == len(ckpt_sets)  # its error is the answer, not a skipped row
    outer = planner.progress
    started = time.monotonic()
    for i, (g, n, s, (t, p, c, e), ckset) in enumerate(rows):
        done = time.monotonic() - started
        left = f", about {done / i * (len(rows) - i):.0f} s left" if i else ""
        shape = s + model_parallel_text(t, p, c, e)
        row = f"plan {i + 1} of {len(rows)}{left}: {n} x {g if isinstance(g, str) else g.name}, {shape}" + (
            " with checkpointing" if ckset else "")
        sub = for_strategy(planner, s) if len(set(names)) > 1 else planner  # one strategy: as asked
        sub.progress = lambda stage, detail="", _row=row: outer(f"{_row}: {stage}", detail)  # noqa: E731
        try:
            tp_flags = dict(sequence_parallel=sequence_parallel, loss_parallel=loss_parallel, async_tp=async_tp) \
                if t > 1 or all(d[0] == 1 for d in degrees) else {}  # without tp: the layout check's error
            pp_flags = dict(pp=p, pp_schedule=pp_schedule, microbatches=microbatches) if p > 1 else {}
            plans.append(sub.plan(s, n, tp=t, cp=c, cp_rotate=cp_rotate, ep=e, checkpoint=list(ckset) or None,
                                  etp=etp if etp == t and e > 1 else 1,  # (the rows whose tp it is, with ep)
                                  offload=offload, tokens=tokens, samples=samples, steps=steps, mfu=mfu, suggest=False,
                                  confirm=confirm, gpu=g, **tp_flags, **pp_flags))
        except UserError as exc:
            if one_layout or (strategies and len(counts) == 1 and len(degrees) == 1):
                raise
            if not ckset:
                skipped.append(f"{shape} on {n} GPUs: {exc}")
        finally:
            sub.progress = outer
            settle()  # the row's garbage collected once; the traces the planner keeps out of later walks
    if not plans:
        raise UserError("no layout applies: " + "; ".join(skipped))
    low = _LOW.get(planner.precision.name)
    notes = [SEMANTICS.format(low=low)] if low and len({p.config.precision for p in plans}) > 1 else []
    return Comparison(plans, skipped, notes)

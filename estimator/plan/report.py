"""Plans as text: the headline (fits or not, memory needed), the memory rows (adding up to the
peak), the verdict, the searches, time; comparisons as one table with the recommended row.

:class:`Plan` and :class:`Comparison`, what :func:`estimator.plan.plan` and
:func:`~estimator.plan.compare` return, are the numbers (:mod:`.results`) with these views as
methods."""

from __future__ import annotations

from html import escape as html_escape

from tabulate import tabulate

from ..render import fmt_bytes, fmt_flops, step_time_words
from .results import (ComparisonData, Config, PlanData, Solve, gpu_hours, gpu_seconds_per_sample, samples_per_s,
                      tokens_per_s_per_gpu)
from .traced import ROW_TITLES, ROWS


def fmt_duration(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 3 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def _none_fits(p: Plan) -> str:
    """Why no count of GPUs fits: a smaller micro-batch that fits, if one does; else the CUDA context when it takes
    most of the card (it was put down to the activations: 9.89 MiB of them on a card whose 830 MB the context
    nearly filled); else the activations and what else sharding leaves whole."""
    if p.max_batch:  # (a smaller micro-batch fits: that is the answer, whatever else could change)
        return (f"No number of GPUs fits this strategy at this micro-batch (its activations and what sharding leaves "
                f"whole on each GPU are more than the card holds); a micro-batch of {p.max_batch:,} fits, or add "
                f"--checkpoint, --tp or --cp, or a shorter sequence")
    fixed = p.verdict.reserve.get("cuda_context", 0)  # (the workspaces row grows with the batch: not fixed)
    if 2 * fixed >= p.verdict.capacity:
        return (f"No number of GPUs fits this strategy at this micro-batch: the CUDA context alone takes "
                f"{fmt_bytes(fixed)} of the card's {fmt_bytes(p.verdict.capacity)} on every GPU, however the model "
                f"is sharded: use a GPU with more memory")
    return ("No number of GPUs fits this strategy at this micro-batch (its activations and what sharding leaves whole "
            "on each GPU are more than the card holds): add --checkpoint, --tp or --cp, a shorter sequence, or a GPU "
            "with more memory")


def _fmt_solve(solve: Solve | None) -> str:
    if solve is None or solve.value is None:
        return "-" if solve is None else solve.reason or "no limit found"
    if solve.value == 0:
        return f"none: a {'micro-batch' if solve.what == 'batch' else 'sequence length'} of 1 does not fit this layout"
    text = f"{solve.value}"
    if solve.limited_by:
        text += f" (the model's limit, {solve.limited_by}; memory allows {solve.memory_allows})"
    elif solve.confirmed is not None:
        text += (" (interpolated)" if not solve.confirmed else " (confirmed by tracing the next, which has every size the "
                 "interpolation gives)" if solve.by_next else " (confirmed by tracing it and the next)")
    return text


def headline(p: PlanData) -> str:
    v = p.verdict
    c = p.config
    needs = f"needs {fmt_bytes(v.needed)} per GPU (peak {fmt_bytes(p.per_gpu.peak)} + reserve)"
    if p.fits:
        return f"FITS on {c.gpus} x {c.gpu}: {needs}, {fmt_bytes(v.margin)} to spare"
    over = f"DOES NOT FIT on {c.gpus} x {c.gpu}: {needs}, {fmt_bytes(-v.margin)} over its {fmt_bytes(v.capacity)}"
    if p.batch is not None and p.batch.value:
        over += f"; a {'local batch' if p.pipeline is not None else 'micro-batch'} of {p.batch.value} fits"
    if v.suggestions:
        over += f"; {'or ' if p.batch is not None and p.batch.value else ''}fits on {v.suggestions[0].describe()}"
    return over


def _hours(h: float) -> str:
    """GPU-hours to three significant figures (1.29, 0.0902, 1,288): a comparison's cheapest reads apart."""
    return f"{h:,.0f}" if h >= 100 else f"{h:.3g}"


def _pipeline_rank(c: Config) -> str:
    """Which pipeline rank the plan reports (the one with the highest peak), where there is a pipeline."""
    pp = getattr(c, "pp", 1) or 1
    return f": pipeline rank {c.rank // max(c.gpus // pp, 1)} of {pp}, the highest peak" if pp > 1 else ""


def _time_rows(p: PlanData) -> list[tuple[str, str]]:
    """The plan's Time table: batch, compute, communication, launch wait and bubble (which add up to the step
    time), time to train, FLOPs per token, checkpoint size."""
    c, t = p.config, p.time
    tm = [("Micro-batch per GPU / global batch", f"{c.micro_batch} / {c.global_batch}"),
          ("Compute", f"{t.compute_s * 1e3:.2f} ms"),
          ("Communication (exposed)", f"{t.comm_s * 1e3:.2f} ms ({t.exposed_comm_s * 1e3:.2f} ms) over "
                                      f"{', '.join(t.links) or 'no link'}"),
          ("Step time", step_time_words(t.step_time_s, t.likely_s if t.band_log else (0.0, 0.0), t.band_note) +
           (f" (MFU {p.flops.mfu * 100:.1f}%)" if p.flops.mfu else ""))]
    if t.offload_s:
        tm.append(("Host transfers (offload)", f"{t.offload_s * 1e3:.2f} ms"))
    if t.launch_wait_s >= 5e-6:  # (with compute, exposed communication, transfers and bubble: the step time)
        tm.insert(3, ("GPU waiting for kernel launches", f"{t.launch_wait_s * 1e3:.2f} ms"))
    if t.bubble_s:
        tm.insert(3, ("Pipeline bubble (waiting on other stages)", f"{t.bubble_s * 1e3:.2f} ms"))
    tr = p.training
    if p.fits and tr is not None and tr.steps:
        tm.append(("Steps", f"{tr.steps:,}"))
        at_mfu = f" at MFU {tr.mfu_given * 100:.0f}%" if tr.mfu_given else ""
        likely = tr.time_to_train_likely_s
        span = f", likely {fmt_duration(likely[0])} to {fmt_duration(likely[1])}" if likely else ""
        tm.append(("Time to train", fmt_duration(tr.time_to_train_s) + at_mfu + span +
                   f" ({_hours(tr.time_to_train_s * c.gpus / 3600)} GPU-hours)"))
    f = p.flops
    if f.six_n_per_token:
        tm.append(("FLOPs per token: traced / 6N+12LHQT",
                   f"{fmt_flops(f.traced_per_token)} / {fmt_flops(f.six_n_per_token)}"))
    ckpt = p.checkpoint_size
    if ckpt:
        tm.append(("Checkpoint on disk: full / per rank",
                   f"{fmt_bytes(ckpt['full'])} / {fmt_bytes(ckpt['per_rank'])}"))
    return tm


def render_plan(p: PlanData, tablefmt: str = "simple") -> str:
    c, g = p.config, p.per_gpu

    def table(rows: list, what: str) -> str:  # (markdown tables need a header row to render)
        headers = [what, ""] if tablefmt in ("github", "pipe") else ()
        return tabulate(rows, headers=headers, tablefmt=tablefmt, disable_numparse=True)

    extras = [w for w, on in (("sequence parallel", c.sequence_parallel), ("loss parallel", c.loss_parallel),
                              ("async", c.async_tp)) if on]
    tp_text = f" x tp {c.tp}" + (f" ({', '.join(extras)})" if extras else "") if c.tp > 1 else ""
    tp_text += f" x cp {c.cp}" if c.cp > 1 else ""
    tp_text += f" x ep {c.ep}" + (f" (etp {c.etp})" if c.etp > 1 else "") if c.ep > 1 else ""
    ck = ", checkpoint " + ", ".join(c.checkpoint) if c.checkpoint else ""
    off = ", offload " + c.offload if c.offload else ""
    title = (f"Plan: {c.model} on {c.gpus} x {c.gpu}, {c.strategy}{tp_text}, {c.precision}{ck}{off}, "
             f"micro-batch {c.micro_batch if c.micro_batch is not None else '-'}"
             f"{f' x {c.seq}' if c.seq else ''} (rank {c.rank}{_pipeline_rank(c)}; {c.engine})")
    at = f"{g.peak_phase}" + (f", {g.peak_module}" if g.peak_module and g.peak_module != f"({g.peak_phase})" else "")
    mem = [(f"{ROW_TITLES[r]}", fmt_bytes(g.rows.get(r, 0))) for r in ROWS if g.rows.get(r, 0)]
    mem.append((f"Peak ({at})", fmt_bytes(g.peak)))
    mem.append(("Reserve (CUDA context, cuBLAS workspace, fragmentation)", fmt_bytes(sum(p.verdict.reserve.values()))))
    mem.append(("Needed / capacity", f"{fmt_bytes(p.verdict.needed)} / {fmt_bytes(p.verdict.capacity)}"))
    if g.host:
        mem.append(("Offloaded to host memory", fmt_bytes(g.host)))
    states = [("Model states held (parameters / gradients / optimizer)",
               f"{fmt_bytes(g.parameters)} / {fmt_bytes(g.gradients)} / {fmt_bytes(g.optimizer_state)}"),
              ("Activations saved at the end of forward", fmt_bytes(g.saved_activations))]
    parts = [headline(p), title,
             "Memory at the peak (rows add up to the peak)\n" + table(mem, "Memory at the peak"),
             table(states, "Held")]
    if p.pipeline is not None:  # the local batch searched at the same micro-batch size (plan.pipeline_search)
        found = "not searched" if p.batch is None else _fmt_solve(p.batch)
        if p.batch is not None and p.batch.value:
            micro = p.pipeline["micro_batch"]
            found += f" ({p.batch.value // micro} micro-batches of {micro}; the schedule composed, each stage traced once)"
        parts.append(table([("Largest local batch that fits", found)], "Search"))
    elif p.fits or p.batch is not None:
        sizes = [("Largest micro-batch that fits", _fmt_solve(p.batch))]
        if p.seq is not None:
            sizes.append(("Longest sequence that fits", _fmt_solve(p.seq)))
        parts.append(table(sizes, "Search"))
    if not p.fits and not p.verdict.suggestions and p.pipeline is None:  # (searched: none fits on any count)
        parts.append(_none_fits(p))
    if not p.fits and p.verdict.suggestions:
        parts.append("Smallest layouts that fit:\n" + "\n".join(
            f"  - {s.describe()}: needs {fmt_bytes(s.needed)}" + (f", step {s.step_time_s * 1e3:,.0f} ms"
                                                                  if s.step_time_s else "")
            + (f", time to train {fmt_duration(s.time_to_train_s)} ({_hours(s.time_to_train_s * s.gpus / 3600)} "
               f"GPU-hours)" if s.time_to_train_s else "") for s in p.verdict.suggestions))
    tm = _time_rows(p)
    parts.append(table(tm, "Time"))
    if p.notes:
        parts.append("Notes:\n" + "\n".join(f"  - {n}" for n in p.notes))
    return "\n\n".join(parts) + "\n"


def compare_label(cmp: ComparisonData) -> str:
    """The model and the rows' precision: one name, or each engine's own where they differ (FSDP2's
    MixedPrecisionPolicy beside DDP's autocast; the Precision note under the table says which)."""
    names = list(dict.fromkeys(p.config.precision for p in cmp.plans))
    what = names[0] if len(names) == 1 else f"{' / '.join(names)}: each engine's own, see Precision below"
    return f"{cmp.plans[0].config.model} ({what})"


def _fmt_max_batch(p: PlanData) -> str:
    """A row's largest micro-batch, ``~N`` where the search interpolated it without a trace confirming it."""
    if p.max_batch is None:
        return "-"
    return f"{p.max_batch:,}" if p.batch.confirmed or p.batch.limited_by or not p.max_batch else f"~{p.max_batch:,}"


def render_comparison(cmp: ComparisonData, tablefmt: str = "simple") -> str:
    best = cmp.recommended
    body = []
    for p in cmp.plans:
        c = p.config
        hours, rate = gpu_hours(p), tokens_per_s_per_gpu(p)
        body.append([("* " if p is best else "  ") + c.gpu, str(c.gpus), c.strategy + c.model_parallel(),
                     ", ".join(c.checkpoint) or "-", str(c.micro_batch), str(c.global_batch),
                     fmt_bytes(p.verdict.needed), "yes" if p.fits else "no",
                     _fmt_max_batch(p),
                     f"{p.step_time_s * 1e3:.1f} ms", "-" if rate is None else f"{rate:,.0f}",
                     "-" if not p.flops.mfu else f"{p.flops.mfu * 100:.1f}%",
                     fmt_duration(p.time_to_train_s), "-" if hours is None or not p.fits else _hours(hours)])
    head = f"Plans for {compare_label(cmp)}"
    given = next((p.training.mfu_given for p in cmp.plans if p.training is not None and p.training.mfu_given), None)
    at = f" (MFU {given * 100:g}%)" if given else ""
    table = tabulate(body, headers=["GPU", "GPUs", "Strategy", "Checkpoint", "Micro-batch", "Global batch",
                                    "Needs / GPU", "Fits", "Max batch", "Step time", "Tokens/s/GPU", "MFU",
                                    f"Time to train{at}", f"GPU-hours{at}"],
                     tablefmt=tablefmt, disable_numparse=True)
    parts = [answers_text(cmp), head, table] + [f"Precision: {n}." for n in cmp.notes]
    if any(_fmt_max_batch(p).startswith("~") for p in cmp.plans):  # (ZeRO's rows: laid out by hand, not traced)
        parts.append("Max batch ~N: interpolated between the row's traces, not confirmed by tracing it; a plan of "
                     "that layout alone confirms it (it can be lower).")
    if given:  # (the answers above rank the rows on these times)
        parts.append(f"Time to train and GPU-hours at the MFU given (--mfu {given:g}: the model's FLOPs at "
                     f"{given * 100:g}% of each GPU's peak), not at the planned step time; Step time, Tokens/s/GPU "
                     f"and MFU are the plan's.")
    if cmp.skipped:
        parts.append("Not applicable:\n" + "\n".join(f"  - {s}" for s in cmp.skipped))
    return "\n\n".join(parts) + "\n"


def answers_text(cmp: ComparisonData) -> str:
    """How many GPUs: the fewest that fit, the fastest (marked *) and the cheapest, each with its layout."""
    from .html import label

    answers = cmp.answers
    if not answers:
        return f"None of these {len(cmp.plans)} plans fits."

    def cost(p: PlanData) -> str:
        hours = gpu_hours(p)
        if hours is not None:
            return f"{fmt_duration(p.time_to_train_s)}, {_hours(hours)} GPU-hours"
        return f"{samples_per_s(p):,.1f} samples/s, {gpu_seconds_per_sample(p) * 1e3:,.2f} GPU-ms per sample"

    lines = [f"Fewest GPUs that fit:  {label(answers['fewest_gpus'])} ({cost(answers['fewest_gpus'])})",
             f"Fastest (*):           {label(answers['fastest'])} ({cost(answers['fastest'])})",
             f"Cheapest in GPU-hours: {label(answers['cheapest'])} ({cost(answers['cheapest'])})"]
    return "\n".join(lines)


class Plan(PlanData):
    """The plan of one layout: per-GPU memory, verdict, largest batch, time; ``print(plan)`` shows it."""

    def render(self, tablefmt: str = "simple") -> str:
        return render_plan(self, tablefmt)

    def __str__(self) -> str:
        return self.render()

    def __repr__(self) -> str:  # a notebook cell or a REPL: the headline, not every field
        return f"<Plan: {headline(self)}>"

    def _repr_html_(self) -> str:
        from .html import table_html

        return f"<p><b>{html_escape(headline(self))}</b></p>" + table_html(self, fmt_duration)

    def to_html(self) -> str:
        """A self-contained page: the verdict, one GPU's memory against its capacity, the step time (:mod:`.html`)."""
        from .html import to_html

        c = self.config
        return to_html(self, f"Plan: {c.model} on {c.gpus} x {c.gpu}", headline(self), self.render(), fmt_duration)

    def plot(self, path: str, fmt: str | None = None) -> None:
        """Draw the plan as an image (:mod:`.plot`; needs matplotlib)."""
        from .plot import plot_plan

        plot_plan(self, path, headline(self), fmt)


class Comparison(ComparisonData):
    """Plans side by side (strategies x checkpointing, GPU types, GPU counts); the recommended one
    is the fastest that fits (shortest time to train with a budget, else most samples per second)."""

    def render(self, tablefmt: str = "simple") -> str:
        return render_comparison(self, tablefmt)

    def __str__(self) -> str:
        return self.render()

    def __repr__(self) -> str:
        return f"<Comparison of {len(self.plans)} plans: {_recommendation(self)}>"

    def _repr_html_(self) -> str:
        from .html import table_html

        return f"<p><b>{html_escape(_recommendation(self))}</b></p>" + table_html(self, fmt_duration)

    def to_html(self) -> str:
        """A self-contained page: each layout's memory of one GPU and step time, side by side (:mod:`.html`)."""
        from .html import to_html

        return to_html(self, f"Plans for {compare_label(self)}", _recommendation(self), self.render(),
                       fmt_duration)

    def plot(self, path: str, fmt: str | None = None) -> None:
        """Draw the plans side by side as an image (:mod:`.plot`; needs matplotlib)."""
        from .plot import plot_plan

        plot_plan(self, path, _recommendation(self), fmt)


def _recommendation(cmp: ComparisonData) -> str:
    """The comparison's answer in one line: the fastest layout that fits, the fewest GPUs and the cheapest in
    GPU-hours (where they differ), or that none fits."""
    from .html import label

    answers = cmp.answers
    fit = sum(p.fits for p in cmp.plans)
    if not answers:
        return f"none of these {len(cmp.plans)} plans fits"
    best = answers["fastest"]
    text = f"fastest: {label(best)} ({fit} of {len(cmp.plans)} plans fit; needs {fmt_bytes(best.verdict.needed)} per GPU)"
    for key, name in (("fewest_gpus", "fewest GPUs"), ("cheapest", "cheapest in GPU-hours")):
        if answers[key] is not best:
            text += f"; {name}: {label(answers[key])}"
    return text

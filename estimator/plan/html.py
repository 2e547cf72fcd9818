"""Plans as HTML: the compact table a notebook shows (``Plan._repr_html_``, ``Comparison._repr_html_``) and the
self-contained page ``estimator plan --output plan.html`` writes: the verdict, the memory of one GPU under
each layout (its rows stacked, adding up to the peak, the reserve on top, the GPU's capacity marked), the
step time with the communication the compute waits for (exposed) apart from the communication it hides,
and the table of the plans.  No external resources, no script.
"""

from __future__ import annotations

import html
from typing import Any, Callable

from ..render.units import CATEGORY_COLORS, fmt_bytes
from .results import PlanData
from .traced import ROW_TITLES, ROWS

# the per-GPU rows in the estimate's palette where they are the same thing (estimator.render.units)
ROW_COLORS = {
    "parameters": CATEGORY_COLORS["parameter"], "gradients": CATEGORY_COLORS["gradient"],
    "optimizer_state": CATEGORY_COLORS["optimizer_state"], "gathered_parameters": "#ff9da7",
    "weight_copies": "#a0cbe8", "comm_buffers": "#17becf", "activations": CATEGORY_COLORS["saved"],
    "temporaries": CATEGORY_COLORS["temporary"], "inputs_and_buffers": CATEGORY_COLORS["input"],
    "workspaces": CATEGORY_COLORS["workspace"], "reserve": "#bab0ac",
}
ROW_LABELS = {**ROW_TITLES, "reserve": "Reserve (CUDA context, fragmentation)"}
TIME_PARTS = (("compute", "compute", "#4e79a7"),
              ("exposed", "communication the compute waits for (exposed)", "#e15759"),
              ("launch", "the GPU waiting for the host to launch kernels", "#bab0ac"),
              ("offload", "host transfers (offload)", "#edc948"),
              ("bubble", "pipeline bubble: the rank waiting on other stages", "#d4a6c8"),
              ("hidden", "communication hidden behind compute (the thin bar beneath)", "#f28e2b"))


def plans_of(result: Any) -> list[PlanData]:
    return list(result.plans) if hasattr(result, "plans") else [result]


def label(p: PlanData) -> str:
    """'8 x H100-SXM, fsdp x tp 2, checkpoint Block'."""
    c = p.config
    ck = f", checkpoint {', '.join(c.checkpoint)}" if c.checkpoint else ""
    off = f", offload {c.offload}" if c.offload else ""
    return f"{c.gpus} x {c.gpu}, {c.strategy}{c.model_parallel()}{ck}{off}"


def memory_parts(p: PlanData) -> list[tuple[str, int]]:
    """(row, bytes) of one GPU at the peak, then the reserve: they add up to what the GPU needs."""
    parts = [(r, p.per_gpu.rows.get(r, 0)) for r in ROWS if p.per_gpu.rows.get(r, 0)]
    return parts + [("reserve", p.verdict.needed - p.per_gpu.peak)]


def time_parts(p: PlanData) -> list[tuple[str, float]]:
    """(part, seconds) of one step: compute, the exposed communication, the GPU idle while the host launches
    kernels (a small model's step is launch-bound), host transfers, a pipeline rank's bubble (these five add up
    to the step time), and
    the hidden communication (drawn under the compute it overlaps, not after the step)."""
    t = p.time
    return [("compute", t.compute_s), ("exposed", t.exposed_comm_s), ("launch", t.launch_wait_s),
            ("offload", t.offload_s), ("bubble", t.bubble_s),
            ("hidden", max(t.comm_s - t.exposed_comm_s, 0.0))]


def _bars_svg(rows: list[tuple[str, list[tuple[str, float, str, str]], float | None]], unit: str, scale: float,
              top: float, aria: str, under: dict[int, tuple[float, str, str]] | None = None) -> str:
    """Horizontal stacked bars, one per row: (label, [(part, value, colour, tooltip)], marker or None); values
    divided by ``scale`` on an axis to ``top``; the marker (the GPU's capacity) a dashed line across the row;
    ``under[i]``: (value, colour, tooltip) drawn as a thin bar from 0 under row ``i`` (what overlaps its parts).
    The labels' column is as wide as the longest label (about 7 px a character at 12 px)."""
    longest = max((len(name) for name, _, _ in rows), default=0)
    width, right, bar, gap = 900, 20, 22, 12
    left = min(max(250, 7 * longest + 16), 450)
    height = 30 + len(rows) * (bar + gap)
    pw = width - left - right

    def x(v: float) -> float:
        return left + pw * min(v / top, 1.0)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="100%" role="img" '
           f'aria-label="{html.escape(aria)}" class="bars">']
    for k in range(5):
        v = top * k / 4
        out.append(f'<line x1="{x(v):.1f}" x2="{x(v):.1f}" y1="8" y2="{height - 18}" stroke="#e4e4e4"/>'
                   f'<text x="{x(v):.1f}" y="{height - 4}" text-anchor="{"end" if k == 4 else "middle"}">'
                   f'{v / scale:.3g} {unit}</text>')  # (the last label ends at its line: inside the chart)
    for i, (name, parts, marker) in enumerate(rows):
        y = 12 + i * (bar + gap)
        out.append(f'<text x="{left - 8}" y="{y + bar * 0.7:.1f}" text-anchor="end">{html.escape(name)}</text>')
        acc = 0.0
        for _part, value, color, tip in parts:
            if value <= 0:
                continue
            out.append(f'<rect x="{x(acc):.1f}" y="{y}" width="{max(x(acc + value) - x(acc), 0.5):.1f}" height="{bar}" '
                       f'fill="{color}"><title>{html.escape(tip)}</title></rect>')
            acc += value
        if under and i in under and under[i][0] > 0:
            value, color, tip = under[i]
            out.append(f'<rect x="{x(0):.1f}" y="{y + bar + 1}" width="{max(x(value) - x(0), 0.5):.1f}" height="4" '
                       f'fill="{color}"><title>{html.escape(tip)}</title></rect>')
        if marker is not None:
            out.append(f'<line x1="{x(marker):.1f}" x2="{x(marker):.1f}" y1="{y - 4}" y2="{y + bar + 4}" stroke="#111" '
                       f'stroke-width="2" stroke-dasharray="4 2" class="capacity"><title>capacity '
                       f'{html.escape(fmt_bytes(marker))}</title></line>')
    out.append("</svg>")
    return "\n".join(out)


def memory_svg(plans: list[PlanData]) -> str:
    """One GPU's memory under each layout, against its capacity (the dashed line)."""
    top = max(max(p.verdict.needed, p.verdict.capacity) for p in plans) * 1.02
    rows = [(label(p), [(r, float(b), ROW_COLORS.get(r, "#999"), f"{ROW_LABELS.get(r, r)}: {fmt_bytes(b)}")
                        for r, b in memory_parts(p)], float(p.verdict.capacity)) for p in plans]
    return _bars_svg(rows, "GiB", 2**30, top, "memory of one GPU by layout")


def time_svg(plans: list[PlanData]) -> str:
    """One step's time under each layout: compute, exposed communication, hidden communication, host transfers."""
    colors = {k: c for k, _, c in TIME_PARTS}
    words = {k: w for k, w, _ in TIME_PARTS}
    parts = [dict(time_parts(p)) for p in plans]
    top = max(max(sum(v for k, v in ps.items() if k != "hidden"), ps["hidden"]) for ps in parts) * 1.02 or 1.0
    rows = [(label(p), [(k, v, colors[k], f"{words[k]}: {v * 1e3:.2f} ms") for k, v in ps.items() if k != "hidden"],
             None) for p, ps in zip(plans, parts)]
    under = {i: (ps["hidden"], colors["hidden"], f"{words['hidden']}: {ps['hidden'] * 1e3:.2f} ms")
             for i, ps in enumerate(parts)}
    return _bars_svg(rows, "ms", 1e-3, top, "step time by layout", under)


def _legend(items: list[tuple[str, str]]) -> str:
    return '<div class="legend">' + "".join(f'<span><i style="background:{c}"></i>{html.escape(w)}</span>'
                                            for w, c in items) + "</div>"


def table_html(result: Any, duration: Callable[[float | None], str]) -> str:
    """The plans as one compact table (the notebook view): layout, micro-batch, what one GPU needs against its
    capacity, fits, the largest micro-batch, the step time with its exposed communication, MFU, time to train
    (in ``duration``'s words); the recommended row marked."""
    plans = plans_of(result)
    best = getattr(result, "recommended", plans[0] if plans[0].fits else None)
    esc = html.escape
    given = next((p.training.mfu_given for p in plans if p.training is not None and p.training.mfu_given), None)
    at = f" (at the MFU given, {given * 100:g}%)" if given else ""
    head = ("<tr><th>Layout</th><th>Micro-batch</th><th>Needs / GPU</th><th>Capacity</th><th>Fits</th>"
            f"<th>Max batch</th><th>Step time</th><th>Exposed comm.</th><th>MFU</th><th>Time to train{at}</th></tr>")
    body = []
    for p in plans:
        mark = " style=\"font-weight:600;background:#e8f5e9\"" if p is best and len(plans) > 1 else ""
        body.append(f"<tr{mark}><td>{esc(label(p))}</td><td>{p.config.micro_batch}</td>"
                    f"<td title=\"{p.verdict.needed:,} bytes\">{fmt_bytes(p.verdict.needed)}</td>"
                    f"<td>{fmt_bytes(p.verdict.capacity)}</td><td>{'yes' if p.fits else '<b>no</b>'}</td>"
                    f"<td>{'-' if p.max_batch is None else p.max_batch}</td><td>{p.step_time_s * 1e3:.1f} ms</td>"
                    f"<td>{p.time.exposed_comm_s * 1e3:.1f} ms</td>"
                    f"<td>{'-' if not p.flops.mfu else f'{p.flops.mfu * 100:.1f}%'}</td>"
                    f"<td>{esc(duration(p.time_to_train_s))}</td></tr>")
    return (f'<table class="plans" style="border-collapse:collapse;font-variant-numeric:tabular-nums">'
            f"<thead>{head}</thead><tbody>{''.join(body)}</tbody></table>")


_STYLE = """body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0;
       padding: 1.2em 2em; color: #222; }
h1 { font-size: 1.4em; margin: 0 0 0.3em; overflow-wrap: anywhere; }
h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
.headline { font-size: 1.1em; font-weight: 600; padding: 0.6em 0.9em; border-radius: 6px; margin: 0.4em 0 1em;
            border-left: 6px solid #2e7d32; background: #e8f5e9; overflow-wrap: anywhere; }
.headline.nofit { border-color: #c62828; background: #fdecea; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { padding: 0.22em 0.7em; border-bottom: 1px solid #eee; text-align: left; }
.scroll { overflow-x: auto; }
.legend { display: flex; flex-wrap: wrap; gap: 0.3em 1.2em; margin: 0.4em 0; font-size: 0.95em; }
.legend i { display: inline-block; width: 0.9em; height: 0.9em; margin-right: 0.35em; vertical-align: -0.1em; }
svg.bars { display: block; max-width: 1100px; min-width: 640px; }
svg text { font: 12px system-ui, sans-serif; fill: #333; }
pre { background: #fafafa; border: 1px solid #eee; padding: 0.6em; overflow-x: auto; }
@media (max-width: 640px) { body { padding: 0.8em; } }
"""


def to_html(result: Any, title: str, headline: str, text: str, duration: Callable[[float | None], str]) -> str:
    """The page ``estimator plan --output plan.html`` writes (``text``: the plan's text report, kept whole)."""
    plans = plans_of(result)
    fits = any(p.fits for p in plans)
    used = [r for r in (*ROWS, "reserve") if any(dict(memory_parts(p)).get(r) for p in plans)]
    mem_legend = _legend([(ROW_LABELS[r], ROW_COLORS[r]) for r in used] + [("capacity of the GPU (dashed)", "#111")])
    time_legend = _legend([(w, c) for k, w, c in TIME_PARTS if any(dict(time_parts(p)).get(k) for p in plans)])
    esc = html.escape
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title>
<style>
{_STYLE}</style>
</head>
<body>
<h1>{esc(title)}</h1>
<div class="headline{'' if fits else ' nofit'}">{esc(headline)}</div>
<h2>Memory of one GPU</h2>
<p>What one GPU holds at the step's peak under each layout (the rows add up to the peak; the reserve on top is
what the GPU needs beyond it), against the GPU's capacity.</p>
{mem_legend}
<div class="scroll">{memory_svg(plans)}</div>
<h2>Step time</h2>
<p>The compute stream's busy time, the communication it waits for (exposed), the time it waits for the host to launch kernels and, under pipeline parallelism, for the other stages (the bubble): these end at the step time; beneath, the communication the compute hides (it runs meanwhile).</p>
{time_legend}
<div class="scroll">{time_svg(plans)}</div>
<h2>Plans</h2>
<div class="scroll">{table_html(result, duration)}</div>
<h2>Details</h2>
<pre>{esc(text)}</pre>
</body>
</html>
"""

"""How a :class:`~estimator.report.Report` is shown: text and markdown tables, CSV, HTML, SVG, PNG.

Memory is shown in binary units (KiB, MiB, GiB = 2**10, 2**20, 2**30 bytes); FLOPs in decimal
units, one multiply-add being 2 FLOPs.  The report object holds the numbers
(:meth:`~estimator.report.Report.to_dict`); everything here only formats them.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
from typing import TYPE_CHECKING

from tabulate import tabulate

from .capture import INPUT_MODULE, LOSS_MODULE
from .errors import UserError
from .memory import CATEGORIES, MemoryProfile

if TYPE_CHECKING:
    from .report import Report

SCHEMA_VERSION = 1  # of Report.to_dict(); see the README


def fmt_bytes(n: float) -> str:
    """Binary units: 1536 -> '1.50 KiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # pragma: no cover


def fmt_flops(n: float) -> str:
    """Decimal units: 2.5e9 -> '2.50 GFLOP'."""
    n = float(n)
    for unit in ("", "K", "M", "G", "T", "P", "E"):
        if abs(n) < 1000 or unit == "E":
            return f"{n:.0f} FLOP" if unit == "" else f"{n:.2f} {unit}FLOP"
        n /= 1000
    return f"{n:.2f} EFLOP"  # pragma: no cover


def fmt_count(n: int) -> str:
    return f"{n:,}"


_CATEGORY_LABEL = {"parameter": "parameters", "buffer": "buffers", "input": "inputs",
                   "optimizer_state": "optimizer state", "gradient": "gradients", "saved": "saved activations",
                   "temporary": "temporaries"}


def _dtype_note(per_dtype: dict[str, int]) -> str:
    """' (bfloat16 1.00 MiB, float32 2.00 MiB)' when several dtypes share a figure."""
    if len(per_dtype) < 2:
        return ""
    return " (" + ", ".join(f"{d} {fmt_bytes(n)}" for d, n in sorted(per_dtype.items(), key=lambda kv: -kv[1])) + ")"


# -- text -----------------------------------------------------------------
def summary_rows(report: "Report") -> list[tuple[str, str]]:
    t = report.tally
    fwd, bwd = t.flops["forward"], t.flops["backward"]
    mm = t.flops["matmul_forward"] + t.flops["matmul_backward"]
    rows = [
        ("Parameters", f"{fmt_count(t.params_total)} ({fmt_count(t.params_trainable)} trainable)"),
        ("Loss", report.capture.loss_source),
        ("Optimizer", report.capture.optimizer_name or "none"),
        ("Target", f"{report.device}, {report.precision}, {report.mode}"),
        ("Memory: parameters", fmt_bytes(t.parameters_bytes)),
        ("Memory: buffers", fmt_bytes(t.buffers_bytes)),
        ("Memory: gradients", fmt_bytes(t.gradients_bytes)),
        ("Memory: optimizer state", fmt_bytes(t.optimizer_state_bytes)),
        ("Memory: activations (saved for backward)", fmt_bytes(t.activations_bytes)
         + _dtype_note(t.memory_by_dtype.get("saved", {}))),
    ]
    if report.memory is not None:
        m = report.memory
        at = m.peak_at
        where = f"in {at.phase}" + (f", {at.module}" if at.module else "") + (f", {at.op}" if at.op else "")
        rows += [
            ("Memory: peak (steady-state step)", f"{fmt_bytes(m.peak)} ({where})"),
            ("Memory: peak at that moment", ", ".join(f"{_CATEGORY_LABEL.get(k, k)} {fmt_bytes(v)}"
                                                      for k, v in at.by_category.items() if v)),
            ("Memory: peak (first step)", fmt_bytes(m.peak_first_step)),
        ]
        if m.reserve:
            rows.append(("Memory: reserve outside the allocator",
                         f"{fmt_bytes(sum(m.reserve.values()))} (CUDA context, cuBLAS workspace, fragmentation)"))
    rows += [
        ("FLOPs: forward", fmt_flops(fwd)),
        ("FLOPs: backward", fmt_flops(bwd)),
        ("FLOPs: total", f"{fmt_flops(fwd + bwd)} ({100.0 * mm / max(fwd + bwd, 1):.1f}% matmul-class)"),
    ]
    for dtype, n in sorted(t.flops_by_dtype.items()):
        rows.append((f"FLOPs: {dtype}", fmt_flops(n)))
    if report.checkpoint:
        c = report.checkpoint
        rows.append((f"What-if: checkpoint {', '.join(c.classes)}",
                     f"peak {fmt_bytes(c.peak)} (saves {fmt_bytes(c.peak_saved)}), "
                     f"backward +{fmt_flops(c.flops_added)}"))
    if t.flops["optimizer"]:
        rows.append(("FLOPs: optimizer step", fmt_flops(t.flops["optimizer"])))
    if report.capture.fallback_reason:
        where = "real CPU tensors" if report.capture.mode == "real" else "fake tensors"
        rows.append(("Capture", f"{where} ({report.capture.fallback_reason})"))
    return rows


def module_table(report: "Report", depth: int | None = None, tablefmt: str = "simple") -> str:
    headers = ["Module", "Type", "Output shape", "Params", "Saved activations", "Fwd FLOPs", "Bwd FLOPs", "%"]
    rows = report.module_rows(depth)
    body = [
        [r.path, r.type, r.output_shape, fmt_count(r.params), fmt_bytes(r.activations),
         fmt_flops(r.flops_forward), fmt_flops(r.flops_backward), f"{r.percent:.1f}"]
        for r in rows
    ]
    t = report.tally
    body.append(["Total", "", "", fmt_count(t.params_total), fmt_bytes(t.activations_bytes),
                 fmt_flops(t.flops["forward"]), fmt_flops(t.flops["backward"]), "100.0"])
    return tabulate(body, headers=headers, tablefmt=tablefmt, disable_numparse=True)


def unsupported_table(report: "Report", tablefmt: str = "simple") -> str:
    if not report.tally.unsupported:
        return ""
    body = [[r["op"], r["count"], r["module"]] for r in report.tally.unsupported]
    return tabulate(body, headers=["Op without a cost rule", "Count", "Module"], tablefmt=tablefmt)


def render(report: "Report", tablefmt: str = "simple", depth: int | None = None) -> str:
    title = f"Training-step estimate{f' of {report.model_name}' if report.model_name else ''}"
    parts = [
        title,
        tabulate(report.summary_rows(), tablefmt=tablefmt, disable_numparse=True),
        f"Per module (depth {report.depth if depth is None else depth})",
        report.module_table(depth, tablefmt),
    ]
    unsupported = report.unsupported_table(tablefmt)
    if unsupported:
        parts += ["Not counted (no rule; FLOPs of these ops are missing from the totals)", unsupported]
    return "\n\n".join(parts) + "\n"


# -- csv ------------------------------------------------------------------
CSV_COLUMNS = ("path", "type", "output_shape", "params", "activations", "flops_forward", "flops_backward",
               "percent")


def to_csv(report: "Report", depth: int | None = None) -> str:
    """One row per module at ``depth`` (the JSON ``modules`` rows): exact integers, bytes and FLOPs."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in report.module_rows(depth):
        d = r.to_dict()
        d["percent"] = f"{r.percent:.4f}"
        writer.writerow([d[c] for c in CSV_COLUMNS])
    return buf.getvalue()


# -- html -----------------------------------------------------------------
def to_html(report: "Report", depth: int | None = None) -> str:
    """A self-contained page (inline CSS and SVG, no scripts or external resources): the summary,
    the per-module table, the memory timeline of the steady-state step, and the JSON of
    :meth:`to_dict` in a ``<script type="application/json" id="estimate-json">`` block."""
    esc = html.escape
    title = f"Training-step estimate{f' of {report.model_name}' if report.model_name else ''}"
    summary = "\n".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in report.summary_rows())
    rows = report.module_rows(depth)
    t = report.tally
    body = []
    for r in rows:
        indent = 0 if r.path.startswith("(") else r.path.count(".") + (r.path != "(root)")
        body.append(
            f"<tr><td class=path style=\"padding-left:{0.4 + 0.9 * indent:.1f}em\">{esc(r.path)}</td>"
            f"<td>{esc(r.type)}</td><td>{esc(r.output_shape)}</td>"
            f"<td class=num title=\"{r.params}\">{fmt_count(r.params)}</td>"
            f"<td class=num title=\"{r.activations} bytes\">{fmt_bytes(r.activations)}</td>"
            f"<td class=num title=\"{r.flops_forward}\">{fmt_flops(r.flops_forward)}</td>"
            f"<td class=num title=\"{r.flops_backward}\">{fmt_flops(r.flops_backward)}</td>"
            f"<td class=num><span class=bar style=\"width:{min(r.percent, 100):.1f}%\"></span>"
            f"{r.percent:.1f}</td></tr>")
    body.append(f"<tr class=total><td>Total</td><td></td><td></td><td class=num>{fmt_count(t.params_total)}</td>"
                f"<td class=num>{fmt_bytes(t.activations_bytes)}</td>"
                f"<td class=num>{fmt_flops(t.flops['forward'])}</td>"
                f"<td class=num>{fmt_flops(t.flops['backward'])}</td><td class=num>100.0</td></tr>")
    unsupported = ""
    if t.unsupported:
        urows = "\n".join(f"<tr><td>{esc(str(u['op']))}</td><td class=num>{u['count']}</td>"
                          f"<td>{esc(str(u['module']))}</td></tr>" for u in t.unsupported)
        unsupported = ("<h2>Not counted</h2><p>Ops without a cost rule: their FLOPs are missing from the "
                       "totals.</p><table><thead><tr><th>Op</th><th>Count</th><th>Module</th></tr></thead>"
                       f"<tbody>{urows}</tbody></table>")
    timeline = ""
    if report.memory is not None and report.memory.timeline:
        timeline = ("<h2>Memory over one training step</h2><p>Live bytes after each op of a steady-state "
                    "step (optimizer state already allocated), stacked by category"
                    + (", each allocation rounded to the CUDA caching allocator's 512-byte blocks"
                       if report.device == "cuda" else "") + ".</p>" + timeline_svg(report.memory))
    data = json.dumps(report.to_dict(depth), indent=1).replace("</", "<\\/")
    depth_text = report.depth if depth is None else depth
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="estimator (schema version {SCHEMA_VERSION})">
<title>{esc(title)}</title>
<style>
body {{ font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em auto;
       max-width: 1200px; padding: 0 1em; color: #222; }}
h1 {{ font-size: 1.5em; margin-bottom: 0.2em; }}
h2 {{ font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }}
table {{ border-collapse: collapse; margin: 0.5em 0; }}
th, td {{ padding: 0.25em 0.7em; border-bottom: 1px solid #eee; text-align: left; vertical-align: top; }}
thead th {{ background: #f5f5f5; position: sticky; top: 0; }}
table.summary th {{ font-weight: 600; white-space: nowrap; }}
td.num {{ text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; position: relative; }}
td.path {{ font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 0.92em; }}
span.bar {{ position: absolute; left: 0; top: 15%; height: 70%; background: #4e79a733; z-index: -1; }}
tr.total td {{ font-weight: 600; border-top: 2px solid #ccc; }}
p.note {{ color: #666; }}
svg text {{ font: 11px system-ui, sans-serif; fill: #333; }}
</style>
</head>
<body>
<h1>{esc(title)}</h1>
<p class=note>One training step (forward, loss, backward, optimizer step) captured on fake tensors.
Memory in binary units (KiB, MiB, GiB); one multiply-add is 2 FLOPs. Hover a number for its exact value.</p>
<h2>Summary</h2>
<table class=summary>
{summary}
</table>
{timeline}
<h2>Per module (depth {depth_text})</h2>
<table class=modules>
<thead><tr><th>Module</th><th>Type</th><th>Output shape</th><th>Params</th><th>Saved activations</th>
<th>Fwd FLOPs</th><th>Bwd FLOPs</th><th>% FLOPs</th></tr></thead>
<tbody>
{chr(10).join(body)}
</tbody>
</table>
{unsupported}
<script type="application/json" id="estimate-json">
{data}
</script>
</body>
</html>
"""


# -- the memory timeline as inline SVG ---------------------------------------------------------

CATEGORY_COLORS = {
    "parameter": "#4e79a7", "buffer": "#a0cbe8", "input": "#f28e2b", "optimizer_state": "#59a14f",
    "gradient": "#e15759", "saved": "#b07aa1", "temporary": "#edc948",
}
MAX_SVG_POINTS = 1000


def _nice_step(span: float, ticks: int = 5) -> float:
    raw = span / max(ticks, 1)
    if raw <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag  # pragma: no cover


def timeline_svg(profile: MemoryProfile, width: int = 1000, height: int = 380) -> str:
    """The steady-state memory timeline as a stacked-area SVG (no external resources).

    At most ``MAX_SVG_POINTS`` columns: each keeps the op with the most live bytes in its range,
    so the peak is always drawn.
    """
    points = profile.timeline
    n = len(points)
    if n > MAX_SVG_POINTS:
        size = math.ceil(n / MAX_SVG_POINTS)
        picked = [max(range(i, min(i + size, n)), key=lambda j: points[j].total) for i in range(0, n, size)]
    else:
        picked = list(range(n))
    cats = [c for c in CATEGORIES if any(points[j].by_category.get(c) for j in picked)]
    top = max([points[j].total for j in picked] + [profile.peak, 1])
    unit_name, unit = "B", 1
    for name, u in (("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30), ("TiB", 2**40)):
        if top >= u:
            unit_name, unit = name, u
    step = _nice_step(top / unit)
    y_max = math.ceil(top / unit / step) * step * unit
    left, right, top_pad, bottom = 70, 170, 20, 40
    pw, ph = width - left - right, height - top_pad - bottom
    last = max(n - 1, 1)

    def x(j: int) -> float:
        return left + pw * j / last

    def y(v: float) -> float:
        return top_pad + ph * (1 - v / y_max)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="live memory over one training step">']
    # grid and y axis
    v = 0.0
    while v <= y_max / unit + 1e-9:
        yy = y(v * unit)
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#e5e5e5"/>')
        label = f"{v:g} {unit_name}"
        parts.append(f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{label}</text>')
        v += step
    # stacked areas, bottom category first
    base = [0.0] * len(picked)
    for c in cats:
        upper = [base[k] + points[j].by_category.get(c, 0) for k, j in enumerate(picked)]
        fwd = " ".join(f"{x(j):.1f},{y(upper[k]):.1f}" for k, j in enumerate(picked))
        back = " ".join(f"{x(j):.1f},{y(base[k]):.1f}" for k, j in reversed(list(enumerate(picked))))
        most = max(points[j].by_category.get(c, 0) for j in picked)
        parts.append(f'<polygon points="{fwd} {back}" fill="{CATEGORY_COLORS.get(c, "#999")}" fill-opacity="0.85">'
                     f'<title>{html.escape(c.replace("_", " "))}: up to {fmt_bytes(most)}</title></polygon>')
        base = upper
    # phase boundaries
    seen = set()
    for j, p in enumerate(points):
        if p.phase in ("loss", "backward", "optimizer") and p.phase not in seen:
            seen.add(p.phase)
            parts.append(f'<line x1="{x(j):.1f}" x2="{x(j):.1f}" y1="{top_pad}" y2="{top_pad + ph}" '
                         f'stroke="#777" stroke-width="0.8"/>')
            parts.append(f'<text x="{x(j) + 3:.1f}" y="{top_pad + ph - 4}" fill="#555">{p.phase}</text>')
    # the peak
    peak_j = next((j for j, p in enumerate(points) if p.index == profile.peak_at.index), None)
    if peak_j is not None:
        px, py = x(peak_j), y(profile.peak)
        at = profile.peak_at
        module = "" if at.module in ("", f"({at.phase})") else at.module
        where = html.escape(f"{at.phase} {module}".strip())
        anchor = "end" if px > left + pw * 0.6 else "start"
        dx = -6 if anchor == "end" else 6
        parts.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{top_pad}" y2="{top_pad + ph}" stroke="#000" '
                     f'stroke-dasharray="4 3"/>')
        parts.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3.5" fill="#000"/>')
        parts.append(f'<text x="{px + dx:.1f}" y="{max(py - 6, top_pad + 10):.1f}" text-anchor="{anchor}" '
                     f'font-weight="600">peak {fmt_bytes(profile.peak)} ({where})</text>')
    # axes and legend
    parts.append(f'<line x1="{left}" x2="{left}" y1="{top_pad}" y2="{top_pad + ph}" stroke="#333"/>')
    parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{top_pad + ph}" y2="{top_pad + ph}" stroke="#333"/>')
    parts.append(f'<text x="{left + pw / 2:.0f}" y="{height - 8}" text-anchor="middle">'
                 f'op in execution order ({n:,} ops)</text>')
    for i, c in enumerate(reversed(cats)):
        ly = top_pad + 8 + 18 * i
        parts.append(f'<rect x="{left + pw + 16}" y="{ly - 9}" width="12" height="12" '
                     f'fill="{CATEGORY_COLORS.get(c, "#999")}"/>')
        parts.append(f'<text x="{left + pw + 34}" y="{ly + 1}">{html.escape(c.replace("_", " "))}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


# -- the memory timeline as a PNG (matplotlib) --------------------------------------------------


def plot(profile: MemoryProfile, path: str, title: str = "") -> None:
    """Draw the stacked live-memory timeline with the peak marked (needs matplotlib: ``[plot]`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise UserError("--plot needs matplotlib: pip install 'estimator[plot]'") from exc
    xs = list(range(len(profile.timeline)))
    cats = [c for c in CATEGORIES if any(p.by_category.get(c) for p in profile.timeline)]
    ys = [[p.by_category.get(c, 0) / 2**20 for p in profile.timeline] for c in cats]
    fig, ax = plt.subplots(figsize=(11, 5))
    ax.stackplot(xs, ys, labels=[c.replace("_", " ") for c in cats])
    peak_x = next((i for i, p in enumerate(profile.timeline) if p.index == profile.peak_at.index), 0)
    ax.axvline(peak_x, color="black", linestyle="--", linewidth=1)
    ax.annotate(f"peak {profile.peak / 2**20:.1f} MiB\n{profile.peak_at.phase} {profile.peak_at.module}",
                (peak_x, profile.peak / 2**20), textcoords="offset points", xytext=(5, -30), fontsize=8)
    phases = [p.phase for p in profile.timeline]
    for ph in ("backward", "optimizer"):
        if ph in phases:
            ax.axvline(phases.index(ph), color="grey", linewidth=0.5)
            ax.text(phases.index(ph), 0, f" {ph}", fontsize=8, color="grey", va="bottom")
    ax.set_xlabel("op (execution order)")
    ax.set_ylabel("live MiB")
    ax.set_title(title or "Live memory over one training step (steady state)")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

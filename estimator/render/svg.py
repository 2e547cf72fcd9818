"""The memory timeline as an inline SVG chart: live bytes after each op stacked by category, each phase
given room in proportion to its ops with a minimum (:data:`MIN_PHASE_SHARE`), the peak marked, the
checkpoint what-if as a dashed line, the GPU's room for the peak (its capacity less the CUDA reserve) as a
line when the report is sized for a GPU; at most ``MAX_SVG_POINTS`` columns (each keeps the highest point
it covers).
"""

from __future__ import annotations

import html
import math
from typing import Any

from ..memory import CATEGORIES, MemoryProfile
from .units import CATEGORY_COLORS, CATEGORY_LABEL, PHASE_NAMES, fmt_bytes

# -- the memory timeline: phases in proportion to their ops -----------------------------------

MAX_SVG_POINTS = 1000
PHASE_ORDER = ("forward", "loss", "backward", "optimizer")
# The least share of the width a phase gets: a ResNet's loss is 5 ops of 1,400 (0.4 %), and would be a
# hairline; equal widths gave it a quarter.  8 % keeps a few-op phase readable and labelled.
MIN_PHASE_SHARE = 0.08
AXIS_WORDS = "phase of the step (width in proportion to its ops, at least 8 %; ops in execution order within it)"


def _phase_of(p: Any) -> str:
    phase = str(p.phase if hasattr(p, "phase") else p[0])
    return "forward" if phase == "start" else phase


def phase_shares(counts: list[int], minimum: float = MIN_PHASE_SHARE) -> list[float]:
    """Each phase's share of the width: in proportion to its ops, at least ``minimum`` (shares summing to 1;
    the phases raised to the minimum take their room from the others in proportion)."""
    if not counts:
        return []
    minimum = min(minimum, 1.0 / len(counts))
    fixed: set[int] = set()
    while True:
        free = 1.0 - minimum * len(fixed)
        rest = sum(c for i, c in enumerate(counts) if i not in fixed) or 1
        shares = [minimum if i in fixed else free * c / rest for i, c in enumerate(counts)]
        low = {i for i, share in enumerate(shares) if share < minimum and i not in fixed}
        if not low:
            return shares
        fixed |= low


def phase_layout(phases: list[str], bands: list[tuple[str, float, float]] | None = None
                 ) -> tuple[list[float], list[tuple[str, float, float]]]:
    """x in [0, 1] for each point of a timeline whose points are in ``phases`` (execution order): each phase
    present gets a width in proportion to its points, at least :data:`MIN_PHASE_SHARE` (or the given
    ``bands``: another timeline drawn on the same axis), and its points are spread evenly across it, edge to
    edge.  Returns the xs and the (phase, start, end) bands."""
    present = [ph for ph in PHASE_ORDER if ph in set(phases)]
    present += [ph for ph in dict.fromkeys(phases) if ph not in present]
    counts = {ph: phases.count(ph) for ph in present}
    if bands is None:
        bands, start = [], 0.0
        for ph, share in zip(present, phase_shares([counts[ph] for ph in present])):
            bands.append((ph, start, start + share))
            start += share
    where = {ph: (a, b) for ph, a, b in bands}
    seen = dict.fromkeys(present, 0)
    xs = []
    for ph in phases:
        a, b = where.get(ph, (0.0, 1.0))
        k, n = seen[ph], counts[ph]
        seen[ph] += 1
        xs.append(a + (b - a) * (k / (n - 1) if n > 1 else 0.5))
    return xs, [band for band in bands if band[0] in counts]


def _columns(totals: list[int], xs: list[float], limit: int) -> list[int]:
    """Indices to draw: at most ``limit`` columns over x in [0, 1], each keeping its largest total (so the peak
    is always drawn)."""
    if len(totals) <= limit:
        return list(range(len(totals)))
    picked: dict[int, int] = {}
    for j, x in enumerate(xs):
        b = min(int(x * limit), limit - 1)
        if b not in picked or totals[j] > totals[picked[b]]:
            picked[b] = j
    return sorted(picked.values())


def unit_for(top: float) -> tuple[str, int]:
    unit_name, unit = "B", 1
    for name, u in (("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30), ("TiB", 2**40)):
        if top >= u:
            unit_name, unit = name, u
    return unit_name, unit


def _nice_step(span: float, ticks: int = 5) -> float:
    raw = span / max(ticks, 1)
    if raw <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag  # pragma: no cover


def timeline_data(profile: MemoryProfile, checkpoint: list[tuple[str, int]] | None = None,
                  limit: int = MAX_SVG_POINTS) -> dict[str, Any]:
    """What the chart draws: per drawn column x (0..1), phase, module, op, total and bytes per category;
    the phase bands; the checkpoint what-if's totals on the same phase axis."""
    points = profile.timeline
    phases = [_phase_of(p) for p in points]
    xs, bands = phase_layout(phases)
    picked = _columns([p.total for p in points], xs, limit)
    cats = [c for c in CATEGORIES if any(points[j].by_category.get(c) for j in picked) or profile.peak_at.by_category.get(c)]
    by_category = [points[j].by_category for j in picked]
    totals = [points[j].total for j in picked]
    peak_k = next((k for k, j in enumerate(picked) if points[j].index == profile.peak_at.index), None)
    if peak_k is not None:  # the timeline holds the bytes after each op; the peak can be reached inside an op
        by_category[peak_k], totals[peak_k] = profile.peak_at.by_category, profile.peak
    data: dict[str, Any] = {
        "x": [round(xs[j], 5) for j in picked],
        "phase": [str(points[j].phase) for j in picked],
        "module": [points[j].module for j in picked],
        "op": [points[j].op for j in picked],
        "total": totals,
        "categories": [str(c) for c in cats],
        "bytes": [[b.get(c, 0) for c in cats] for b in by_category],
        "bands": [[ph, a, b] for ph, a, b in bands],
        "peak": peak_k,
        "index": picked,  # into profile.timeline
    }
    if checkpoint:  # on the step's own phase bands, so that each phase lines up with the step's
        cxs, _ = phase_layout([_phase_of(p) for p in checkpoint], bands)
        cpicked = _columns([t for _, t in checkpoint], cxs, limit)
        data["checkpoint"] = {"x": [round(cxs[j], 5) for j in cpicked], "total": [checkpoint[j][1] for j in cpicked]}
    return data


def on_scale(top: int, limit: int | None) -> bool:
    """Whether a GPU's room for the peak is drawn on the chart's axis: when it is within 3x the highest point
    (beyond, the step's curve would be flattened to the bottom; the limit is then stated in words)."""
    return limit is not None and limit <= 3 * top


def _limit_svg(at: float | None, text: str, x0: float, x1: float, top: float, left_side: bool = False) -> str:
    """The GPU's room for the peak: a dashed red line across the chart at height ``at``, or (None: off the
    scale) a note just above the chart's top edge ``top`` (a line kept for it), at its right end (``left_side``:
    its left end, away from a peak label written leftwards from the right half)."""
    label = html.escape(text)
    if at is None:
        x, anchor = (x0 + 6, "start") if left_side else (x1 - 6, "end")
        return (f'<text x="{x:.1f}" y="{top - 6:.1f}" text-anchor="{anchor}" class="limit">{label} '
                f'(above this scale)</text>')
    return (f'<line x1="{x0:.1f}" x2="{x1:.1f}" y1="{at:.1f}" y2="{at:.1f}" stroke="#c62828" '
            f'stroke-width="1.6" stroke-dasharray="7 4" class="limit"><title>{label}</title></line>'
            f'<text x="{x0 + 6:.1f}" y="{at - 5:.1f}" class="limit">{label}</text>')


def timeline_svg(profile: MemoryProfile, width: int = 1200, height: int = 380,
                 checkpoint: list[tuple[str, int]] | None = None, peak_label: str | None = None,
                 data: dict[str, Any] | None = None, limit: tuple[int, str] | None = None) -> str:
    """The memory timeline as a stacked-area SVG that scales to its container's width: live bytes by
    category, the forward, loss, backward and optimizer phases in proportion to their ops (at least
    :data:`MIN_PHASE_SHARE` each) and labelled, the peak marked, the checkpoint what-if's total as a dashed
    line, and ``limit`` (bytes, words: the GPU's room for the peak) as a red dashed line.  No external
    resources."""
    data = data or timeline_data(profile, checkpoint)
    n = len(data["x"])
    cats = data["categories"]
    top = max(data["total"] + [profile.peak, 1] + (data["checkpoint"]["total"] if "checkpoint" in data else []))
    drawn = on_scale(top, limit[0] if limit else None)
    top = max(top, limit[0]) if drawn else top
    unit_name, unit = unit_for(top)
    step = _nice_step(top / unit)
    y_max = math.ceil(top / unit / step) * step * unit
    # (a limit off the scale gets a line of its own above the plot: the peak's label, near the top, took it)
    left, right, top_pad, bottom = 64, 14, 14 + (18 if limit is not None and not drawn else 0), 46
    pw, ph = width - left - right, height - top_pad - bottom

    def x(v: float) -> float:
        return left + pw * v

    def y(v: float) -> float:
        return top_pad + ph * (1 - v / y_max)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="100%" '
             f'preserveAspectRatio="xMidYMid meet" role="img" aria-label="live memory over one step" '
             f'id="timeline" data-left="{left}" data-width="{pw}" data-top="{top_pad}" data-height="{ph}" '
             f'data-ymax="{y_max}">']
    # phase bands (alternating shade) and their labels under the axis
    for i, (phase, a, b) in enumerate(data["bands"]):
        if i % 2:
            parts.append(f'<rect x="{x(a):.1f}" y="{top_pad}" width="{x(b) - x(a):.1f}" height="{ph}" fill="#f4f4f4"/>')
        parts.append(f'<text x="{(x(a) + x(b)) / 2:.1f}" y="{top_pad + ph + 30}" text-anchor="middle" '
                     f'class="phase">{html.escape(PHASE_NAMES.get(phase, phase))}</text>')
        if i:
            parts.append(f'<line x1="{x(a):.1f}" x2="{x(a):.1f}" y1="{top_pad}" y2="{top_pad + ph + 6}" '
                         f'stroke="#999" stroke-width="1"/>')
    # grid and y axis
    v = 0.0
    while v <= y_max / unit + 1e-9:
        yy = y(v * unit)
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#e2e2e2"/>')
        parts.append(f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{v:g} {unit_name}</text>')
        v += step
    # stacked areas, bottom category first
    base = [0.0] * n
    for ci, c in enumerate(cats):
        upper = [base[k] + data["bytes"][k][ci] for k in range(n)]
        fwd = " ".join(f"{x(data['x'][k]):.1f},{y(upper[k]):.1f}" for k in range(n))
        back = " ".join(f"{x(data['x'][k]):.1f},{y(base[k]):.1f}" for k in reversed(range(n)))
        most = max(data["bytes"][k][ci] for k in range(n)) if n else 0
        parts.append(f'<polygon points="{fwd} {back}" fill="{CATEGORY_COLORS.get(c, "#999")}" fill-opacity="0.88">'
                     f'<title>{html.escape(CATEGORY_LABEL.get(c, c))}: up to {fmt_bytes(most)}</title></polygon>')
        base = upper
    # the checkpoint what-if's total, on the same phase axis
    if "checkpoint" in data:
        ck = data["checkpoint"]
        pts = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in zip(ck["x"], ck["total"]))
        parts.append(f'<polyline points="{pts}" fill="none" stroke="#111" stroke-width="1.6" '
                     f'stroke-dasharray="5 3" class="checkpoint"><title>with activation checkpointing: peak '
                     f'{fmt_bytes(max(ck["total"]))}</title></polyline>')
    # the peak
    k = data["peak"]
    anchor = "start"
    if k is not None:
        px, py = x(data["x"][k]), y(profile.peak)
        label = html.escape(peak_label or f"peak {fmt_bytes(profile.peak)}")
        anchor = "end" if px > left + pw * 0.6 else "start"
        dx = -7 if anchor == "end" else 7
        parts.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{top_pad}" y2="{top_pad + ph}" stroke="#000" '
                     f'stroke-dasharray="4 3"/>')
        parts.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="4" fill="#000"/>')
        parts.append(f'<text x="{px + dx:.1f}" y="{max(py - 8, top_pad + 12):.1f}" text-anchor="{anchor}" '
                     f'class="peak">{label}</text>')
    if limit is not None:
        parts.append(_limit_svg(y(limit[0]) if drawn else None, limit[1], left, left + pw, top_pad, anchor == "end"))
    # axes, cursor (moved by the page's script) and the x-axis title
    parts.append(f'<line x1="{left}" x2="{left}" y1="{top_pad}" y2="{top_pad + ph}" stroke="#333"/>')
    parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{top_pad + ph}" y2="{top_pad + ph}" stroke="#333"/>')
    parts.append(f'<line id="cursor" x1="{left}" x2="{left}" y1="{top_pad}" y2="{top_pad + ph}" stroke="#d62728" '
                 f'stroke-width="1.2" visibility="hidden"/>')
    parts.append(f'<text x="{left + pw / 2:.0f}" y="{height - 2}" text-anchor="middle" class="axis">'
                 f'{AXIS_WORDS}</text>')
    parts.append("</svg>")
    return "\n".join(parts)

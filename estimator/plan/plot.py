"""Plans as an image (``estimator plan --plot plan.png``; PNG, SVG or PDF through matplotlib, an optional
extra): one GPU's memory under each layout (the rows of the peak stacked, the reserve on top, the GPU's
capacity dashed) beside the step time (compute, the communication the compute waits for, the communication
it hides, host transfers).  The palette and words are the HTML page's (:mod:`.html`).
"""

from __future__ import annotations

from typing import Any

from ..errors import UserError
from .html import ROW_COLORS, ROW_LABELS, TIME_PARTS, label, memory_parts, plans_of, time_parts


def plot_plan(result: Any, path: str, title: str, fmt: str | None = None) -> None:
    """Draw ``result`` (a :class:`~.report.Plan` or :class:`~.report.Comparison`) to ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise UserError("--plot needs matplotlib: pip install 'estimator[plot]'") from exc
    plans = plans_of(result)
    names = [label(p) for p in plans]
    # laid out by hand in inches: the bars, then the x labels, then the legends below the axes (they cover no bar)
    legend_h = 0.22 * 6 + 0.2
    height = 0.45 * len(plans) + 1.0 + 0.6 + legend_h
    fig = Figure(figsize=(13, height))
    FigureCanvasAgg(fig)
    left = min(0.45, 0.12 + 0.0075 * max(len(n) for n in names))
    fig.subplots_adjust(left=left, right=0.98, top=1 - 0.75 / height, bottom=(legend_h + 0.6) / height, wspace=0.06)
    mem, tim = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 2]})
    ys = list(range(len(plans)))[::-1]  # the first plan on top, as in the table
    gib = 2**30
    drawn: set[str] = set()
    for y, p in zip(ys, plans):
        left = 0.0
        for row, nbytes in memory_parts(p):
            mem.barh(y, nbytes / gib, left=left, color=ROW_COLORS.get(row, "#999"), height=0.6,
                     label=None if row in drawn else ROW_LABELS.get(row, row))
            drawn.add(row)
            left += nbytes / gib
        mem.plot([p.verdict.capacity / gib] * 2, [y - 0.42, y + 0.42], "--", color="#111", linewidth=1.6,
                 label=None if "capacity" in drawn else "capacity of the GPU")
        drawn.add("capacity")
    mem.set_yticks(ys, names)
    mem.set_xlabel("memory of one GPU (GiB)")
    mem.set_title("Memory of one GPU at the step's peak", fontsize=10)
    colors = {k: c for k, _, c in TIME_PARTS}
    words = {k: w for k, w, _ in TIME_PARTS}
    seen: set[str] = set()
    for y, p in zip(ys, plans):
        left = 0.0
        for part, seconds in time_parts(p):
            if seconds <= 0:
                continue
            tim.barh(y, seconds * 1e3, left=left, color=colors[part], height=0.6,
                     label=None if part in seen else words[part])
            seen.add(part)
            left += seconds * 1e3
    tim.set_xlabel("step time (ms)")
    tim.set_title("Step time and its communication", fontsize=10)
    for ax, ncol in ((mem, 2), (tim, 1)):
        ax.grid(axis="x", color="#e2e2e2")
        ax.set_axisbelow(True)
        ax.legend(loc="upper left", bbox_to_anchor=(ax.get_position().x0, legend_h / height), ncol=ncol,
                  bbox_transform=fig.transFigure, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10.5)
    fig.savefig(path, dpi=110, format=fmt or (path.rsplit(".", 1)[-1].lower() if "." in path else "png"))

"""The memory timeline as an image file (PNG, SVG or PDF through matplotlib, an optional extra).
"""

from __future__ import annotations

from typing import Any

from ..errors import UserError
from .svg import AXIS_WORDS, on_scale, timeline_data, unit_for
from .units import CATEGORY_COLORS, CATEGORY_LABEL, PHASE_NAMES, fmt_bytes
from .words import gpu_limit, inputs_words, place, training

# -- the memory timeline as an image (matplotlib) --------------------------------------------------

PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def plot_formats() -> tuple[str, ...]:
    """The suffixes ``--plot`` writes: .png, .svg and .pdf where this matplotlib can write them."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        supported = FigureCanvasAgg(Figure()).get_supported_filetypes()
    except ImportError:
        return ()
    return tuple(s for s in PLOT_SUFFIXES if s[1:] in supported)


def plot(report: Any, path: str, title: str = "", fmt: str | None = None) -> None:
    """Draw the stacked live-memory timeline with the peak marked (needs matplotlib: ``[plot]`` extra):
    the HTML report's palette and units, phases in proportion to their ops (at least 8 % each), the
    checkpoint what-if dashed, the GPU's room for the peak as a red dashed line (``--gpu``), the legend
    below the axes (it covers no curve).
    ``report``: a :class:`~estimator.report.Report` (title with batch, sequence and precision) or a
    :class:`~estimator.memory.MemoryProfile`; ``fmt``: png, svg or pdf (default: from the suffix)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise UserError("--plot needs matplotlib: pip install 'estimator[plot]'") from exc
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text in an SVG
        _draw_plot(report, path, title, fmt, Figure, FigureCanvasAgg)


def _draw_plot(report: Any, path: str, title: str, fmt: str | None, Figure: Any, FigureCanvasAgg: Any) -> None:
    profile = report.memory if hasattr(report, "memory") else report
    ck = report.checkpoint.timeline if getattr(report, "checkpoint", None) else None
    data = timeline_data(profile, ck, limit=4000)
    cats = data["categories"]
    top = max(data["total"] + [profile.peak, 1] + (data["checkpoint"]["total"] if "checkpoint" in data else []))
    limit = gpu_limit(report) if hasattr(report, "capture") else None
    drawn = on_scale(top, limit[0] if limit else None)
    top = max(top, limit[0]) if drawn else top
    unit_name, unit = unit_for(top)
    fig = Figure(figsize=(12, 6.2))
    FigureCanvasAgg(fig)
    # the axes above, the legend in the band below them (inches: 1.45 of 6.2), where it covers no curve
    fig.subplots_adjust(left=0.07, right=0.98, top=0.9, bottom=1.45 / 6.2)
    ax = fig.add_subplot()
    ys = [[b[i] / unit for b in data["bytes"]] for i in range(len(cats))]
    ax.stackplot(data["x"], ys, labels=[CATEGORY_LABEL.get(c, c) for c in cats],
                 colors=[CATEGORY_COLORS.get(c, "#999") for c in cats], alpha=0.88)
    if "checkpoint" in data:
        names = ", ".join(report.checkpoint.classes)
        ax.plot(data["checkpoint"]["x"], [v / unit for v in data["checkpoint"]["total"]], "--", color="#111",
                linewidth=1.3, label=f"with checkpointing of {names}")
    for i, (phase, a, b) in enumerate(data["bands"]):
        if i:
            ax.axvline(a, color="#999", linewidth=0.8)
    ax.set_xticks([(a + b) / 2 for _, a, b in data["bands"]], [PHASE_NAMES.get(p, p) for p, _, _ in data["bands"]])
    ax.tick_params(axis="x", length=0)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, top / unit * 1.08)
    k = data["peak"]
    if k is not None:
        px, py = data["x"][k], profile.peak / unit
        ax.axvline(px, color="#555", linestyle=":", linewidth=0.9, alpha=0.7)
        ax.plot([px], [py], "o", color="black", markersize=4)
        where = place(report, profile.peak_at) if hasattr(report, "capture") else f"{profile.peak_at.phase}"
        ax.annotate(f"peak {fmt_bytes(profile.peak)}\n{where}", (px, py), textcoords="offset points",
                    xytext=(-8 if px > 0.6 else 8, -4), ha="right" if px > 0.6 else "left", va="top", fontsize=8.5,
                    fontweight="bold")
    if limit is not None and drawn:
        ax.axhline(limit[0] / unit, color="#c62828", linestyle="--", linewidth=1.4, label=limit[1])
    elif limit is not None:
        ax.text(0.995, 0.98, f"{limit[1]} (above this scale)", transform=ax.transAxes, ha="right", va="top",
                fontsize=8, color="#c62828")
    ax.set_ylabel(f"live memory ({unit_name})")
    ax.set_xlabel(AXIS_WORDS)
    if not title and hasattr(report, "capture"):
        what = "training step (steady state)" if training(report) else "forward pass"
        details = ", ".join(w for w in (inputs_words(report), report.precision, report.device) if w)
        title = f"{report.model_name or 'model'}: live memory over one {what}\n{details}"
    ax.set_title(title or "Live memory over one training step (steady state)", fontsize=10.5)
    ax.legend(loc="upper left", bbox_to_anchor=(0.07, 0.95 / 6.2), bbox_transform=fig.transFigure, fontsize=8,
              ncol=3, frameon=False)
    ax.grid(axis="y", color="#e2e2e2")
    ax.set_axisbelow(True)
    fig.savefig(path, dpi=110, format=fmt or (path.rsplit(".", 1)[-1].lower() if "." in path else "png"))

"""The estimate as people read it (tables) and as programs read it (a dict / JSON).

Memory is shown in binary units (KiB, MiB, GiB = 2**10, 2**20, 2**30 bytes);
the dict holds exact bytes.  FLOPs follow the project convention: one
multiply-add is 2 FLOPs.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
from dataclasses import dataclass
from typing import Any

import torch.fx as fx
from tabulate import tabulate

from .capture import INPUT_MODULE, LOSS_MODULE, Capture
from .memory import CATEGORIES, MemoryProfile
from .tally import ModuleTally, Tally

SCHEMA_VERSION = 1


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


def _depth_of(path: str) -> int:
    return 0 if path == "" else path.count(".") + 1


def _truncate(path: str, depth: int) -> str:
    if path in (LOSS_MODULE, INPUT_MODULE) or path == "":
        return path
    return ".".join(path.split(".")[:depth])


@dataclass
class ModuleRow:
    path: str
    type: str
    output_shape: str
    params: int
    activations: int
    flops_forward: int
    flops_backward: int
    percent: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class CheckpointWhatIf:
    """The same step with activation checkpointing on every instance of ``classes``."""

    classes: list[str]
    peak: int
    peak_saved: int
    flops_backward: int
    flops_added: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Report:
    """The estimate of one training step.  ``print(report)`` shows tables; ``to_dict()`` is JSON-ready."""

    capture: Capture
    tally: Tally
    model_name: str = ""
    depth: int = 2
    memory: MemoryProfile | None = None
    device: str = "cuda"
    precision: str = "fp32"
    mode: str = "train"
    checkpoint: CheckpointWhatIf | None = None

    # -- access ---------------------------------------------------------------
    @property
    def graph(self) -> fx.Graph:
        """The captured fx graph of the step (forward, loss, backward, optimizer) in execution order."""
        return self.capture.graph

    def to_networkx(self):
        """The captured graph as a ``networkx.DiGraph`` (node name -> attributes; edges are data flow)."""
        from .graph import to_networkx

        return to_networkx(self.capture.records)

    @property
    def unsupported_ops(self) -> list[dict[str, Any]]:
        return self.tally.unsupported

    # -- module table ---------------------------------------------------------
    def module_rows(self, depth: int | None = None) -> list[ModuleRow]:
        """One row per module at ``depth`` (plus (loss) and (input)); rows sum to the totals."""
        depth = self.depth if depth is None else depth
        t = self.tally
        groups: dict[str, list[ModuleTally]] = {}
        for path, m in t.modules.items():
            groups.setdefault(_truncate(path, depth), []).append(m)
        total = (t.flops["forward"] + t.flops["backward"]) or 1
        rows = []
        for key, members in groups.items():
            fwd = sum(m.flops_forward for m in members)
            bwd = sum(m.flops_backward for m in members)
            params = sum(m.params for m in members)
            saved = sum(m.saved_bytes for m in members)
            if key in (LOSS_MODULE, INPUT_MODULE) and not (fwd or bwd or params or saved):
                continue
            shapes = self.capture.module_outputs.get(key, [])
            rows.append(
                ModuleRow(
                    path=key or "(root)",
                    type=self.capture.module_types.get(key, ""),
                    output_shape=", ".join("x".join(map(str, s)) or "scalar" for s in shapes),
                    params=params,
                    activations=saved,
                    flops_forward=fwd,
                    flops_backward=bwd,
                    percent=100.0 * (fwd + bwd) / total,
                )
            )
        return rows

    # -- dict / JSON ----------------------------------------------------------
    def to_dict(self, depth: int | None = None) -> dict[str, Any]:
        t = self.tally
        return {
            "schema_version": SCHEMA_VERSION,
            "model": self.model_name,
            "capture": self.capture.mode,
            "capture_fallback": self.capture.fallback_reason,
            "loss": self.capture.loss_source,
            "optimizer": self.capture.optimizer_name,
            "device": self.device,
            "precision": self.precision,
            "mode": self.mode,
            "params": {"total": t.params_total, "trainable": t.params_trainable},
            "memory": {
                "parameters": t.parameters_bytes,
                "buffers": t.buffers_bytes,
                "gradients": t.gradients_bytes,
                "optimizer_state": t.optimizer_state_bytes,
                "activations": t.activations_bytes,
                "inputs": t.inputs_bytes,
                "by_dtype": {("activations" if k == "saved" else k + "s" if k in ("parameter", "buffer", "gradient", "input")
                              else k): v for k, v in t.memory_by_dtype.items()},
                **(self.memory.to_dict() if self.memory else {}),
            },
            "flops": {
                "forward": t.flops["forward"],
                "backward": t.flops["backward"],
                "total": t.flops["forward"] + t.flops["backward"],
                "matmul_forward": t.flops["matmul_forward"],
                "matmul_backward": t.flops["matmul_backward"],
                "optimizer": t.flops["optimizer"],
                "by_dtype": dict(t.flops_by_dtype),
            },
            "checkpoint": self.checkpoint.to_dict() if self.checkpoint else None,
            "modules": [r.to_dict() for r in self.module_rows(depth)],
            "unsupported_ops": list(t.unsupported),
        }

    # -- text -----------------------------------------------------------------
    def summary_rows(self) -> list[tuple[str, str]]:
        t = self.tally
        fwd, bwd = t.flops["forward"], t.flops["backward"]
        mm = t.flops["matmul_forward"] + t.flops["matmul_backward"]
        rows = [
            ("Parameters", f"{fmt_count(t.params_total)} ({fmt_count(t.params_trainable)} trainable)"),
            ("Loss", self.capture.loss_source),
            ("Optimizer", self.capture.optimizer_name or "none"),
            ("Target", f"{self.device}, {self.precision}, {self.mode}"),
            ("Memory: parameters", fmt_bytes(t.parameters_bytes)),
            ("Memory: buffers", fmt_bytes(t.buffers_bytes)),
            ("Memory: gradients", fmt_bytes(t.gradients_bytes)),
            ("Memory: optimizer state", fmt_bytes(t.optimizer_state_bytes)),
            ("Memory: activations (saved for backward)", fmt_bytes(t.activations_bytes)
             + _dtype_note(t.memory_by_dtype.get("saved", {}))),
        ]
        if self.memory is not None:
            m = self.memory
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
        if self.checkpoint:
            c = self.checkpoint
            rows.append((f"What-if: checkpoint {', '.join(c.classes)}",
                         f"peak {fmt_bytes(c.peak)} (saves {fmt_bytes(c.peak_saved)}), "
                         f"backward +{fmt_flops(c.flops_added)}"))
        if t.flops["optimizer"]:
            rows.append(("FLOPs: optimizer step", fmt_flops(t.flops["optimizer"])))
        if self.capture.fallback_reason:
            where = "real CPU tensors" if self.capture.mode == "real" else "fake tensors"
            rows.append(("Capture", f"{where} ({self.capture.fallback_reason})"))
        return rows

    def module_table(self, depth: int | None = None, tablefmt: str = "simple") -> str:
        headers = ["Module", "Type", "Output shape", "Params", "Saved activations", "Fwd FLOPs", "Bwd FLOPs", "%"]
        rows = self.module_rows(depth)
        body = [
            [r.path, r.type, r.output_shape, fmt_count(r.params), fmt_bytes(r.activations),
             fmt_flops(r.flops_forward), fmt_flops(r.flops_backward), f"{r.percent:.1f}"]
            for r in rows
        ]
        t = self.tally
        body.append(["Total", "", "", fmt_count(t.params_total), fmt_bytes(t.activations_bytes),
                     fmt_flops(t.flops["forward"]), fmt_flops(t.flops["backward"]), "100.0"])
        return tabulate(body, headers=headers, tablefmt=tablefmt, disable_numparse=True)

    def unsupported_table(self, tablefmt: str = "simple") -> str:
        if not self.tally.unsupported:
            return ""
        body = [[r["op"], r["count"], r["module"]] for r in self.tally.unsupported]
        return tabulate(body, headers=["Op without a cost rule", "Count", "Module"], tablefmt=tablefmt)

    def render(self, tablefmt: str = "simple", depth: int | None = None) -> str:
        title = f"Training-step estimate{f' of {self.model_name}' if self.model_name else ''}"
        parts = [
            title,
            tabulate(self.summary_rows(), tablefmt=tablefmt, disable_numparse=True),
            f"Per module (depth {self.depth if depth is None else depth})",
            self.module_table(depth, tablefmt),
        ]
        unsupported = self.unsupported_table(tablefmt)
        if unsupported:
            parts += ["Not counted (no rule; FLOPs of these ops are missing from the totals)", unsupported]
        return "\n\n".join(parts) + "\n"

    def to_markdown(self, depth: int | None = None) -> str:
        return self.render("github", depth)

    # -- csv ------------------------------------------------------------------
    CSV_COLUMNS = ("path", "type", "output_shape", "params", "activations", "flops_forward", "flops_backward",
                   "percent")

    def to_csv(self, depth: int | None = None) -> str:
        """One row per module at ``depth`` (the JSON ``modules`` rows): exact integers, bytes and FLOPs."""
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(self.CSV_COLUMNS)
        for r in self.module_rows(depth):
            d = r.to_dict()
            d["percent"] = f"{r.percent:.4f}"
            writer.writerow([d[c] for c in self.CSV_COLUMNS])
        return buf.getvalue()

    # -- html -----------------------------------------------------------------
    def to_html(self, depth: int | None = None) -> str:
        """A self-contained page (inline CSS and SVG, no scripts or external resources): the summary,
        the per-module table, the memory timeline of the steady-state step, and the JSON of
        :meth:`to_dict` in a ``<script type="application/json" id="estimate-json">`` block."""
        esc = html.escape
        title = f"Training-step estimate{f' of {self.model_name}' if self.model_name else ''}"
        summary = "\n".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in self.summary_rows())
        rows = self.module_rows(depth)
        t = self.tally
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
        if self.memory is not None and self.memory.timeline:
            timeline = ("<h2>Memory over one training step</h2><p>Live bytes after each op of a steady-state "
                        "step (optimizer state already allocated), stacked by category"
                        + (", each allocation rounded to the CUDA caching allocator's 512-byte blocks"
                           if self.device == "cuda" else "") + ".</p>" + timeline_svg(self.memory))
        data = json.dumps(self.to_dict(depth), indent=1).replace("</", "<\\/")
        depth_text = self.depth if depth is None else depth
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

    def __str__(self) -> str:
        return self.render()


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

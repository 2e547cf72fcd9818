"""The self-contained HTML report: headline, summary, memory timeline with hover, module tree,
per-operator table, and the JSON of ``to_dict()`` in ``<script id="estimate-json">``.
"""

from __future__ import annotations

import html
import json
from typing import Any

from ..capture import INPUT_MODULE, LOSS_MODULE
from ..results import ReportData
from .json_dict import to_dict
from .svg import timeline_data, timeline_svg
from .text import summary_rows
from .units import CATEGORY_COLORS, CATEGORY_LABEL, SCHEMA_VERSION, fmt_bytes, fmt_count, fmt_flops
from .words import STAGE_WORDS, gpu_limit, headline, inputs_words, place, title, training

# -- html -----------------------------------------------------------------


def _module_tree(report: ReportData) -> dict[str, Any]:
    """Every module with its subtree's totals: params, parameter bytes, saved activations, FLOPs."""
    t = report.tally
    nodes: dict[str, dict[str, Any]] = {}

    def node(path: str) -> dict[str, Any]:
        if path not in nodes:
            nodes[path] = {"path": path, "type": report.capture.module_types.get(path, ""), "children": [],
                           "params": 0, "param_bytes": 0, "saved": 0, "fwd": 0, "bwd": 0}
            if path not in ("",) and not path.startswith("("):
                parent = path.rpartition(".")[0]
                node(parent)["children"].append(path)
        return nodes[path]

    node("")
    for path in report.capture.module_types:
        node(path)
    for path, m in t.modules.items():
        if path.startswith("("):
            continue
        for anc in [""] + [".".join(path.split(".")[:i]) for i in range(1, path.count(".") + 2) if path]:
            n = node(anc)
            n["params"] += m.params
            n["param_bytes"] += m.param_bytes
            n["saved"] += m.saved_bytes
            n["fwd"] += m.flops_forward
            n["bwd"] += m.flops_backward
    return nodes


def _tree_html(report: ReportData) -> str:
    nodes = _module_tree(report)
    t = report.tally
    root = nodes[""]
    mem_max = max(root["param_bytes"] + root["saved"], 1)
    flop_max = max(t.flops["forward"] + t.flops["backward"], 1)
    train = training(report)
    esc = html.escape

    def bars(n: dict[str, Any]) -> str:
        pw = 100.0 * n["param_bytes"] / mem_max
        sw = 100.0 * n["saved"] / mem_max
        fw = 100.0 * n["fwd"] / flop_max
        bw = 100.0 * n["bwd"] / flop_max
        mem = (f'<span class="bar"><i class="b-param" style="width:{pw:.2f}%"></i>'
               f'<i class="b-saved" style="width:{sw:.2f}%"></i></span>')
        flops = (f'<span class="bar"><i class="b-fwd" style="width:{fw:.2f}%"></i>'
                 f'<i class="b-bwd" style="width:{bw:.2f}%"></i></span>')
        flop_text = fmt_flops(n["fwd"] + n["bwd"])
        saved = (f'<span class="num" title="{n["saved"]:,} bytes saved for backward">{fmt_bytes(n["saved"])}</span>'
                 if train else "")
        return (f'<span class="num" title="{n["params"]:,} parameters">{fmt_count(n["params"])}</span>'
                f'<span class="num" title="{n["param_bytes"]:,} bytes">{fmt_bytes(n["param_bytes"])}</span>{saved}{mem}'
                f'<span class="num" title="forward {n["fwd"]:,} + backward {n["bwd"]:,} FLOPs">{flop_text}</span>{flops}')

    def row(n: dict[str, Any], depth: int) -> str:
        name = n["path"].rpartition(".")[2] if n["path"] else "(root)"
        label = (f'<span class="name" style="padding-left:{depth * 1.1:.1f}em" title="{esc(n["path"] or "(root)")}">'
                 f'{esc(name)} <em>{esc(n["type"])}</em></span>')
        line = f'<span class="row">{label}{bars(n)}</span>'
        kids = [nodes[c] for c in n["children"]]
        if not kids:
            return f'<div class="leaf">{line}</div>'
        inner = "".join(row(k, depth + 1) for k in kids)
        return f'<details{" open" if depth < 2 else ""}><summary>{line}</summary>{inner}</details>'

    extra = ""
    for special in (LOSS_MODULE, INPUT_MODULE):
        m = t.modules.get(special)
        if m is not None and (m.flops_forward or m.flops_backward or m.saved_bytes):
            n = {"path": special, "type": "outside the model" if special == LOSS_MODULE else "saved inputs",
                 "children": [], "params": 0, "param_bytes": 0, "saved": m.saved_bytes, "fwd": m.flops_forward,
                 "bwd": m.flops_backward}
            extra += row(n, 0)
    head = ('<div class="row head"><span class="name">Module <em>type</em></span><span class="num">Params</span>'
            f'<span class="num">Weights</span>{"<span class=num>Saved act.</span>" if train else ""}<span class="bar-h">'
            f'<i class="b-param"></i>weights{"<i class=b-saved></i>saved activations" if train else ""}</span>'
            '<span class="num">FLOPs</span><span class="bar-h"><i class="b-fwd"></i>forward'
            f'{"<i class=b-bwd></i>backward" if train else ""}</span></div>')
    return f'<div class="tree{" train" if train else ""}">{head}{row(root, 0)}{extra}</div>'


def _peak_panel(report: ReportData) -> str:
    """The details of the peak (what the hover panel shows before the mouse moves)."""
    m = report.memory
    at = m.peak_at
    items = "".join(f'<li><i style="background:{CATEGORY_COLORS.get(str(k), "#999")}"></i>'
                    f'{html.escape(CATEGORY_LABEL.get(str(k), str(k)))} <b>{fmt_bytes(v)}</b></li>'
                    for k, v in at.by_category.items() if v)
    return (f'<div id="point"><div class="where"><b id="pt-title">At the peak: {fmt_bytes(m.peak)}</b>'
            f'<span id="pt-place">{html.escape(place(report, at))}</span>'
            f'<span id="pt-op" class="mono">{html.escape(at.op)}</span></div><ul id="pt-bytes">{items}</ul></div>')


_SCRIPT = """
(function () {
  var svg = document.getElementById("timeline"), data = JSON.parse(document.getElementById("timeline-data").textContent);
  if (!svg || !data.x.length) return;
  var left = +svg.dataset.left, width = +svg.dataset.width, cursor = document.getElementById("cursor");
  var names = data.labels, colors = data.colors, phases = data.phase_names;
  function fmt(n) { var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0; while (Math.abs(n) >= 1024 && i < 4) { n /= 1024; i++; }
    return i ? n.toFixed(2) + " " + u[i] : n + " B"; }
  function show(k) {
    var x = left + width * data.x[k];
    cursor.setAttribute("x1", x); cursor.setAttribute("x2", x); cursor.setAttribute("visibility", "visible");
    document.getElementById("pt-title").textContent = "Live: " + fmt(data.total[k]) + (k === data.peak ? " (the peak)" : "");
    document.getElementById("pt-place").textContent = data.place[k];
    document.getElementById("pt-op").textContent = data.op[k];
    var ul = document.getElementById("pt-bytes"); ul.innerHTML = "";
    data.categories.forEach(function (c, i) { if (!data.bytes[k][i]) return;
      var li = document.createElement("li"), sw = document.createElement("i"), b = document.createElement("b");
      sw.style.background = colors[c]; b.textContent = fmt(data.bytes[k][i]);
      li.appendChild(sw); li.appendChild(document.createTextNode(names[c] + " ")); li.appendChild(b); ul.appendChild(li); });
  }
  function nearest(evt) {
    var pt = svg.createSVGPoint(); pt.x = evt.clientX; pt.y = evt.clientY;
    var v = (pt.matrixTransform(svg.getScreenCTM().inverse()).x - left) / width, lo = 0, hi = data.x.length - 1;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (data.x[mid] < v) lo = mid + 1; else hi = mid; }
    if (lo > 0 && Math.abs(data.x[lo - 1] - v) < Math.abs(data.x[lo] - v)) lo--;
    return lo;
  }
  svg.addEventListener("mousemove", function (e) { show(nearest(e)); });
  var m = /[#&]at=(\\d+|peak)/.exec(location.hash);
  if (m) show(m[1] === "peak" ? data.peak : Math.min(+m[1], data.x.length - 1));
})();
"""


def _timeline_section(report: ReportData, train: bool) -> tuple[str, str]:
    """The memory chart with its legend, note and peak panel, and the JSON the hover script reads
    (both empty without a timeline)."""
    esc = html.escape
    timeline = ""
    timeline_json = ""
    if report.memory is not None and report.memory.timeline:
        m = report.memory
        ck = report.checkpoint.timeline if report.checkpoint and report.checkpoint.timeline else None
        data = timeline_data(m, ck)
        picked_places = [place(report, m.timeline[j]) for j in data["index"]]
        client = {"x": data["x"], "phase": data["phase"], "op": data["op"], "total": data["total"],
                  "categories": data["categories"], "bytes": data["bytes"], "peak": data["peak"],
                  "place": picked_places, "labels": {c: CATEGORY_LABEL.get(c, c) for c in data["categories"]},
                  "colors": {c: CATEGORY_COLORS.get(c, "#999") for c in data["categories"]}}
        timeline_json = json.dumps(client, separators=(",", ":")).replace("</", "<\\/")
        legend = "".join(f'<span><i style="background:{CATEGORY_COLORS.get(c, "#999")}"></i>'
                         f'{esc(CATEGORY_LABEL.get(c, c))}</span>' for c in reversed(data["categories"]))
        if report.gpu is not None and gpu_limit(report) is not None:
            legend += f'<span><i class="dash limit"></i>{esc(gpu_limit(report)[1])}</span>'
        if ck:
            legend += (f'<span><i class="dash"></i>with checkpointing of {esc(", ".join(report.checkpoint.classes))} '
                       f'(peak {fmt_bytes(report.checkpoint.peak)})</span>')
        note = ("Live bytes after each op" + (" of a steady-state step (optimizer state already allocated)" if train
                                                else " of the forward pass")
                + (", each allocation rounded to the CUDA caching allocator's 512-byte blocks" if report.device == "cuda"
                   else "") + ". Hover the chart to see any point; the panel shows the peak until then.")
        svg = timeline_svg(m, checkpoint=ck, data=data, limit=gpu_limit(report),
                           peak_label=f"peak {fmt_bytes(m.peak)}: {place(report, m.peak_at)}")
        over = "one training step" if train else "one forward pass"
        if report.generation is not None:
            over = f"the {STAGE_WORDS[report.generation.binding]} of generate() (the step with the higher peak)"
        timeline = (f'<h2>Memory over {over}</h2><p class="note">{esc(note)}</p>'
                    f'<div class="legend">{legend}</div><div class="chart scroll">{svg}</div>{_peak_panel(report)}')
    return timeline, timeline_json


def _no_gradient_section(t: Any) -> str:
    """Trainable parameters that get no gradient (empty when every one gets one)."""
    esc = html.escape
    missing = ""
    if t.no_gradient:
        rows_ = "".join(f"<tr><td class=mono>{esc(r['module'] or '(root)')}</td><td>{esc(r['type'])}</td>"
                        f"<td class=num>{fmt_count(r['count'])}</td><td class=num>{fmt_bytes(r['bytes'])}</td>"
                        f"<td class=mono>{esc(', '.join(r['params'][:4]) + (' ...' if len(r['params']) > 4 else ''))}"
                        f"</td></tr>" for r in t.no_gradient)
        missing = ("<h2 class=warn>Trainable parameters that get no gradient</h2><p>They are trainable but nothing in "
                   "this step reaches them: check that the inputs feed every part of the model, or freeze them "
                   "(<code>requires_grad=False</code>).</p><table><thead><tr><th>Module</th><th>Type</th><th>Params</th>"
                   f"<th>Bytes</th><th>Parameters</th></tr></thead><tbody>{rows_}</tbody></table>")
    return missing


def _operators_section(t: Any, train: bool) -> str:
    """The 40 aten ops with the most FLOPs (or saved bytes), with their share of the FLOPs."""
    esc = html.escape
    total_flops = sum(r["flops_forward"] + r["flops_backward"] for r in t.by_operator) or 1
    op_rows = []
    for r in [r for r in t.by_operator if r["flops_forward"] + r["flops_backward"] or r["saved_bytes"]][:40]:
        share = 100.0 * (r["flops_forward"] + r["flops_backward"]) / total_flops
        op_rows.append(f"<tr><td class=mono>{esc(r['op'].removeprefix('aten.'))}</td><td class=num>{r['count']:,}</td>"
                       f"<td class=num title=\"{r['flops_forward']:,}\">{fmt_flops(r['flops_forward'])}</td>"
                       + (f"<td class=num title=\"{r['flops_backward']:,}\">{fmt_flops(r['flops_backward'])}</td>"
                          f"<td class=num title=\"{r['saved_bytes']:,} bytes\">{fmt_bytes(r['saved_bytes'])}</td>"
                          if train else "")
                       + f"<td class=share><span class=bar><i class=b-fwd style=\"width:{share:.2f}%\"></i></span>"
                         f"{share:.1f}%</td></tr>")
    operators = ("<h2>Per operator</h2><details open><summary>aten ops by FLOPs"
                 + (" (forward + backward)" if train else "")
                 + (" and the bytes they save for backward" if train else "") + "</summary><table><thead><tr><th>Op</th>"
                 "<th>Calls</th><th>Fwd FLOPs</th>" + ("<th>Bwd FLOPs</th><th>Saved for backward</th>" if train else "")
                 + f"<th>% FLOPs</th></tr></thead><tbody>{''.join(op_rows)}</tbody></table></details>") if op_rows else ""
    return operators


def _unsupported_section(t: Any) -> str:
    """Ops without a cost rule, by name, count and module (empty when every op has one)."""
    esc = html.escape
    unsupported = ""
    if t.unsupported:
        urows = "\n".join(f"<tr><td class=mono>{esc(str(u['op']))}</td><td class=num>{u['count']}</td>"
                          f"<td class=mono>{esc(str(u['module'] or '(root)'))}</td></tr>" for u in t.unsupported)
        unsupported = ("<h2>Not counted</h2><p>Ops without a cost rule: their FLOPs are missing from the "
                       "totals.</p><table><thead><tr><th>Op</th><th>Count</th><th>Module</th></tr></thead>"
                       f"<tbody>{urows}</tbody></table>")
    return unsupported


_STYLE = """body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; padding: 1.2em 2em;
       color: #222; }
h1 { font-size: 1.45em; margin: 0 0 0.15em; }
h2 { font-size: 1.15em; margin-top: 1.8em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
h2.warn { color: #b00020; }
p.sub { color: #555; margin: 0 0 0.8em; }
.headline { font-size: 1.2em; font-weight: 600; padding: 0.6em 0.9em; border-radius: 6px; margin: 0.4em 0 1em;
            border-left: 6px solid #4e79a7; background: #eef3f9; }
.headline.fits { border-color: #2e7d32; background: #e8f5e9; }
.headline.nofit { border-color: #c62828; background: #fdecea; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { padding: 0.22em 0.7em; border-bottom: 1px solid #eee; text-align: left; vertical-align: top; }
thead th { background: #f5f5f5; position: sticky; top: 0; }
table.summary th { font-weight: 600; white-space: nowrap; }
td.num, span.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.mono, td.path { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 0.92em; }
p.note { color: #666; margin: 0.2em 0; }
.legend { display: flex; flex-wrap: wrap; gap: 0.4em 1.2em; margin: 0.5em 0; font-size: 0.95em; }
.legend i, #point i { display: inline-block; width: 0.9em; height: 0.9em; margin-right: 0.35em; vertical-align: -0.1em;
                      border-radius: 2px; }
.legend i.dash { width: 1.6em; height: 0; border-top: 2px dashed #111; border-radius: 0; vertical-align: 0.25em; }
.chart { width: 100%; }
.chart svg { display: block; width: 100%; height: auto; }
svg text { font: 12px system-ui, sans-serif; fill: #333; }
svg text.phase { font-size: 13px; font-weight: 600; fill: #444; }
svg text.peak { font-weight: 700; fill: #000; }
svg text.axis { fill: #666; }
#point { display: flex; flex-wrap: wrap; gap: 0.3em 2em; align-items: baseline; background: #fafafa;
          border: 1px solid #e4e4e4; border-radius: 6px; padding: 0.5em 0.9em; margin-top: 0.4em; }
#point .where { display: flex; flex-direction: column; min-width: 22em; }
#point ul { list-style: none; margin: 0; padding: 0; display: flex; flex-wrap: wrap; gap: 0.2em 1.3em; }
.tree { font-size: 0.95em; }
.tree .row { display: grid; grid-template-columns: minmax(18em, 2.2fr) 7.5em 6.5em minmax(8em, 1.4fr) 7em minmax(8em, 1.4fr);
             gap: 0.8em; align-items: center; padding: 0.12em 0; border-bottom: 1px solid #f0f0f0; }
.tree.train .row { grid-template-columns: minmax(18em, 2.2fr) 7.5em 6.5em 6.5em minmax(8em, 1.4fr) 7em minmax(8em, 1.4fr); }
.tree .head { font-weight: 600; background: #f5f5f5; position: sticky; top: 0; }
.tree summary { cursor: pointer; list-style: none; }
.tree summary::-webkit-details-marker { display: none; }
.tree summary .name::before { content: "\\25B8"; display: inline-block; width: 1em; color: #777; }
.tree details[open] > summary .name::before { content: "\\25BE"; }
.tree .leaf .name::before { content: ""; display: inline-block; width: 1em; }
.tree .name { font-family: ui-monospace, Menlo, Consolas, monospace; white-space: nowrap; overflow: hidden;
              text-overflow: ellipsis; }
.tree .name em { font-style: normal; color: #777; font-family: system-ui, sans-serif; font-size: 0.92em; }
.bar { display: flex; height: 0.8em; background: #f1f1f1; border-radius: 2px; overflow: hidden; min-width: 4em; }
.bar i { display: block; height: 100%; }
.bar-h { font-weight: normal; font-size: 0.9em; color: #555; }
.bar-h i { display: inline-block; width: 0.8em; height: 0.8em; margin: 0 0.3em 0 0.6em; vertical-align: -0.05em; }
td.share { min-width: 14em; }
td.share .bar { display: inline-flex; width: 9em; margin-right: 0.5em; vertical-align: -0.05em; }
.legend i.dash.limit { border-top-color: #c62828; }
svg text.limit { fill: #c62828; font-weight: 600; }
.scroll { overflow-x: auto; }
.headline, h1, p.sub, table.summary td { overflow-wrap: anywhere; }
/* a phone (390 px): the summary as label-over-value blocks; the chart, the tree and the operator table
   scroll sideways inside their boxes, the page itself never does */
@media (max-width: 700px) {
  body { padding: 0.8em; }
  table.summary, table.summary tbody, table.summary tr, table.summary th, table.summary td { display: block; }
  table.summary th { white-space: normal; border-bottom: 0; padding-bottom: 0; }
  table.summary td { padding-top: 0.05em; padding-left: 1.4em; }
  .chart svg { min-width: 640px; }
  #point .where { min-width: 0; }
}
"""


def to_html(report: ReportData, depth: int | None = None) -> str:
    """A self-contained page: the headline, the summary, the memory timeline (phases given equal room,
    stacked by category, the peak marked, the checkpoint what-if as a dashed line, hover for the op,
    module, phase and live bytes at any point), the module tree with memory and FLOP bars, the
    per-operator table, and the JSON of :meth:`to_dict` in ``<script type="application/json"
    id="estimate-json">``.  One small inline script drives the hover; the page is complete without it."""
    esc = html.escape
    t = report.tally
    train = training(report)
    page_title = title(report)
    summary = "\n".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in summary_rows(report))
    fits = report.fits
    verdict = "unknown" if fits is None else ("fits" if fits else "nofit")
    subtitle = ", ".join(w for w in (inputs_words(report), report.precision, report.device,
                                     {"train": "training step", "generate": "generation"}.get(report.mode,
                                                                                               "inference")) if w)
    timeline, timeline_json = _timeline_section(report, train)
    missing = _no_gradient_section(t)
    operators = _operators_section(t, train)
    unsupported = _unsupported_section(t)
    data_json = json.dumps(to_dict(report, depth), indent=1).replace("</", "<\\/")
    colors_css = "".join(f".b-{k} {{ background: {v}; }}\n" for k, v in
                         (("param", CATEGORY_COLORS["parameter"]), ("saved", CATEGORY_COLORS["saved"]),
                          ("fwd", "#4e79a7"), ("bwd", "#f28e2b")))
    script = (f'<script type="application/json" id="timeline-data">{timeline_json}</script>\n<script>{_SCRIPT}</script>'
              if timeline_json else "")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="estimator (schema version {SCHEMA_VERSION})">
<title>{esc(page_title)}</title>
<style>
{_STYLE}{colors_css}</style>
</head>
<body>
<h1>{esc(page_title)}</h1>
<p class="sub">{esc(subtitle)}. Memory in binary units (KiB, MiB, GiB); one multiply-add is 2 FLOPs; hover a
number for its exact value.</p>
<div class="headline {verdict}">{esc(headline(report))}</div>
{timeline}
<h2>Summary</h2>
<table class=summary>
{summary}
</table>
{missing}
<h2>Per module</h2>
<p class="note">Every module with its subtree's totals: parameters, memory (weights{" and activations saved for backward" if train else ""}) and FLOPs{" (forward and backward, each backward op on the module whose forward made it)" if train else ""}; click a row to open or close it.</p>
<div class="scroll">{_tree_html(report)}</div>
<div class="scroll">{operators}</div>
{unsupported}
<script type="application/json" id="estimate-json">
{data_json}
</script>
{script}
</body>
</html>
"""

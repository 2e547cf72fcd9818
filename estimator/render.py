"""How a :class:`~estimator.report.Report` is shown: text and markdown tables, CSV, HTML, SVG, plots.

Memory is shown in binary units (KiB, MiB, GiB = 2**10, 2**20, 2**30 bytes); FLOPs in decimal
units, one multiply-add being 2 FLOPs.  The report object holds the numbers
(:meth:`~estimator.report.Report.to_dict`); everything here only formats them.

Every text, markdown and HTML report starts with the headline (:func:`headline`): the memory the
device needs (peak + reserve) and, for a GPU, whether it fits and the largest micro-batch.

Why one file of this length: every output format (text, markdown, CSV, HTML with its SVG chart,
PNG) renders the same rows from the same Report; keeping them together keeps the formats in step
(the golden and format tests compare them).
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import re
from typing import TYPE_CHECKING, Any

from tabulate import tabulate

from .capture import INPUT_MODULE, LOSS_MODULE, OPTIMIZER_MODULE
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


def fmt_gb(n: int) -> str:
    """A GPU's datasheet capacity in decimal gigabytes: 80e9 -> '80 GB'."""
    return f"{n / 1e9:g} GB"


CATEGORY_LABEL = {"parameter": "parameters", "buffer": "buffers", "input": "inputs",
                  "optimizer_state": "optimizer state", "gradient": "gradients", "saved": "saved activations",
                  "workspace": "CUDA library workspaces", "temporary": "temporaries",
                  "allocator": "allocator blocks beyond requests"}
_CATEGORY_LABEL = CATEGORY_LABEL  # the name before the headline work

# One palette for the HTML chart, the legend and the PNG (Tableau 10).
CATEGORY_COLORS = {
    "parameter": "#4e79a7", "buffer": "#a0cbe8", "input": "#f28e2b", "optimizer_state": "#59a14f",
    "gradient": "#e15759", "saved": "#b07aa1", "temporary": "#edc948", "workspace": "#9c755f",
    "allocator": "#bab0ac",
}

OPTIMIZER_NAMES = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD", "sgd-momentum": "SGD", "adagrad": "Adagrad",
                   "rmsprop": "RMSprop", "adamax": "Adamax", "adadelta": "Adadelta", "nadam": "NAdam",
                   "radam": "RAdam"}
PHASE_NAMES = {"start": "start of the step", "forward": "forward pass", "loss": "loss",
               "backward": "backward pass", "optimizer": "optimizer step"}


def _dtype_note(per_dtype: dict[str, int]) -> str:
    """' (bfloat16 1.00 MiB, float32 2.00 MiB)' when several dtypes share a figure."""
    if len(per_dtype) < 2:
        return ""
    return " (" + ", ".join(f"{d} {fmt_bytes(n)}" for d, n in sorted(per_dtype.items(), key=lambda kv: -kv[1])) + ")"


def training(report: "Report") -> bool:
    return report.mode != "inference"


def title(report: "Report") -> str:
    what = "Training-step estimate" if training(report) else "Inference estimate (forward pass, no gradients)"
    return f"{what}{f' of {report.model_name}' if report.model_name else ''}"


def op_words(op: str) -> str:
    """'aten._foreach_sqrt.default' -> 'foreach sqrt'; 'aten.convolution_backward.default' -> 'convolution backward'."""
    name = op.removeprefix("aten.")
    name = re.sub(r"\.(default|Tensor|Scalar|int|dim_IntList|[A-Za-z_]+)$", "", name) if name.count(".") else name
    return name.strip("_").replace("_", " ")


def optimizer_words(report: "Report") -> str:
    name = report.capture.optimizer_name or ""
    return OPTIMIZER_NAMES.get(name.lower(), name)


def place(report: "Report", snapshot: Any) -> str:
    """Where a point of the timeline is, in words: 'optimizer step (AdamW foreach sqrt)',
    'backward pass, layers.3.mlp (LlamaMLP: mm)', 'loss (cross entropy: log softmax)'."""
    phase = str(snapshot.phase)
    op = op_words(snapshot.op) if snapshot.op else ""
    if phase == "optimizer":
        return f"optimizer step ({' '.join(w for w in (optimizer_words(report), op) if w)})"
    if phase == "start":
        return PHASE_NAMES["start"]
    module = snapshot.module
    words = PHASE_NAMES.get(phase, phase)
    if phase == "loss" or module in (LOSS_MODULE, OPTIMIZER_MODULE, INPUT_MODULE):
        return f"{words} ({op})" if op else words
    kind = report.capture.module_types.get(module, "")
    if not module:  # code of the root module's own forward, outside its submodules
        return f"{words}, root module {kind}" + (f" ({op})" if op else "")
    detail = ": ".join(w for w in (kind, op) if w)
    return f"{words}, {module}" + (f" ({detail})" if detail else "")


def inputs_words(report: "Report") -> str:
    """'batch 8, sequence 1024' or 'batch 32, images 224x224', from the traced inputs."""
    batch = seq = image = None
    for t in report.capture.inputs:
        shape = tuple(t.shape)
        if not shape:
            continue
        if batch is None:
            batch = shape[0]
        if not t.is_floating_point() and len(shape) == 2 and seq is None:
            seq = shape[1]
        if t.is_floating_point() and len(shape) == 4 and image is None:
            image = f"{shape[2]}x{shape[3]}"
    parts = []
    if batch is not None:
        parts.append(f"batch {batch}")
    if seq is not None:
        parts.append(f"sequence {seq}")
    if image is not None:
        parts.append(f"images {image}")
    return ", ".join(parts)


# -- the headline -----------------------------------------------------------


def headline(report: "Report") -> str:
    """The first line of every report: memory needed and, with a GPU, fits or not and the largest micro-batch.

    'Needs 18.42 GiB on the GPU (peak 16.20 GiB + 2.22 GiB CUDA reserve): fits on H100-SXM (80 GB =
    74.51 GiB, 56.09 GiB to spare); largest micro-batch 12'."""
    needed = report.needed
    if needed is None:
        return "No memory estimate"
    m = report.memory
    what = "A training step" if training(report) else "Inference"
    reserve = sum(m.reserve.values())
    if report.device != "cuda":
        return f"{what} needs {fmt_bytes(needed)} of memory (peak of live tensors on the CPU target)"
    parts = f"peak {fmt_bytes(max(m.peak, m.peak_first_step))} + {fmt_bytes(reserve)} CUDA reserve"
    text = f"{what} needs {fmt_bytes(needed)} on the GPU ({parts})"
    gpu = report.gpu
    if gpu is None:
        return text + "; add --gpu NAME to check a GPU"
    usable = gpu.capacity
    capacity = (f"{fmt_gb(gpu.memory)}, {fmt_bytes(usable)} usable" if usable != gpu.memory
                else f"{fmt_gb(gpu.memory)} = {fmt_bytes(usable)}")
    if report.fits:
        text += f": fits on {gpu.name} ({capacity}, {fmt_bytes(usable - needed)} to spare)"
    else:
        text += f": DOES NOT FIT on {gpu.name} ({capacity}, {fmt_bytes(needed - usable)} short)"
    if report.max_batch is not None:
        text += ("; no micro-batch fits on one GPU (estimator plan shards it over several)" if report.max_batch == 0
                 else f"; largest micro-batch {report.max_batch}")
    elif report.max_batch_note and training(report):
        text += f"; largest micro-batch {report.max_batch_note}"  # "not searched: ..." or "over ..."
    return text


# -- text -----------------------------------------------------------------


def summary_rows(report: "Report") -> list[tuple[str, str]]:
    t = report.tally
    train = training(report)
    fwd, bwd = t.flops["forward"], t.flops["backward"]
    mm = t.flops["matmul_forward"] + t.flops["matmul_backward"]
    params = f"{fmt_count(t.params_total)} ({fmt_count(t.params_trainable)} trainable)" if train \
        else fmt_count(t.params_total)
    missing = sum(r["count"] for r in t.no_gradient)
    if missing:
        params += f"; {fmt_count(missing)} trainable get NO gradient (listed below)"
    rows = [("Parameters", params)]
    shape = inputs_words(report)
    rows.append(("Inputs", shape or "-"))
    if train:
        rows += [("Loss", report.capture.loss_source), ("Optimizer", optimizer_words(report) or "none")]
    rows.append(("Target", f"{report.device}, {report.precision}, {'training' if train else 'inference'}"))
    m = report.memory
    if m is not None:
        at = m.peak_at
        if report.device == "cuda":
            rows.append(("Memory the GPU needs", f"{fmt_bytes(report.needed)} (peak + CUDA reserve)"))
        rows.append((f"Memory: peak{' (steady-state step)' if train else ''}",
                     f"{fmt_bytes(m.peak)}, in the {place(report, at)}"))
        rows.append(("Memory at the peak", ", ".join(f"{CATEGORY_LABEL.get(k, k)} {fmt_bytes(v)}"
                                                     for k, v in at.by_category.items() if v)))
        if train and m.peak_first_step != m.peak:
            rows.append(("Memory: peak (first step)", f"{fmt_bytes(m.peak_first_step)} (the optimizer state "
                                                       f"is created inside the first step)"))
        st = report.step_time
        if st is not None:
            quality = "calibrated on measured kernels" if st.calibrated else "extrapolated from the H100's constants"
            rows.append((f"Step time on {st.gpu}", f"{st.total * 1e3:.1f} ms (forward {st.forward * 1e3:.1f}, "
                         f"backward {st.backward * 1e3:.1f}, optimizer {st.optimizer * 1e3:.1f}; "
                         f"{'launch' if st.bound == 'host' else 'GPU'}-bound; {quality})"))
            rows.append(("Achieved FLOP/s, MFU", f"{fmt_flops(st.achieved_flops)}/s, MFU {st.mfu:.1%} "
                         f"(PaLM appendix B: model FLOPs over the step and the peak)"))
            top = st.by_op()
            rows.append(("Top ops by GPU time", ", ".join(
                f"{op.removeprefix('aten.')} {sec * 1e3:.2f} ms" for op, sec in list(top.items())[:5])))
        if report.kernels:
            rows.append(("Kernels assumed", ", ".join(f"{name} x{n}" for name, n in report.kernels.items())))
        if m.reserve:
            rows.append(("Memory: CUDA reserve", f"{fmt_bytes(sum(m.reserve.values()))}: " + ", ".join(
                f"{_RESERVE_LABEL.get(k, k.replace('_', ' '))} {fmt_bytes(v)}" for k, v in m.reserve.items())))
    rows += [("Memory: parameters", fmt_bytes(t.parameters_bytes) + _dtype_note(t.memory_by_dtype.get("parameter", {})))]
    if t.buffers_bytes:
        rows.append(("Memory: buffers", fmt_bytes(t.buffers_bytes)))
    if train:
        rows += [
            ("Memory: gradients", fmt_bytes(t.gradients_bytes)),
            ("Memory: optimizer state", fmt_bytes(t.optimizer_state_bytes)),
            ("Memory: activations saved for backward", fmt_bytes(t.activations_bytes)
             + _dtype_note(t.memory_by_dtype.get("saved", {}))),
        ]
    rows.append(("FLOPs: forward", fmt_flops(fwd)))
    if train:
        rows.append(("FLOPs: backward", fmt_flops(bwd)))
        rows.append(("FLOPs: forward + backward", f"{fmt_flops(fwd + bwd)} ({100.0 * mm / max(fwd + bwd, 1):.1f}% "
                                                  f"matmul-class)"))
    else:
        rows[-1] = ("FLOPs: forward", f"{fmt_flops(fwd)} ({100.0 * mm / max(fwd, 1):.1f}% matmul-class)")
    for dtype, n in sorted(t.flops_by_dtype.items()):
        rows.append((f"FLOPs in {dtype}", fmt_flops(n)))
    if train and t.flops["optimizer"]:
        rows.append(("FLOPs: optimizer step", fmt_flops(t.flops["optimizer"])))
    if report.checkpoint:
        c = report.checkpoint
        rows.append((f"What-if: checkpoint {', '.join(c.classes)}",
                     f"peak {fmt_bytes(c.peak)} (saves {fmt_bytes(c.peak_saved)}), "
                     f"backward +{fmt_flops(c.flops_added)}"))
    for q in report.quantized:
        rows.append((f"What-if: {q.scheme} weights", f"peak {fmt_bytes(q.peak)}, parameters {fmt_bytes(q.parameters)} "
                                                    f"({q.layers} Linear layers; {q.layout})"))
    if report.capture.fallback_reason:
        where = "real CPU tensors" if report.capture.mode == "real" else "fake tensors"
        rows.append(("Capture", f"{where} ({report.capture.fallback_reason})"))
    return rows


_RESERVE_LABEL = {"cuda_context": "CUDA context", "cublas_workspace": "cuBLAS workspace",
                  "fragmentation": "fragmentation"}


def _wrap(text: str, width: int) -> str:
    """``text`` broken into lines of at most ``width`` characters, at spaces, else after '.', '_' or ','."""
    if width <= 0 or len(text) <= width:
        return text
    lines = []
    for para in text.split("\n"):
        words = re.findall(r"[^ ]+ ?", para)
        line = ""
        for word in words:
            while len(word.rstrip()) > width:  # a long word (a module path): break after a separator
                cut = max((word.rfind(c, 0, width - len(line)) for c in "._,/"), default=-1)
                if cut <= 0 and line:
                    lines.append(line.rstrip())
                    line = ""
                    continue
                cut = cut + 1 if cut > 0 else width - len(line)
                lines.append((line + word[:cut]).rstrip())
                line, word = "", word[cut:]
            if len(line) + len(word.rstrip()) > width:
                lines.append(line.rstrip())
                line = ""
            line += word
        lines.append(line.rstrip())
    return "\n".join(lines)


def _table(body: list[list[str]], headers: list[str] | None, tablefmt: str, width: int | None,
           flexible: tuple[int, ...] = (), minimum: tuple[int, ...] = (), optional: tuple[int, ...] = ()) -> str:
    """tabulate, at most ``width`` columns wide (text formats): headers wrapped at spaces to their column's
    cells, then the ``flexible`` columns wrapped, the first one shaved first down to its ``minimum``;
    the ``optional`` columns dropped (last resort) when that is not enough."""
    if not (width and tablefmt in ("simple", "plain") and body):
        if headers:
            return tabulate(body, headers=headers, tablefmt=tablefmt, disable_numparse=True)
        return tabulate(body, tablefmt=tablefmt, disable_numparse=True)
    headers = list(headers) if headers else None
    body = [list(map(str, row)) for row in body]

    def cell_width(col: int) -> int:
        return max(len(line) for row in body for line in row[col].split("\n"))

    pad = 2 if headers else 0  # tabulate pads header cells by 2 in the simple format
    if headers:
        for i, h in enumerate(headers):
            target = max(cell_width(i), max(len(w) for w in h.split()) if h.split() else 0)
            headers[i] = _wrap(h, target) if len(h) > target else h
    natural = [max(cell_width(i), max((len(x) + pad for x in headers[i].split("\n")), default=0) if headers else 0)
               for i in range(len(body[0]))]
    excess = sum(natural) + 2 * (len(natural) - 1) - width
    limits = dict.fromkeys(flexible)
    for i, low in zip(flexible, minimum or (8,) * len(flexible)):
        if excess <= 0:
            break
        cut = min(excess, max(natural[i] - low, 0))
        limits[i] = natural[i] - cut
        excess -= cut
    if excess > 0 and optional:  # still too wide: drop a column, then fit again
        drop = optional[0]
        keep = [i for i in range(len(natural)) if i != drop]
        remap = {old: new for new, old in enumerate(keep)}
        pick = lambda row: [row[i] for i in keep]  # noqa: E731
        flex = [(remap[i], low) for i, low in zip(flexible, minimum or (8,) * len(flexible)) if i != drop]
        return _table([pick(r) for r in body], pick(headers) if headers else None, tablefmt, width,
                      tuple(i for i, _ in flex), tuple(low for _, low in flex), tuple(remap[i] for i in optional[1:]))
    for i, limit in limits.items():
        if limit is not None and limit < natural[i]:
            body = [[_wrap(c, limit) if j == i else c for j, c in enumerate(row)] for row in body]
            if headers:
                headers[i] = _wrap(headers[i], max(limit - pad, 1))
    if headers:
        return tabulate(body, headers=headers, tablefmt=tablefmt, disable_numparse=True)
    return tabulate(body, tablefmt=tablefmt, disable_numparse=True)


def module_table(report: "Report", depth: int | None = None, tablefmt: str = "simple", width: int | None = None) -> str:
    train = training(report)
    headers = ["Module", "Type", "Output shape", "Params"]
    headers += ["Saved activations", "Fwd FLOPs", "Bwd FLOPs", "%"] if train else ["Fwd FLOPs", "%"]
    rows = report.module_rows(depth)

    def cells(path, kind, shape, params, act, fwd, bwd, pct):
        row = [path, kind, shape, params]
        return row + ([act, fwd, bwd, pct] if train else [fwd, pct])

    body = [cells(r.path, r.type, r.output_shape, fmt_count(r.params), fmt_bytes(r.activations),
                  fmt_flops(r.flops_forward), fmt_flops(r.flops_backward), f"{r.percent:.1f}") for r in rows]
    t = report.tally
    body.append(cells("Total", "", "", fmt_count(t.params_total), fmt_bytes(t.activations_bytes),
                      fmt_flops(t.flops["forward"]), fmt_flops(t.flops["backward"]), "100.0"))
    # shave the output shape first, then the type, the module path last; drop the shapes if that is not enough
    return _table(body, headers, tablefmt, width, flexible=(2, 1, 0), minimum=(10, 10, 18), optional=(2,))


def unsupported_table(report: "Report", tablefmt: str = "simple", width: int | None = None) -> str:
    if not report.tally.unsupported:
        return ""
    body = [[r["op"], str(r["count"]), r["module"]] for r in report.tally.unsupported]
    return _table(body, ["Op without a cost rule", "Count", "Module"], tablefmt, width, flexible=(2, 0),
                  minimum=(16, 16))


def no_gradient_table(report: "Report", tablefmt: str = "simple", width: int | None = None) -> str:
    rows = report.tally.no_gradient
    if not rows:
        return ""
    body = [[r["module"] or "(root)", r["type"], fmt_count(r["count"]), fmt_bytes(r["bytes"]),
             f"{len(r['params'])} tensor{'s' if len(r['params']) != 1 else ''}"] for r in rows]
    return _table(body, ["Module", "Type", "Params", "Bytes", "Parameters"], tablefmt, width, flexible=(1, 0),
                  minimum=(10, 18))


def operators_table(report: "Report", tablefmt: str = "simple", width: int | None = None, top: int | None = None) -> str:
    train = training(report)
    rows = [r for r in report.tally.by_operator  # ops that cost nothing (views, detach) are left to the JSON and CSV
            if r["flops_forward"] or r["flops_backward"] or r["flops_optimizer"] or r["saved_bytes"]]
    rows = rows[:top] if top else rows
    total = sum(r["flops_forward"] + r["flops_backward"] for r in report.tally.by_operator) or 1
    headers = ["Op", "Calls", "Fwd FLOPs"] + (["Bwd FLOPs", "Optimizer FLOPs", "Saved for backward"] if train else []) \
        + ["% FLOPs"]
    body = []
    for r in rows:
        row = [r["op"].removeprefix("aten."), fmt_count(r["count"]), fmt_flops(r["flops_forward"])]
        if train:
            row += [fmt_flops(r["flops_backward"]), fmt_flops(r["flops_optimizer"]), fmt_bytes(r["saved_bytes"])]
        row.append(f"{100.0 * (r['flops_forward'] + r['flops_backward']) / total:.1f}")
        body.append(row)
    return _table(body, headers, tablefmt, width, flexible=(0,), minimum=(16,))


def render(report: "Report", tablefmt: str = "simple", depth: int | None = None, *, width: int | None = None,
           operators: bool = False) -> str:
    """The text (``tablefmt="simple"``) or markdown (``"github"``) report; ``width``: wrap to at most that
    many columns (text); ``operators``: add the per-operator table."""
    md = tablefmt == "github"
    depth_text = report.depth if depth is None else depth

    def heading(text: str, level: int = 2) -> str:
        return f"{'#' * level} {text}" if md else text

    summary = report.summary_rows()
    if md:
        summary_text = tabulate([[k, v] for k, v in summary], headers=["Quantity", "Estimate"], tablefmt="github",
                                disable_numparse=True)
    else:
        key_width = max(len(k) for k, _ in summary)
        value_width = max(20, width - key_width - 2) if width else 0
        summary_text = tabulate([[k, _wrap(v, value_width) if value_width else v] for k, v in summary],
                                tablefmt="plain", disable_numparse=True)
    line = report.headline()
    head = title(report) if md or not width else _wrap(title(report), width)
    parts = [heading(head, 1), f"**{line}**" if md else (_wrap(line, width) if width else line), summary_text,
             heading(f"Per module (depth {depth_text})"), module_table(report, depth, tablefmt, width)]
    missing = no_gradient_table(report, tablefmt, width)
    if missing:
        parts += [heading("Trainable parameters that get no gradient in this step (check the inputs, or freeze "
                          "them)"), missing]
    if operators:
        parts += [heading("Per operator (aten ops, most FLOPs first)"), operators_table(report, tablefmt, width)]
    unsupported = report.unsupported_table(tablefmt) if width is None else unsupported_table(report, tablefmt, width)
    if unsupported:
        parts += [heading("Not counted (no rule; FLOPs of these ops are missing from the totals)"), unsupported]
    return "\n\n".join(parts) + "\n"


# -- csv ------------------------------------------------------------------
CSV_COLUMNS = ("path", "type", "output_shape", "params", "activations", "flops_forward", "flops_backward",
               "percent")
OPERATOR_CSV_COLUMNS = ("op", "count", "flops_forward", "flops_backward", "flops_optimizer", "saved_bytes", "kind")


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


def operators_csv(report: "Report") -> str:
    """One row per aten op (the JSON ``by_operator`` rows): exact integers."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(OPERATOR_CSV_COLUMNS)
    for r in report.tally.by_operator:
        writer.writerow([r[c] for c in OPERATOR_CSV_COLUMNS])
    return buf.getvalue()


# -- the memory timeline: phases given equal room --------------------------------------------

MAX_SVG_POINTS = 1000
PHASE_ORDER = ("forward", "loss", "backward", "optimizer")


def _phase_of(p: Any) -> str:
    phase = str(p.phase if hasattr(p, "phase") else p[0])
    return "forward" if phase == "start" else phase


def phase_layout(phases: list[str]) -> tuple[list[float], list[tuple[str, float, float]]]:
    """x in [0, 1] for each point of a timeline whose points are in ``phases`` (execution order): every
    phase present gets the same width and its points are spread evenly across it, edge to edge.
    Returns the xs and the (phase, start, end) bands."""
    present = [ph for ph in PHASE_ORDER if ph in set(phases)]
    present += [ph for ph in dict.fromkeys(phases) if ph not in present]
    counts = {ph: phases.count(ph) for ph in present}
    band = 1.0 / max(len(present), 1)
    seen = dict.fromkeys(present, 0)
    xs = []
    for ph in phases:
        i, k, n = present.index(ph), seen[ph], counts[ph]
        seen[ph] += 1
        xs.append(band * (i + (k / (n - 1) if n > 1 else 0.5)))
    return xs, [(ph, band * i, band * (i + 1)) for i, ph in enumerate(present)]


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


def _unit(top: float) -> tuple[str, int]:
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
    if checkpoint:
        cxs, _ = phase_layout([_phase_of(p) for p in checkpoint])
        cpicked = _columns([t for _, t in checkpoint], cxs, limit)
        data["checkpoint"] = {"x": [round(cxs[j], 5) for j in cpicked], "total": [checkpoint[j][1] for j in cpicked]}
    return data


def timeline_svg(profile: MemoryProfile, width: int = 1200, height: int = 380,
                 checkpoint: list[tuple[str, int]] | None = None, peak_label: str | None = None,
                 data: dict[str, Any] | None = None) -> str:
    """The memory timeline as a stacked-area SVG that scales to its container's width: live bytes by
    category, the forward, loss, backward and optimizer phases given equal room and labelled, the peak
    marked, and the checkpoint what-if's total as a dashed line.  No external resources."""
    data = data or timeline_data(profile, checkpoint)
    n = len(data["x"])
    cats = data["categories"]
    top = max(data["total"] + [profile.peak, 1] + (data["checkpoint"]["total"] if "checkpoint" in data else []))
    unit_name, unit = _unit(top)
    step = _nice_step(top / unit)
    y_max = math.ceil(top / unit / step) * step * unit
    left, right, top_pad, bottom = 64, 14, 14, 46
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
    # axes, cursor (moved by the page's script) and the x-axis title
    parts.append(f'<line x1="{left}" x2="{left}" y1="{top_pad}" y2="{top_pad + ph}" stroke="#333"/>')
    parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{top_pad + ph}" y2="{top_pad + ph}" stroke="#333"/>')
    parts.append(f'<line id="cursor" x1="{left}" x2="{left}" y1="{top_pad}" y2="{top_pad + ph}" stroke="#d62728" '
                 f'stroke-width="1.2" visibility="hidden"/>')
    parts.append(f'<text x="{left + pw / 2:.0f}" y="{height - 2}" text-anchor="middle" class="axis">'
                 f'phase of the step (each phase given equal width; ops in execution order within it)</text>')
    parts.append("</svg>")
    return "\n".join(parts)


# -- html -----------------------------------------------------------------


def _module_tree(report: "Report") -> dict[str, Any]:
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


def _tree_html(report: "Report") -> str:
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


def _peak_panel(report: "Report") -> str:
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


def to_html(report: "Report", depth: int | None = None) -> str:
    """A self-contained page: the headline, the summary, the memory timeline (phases given equal room,
    stacked by category, the peak marked, the checkpoint what-if as a dashed line, hover for the op,
    module, phase and live bytes at any point), the module tree with memory and FLOP bars, the
    per-operator table, and the JSON of :meth:`to_dict` in ``<script type="application/json"
    id="estimate-json">``.  One small inline script drives the hover; the page is complete without it."""
    esc = html.escape
    t = report.tally
    train = training(report)
    page_title = title(report)
    summary = "\n".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in report.summary_rows())
    fits = report.fits
    verdict = "unknown" if fits is None else ("fits" if fits else "nofit")
    subtitle = ", ".join(w for w in (inputs_words(report), report.precision, report.device,
                                     "training step" if train else "inference") if w)
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
        if ck:
            legend += (f'<span><i class="dash"></i>with checkpointing of {esc(", ".join(report.checkpoint.classes))} '
                       f'(peak {fmt_bytes(report.checkpoint.peak)})</span>')
        note = ("Live bytes after each op" + (" of a steady-state step (optimizer state already allocated)" if train
                                                else " of the forward pass")
                + (", each allocation rounded to the CUDA caching allocator's 512-byte blocks" if report.device == "cuda"
                   else "") + ". Hover the chart to see any point; the panel shows the peak until then.")
        svg = timeline_svg(m, checkpoint=ck, data=data,
                           peak_label=f"peak {fmt_bytes(m.peak)}: {place(report, m.peak_at)}")
        timeline = (f'<h2>Memory over one {"training step" if train else "forward pass"}</h2><p class="note">{esc(note)}</p>'
                    f'<div class="legend">{legend}</div><div class="chart">{svg}</div>{_peak_panel(report)}')
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
    unsupported = ""
    if t.unsupported:
        urows = "\n".join(f"<tr><td class=mono>{esc(str(u['op']))}</td><td class=num>{u['count']}</td>"
                          f"<td class=mono>{esc(str(u['module']))}</td></tr>" for u in t.unsupported)
        unsupported = ("<h2>Not counted</h2><p>Ops without a cost rule: their FLOPs are missing from the "
                       "totals.</p><table><thead><tr><th>Op</th><th>Count</th><th>Module</th></tr></thead>"
                       f"<tbody>{urows}</tbody></table>")
    data_json = json.dumps(report.to_dict(depth), indent=1).replace("</", "<\\/")
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
body {{ font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; padding: 1.2em 2em;
       color: #222; }}
h1 {{ font-size: 1.45em; margin: 0 0 0.15em; }}
h2 {{ font-size: 1.15em; margin-top: 1.8em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }}
h2.warn {{ color: #b00020; }}
p.sub {{ color: #555; margin: 0 0 0.8em; }}
.headline {{ font-size: 1.2em; font-weight: 600; padding: 0.6em 0.9em; border-radius: 6px; margin: 0.4em 0 1em;
            border-left: 6px solid #4e79a7; background: #eef3f9; }}
.headline.fits {{ border-color: #2e7d32; background: #e8f5e9; }}
.headline.nofit {{ border-color: #c62828; background: #fdecea; }}
table {{ border-collapse: collapse; margin: 0.5em 0; }}
th, td {{ padding: 0.22em 0.7em; border-bottom: 1px solid #eee; text-align: left; vertical-align: top; }}
thead th {{ background: #f5f5f5; position: sticky; top: 0; }}
table.summary th {{ font-weight: 600; white-space: nowrap; }}
td.num, span.num {{ text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }}
.mono, td.path {{ font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 0.92em; }}
p.note {{ color: #666; margin: 0.2em 0; }}
.legend {{ display: flex; flex-wrap: wrap; gap: 0.4em 1.2em; margin: 0.5em 0; font-size: 0.95em; }}
.legend i, #point i {{ display: inline-block; width: 0.9em; height: 0.9em; margin-right: 0.35em; vertical-align: -0.1em;
                      border-radius: 2px; }}
.legend i.dash {{ width: 1.6em; height: 0; border-top: 2px dashed #111; border-radius: 0; vertical-align: 0.25em; }}
.chart {{ width: 100%; }}
.chart svg {{ display: block; width: 100%; height: auto; }}
svg text {{ font: 12px system-ui, sans-serif; fill: #333; }}
svg text.phase {{ font-size: 13px; font-weight: 600; fill: #444; }}
svg text.peak {{ font-weight: 700; fill: #000; }}
svg text.axis {{ fill: #666; }}
#point {{ display: flex; flex-wrap: wrap; gap: 0.3em 2em; align-items: baseline; background: #fafafa;
          border: 1px solid #e4e4e4; border-radius: 6px; padding: 0.5em 0.9em; margin-top: 0.4em; }}
#point .where {{ display: flex; flex-direction: column; min-width: 22em; }}
#point ul {{ list-style: none; margin: 0; padding: 0; display: flex; flex-wrap: wrap; gap: 0.2em 1.3em; }}
.tree {{ font-size: 0.95em; }}
.tree .row {{ display: grid; grid-template-columns: minmax(18em, 2.2fr) 7.5em 6.5em minmax(8em, 1.4fr) 7em minmax(8em, 1.4fr);
             gap: 0.8em; align-items: center; padding: 0.12em 0; border-bottom: 1px solid #f0f0f0; }}
.tree.train .row {{ grid-template-columns: minmax(18em, 2.2fr) 7.5em 6.5em 6.5em minmax(8em, 1.4fr) 7em minmax(8em, 1.4fr); }}
.tree .head {{ font-weight: 600; background: #f5f5f5; position: sticky; top: 0; }}
.tree summary {{ cursor: pointer; list-style: none; }}
.tree summary::-webkit-details-marker {{ display: none; }}
.tree summary .name::before {{ content: "\\25B8"; display: inline-block; width: 1em; color: #777; }}
.tree details[open] > summary .name::before {{ content: "\\25BE"; }}
.tree .leaf .name::before {{ content: ""; display: inline-block; width: 1em; }}
.tree .name {{ font-family: ui-monospace, Menlo, Consolas, monospace; white-space: nowrap; overflow: hidden;
              text-overflow: ellipsis; }}
.tree .name em {{ font-style: normal; color: #777; font-family: system-ui, sans-serif; font-size: 0.92em; }}
.bar {{ display: flex; height: 0.8em; background: #f1f1f1; border-radius: 2px; overflow: hidden; min-width: 4em; }}
.bar i {{ display: block; height: 100%; }}
.bar-h {{ font-weight: normal; font-size: 0.9em; color: #555; }}
.bar-h i {{ display: inline-block; width: 0.8em; height: 0.8em; margin: 0 0.3em 0 0.6em; vertical-align: -0.05em; }}
td.share {{ min-width: 14em; }}
td.share .bar {{ display: inline-flex; width: 9em; margin-right: 0.5em; vertical-align: -0.05em; }}
{colors_css}</style>
</head>
<body>
<h1>{esc(page_title)}</h1>
<p class="sub">{esc(subtitle)}. Memory in binary units (KiB, MiB, GiB); one multiply-add is 2 FLOPs; hover a
number for its exact value.</p>
<div class="headline {verdict}">{esc(report.headline())}</div>
{timeline}
<h2>Summary</h2>
<table class=summary>
{summary}
</table>
{missing}
<h2>Per module</h2>
<p class="note">Every module with its subtree's totals: parameters, memory (weights{" and activations saved for backward" if train else ""}) and FLOPs{" (forward and backward, each backward op on the module whose forward made it)" if train else ""}; click a row to open or close it.</p>
{_tree_html(report)}
{operators}
{unsupported}
<script type="application/json" id="estimate-json">
{data_json}
</script>
{script}
</body>
</html>
"""


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
    the HTML report's palette and units, phases given equal room, the checkpoint what-if dashed.
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
    unit_name, unit = _unit(top)
    fig = Figure(figsize=(12, 5.2))
    FigureCanvasAgg(fig)
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
    ax.set_ylabel(f"live memory ({unit_name})")
    ax.set_xlabel("phase of the step (each phase given equal width; ops in execution order within it)")
    if not title and hasattr(report, "capture"):
        what = "training step (steady state)" if training(report) else "forward pass"
        details = ", ".join(w for w in (inputs_words(report), report.precision, report.device) if w)
        title = f"{report.model_name or 'model'}: live memory over one {what}\n{details}"
    ax.set_title(title or "Live memory over one training step (steady state)", fontsize=10.5)
    ax.legend(loc="upper left", fontsize=8, ncol=2, framealpha=0.9)
    ax.grid(axis="y", color="#e2e2e2")
    ax.set_axisbelow(True)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format=fmt or (path.rsplit(".", 1)[-1].lower() if "." in path else "png"))

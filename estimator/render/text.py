"""Text and markdown (``tablefmt="github"``) reports: the summary, the per-module table (rows that
sum to the totals), the ops without a rule, the parameters without a gradient and the
per-operator table.
"""

from __future__ import annotations

import re

import torch
from tabulate import tabulate

from ..quantize import TRACED_4BIT
from ..results import ReportData
from .generation import generation_rows
from .units import CATEGORY_LABEL, dtype_note, fmt_bytes, fmt_count, fmt_flops, step_time_words
from .words import STAGE_WORDS, headline, inputs_words, loop_words, optimizer_words, place, title, training

# -- text -----------------------------------------------------------------


def _memory_rows(report: ReportData, train: bool) -> list[tuple[str, str]]:
    """The peak, where it is and what is live there, the step time, the kernels and the CUDA reserve."""
    rows: list[tuple[str, str]] = []
    m = report.memory
    traced = report.quantize in TRACED_4BIT  # (traced over the 4-bit weights: no what-if on the peak)
    if m is not None:
        at = m.peak_at
        if report.device == "cuda":
            rows.append(("Memory the GPU needs", f"{fmt_bytes(report.needed)} (peak + CUDA reserve"
                                                 f"{f', {report.quantize} weights' if report.quantize else ''})"))
        if report.quantize and not traced:
            rows.append((f"Memory: peak with {report.quantize} weights",
                         f"{fmt_bytes(report.quantized_peak)} (the traced step replayed with the quantized weights' "
                         f"bytes; see the what-if below)"))
        which = " (steady-state step)" if train else (
            f" (the {STAGE_WORDS[report.generation.binding]})" if report.generation is not None else "")
        rows.append((f"Memory: peak{which}{' as traced' if report.quantize and not traced else ''}"
                     f"{f' with {report.quantize} weights' if traced else ''}",
                     f"{fmt_bytes(m.peak)}, in the {place(report, at)}"))
        blocks = " (512-B blocks)" if report.device == "cuda" else ""  # (the CUDA allocator's rounding)
        rows.append((f"Memory at the peak{blocks}", ", ".join(f"{CATEGORY_LABEL.get(k, k)} {fmt_bytes(v)}"
                                                              for k, v in at.by_category.items() if v)))
        if train and m.peak_first_step != m.peak:
            sids = getattr(report.capture, "sids", None) or {}  # (state a constructor made exists before: Adagrad's)
            made = set(sids.get("optimizer_state", ())) - set(sids.get("before_loop", ())) if sids else True
            why = ("the optimizer state is created inside the first step" if report.tally.optimizer_state_bytes and made
                   else "the first step starts without what a step leaves for the next: the last loss, kept gradients")
            rows.append(("Memory: peak (first step)", f"{fmt_bytes(m.peak_first_step)} ({why})"))
        st = report.step_time
        if st is not None:
            weights = " (16-bit weights)" if report.quantize and not traced else ""
            phases = ", ".join(f"{name} {sec * 1e3:.3g} ms" for name, sec in (
                ("forward", st.forward), ("backward", st.backward), ("optimizer", st.optimizer))
                if sec > 0 or name == "forward")  # (inference and generation: no backward, no optimizer)
            rows.append((f"Step time on {st.gpu}{weights}", f"{step_time_words(st.total, st.likely, st.band_note)} "
                         f"({phases}; {'launch' if st.bound == 'host' else 'GPU'}-bound)"))
            rows.append(("Achieved FLOP/s, MFU", f"{fmt_flops(st.achieved_flops)}/s, MFU {st.mfu:.1%} "
                         f"(PaLM appendix B: model FLOPs over the step and the peak)"))
            top = st.by_op()
            rows.append(("Top ops by GPU time", ", ".join(
                f"{op.removeprefix('aten.')} {sec * 1e3:.2f} ms" for op, sec in list(top.items())[:5])))
        if report.kernels:
            release = (f" (torch {report.cuda_torch[0]}.{report.cuda_torch[1]}'s choice; --cuda-torch for another "
                       "release)") if report.cuda_torch else ""
            rows.append(("Kernels assumed", ", ".join(f"{name} x{n}" for name, n in report.kernels.items()) + release))
        if m.reserve:
            traced = " as traced" if report.quantize else ""
            rows.append((f"Memory: CUDA reserve{traced}", f"{fmt_bytes(sum(m.reserve.values()))}: " + ", ".join(
                f"{_RESERVE_LABEL.get(k, k.replace('_', ' '))} {fmt_bytes(v)}" for k, v in m.reserve.items())))
    return rows


def _flops_rows(report: ReportData, train: bool) -> list[tuple[str, str]]:
    """FLOPs by phase and dtype, the optimizer's, and per optimizer step of an accumulation."""
    t = report.tally
    fwd, bwd = t.flops["forward"], t.flops["backward"]
    mm = t.flops["matmul_forward"] + t.flops["matmul_backward"]
    rows: list[tuple[str, str]] = []
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
    if train and report.capture.grad_accum > 1:
        n = report.capture.grad_accum
        rows.append(("FLOPs per optimizer step", f"{fmt_flops(n * (fwd + bwd) + t.flops['optimizer'])} "
                                                 f"({n} micro-batches, one optimizer step)"))
    return rows


def summary_rows(report: ReportData) -> list[tuple[str, str]]:
    t = report.tally
    train = training(report)
    params = f"{fmt_count(t.params_total)} ({fmt_count(t.params_trainable)} trainable)" if train \
        else fmt_count(t.params_total)
    missing = sum(r["count"] for r in t.no_gradient)
    if missing:
        params += f"; {fmt_count(missing)} trainable get NO gradient (listed below)"
    rows = [("Parameters", params)]
    shape = inputs_words(report)
    rows.append(("Inputs", shape or "-"))
    if train:
        rows += [("Loss", report.capture.loss_source), ("Optimizer", optimizer_words(report) or "none"),
                 ("Training loop", loop_words(report.capture))]
    mode_words = {"train": "training", "inference": "inference", "generate": "generation"}.get(report.mode, report.mode)
    rows.append(("Target", f"{report.device}, {_precision_words(report)}, {mode_words}"))
    rows += generation_rows(report)
    rows += _memory_rows(report, train)
    rows += [("Memory: parameters", fmt_bytes(t.parameters_bytes) + dtype_note(t.memory_by_dtype.get("parameter", {})))]
    if t.buffers_bytes:
        rows.append(("Memory: buffers", fmt_bytes(t.buffers_bytes)))
    if train:
        rows += [
            ("Memory: gradients", fmt_bytes(t.gradients_bytes)),
            ("Memory: optimizer state", fmt_bytes(t.optimizer_state_bytes)),
            ("Memory: activations saved for backward", fmt_bytes(t.activations_bytes)
             + dtype_note(t.memory_by_dtype.get("saved", {}))),
        ]
    rows += _flops_rows(report, train)
    if report.checkpoint:
        c = report.checkpoint
        policy = "" if c.policy == "full" else f" ({c.policy} policy)"
        rows.append((f"What-if: checkpoint {', '.join(c.classes)}{policy}",
                     f"peak {fmt_bytes(c.peak)} ({'saves' if c.peak_saved >= 0 else 'raises it by'} "
                     f"{fmt_bytes(abs(c.peak_saved))}), "
                     f"backward +{fmt_flops(c.flops_added)}"
                     + (f", largest micro-batch {c.max_batch:,}" if c.max_batch else "")))
    if report.compiled:
        rows.append(compile_row(report.compiled))
    for q in report.quantized:
        rows.append((f"What-if: {q.scheme} weights", f"peak {fmt_bytes(q.peak)}, parameters {fmt_bytes(q.parameters)} "
                                                    f"({q.layers} Linear layers; {q.layout})"))
    for note in report.capture.assumptions:
        rows.append(("Assumed", note))
    if report.capture.fallback_reason:
        where = "real CPU tensors" if report.capture.mode == "real" else "fake tensors"
        rows.append(("Capture", f"{where} ({report.capture.fallback_reason})"))
    return rows


def compile_row(c: dict) -> tuple[str, str]:
    """The compiled step beside the eager one: step time (on a GPU), peak, activations, kernels."""
    parts = []
    if c.get("step_time_s") is not None and c.get("eager_step_time_s") is not None:
        parts.append(f"step {c['step_time_s'] * 1e3:.1f} ms (eager {c['eager_step_time_s'] * 1e3:.1f} ms, "
                     f"{c['eager_step_time_s'] / c['step_time_s']:.2f}x)")
    if c.get("peak") is not None:
        parts.append(f"peak {fmt_bytes(c['peak'])} (eager {fmt_bytes(c['eager_peak'])})")
    parts.append(f"activations {fmt_bytes(c['activations'])} (eager {fmt_bytes(c['eager_activations'])})")
    parts.append(f"{c['fused_kernels']:,} fused kernels")
    return f"torch.compile ({c['mode']}) vs eager", ", ".join(parts)


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


def md_cell(value: object) -> str:
    """A markdown table cell: ``|`` escaped, ``<`` and ``>`` as entities (GitHub renders raw HTML)."""
    return str(value).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _table(body: list[list[str]], headers: list[str] | None, tablefmt: str, width: int | None,
           flexible: tuple[int, ...] = (), minimum: tuple[int, ...] = (), optional: tuple[int, ...] = ()) -> str:
    """tabulate, at most ``width`` columns wide (text formats): headers wrapped at spaces to their column's
    cells, then the ``flexible`` columns wrapped, the first one shaved first down to its ``minimum``;
    the ``optional`` columns dropped (last resort) when that is not enough."""
    if tablefmt == "github":  # a cell's "|" would end it (a module named "a|b" in a ModuleDict), "<" open HTML
        body = [[md_cell(c) for c in row] for row in body]
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


def module_table(report: ReportData, depth: int | None = None, tablefmt: str = "simple", width: int | None = None) -> str:
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


def unsupported_table(report: ReportData, tablefmt: str = "simple", width: int | None = None) -> str:
    if not report.tally.unsupported:
        return ""
    body = [[r["op"], str(r["count"]), r["module"] or "(root)"] for r in report.tally.unsupported]
    return _table(body, ["Op without a cost rule", "Count", "Module"], tablefmt, width, flexible=(2, 0),
                  minimum=(16, 16))


def no_gradient_table(report: ReportData, tablefmt: str = "simple", width: int | None = None) -> str:
    rows = report.tally.no_gradient
    if not rows:
        return ""
    body = [[r["module"] or "(root)", r["type"], fmt_count(r["count"]), fmt_bytes(r["bytes"]),
             f"{len(r['params'])} tensor{'s' if len(r['params']) != 1 else ''}"] for r in rows]
    return _table(body, ["Module", "Type", "Params", "Bytes", "Parameters"], tablefmt, width, flexible=(1, 0),
                  minimum=(10, 18))


def operators_table(report: ReportData, tablefmt: str = "simple", width: int | None = None, top: int | None = None) -> str:
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


def _precision_words(report: ReportData) -> str:
    """The precision asked for; fp32 (no autocast, no cast) on a model whose weights are mostly another dtype
    says so: the step runs in the weights' dtype ("bf16 weights as given")."""
    if report.precision != "fp32":
        return report.precision
    by_dtype: dict[torch.dtype, int] = {}
    for p in getattr(report.capture, "params", {}).values():
        by_dtype[p.dtype] = by_dtype.get(p.dtype, 0) + p.numel()
    main = max(by_dtype, key=by_dtype.get) if by_dtype else torch.float32
    short = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}.get(main)
    return f"{short} weights as given (no autocast)" if short else report.precision


def render(report: ReportData, tablefmt: str = "simple", depth: int | None = None, *, width: int | None = None,
           operators: bool = False) -> str:
    """The text (``tablefmt="simple"``) or markdown (``"github"``) report; ``width``: wrap to at most that
    many columns (text); ``operators``: add the per-operator table."""
    md = tablefmt == "github"
    depth_text = report.depth if depth is None else depth

    def heading(text: str, level: int = 2) -> str:
        return f"{'#' * level} {text}" if md else text

    summary = summary_rows(report)
    if md:
        summary_text = tabulate([[k, md_cell(v)] for k, v in summary], headers=["Quantity", "Estimate"],
                                tablefmt="github",
                                disable_numparse=True)
    else:
        key_width = max(len(k) for k, _ in summary)
        value_width = max(20, width - key_width - 2) if width else 0
        summary_text = tabulate([[k, _wrap(v, value_width) if value_width else v] for k, v in summary],
                                tablefmt="plain", disable_numparse=True)
    line = headline(report)
    head = title(report) if md or not width else _wrap(title(report), width)
    parts = [heading(head, 1), f"**{line}**" if md else (_wrap(line, width) if width else line), summary_text,
             heading(f"Per module (depth {depth_text})"), module_table(report, depth, tablefmt, width)]
    missing = no_gradient_table(report, tablefmt, width)
    if missing:
        parts += [heading("Trainable parameters that get no gradient in this step (check the inputs, or freeze "
                          "them)"), missing]
    if operators:
        parts += [heading("Per operator (aten ops, most FLOPs first)"), operators_table(report, tablefmt, width)]
    unsupported = unsupported_table(report, tablefmt, width)
    if unsupported:
        parts += [heading("Not counted (no rule; FLOPs of these ops are missing from the totals)"), unsupported]
    return "\n\n".join(parts) + "\n"

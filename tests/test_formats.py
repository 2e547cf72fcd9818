"""Output formats: csv (per-module rows), the self-contained HTML report, JSON schema vs docs/json.md."""

from __future__ import annotations

import csv
import html
import io
import json
import os
import re
import stat
from html.parser import HTMLParser

import pytest
import torch
from torch import nn

from estimator import estimate
from estimator.memory import MemoryProfile, Snapshot
from estimator.render import MAX_SVG_POINTS, SCHEMA_VERSION, fmt_bytes, timeline_svg
from estimator.report import Report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64))
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.norm(self.body(x)))


@pytest.fixture(scope="module")
def report() -> Report:
    return estimate(_Net(), torch.randn(16, 32), device="cpu", depth=2, model_name="net <&> \"quoted\"")


def test_csv_has_one_row_per_module_with_exact_integers(report):
    rows = list(csv.DictReader(io.StringIO(report.to_csv())))
    expected = report.to_dict()["modules"]
    assert [r["path"] for r in rows] == [m["path"] for m in expected]
    assert list(rows[0]) == list(Report.CSV_COLUMNS)
    for got, want in zip(rows, expected):
        for key in ("params", "activations", "flops_forward", "flops_backward"):
            assert int(got[key]) == want[key]
        assert abs(float(got["percent"]) - want["percent"]) < 1e-4
    t = report.tally
    assert sum(int(r["flops_forward"]) for r in rows) == t.flops["forward"]
    assert sum(int(r["flops_backward"]) for r in rows) == t.flops["backward"]
    assert sum(int(r["params"]) for r in rows) == t.params_total
    depth1 = list(csv.DictReader(io.StringIO(report.to_csv(depth=1))))
    assert len(depth1) < len(rows) and all(r["path"].count(".") == 0 for r in depth1)


class _Collect(HTMLParser):
    VOID = {"meta", "br", "img", "input", "link", "hr", "col", "source", "wbr"}
    SVG_EMPTY = {"line", "circle", "rect", "polygon", "path"}

    def __init__(self):
        super().__init__()
        self.stack: list[str] = []
        self.tags: list[tuple[str, dict]] = []
        self.errors: list[str] = []
        self.script_json = ""
        self._in_json = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)
        self._in_json = tag == "script" and dict(attrs).get("id") == "estimate-json"

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()
        self._in_json = False

    def handle_data(self, data):
        if self._in_json:
            self.script_json += data


def test_html_is_self_contained_and_balanced(report):
    page = report.to_html()
    parser = _Collect()
    parser.feed(page)
    parser.close()
    assert parser.errors == [] and parser.stack == []
    # No external resource of any kind: no links, sources, imports or url() references. The
    # only URL is the SVG namespace name, which is an identifier, never fetched.
    for tag, attrs in parser.tags:
        assert not ({"src", "href", "srcset", "action"} & set(attrs)), (tag, attrs)
        assert tag not in ("link", "img", "iframe", "object", "embed")
    assert re.findall(r"https?://[^\s\"']+", page) == ["http://www.w3.org/2000/svg"]
    assert "@import" not in page and "url(" not in page
    # One small inline script (the hover), which loads nothing
    scripts = re.findall(r"<script>(.*?)</script>", page, flags=re.S)
    assert len(scripts) == 1 and not re.search(r"fetch|XMLHttpRequest|import|src|eval", scripts[0])
    assert [a.get("type") for t, a in parser.tags if t == "script"].count("application/json") == 2
    # The title is escaped; the headline comes first; the summary and every module are there; the JSON is embedded.
    assert "net &lt;&amp;&gt; &quot;quoted&quot;" in page
    assert page.index(html.escape(report.headline())) < page.index("<svg")
    for key, value in report.summary_rows():
        assert html.escape(key) in page and html.escape(value) in page
    for path in report.tally.modules:
        if not path.startswith("("):
            assert f'title="{path or "(root)"}"' in page
    assert json.loads(parser.script_json) == json.loads(json.dumps(report.to_dict()))
    # The memory timeline: one polygon per category present, the peak marked with its size, the phases labelled.
    svg = page[page.index("<svg"):page.index("</svg>")]
    assert svg.count("<polygon") >= 2 and f"peak {fmt_bytes(report.memory.peak)}" in svg
    assert ">forward pass<" in svg and ">backward pass<" in svg and ">optimizer step<" in svg


def _profile(n: int) -> MemoryProfile:
    points = []
    for i in range(n):
        by = {"parameter": 1000, "temporary": (i * 7919) % 5000}
        points.append(Snapshot(i, "forward" if i < n // 2 else "backward", "m", "op", sum(by.values()), by))
    peak = max(points, key=lambda p: p.total)
    return MemoryProfile(peak=peak.total, peak_first_step=peak.total, peak_at=peak, peak_first_step_at=peak,
                         timeline=points, device="cpu")


def test_long_timelines_are_downsampled_keeping_the_peak():
    profile = _profile(25_000)
    svg = timeline_svg(profile)
    polygon = re.search(r'<polygon points="([^"]+)"', svg).group(1)
    assert len(polygon.split()) <= 2 * MAX_SVG_POINTS
    assert f"peak {fmt_bytes(profile.peak)}" in svg and len(svg) < 200_000
    # the highest drawn point is the peak: its y equals the peak marker's y
    cy = float(re.search(r'<circle cx="[^"]+" cy="([^"]+)"', svg).group(1))
    tops = [float(p.split(",")[1]) for p in re.findall(r'<polygon points="([^"]+)"', svg)[-1].split()]
    assert min(tops) == pytest.approx(cy, abs=0.11)


def _documented_schema() -> str:
    text = open(os.path.join(ROOT, "docs", "json.md")).read()
    start = text.index(f"## JSON (schema version {SCHEMA_VERSION})")
    block = text[start:]
    return block[block.index("```") + 3:block.index("```", block.index("```") + 3)]


def test_docs_document_every_json_key(report):
    schema = _documented_schema()
    d = report.to_dict()

    def documented(keys, where):
        missing = [k for k in keys if not re.search(rf'"{re.escape(k)}"', where)]
        assert missing == [], f"keys missing from the schema in docs/json.md: {missing}"

    documented(d, schema)
    documented(d["params"], schema)
    documented(d["memory"], schema)
    documented(d["flops"], schema)
    documented(d["modules"][0], schema)
    # a timed estimate's step time and fit (the fixture's has neither: no --gpu)
    timed = estimate(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)),
                     torch.randn(4, 16), gpu="H100", loss_fn=lambda out: out.pow(2).mean()).to_dict()
    documented(timed["step_time"], schema)
    documented(timed["fit"], schema)
    top_level = re.findall(r'^[{ ]"(\w+)":', schema, flags=re.M)
    assert set(top_level) <= set(d), f"docs/json.md documents keys the JSON does not have: {set(top_level) - set(d)}"


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    from estimator.cli import main

    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_formats_from_the_output_suffix(tmp_path, capsys):
    html_out, csv_out = tmp_path / "r.html", tmp_path / "modules.csv"
    small = ("examples/mlp.py:build", "--set", "batch=8", "--device", "cpu")
    for out in (html_out, csv_out):
        code, stdout, err = _cli(capsys, "estimate", *small, "--output", str(out))
        assert code == 0 and stdout == "", err
    assert html_out.read_text().startswith("<!DOCTYPE html>")
    rows = list(csv.DictReader(io.StringIO(csv_out.read_text())))
    assert rows and set(rows[0]) == set(Report.CSV_COLUMNS)
    # Written like any file the user makes: permissions follow the umask, not mkstemp's 0600.
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(html_out).st_mode) == 0o666 & ~umask
    # --format wins over the suffix; html goes to stdout when it is not a terminal.
    code, stdout, err = _cli(capsys, "estimate", *small, "--format", "html")
    assert code == 0 and stdout.startswith("<!DOCTYPE html>"), err
    # --format with an --output of another format's suffix is refused (issue 23), with an unknown suffix written
    code, stdout, err = _cli(capsys, "estimate", *small, "--format", "csv", "--output", str(tmp_path / "x.json"))
    assert code == 2 and "names a json file" in err and not (tmp_path / "x.json").exists()
    code, stdout, err = _cli(capsys, "estimate", *small, "--format", "csv", "--output", str(tmp_path / "x.out"))
    assert code == 0 and (tmp_path / "x.out").read_text().splitlines()[0] == ",".join(Report.CSV_COLUMNS)


def _markdown_tables(text: str) -> list[list[str]]:
    """The tables of a markdown text: runs of lines starting with '|'."""
    tables, run = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            run.append(line)
        elif run:
            tables.append(run)
            run = []
    return tables


def _cells(line: str) -> int:
    """Cells of a markdown table row: '|' not escaped, less the outer two."""
    return len(re.findall(r"(?<!\\)\|", line)) - 1


def test_markdown_tables_have_headers_and_escaped_cells():
    """Each markdown table is a header row, a separator and rows of as many cells (GitHub renders nothing
    else): a plan's tables had no header row (markdown-it rendered none of them), and a module named "a|b" (a
    ModuleDict key) split its row into one cell more than the header."""
    from estimator.plan import Planner

    class Named(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleDict({"a|b": nn.Linear(8, 8), "<b>x</b>": nn.Linear(8, 8)})

        def forward(self, x):
            return self.layers["<b>x</b>"](self.layers["a|b"](x))

    model, x = Named(), torch.randn(4, 8)
    texts = [estimate(model, x, device="cpu").render("github"),
             Planner(model, x, gpu="H100").plan("ddp", 2, solve=()).render("github")]
    for text in texts:
        tables = _markdown_tables(text)
        assert tables
        for table in tables:
            assert re.fullmatch(r"\|[-:|]+\|", table[1]) and not re.fullmatch(r"\|[-:|]+\|", table[0]), table[:2]
            assert {_cells(line) for line in table} == {_cells(table[0])}, table
    assert "a\\|b" in texts[0] and "&lt;b&gt;" in texts[0] and "<b>" not in texts[0]


def test_plan_charts_draw_each_step_to_its_time_and_each_row_in_a_colour_of_its_own():
    """The step-time bars drew the communication hidden behind compute after the step's end (a ZeRO-3 row of
    16.2 ms ran to 18.3 ms, past a 17.2 ms row), and DDP's communication buffers took the workspaces' colour.
    Each stacked bar now ends at its step time (the hidden part a thin bar beneath), read back from the SVG."""
    from estimator.plan import Planner
    from estimator.plan.html import ROW_COLORS, time_svg

    assert len(set(ROW_COLORS.values())) == len(ROW_COLORS)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
    planner = Planner(model, torch.randn(64, 256), gpu="A100-40GB")
    plans = [planner.plan(s, 4, solve=()) for s in ("ddp", "zero3", "fsdp")]
    svg = time_svg(plans)
    spans: dict[float, tuple[float, float]] = {}  # row's y -> (start, end) of its stacked parts
    for x, y, w, h in re.findall(r'<rect x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)"', svg):
        if float(h) > 4:  # the stacked parts of a row (the thin bar beneath is the hidden communication)
            lo, hi = spans.get(float(y), (float(x), 0.0))
            spans[float(y)] = (min(lo, float(x)), max(hi, float(x) + float(w)))
    lengths = [spans[y][1] - spans[y][0] for y in sorted(spans)]
    for p, length in zip(plans, lengths):
        assert length / lengths[0] == pytest.approx(p.step_time_s / plans[0].step_time_s, abs=0.01)


def test_docs_document_every_plan_json_key():
    """docs/plan.md listed keys the plan's JSON does not have (per_gpu's activations, peak_breakdown, min_gpus,
    units) and not those it has: every key of a plan, of its per_gpu and rows, and of a comparison and its rows
    is named there, and every key named at the top of the plan's list exists."""
    from estimator.plan import Planner

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = open(os.path.join(root, "docs", "plan.md"), encoding="utf-8").read()
    schema = text[text.index("JSON (`--format json`)"):text.index('"plans": [...]}`.') + 10]
    model = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 8))
    planner = Planner(model, torch.randn(8, 64), gpu="H100")
    plan = planner.plan("fsdp", 2, solve=()).to_dict()
    comparison = planner.compare([2], strategies=["ddp", "fsdp"], with_checkpointing=False).to_dict()
    for keys in (plan, plan["per_gpu"], plan["per_gpu"]["rows"], comparison, comparison["rows"][0]):
        missing = [k for k in keys if f'"{k}"' not in schema]
        assert missing == [], f"keys missing from docs/plan.md's JSON: {missing}"
    named = re.findall(r'"(\w+)"', schema[:schema.index('"per_gpu"')])
    assert set(named) <= set(plan), set(named) - set(plan)


def test_the_jsons_ops_by_time_are_the_reports():
    """The report's "Top ops by GPU time" sums every call of an op; the JSON had only the longest single calls
    (top_ops), from which that line cannot be rebuilt: ``step_time.by_op`` is the same list."""
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    report = estimate(model, torch.randn(32, 64), gpu="H100")
    line = next(l for l in str(report).splitlines() if l.startswith("Top ops by GPU time"))
    rows = report.to_dict()["step_time"]["by_op"]
    shown = ", ".join(f"{r['op'].removeprefix('aten.')} {r['gpu_s'] * 1e3:.2f} ms" for r in rows[:5])
    assert line.split(None, 5)[-1].strip().startswith(shown[:60]), (line, shown)

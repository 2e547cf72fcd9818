"""The HTML report in a real headless browser (Chromium from the distribution's packages).

Skips when no Chromium is installed (``apt-get install chromium`` on Debian).  The page is loaded
from a file with the network off; a test-only script appended to a copy of the page measures the
layout and moves the mouse over the chart, and ``--dump-dom`` returns what it found.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest

import zoo
from estimator import estimate

BROWSER = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium installed (apt-get install chromium)")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]

PROBE = """
<script>
(function () {
  var svg = document.getElementById("timeline"), box = svg.getBoundingClientRect();
  var out = {chart: box.width, page: document.documentElement.clientWidth, height: box.height,
             before: document.getElementById("pt-place").textContent};
  var x = box.left + box.width * 0.97, y = box.top + box.height / 2;  // far right: the optimizer step
  svg.dispatchEvent(new MouseEvent("mousemove", {clientX: x, clientY: y, bubbles: true}));
  out.after = document.getElementById("pt-place").textContent;
  out.title = document.getElementById("pt-title").textContent;
  out.cursor = document.getElementById("cursor").getAttribute("visibility");
  out.items = document.querySelectorAll("#pt-bytes li").length;
  out.details = document.querySelectorAll(".tree details").length;
  out.open = document.querySelectorAll(".tree details[open]").length;
  var pre = document.createElement("pre"); pre.id = "probe"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>
"""


def _chromium(*args: str, width: int = 1400, height: int = 1600) -> subprocess.CompletedProcess:
    profile = tempfile.mkdtemp(prefix="estimator-chromium-")
    try:
        return subprocess.run([BROWSER, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", *args],
                              capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    model, inputs, loss_fn = zoo.gpt()
    report = estimate(model, inputs, loss_fn=loss_fn, checkpoint="Block", gpu="L4")
    path = tmp_path_factory.mktemp("html") / "report.html"
    path.write_text(report.to_html())
    return report, path


def test_chart_spans_the_page_and_hover_shows_the_point(page):
    report, path = page
    probe = path.with_name("probe.html")
    probe.write_text(path.read_text().replace("</body>", PROBE + "</body>"))
    proc = _chromium("--dump-dom", probe.as_uri())
    found = re.search(r'<pre id="probe">(.*?)</pre>', proc.stdout)
    assert found, proc.stderr[-2000:]
    out = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    # full width: the chart takes the page's width less the body's margins
    assert out["chart"] >= 0.9 * out["page"] and out["height"] > 250
    # before the mouse moves, the panel shows the peak; hovering the far right shows the optimizer step
    from estimator.render import place

    assert out["before"] == place(report, report.memory.peak_at)
    assert out["after"].startswith("optimizer step (AdamW") and out["title"].startswith("Live: ")
    assert out["cursor"] == "visible" and out["items"] >= 3
    # the module tree: collapsible, the root open
    assert out["details"] >= 2 and out["open"] >= 1


def test_screenshot(page):
    _, path = page
    shot = path.with_name("report.png")
    proc = _chromium(f"--screenshot={shot}", path.as_uri() + "#at=peak")
    assert shot.exists() and shot.stat().st_size > 30_000, proc.stderr[-2000:]
    if os.environ.get("ESTIMATOR_SCREENSHOTS"):  # keep it to look at: ESTIMATOR_SCREENSHOTS=dir pytest ...
        shutil.copy(shot, os.path.join(os.environ["ESTIMATOR_SCREENSHOTS"], "report.png"))


# -- issue 23 items 6 and 7: the phone, the GPU's room, the plan's page, the notebook view -------------------------

LAYOUT_PROBE = """
<script>
window.addEventListener("load", function () {
  var out = {page: document.documentElement.scrollWidth, view: window.innerWidth, clipped: []};
  var summary = document.querySelector("table.summary");
  if (summary) out.summary = summary.getBoundingClientRect().right;
  document.querySelectorAll("table.summary td, table.summary th, .headline, h1").forEach(function (e) {
    if (e.scrollWidth > e.clientWidth + 1) out.clipped.push(e.textContent.slice(0, 40)); });
  var svg = document.getElementById("timeline"), line = svg && svg.querySelector("line.limit");
  if (line) out.limit = +svg.dataset.ymax * (1 - (+line.getAttribute("y1") - +svg.dataset.top) / +svg.dataset.height);
  out.bars = document.querySelectorAll("svg.bars").length;
  out.capacity = document.querySelectorAll("svg.bars line.capacity").length;
  var frame = document.querySelector("iframe");
  if (frame) out.frame = frame.contentDocument.querySelector(".headline").textContent;
  var plans = document.querySelector("table.plans");
  if (plans) out.plan_rows = plans.querySelectorAll("tbody tr").length;
  var pre = document.createElement("pre"); pre.id = "probe"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def _probe(path, page: str, width: int) -> dict:
    """Load ``page`` in a viewport ``width`` pixels wide and return what :data:`LAYOUT_PROBE` measured.  Headless
    Chromium makes no window narrower than 500 px, so the page is shown in a frame of that width (a phone's
    viewport: the page sees ``innerWidth == width``) and the frame's findings are copied out."""
    import html as html_module

    probed = page.replace("</body>", LAYOUT_PROBE + "</body>")
    framed = (f'<!DOCTYPE html><html><body style="margin:0"><iframe id="phone" style="width:{width}px;height:3000px;'
              f'border:0" srcdoc="{html_module.escape(probed, quote=True)}"></iframe><script>window.addEventListener('
              f'"load", function () {{ var f = document.getElementById("phone").contentDocument.getElementById("probe");'
              f' var pre = document.createElement("pre"); pre.id = "probe"; pre.textContent = f ? f.textContent : "";'
              f' document.body.appendChild(pre); }});</script></body></html>')
    probe = path.with_name(f"probe-{width}.html")
    probe.write_text(framed)
    proc = _chromium("--dump-dom", "--virtual-time-budget=5000", probe.as_uri(), width=max(width + 20, 600))
    found = re.search(r'<pre id="probe">(.*?)</pre>', proc.stdout)
    assert found, proc.stderr[-2000:]
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))


@pytest.fixture(scope="module")
def tight(tmp_path_factory):
    """A report on a GPU whose room for the peak is within the chart's scale (so the line is drawn on it)."""
    import dataclasses

    from estimator.hardware import lookup

    model, inputs, loss_fn = zoo.gpt()
    gpu = dataclasses.replace(lookup("L4"), name="L4-530MiB", memory=530 * 2**20, total_memory=None)
    report = estimate(model, inputs, loss_fn=loss_fn, gpu=gpu, solve_batch=False)
    return report, tmp_path_factory.mktemp("tight") / "report.html"


@pytest.mark.parametrize("width", [390, 1280])
def test_the_page_never_overflows_and_draws_the_gpu_room(tight, width):
    report, path = tight
    out = _probe(path, report.to_html(), width)
    # a phone (390 px): nothing wider than the window, the summary inside it, no cell cut off
    assert out["page"] <= out["view"] and out["summary"] <= out["view"] and out["clipped"] == [], out
    # the dashed line at the GPU's room for the peak: its capacity (530 MiB) less the CUDA reserve
    room = report.gpu.capacity - sum(report.memory.reserve.values())
    assert out["limit"] == pytest.approx(room, rel=0.01)


def test_screenshot_at_phone_width(tight):
    import html as html_module

    report, path = tight
    # in a frame 390 px wide (headless Chromium makes no narrower window): what a phone shows
    path.write_text(f'<!DOCTYPE html><html><body style="margin:0"><iframe style="width:390px;height:2400px;border:0" '
                    f'srcdoc="{html_module.escape(report.to_html(), quote=True)}"></iframe></body></html>')
    shot = path.with_name("phone.png")
    proc = _chromium(f"--screenshot={shot}", path.as_uri(), width=500, height=2400)
    assert shot.exists() and shot.stat().st_size > 30_000, proc.stderr[-2000:]
    if os.environ.get("ESTIMATOR_SCREENSHOTS"):
        shutil.copy(shot, os.path.join(os.environ["ESTIMATOR_SCREENSHOTS"], "report-390px.png"))


@pytest.mark.parametrize("width", [390, 1280])
def test_the_plan_page_shows_memory_against_capacity_and_time(tmp_path, width):
    from estimator.plan import compare

    model, inputs, loss_fn = zoo.ZOO["mlp"]()
    cmp = compare(model, inputs, loss_fn=loss_fn, gpu="L4", gpus=[2], strategies=["ddp", "zero2"])
    out = _probe(tmp_path / "plan.html", cmp.to_html(), width)
    assert out["page"] <= out["view"] and out["clipped"] == [], out
    # two charts (memory by layout, step time); each layout's bar has its GPU's capacity marked; the table
    assert out["bars"] == 2 and out["capacity"] == len(cmp.plans) and out["plan_rows"] == len(cmp.plans)


def test_the_notebook_view_renders_the_report_in_its_frame(tmp_path):
    model, inputs, loss_fn = zoo.ZOO["mlp"]()
    report = estimate(model, inputs, loss_fn=loss_fn, gpu="L4", solve_batch=False)
    notebook = f"<!DOCTYPE html><html><body><div class=cell>{report._repr_html_()}</div></body></html>"
    out = _probe(tmp_path / "notebook.html", notebook, 1000)
    assert out["frame"] == report.headline()

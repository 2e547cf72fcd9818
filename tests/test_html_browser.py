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

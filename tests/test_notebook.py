"""Notebooks (issue 23 item 6): a report, a plan and a comparison show their answer in a line (``repr``) and
their HTML inline (``_repr_html_``, what Jupyter displays); the page in a real browser is checked in
tests/test_html_browser.py."""

from __future__ import annotations

import html
import re

import pytest

import zoo
from estimator import estimate
from estimator.plan import compare, plan


@pytest.fixture(scope="module")
def mlp_report():
    model, inputs, loss_fn = zoo.ZOO["mlp"]()
    return estimate(model, inputs, loss_fn=loss_fn, gpu="L4", solve_batch=False)


def test_repr_is_the_headline_not_every_field(mlp_report):
    text = repr(mlp_report)
    # the issue measured 37,251 characters for a 4-layer MLP: the capture's records, every tensor, the tallies
    assert text == f"<Report of MLP: {mlp_report.headline()}>" and len(text) < 400
    assert str(mlp_report) == mlp_report.render()  # print() still shows the tables


def test_repr_html_is_the_html_report_in_an_iframe(mlp_report):
    frame = mlp_report._repr_html_()
    assert frame.startswith("<iframe srcdoc=") and frame.endswith("</iframe>")
    srcdoc = re.search(r'srcdoc="([^"]*)"', frame).group(1)  # quotes escaped: the page is one attribute
    assert html.unescape(srcdoc) == mlp_report.to_html()


def test_plan_and_comparison_show_their_answer():
    model, inputs, loss_fn = zoo.ZOO["mlp"]()
    p = plan(model, inputs, loss_fn=loss_fn, gpu="L4", gpus=2, strategy="ddp", solve=())
    assert repr(p).startswith("<Plan: FITS on 2 x L4: needs ") and len(repr(p)) < 300
    table = p._repr_html_()
    assert "<table" in table and table.count("<tr") == 2  # the header and the plan
    assert "2 x L4, ddp" in table and html.escape(p.render().splitlines()[0]) in table
    c = compare(model, inputs, loss_fn=loss_fn, gpu="L4", gpus=[2], strategies=["ddp", "zero2"])
    assert repr(c).startswith(f"<Comparison of {len(c.plans)} plans: fastest: ")
    rows = c._repr_html_()
    assert rows.count("<tr") == 1 + len(c.plans)
    # the recommended row is marked, as '*' marks it in the text table
    best = c.recommended
    marked = re.findall(r'<tr style="font-weight:600[^"]*"><td>([^<]*)</td>', rows)
    assert len(marked) == 1 and marked[0].startswith(f"{best.config.gpus} x {best.config.gpu}, {best.config.strategy}")

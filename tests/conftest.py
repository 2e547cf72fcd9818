"""Shared fixtures: the zoo, and per-session caches of ground truth and estimates.

A case is measured (real CPU step) and estimated once per (case, optimizer,
device) per test session; every comparison test reads the cached results.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for path in (HERE, ROOT):
    if path not in sys.path:
        sys.path.insert(0, path)

import groundtruth  # noqa: E402
import zoo  # noqa: E402

# The estimator warns about ops without a cost rule; the tests inspect that list directly.
logging.getLogger("estimator").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", message=".*TF32 acceleration on top of oneDNN.*")


def build_case(name: str, device: str = "cpu"):
    if name in zoo.HF:
        pytest.importorskip("transformers")
    return zoo.ZOO[name](device=device)


class Results:
    """Session cache: ground truth and estimate dicts keyed by (case, optimizer spec key, device)."""

    def __init__(self):
        self._truth: dict = {}
        self._estimate: dict = {}

    def truth(self, name: str, optimizer="adamw", key=None):
        k = (name, key or optimizer)
        if k not in self._truth:
            model, inputs, loss_fn = build_case(name)
            spec = optimizer(model) if callable(optimizer) and not isinstance(optimizer, type) else optimizer
            self._truth[k] = groundtruth.measure(model, inputs, spec, loss_fn)
        return self._truth[k]

    def estimate(self, name: str, optimizer="adamw", key=None, device: str = "cuda"):
        from estimator import estimate

        k = (name, key or optimizer, device)
        if k not in self._estimate:
            model, inputs, loss_fn = build_case(name)
            spec = optimizer(model) if callable(optimizer) and not isinstance(optimizer, type) else optimizer
            report = estimate(model, inputs, optimizer=spec, loss_fn=loss_fn, device=device)
            self._estimate[k] = report
        return self._estimate[k]


@pytest.fixture(scope="session")
def results() -> Results:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return Results()


def pytest_configure(config):
    config.addinivalue_line("markers", "hf: needs transformers (shrunk configs, random weights)")

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
import torchvision_env  # noqa: E402
import zoo  # noqa: E402

# torchvision's PyPI wheels (the test extras install one) link the CUDA torch's libraries: imported first in
# every process with the two schemas its C++ library would have defined (torchvision_env), so that every test
# sees the same torchvision, or none, whatever ran before it; the test's subprocesses do the same.
torchvision_env.load()

# The estimator warns about ops without a cost rule; the tests inspect that list directly.
logging.getLogger("estimator").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", message=".*TF32 acceleration on top of oneDNN.*")


def build_case(name: str, device: str = "cpu"):
    if name in zoo.HF:
        pytest.importorskip("transformers")
    return zoo.ZOO[name](device=device)


class Results:
    """Session cache keyed by (case, optimizer key[, device]).

    Ground truth and ``report.to_dict()`` are kept for the session; whole reports
    (fx graph + fake tensors) only for the last few cases, since a large live heap
    makes every full garbage collection slow.
    """

    KEEP_REPORTS = 4

    def __init__(self):
        self._truth: dict = {}
        self._dicts: dict = {}
        self._reports: dict = {}
        self._errors: dict = {}

    @staticmethod
    def _spec(optimizer, model):
        return optimizer(model) if callable(optimizer) and not isinstance(optimizer, type) else optimizer

    def truth(self, name: str, optimizer="adamw", key=None) -> dict:
        k = (name, key or optimizer)
        if k not in self._truth:
            model, inputs, loss_fn = build_case(name)
            self._truth[k] = groundtruth.measure(model, inputs, self._spec(optimizer, model), loss_fn)
        return self._truth[k]

    def report(self, name: str, optimizer="adamw", key=None, device: str = "cpu"):
        from estimator import estimate

        k = (name, key or optimizer, device)
        if k in self._errors:  # a failing estimate fails every test of the case, once
            raise self._errors[k]
        if k not in self._reports:
            model, inputs, loss_fn = build_case(name)
            try:
                report = estimate(model, inputs, optimizer=self._spec(optimizer, model), loss_fn=loss_fn,
                                  device=device)
            except Exception as exc:
                self._errors[k] = exc
                raise
            self._dicts[k] = report.to_dict()
            self._reports[k] = report
            while len(self._reports) > self.KEEP_REPORTS:
                self._reports.pop(next(iter(self._reports)))
        return self._reports[k]

    def estimate(self, name: str, optimizer="adamw", key=None, device: str = "cpu") -> dict:
        """``estimate(..., device=device).to_dict()``; device "cpu" (the default) picks the kernels
        the real CPU step of the ground truth runs (SDPA backend among them)."""
        k = (name, key or optimizer, device)
        if k not in self._dicts:
            self.report(name, optimizer, key, device)
        return self._dicts[k]


@pytest.fixture(scope="session")
def results() -> Results:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return Results()


def pytest_configure(config):
    # one process per core between them: pytest-xdist's workers each take cores / workers intra-op threads (two
    # workers of two threads each on the 2-core CI machine spin-waited on each other: a zoo test pair ran 26 %
    # slower than with one thread each)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    config.addinivalue_line("markers", "hf: needs transformers (shrunk configs, random weights)")


# The files whose real multi-process runs take longest, heaviest first (measured: their fixtures of gloo runs take
# 30-90 s each on the 2-core machine).  pytest-xdist's --dist loadfile hands files to its workers in collection
# order, so a heavy file collected last leaves one worker running it alone at the end; started first, the
# others fill in beside them.
HEAVY_FIRST = ("test_plan.py", "test_pipeline.py", "test_expert_parallel.py", "test_context_parallel.py",
               "test_compile.py", "test_how_many_gpus.py", "test_replicate_pipeline.py", "test_replicate.py",
               "test_float8.py", "test_zoo_sweep.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(os.path.basename(str(item.fspath)), len(rank)))  # stable: files keep order

"""Real runs of tests/dist_worker.py on gloo, started before the plans they check are traced (shared by the
context- and expert-parallel tests): one process per rank, each writing its rank's numbers as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Callable

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "dist_worker.py")


def launch(case: dict, world: int, directory) -> list[subprocess.Popen]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    config = json.dumps({"cases": [case]})
    return [subprocess.Popen([sys.executable, WORKER, str(r), str(world), str(directory / "init"),
                              str(directory / f"r{r}.json"), config], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for r in range(world)]


def real_and_planned(launches: list[tuple[dict, int, Any]], ranks: dict[str, list[int]],
                     plans: Callable[[], dict]) -> tuple[dict, dict]:
    """Start every ``(case, world, directory)``'s processes, make ``plans()`` while they run, wait for them (a
    failed rank fails with its stderr); (real numbers by (run id, rank) for ``ranks[case name]``, the plans)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    procs = [(case, world, d, launch(case, world, d)) for case, world, d in launches]
    try:
        planned = plans()
        for case, world, _, started in procs:
            for r, p in enumerate(started):
                _, err = p.communicate(timeout=420)
                assert p.returncode == 0, f"{case['name']} rank {r} failed:\n{err[-4000:]}"
    except BaseException:
        for *_, started in procs:
            for p in started:
                p.kill()
        raise
    real = {}
    for case, world, d in launches:
        for r in ranks[case["name"]]:
            for key, value in json.loads((d / f"r{r}.json").read_text())["runs"].items():
                real[(key.split("/")[1], r)] = value
    return real, planned


def assert_states_exact(runs: tuple[dict, dict], run: str, rank: int) -> None:
    """The plan's parameters, gradients and optimizer state are the real run's, to the byte."""
    real, plans = runs
    x, g = real[(run, rank)], plans[(run, rank)].per_gpu
    assert (g.parameters, g.gradients, g.optimizer_state) == (x["parameters"], x["gradients"], x["optimizer_state"])


def assert_peak_within(runs: tuple[dict, dict], run: str, rank: int, rel: float = 0.01) -> None:
    """The plan's peak is within ``rel`` of the real run's peak of live bytes."""
    real, plans = runs
    x, g = real[(run, rank)], plans[(run, rank)].per_gpu
    assert g.peak == pytest.approx(x["peak"], rel=rel), (g.peak, x["peak"], x["peak_op"], g.peak_op)

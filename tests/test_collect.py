"""The collector during an estimate or a plan (``estimator.collect``): only objects made during the call are
scanned, and the caller's collector is as it was afterwards."""

from __future__ import annotations

import gc

import torch
from torch import nn

from estimator import estimate
from estimator.plan import Planner


def _model_and_inputs():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)), torch.randn(8, 16)


def test_an_estimate_scans_only_its_own_objects_and_restores_the_collector():
    model, x = _model_and_inputs()
    seen = []

    def loss_fn(out):  # runs inside the estimate's capture
        seen.append(gc.get_freeze_count())
        return out.sum()

    assert gc.get_freeze_count() == 0
    estimate(model, x, loss_fn=loss_fn)
    assert seen and all(n > 0 for n in seen)  # the caller's objects were out of the collector's sight
    assert gc.get_freeze_count() == 0 and gc.isenabled()  # and put back


def test_a_caller_that_froze_or_disabled_the_collector_keeps_it_so():
    model, x = _model_and_inputs()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        estimate(model, x)
        assert gc.get_freeze_count() > frozen // 2  # not unfrozen (some frozen objects may have died meanwhile)
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        estimate(model, x)
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_a_plan_scans_only_its_own_objects_and_restores_the_collector():
    model, x = _model_and_inputs()
    seen = []

    def loss_fn(out):
        seen.append(gc.get_freeze_count())
        return out.sum()

    Planner(model, x, gpu="H100", loss_fn=loss_fn).plan("ddp", 1, solve=False)
    assert seen and all(n > 0 for n in seen) and gc.get_freeze_count() == 0 and gc.isenabled()


def test_no_automatic_collection_runs_during_a_plan_and_its_cycles_are_collected_after():
    """Between its traces too (the progress callback runs outside the step, which pauses the collector itself),
    the collector is off; a reference cycle made during the plan is freed by the first collection after it."""
    import weakref

    model, x = _model_and_inputs()
    enabled, cycles = [], []

    class Node:
        pass

    def loss_fn(out):
        node = Node()
        node.me = node  # a cycle: only the collector frees it
        cycles.append(weakref.ref(node))
        return out.sum()

    Planner(model, x, gpu="H100", loss_fn=loss_fn,
            progress=lambda *_: enabled.append(gc.isenabled())).plan("ddp", 1)
    assert enabled and not any(enabled) and gc.isenabled() and gc.get_freeze_count() == 0
    gc.collect()
    assert cycles and all(ref() is None for ref in cycles)


def test_a_comparison_settles_after_each_row():
    """After each row the cycles made so far are collected and the survivors frozen: the second row runs with
    more objects frozen than the first (the traces the planner keeps), and all are back in sight after."""
    from estimator.plan import compare

    model, x = _model_and_inputs()
    frozen: dict[str, list[int]] = {"plan 1 of": [], "plan 2 of": []}

    def progress(stage, detail=""):
        for row, counts in frozen.items():
            if stage.startswith(row):
                counts.append(gc.get_freeze_count())

    compare(model, x, gpu="H100", gpus=[2], strategies=["ddp", "fsdp"], progress=progress)
    assert frozen["plan 1 of"] and frozen["plan 2 of"]
    assert min(frozen["plan 2 of"]) > max(frozen["plan 1 of"])
    assert gc.get_freeze_count() == 0 and gc.isenabled()

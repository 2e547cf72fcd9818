"""An engine's optimizer step traced on its local shards (``estimator.capture.step``): for an element-wise
optimizer (``estimator.optim.ELEMENTWISE``) the step on FSDP2's and tensor parallelism's DTensor parameters is
the same step on each rank's local tensors, so the capture runs it on meta twins of the shards.  The truth is
the step on the DTensors themselves, as the engine runs it, traced in the same test: every op, allocation,
free and size of the rank's step must be the same."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

import estimator.capture.step as step_module
from estimator.plan import Planner
from estimator.plan.layout import Layout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _llama():
    spec = importlib.util.spec_from_file_location("_opt_llama", os.path.join(ROOT, "examples", "llama.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with torch.device("meta"):
        config = module.LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=128, vocab_size=128,
                                    max_seq_len=32)
        model = module.Llama(config)
    idx = torch.zeros(2, 16, dtype=torch.long)
    return model, (idx, idx.clone())


def _rank_step(layout: Layout, optimizer: str, monkeypatch, on_shards: bool):
    """The rank's step under ``layout``; ``on_shards=False``: the optimizer forced onto the DTensors."""
    twins = []
    real_twin = step_module.meta_twin

    def counting_twin(rec, p, grad=None, requires_grad=None):
        if grad is not None or requires_grad is not None:  # a shard's twin (the engine path)
            twins.append(p)
        return real_twin(rec, p, grad, requires_grad)

    monkeypatch.setattr(step_module, "meta_twin", counting_twin)
    if not on_shards:
        monkeypatch.setattr(step_module, "elementwise", lambda spec: False)
    model, inputs = _llama()
    step = Planner(model, inputs, gpu="H100", optimizer=optimizer).traced(layout)
    monkeypatch.undo()
    return step, twins


def _ops(step) -> list[tuple]:
    """Each op of the rank's step with its phase and the shapes and dtypes it made (storage ids aside: the
    DTensor path lifts Adam's 4-byte CPU ``step`` scalars into the fake mode, a storage each, never on the GPU)."""
    return [(n.meta.get("phase"), str(n.target), n.meta.get("spec"), n.meta.get("stride"))
            for n in step.cap.nodes]


@pytest.mark.parametrize("layout,optimizer", [
    (Layout("fsdp", 4), "adamw"),
    (Layout("fsdp", 4), "sgd-momentum"),
    (Layout("fsdp", 8, tp=2), "adam"),
    (Layout("fsdp", 8, tp=2, sequence_parallel=True), "adamw"),
    (Layout("ddp", 4, tp=2), "adamw"),
    (Layout("hsdp", 8, gpus_per_node=4), "adamw"),
])
def test_an_elementwise_step_on_the_local_shards_is_the_engines_step(layout, optimizer, monkeypatch):
    shards, twins = _rank_step(layout, optimizer, monkeypatch, on_shards=True)
    dtensors, none = _rank_step(layout, optimizer, monkeypatch, on_shards=False)
    assert twins and not none  # the shards' path ran in the first trace only
    assert _ops(shards) == _ops(dtensors)
    for field in ("parameters_bytes", "gradients_bytes", "optimizer_state_bytes", "activations_bytes"):
        assert getattr(shards.tally, field) == getattr(dtensors.tally, field), field
    a, b = shards.peak("cuda"), dtensors.peak("cuda")
    assert (a.total, dict(a.by_row)) == (b.total, dict(b.by_row))
    # live bytes through the optimizer step: its most and what it leaves (the timelines differ only in the
    # DTensor path's 4-byte CPU scalars, lifted into the fake mode and freed at once)
    for step in (shards, dtensors):
        step.opt = [s.total for s in step.profile.timeline if s.phase == "optimizer"]
    assert (max(shards.opt, default=0), shards.opt[-1:]) == (max(dtensors.opt, default=0), dtensors.opt[-1:])
    planner = Planner(*_llama(), gpu="H100", optimizer=optimizer)
    gpu = planner.gpu
    assert planner._time(layout, shards, gpu) == planner._time(layout, dtensors, gpu)


def test_an_optimizer_that_is_not_elementwise_runs_on_the_dtensors(monkeypatch):
    """A subclass may reduce over a tensor (its step is not known to be the local one): the engine's path."""

    class Mine(torch.optim.AdamW):
        pass

    _, twins = _rank_step(Layout("fsdp", 4), Mine, monkeypatch, on_shards=True)
    assert twins == []

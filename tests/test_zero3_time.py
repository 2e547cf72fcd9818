"""ZeRO-3's per-unit gathers in the step time (issue 23 item 1): each wrap unit's parameters all-gathered before
its forward and its backward, its gradients reduce-scattered after its backward, one unit prefetched.  The
bounds follow from the schedule itself: with no compute to hide behind every collective is exposed; with
unbounded compute only the first gather of each pass and the last reduce-scatter are."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from estimator.plan import Planner
from estimator.plan.layout import Layout
from estimator.plan.schedule import zero3_gathers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("ex_llama_z3", os.path.join(ROOT, "examples", "llama.py"))
llama = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(llama)


@pytest.fixture(scope="module")
def traced():
    cfg = {"vocab_size": 512, "dim": 64, "hidden_dim": 128, "n_layers": 3, "n_heads": 4, "n_kv_heads": 2,
           "max_seq_len": 32}
    with torch.device("meta"):
        model = llama.Llama(llama.LlamaConfig(**cfg))
    idx = torch.zeros(2, 32, dtype=torch.long)
    planner = Planner(model, (idx, idx.clone()), gpu="H100")
    return planner, planner.traced(Layout("zero3", 8), ())


def _seconds(nbytes):
    return nbytes / 1e9  # a 1 GB/s link, no latency


def test_bounds_of_the_exposed_gathers(traced):
    planner, step = traced
    units = planner.unit_paths
    assert len(units) == 3
    params, grads = 1e9, 2e9
    # per unit: its share of the parameter elements (the rest of the model: embeddings, norm, head, a unit too)
    share = {}
    for name, p in step.cap.params.items():
        owner = step.cap.param_owner.get(name, "")
        key = next((u for u in units if owner == u or owner.startswith(u + ".")), "")
        share[key] = share.get(key, 0) + p.numel()
    total = sum(share.values())
    ag = {u: _seconds(params * n / total) for u, n in share.items()}
    rs = {u: _seconds(grads * n / total) for u, n in share.items()}

    none = [(0.0, 0.0, 0.0)] * len(step.cap.nodes)  # no compute: nothing hides
    exposed, ag_total, rs_total = zero3_gathers(step, none, units, params, grads, lambda k, b: _seconds(b))
    assert ag_total == pytest.approx(2 * sum(ag.values())) and rs_total == pytest.approx(sum(rs.values()))
    assert exposed == pytest.approx(ag_total + rs_total)

    endless = [(1e9, 0.0, 0.0)] * len(step.cap.nodes)  # every unit computes far longer than any collective
    exposed, _, _ = zero3_gathers(step, endless, units, params, grads, lambda k, b: _seconds(b))
    # forward order: the rest of the model (the embedding runs first), then the layers; the backward the reverse
    first, last = "", units[-1]
    assert exposed == pytest.approx(ag[first] + ag[last] + rs[first])


def test_zero3_costs_its_gathers_in_the_plan(traced):
    planner, _ = traced
    p = planner.plan("zero3", 8, solve=())
    t = p.time
    assert t.exposed_comm_s > 0 and "per-unit gathers" in t.model
    assert t.step_time_s == pytest.approx(t.compute_s + t.exposed_comm_s)


@pytest.mark.parametrize("semantics", ["deepspeed", "paper"])
@pytest.mark.parametrize("gpus", [2, 8])
def test_zero2_holds_no_more_than_zero1(semantics, gpus):
    """ZeRO-2 partitions the gradients ZeRO-1 keeps whole, so no rank's peak grows: its 16-bit gradient
    partition lives from backward to zero_grad as ZeRO-1's full gradients do.  (ZeRO-3 can hold more than
    ZeRO-2 on few GPUs: its gathering buffer for the largest unit against a small partition saving.)"""
    cfg = {"vocab_size": 512, "dim": 64, "hidden_dim": 128, "n_layers": 3, "n_heads": 4, "n_kv_heads": 2,
           "max_seq_len": 32}
    with torch.device("meta"):
        model = llama.Llama(llama.LlamaConfig(**cfg))
    idx = torch.zeros(2, 32, dtype=torch.long)
    planner = Planner(model, (idx, idx.clone()), gpu="H100", zero_semantics=semantics)
    peaks = [planner.plan(f"zero{k}", gpus, solve=()).per_gpu.peak for k in (1, 2)]
    assert peaks[0] >= peaks[1], peaks


def test_gradient_accumulation_communicates_as_deepspeed_stages_do():
    """Under ``grad_accum`` N DeepSpeed's stage 2 reduce-scatters in every micro-step's backward (gradient hooks:
    ``partition_gradients``), stage 3 gathers and reduce-scatters in every micro-step, stage 1 reduces once at
    the boundary; the all-gather of the updated parameters (stages 1-2) runs once per optimizer step."""
    cfg = {"vocab_size": 512, "dim": 64, "hidden_dim": 128, "n_layers": 3, "n_heads": 4, "n_kv_heads": 2,
           "max_seq_len": 32}
    with torch.device("meta"):
        model = llama.Llama(llama.LlamaConfig(**cfg))
    idx = torch.zeros(2, 32, dtype=torch.long)
    n = 4
    one, four = (Planner(model, (idx, idx.clone()), gpu="H100", grad_accum=g) for g in (1, n))
    for stage, rs_times, ag_times in ((1, 1, 1), (2, n, 1), (3, n, n)):
        a, b = (p.plan(f"zero{stage}", 8, solve=()).time for p in (one, four))
        assert b.comm_bytes_per_gpu["reduce_scatter"] == rs_times * a.comm_bytes_per_gpu["reduce_scatter"]
        assert b.comm_bytes_per_gpu["all_gather"] == ag_times * a.comm_bytes_per_gpu["all_gather"]
        assert b.comm_by_kind_s["reduce_scatter"] == pytest.approx(rs_times * a.comm_by_kind_s["reduce_scatter"])
        assert b.step_time_s == pytest.approx(b.compute_s + b.exposed_comm_s)

"""Asynchronous TP (``--async-tp``): torch.compile's micro-pipelined tensor parallelism, in the step time only.

No CPU run can measure it (torch's symmetric-memory kernels are CUDA's), so the checks are the model's own
arithmetic (:class:`estimator.plan.schedule.MicroPipelinedTP`, the chunk pipelines of torch's
``_pipelined_multi_all_gather_and_consume`` and ``_pipelined_produce_and_all2all``) and what must hold of any
plan: the memory is the synchronous plan's, the step is no longer than it and no shorter than its compute, and
what it saves is at most the tensor-parallel group's communication.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from estimator import UserError
from estimator.plan import Planner
from estimator.plan.schedule import MicroPipelinedTP

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import llama  # noqa: E402

# large enough that a step is not bound by the host's launches (its tensor-parallel collectives then show)
CONFIG = {"vocab_size": 256, "dim": 2048, "hidden_dim": 5632, "n_layers": 2, "n_heads": 16, "n_kv_heads": 16,
          "max_seq_len": 2048}


def _planner() -> Planner:
    with torch.device("meta"):
        model = llama.Llama(llama.LlamaConfig(**CONFIG))
    idx = torch.zeros(2, 2048, dtype=torch.long)
    return Planner(model, (idx, idx.clone()), gpu="H100", precision="fsdp-bf16", compile="block")


def test_a_matmul_fused_with_its_all_gather_waits_only_for_the_last_chunk():
    """All-gather from t = 0 to 10 over 4 ranks; the matmul (8) issued at 1 starts on the local chunk at once and
    ends at max(1 + 8, 10 + 8 / 4) = 12; a view between them does not wait for the all-gather."""
    fused = MicroPipelinedTP()
    fused.gathered_by({1}, 0.0, 10.0, 4)
    assert fused.waits_for({1, 2}) == {2}
    assert fused.compute({1}, {3}, 0.5, 0.0, matmul=False) == 0.5  # a view (storage 3) carries the all-gather on
    assert fused.compute({3}, {4}, 1.0, 8.0, matmul=True) == pytest.approx(12.0)
    # a matmul issued before the all-gather starts begins with it: max(3 + 8, 10 + 2) with the all-gather at 3
    fused.gathered_by({5}, 3.0, 10.0, 4)
    assert fused.compute({5}, {6}, 1.0, 8.0, matmul=True) == pytest.approx(12.0)


def test_a_reduce_scatter_fused_with_its_matmul_starts_after_the_first_chunk():
    """Matmul from t = 0 for 8 over 4 ranks: its reduce-scatter (10) may start at 8 / 4 = 2 and ends no earlier
    than the matmul's end plus its last chunk's send, max(2 + 10, 8 + 10 / 4) = 12 (traced_time takes the max)."""
    fused = MicroPipelinedTP()
    fused.compute(set(), {7}, 0.0, 8.0, matmul=True)
    fused.compute({7}, {8}, 8.0, 0.5, matmul=False)  # a copy between them passes the matmul on
    ready, bound = fused.start_of("reduce_scatter", {8}, 4, deps=8.5)
    assert (ready, bound) == (2.0, 8.0)
    assert max(ready + 10.0, bound + 10.0 / 4) == 12.0
    assert fused.start_of("all_gather", {8}, 4, deps=8.5) == (8.5, 0.0)


def test_async_tp_hides_tensor_parallel_communication_and_keeps_the_memory():
    planner = _planner()
    sync, fused = (planner.plan("fsdp", 4, tp=2, sequence_parallel=True, async_tp=a, solve=()) for a in (False, True))
    assert fused.per_gpu == sync.per_gpu and fused.verdict.needed == sync.verdict.needed
    assert fused.time.compute_s == sync.time.compute_s
    assert fused.time.compute_s <= fused.step_time_s < sync.step_time_s
    tp_comm = sum(v for k, v in sync.time.comm_by_kind_s.items() if k.startswith(("all_gather", "reduce_scatter")))
    assert sync.step_time_s - fused.step_time_s <= tp_comm
    assert fused.time.exposed_comm_s < sync.time.exposed_comm_s
    assert "(sequence parallel, async)" in fused.render() and fused.to_dict()["async_tp"] is True
    assert any(n.startswith("async TP:") for n in fused.notes)


@pytest.mark.parametrize("kw,message", [
    ({"tp": 2}, "add --tp 2 \\(or more\\) and --sequence-parallel"),
    ({"tp": 1, "sequence_parallel": False}, "--sequence-parallel"),
])
def test_async_tp_needs_sequence_parallelism(kw, message):
    with pytest.raises(UserError, match=message):
        _planner().plan("fsdp", 4, async_tp=True, solve=(), **kw)


def test_async_tp_needs_torch_compile():
    with torch.device("meta"):
        model = llama.Llama(llama.LlamaConfig(**CONFIG))
    idx = torch.zeros(2, 2048, dtype=torch.long)
    planner = Planner(model, (idx, idx.clone()), gpu="H100", precision="fsdp-bf16")
    with pytest.raises(UserError, match="add --compile"):
        planner.plan("fsdp", 4, tp=2, sequence_parallel=True, async_tp=True, solve=())

"""The planner's traces with DTensor's foreach sharding scanned once per op (estimator.plan.foreach_sharding) give
every number the traces with torch's own quadratic scan give: FSDP2 alone (no ``_StridedShard`` placement) and
FSDP2 x tensor parallelism (``_StridedShard`` placements, which torch's function then fixes up)."""

from __future__ import annotations

import contextlib
import os
import sys

import pytest
import torch

from estimator.plan import Planner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import llama  # noqa: E402

CONFIG = {"vocab_size": 256, "dim": 64, "hidden_dim": 96, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
          "max_seq_len": 32}


def _plan(tp: int) -> dict:
    with torch.device("meta"):
        model = llama.Llama(llama.LlamaConfig(**CONFIG))
    idx = torch.zeros(4, 32, dtype=torch.long)
    return Planner(model, (idx, idx.clone()), gpu="H100", precision="fp32").plan("fsdp", 4, tp=tp,
                                                                                 solve=()).to_dict()


@pytest.mark.parametrize("tp", [1, 2])
def test_the_scan_once_per_op_changes_no_number(monkeypatch, tp):
    import estimator.plan.engine as engine
    import torch.distributed.tensor._sharding_prop as prop

    original = prop._propagate_use_strided_shard_flag
    calls = {"torch": 0}

    def counted(*args):
        calls["torch"] += 1
        return original(*args)

    monkeypatch.setattr(prop, "_propagate_use_strided_shard_flag", counted)
    fast = _plan(tp)
    fast_calls = calls["torch"]
    monkeypatch.setattr(engine, "fast_foreach_sharding", contextlib.nullcontext)
    calls["torch"] = 0
    assert _plan(tp) == fast
    assert calls["torch"] > fast_calls  # torch's own function ran for every child without the scan once per op
    assert prop._propagate_use_strided_shard_flag is counted  # restored after each trace

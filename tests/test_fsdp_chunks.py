"""The planner's FSDP2 traces with each parameter's chunks made when read (estimator.plan.fsdp_chunks) give every
number the traces with torch's own ``_chunk_with_empty`` give: on a rank that holds a chunk, on ranks past the
last non-empty chunk (a 250-row vocabulary over 512 ranks: empty shards, padded), and under tensor parallelism."""

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

CONFIG = {"vocab_size": 250, "dim": 64, "hidden_dim": 96, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
          "max_seq_len": 32}


def _plan(gpus: int, rank: int, tp: int) -> dict:
    with torch.device("meta"):
        model = llama.Llama(llama.LlamaConfig(**CONFIG))
    idx = torch.zeros(4, 32, dtype=torch.long)
    return Planner(model, (idx, idx.clone()), gpu="H100", precision="fp32").plan(
        "fsdp", gpus, tp=tp, rank=rank, solve=()).to_dict()


@pytest.mark.parametrize("gpus,rank,tp", [(4, 1, 1), (512, 511, 1), (512, 3, 2)])
def test_chunks_made_when_read_change_no_number(monkeypatch, gpus, rank, tp):
    import estimator.plan.engine as engine
    import torch.distributed.fsdp._fully_shard._fsdp_param as fsdp_param

    import estimator.plan.fsdp_chunks as fsdp_chunks

    original, made = fsdp_param._chunk_with_empty, []
    lazy_chunks = fsdp_chunks.lazy_chunk_with_empty
    monkeypatch.setattr(fsdp_chunks, "lazy_chunk_with_empty", lambda *a, **k: made.append(1) or lazy_chunks(*a, **k))
    lazy = _plan(gpus, rank, tp)
    assert made  # the traces chunked every parameter lazily
    assert fsdp_param._chunk_with_empty is original  # restored after each trace
    monkeypatch.setattr(engine, "lazy_fsdp_chunks", contextlib.nullcontext)
    assert _plan(gpus, rank, tp) == lazy

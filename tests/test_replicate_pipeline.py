"""Replicated blocks in pipeline stages and under gradient accumulation (:mod:`estimator.capture.replicate`, each
micro-step's passes its own segments): a plan whose traces copy a middle block equals the one that traces every
block (``replicate=False``), every number of ``to_dict()``, in the same test (a file apart from
tests/test_replicate.py so that the two run side by side).
"""

from __future__ import annotations

import pytest
import torch

from estimator.plan import plan
from test_replicate import _llama, _same, expanded  # noqa: F401  (a fixture)


@pytest.mark.parametrize("layout", [dict(strategy="fsdp", gpus=16, grad_accum=2),
                                    dict(strategy="fsdp", gpus=8, pp=2, pp_schedule="gpipe"),
                                    dict(strategy="fsdp", gpus=8, tp=2, pp=2, pp_schedule="interleaved-1f1b",
                                         checkpoint="Block")],
                         ids=["fsdp-accumulate", "fsdp-gpipe", "fsdp-tp-interleaved"])
def test_replicated_pipeline_stages_equal_their_full_traces(layout, expanded):
    """Every pipeline stage of 8 blocks or more is traced with six and replicated (its micro-batches are micro-steps
    of gradient accumulation): the plan equals the one whose stages are traced in full."""
    model, _ = _llama(34 if layout.get("pp_schedule") == "interleaved-1f1b" else 16)  # 8+ blocks a stage
    idx = torch.zeros(8, 32, dtype=torch.long)
    kw = dict(gpu="H100", solve=(), tokens=1e9, **layout, **({"microbatches": 4} if "pp" in layout else {}))
    ours = plan(model, (idx, idx), **kw)
    # stages traced: GPipe's two (first, last); 34 blocks in 4 stages of 8, 9, 9, 8: three alike-keyed traces
    stages = {"gpipe": 2, "interleaved-1f1b": 3}.get(layout.get("pp_schedule"), 0)
    assert len(expanded) >= 1 + stages, expanded  # the whole model's trace and every stage's
    full = plan(model, (idx, idx), replicate=False, **kw)
    assert _same(ours.to_dict(), full.to_dict()) == []


def test_a_tensor_parallel_transformers_stage_replicates(expanded):
    """A transformers Llama as torchtitan runs it (FSDP2 x TP 2 with sequence and loss parallelism), pipelined: its rotary embedding, computed before the first layer, stays shared
    rather than the first layer's (block_layout._extend_back), so each stage replicates, and the plan equals the
    full trace's."""
    pytest.importorskip("transformers")
    from estimator.plan import Planner
    from estimator.specs import load

    model, inputs = load("hf:llama", batch=4, seq=64, overrides=dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=16, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=256, max_position_embeddings=64))
    kw = dict(gpus=8, tp=2, sequence_parallel=True, loss_parallel=True, pp=2, microbatches=4, solve=(), tokens=1e9)
    ours = Planner(model, inputs, gpu="H100", precision="fsdp-bf16").plan("fsdp", **kw)
    full = Planner(model, inputs, gpu="H100", precision="fsdp-bf16", replicate=False).plan("fsdp", **kw)
    assert len(expanded) >= 3, expanded  # the whole model's single-device trace and both stages'
    assert _same(ours.to_dict(), full.to_dict()) == []

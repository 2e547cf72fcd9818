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
                                         checkpoint="Block"),
                                    dict(strategy="ddp", gpus=2, pp=2, pp_schedule="zbv")],
                         ids=["fsdp-accumulate", "fsdp-gpipe", "fsdp-tp-interleaved", "zbv"])
def test_replicated_pipeline_stages_equal_their_full_traces(layout, expanded):
    """Every pipeline stage of 7 blocks or more is traced with five and replicated (its micro-batches are micro-steps
    of gradient accumulation): the plan equals the one whose stages are traced in full."""
    model, _ = _llama(32 if layout.get("pp_schedule") in ("interleaved-1f1b", "zbv") else 16)
    idx = torch.zeros(8, 32, dtype=torch.long)
    kw = dict(gpu="H100", solve=(), tokens=1e9, **layout, **({"microbatches": 4} if "pp" in layout else {}))
    ours = plan(model, (idx, idx), **kw)
    stages = 2 * (2 if layout.get("pp_schedule") in ("interleaved-1f1b", "zbv") else 1) if "pp" in layout else 0
    assert len(expanded) >= 1 + stages, expanded  # the whole model's trace and every stage's
    full = plan(model, (idx, idx), replicate=False, **kw)
    assert _same(ours.to_dict(), full.to_dict()) == []

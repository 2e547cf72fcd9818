"""``plan --compare`` over parallel degrees (issue 22, item 6: 4-D layouts compared, which fits fastest):
``--tp``, ``--pp``, ``--cp`` and ``--ep`` take lists or ranges, and the comparison plans every combination.

Each row must be the plan of that layout made on its own (a fresh planner, no trace shared): the per-layout plans
are what the engine tests check against real gloo runs (tests/test_plan.py, test_pipeline.py,
test_context_parallel.py); here the comparison must neither change nor drop them.  The recommended row is
computed from the rows.
"""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch
import torch.nn.functional as F

from estimator import UserError
from estimator.plan import Planner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import llama  # noqa: E402

# 4 query heads over 4 key/value heads (torch's CPU flash kernel, which context parallelism traces, takes no
# grouped-query attention); 2 layers, one per pipeline stage
CONFIG = {"vocab_size": 256, "dim": 64, "hidden_dim": 96, "n_layers": 2, "n_heads": 4, "n_kv_heads": 4,
          "max_seq_len": 64}
BATCH, SEQ, GPUS = 4, 64, 8


def _loss(logits: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), torch.zeros(logits.shape[:2], dtype=torch.long).flatten())


def _planner() -> Planner:
    with torch.device("meta"):
        model = llama.Llama(llama.LlamaConfig(**CONFIG))
    return Planner(model, (torch.zeros(BATCH, SEQ, dtype=torch.long),), gpu="H100", device="cpu", precision="fp32",
                   loss_fn=_loss)


DEGREES = dict(tp=[1, 2], pp=[1, 2], cp=[1, 2])


@pytest.fixture(scope="module")
def comparison():
    return _planner().compare(GPUS, strategies=["fsdp"], with_checkpointing=False, **DEGREES)


def _key(plan) -> tuple[int, int, int]:
    return plan.config.tp, plan.config.pp, plan.config.cp


def test_every_combination_is_a_row_or_says_why_not(comparison):
    """tp x pp x cp in {1, 2}^3 on 8 GPUs under FSDP: eight combinations; tp 2 x pp 2 x cp 2 leaves one
    data-parallel rank, whose sharding over dp x cp = 2 still applies, so every combination is a row here, and
    each row's data-parallel degree is what the GPUs leave: 8 / (tp x pp x cp)."""
    expected = {(t, p, c) for t in DEGREES["tp"] for p in DEGREES["pp"] for c in DEGREES["cp"]}
    seen = [_key(p) for p in comparison.plans]
    assert len(set(seen)) == len(seen) and set(seen) <= expected
    assert len(seen) + len(comparison.skipped) == len(expected), (seen, comparison.skipped)
    for p in comparison.plans:
        t, pp, c = _key(p)
        assert p.config.dp == GPUS // (t * pp * c)
        label = "fsdp" + "".join(f" x {k} {v}" for k, v in (("tp", t), ("pp", pp), ("cp", c)) if v > 1)
        assert label in comparison.render()


def test_each_row_is_the_plan_of_its_layout_made_alone(comparison):
    """Every number of a row equals the plan of the same layout from a fresh planner (no trace shared), made as
    a comparison makes its rows: the largest micro-batch not confirmed by a trace past the interpolation.  The
    rows with one degree each and the one with all three (the suite's time: each plan is traced again)."""
    for row in comparison.plans:
        t, p, c = _key(row)
        if sorted((t, p, c)) not in ([1, 1, 2], [2, 2, 2]):
            continue
        alone = _planner().plan("fsdp", GPUS, tp=t, pp=p, cp=c, suggest=False, confirm=False)  # as a row is
        assert row.to_dict() == alone.to_dict(), (t, p, c)


def test_the_recommended_row_is_the_fastest_that_fits(comparison):
    """Without a budget the fastest is the most samples per second: samples per step / step time."""
    fitting = [p for p in comparison.plans if p.fits]
    rate = {id(p): p.training.samples_per_step / p.step_time_s for p in fitting}
    best = max(fitting, key=lambda p: rate[id(p)])
    assert math.isclose(rate[id(comparison.answers["fastest"])], rate[id(best)])
    assert comparison.recommended is comparison.answers["fastest"]


def test_a_combination_a_layout_cannot_take_is_listed_not_raised():
    """tp 4 on 4 GPUs leaves FSDP one data-parallel rank: listed with the layout check's own reason; the rows
    that apply are planned."""
    cmp = _planner().compare(4, strategies=["fsdp"], tp=[1, 4], with_checkpointing=False)
    assert [_key(p) for p in cmp.plans] == [(1, 1, 1)]
    assert len(cmp.skipped) == 1 and cmp.skipped[0].startswith("fsdp x tp 4 on 4 GPUs: fsdp with 1 data-parallel")


def test_a_single_layout_still_raises_its_error():
    with pytest.raises(UserError, match="shards nothing"):
        _planner().compare(4, strategies=["fsdp"], tp=4, with_checkpointing=False)


@pytest.mark.parametrize("bad, message", [([], "--tp names no degree"), ([1, 0], "--tp must be >= 1, not 0")])
def test_bad_degrees_are_one_line_errors(bad, message):
    with pytest.raises(UserError, match=message):
        _planner().compare(4, strategies=["fsdp"], tp=bad)


def test_the_cli_compares_every_combination_of_the_lists(monkeypatch, capsys):
    """``--tp 1,2 --pp 1-2`` without ``--compare``: one strategy, the four combinations, each reaching
    ``Planner.plan`` with its degrees; one degree each is one plan as before."""
    from estimator.cli.main import main

    calls = []

    def seen(self, strategy, gpus, **kw):
        calls.append((strategy, gpus, kw["tp"], kw.get("pp", 1), kw["cp"]))
        raise UserError("seen")

    monkeypatch.setattr(Planner, "plan", seen)
    spec = os.path.join(ROOT, "examples", "llama.py") + ":build"
    assert main(["plan", spec, "--gpu", "H100", "--gpus", "8", "--strategy", "fsdp", "--tp", "1,2",
                 "--pp", "1-2"]) == 2
    assert sorted(calls) == [("fsdp", 8, t, p, 1) for t in (1, 2) for p in (1, 2)]
    assert len(capsys.readouterr().err.strip().splitlines()) == 1  # "no layout applies: ...", one line
    calls.clear()
    assert main(["plan", spec, "--gpu", "H100", "--gpus", "8", "--strategy", "fsdp", "--tp", "2"]) == 2
    assert calls == [("fsdp", 8, 2, 1, 1)]
    assert main(["plan", spec, "--gpu", "H100", "--gpus", "8", "--tp", "0-2"]) == 2
    assert "not a range" in capsys.readouterr().err


def test_engine_warnings_become_one_note_each_and_others_pass(recwarn):
    """A warning raised from torch.distributed's sources while a layout is traced is a note of the plan, once
    however often it is raised (a comparison traces many layouts); any other warning is raised again once per place
    and message, as the default filter shows it."""
    import warnings

    from estimator.plan.engine import engine_warnings_as_notes

    notes: list[str] = []
    fsdp = "/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_state.py"
    for _ in range(2):
        with engine_warnings_as_notes(notes):
            warnings.warn_explicit("FSDP2-wrapped module (M) returned a view tensor.\nmore", UserWarning, fsdp, 331)
    assert notes == ["torch.distributed warned during the trace: FSDP2-wrapped module (M) returned a view tensor."]
    assert len(recwarn) == 0
    with engine_warnings_as_notes(notes):
        for _ in range(3):  # one place, three times (a warning in every block's forward): shown once
            warnings.warn("the model's own warning", FutureWarning)
    assert [str(w.message) for w in recwarn] == ["the model's own warning"] and len(notes) == 1

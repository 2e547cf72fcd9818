"""The largest-value search of :mod:`estimator.plan.search` on synthetic steps whose bytes needed are known
functions of the batch: the answer is a value that fits whose next does not, and the traces already made bound
the ones that follow (each trace is a trace of the whole engine: their count is what a user waits for)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from estimator.plan.search import largest_fitting

CAPACITY = 80 * 2**30
PER_SAMPLE = 3_000_000


def _search(need, guess):
    """Search with ``guess(v)`` as the interpolation (what the traces at two sizes predict) and ``need(v)`` as
    what a trace at ``v`` needs; (the Solve, the values traced)."""
    traced: list[int] = []

    def trace(v: int):
        traced.append(v)
        return need(v) <= CAPACITY, need(v), need(v)

    moved = [0]

    def interpolated(v: int) -> bool:
        return guess(v) + moved[0] <= CAPACITY

    def recalibrate(v: int, n: int) -> bool:
        before, moved[0] = moved[0], n - guess(v)
        return moved[0] != before

    solve = largest_fitting("batch", 4, interpolated, trace, [4, 8], confirm=True, recalibrate=recalibrate,
                            capacity=CAPACITY)
    return solve, traced


def _linear(v: int) -> int:
    return 2**30 + PER_SAMPLE * v


def _boundary(need) -> int:
    """The largest v that fits, by scanning down from where the linear part alone crosses the card."""
    v = (CAPACITY - 2**30) // PER_SAMPLE + 1
    while need(v) > CAPACITY:
        v -= 1
    return v


def test_an_interpolation_that_hits_is_confirmed_by_two_traces():
    solve, traced = _search(_linear, _linear)
    answer = (CAPACITY - 2**30) // PER_SAMPLE  # the largest v with 1 GiB + 3 MB x v <= 80 GiB
    assert (solve.value, solve.confirmed, sorted(traced)) == (answer, True, [answer, answer + 1])


def _stepped(v: int) -> int:
    """The linear need plus the caching allocator's reserve, 1 GiB more every 7 GiB of activations."""
    return _linear(v) + 2**30 * math.ceil(PER_SAMPLE * v / (7 * 2**30))


def test_an_allocator_reserve_in_steps_is_narrowed_from_the_traces_made():
    """The traces pay the reserve, which the interpolation (linear) misses: the true boundary, in at most 8 traces
    (one recalibration on the reserve the first traces paid finds it: 6 traces, as before the narrowing, which
    must not lose that)."""
    solve, traced = _search(_stepped, _linear)
    assert solve.value == _boundary(_stepped) and solve.confirmed
    assert len(traced) == len(set(traced)) <= 8, traced


def test_bytes_that_jump_back_and_forth_are_narrowed_from_the_traces_made():
    """The simulated allocator's need is not monotone near the card (every 7th size needs another 8 GiB segment,
    on top of the stepped reserve): any value that fits with a next that does not is an answer; the search ends
    on one in at most 8 traces (6 measured; the search before the narrowing took 26 here, searching again from
    its last guess after three recalibrations)."""

    def need(v):
        return _stepped(v) + (8 * 2**30 if v % 7 == 0 else 0)

    solve, traced = _search(need, _linear)
    assert solve.confirmed and need(solve.value) <= CAPACITY < need(solve.value + 1)
    assert len(traced) == len(set(traced)) <= 8, traced


def test_an_answer_whose_next_trace_reproduces_the_interpolation_is_not_traced():
    """When the trace at the answer's next does not fit and has every size the interpolation gives there
    (``reproduced``), the answer, between that trace and the points, takes the interpolation's bytes: one trace,
    not two.  A next that is not reproduced falls back to tracing the answer too."""
    answer = (CAPACITY - 2**30) // PER_SAMPLE  # the largest v with 1 GiB + 3 MB x v <= 80 GiB
    for reproduces, expected in ((True, [answer + 1]), (False, [answer, answer + 1])):
        traced: list[int] = []

        def trace(v: int):
            traced.append(v)
            return _linear(v) <= CAPACITY, _linear(v), _linear(v)

        solve = largest_fitting("batch", 4, lambda v: _linear(v) <= CAPACITY, trace, [4, 8], confirm=True,
                                capacity=CAPACITY, exact=_linear, reproduced=lambda v: reproduces,
                                peak_at=_linear)
        assert (solve.value, solve.confirmed, sorted(traced), solve.by_next) == (answer, True, expected, reproduces)
        assert solve.needed_at_answer == _linear(answer) and solve.peak_at_next == _linear(answer + 1)


def test_a_first_guess_past_the_limit_is_searched_down_from_it():
    """The first guess (interpolated sizes at the traced step's peak) ran past the search's limit for a model whose
    bytes grow with its sequence (Embedding -> LayerNorm -> MLP, 4 x seq tokens): "over 16,777,216" where a plan
    at 2^24 needs 96.4 GB of the H100's 85 GB.  The simulated allocator (or a trace) at the limit now decides,
    and the answer is searched down from there and confirmed by the trace at it and the next."""
    import torch
    from torch import nn

    from estimator.plan.layout import Layout
    from estimator.plan.planner import Planner

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(100, 64), nn.LayerNorm(64), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 100))
    planner = Planner(model, torch.randint(0, 100, (4, 16)), gpu="H100")
    solve = planner.solve("seq", Layout("ddp", 1), (), planner.gpu)
    assert solve.value is not None and solve.value < 2**24 and solve.confirmed, solve
    layout = Layout("ddp", 1)

    def need(seq: int) -> int:  # what a trace at that length needs (the plan's own figure)
        step = planner.traced(layout, (), "seq", seq)
        return planner.needed(planner.memory(layout, step).peak.total, layout, step)

    assert need(solve.value) <= planner.gpu.capacity < need(solve.value + 1)


class _TakesOneBatch(torch.nn.Module):
    """A per-sample parameter: the model takes a batch of 8 only."""

    def __init__(self):
        super().__init__()
        self.lin, self.pair = torch.nn.Linear(16, 16), torch.nn.Parameter(torch.zeros(8, 16))

    def forward(self, x):
        return (self.lin(x) * self.pair).sum()


def test_a_search_whose_trace_fails_at_another_size_says_so_and_the_plan_stands():
    """The plan's batch search traced a micro-batch of 16, which this model cannot take, and the whole plan failed
    on a size the user never gave (estimate --gpu said "not searched"): the plan stands, its search says why not."""
    from estimator.plan import plan

    p = plan(_TakesOneBatch(), torch.randn(8, 16), gpu="H100", device="cpu", loss_fn=lambda o: o)
    assert p.verdict.fits and p.batch.value is None
    assert p.batch.reason.startswith("not searched: the step at another micro-batch") and "broadcast" in p.batch.reason
    assert "not searched: the step at another micro-batch" in str(p)


def test_solve_seq_needs_a_sequence_and_is_searched_when_the_given_one_does_not_fit():
    """--solve seq resized an image's channels ("expected input[4, 6, 32, 32] to have 3 channels") and was dropped
    without a word when the given size did not fit, when a shorter sequence may."""
    from estimator.errors import UserError
    from estimator.hardware import GPU, lookup
    from estimator.plan import plan

    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(), torch.nn.Linear(8 * 14 * 14, 4))
    with pytest.raises(UserError, match="--solve seq searches a sequence length, and these inputs have none"):
        plan(cnn, torch.randn(2, 3, 16, 16), gpu="H100", device="cpu", solve=("batch", "seq"))
    model = torch.nn.Sequential(torch.nn.Embedding(64, 256), torch.nn.Linear(256, 256))
    ids = torch.randint(0, 64, (4, 4096))
    fits = plan(model, ids, gpu="H100", loss_fn=lambda o: o.float().pow(2).mean(), solve=("batch", "seq"))
    # a card a little smaller than the given step needs: it does not fit, and a shorter sequence does
    small = replace(lookup("H100"), total_memory=fits.verdict.needed - (64 << 20))
    assert isinstance(small, GPU)
    p = plan(model, ids, gpu=small, loss_fn=lambda o: o.float().pow(2).mean(), solve=("batch", "seq"))
    assert not p.verdict.fits and p.seq is not None and 0 < p.seq.value < 4096


def test_a_plan_checks_its_fit_at_the_first_steps_peak_as_an_estimate_does():
    """A BatchNorm CNN in bf16-mixed: its first step peaks 1.4 MB above the steady state (AdamW's state made inside
    step()). estimate --gpu checked the fit there, the one-GPU plan at the steady peak: on a card between the two
    the estimate said DOES NOT FIT and the plan FITS. Both check the higher now, and say so."""
    from estimator import estimate
    from estimator.hardware import lookup
    from estimator.plan import plan

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
                                torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10))
    x = torch.randn(90, 3, 32, 32)
    report = estimate(model, x, gpu="H100", precision="bf16-mixed", solve_batch=False)
    first, steady = report.memory.peak_first_step, report.memory.peak
    assert first > steady  # (the case: else there is nothing to check)
    p = plan(model, x, gpu="H100", gpus=1, strategy="ddp", precision="bf16-mixed", solve=())
    assert p.per_gpu.peak == steady and p.verdict.needed == report.to_dict()["needed"]
    assert any("the first step peaks higher" in n for n in p.notes)
    between = replace(lookup("H100"), total_memory=p.verdict.needed - (first - steady) // 2)
    assert not plan(model, x, gpu=between, gpus=1, strategy="ddp", precision="bf16-mixed", solve=()).verdict.fits

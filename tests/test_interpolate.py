"""The bytes a step needs at another size, interpolated from two traces and the caching allocator simulated on
them (estimator.plan.interpolate), against a trace at that size made in the same test; and the search that
refines its first guess with it (estimator.plan.search._refine)."""

from __future__ import annotations

import random

import pytest

from estimator.plan import Planner
from estimator.plan.interpolate import _library_key, need_at
from estimator.plan.layout import Layout
from estimator.plan.search import _refine
from estimator.workspace import library_memory

from test_plan import _gpt, _gpu_with

CFG = {"vocab_size": 257, "block_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 64}


def _fsdp(planner: Planner) -> Layout:
    return Layout("fsdp", 2, 1, False, planner.gpus_per_node, 0, None, None, False, 1, "1f1b", 0, 1, "allgather",
                  1, False)


def test_need_between_and_beyond_two_traces_is_the_traced_need():
    """At every size where the trace has the same ops and the same kinds of library allocations as the traces
    at 4 and 8, the interpolated need is the need of the trace at that size, to the byte (the allocator's
    fragmentation reserve included, which is not linear in the batch)."""
    model, inputs = _gpt(CFG, 4, 64)
    planner = Planner(model, inputs, gpu="H100", device="cuda", precision="bf16-mixed")
    layout = _fsdp(planner)
    points = [4, 8]
    steps = [planner.traced(layout, (), "batch", v) for v in points]
    need = need_at(steps, points, steps[0].cuda_target)
    assert need is not None
    compared = 0
    for v in (1, 5, 13, 40):
        st = planner.traced(layout, (), "batch", v)
        lib, base = library_memory(st.cap, st.cuda_target), library_memory(steps[0].cap, st.cuda_target)
        if st.structure() != steps[0].structure() or _library_key(lib) != _library_key(base):
            continue  # another kernel at this size: the search traces it (test below)
        compared += 1
        truth = planner.needed(planner.memory(layout, st).peak.total, layout, st)
        assert need(v) == truth, (v, need(v), truth)
    assert compared >= 3


def test_temporaries_at_one_size_only_are_interpolated_by_their_rules():
    """At 1000 samples the bias gradients' sums over 64,000 rows and the embedding's backward take kernels with a
    temporary (estimator.workspace's rules) that the trace at 4 does not have.  Such traces gave no interpolation
    (a compare row then fell back to a fixed fragmentation guess: GPT on 2 L4s searched 538 where 457 is the
    largest that fits); each temporary is now its rule evaluated at the size, 0 below its kernel's threshold: the
    bytes needed equal a trace's at both points and at a size between them, traced on its own."""
    model, inputs = _gpt(CFG, 4, 64)
    planner = Planner(model, inputs, gpu="H100", device="cuda", precision="bf16-mixed")
    layout = _fsdp(planner)
    steps = [planner.traced(layout, (), "batch", v) for v in (4, 1000)]
    target = steps[0].cuda_target
    kinds = [_library_key(library_memory(s.cap, target)) for s in steps]
    assert kinds[0] != kinds[1], "the two sizes were chosen for their different kernels"
    need = need_at(steps, [4, 1000], target)
    for v in (4, 1000, 37, 500):
        st = planner.traced(layout, (), "batch", v)
        assert need(v) == planner.needed(planner.memory(layout, st).peak.total, layout, st), v


def test_a_large_answer_is_confirmed_by_traces_at_it_and_the_next():
    """A small model on an H100: the largest micro-batch is about 164,000, where the kernels allocate other
    temporaries than at 4 and 8.  The answer is closed by traces (it fits, one more does not), made by
    independent plans at those sizes, and the search traced at most four sizes beyond its two points."""
    model, inputs = _gpt(CFG, 4, 64)
    planner = Planner(model, inputs, gpu="H100", device="cuda", precision="bf16-mixed")
    p = planner.plan("fsdp", 2)
    assert p.batch.confirmed and p.max_batch > 10_000, p.batch
    traced = {k[3] for k in planner._steps if k[0] != "single" and k[2] == "batch"}
    assert len(traced - {4, 8}) <= 4, sorted(traced)
    for value, fits in ((p.max_batch, True), (p.max_batch + 1, False)):
        other = Planner(*_gpt(CFG, value, 64), gpu="H100", device="cuda", precision="bf16-mixed").plan(
            "fsdp", 2, solve=(), suggest=False)
        assert other.fits is fits, (value, other.verdict.needed)


@pytest.mark.parametrize("seed", range(20))
def test_refine_finds_the_largest_value_from_any_first_guess(seed):
    """Against the answer by construction, for needs of three shapes (a threshold, a line, a line rounded up to the
    allocator's 2 MiB or 20 MiB blocks plus a staircase), any start, any limit above the answer: the largest value
    whose need fits, probing only values >= 1, in a number of evaluations that grows with the log of the first
    guess's miss."""
    rnd = random.Random(seed)
    answer = rnd.choice([0, 1, 2, 3, rnd.randrange(4, 100), rnd.randrange(100, 1 << 20)])
    limit = answer + rnd.choice([1, 2, 1 << 22])
    start = max(1, rnd.choice([1, answer, answer + 1, rnd.randrange(1, 2 * answer + 2)]))
    slope, block = rnd.randrange(1_000, 10_000_000), rnd.choice([2 << 20, 20 << 20])
    shapes = {
        "threshold": lambda v: 0 if v <= answer else 1,
        "line": lambda v: slope * v,
        "rounded": lambda v: -(-slope * v // block) * block + (v // 7) * 4096,
    }
    for name, need in shapes.items():
        capacity = need(answer)
        if name == "threshold":
            capacity = 0
        elif name == "rounded" and need(answer + 1) == capacity:  # on a plateau: fit exactly its last value
            while need(answer + 1) == capacity:
                answer += 1
                limit = max(limit, answer + 1)
        calls = []

        def counted(v):
            calls.append(v)
            return need(v)

        assert _refine(counted, capacity, start, limit) == answer, name
        assert len(calls) <= 6 * max(1, abs(start - answer)).bit_length() + 8, (name, len(calls))
        assert min(calls) >= 1


def test_a_traces_deferred_need_is_the_need_computed_from_scratch():
    """A plan's trace is simulated without the allocator's need (a search's points never ask it); asked later,
    it reuses that simulation's allocator run: the same bytes as :func:`estimator.memory.fragmentation` on the
    capture from scratch, and the same as a simulation that computed it at once."""
    from estimator.memory import fragmentation, simulate

    model, inputs = _gpt(CFG, 4, 64)
    planner = Planner(model, inputs, gpu="H100", device="cuda", precision="bf16-mixed")
    step = planner.traced(_fsdp(planner), (), "batch", 6)
    assert step.lazy_need and step.profile.deferred_need is not None
    scratch = fragmentation(step.cap, step.cuda_target)
    assert scratch > 0
    assert step.fragmentation() == scratch
    assert step.profile.deferred_need is None and step.fragmentation() == scratch  # asked once, kept
    assert simulate(step.cap, "cuda", target=step.cuda_target).reserve["fragmentation"] == scratch


def _hf_llama(batch: int):
    """A 2-layer Hugging Face Llama on the meta device, fed token ids as labels too (as bench_llama7b.py)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=4, vocab_size=256)
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    ids = torch.zeros(batch, 64, dtype=torch.int64, device="meta")
    return model, {"input_ids": ids, "labels": ids}


def test_a_micro_batch_of_one_is_searched_from_two_and_four():
    """At a micro-batch of one the shifted logits are reshaped as a view where larger batches copy them, so the
    trace at 1 has its own op sequence and cannot be interpolated with the trace at 2 (which made every such
    search trace its way up).  The search interpolates from 2 and 4 and traces the answer's next; the answer's
    bytes, between traces, are those of an independent plan at that batch, to the byte, and the next does not
    fit."""
    model, inputs = _hf_llama(1)
    planner = Planner(model, inputs, gpu="H100", device="cuda", precision="bf16-mixed")
    layout = _fsdp(planner)
    one, two = (planner.traced(layout, (), "batch", v) for v in (1, 2))
    assert one.structure() != two.structure(), "the case was chosen for its own op sequence at batch 1"
    # a card with room for about 9 micro-batches: what FSDP on 2 needs at 9, plus 1 MiB
    gpu = _gpu_with(Planner(*_hf_llama(9), gpu="H100").plan("fsdp", 2, solve=(), suggest=False).verdict.needed
                    + 2**20)
    planner = Planner(model, inputs, gpu=gpu, device="cuda", precision="bf16-mixed")
    p = planner.plan("fsdp", 2)
    assert p.batch.confirmed and p.batch.by_next and p.batch.traced == [2, 4], p.batch
    traced = {k[3] for k in planner._steps if k[0] != "single" and k[2] == "batch"}
    assert traced <= {2, 4, p.max_batch + 1}, sorted(traced)  # (besides the given batch, traced as given)
    for value, fits in ((p.max_batch, True), (p.max_batch + 1, False)):
        other = Planner(*_hf_llama(value), gpu=gpu).plan("fsdp", 2, solve=(), suggest=False)
        assert other.fits is fits, (value, other.verdict.needed)
        if fits:
            assert (p.batch.needed_at_answer, p.batch.peak_at_answer) == (other.verdict.needed, other.per_gpu.peak)


def test_the_largest_batch_alone_is_the_plans():
    """``Planner.largest_batch`` (``estimate --gpu``'s search, without the plan's step time and FLOPs) answers
    what the whole plan of DDP on one GPU answers, with the same bytes at the answer."""
    gpu = _gpu_with(Planner(*_hf_llama(9), gpu="H100").plan("ddp", 1, solve=(), suggest=False).verdict.needed
                    + 2**20)
    alone = Planner(*_hf_llama(1), gpu=gpu).largest_batch()
    whole = Planner(*_hf_llama(1), gpu=gpu).plan("ddp", 1).batch
    assert alone == whole and alone.value >= 9, (alone, whole)


def test_a_temporary_that_is_not_linear_in_the_batch_is_its_rule_at_that_size():
    """A Llama of 2,048 hidden at 2,048 tokens: the sum reductions' partial-sum buffers stop growing between
    batches 4 and 9 (capped by the reduction's grid: 128 MiB at 4, 132 MiB at 9 where a line through 2 and 4
    says 288 MiB) and cuDNN's attention backward rounds its workspace.  The interpolation evaluates each
    temporary's workspace rule on the op's arguments at 9 (their shapes and strides interpolated), so the bytes
    needed at 9 are the trace's to the byte, and the trace at 9 reproduces every size."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from estimator.plan.interpolate import _library_vector
    from estimator.plan.search import lagrange

    cfg = AutoConfig.for_model("llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=2,
                               num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    ids = torch.zeros(1, 2048, dtype=torch.long, device="meta")
    planner = Planner(model, {"input_ids": ids, "labels": ids}, gpu="H100", precision="bf16-mixed")
    layout = Layout("ddp", 1, gpus_per_node=planner.gpus_per_node)
    steps = [planner.traced(layout, (), "batch", v) for v in (2, 4)]
    need = need_at(steps, [2, 4], steps[0].cuda_target)
    nine = planner.traced(layout, (), "batch", 9)
    traced = _library_vector(library_memory(nine.cap, need.target))
    line = [round(x) for x in lagrange([2, 4], need.lib_per, 9)]
    assert traced != line, "the case was chosen for a temporary that is not linear in the batch"
    assert need.sizes(9)[1] == traced and need.reproduces(nine, 9)
    assert need(9) == planner.needed(planner.memory(layout, nine).peak.total, layout, nine)


def _branchy(batch: int):
    """An MLP that copies its input once the batch exceeds 3 (another op sequence at 4 than at 2), and its input."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 256)

        def forward(self, x):
            if x.shape[0] > 3:
                x = x.clone()
            return self.b(torch.relu(self.a(x))).square().mean()

    return Net(), (torch.randn(batch, 256),)


def test_a_micro_batch_of_one_whose_larger_sizes_differ_is_searched_by_traces():
    """The search alone (``estimate --gpu``) from a micro-batch of one starts at 2 and 4; where those two differ in
    op sequence it searches by traces, and its answer is the largest batch an independent plan fits, the next one
    not."""
    model, inputs = _branchy(1)
    need = lambda b: Planner(*_branchy(b), gpu="H100", loss_fn=None).plan(  # noqa: E731
        "ddp", 1, solve=(), suggest=False).verdict.needed
    gpu = _gpu_with(need(20) + 2**20)
    solve = Planner(model, inputs, gpu=gpu, loss_fn=None).largest_batch()
    assert solve.value is not None and solve.method.startswith("traced"), solve
    assert need(solve.value) <= gpu.capacity < need(solve.value + 1)


def test_a_comparison_row_searches_what_its_plan_confirms():
    """``--compare`` rows are not confirmed by traces: their largest micro-batch is the interpolation's.  The
    example GPT on 2 L4s under DDP (traces at 8 and 16 on either side of the embedding backward's sort threshold)
    had its row at 538 where the plan's search, tracing the answer's next, confirms 457."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
    import gpt

    model, inputs = gpt.build()
    planner = Planner(model, inputs, gpu="L4")
    row = planner.compare(2, strategies=["ddp"], with_checkpointing=False).plans[0]
    single = Planner(model, inputs, gpu="L4").plan("ddp", 2)
    assert single.batch.confirmed and row.max_batch == single.max_batch

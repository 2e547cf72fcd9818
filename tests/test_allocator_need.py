"""The smallest capacity the simulated caching allocator runs a step in (``estimator.memory.allocator_need``)
starts every bisection run from a copy of the allocator where all runs still agree
(``Allocator.clone``, ``memory._shared_prefix``).  Checked here against what that shortcut replaces:
whole runs from an empty allocator, on seeded random streams and on a real capture's streams.
"""

from __future__ import annotations

import importlib.util
import os
import random

import pytest

from estimator import estimate
from estimator.allocator import Allocator, OutOfMemoryError, Replay
from estimator.memory import _allocator_run, _allocator_streams, allocator_need, categories, with_library_memory
from estimator.target import CudaTarget

MiB = 1 << 20
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _whole_runs_need(streams, low: int, high: int, step: int = 8 << 20) -> int:
    """``allocator_need`` as it was before the shortcut: every run replays the load and both steps from an
    empty allocator (the same bisection, the same answer rule)."""
    def runs(capacity: int) -> int | None:
        traces, most = _allocator_run(streams, capacity)
        return most if len(traces) == 2 and traces[-1].oom is None else None

    low = min(low, high)
    guess = low + (low >> 3)
    if guess < high:
        most = runs(guess)
        high, low = (min(guess, most), low) if most is not None else (high, guess)
    while high - low > step:
        mid = (low + high) // 2
        most = runs(mid)
        low, high = (low, min(mid, most)) if most is not None else (mid, high)
    return high


def _random_step(rng: random.Random, tag: str, n: int) -> list:
    """``n`` events of one step whose storages all die inside it: sizes log-uniform from 1 KiB to 64 MiB."""
    events, alive, index = [], [], 0
    for k in range(n):
        index += rng.random() < 0.7
        if not alive or rng.random() < 0.55:
            size = int(2 ** rng.uniform(10, 26))
            events.append((index, (tag, k), size))
            alive.append(((tag, k), size))
        else:
            key, size = alive.pop(rng.randrange(len(alive)))
            events.append((index, key, -size))
    return events + [(index + 1, key, -size) for key, size in alive]


def _random_streams(seed: int) -> list:
    """A load (weights kept), two steps and their (empty) drops, as ``memory._allocator_streams`` lays them out."""
    rng = random.Random(seed)
    load = [(-1, ("w", k), int(2 ** rng.uniform(16, 27))) for k in range(40)]
    return [load, _random_step(rng, "a", 1500), [], _random_step(rng, "b", 1500), []]


def _span(streams, every: list | None = None) -> tuple[int, int]:
    """(allocated peak, reserved peak) of the unlimited run: the bisection's bounds (``every``: gets the run's
    trace of each stream)."""
    traces, most = _allocator_run(streams, every=every)
    return max(t.peak_allocated for t in traces), most


@pytest.mark.parametrize("seed", range(6))
def test_the_need_is_the_one_whole_runs_find_on_random_streams(seed):
    streams = _random_streams(seed)
    low, high = _span(streams)
    assert high > low  # fragmentation to bisect over
    for step in (8 << 20, 1 << 20):
        assert allocator_need(streams, low, high, step) == _whole_runs_need(streams, low, high, step)


def test_the_need_is_the_one_whole_runs_find_on_a_real_capture():
    spec = importlib.util.spec_from_file_location("example_gpt", os.path.join(EXAMPLES, "gpt.py"))
    gpt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpt)
    model, inputs = gpt.build(batch=4, seq=128)
    cap = estimate(model, inputs, gpu="H100", solve_batch=False).capture
    raw = list(cap.storage_bytes)
    events, persistent, _ = with_library_memory(cap, CudaTarget(), raw, categories(cap))
    streams = _allocator_streams(cap, events, raw, persistent, set(cap.sids.get("loss", ())))
    every: list = []
    low, high = _span(streams, every)
    for step in (8 << 20, 512 << 10):  # 512 KiB: enough runs to land the start inside both steps
        need = _whole_runs_need(streams, low, high, step)
        assert allocator_need(streams, low, high, step) == need
        assert allocator_need(streams, low, high, step, unlimited=every) == need  # the caller's unlimited run


@pytest.mark.parametrize("expandable", [False, True])
def test_a_clone_runs_as_the_original_would_and_leaves_it_alone(expandable):
    rng = random.Random(7)
    first, second = _random_step(rng, "a", 1200), _random_step(rng, "b", 1200)
    original = Replay(Allocator(expandable_segments=expandable))
    original.run(first[:700])
    copy = original.clone()
    before = original.allocator.snapshot(), dict(original.live)
    rest = copy.run(first[700:] + second)
    assert (original.allocator.snapshot(), original.live) == before  # the copy shares no block with it
    assert original.run(first[700:] + second) == rest  # the same blocks chosen, the same counters


def test_a_clone_at_a_capacity_runs_as_an_allocator_of_that_capacity_from_the_start():
    rng = random.Random(11)
    events = _random_step(rng, "a", 3000)
    capacity = 160 * MiB
    fresh = Replay(Allocator(capacity))
    whole = fresh.run(events)
    assert whole.oom is not None or whole.stats.num_alloc_retries > 0  # the capacity binds somewhere
    # the unlimited run up to the first op after which it holds more than the capacity, then the copy
    unlimited = Replay(Allocator())
    trace = unlimited.run(events)
    over = next(op for op, reserved in zip(trace.index, trace.reserved) if reserved > capacity)
    cut = next(j for j, e in enumerate(events) if e[0] == over)
    start = Replay(Allocator())
    start.run(events[:cut])
    copy = start.clone(capacity)
    resumed = copy.run(events[cut:])
    assert (resumed.oom, resumed.peak_reserved) == (whole.oom, whole.peak_reserved)
    assert copy.allocator.snapshot() == fresh.allocator.snapshot()  # every segment and block as the fresh one left them
    counters = ("reserved_bytes", "allocated_bytes", "num_alloc_retries", "num_ooms", "num_device_alloc",
                "num_device_free", "segments")
    assert [getattr(resumed.stats, c) for c in counters] == [getattr(whole.stats, c) for c in counters]
    with pytest.raises(OutOfMemoryError):
        Allocator(1 * MiB).clone(1 * MiB).malloc(2 * MiB)  # the copy keeps the capacity it is given

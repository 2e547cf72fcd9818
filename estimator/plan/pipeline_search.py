"""The largest local batch under pipeline parallelism: more micro-batches of the same size, composed.

A pipeline stage is traced once, at its micro-batch (:mod:`.pipeline`); what changes with the local batch at a
fixed micro-batch size is how many micro-batches the schedule runs: how many a rank keeps in flight (all of them
under GPipe, at most its distance to the last stage under 1F1B), the receive buffers ``PipelineStage`` keeps
(one per micro-batch) and the sends not yet waited on.  Those are the schedule's composition, which costs no
trace: the search composes every rank at each candidate count (:func:`.pipeline._compose_ranks`) and keeps the
largest whose highest rank fits the card with its reserve.  Candidates are the counts the schedule runs: any for
GPipe, at least ``pp`` for 1F1B, multiples of ``pp`` for the multi-stage schedules (interleaved 1F1B, ZBV);
exponential then binary search, up to :data:`MAX_MICROBATCHES` (:data:`MAX_MULTI_STAGE` for the multi-stage
schedules, whose orders come from PyTorch's schedule classes in time quadratic in the count: 0.4-0.5 s at 256
micro-batches of 8 ranks, 4-8 s at 1,024).
"""

from __future__ import annotations

from typing import Callable

from ..errors import UserError
from .results import Solve
from .search import _largest

MAX_MICROBATCHES = 4096
MAX_MULTI_STAGE = 256


def _candidates(schedule: str, pp: int) -> tuple[int, int]:
    """(first count, step): the micro-batch counts ``schedule`` runs are first, first + step, ..."""
    if schedule == "gpipe":
        return 1, 1
    if schedule == "1f1b":
        return pp, 1
    return pp, pp


def largest_local_batch(fits: Callable[[int], bool], schedule: str, pp: int, micro: int) -> Solve:
    """The largest local batch (a number of micro-batches of ``micro`` samples) for which ``fits(count)`` holds.
    Counts are ``first + k x step`` (:func:`_candidates`), searched as the batch search searches its values
    (:func:`.search._largest`: doubling, then halving the gap)."""
    first, step = _candidates(schedule, pp)
    tried: list[int] = []

    def ok(k: int) -> bool:
        count = first + k * step
        tried.append(count * micro)
        try:
            return fits(count)
        except UserError:  # a count the schedule refuses
            return False

    runs = "any count" if (first, step) == (1, 1) else f"{first} or more" if step == 1 else f"multiples of {step}"
    method = (f"each stage traced once at micro-batch {micro}; the schedule composed with more micro-batches "
              f"({schedule} runs {runs})")
    found = _largest(lambda v: ok(v - 1), ((MAX_MICROBATCHES if step == 1 else MAX_MULTI_STAGE) - first) // step + 1)
    if found is None:
        return Solve("batch", None, method, tried, reason=f"no limit found up to "
                     f"{MAX_MICROBATCHES if step == 1 else MAX_MULTI_STAGE} micro-batches of {micro}")
    return Solve("batch", (first + (found - 1) * step) * micro if found else 0, method, tried)

"""Searches over traced steps: the largest micro-batch or longest sequence that fits a GPU, the
fewest GPUs on which a layout fits, and the inputs at another size.

Storage sizes are polynomials of the batch size (degree 1) and of the sequence length (degree 2:
attention scores), and of 1/N in the number of data-parallel ranks (shards), up to padding.  A
search traces the step at two or three values with the same op sequence, interpolates every
storage's size, replays the timeline to find the answer, and then traces the answer and its
neighbour to confirm it (it fits, the next does not); a miss falls back to traces only.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch
import torch.utils._pytree as pytree

from ..errors import UnsupportedModelError, UserError
from ..specs.options import usable_positions
from .results import Solve

_POSITION_ATTRS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "max_sequence_length",
                   "block_size", "seq_length")


def _plain(inputs: Any) -> Any:
    if isinstance(inputs, Mapping) and type(inputs) is not dict:
        return dict(inputs)
    return inputs


def input_dims(inputs: Any) -> tuple[int | None, int | None]:
    """(batch size, sequence length) read from the inputs: dim 0 of the first tensor; dim 1 of the
    first integer tensor with >= 2 dims (else of the first tensor with >= 2 dims)."""
    from ..caller import dataclasses_flattened

    with dataclasses_flattened(inputs):  # (a Planner reads them when it is made, outside its methods' own)
        leaves = [t for t in pytree.tree_leaves(_plain(inputs)) if isinstance(t, torch.Tensor)]
    batch = next((t.shape[0] for t in leaves if t.ndim >= 1), None)
    two = [t for t in leaves if t.ndim >= 2]
    ints = [t for t in two if not t.is_floating_point()]
    seq = (ints or two)[0].shape[1] if two else None
    return batch, seq


def check_not_empty(inputs: Any) -> None:
    """A one-line error for inputs whose batch (dimension 0 of the first tensor, :func:`input_dims`) is empty: a step
    of no samples has no size to estimate or search from (the search and the time model divided by it).  A nested
    tensor is refused first: it has no batch dimension to read (torch raises an internal error), and the capture
    does not model one (a jagged one refused from inside its op aborted the interpreter)."""
    if any(isinstance(t, torch.Tensor) and t.is_nested for t in pytree.tree_leaves(_plain(inputs))):
        raise UnsupportedModelError(
            "the inputs hold a nested tensor (torch.nested), which the capture does not model: pad the sequences "
            "(torch.nested.to_padded_tensor, or torch.nn.utils.rnn.pad_sequence) and estimate the padded step, "
            "whose bytes and FLOPs bound it")
    if input_dims(inputs)[0] == 0:
        raise UserError("the inputs' batch is empty (dimension 0 of the first input tensor is 0): give at least one "
                        "sample, e.g. --set batch=1")


def sequence_shown(inputs: Any) -> int | None:
    """The sequence length a plan's title and JSON give: dim 1 of the first integer input with 2 dims (token ids),
    else of the first floating input with 3 dims (batch, time, features); None for images (dim 1 is channels) and
    feature vectors (dim 1 is features), which :func:`input_dims` reads as a length for ``--solve seq`` alone."""
    leaves = [t for t in pytree.tree_leaves(_plain(inputs)) if isinstance(t, torch.Tensor)]
    ids = [t for t in leaves if t.ndim == 2 and not t.is_floating_point()]
    frames = [t for t in leaves if t.ndim == 3 and t.is_floating_point()]
    return int((ids or frames)[0].shape[1]) if ids or frames else None


def tokens_per_sample(inputs: Any) -> int | None:
    """Tokens in one sample: dim 1 of the first integer input with 2 dims (B, T), else None."""
    for t in pytree.tree_leaves(_plain(inputs)):
        if isinstance(t, torch.Tensor) and not t.is_floating_point() and t.ndim == 2:
            return int(t.shape[1])
    return None


def resize_inputs(inputs: Any, dim: int, old: int, new: int) -> Any:
    """The inputs with every tensor's ``dim`` of size ``old`` set to ``new`` (as meta tensors); a
    tensor passed twice stays one tensor."""
    made: dict[int, torch.Tensor] = {}

    def one(t: torch.Tensor) -> torch.Tensor:
        if t.ndim > dim and t.shape[dim] == old:
            if id(t) not in made:
                shape = list(t.shape)
                shape[dim] = new
                made[id(t)] = torch.empty(shape, dtype=t.dtype, device="meta").requires_grad_(t.requires_grad)
            return made[id(t)]
        return t

    return pytree.tree_map_only(torch.Tensor, one, _plain(inputs))


def position_limit(model: torch.nn.Module) -> tuple[int, str] | None:
    """The longest sequence the model accepts, if it says: a config / module attribute
    (max_position_embeddings, n_positions, block_size...) or the rows of a position-embedding table (less the
    rows up to its padding row, where positions are numbered after it as RoBERTa numbers them)."""
    found: list[tuple[int, str]] = []
    cfg = getattr(model, "config", None)
    for holder, prefix in [(cfg, "config")] + [(m, p or "(root)") for p, m in model.named_modules()]:
        for attr in _POSITION_ATTRS:
            v = getattr(holder, attr, None) if holder is not None else None
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                found.append((v, f"{prefix}.{attr}"))
    for path, mod in model.named_modules():
        last = path.rpartition(".")[2].lower()
        if isinstance(mod, torch.nn.Embedding) and ("pos" in last or last == "wpe"):
            rows = usable_positions(mod)  # (RoBERTa numbers positions from padding_idx + 1)
            found.append((rows, f"{path}.num_embeddings" + (" - padding_idx - 1" if rows < mod.num_embeddings
                                                              else "")))
    return min(found) if found else None


def lagrange(xs: Sequence[float], ys: Sequence[Sequence[float]], x: float) -> list[float]:
    """Per-element Lagrange interpolation of the vectors ``ys`` (taken at ``xs``) at ``x``."""
    out = torch.zeros(len(ys[0]), dtype=torch.float64)
    for i, (xi, y) in enumerate(zip(xs, ys)):
        w = 1.0
        for j, xj in enumerate(xs):
            if j != i:
                w *= (x - xj) / (xi - xj)
        out += w * torch.as_tensor(y, dtype=torch.float64)
    return out.tolist()


def _largest(fits_at: Callable[[int], bool], limit: int) -> int | None:
    """The largest value >= 1 for which ``fits_at`` holds (0: not even 1), doubling then halving; None past
    ``limit``."""
    if not fits_at(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits_at(hi):
        lo, hi = hi, hi * 2
    if hi > limit:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits_at(mid) else (lo, mid)
    return lo


def largest_fitting(what: str, base: int, fits_interpolated: Callable[[int], bool] | None,
                    traced: Callable[[int], tuple[bool, int, int]], points: list[int], confirm: bool,
                    limit: int = 1 << 24, model_limit: tuple[int, str] | None = None, real: bool = False,
                    recalibrate: Callable[[int, int], bool] | None = None, capacity: int | None = None,
                    exact: Callable[[int], int] | None = None,
                    anchor: Callable[[list[int]], Callable[[int], int] | None] | None = None,
                    reproduced: Callable[[int], bool] | None = None,
                    peak_at: Callable[[int], int] | None = None) -> Solve:
    """The largest value (>= 1) that fits: interpolated when ``fits_interpolated`` is given (the
    traces at ``points`` share their structure), then confirmed by ``traced(v) -> (fits, peak, bytes needed)``.
    ``real``: the traces ran on real CPU tensors (data-dependent control flow), so a trace at the
    answer would run the model for real at that size, which may not fit this machine: interpolated
    only, never confirmed, and not searched when the traces do not interpolate.  ``recalibrate(v, need)``:
    when a confirmation misses, the interpolation is moved to the bytes the trace at ``v`` needs (the
    allocator's reserve at that size, which the interpolation guesses) and searched again within what the
    traces so far bound, up to 3 times, before the traces narrow what they bracket
    (:func:`_narrow`; ``capacity``: the card's bytes, to aim each trace where the bytes needed cross it).
    ``exact(v)``: the bytes needed at ``v`` with the caching allocator simulated on the interpolated sizes
    (:func:`.interpolate.need_at`), which refines the first guess before any trace; ``anchor(values)``: the
    same interpolated from the traces at ``values`` (None where they differ in op sequence or in the kernels'
    allocations), used when a confirmation misses: from the two traces around the miss, the answer is
    searched again.  ``reproduced(v)``: the trace at ``v`` (made) has every size the interpolation gives there;
    when the answer's next is traced, does not fit and is reproduced, the answer (between that trace and the
    points) is not traced: its bytes are ``exact``'s and its peak ``peak_at``'s, which a trace would repeat."""
    method = "interpolated" if fits_interpolated is not None else "traced (the op sequence changes with the size)"
    if real:
        if fits_interpolated is None:
            return Solve(what, None, "not searched", list(points),
                         reason="not searched: the model traces on real CPU tensors only and its ops change with the size")
        confirm, method = False, method + " (not confirmed: the model traces on real CPU tensors only)"
    fits_at = fits_interpolated or (lambda v: traced(v)[0])
    best = _largest(fits_at, limit)
    if best is None and fits_interpolated is not None and (
            exact(limit) > capacity if exact is not None and capacity is not None else confirm and not traced(limit)[0]):
        best = limit  # the first guess ran past the limit where the simulated allocator (or a trace) does not fit:
        # searched down from there (a model linear in its sequence: "over 16,777,216" where 14 M fit and 2^24 not)
    if best is None:
        return Solve(what, None, method, list(points), reason=f"over {limit:,} (the search stops there)")
    if exact is not None and capacity is not None and best >= 1:
        best = _refine(exact, capacity, best, limit)
        method += " (the caching allocator simulated at each size)"
    if model_limit is not None and best > model_limit[0]:
        return Solve(what, model_limit[0], method, list(points), limited_by=f"{model_limit[1]} = {model_limit[0]}",
                     memory_allows=best)
    if not confirm:
        return Solve(what, best, method, list(points), confirmed=False if real and best else None)
    known: dict[int, tuple[bool, int, int]] = {0: (True, 0, 0)}  # every trace: value -> (fits, peak, need)

    def probe(v: int) -> bool:
        if v not in known:
            known[v] = traced(v)
        return known[v][0]

    if reproduced is not None and exact is not None and peak_at is not None and best >= min(points):
        if not probe(best + 1) and reproduced(best + 1):
            return Solve(what, best, method + " (the next traced: every size as interpolated)", list(points),
                         confirmed=True, peak_at_answer=peak_at(best), peak_at_next=known[best + 1][1],
                         needed_at_answer=exact(best), by_next=True)
    probe(best), probe(best + 1)
    rounds = 0
    while not _closed(known, best) and anchor is not None and capacity is not None and best >= 1 and rounds < 3:
        rounds += 1  # a miss: the kernels' allocations changed kind between the first traces and here
        need = anchor([best, best + 1])
        lo, hi = _bracket(known)
        if need is None:
            break
        again = _refine(need, capacity, best, limit)
        again = max(lo, min(again, hi - 1)) if hi is not None else max(lo, again)  # within what the traces bound
        if again == best:
            break
        best = again
        if probe(best):
            probe(best + 1)
        if _closed(known, best):
            method += " (interpolated again from the traces around a miss)"
    rounds = 0
    while not _closed(known, best) and recalibrate is not None and fits_interpolated is not None and best >= 1 \
            and rounds < 3:
        rounds += 1  # the interpolation missed: move it to what the last trace needs, search again
        at = best + 1 if known[best][0] else best
        if not recalibrate(at, known[at][2]):
            break
        again = _largest(fits_at, limit)
        lo, hi = _bracket(known)
        if again is None or again < 1:
            break
        best = max(lo, min(again, hi - 1)) if hi is not None else max(lo, again)  # within what the traces bound
        if best in known and best + 1 in known:
            break
        if probe(best):
            probe(best + 1)
        if _closed(known, best):
            method += " (recalibrated on the traced reserve)"
    if not _closed(known, best):  # the interpolation missed: narrow with traces from what they bracket
        best = _narrow(known, probe, capacity)
        method += " (missed; searched with traces)"
    ok_best, peak_best, need_best = known[best] if best >= 1 else (True, 0, 0)
    probe(best + 1)
    ok_next, peak_next, _ = known[best + 1]
    return Solve(what, best, method, list(points), confirmed=ok_best and not ok_next, peak_at_answer=peak_best,
                 peak_at_next=peak_next, needed_at_answer=need_best)


def _refine(need: Callable[[int], int], capacity: int, start: int, limit: int, budget: int = 128) -> int:
    """The largest value ``v`` (0 when not even 1) with ``need(v) <= capacity``, ``need`` the bytes needed at ``v``
    (non-decreasing and close to linear; each evaluation simulates the caching allocator), searched from ``start``
    (a first guess): a second probe 1/64 of the way off for the slope, then each probe where the line through the
    evaluations nearest the bracket reaches ``capacity``; when two probes in a row land on one side (the line
    stalls on the allocator's rounding), the next goes at least twice the last move further.  The bracket
    closes where a bisection's would (same answer), in about 6 evaluations where a doubling search and a bisection
    took about 20 at answers in the thousands."""
    seen: dict[int, int] = {}
    lo, hi = 0, limit + 1  # need(lo) fits (0: nothing to fit); need(hi) does not (past the limit: taken so)
    v, sides, probes = min(max(start, 1), limit), [], []
    while budget > 0:
        budget -= 1
        seen[v] = need(v)
        probes.append(v)
        fits = seen[v] <= capacity
        lo, hi = (v, hi) if fits else (lo, v)
        if hi - lo <= 1:
            break
        sides.append(fits)
        if len(seen) == 1:
            v += max(1, v // 64) if fits else -max(1, v // 64)
        else:
            ends = [u for u in (lo, hi) if u in seen]
            ends += [u for u in reversed(seen) if u not in ends][:2 - len(ends)]
            (a, na), (b, nb) = ((u, seen[u]) for u in ends)
            if nb != na:
                v = a + (capacity - na) * (b - a) // (nb - na)
            else:  # a plateau (the allocator's rounding): step out from it, twice as far, on its side
                v = max(a, b) + abs(b - a) if nb <= capacity else min(a, b) - abs(b - a)
            moved = abs(probes[-1] - probes[-2])
            if sides[-2:] == [True, True]:  # the line stalls: gallop, twice the last move
                v = max(v, lo + 2 * moved)
            elif sides[-2:] == [False, False]:
                v = min(v, hi - 2 * moved)
        v = min(max(v, lo + 1), hi - 1)
    return lo


def _closed(known: dict[int, tuple[bool, int, int]], v: int) -> bool:
    """``v`` traced and fits, ``v + 1`` traced and does not."""
    return v in known and v + 1 in known and known[v][0] and not known[v + 1][0]


def _bracket(known: dict[int, tuple[bool, int, int]]) -> tuple[int, int | None]:
    """(the largest traced value that fits, the smallest above it that does not; None if none)."""
    lo = max(v for v, (ok, _, _) in known.items() if ok)
    return lo, min((v for v, (ok, _, _) in known.items() if not ok and v > lo), default=None)


def _narrow(known: dict[int, tuple[bool, int, int]], probe: Callable[[int], bool], capacity: int | None,
            budget: int = 16) -> int:
    """The largest value that fits by traces, from those already made: past the largest that fits by doubling,
    below one that does not by gaps doubling down, then between the two where the bytes needed cross the
    ``capacity`` (linear between the bracketing traces; a bisection when that step did not halve the gap)."""
    lo, hi = _bracket(known)
    while hi is None and budget > 0:
        budget -= 1
        probe(2 * lo)
        lo, hi = _bracket(known)
    if lo == 0 and hi is not None:  # nothing traced fits: step down from the smallest that does not
        gap = max(1, hi // 64)
        while hi - gap > 0 and budget > 0 and not probe(hi - gap):
            gap, budget = gap * 2, budget - 1
        lo, hi = _bracket(known)
    aim = True
    while hi is not None and hi - lo > 1 and budget > 0:
        mid = (lo + hi) // 2
        need_lo, need_hi = known[lo][2], known[hi][2]
        if aim and capacity is not None and lo >= 1 and need_hi > need_lo:
            mid = min(max(lo + (capacity - need_lo) * (hi - lo) // (need_hi - need_lo), lo + 1), hi - 1)
        width = hi - lo
        probe(mid)
        budget -= 1
        lo, hi = _bracket(known)
        aim = hi is None or 2 * (hi - lo) <= width
    return lo


def fewest_gpus(candidates: list[int], fits: Callable[[int], bool]) -> int | None:
    """The first of the increasing ``candidates`` on which ``fits`` (monotone), by bisection; None if none."""
    if not candidates or not fits(candidates[-1]):
        return None
    lo, hi = -1, len(candidates) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(candidates[mid]) else (mid, hi)
    return candidates[hi]


def check_solve(solve: Any, inputs: Any = None) -> tuple[str, ...]:
    """``solve`` (a name, a sequence of names or None) as a tuple of "batch" and "seq", or a one-line error; "seq"
    with ``inputs`` that have no sequence (:func:`sequence_shown`: images, feature vectors) is one too (it resized
    their channels or features: "expected input[4, 6, 32, 32] to have 3 channels")."""
    asked = (solve,) if isinstance(solve, str) else tuple(solve or ())
    bad = [s for s in asked if s not in ("batch", "seq")]
    if bad:
        raise UserError(f"solve takes 'batch' (the largest micro-batch) and 'seq' (the longest sequence), not {bad[0]!r}")
    if "seq" in asked and inputs is not None and sequence_shown(inputs) is None:
        raise UserError("--solve seq searches a sequence length, and these inputs have none (token ids (batch, seq) "
                        "or frames (batch, time, features); dimension 1 of images is channels, of feature vectors "
                        "features): drop --solve seq")
    return asked


def check_budget(tokens: float | None, samples: float | None, steps: int | None, mfu: float | None) -> None:
    if sum(x is not None for x in (tokens, samples, steps)) > 1:
        raise UserError("give one budget: --tokens, --samples or --steps")
    for name, v in (("--tokens", tokens), ("--samples", samples), ("--steps", steps)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf")):
            raise UserError(f"{name} must be a finite number > 0, not {v!r}")  # (NaN fails 0 < v)
    if steps is not None and steps != int(steps):
        raise UserError(f"--steps must be a whole number of optimizer steps, not {steps}")
    if mfu is not None and (isinstance(mfu, bool) or not isinstance(mfu, (int, float)) or not 0.0 < mfu <= 1.0):
        raise UserError(f"--mfu must be in (0, 1], e.g. 0.4, not {mfu}")

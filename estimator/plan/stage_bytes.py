"""What one traced pipeline stage holds, as the schedule's composition (:mod:`.pipeline_schedule`) needs it:
each phase's peak by row, what one micro-batch holds from its forward to its backward, the stage at rest, and
what zero-bubble's input-gradient pass keeps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .traced import ROWS, Timeline, running_bytes


@dataclass(frozen=True)
class StageBytes:
    """What the composition needs of one stage's traced micro-batch (see :func:`stage_bytes`); bytes by
    row of the per-GPU table."""

    peaks: dict[Any, tuple[int, dict[str, int]]]  # (micro_step, "forward"|"backward") and "optimizer"
    held: dict[str, int]  # one micro-batch from its forward to its backward
    # the stage at rest: before any forward, after forwards only (less their micro-batches), after a backward
    idle: tuple[dict[str, int], dict[str, int], dict[str, int]]
    recv: tuple[int, int]  # one micro-batch's receive buffers: (activation, gradient)
    sent: int  # one tensor sent (an activation or its gradient)
    retained: int = 0  # an input gradient (I) that keeps the graph: bytes above the backward's peak
    intermediates: int = 0  # the output gradients an input gradient keeps for its weight gradient (W)


# rows of the engine's gathers: an engine that keeps a stage's parameters gathered after its forward (FSDP2 not
# resharded after forward) gathers them in the first forward of a step only
GATHER_ROWS = ("gathered_parameters", "comm_buffers")


def stage_bytes(step: Any, device: str, recv: tuple[int, int], sent: int, kept: bool = False) -> StageBytes:
    """What the schedule's composition needs of a traced stage step (:class:`StageBytes`): the
    running live bytes of ``step`` (as :func:`.traced.replay` counts them: the optimizer state live from the
    start, CUDA's block rounding), their maximum in each phase with its rows; the bytes the first micro-step's
    forward makes and still holds at its end (its saved activations, autocast's weight copies, its output, the
    activation it received), which every other micro-batch in flight holds too; the stage at rest (before any
    forward, after the first forward less that micro-batch, after the first backward).  ``kept``: the engine keeps
    the parameters gathered after forward (FSDP2 not resharded after forward): a forward after the first and
    before any backward (GPipe's, 1F1B's warm-up) gathers nothing, and its peak, ``(0, "forward again")``, is the
    first forward's without the gathers' transients (those rows as at its end)."""
    cap = step.cap
    tl = Timeline(cap, step.rows)
    start_rows, deltas, live = running_bytes(tl, cap.storage_bytes, device)
    running = live.tolist()
    library = step.library_bytes(device)

    def key(index: int) -> Any:
        if index < 0:
            return None
        meta = cap.nodes[index].meta
        phase = meta.get("phase", "forward")
        if phase == "optimizer":
            return "optimizer"
        return meta.get("micro_step", 0), "backward" if phase == "backward" else "forward"

    best: dict[Any, int] = {}  # each phase's peak, first and last event
    first: dict[Any, int] = {}
    last: dict[Any, int] = {}
    for k, index in enumerate(tl.index):
        group = key(index)
        if group is None:
            continue
        if group not in best or running[k] > running[best[group]]:
            best[group] = k
        first.setdefault(group, k)
        last[group] = k

    def rows_at(k: int) -> dict[str, int]:
        rows = start_rows.index_add(0, tl.row[tl.sid[:k + 1]], deltas[:k + 1])
        return {r: int(rows[i]) for i, r in enumerate(ROWS)}

    peaks = {}
    for group, k in best.items():
        by_row = rows_at(k)
        by_row["workspaces"] += library
        peaks[group] = (running[k] + library, by_row)
    if kept and (0, "forward") in first:
        peaks[(0, "forward again")] = _forward_again(tl, start_rows, deltas, running, rows_at,
                                                     range(first[(0, "forward")], last[(0, "forward")] + 1), library)
    held: dict[str, int] = {}
    saved: dict[int, int] = {}  # what the first micro-batch's forward made and still holds at its end
    sids, changes = tl.sid.tolist(), deltas.tolist()
    if (0, "forward") in first:
        for k in range(first[(0, "forward")], last[(0, "forward")] + 1):
            if changes[k] > 0:
                saved[sids[k]] = changes[k]
            elif changes[k] < 0:
                saved.pop(sids[k], None)
        # its own tensors only: parameters gathered by the engine, gradients, buffers of collectives and the
        # libraries' workspaces are the stage's, not one per micro-batch in flight
        own = {"activations", "temporaries", "weight_copies", "inputs_and_buffers"}
        saved = {sid: b for sid, b in saved.items() if step.rows[sid] in own}
        for sid, b in saved.items():
            held[step.rows[sid]] = held.get(step.rows[sid], 0) + b
    retained = intermediates = 0
    if held and (0, "backward") in last:
        window = range(first[(0, "backward")], last[(0, "backward")] + 1)
        retained, intermediates = _zero_bubble_bytes(step, window, sids, changes, running, set(saved))
        retained = max(0, retained + library - peaks[(0, "backward")][0])
    start = {r: int(start_rows[i]) for i, r in enumerate(ROWS)}
    after_forward = {r: b - held.get(r, 0) for r, b in rows_at(last[(0, "forward")]).items()} \
        if (0, "forward") in last else start
    after_backward = rows_at(last[(0, "backward")]) if (0, "backward") in last else after_forward
    return StageBytes(peaks, held, (start, after_forward, after_backward), recv, sent, retained, intermediates)


def _forward_again(tl: Timeline, start_rows: Any, deltas: Any, running: list[int], rows_at: Any, window: range,
                   library: int) -> tuple[int, dict[str, int]]:
    """The peak of a forward that gathers nothing: the first forward's running bytes (``window``: its events) with
    the rows of the engine's gathers (:data:`GATHER_ROWS`) held at their values at its end, and its rows."""
    index = [ROWS.index(r) for r in GATHER_ROWS]
    gather = (tl.row[tl.sid].unsqueeze(1) == tl.row.new_tensor(index)).any(1)
    gathers = (start_rows[index].sum() + (deltas * gather).cumsum(0)).tolist()
    end = gathers[window[-1]]
    k = max(window, key=lambda j: running[j] - gathers[j])
    rows = rows_at(k)
    end_rows = rows_at(window[-1])
    for r in GATHER_ROWS:
        rows[r] = end_rows[r]
    rows["workspaces"] += library
    return running[k] - gathers[k] + end + library, rows


def _zero_bubble_bytes(step: Any, window: range, sids: list[int], changes: list[int], running: list[int],
                       saved: set[int]) -> tuple[int, int]:
    """What zero-bubble's input-gradient pass (``stage_backward_input``) holds of the first micro-step's backward
    (``window``: its events): the top of the backward with none of the forward's ``saved`` storages freed (the
    graph is kept, ``retain_graph=True``) nor the output gradients its weight gradients will read (the
    "intermediates" whose gradients it stores for ``stage_backward_weight``), without the weight gradients
    themselves (``autograd.grad`` for the inputs only); and those output gradients' bytes, held until the
    weight-gradient pass.  An output gradient is a GEMM operand made in backward whose other operand is a saved
    activation (``dW = dY^T X``)."""
    gemms = ("aten.mm.default", "aten.addmm.default")
    kept: set[int] = set()
    skipped = {sid for sid, row in enumerate(step.rows) if row == "gradients"}
    for node in step.cap.nodes:
        meta = node.meta
        if meta.get("phase") != "backward" or meta.get("micro_step", 0) != 0 or str(node.target) not in gemms:
            continue
        operands = [a.meta["storage"][0] for a in node.args if getattr(a, "meta", None) and a.meta.get("storage")]
        if any(sid in saved for sid in operands):
            kept.update(sid for sid in operands if sid not in saved and step.rows[sid] != "parameters")
            skipped.update(meta.get("storage") or ())  # the weight gradient: not made by the input pass
    freed = top = skipped_live = 0
    sizes: dict[int, int] = {}
    for k in window:
        sid, change = sids[k], changes[k]
        if change > 0 and sid in kept:
            sizes[sid] = max(sizes.get(sid, 0), change)
        if sid in skipped and sid not in kept:
            skipped_live += change
        elif change < 0 and (sid in saved or sid in kept):
            freed -= change
        top = max(top, running[k] + freed - skipped_live)
    return top, sum(sizes.values())

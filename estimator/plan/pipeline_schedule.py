"""The pipeline schedules as ``torch.distributed.pipelining`` runs them: which stages a rank holds, the order of
its actions, the bytes it holds at each of them and the step's time.

* **Stages per rank** (torchtitan's ``pipeline_module_split``): one for the single-stage schedules (GPipe, 1F1B);
  two for the multi-stage ones, torchtitan's default (``pipeline_parallel_layers_per_stage`` unset), placed
  ``rank, rank + pp`` by the looped schedules (interleaved 1F1B) and ``rank, 2 pp - 1 - rank`` by the V-shaped
  ones (ZBV).
* **The order of actions**: the multi-stage schedules' ``pipeline_order``, made by PyTorch's own schedule class
  (it is the program ``_PipelineScheduleRuntime`` executes; the class is built with stand-ins for the stages,
  which its order needs only the indices and sizes of); the single-stage schedules' as their
  ``_step_microbatches`` runs them (GPipe: every forward, then every backward; 1F1B: ``min(M, pp - stage)``
  forwards, then one backward and one forward, then the remaining backwards).
* **Bytes at each action** (:func:`rank_peak`): the action's traced phase (its stage's traced micro-batch) with
  the other micro-batches in flight on that stage (each holding what one micro-batch holds from its forward to
  its backward), the rank's other stages as they rest at that moment (their model states, their micro-batches
  in flight), the receive buffers ``PipelineStage`` keeps (one per micro-batch, allocated once), and the tensors
  of sends not yet waited on: ``Schedule1F1B`` keeps its last backward's send until the next; the runtime of
  the multi-stage schedules waits on its sends only at the end of the step, and a send's work holds its tensor.
* **Time** (:func:`simulate`): every rank runs its actions in order, a forward after the previous stage's forward
  of that micro-batch, a backward after the next stage's backward, each plus the send between ranks; the
  step is the last rank's finish.  Zero-bubble's weight gradient (``W``) is the forward's matmul work again
  (a weight gradient GEMM has its forward GEMM's FLOPs) and the input gradient (``I``) the rest of the backward.

Zero-bubble's ``I`` (``stage_backward_input``) keeps the micro-batch's graph (``retain_graph``) and the output
gradients of its weight GEMMs until its ``W``; the first stage's ``I`` does nothing and its ``W`` runs the whole
backward (``PipelineStage.backward_one_chunk``).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from ..errors import UserError
from .stage_bytes import StageBytes

SINGLE_STAGE = ("gpipe", "1f1b")
MULTI_STAGE = ("interleaved-1f1b", "zbv")


def stages_per_rank(schedule: str) -> int:
    """Stages each rank holds: torchtitan's default for the schedule's kind."""
    return 1 if schedule in SINGLE_STAGE else 2


def rank_stages(schedule: str, pp: int, rank: int) -> tuple[int, ...]:
    """The stage indices ``rank`` holds (``pipeline_module_split``'s ``_get_stage_indices``)."""
    v = stages_per_rank(schedule)
    if schedule == "zbv":
        return rank, 2 * pp - 1 - rank
    return tuple(rank + k * pp for k in range(v))


@dataclass(frozen=True)
class Action:
    """One computation of the schedule: ``kind`` F (forward), B (full backward), I (input gradient) or W
    (weight gradient) of ``microbatch`` on ``stage``."""

    stage: int
    kind: str
    microbatch: int


def orders(schedule: str, pp: int, microbatches: int) -> dict[int, list[Action]]:
    """Every rank's actions in the order it runs them."""
    if schedule in SINGLE_STAGE:
        out = {}
        for rank in range(pp):
            m = microbatches
            if schedule == "gpipe":
                out[rank] = [Action(rank, "F", i) for i in range(m)] + [Action(rank, "B", i) for i in range(m)]
                continue
            warm = min(m, pp - rank)
            acts = [Action(rank, "F", i) for i in range(warm)]
            for i in range(m - warm):
                acts += [Action(rank, "B", i), Action(rank, "F", warm + i)]
            out[rank] = acts + [Action(rank, "B", i) for i in range(m - warm, m)]
        return out
    return _torch_orders(schedule, pp, microbatches)


def _torch_orders(schedule: str, pp: int, microbatches: int) -> dict[int, list[Action]]:
    """The ``pipeline_order`` of PyTorch's schedule class for ``schedule``, built on stand-in stages."""
    from torch.distributed.pipelining import schedules

    cls = {"interleaved-1f1b": schedules.ScheduleInterleaved1F1B, "zbv": schedules.ScheduleZBVZeroBubble}[schedule]
    n = pp * stages_per_rank(schedule)
    stand_ins = [SimpleNamespace(stage_index=s, num_stages=n, group_size=pp, group_rank=0, is_first=s == 0,
                                 is_last=s == n - 1, submod=None) for s in rank_stages(schedule, pp, 0)]
    try:
        made = cls(stand_ins, microbatches, loss_fn=lambda *a: None)
    except (ValueError, AssertionError, RuntimeError) as e:
        raise UserError(f"--pp-schedule {schedule} with --pp {pp} and --microbatches {microbatches}: "
                        f"{str(e).splitlines()[0]}; use a multiple of --pp micro-batches") from None
    out = {}
    for rank, acts in made.pipeline_order.items():  # computations only (the runtime adds the sends)
        out[rank] = [Action(a.stage_index, a.computation_type.value, a.microbatch_index)
                     for a in acts if a is not None and a.computation_type.value in ("F", "B", "I", "W")]
    return out


def _plus(*parts: tuple[dict[str, int], int]) -> dict[str, int]:
    """The sum of ``k`` times each rows."""
    out: dict[str, int] = {}
    for rows, k in parts:
        for row, b in rows.items():
            out[row] = out.get(row, 0) + k * b
    return out


def _phase_rows(st: StageBytes, a: Action, before: int, microbatches: int, forwards: int = 0) -> dict[str, int]:
    """The traced phase that stands for action ``a`` (``before``: the stage's backwards done before it,
    ``forwards``: its forwards): a forward before any backward is the first micro-step's (after the stage's first
    forward, without its gathers where the engine keeps the parameters gathered), a later one the second's; the
    first backward is
    the first micro-step's and the last the second's (the traced last micro-step: gradients accumulated, then
    the engine's gradient sync and resharding).  A backward between them accumulates as the last does without
    its sync: the last's rows with the first's communication buffers, the gradients as the first backward left
    them (FSDP2 reduces them only on the last), the parameters still gathered as after the first."""
    if a.kind == "F":
        if before == 0 and forwards > 0 and (0, "forward again") in st.peaks:
            return st.peaks[(0, "forward again")][1]
        return st.peaks[(0 if before == 0 or (1, "forward") not in st.peaks else 1, "forward")][1]
    first = st.peaks[(0, "backward")][1]
    if before == 0 or (1, "backward") not in st.peaks:
        return first
    last = st.peaks[(1, "backward")][1]
    if before >= microbatches - 1:
        return last
    return {**last, "comm_buffers": first.get("comm_buffers", 0),
            "gradients": min(last.get("gradients", 0), st.idle[2].get("gradients", 0)),
            "gathered_parameters": max(first.get("gathered_parameters", 0), last.get("gathered_parameters", 0))}


def rank_peak(actions: list[Action], stages: dict[int, StageBytes], schedule: str, microbatches: int,
              n_stages: int) -> tuple[int, dict[str, int], str, dict[int, int]]:
    """The rank's peak over its actions (and the optimizer): (bytes, rows that add up to them, where, most in
    flight per stage).

    Why this length: one walk over the actions keeps every stage's counts, and each action's bytes add four
    terms (its phase, its stage's others in flight, the resting stages, buffers and sends) that read them."""
    done_f = dict.fromkeys(stages, 0)
    done_b = dict.fromkeys(stages, 0)  # B or I: the input gradient sent back
    done_w = dict.fromkeys(stages, 0)  # W (zero-bubble) or B: the micro-batch's tensors freed
    most = dict.fromkeys(stages, 0)
    runtime = schedule in MULTI_STAGE  # sends waited on at the end of the step

    def resting(t: int) -> dict[str, int]:
        st = stages[t]
        base = st.idle[0] if done_f[t] == 0 else st.idle[1] if done_b[t] == 0 else st.idle[2]
        return _plus((base, 1), (st.held, done_f[t] - done_w[t]),
                     ({"activations": st.intermediates}, done_b[t] - done_w[t]))

    def sends(t: int, now: Action | None) -> int:
        st = stages[t]
        if now is None:  # every schedule waits on its sends before the step returns, before the optimizer
            return 0
        if runtime:  # every send of the step so far, the outputs of stages before the last after their backward
            outputs = done_w[t] if t < n_stages - 1 else 0
            grads = done_b[t] if t > 0 else 0
            return (outputs + grads) * st.sent
        if t == 0:  # the first stage sends no gradient
            return 0
        if schedule == "1f1b":  # the previous backward's gradient send, waited on at the next backward
            return st.sent if done_b[t] > 0 else 0
        return done_b[t] * st.sent  # GPipe: the backward's sends, waited on after the last backward

    def buffers(t: int, now: Action | None) -> int:
        st = stages[t]
        act, grad = st.recv
        counted_act = done_f[t] - done_w[t] + (1 if now is not None and now.stage == t and now.kind == "F" else 0)
        counted_grad = 1 if now is not None and now.stage == t and now.kind in ("B", "I") else 0
        return microbatches * (act + grad) - act * counted_act - grad * counted_grad

    best: tuple[int, dict[str, int], str] = (-1, {}, "")
    for a in actions:
        st = stages[a.stage]
        if a.kind == "I" and a.stage == 0:  # the first stage has no input gradient: its W runs the whole backward
            done_b[a.stage] += 1
            continue
        others = done_f[a.stage] - done_w[a.stage] - (a.kind != "F")  # its stage's other micro-batches in flight
        waiting = done_b[a.stage] - done_w[a.stage] - (a.kind == "W")  # ... between their I and W
        rows = _plus((_phase_rows(st, a, done_b[a.stage] if a.kind != "W" else done_w[a.stage], microbatches,
                                  done_f[a.stage]), 1),
                     (st.held, others),
                     ({"activations": st.intermediates}, waiting), ({"activations": st.retained}, a.kind == "I"),
                     ({"comm_buffers": sum(buffers(t, a) + sends(t, a) for t in stages)}, 1),
                     *((resting(t), 1) for t in stages if t != a.stage))
        total = sum(rows.values())
        if total > best[0]:
            best = (total, rows, f"{'forward' if a.kind == 'F' else 'backward'} of micro-batch {a.microbatch + 1} "
                                 f"on stage {a.stage}, {others + 1} in flight")
        if a.kind == "F":
            done_f[a.stage] += 1
        elif a.kind in ("B", "I"):
            done_b[a.stage] += 1
        if a.kind in ("B", "W"):
            done_w[a.stage] += 1
        most[a.stage] = max(most[a.stage], done_f[a.stage] - done_w[a.stage])
    for t, st in stages.items():  # the optimizer: every stage at rest after its last backward
        if "optimizer" in st.peaks:
            rows = _plus((st.peaks["optimizer"][1], 1), *((st2.idle[2], 1) for t2, st2 in stages.items() if t2 != t),
                         ({"comm_buffers": sum(buffers(t2, None) for t2 in stages)}, 1))
            if sum(rows.values()) > best[0]:
                best = (sum(rows.values()), rows, f"optimizer step (stage {t})")
    return best[0], best[1], best[2], most


def simulate(acts: dict[int, list[Action]], rank_of: dict[int, int], seconds: dict[int, dict[str, float]],
             send_s: dict[int, float]) -> tuple[float, dict[int, float]]:
    """The step's makespan over the ranks' orders (see the module docstring) and each rank's busy time;
    ``seconds[stage][kind]``, ``send_s[stage]``: one activation (or its gradient) from ``stage`` to its
    neighbour on another rank."""
    n_stages = len(rank_of)
    done: dict[tuple[int, str, int], float] = {}
    free = dict.fromkeys(acts, 0.0)
    nxt = dict.fromkeys(acts, 0)
    busy = dict.fromkeys(acts, 0.0)

    def ready(a: Action) -> float | None:
        deps: list[tuple[tuple[int, str, int], float]] = []
        if a.kind == "F" and a.stage > 0:
            prev = a.stage - 1
            deps.append(((prev, "F", a.microbatch), send_s[prev] if rank_of[prev] != rank_of[a.stage] else 0.0))
        if a.kind in ("B", "I"):
            deps.append(((a.stage, "F", a.microbatch), 0.0))
            if a.stage < n_stages - 1:
                later = a.stage + 1
                key = (later, "I", a.microbatch) if (later, "I", a.microbatch) in done else (later, "B", a.microbatch)
                deps.append((key, send_s[a.stage] if rank_of[later] != rank_of[a.stage] else 0.0))
        if a.kind == "W":
            deps.append(((a.stage, "I", a.microbatch), 0.0))
        at = 0.0
        for key, delay in deps:
            if key not in done:
                return None
            at = max(at, done[key] + delay)
        return at

    remaining = sum(len(v) for v in acts.values())
    while remaining:
        moved = False
        for rank, todo in acts.items():
            while nxt[rank] < len(todo):
                a = todo[nxt[rank]]
                at = ready(a)
                if at is None:
                    break
                took = seconds[a.stage][a.kind]
                done[(a.stage, a.kind, a.microbatch)] = max(at, free[rank]) + took
                free[rank] = done[(a.stage, a.kind, a.microbatch)]
                busy[rank] += took
                nxt[rank] += 1
                remaining -= 1
                moved = True
        if not moved:  # pragma: no cover - PyTorch's orders are deadlock-free
            raise RuntimeError("the pipeline schedule's actions wait on each other")
    return max(free.values()), busy

"""Step time: the traced step's ops on a compute stream, its collectives on the links, in the order
and with the dependencies the engine gives them; exposed communication is what the compute
stream waits for.

**Per op**: the calibrated per-op model of :mod:`estimator.timing` (the one ``estimate --gpu``
reports): each op's kernel time on the GPU and its host time (dispatch, launch), so a small model's
step is launch-bound as on a real GPU; the host issues ops in order and a kernel starts when the
host has issued it and the stream is free.  GPUs without measured constants use the H100's scaled
to their datasheet (``estimator.timing.load_model``; the plan's step time says so).  **Per collective**: ring algorithms, bytes each GPU sends ``2(n-1)/n S``
(all-reduce) or ``(n-1)/n S`` (all-gather, reduce-scatter, all-to-all), ``S`` (broadcast), over
the inter-node link when the group's ranks span nodes, else the intra-node link, at the links'
datasheet rates.

**Schedule** (what the engines do on GPUs, from their sources):

* compute ops run one after another on the compute stream, in the traced order; an op that
  reads a collective's output waits for the collective to finish;
* collectives run on their link, one at a time per link, each starting when the link is free
  and what it sends has been computed (CPU runs ahead of the GPU: issue order is not a wait);
* FSDP2 copies the shards into its all-gather buffer and the gradients into its reduce-scatter
  buffer on the communication side (``all_gather_copy_in``, ``chunk_cat``: side streams in
  ``_fsdp_collectives.py``), and the copy-in of an all-gather waits for the copy-out of the
  previous one (``_fsdp_param_group.py``: ``AllGatherState``, one all-gather in flight ahead):
  so the next unit's parameters are gathered while this unit computes, forward and backward
  (FSDP2's implicit forward and explicit backward prefetch), and a unit's reduce-scatter runs
  while the previous unit's backward computes;
* DDP all-reduces each bucket when it is full (its copies in are compute ops), the optimizer
  waits for the reduced gradients; tensor parallelism's collectives are waited for by the next op.

ZeRO (no engine traced): compute is the single-device step's ops (the optimizer's for the
rank's partition); communication per DeepSpeed's defaults: stages 1-2 reduce-scatter the
gradients and all-gather the updated parameters without overlap (``overlap_comm`` off), stage
3 gathers parameters in forward and backward and reduce-scatters gradients overlapped with the
pass that needs them (``overlap_comm`` on): a pass's exposed time is its communication beyond
its compute.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import torch.utils._pytree as pytree

from ..graph import OpNode
from ..hardware import GPU, Link
from ..rules.registry import MATMUL
from ..timing import load_model, node_times
from .traced import Collective, Step, _op_name
from .results import StepTime

_SIDE_COPIES = frozenset({"fsdp.all_gather_copy_in", "fsdp.chunk_cat"})
_COPY_OUT = "fsdp.split_with_sizes_copy"


def _model_name(gpu: GPU) -> str:
    model = load_model(gpu)
    return "calibrated per-op times" if model.calibrated else f"per-op times {model.source}"


def ring_bytes(kind: str, n: int, size: float) -> float:
    """Bytes each GPU sends in a ring collective over ``n`` GPUs (``size``: the full buffer S)."""
    if n <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2 * (n - 1) / n * size
    if kind == "broadcast":
        return size
    return (n - 1) / n * size


def collective_time(c: Collective, intra: Link, inter: Link) -> tuple[float, Link]:
    lk = inter if c.spans_nodes else intra
    return ring_bytes(c.kind, c.group_size, c.nbytes) / lk.bandwidth, lk


def _sids_of(value) -> set[int]:
    out: set[int] = set()
    for leaf in pytree.tree_leaves(value):
        if isinstance(leaf, OpNode):
            out.update(leaf.meta.get("storage", ()))
    return out


def traced_time(step: Step, gpu: GPU, intra: Link, inter: Link, optimizer_on_gpu: bool = True) -> StepTime:
    """The step time of an engine-traced step (see the module docstring)."""
    t_compute = 0.0
    busy = 0.0
    link_free: dict[str, float] = defaultdict(float)
    side_free: dict[str, float] = defaultdict(float)
    ready: dict[int, float] = {}  # storage -> when a collective's result is there
    written: dict[int, float] = {}  # storage -> when the compute stream last wrote it
    last_copy_out = 0.0
    by_phase: dict[str, float] = defaultdict(float)
    comm_s: dict[str, float] = defaultdict(float)
    comm_bytes: dict[str, float] = defaultdict(float)
    links: set[str] = set()
    end = 0.0
    host = 0.0  # when the host has issued the ops so far
    waited = 0.0  # compute-stream time spent waiting for collectives
    times = node_times(step.cap.nodes, gpu)
    for i, node in enumerate(step.cap.nodes):
        phase = node.meta.get("phase", "forward")
        inputs = _sids_of((node.args, node.kwargs))
        outputs = set(node.meta.get("storage", ()))
        after_inputs = max((written.get(s, 0.0) for s in inputs), default=0.0)
        coll = step.collectives.get(i)
        name = _op_name(node)
        if coll is not None:
            seconds, lk = collective_time(coll, intra, inter)
            stream = "ag" if coll.kind == "all_gather" else "rs"
            start = max(link_free[lk.name], side_free[stream], after_inputs,
                        max((ready.get(s, 0.0) for s in inputs), default=0.0))
            finish = start + seconds
            link_free[lk.name] = side_free[stream] = finish
            for s in outputs | (inputs if name.startswith("c10d.") else set()):
                ready[s] = finish
            key = coll.kind + (" (inter-node)" if coll.spans_nodes else "")
            comm_s[key] += seconds
            comm_bytes[key] += ring_bytes(coll.kind, coll.group_size, coll.nbytes)
            if seconds:
                links.add(lk.name)
            end = max(end, finish)
            continue
        seconds, issue, sync = times[i]
        if phase == "optimizer" and not optimizer_on_gpu:
            seconds = issue = 0.0
        host += issue
        if sync:  # a device value read on the host: the host waits for the stream
            host = max(host, t_compute)
        if name in _SIDE_COPIES:  # on FSDP2's all-gather / reduce-scatter side stream
            stream = "ag" if name == "fsdp.all_gather_copy_in" else "rs"
            start = max(side_free[stream], after_inputs, last_copy_out if stream == "ag" else 0.0)
            finish = side_free[stream] = start + seconds
            for s in outputs:
                written[s] = finish
            end = max(end, finish)
            continue
        issued = max(t_compute, host)  # the stream is free and the host has issued the op
        start = max(issued, max((ready.get(s, 0.0) for s in inputs), default=0.0))
        waited += start - issued  # the stream waits for a collective
        t_compute = start + seconds
        busy += seconds
        by_phase[phase] += seconds
        for s in outputs:
            written[s] = t_compute
        if name == _COPY_OUT:
            last_copy_out = t_compute
        end = max(end, t_compute)
    waited += max(0.0, end - max(t_compute, host))  # collectives still running after the last op
    end = max(end, host)
    return StepTime(step_time_s=end, compute_s=busy, comm_s=sum(comm_s.values()), exposed_comm_s=waited,
                    by_phase_s=dict(by_phase), comm_by_kind_s=dict(comm_s), comm_bytes_per_gpu=dict(comm_bytes),
                    links=sorted(links), model=f"traced schedule, {_model_name(gpu)}")


def zero_time(step: Step, gpu: GPU, stage: int, n: int, spans_nodes: bool, intra: Link, inter: Link,
              param_bytes: float, grad_bytes: float, optimizer_scale: float) -> StepTime:
    """The step time of a ZeRO layout over the single-device step (see the module docstring).

    ``param_bytes``/``grad_bytes``: the full 16-bit (working dtype) parameters and gradients;
    ``optimizer_scale``: the optimizer's share of the traced optimizer work on this rank."""
    by_phase: dict[str, float] = defaultdict(float)
    host_by_phase: dict[str, float] = defaultdict(float)
    for node, (seconds, issue, _) in zip(step.cap.nodes, node_times(step.cap.nodes, gpu)):
        phase = node.meta.get("phase", "forward")
        by_phase["forward" if phase == "loss" else phase] += seconds
        host_by_phase["forward" if phase == "loss" else phase] += issue
    for phase, issue in host_by_phase.items():  # a launch-bound pass takes its host time
        by_phase[phase] = max(by_phase[phase], issue)
    by_phase["optimizer"] *= optimizer_scale
    lk = inter if spans_nodes else intra
    rs = ring_bytes("reduce_scatter", n, grad_bytes)
    ag = ring_bytes("all_gather", n, param_bytes)
    comm_bytes = {"reduce_scatter": rs, "all_gather": ag * (2 if stage == 3 else 1)}
    if stage == 3:
        fwd = max(0.0, ag / lk.bandwidth - by_phase["forward"])
        bwd = max(0.0, (ag + rs) / lk.bandwidth - by_phase["backward"])
        exposed = fwd + bwd
    else:
        exposed = (rs + ag) / lk.bandwidth
    compute = sum(by_phase.values())
    comm = sum(comm_bytes.values()) / lk.bandwidth
    return StepTime(step_time_s=compute + exposed, compute_s=compute, comm_s=comm, exposed_comm_s=exposed,
                    by_phase_s=dict(by_phase),
                    comm_by_kind_s={k: v / lk.bandwidth for k, v in comm_bytes.items()},
                    comm_bytes_per_gpu=comm_bytes, links=[lk.name] if n > 1 else [],
                    model=f"ZeRO volumes (DeepSpeed's overlap defaults), {_model_name(gpu)}")


def matmul_flops(step: Step, phases: Sequence[str] = ("forward", "loss", "backward")) -> tuple[float, str]:
    """Matmul-class FLOPs of ``phases`` and the dtype most of them run in."""
    by_dtype: dict[str, float] = defaultdict(float)
    for node in step.cap.nodes:
        cost = node.meta.get("cost")
        if cost is not None and cost.kind == MATMUL and node.meta.get("phase") in phases:
            by_dtype[cost.dtype or "float32"] += cost.flops
    if not by_dtype:
        return 0.0, "float32"
    return sum(by_dtype.values()), max(by_dtype, key=by_dtype.get)

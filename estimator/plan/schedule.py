"""Step time: the traced step's ops on a compute stream, its collectives on the links, in the order
and with the dependencies the engine gives them; exposed communication is what the compute
stream waits for.

**Per op**: the calibrated per-op model of :mod:`estimator.timing` (the one ``estimate --gpu``
reports): each op's kernel time on the GPU and its host time (dispatch, launch), so a small model's
step is launch-bound as on a real GPU; the host issues ops in order and a kernel starts when the
host has issued it and the stream is free.  GPUs without measured constants use the H100's scaled
to their datasheet (``estimator.timing.load_model``; the plan's step time says so).  **Per collective**: ring algorithms, bytes each GPU sends ``2(n-1)/n S``
(all-reduce) or ``(n-1)/n S`` (all-gather, reduce-scatter, all-to-all), ``S`` (broadcast), at the
ring's bus bandwidth, plus the ring's latency (:func:`collective_time`).  Inside a node the bus
bandwidth is the intra-node link's datasheet rate.  Across nodes NCCL runs one ring per NIC rail:
each of a node's ``k`` ranks of the group sends through its own NIC, so the bus bandwidth is ``k``
NICs (at NCCL's achieved 24 GB/s per 200 Gb/s NIC), capped by the intra-node link (a DGX A100,
8 x 200 Gb/s: 192 GB/s, as NVIDIA measures it).

**Schedule** (what the engines do on GPUs, from their sources):

* compute ops run one after another on the compute stream, in the traced order; an op that
  reads a collective's output waits for the collective to finish;
* collectives run on their link, one at a time per link, each starting when the link and its
  stream are free, the host has issued it and what it sends has been written;
* ops the engine issues on a side stream (recorded as FSDP2 switches streams:
  ``Step.streams``) run there, one after another, when the host has issued them and their
  inputs are written: FSDP2's casts and copy into the all-gather buffer on its copy-in stream,
  the ops after a reduce-scatter (division, the cast back to the parameters' dtype) on the
  reduce-scatter stream (``_fsdp_collectives.py``); the reduce-scatter's copy-in (``chunk_cat``)
  is on the compute stream, as in torch 2.11-2.13; the copy-in of an all-gather waits for the
  copy-out of the previous one (``_fsdp_param_group.py``: ``AllGatherState``, one all-gather in
  flight ahead): so the next unit's parameters are gathered while this unit computes, forward
  and backward (FSDP2's implicit forward and explicit backward prefetch), and a unit's
  reduce-scatter runs while the previous unit's backward computes;
* DDP all-reduces each bucket when it is full (its copies in are compute ops), the optimizer
  waits for the reduced gradients; tensor parallelism's collectives are waited for by the next op.

ZeRO (no engine traced): compute is the single-device step's ops (the optimizer's for the
rank's partition); communication per DeepSpeed's defaults: stages 1-2 reduce-scatter the
gradients and all-gather the updated parameters without overlap (``overlap_comm`` off), stage
3 gathers parameters in forward and backward and reduce-scatters gradients overlapped with the
pass that needs them (``overlap_comm`` on): a pass's exposed time is its communication beyond
its compute.  Under gradient accumulation stages 2 and 3 communicate in every micro-step (their
gradient hooks), stage 1 once per optimizer step.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import torch.utils._pytree as pytree

from ..graph import OpNode
from ..hardware import GPU, Link
from ..rules.registry import MATMUL
from ..timing import load_model, node_band
from ..timing.simulate import node_times_of, node_works
from .traced import Collective, Step, _op_name
from .results import StepTime

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


# Achieved over line rate of a NIC in NCCL's collectives: "we usually consider 24GB/s is the peak
# performance per 200G NIC (12 GB/s for 100G NICs)" (S. Jeaugey, NCCL, NVIDIA/nccl-tests#119); a DGX
# A100's 8 x 200 Gb/s measure 192 GB/s all-reduce bus bandwidth (NVIDIA/nccl#812, quoted in #1576).
# The same 96 % is assumed for 400 and 800 Gb/s NICs.
NIC_EFFICIENCY = 24 / 25

# NCCL's ring cost model (src/graph/tuning.cc, ncclTopoTuneModel): a collective takes its latency
# plus bytes over the algorithm bandwidth; the latency is a base plus one hop latency per ring step
# (microseconds; steps inside a node on NVLink or PCIe, steps between nodes on the network).
# LL trades bandwidth (1/4 of the bus across nodes or in all-reduce, 1/3 otherwise) for latency;
# NCCL picks the faster protocol per call.
_RING_BASE_US = {"simple": 8.4, "ll": 3.6}
_RING_HOP_US = {"nvlink": {"simple": 3.4, "ll": 0.47}, "pci": {"simple": 5.7, "ll": 1.0},
                "net": {"simple": 9.6, "ll": 2.7}}


def bus_bandwidth(c: Collective, intra: Link, inter: Link) -> float:
    """Bus bandwidth of the ring of ``c`` (bytes/s): the intra-node link inside one node; across
    nodes the ``per_node`` NIC rails of each node, at NCCL's achieved rate, up to the intra link."""
    if not c.spans_nodes:
        return intra.bandwidth
    return min(intra.bandwidth, c.per_node * inter.bandwidth * NIC_EFFICIENCY)


def ring_latency(c: Collective, intra: Link, protocol: str) -> float:
    """NCCL's ring latency of ``c`` in seconds: base + hops inside nodes + hops between nodes."""
    steps = 2 * (c.group_size - 1) if c.kind == "all_reduce" else c.group_size - 1
    inter_steps = 2 * (c.nodes - 1) if c.kind == "all_reduce" else c.nodes - 1
    hop = _RING_HOP_US["nvlink" if intra.name.startswith(("nvlink", "xgmi")) else "pci"][protocol]
    if c.spans_nodes and protocol == "ll":
        hop *= 1.8  # tuning.cc: LL's intra-node latency across nodes
    us = _RING_BASE_US[protocol] + (steps - inter_steps) * hop + inter_steps * _RING_HOP_US["net"][protocol]
    return us * 1e-6


def collective_time(c: Collective, intra: Link, inter: Link) -> tuple[float, Link]:
    """Seconds ``c`` takes (the faster of NCCL's Simple and LL protocols) and the link it runs on."""
    lk = inter if c.spans_nodes else intra
    volume = ring_bytes(c.kind, c.group_size, c.nbytes)  # bytes each GPU sends
    if volume == 0:
        return 0.0, lk
    if c.kind == "all_to_all" and c.spans_nodes:
        return _all_to_all_across_nodes(c, intra, inter), lk
    bw = bus_bandwidth(c, intra, inter)
    ll_bw = bw / (4 if c.spans_nodes or c.kind == "all_reduce" else 3)
    simple = ring_latency(c, intra, "simple") + volume / bw
    ll = ring_latency(c, intra, "ll") + volume / ll_bw
    return min(simple, ll), lk


def _all_to_all_across_nodes(c: Collective, intra: Link, inter: Link) -> float:
    """An all-to-all whose group spans nodes: each GPU sends ``S / n`` to every other rank, the share for ranks in
    other nodes (``(n - g) / n x S``, ``g`` ranks of the group in its node) through its own NIC rail at NCCL's
    achieved rate, the rest over the node's link at the same time (NCCL runs all-to-all as grouped point-to-point
    sends, not a ring, so the node's other rails do not carry this GPU's bytes); plus a ring's latency."""
    n, g = c.group_size, c.per_node
    across = (n - g) / n * c.nbytes / (inter.bandwidth * NIC_EFFICIENCY)
    inside = (g - 1) / n * c.nbytes / intra.bandwidth
    return ring_latency(c, intra, "simple") + max(across, inside)


def _sids_of(value) -> set[int]:
    out: set[int] = set()
    for leaf in pytree.tree_leaves(value):
        if isinstance(leaf, OpNode):
            out.update(leaf.meta.get("storage", ()))
    return out


class MicroPipelinedTP:
    """Asynchronous TP (torch.compile's micro-pipeline pass, ``torch/_inductor/fx_passes/micro_pipeline_tp.py``): each
    all-gather of sequence parallelism fused with the matmuls that read the gathered tensor
    (``symm_mem.fused_all_gather_matmul``) and each reduce-scatter with the matmul that produces its input
    (``fused_matmul_reduce_scatter``), both run chunk by chunk, one chunk per rank of the ``n``-rank group, the
    copies on the copy engines beside the compute (``torch/distributed/_symmetric_memory``:
    ``_pipelined_multi_all_gather_and_consume``, ``_pipelined_produce_and_all2all``).  Timed as:

    * all-gather then matmul: the local chunk's matmul needs nothing, chunk ``i`` waits for its copy: the matmul
      starts with the all-gather and ends at ``max(its own end, all-gather end + matmul / n)``;
    * matmul then reduce-scatter: each chunk is sent when it is computed: the reduce-scatter starts ``matmul / n``
      after the matmul and ends at ``max(its own end, matmul end + reduce-scatter / n)``.

    Ops between the collective and the matmul (waits, views, the copy that moves the gathered dimension) run
    without waiting: the fused kernel takes them in.  Memory is not changed: the gathered tensor and the
    reduce-scatter's stacked partials are still allocated by the caching allocator; the symmetric-memory
    workspace (one shard, or two chunks) is outside it."""

    def __init__(self) -> None:
        self.gathered: dict[int, tuple[float, float, int]] = {}  # storage -> (start, end, n) of its all-gather
        self.produced: dict[int, tuple[float, float]] = {}  # storage -> (start, seconds) of the matmul that wrote it

    def waits_for(self, inputs: set[int]) -> set[int]:
        """Of ``inputs``, those an op still waits for in full (not a fused all-gather's output)."""
        return {s for s in inputs if s not in self.gathered}

    def compute(self, inputs: set[int], outputs: set[int], start: float, seconds: float,
                matmul: bool) -> float:
        """The end of a compute op that starts at ``start`` (all-gathers it reads count from their start)."""
        fused = [self.gathered[s] for s in inputs if s in self.gathered]
        end = start + seconds
        if matmul:
            if fused:  # not before its all-gather starts; its last chunk after the all-gather ends
                end = max(max(start, *(b for b, _, _ in fused)) + seconds, max(e + seconds / n for _, e, n in fused))
            for s in outputs:
                self.produced[s] = (start, seconds)
            return end
        for s in outputs:  # views, waits and copies between a fused collective and its matmul pass it on
            if fused:
                self.gathered[s] = max(fused, key=lambda f: f[1])
            made = [self.produced[t] for t in inputs if t in self.produced]
            if made:
                self.produced[s] = max(made, key=lambda m: m[0] + m[1])
        return end

    def start_of(self, kind: str, inputs: set[int], n: int, deps: float) -> tuple[float, float]:
        """(when a fused collective may start, the end bound of its matmul's last chunk) given its inputs."""
        made = [self.produced[s] for s in inputs if s in self.produced] if kind == "reduce_scatter" else []
        if not made:
            return deps, 0.0
        mm_start, mm_seconds = max(made, key=lambda m: m[0] + m[1])
        return mm_start + mm_seconds / n, mm_start + mm_seconds

    def gathered_by(self, outputs: set[int], start: float, end: float, n: int) -> None:
        for s in outputs:
            self.gathered[s] = (start, end, n)


def traced_time(step: Step, gpu: GPU, intra: Link, inter: Link, optimizer_on_gpu: bool = True,
                async_tp: bool = False) -> StepTime:
    """The step time of an engine-traced step (see the module docstring); ``async_tp``: the tensor-parallel
    group's all-gathers and reduce-scatters pipelined with their matmuls (:class:`MicroPipelinedTP`).

    Why this length: one pass places every op on its stream or link; the branches share its clocks."""
    fused = MicroPipelinedTP() if async_tp else None
    t_compute = 0.0  # when the compute stream is free
    busy = 0.0
    link_free: dict[str, float] = defaultdict(float)
    stream_free: dict[str, float] = defaultdict(float)  # side streams
    avail: dict[int, float] = {}  # storage -> when the op that last wrote it finishes (any stream)
    last_copy_out = 0.0
    by_phase: dict[str, float] = defaultdict(float)
    comm_s: dict[str, float] = defaultdict(float)
    comm_bytes: dict[str, float] = defaultdict(float)
    links: set[str] = set()
    end = 0.0
    host = 0.0  # when the host has issued the ops so far
    waited = 0.0  # compute-stream time spent waiting for collectives and their side streams
    works = node_works(step.cap.nodes)
    times = node_times_of(works, gpu)
    static: dict[int, tuple] = {}  # what an op's every run shares (its micro-steps repeat it): read once
    for i in step.cap.node_order("first"):  # every micro-step of an accumulation; the gradient sync once
        if i not in static:
            node = step.cap.nodes[i]
            static[i] = (node, node.meta.get("phase", "forward"), _sids_of((node.args, node.kwargs)),
                         set(node.meta.get("storage", ())), step.collectives.get(i), _op_name(node))
        node, phase, inputs, outputs, coll, name = static[i]
        waited_for = fused.waits_for(inputs) if fused is not None and coll is None else inputs
        deps = max((avail.get(s, 0.0) for s in waited_for), default=0.0)
        seconds, issue, sync = times[i]
        if phase == "optimizer" and not optimizer_on_gpu:
            seconds = issue = 0.0
        host += issue
        if sync:  # a device value read on the host: the host waits for the stream
            host = max(host, t_compute)
        stream = step.streams.get(i)
        if coll is not None:
            seconds, lk = collective_time(coll, intra, inter)
            stream = stream or coll.kind  # NCCL's own stream, one per kind of collective
            pipelined = fused is not None and coll.tp and coll.kind in ("all_gather", "reduce_scatter")
            ready, bound = fused.start_of(coll.kind, inputs, coll.group_size, deps) if pipelined else (deps, 0.0)
            start = max(link_free[lk.name], stream_free[stream], ready, host)
            finish = max(start + seconds, bound + seconds / coll.group_size)
            link_free[lk.name] = stream_free[stream] = finish
            if pipelined and coll.kind == "all_gather":
                fused.gathered_by(outputs, start, finish, coll.group_size)
            for s in outputs | (inputs if name.startswith("c10d.") else set()):  # c10d ops work in place
                avail[s] = finish
            key = coll.kind + (" (inter-node)" if coll.spans_nodes else "")
            comm_s[key] += seconds
            comm_bytes[key] += ring_bytes(coll.kind, coll.group_size, coll.nbytes)
            if seconds:
                links.add(f"{lk.name} ({bus_bandwidth(coll, intra, inter) / 1e9:g} GB/s bus)")
            end = max(end, finish)
            continue
        if stream is not None:  # on one of the engine's side streams
            after = last_copy_out if stream == "all_gather_copy_in" else 0.0
            finish = stream_free[stream] = max(stream_free[stream], deps, host, after) + seconds
            for s in outputs:
                avail[s] = finish
            end = max(end, finish)
            continue
        issued = max(t_compute, host)  # the stream is free and the host has issued the op
        start = max(issued, deps)
        op_end = start + seconds
        if fused is not None:
            cost = node.meta.get("cost")
            op_end = fused.compute(inputs, outputs, start, seconds, cost is not None and cost.kind == MATMUL)
            waited += op_end - start - seconds  # a fused matmul waiting for its all-gather or its last chunk
        waited += start - issued  # the stream waits for a collective (or a side stream's copy)
        t_compute = op_end
        busy += seconds
        by_phase[phase] += seconds
        for s in outputs:
            avail[s] = t_compute
        if name == _COPY_OUT:
            last_copy_out = t_compute
        end = max(end, t_compute)
    waited += max(0.0, end - max(t_compute, host))  # collectives still running after the last op
    end = max(end, host)
    band_log, band_note = node_band(step.cap.nodes, end, gpu, works=works, times=times)
    return StepTime(step_time_s=end, compute_s=busy, comm_s=sum(comm_s.values()), exposed_comm_s=waited,
                    by_phase_s=dict(by_phase), comm_by_kind_s=dict(comm_s), comm_bytes_per_gpu=dict(comm_bytes),
                    links=sorted(links), model=f"traced schedule, {_model_name(gpu)}", band_log=band_log,
                    band_note=band_note)


def _unit_of(module: str, units: Sequence[str]) -> str:
    """The unit (a wrap-class instance's path) ``module`` belongs to, "" for the rest of the model."""
    for u in units:
        if module == u or module.startswith(u + "."):
            return u
    return ""


def zero3_gathers(step: Step, times, units: Sequence[str], param_bytes: float, grad_bytes: float,
                  collective) -> tuple[float, float, float]:
    """ZeRO-3's per-unit collectives as they run (DeepSpeed's ``PartitionedParameterCoordinator``: each
    submodule's parameters all-gathered before its forward and again before its backward, the next unit's
    prefetched while one computes; its gradients reduce-scattered after its backward):

    * forward: the first unit's gather waits; each next gather hides behind the unit before it:
      exposed = ag(u_0) + sum_i max(0, ag(u_i) - forward(u_{i-1}));
    * backward, units in reverse: exposed = ag(u_last) + sum_i max(0, ag(u_{i-1}) + rs(u_i) - backward(u_i))
      + rs(u_0).

    Units are the wrap class's instances (the rest of the model, embeddings and head, one more unit), each
    collective its own ring with its own latency (``collective(kind, bytes)`` gives its seconds), its bytes
    the unit's share of the 16-bit parameters and gradients.  Under gradient accumulation every micro-step
    gathers and reduce-scatters again (stage 3's gradient hooks fire in every backward): each micro-step is
    costed against its share of the compute.  Returns (exposed seconds, all-gather seconds, reduce-scatter
    seconds) of the whole step."""
    cap = step.cap
    micro = max(1, cap.grad_accum)
    numel: dict[str, int] = defaultdict(int)
    for name, p in cap.params.items():
        numel[_unit_of(cap.param_owner.get(name, ""), units)] += p.numel()
    total = sum(numel.values()) or 1
    order: list[str] = []
    compute: dict[tuple[str, str], float] = defaultdict(float)
    for i in cap.node_order():
        node = cap.nodes[i]
        phase = "backward" if node.meta.get("phase") == "backward" else "forward"
        if node.meta.get("phase") not in ("forward", "loss", "backward"):
            continue
        u = _unit_of(node.meta.get("module") or "", units)
        if phase == "forward" and u not in order and numel.get(u):
            order.append(u)
        compute[(u, phase)] += times[i][0] / micro  # one micro-step's
    order = [u for u in order if numel.get(u)] or [""]
    ag = {u: collective("all_gather", param_bytes * numel[u] / total) for u in order}
    rs = {u: collective("reduce_scatter", grad_bytes * numel[u] / total) for u in order}
    exposed = ag[order[0]]
    for prev, u in zip(order, order[1:]):
        exposed += max(0.0, ag[u] - compute[(prev, "forward")])
    back = order[::-1]
    exposed += ag[back[0]]
    for u, nxt in zip(back, back[1:]):
        exposed += max(0.0, ag[nxt] + rs[u] - compute[(u, "backward")])
    exposed += rs[back[-1]]
    return micro * exposed, micro * 2 * sum(ag.values()), micro * sum(rs.values())


def zero_time(step: Step, gpu: GPU, stage: int, n: int, gpus_per_node: int, intra: Link, inter: Link,
              param_bytes: float, grad_bytes: float, optimizer_scale: float, units: Sequence[str] = ()) -> StepTime:
    """The step time of a ZeRO layout over the single-device step (see the module docstring).

    ``param_bytes``/``grad_bytes``: the full 16-bit (working dtype) parameters and gradients;
    ``optimizer_scale``: the optimizer's share of the traced optimizer work on this rank; ``units``: the
    wrap class's instances, ZeRO-3's gathering units (:func:`zero3_gathers`)."""
    by_phase: dict[str, float] = defaultdict(float)
    host_by_phase: dict[str, float] = defaultdict(float)
    works = node_works(step.cap.nodes)
    times = node_times_of(works, gpu)
    for i in step.cap.node_order():  # every micro-step of an accumulation
        node, (seconds, issue, _) = step.cap.nodes[i], times[i]
        phase = node.meta.get("phase", "forward")
        by_phase["forward" if phase == "loss" else phase] += seconds
        host_by_phase["forward" if phase == "loss" else phase] += issue
    for phase, issue in host_by_phase.items():  # a launch-bound pass takes its host time
        by_phase[phase] = max(by_phase[phase], issue)
    by_phase["optimizer"] *= optimizer_scale
    nodes = -(-n // gpus_per_node)
    rs_c = Collective("reduce_scatter", int(grad_bytes), n, nodes, min(n, gpus_per_node))
    ag_c = Collective("all_gather", int(param_bytes), n, nodes, min(n, gpus_per_node))
    (rs_s, lk), (ag_s, _) = collective_time(rs_c, intra, inter), collective_time(ag_c, intra, inter)
    # under gradient accumulation stage 2 reduce-scatters in every micro-step's backward (its gradient hooks:
    # DeepSpeed's partition_gradients), stage 1 once at the accumulation boundary (reduce_gradients)
    # (stage 3 gathers and reduce-scatters in every micro-step: zero3_gathers)
    reductions = max(1, step.cap.grad_accum) if stage in (2, 3) else 1
    rs_s *= reductions
    comm_bytes = {"reduce_scatter": reductions * ring_bytes("reduce_scatter", n, grad_bytes),
                  "all_gather": ring_bytes("all_gather", n, param_bytes) * (2 * reductions if stage == 3 else 1)}
    comm_s = {"reduce_scatter": rs_s, "all_gather": ag_s * (2 if stage == 3 else 1)}
    if stage == 3:
        def collective(kind: str, nbytes: float) -> float:
            return collective_time(Collective(kind, int(nbytes), n, nodes, min(n, gpus_per_node)), intra, inter)[0]

        exposed, ag_total, rs_total = zero3_gathers(step, times, units, param_bytes, grad_bytes, collective)
        comm_s = {"reduce_scatter": rs_total, "all_gather": ag_total}
    else:
        exposed = rs_s + ag_s
    compute = sum(by_phase.values())
    band_log, band_note = node_band(step.cap.nodes, compute + exposed, gpu, works=works, times=times)
    return StepTime(step_time_s=compute + exposed, compute_s=compute, comm_s=sum(comm_s.values()),
                    exposed_comm_s=exposed, by_phase_s=dict(by_phase), comm_by_kind_s=comm_s,
                    comm_bytes_per_gpu=comm_bytes,
                    links=[f"{lk.name} ({bus_bandwidth(rs_c, intra, inter) / 1e9:g} GB/s bus)"] if n > 1 else [],
                    model=(f"ZeRO-3 per-unit gathers, one unit prefetched, {_model_name(gpu)}" if stage == 3 else
                           f"ZeRO volumes (DeepSpeed's overlap defaults), {_model_name(gpu)}"), band_log=band_log,
                    band_note=band_note)


def matmul_flops(step: Step, phases: Sequence[str] = ("forward", "loss", "backward"),
                 per_step: bool = True) -> tuple[float, str]:
    """Matmul-class FLOPs of ``phases`` and the dtype most of them run in: one micro-batch's (the later micro-step
    of a gradient accumulation, traced once for micro-steps 2..N, not counted), times the step's ``grad_accum``
    micro-batches when ``per_step``."""
    by_dtype: dict[str, float] = defaultdict(float)
    for node in step.cap.nodes:
        cost = node.meta.get("cost")
        if cost is not None and cost.kind == MATMUL and node.meta.get("phase") in phases \
                and not node.meta.get("micro_step"):
            by_dtype[cost.dtype or "float32"] += cost.flops
    if not by_dtype:
        return 0.0, "float32"
    scale = max(1, step.cap.grad_accum) if per_step else 1
    return scale * sum(by_dtype.values()), max(by_dtype, key=by_dtype.get)

"""ZeRO stages 1-3, laid out by hand: PyTorch has no ZeRO engine to trace, so these layouts follow
one of two stated accountings over the single-device step (its parameters, gradients and
optimizer state as traced).

Notation: Psi = parameters (P_t of them trainable), N = data-parallel ranks, S = the optimizer's
state elements per trainable parameter (Adam: 2), all from the traced step.

**DeepSpeed** (the default; ``deepspeed/runtime/zero/stage_1_and_2.py`` and ``stage3.py``): a
``*-mixed`` precision is DeepSpeed's ``bf16``/``fp16`` mode: the model cast to the 16-bit dtype
(activations computed in it), fp32 master weights, fp32 optimizer state and an fp32 gradient
partition with the optimizer, and

* stage 1: 16-bit parameters 2 Psi, 16-bit gradients 2 P_t (not partitioned), and per rank
  (4 + 4 + 4 S) P_t / N: fp32 gradient partition, master weights, state (Adam: 4 Psi + 16 Psi/N);
* stage 2: ``estimate_zero2_model_states_mem_needs`` (``cpu_offload=False``):
  ``gpu_mem = 2 * total_params + int(18 * total_params / total_gpus)``, "2 = params_16bit,
  18 = 2_grads_16bit + 4_grads_32bit + 4_params_32bit + 8_optimizer_states_32bit";
* stage 3: ``estimate_zero3_model_states_mem_needs`` (``cpu_offload=False``):
  ``largest_layer_memory + int(18 * total_params / total_gpus)`` with
  ``largest_layer_memory = 4 * largest_layer_params`` (the largest module's own parameters,
  ``model_to_params``): 16-bit parameters partitioned, 16-bit gathering buffer for one layer;
* the gradient reduction bucket: ``reduce_bucket_size`` elements of the 16-bit dtype (its config
  default, 5e8, capped at the gradients' size: a bucket is never larger than what it holds);
* with ``offload`` (ZeRO-Offload / ZeRO-Infinity), the estimators' ``cpu_offload=True`` cases:
  stage 2 keeps the 16-bit parameters on the GPU (``gpu_mem = 2 * total_params``), stage 3 with
  ``params`` offloaded keeps only the largest layer's buffer.

**Paper** (Rajbhandari et al. 2020, §5.1, K = 12 for mixed-precision Adam): stage 1
4 Psi + K Psi / N, stage 2 2 Psi + (2 + K) Psi / N, stage 3 (16 Psi) / N, no fp32 gradient
partition, no bucket; stage 3 gathers one FSDP-style unit (the largest) at a time.

In both, the optimizer's scalar state (Adam's ``step``) is kept in the parameter group, as
DeepSpeed's optimizers do, and counts nothing.  The peak replays the single-device timeline with
each storage re-sized for the rank: parameters partitioned (stage 3), gradients freed once
reduced (stages 2-3: their bytes live in the bucket), the optimizer's temporaries sized for the
rank's fp32 partition, and the states above live for the whole step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layout import Layout, PlanPrecision
from .traced import Peak, Step

REDUCE_BUCKET_SIZE = 500_000_000  # DeepSpeed's reduce_bucket_size default (elements)


@dataclass(frozen=True)
class ZeroStates:
    """Per-rank model states of a ZeRO layout (bytes) and what lies in host memory."""

    parameters: float
    gradients: float  # 16-bit gradients (full or partition) + the fp32 gradient partition
    optimizer_state: float  # master weights + optimizer state
    bucket: float  # the gradient reduction bucket
    gather_buffer: float  # stage 3: parameters gathered for one layer (or unit)
    cpu: float  # offloaded to host memory
    semantics: str

    @property
    def model_states(self) -> float:
        return self.parameters + self.gradients + self.optimizer_state


def _counts(step: Step) -> tuple[int, int, int, int]:
    """(all parameter elements, trainable elements, optimizer state elements per trainable element
    x trainable elements, i.e. the state elements of non-scalar state tensors, largest layer)."""
    cap = step.cap
    total = sum(p.numel() for p in cap.params.values())
    trainable = sum(p.numel() for p in cap.params.values() if p.requires_grad)
    state = sum(t.numel() for st in cap.optimizer_state.values() for t in st.values() if t.ndim > 0)
    by_module: dict[str, int] = {}
    for name, p in cap.params.items():
        owner = cap.param_owner.get(name, "")
        by_module[owner] = by_module.get(owner, 0) + p.numel()
    return total, trainable, state, max(by_module.values(), default=0)


def zero_states(step: Step, layout: Layout, precision: PlanPrecision, semantics: str,
                largest_unit: int = 0) -> ZeroStates:
    """Model states of one rank of a ZeRO stage (see the module docstring); ``largest_unit``: the
    parameter elements of the largest wrap unit (the paper's stage-3 gathering)."""
    stage = int(layout.strategy[-1])
    n = layout.dp
    total, trainable, state, largest = _counts(step)
    mixed = precision.master
    work = (precision.low or precision.step.cast or torch.float32).itemsize if mixed else \
        (precision.step.cast or torch.float32).itemsize
    state_item = 4 if mixed else work
    deepspeed = semantics == "deepspeed"
    params = work * total / (n if stage == 3 else 1)
    grads16 = work * trainable / (1 if stage == 1 else n)
    if stage == 3 and deepspeed and mixed:
        grads16 = 0.0  # stage 3 reduces straight into the fp32 partition (the 18 of stage3.py)
    grads32 = 4 * trainable / n if (deepspeed and mixed) else 0.0
    master = 4 * trainable / n if mixed else 0.0
    optimizer = state_item * state / n
    bucket = 0.0
    gather = 0.0
    if deepspeed:
        if stage in (1, 2):
            bucket = work * min(REDUCE_BUCKET_SIZE, trainable)
        else:
            gather = 4 * largest  # largest_layer_memory
    elif stage == 3:
        gather = work * largest_unit
    cpu = 0.0
    if layout.offload is not None:
        cpu = grads16 * (stage > 1) + grads32 + master + optimizer
        grads16 = grads16 if stage == 1 else 0.0
        grads32 = master = optimizer = 0.0
        if layout.offload == "params":
            cpu += params
            params = 0.0
    return ZeroStates(params, grads16 + grads32, master + optimizer, bucket, gather, cpu, semantics)


def zero_peak(step: Step, layout: Layout, precision: PlanPrecision, semantics: str, device: str,
              largest_unit: int = 0, sizes: list[float] | None = None) -> tuple[Peak, ZeroStates]:
    """The rank's peak: the single-device timeline re-sized for the layout (see the module docstring);
    ``sizes``: the single-device storage sizes to start from (default: the traced ones)."""
    cap = step.cap
    st = zero_states(step, layout, precision, semantics, largest_unit)
    stage = int(layout.strategy[-1])
    n = layout.dp
    sizes = [float(b) for b in (cap.storage_bytes if sizes is None else sizes)]
    for sid in cap.sids.get("parameter", ()):
        sizes[sid] = 0.0 if layout.offload == "params" else sizes[sid] / (n if stage == 3 else 1)
    traced_grads = float(sum(cap.storage_bytes[s] for s in cap.sids.get("gradient", ())))
    for sid in cap.sids.get("gradient", ()):
        if stage == 2:  # reduced through the bucket into this rank's 16-bit partition, from backward to zero_grad
            sizes[sid] = sizes[sid] / n
        elif stage == 3:
            sizes[sid] = 0.0  # reduced into the bucket and freed as soon as autograd makes them
    state = set(cap.sids.get("optimizer_state", ()))
    for sid in state:
        sizes[sid] = 0.0  # counted in the states below
    # The optimizer's temporaries: the step runs on this rank's partition, in fp32 for a mixed policy
    # (on the host when offloaded).
    for index, sid, delta in cap.events:
        if delta > 0 and index >= 0 and sid not in state and cap.nodes[index].meta.get("phase") == "optimizer":
            dtype = cap.storage_dtype[sid]
            widen = 4 / dtype.itemsize if precision.master and dtype.is_floating_point else 1.0
            sizes[sid] = 0.0 if layout.offload is not None else sizes[sid] * widen / n
    # Live for the whole step: the gradient partitions (stage 1: the traced full gradients are already
    # in the timeline, stage 2 their 16-bit partitions; the fp32 partition is added), master weights and
    # state, bucket, gathering buffer.
    in_timeline = {1: traced_grads, 2: traced_grads / n}.get(stage, 0.0)
    grads = st.gradients - in_timeline
    extra = {"gradients": max(0.0, grads), "optimizer_state": st.optimizer_state, "comm_buffers": st.bucket,
             "gathered_parameters": st.gather_buffer}
    return step.peak(device, sizes, extra=extra), st

"""A report in words: its title, where a point of the step is ("backward pass, layers.3.mlp
(LlamaMLP: mm)"), the inputs ("batch 8, sequence 1024"), and the headline every text, markdown
and HTML report starts with (:func:`headline`): the memory the device needs (peak + reserve)
and, for a GPU, whether it fits and the largest micro-batch.
"""

from __future__ import annotations

import re
from typing import Any

from ..capture import INPUT_MODULE, LOSS_MODULE, OPTIMIZER_MODULE
from ..results import ReportData
from .units import OPTIMIZER_NAMES, PHASE_NAMES, fmt_bytes, fmt_gb


def training(report: ReportData) -> bool:
    return report.mode != "inference"


def title(report: ReportData) -> str:
    what = "Training-step estimate" if training(report) else "Inference estimate (forward pass, no gradients)"
    return f"{what}{f' of {report.model_name}' if report.model_name else ''}"


def op_words(op: str) -> str:
    """'aten._foreach_sqrt.default' -> 'foreach sqrt'; 'aten.convolution_backward.default' -> 'convolution backward'."""
    name = op.removeprefix("aten.")
    name = re.sub(r"\.(default|Tensor|Scalar|int|dim_IntList|[A-Za-z_]+)$", "", name) if name.count(".") else name
    return name.strip("_").replace("_", " ")


def optimizer_words(report: ReportData) -> str:
    name = report.capture.optimizer_name or ""
    return OPTIMIZER_NAMES.get(name.lower(), name)


def place(report: ReportData, snapshot: Any) -> str:
    """Where a point of the timeline is, in words: 'optimizer step (AdamW foreach sqrt)',
    'backward pass, layers.3.mlp (LlamaMLP: mm)', 'loss (cross entropy: log softmax)'."""
    phase = str(snapshot.phase)
    op = op_words(snapshot.op) if snapshot.op else ""
    if phase == "optimizer":
        return f"optimizer step ({' '.join(w for w in (optimizer_words(report), op) if w)})"
    if phase == "start":
        return PHASE_NAMES["start"]
    module = snapshot.module
    words = PHASE_NAMES.get(phase, phase)
    if phase == "loss" or module in (LOSS_MODULE, OPTIMIZER_MODULE, INPUT_MODULE):
        return f"{words} ({op})" if op else words
    kind = report.capture.module_types.get(module, "")
    if not module:  # code of the root module's own forward, outside its submodules
        return f"{words}, root module {kind}" + (f" ({op})" if op else "")
    detail = ": ".join(w for w in (kind, op) if w)
    return f"{words}, {module}" + (f" ({detail})" if detail else "")


def inputs_words(report: ReportData) -> str:
    """'batch 8, sequence 1024' or 'batch 32, images 224x224', from the traced inputs."""
    batch = seq = image = None
    for t in report.capture.inputs:
        shape = tuple(t.shape)
        if not shape:
            continue
        if batch is None:
            batch = shape[0]
        if not t.is_floating_point() and len(shape) == 2 and seq is None:
            seq = shape[1]
        if t.is_floating_point() and len(shape) == 4 and image is None:
            image = f"{shape[2]}x{shape[3]}"
    parts = []
    if batch is not None:
        parts.append(f"batch {batch}")
    if seq is not None:
        parts.append(f"sequence {seq}")
    if image is not None:
        parts.append(f"images {image}")
    return ", ".join(parts)


# -- the headline -----------------------------------------------------------


def loop_words(cap: Any) -> str:
    """The training loop estimated, in words: 'output dropped once the loss is computed (loss = model(x).loss;
    --keep-output holds it through backward)', and the micro-batches of a gradient accumulation."""
    text = ("output held through backward and the optimizer step (out = model(x); --keep-output)" if cap.keep_output
            else "output dropped once the loss is computed (loss = model(x).loss; --keep-output holds it)")
    if cap.grad_accum > 1:
        text += f"; {cap.grad_accum} micro-batches per optimizer step, gradients accumulated (--grad-accum)"
    return text


def headline(report: ReportData) -> str:
    """The first line of every report: memory needed and, with a GPU, fits or not and the largest micro-batch.

    'Needs 18.42 GiB on the GPU (peak 16.20 GiB + 2.22 GiB CUDA reserve): fits on H100-SXM (80 GB =
    74.51 GiB, 56.09 GiB to spare); largest micro-batch 12'."""
    needed = report.needed
    if needed is None:
        return "No memory estimate"
    m = report.memory
    what = "A training step" if training(report) else "Inference"
    reserve = sum(m.reserve.values())
    if report.device != "cuda":
        return f"{what} needs {fmt_bytes(needed)} of memory (peak of live tensors on the CPU target)"
    parts = f"peak {fmt_bytes(max(m.peak, m.peak_first_step))} + {fmt_bytes(reserve)} CUDA reserve"
    text = f"{what} needs {fmt_bytes(needed)} on the GPU ({parts})"
    gpu = report.gpu
    if gpu is None:
        return text + "; add --gpu NAME to check a GPU"
    usable = gpu.capacity
    capacity = (f"{fmt_gb(gpu.memory)}, {fmt_bytes(usable)} usable" if usable != gpu.memory
                else f"{fmt_gb(gpu.memory)} = {fmt_bytes(usable)}")
    if report.fits:
        text += f": fits on {gpu.name} ({capacity}, {fmt_bytes(usable - needed)} to spare)"
    else:
        text += f": DOES NOT FIT on {gpu.name} ({capacity}, {fmt_bytes(needed - usable)} short)"
    if report.max_batch is not None:
        text += ("; no micro-batch fits on one GPU (estimator plan shards it over several)" if report.max_batch == 0
                 else f"; largest micro-batch {report.max_batch}")
        if report.max_batch and report.max_batch_margin is not None:
            text += f" ({fmt_bytes(report.max_batch_margin)} to spare at that size)"
    elif report.max_batch_note and training(report):
        text += f"; largest micro-batch {report.max_batch_note}"  # "not searched: ..." or "over ..."
    return text

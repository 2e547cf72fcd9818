"""A report in words: its title, where a point of the step is ("backward pass, layers.3.mlp
(LlamaMLP: mm)"), the inputs ("batch 8, sequence 1024"), and the headline every text, markdown
and HTML report starts with (:func:`headline`): the memory the device needs (peak + reserve)
and, for a GPU, whether it fits and the largest micro-batch.
"""

from __future__ import annotations

import re
from typing import Any

from ..capture import GENERATE_MODULE, INPUT_MODULE, LOSS_MODULE, OPTIMIZER_MODULE
from ..results import ReportData
from .units import OPTIMIZER_NAMES, PHASE_NAMES, fmt_bytes, fmt_gb


def training(report: ReportData) -> bool:
    return report.mode == "train"


def title(report: ReportData) -> str:
    what = {"train": "Training-step estimate", "inference": "Inference estimate (forward pass, no gradients)",
            "generate": "Generation estimate (transformers generate(): the prefill and the last decode step)"}.get(
        report.mode, report.mode)
    if report.quantize:
        what += f" with {report.quantize} weights"
    return f"{what}{f' of {report.model_name}' if report.model_name else ''}"


def generation_words(report: ReportData) -> str:
    """'Generating 128 tokens after a 512-token prompt (batch 4, DynamicCache grown token by token)'."""
    g = report.generation
    how = "grown token by token" if g.cache == "dynamic" else f"allocated for {g.cache_len:,} tokens"
    if g.states_only:
        how = "of fixed-size recurrent states"
    cache = f"{g.cache_class} {how}" if g.cache != "none" else NO_CACHE
    return (f"Generating {g.new_tokens:,} token{'s' if g.new_tokens != 1 else ''} after a {g.prompt_len:,}-token "
            f"prompt (batch {g.batch}, {cache})")


NO_CACHE = "no cache: the model's generation config has use_cache=False, so each step runs the whole sequence so far"


STAGE_WORDS = {"prefill": "prefill", "decode": "last decode step"}


def stage_peak(report: ReportData, stage: Any) -> int:
    """A generation step's peak, with the quantized weights when the estimate is sized with them."""
    from ..quantize import TRACED_4BIT, quantized_peak

    if not report.quantize or report.quantize in TRACED_4BIT:  # (4-bit weights: traced with them)
        return stage.peak
    return quantized_peak(stage.capture, report.device, stage.peak, report.quantize)


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
    if module == GENERATE_MODULE:  # generate()'s own ops: the inputs prepared, the token chosen
        return f"generate() loop, outside the model ({op})" if op else "generate() loop, outside the model"
    if phase == "loss" or module in (LOSS_MODULE, OPTIMIZER_MODULE, INPUT_MODULE):
        return f"{words} ({op})" if op else words
    kind = report.capture.module_types.get(module, "")
    if not module:  # code of the root module's own forward, outside its submodules
        return f"{words}, root module {kind}" + (f" ({op})" if op else "")
    detail = ": ".join(w for w in (kind, op) if w)
    return f"{words}, {module}" + (f" ({detail})" if detail else "")


def inputs_words(report: ReportData) -> str:
    """'batch 8, sequence 1024' or 'batch 32, images 224x224', from the traced inputs: the sequence is the
    longest integer batch x length input (token ids, not a vision-language model's aspect-ratio ids or lengths),
    an image the last two sizes of the first float input of 4 or more dimensions (tiles and clips included)."""
    samples = getattr(report.capture, "samples", None)  # (a list of C x H x W images: one per sample)
    batch = seq = image = None
    for t in report.capture.inputs:
        shape = tuple(t.shape)
        if not shape:
            continue
        if batch is None:
            batch = samples or shape[0]
            if samples:
                image = f"{shape[-2]}x{shape[-1]}"
        if not t.is_floating_point() and len(shape) == 2 and (seq is None or shape[1] > seq):
            seq = shape[1]
        if t.is_floating_point() and len(shape) >= 4 and image is None:
            image = f"{shape[-2]}x{shape[-1]}"
    parts = []
    if batch is not None:
        parts.append(f"batch {batch}")
    if seq is not None:
        parts.append(f"sequence {seq}")
    if image is not None:
        parts.append(f"images {image}")
    return ", ".join(parts)


# -- the headline -----------------------------------------------------------


def gpu_limit(report: ReportData) -> tuple[int, str] | None:
    """(bytes, words) of the GPU's room for the peak: its capacity less the CUDA reserve (what the headline
    compares: the step fits when its peak stays under it), for the charts; None without a GPU."""
    if report.gpu is None or report.memory is None or report.device != "cuda":
        return None
    reserve = sum(report.memory.reserve.values())
    room = report.gpu.capacity - reserve
    return room, (f"{report.gpu.name}: {fmt_bytes(room)} for the peak ({fmt_bytes(report.gpu.capacity)} less "
                  f"{fmt_bytes(reserve)} CUDA reserve)")


def loop_words(cap: Any) -> str:
    """The training loop estimated, in words: 'output dropped once the loss is computed (loss = model(x).loss;
    --keep-output holds it through backward)', and the micro-batches of a gradient accumulation."""
    text = ("output held through backward and the optimizer step (out = model(x); --keep-output)" if cap.keep_output
            else "output dropped once the loss is computed (loss = model(x).loss; --keep-output holds it)")
    if cap.grad_accum > 1:
        text += f"; {cap.grad_accum} micro-batches per optimizer step, gradients accumulated (--grad-accum)"
    if getattr(cap, "clip_grad_norm", None):
        text += f"; gradients' norm clipped to {cap.clip_grad_norm:g} before the step (--clip-grad-norm)"
    if getattr(cap, "zero_grad", "after_step") == "in_place":
        text += ("; optimizer.zero_grad(set_to_none=False) after the step: the gradients kept allocated, zeroed in "
                 "place, each backward adding into them (--zero-grad in-place)")
    elif getattr(cap, "zero_grad", "after_step") == "before_backward":
        text += ("; optimizer.zero_grad() after the loss, before backward (Lightning's automatic optimization): the "
                 "previous step's gradients held through the forward (--zero-grad before-backward)")
    else:
        text += "; optimizer.zero_grad() after the step (--zero-grad before-backward: after the loss, as Lightning)"
    return text


def headline(report: ReportData) -> str:
    """The first line of every report: memory needed and, with a GPU, fits or not and the largest micro-batch.

    'Needs 18.42 GiB on the GPU (peak 16.20 GiB + 2.22 GiB CUDA reserve): fits on H100-SXM (80 GB =
    74.51 GiB, 56.09 GiB to spare); largest micro-batch 12'.  An estimate sized with quantized weights
    (``--quantize``) answers with them; a generation says which step bounds it and the KV cache."""
    needed = report.needed
    if needed is None:
        return "No memory estimate"
    m = report.memory
    what = {"train": "A training step", "inference": "Inference"}.get(report.mode) or generation_words(report)
    if report.quantize:
        what += f" with {report.quantize} weights ({'LLM.int8' if report.quantize == 'int8' else 'NF4'}, bitsandbytes)"
    peak = report.quantized_peak if report.quantize else max(m.peak, m.peak_first_step)
    if report.device != "cuda":
        text = f"{what} needs {fmt_bytes(needed)} of memory (peak of live tensors on the CPU target)"
    else:
        text = (f"{what} needs {fmt_bytes(needed)} on the GPU (peak {fmt_bytes(peak)} + {fmt_bytes(needed - peak)} "
                f"CUDA reserve)")
    gpu = report.gpu
    if gpu is None:
        return text + _generation_tail(report) + ("; add --gpu NAME to check a GPU" if report.device == "cuda" else "")
    usable = gpu.capacity
    capacity = (f"{fmt_gb(gpu.memory)}, {fmt_bytes(usable)} usable" if usable != gpu.memory
                else f"{fmt_gb(gpu.memory)} = {fmt_bytes(usable)}")
    if report.fits:
        text += f": fits on {gpu.name} ({capacity}, {fmt_bytes(usable - needed)} to spare)"
    else:
        text += f": DOES NOT FIT on {gpu.name} ({capacity}, {fmt_bytes(needed - usable)} short)"
        text += _quantized_fit(report)
    text += _generation_tail(report)
    if report.max_batch is not None:
        text += ((f"; no micro-batch fits on one GPU: {report.max_batch_note}" if report.max_batch_note else
                  "; no micro-batch fits on one GPU (estimator plan shards it over several)") if report.max_batch == 0
                 else f"; largest micro-batch {report.max_batch}")
        if report.max_batch and report.max_batch_margin is not None:
            text += f" ({fmt_bytes(report.max_batch_margin)} to spare at that size)"
    elif report.max_batch_note and training(report):
        text += f"; largest micro-batch {report.max_batch_note}"  # "not searched: ..." or "over ..."
    return text


def _quantized_fit(report: ReportData) -> str:
    """'; fits with int8 weights (needs 14.20 GiB: --quantize int8)': the first weight-only quantization that
    would fit an inference or generation that does not (int8 before int4: the smaller change)."""
    if report.quantize or report.mode == "train" or report.gpu is None or report.device != "cuda":
        return ""
    from ..memory import needed_for_peak
    from ..quantize import QUANT_SCHEMES, quantized_peak

    m = report.memory
    for scheme in QUANT_SCHEMES if report.quantized else ():
        # what --quantize SCHEME would answer (ReportData.needed with quantize set)
        needs = needed_for_peak(quantized_peak(report.capture, "cuda", max(m.peak, m.peak_first_step), scheme))
        if needs <= report.gpu.capacity:
            return f"; fits with {scheme} weights (needs {fmt_bytes(needs)}: --quantize {scheme})"
    return ""


def _generation_tail(report: ReportData) -> str:
    """'; the peak is in the last decode step (prefill 1.2 GiB, decode 1.5 GiB); KV cache 256 MiB at 639 tokens'."""
    g = report.generation
    if g is None:
        return ""
    what = "recurrent-state cache" if g.states_only else "KV cache"
    cache = "no cache (use_cache=False)" if g.cache == "none" else \
        f"{what} {fmt_bytes(g.kv_cache_bytes)} at {g.cache_len:,} tokens"
    if "decode" not in g.stages:
        return f"; one new token: the prefill alone (no decode step); {cache}"
    pre, dec = (stage_peak(report, g.stages[s]) for s in ("prefill", "decode"))
    return f"; the peak is in the {STAGE_WORDS[g.binding]} (prefill {fmt_bytes(pre)}, decode {fmt_bytes(dec)}); {cache}"

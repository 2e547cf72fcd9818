"""The one-call API, :func:`estimate`: capture a training step, apply the rules, tally, simulate memory, report."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from .capture import Progress, StepOptions, capture, check_zero_grad
from .capture.checkpoint import parse_policy, policy_name, resolve_classes
from .caller import apart_from_caller_during
from .collect import young_only_during
from .errors import DataDependentError, UserError
from .hardware import GPU, lookup
from .memory import simulate
from .lora import finetuned
from .loop import check_loop, check_policy
from .plan.search import check_not_empty
from .ema import check_ema
from .optim import check_clip
from .precision import as_given, parse_precision
from .report import CheckpointWhatIf, Report
from .target import CudaTarget, parse_release
from .tally import tally


def _analyse(cap, options: StepOptions, device: str, progress: Progress):
    """Tallies and memory profile of a capture, with the fp8 what-if applied when asked."""
    progress("counting FLOPs and bytes")
    t = tally(cap, train=options.train)
    resize = None
    if options.precision.fp8_linear:
        from .precision import fp8_what_if

        what_if = fp8_what_if(cap, cap.module_types, t.flops_by_dtype)
        resize = what_if["resize"]
        t.flops_by_dtype = what_if["flops_by_dtype"]
        per = t.memory_by_dtype["saved"]
        for sid in cap.saved:
            if sid in resize:
                t.activations_bytes -= cap.storage_bytes[sid] - resize[sid]
                per[str(cap.storage_dtype[sid]).removeprefix("torch.")] -= cap.storage_bytes[sid]
                per["float8_e4m3fn"] = per.get("float8_e4m3fn", 0) + resize[sid]
    progress("simulating memory")
    return t, simulate(cap, device, resize, target=options.cuda)


def _checkpoint_what_if(model, inputs, options: StepOptions, classes: tuple[type, ...], policy: Any, trace: str,
                        device: str, t: Any, profile: Any, progress: Progress) -> CheckpointWhatIf:
    """The same step with every instance of ``classes`` under activation checkpointing, beside the step's own
    tallies ``t`` and memory ``profile``."""
    from dataclasses import replace

    def what_if(stage: str, detail: str = "") -> None:
        progress(f"{stage} (checkpoint what-if)", detail)

    cap_ckpt = capture(model, inputs, replace(options, checkpoint=classes, checkpoint_policy=policy), mode=trace,
                       progress=what_if)
    names = {c.__name__ for c in classes}
    paths = [p for p, cls in cap_ckpt.module_types.items() if cls in names and p]
    if paths and not any(p in cap_ckpt.module_outputs for p in paths):  # (outputs: of the modules called)
        raise UserError(f"checkpoint {', '.join(sorted(names))}: no instance of it runs a forward of its own (its "
                        f"parent calls what is inside it), so checkpointing it changes nothing; name a class whose "
                        f"forward runs (checkpointing wraps a module's forward call)")
    t_ckpt, prof_ckpt = _analyse(cap_ckpt, options, device, what_if)
    return CheckpointWhatIf(
        classes=list(dict.fromkeys(c.__name__ for c in classes)),  # (two classes of one name: once)
        policy=policy_name(policy),
        peak=prof_ckpt.peak,
        peak_saved=profile.peak - prof_ckpt.peak,
        flops_backward=t_ckpt.flops["backward"],
        flops_added=t_ckpt.flops["backward"] - t.flops["backward"],
        matmul_backward=t_ckpt.flops["matmul_backward"],
        # the bytes after each op, and at the peak (reached inside an op) the peak itself
        timeline=[(str(p.phase), prof_ckpt.peak if p.index == prof_ckpt.peak_at.index else p.total)
                  for p in prof_ckpt.timeline],
    )


def _float8(model: torch.nn.Module, float8: Any, mode: str, gpu: GPU | None) -> tuple[torch.nn.Module, list[str]]:
    """The model as ``float8`` training runs it (torchao's Float8Linear: :mod:`estimator.float8`) and its notes."""
    from .float8 import check_float8_gpu, check_recipe, converted

    recipe = check_recipe(float8)
    check_float8_gpu(recipe, gpu)
    if recipe is None:
        return model, []
    if mode != "train":
        raise UserError(f"float8 is float8 training (torchao's Float8Linear); drop it for mode={mode!r}")
    return converted(model, recipe)


@young_only_during
@apart_from_caller_during
def estimate(
    model: torch.nn.Module,
    inputs: Any,
    *,
    optimizer: Any = "adamw",
    optimizer_kwargs: Mapping[str, Any] | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    device: str = "cuda",
    gpu: str | GPU | None = None,
    precision: str = "fp32",
    mode: str = "train",
    checkpoint: Any = None,
    checkpoint_policy: Any = "full",
    keep_output: bool = False,
    grad_accum: int = 1,
    depth: int = 2,
    trace: str = "auto",
    model_name: str | None = None,
    progress: Progress | None = None,
    cuda_torch: str | None = None,
    solve_batch: bool = True,
    replicate: bool = True,
    prompt_len: int | None = None,
    new_tokens: int | None = None,
    kv_cache: str = "dynamic",
    quantize: str | None = None,
    compile: Any = None,
    float8: Any = None,
    lora: Any = None,
    clip_grad_norm: float | None = None,
    ema: float | None = None,
    zero_grad: str = "after_step",
) -> Report:
    """Estimate one training step (forward, loss, backward, optimizer step) of ``model``.

    Args:
        model: any ``nn.Module``; its weights may be real, on the ``meta`` device or fake.
            It is never modified (train/eval mode is restored, parameters are not touched).
        inputs: a tensor, a tuple of positional arguments or a dict of keyword arguments
            (nested lists/dicts of tensors allowed); real, ``meta`` or fake tensors.
        optimizer: a name (``"adamw"``, ``"sgd:momentum=0.9"``, ``"adam:amsgrad=true"``,
            ``"none"``), a ``torch.optim.Optimizer`` class, or an instance over ``model``'s parameters.
        optimizer_kwargs: extra keyword arguments for the optimizer.
        loss_fn: ``loss_fn(output) -> scalar``; default: the output if it is a scalar,
            else ``output.loss``, else the sum of the means of the floating-point outputs.
        device: the target device (``"cuda"`` or ``"cpu"``): the kernels that differ by device
            (SDPA backend, see :mod:`estimator.target`), the optimizer implementation PyTorch
            defaults to there (foreach on CUDA) and the allocator's rounding.
        gpu: the GPU to size the step for (a name from ``estimator hardware``, e.g. ``"H100"``, or a
            :class:`~estimator.hardware.GPU`): the report compares the memory the step needs with
            its capacity.  Implies the ``"cuda"`` target.
        precision: ``fp32``, ``bf16``, ``fp16``, ``bf16-mixed`` or ``fp16-mixed`` (see
            :mod:`estimator.precision`).
        mode: ``"train"`` (one training step), ``"inference"`` (forward under ``no_grad``; ``inputs`` without
            labels, or the model computes its loss) or ``"generate"`` (transformers' ``generate()``: the
            prefill and the last decode step with the KV cache, see :mod:`estimator.generation`; ``inputs``:
            the prompt's ``input_ids``).
        checkpoint: module classes (or class names) to run under activation checkpointing,
            as a what-if: the report shows the memory saved and the FLOPs added.
        checkpoint_policy: which instances and ops the what-if recomputes: ``"full"`` (every instance,
            everything), ``"layer:N"`` (every N-th instance), ``"op"`` (torchtitan's per-op selective
            policy), or your own ``context_fn`` (see :mod:`estimator.capture.checkpoint`).
        keep_output: the training loop holds the model's output through backward and the optimizer step
            (``out = model(x); loss = out.loss; loss.backward(); opt.step()``); by default it is dropped
            once the loss is computed (``loss = model(x).loss``, as HF Trainer, Lightning and torchtitan do).
        grad_accum: micro-batches per optimizer step (gradient accumulation: ``inputs`` is one micro-batch,
            its loss divided by ``grad_accum``, gradients accumulating across micro-steps).
        clip_grad_norm: the loop clips the gradients' norm before the optimizer step
            (``torch.nn.utils.clip_grad_norm_(params, clip_grad_norm)``: HF Trainer's ``max_grad_norm``,
            torchtitan's ``max_norm``); None (the default): no clipping.
        zero_grad: where the loop calls ``optimizer.zero_grad(set_to_none=True)``: ``"after_step"`` (the default:
            after ``opt.step()``, or at the top of the loop before the forward) or ``"before_backward"`` (after the
            loss, before ``loss.backward()``: Lightning's automatic optimization), whose previous step's
            gradients live through the forward, or ``"in_place"`` (``set_to_none=False``: the gradients kept
            allocated, zeroed; see :data:`estimator.capture.ZERO_GRAD`).
        ema: the loop keeps a moving average of the weights with this decay (``AveragedModel`` with
            ``get_ema_multi_avg_fn``, updated after each step; :mod:`estimator.ema`); None (the default): none.
        depth: module depth of the per-module table.
        trace: ``"auto"``, ``"fake"`` or ``"real"`` (see :func:`estimator.capture.capture`).
        cuda_torch: the torch release that will run the step on the GPU (e.g. ``"2.11"``), when it is
            not the one installed here: kernel choices (attention backends) depend on it.
        solve_batch: with ``gpu``, also find the largest micro-batch that fits on it (the report's
            ``max_batch``: a few more traces, see :mod:`estimator.plan`); False skips that search.
        replicate: a stack of identical blocks (a transformer's layers) is traced for five of its blocks and
            the rest replicated (:mod:`estimator.capture.replicate`): the same capture, faster; False traces
            every block.
        progress: ``progress(stage, detail="")``, called as the estimate advances (the module being
            traced in forward, then each phase, counting, memory); the command line draws it.
        prompt_len: ``mode="generate"``: the prompt's length (default: the length of ``inputs``' ids).
        new_tokens: ``mode="generate"``: the tokens generated after the prompt.
        kv_cache: ``mode="generate"``: ``"dynamic"`` (transformers' DynamicCache, generate()'s default) or
            ``"static"`` (StaticCache, ``cache_implementation="static"``).
        quantize: ``"int8"`` or ``"int4"`` (inference and generation): the weights of the Linear layers as
            bitsandbytes quantizes them (see :mod:`estimator.quantize`); the headline, ``needed`` and the
            fit are sized with them.
        compile: the step as ``torch.compile`` (Inductor, default mode) runs it: ``"block"`` (or True: each block
            of the model's stack of identical blocks compiled, as torchtitan applies it) or ``"model"`` (the
            model's forward compiled whole); what forward saves is AOTAutograd's min-cut partition, the fusion
            Inductor's approximated (see :mod:`estimator.capture.compiled`).  The report gives the eager step
            beside it.
        float8: ``"tensorwise"`` or ``"rowwise"``: float8 training as torchao's ``convert_to_float8_training``
            runs it on the Linear layers torchtitan converts (see :mod:`estimator.float8`; needs torchao).
    """
    if device not in ("cuda", "cpu"):
        raise UserError(f"device must be 'cuda' or 'cpu', not {device!r}")
    target_gpu = None
    if gpu is not None:
        if device != "cuda":
            raise UserError(f"gpu={gpu!r} sizes the step for a CUDA GPU: use device='cuda' (the default)")
        target_gpu = gpu if isinstance(gpu, GPU) else lookup(gpu)
    _check_mode(mode, grad_accum, quantize, prompt_len, new_tokens, lora, depth=depth, trace=trace,
                optimizer_kwargs=optimizer_kwargs, kv_cache=kv_cache)
    check_loop(mode, optimizer, optimizer_kwargs, keep_output, ema, clip_grad_norm)
    check_policy(checkpoint, checkpoint_policy)
    check_not_empty(inputs)
    from .capture.compiled import compiled_model

    model, compiled, compiled_notes = compiled_model(model, compile, mode)
    model, finetune_notes, quantize = finetuned(model, lora, quantize, parse_precision(precision), mode, device,
                                                optimizer)
    policy = parse_policy(checkpoint_policy)
    if compiled is not None and mode == "generate":
        raise UserError("compile sizes training and inference steps; drop it for mode='generate'")
    model, float8_notes = _float8(model, float8, mode, target_gpu)
    step_precision, kept_notes = as_given(model, parse_precision(precision))
    options = StepOptions(
        loss_fn=loss_fn,
        optimizer=optimizer if mode == "train" else None,
        optimizer_kwargs=optimizer_kwargs,
        foreach=True if device == "cuda" else None,
        precision=step_precision,
        train=mode == "train",
        keep_output=bool(keep_output),
        grad_accum=grad_accum,
        clip_grad_norm=check_clip(clip_grad_norm, mode), ema=check_ema(ema, mode),
        zero_grad=check_zero_grad(zero_grad, mode), replicate=replicate,
        compile=compiled,
        target=device,
        cuda=CudaTarget.for_gpu(target_gpu, parse_release(cuda_torch)) if device == "cuda" else None,
    )
    classes = _checkpoint_classes(model, checkpoint, compiled, mode)
    progress = progress or (lambda stage, detail="": None)
    generation = None
    if mode == "generate":
        from .generation import trace_generation

        cap, t, profile, generation = trace_generation(
            model, inputs, options, prompt_len=prompt_len, new_tokens=new_tokens, kv_cache=kv_cache, device=device,
            trace=trace, progress=progress, gpu=target_gpu)
    else:
        cap = capture(model, inputs, options, mode=trace, progress=progress)
        cap.assumptions[:0] = compiled_notes + finetune_notes + float8_notes + kept_notes
        t, profile = _analyse(cap, options, device, progress)
    report = Report(cap, t, model_name=model_name or type(model).__name__, depth=depth, memory=profile,
                    device=device, precision=options.precision.name, mode=mode, gpu=target_gpu,
                    generation=generation, quantize=quantize,
                    cuda_torch=options.cuda.torch if options.cuda is not None else None)
    if classes:
        report.checkpoint = _checkpoint_what_if(model, inputs, options, classes, policy, trace, device, t, profile,
                                                progress)
    if target_gpu is not None and device == "cuda":
        from .timing import step_time

        progress("timing the step")
        report.step_time = step_time(report, target_gpu)
        by_dtype = report.tally.flops_by_dtype
        lacking = target_gpu.lacks("fp8" if options.precision.fp8_linear else max(by_dtype, key=by_dtype.get)) \
            if by_dtype else None
        if lacking:
            report.capture.assumptions.append(lacking)
    if compiled is not None:
        report.compiled = _eager_beside(model, inputs, options, trace, device, target_gpu, report, progress)
    if target_gpu is not None and solve_batch:
        _search_batch(report, model, inputs, options, target_gpu, progress, optimizer=optimizer,
                      optimizer_kwargs=optimizer_kwargs, loss_fn=loss_fn, trace=trace, grad_accum=grad_accum,
                      replicate=replicate, compile=compiled, checkpoint=(classes, policy) if classes else None)
    return report


def _search_batch(report: Report, model, inputs, options: StepOptions, gpu: GPU, progress: Progress,
                  checkpoint: tuple | None = None, **kwargs: Any) -> None:
    """The report's largest micro-batch on ``gpu`` (:func:`_largest_batch`), or why it was not searched; with
    ``checkpoint`` (the what-if's classes and policy), the what-if's own."""
    if report.mode != "train":
        report.max_batch_note = "not searched: the largest batch is planned for training steps only"
    elif options.precision.fp8_linear:
        report.max_batch_note = ("not searched: --precision fp8 is a what-if over the bf16-mixed step; --float8 "
                                 "tensorwise traces torchao's float8 training, and searches")
    elif any(isinstance(m, torch.nn.RNNBase) and not m.batch_first for m in model.modules()):
        report.max_batch_note = ("not searched: the model's recurrent layers take (time, batch, features) inputs "
                                 "(batch_first=False), whose dimension 0 is not the batch the search resizes")
    elif (states := _model_states_over(report, gpu)) is not None:
        report.max_batch, report.max_batch_note = 0, states  # said at once: no batch size can fit
    else:
        progress("finding the largest micro-batch")
        kwargs.update(precision=options.precision.name, keep_output=options.keep_output,
                      clip_grad_norm=options.clip_grad_norm, ema=options.ema, zero_grad=options.zero_grad,
                      cuda_torch=".".join(map(str, options.cuda.torch)) if options.cuda is not None else None)
        report.max_batch, report.max_batch_note, report.max_batch_margin = _largest_batch(model, inputs, gpu,
                                                                                          **kwargs)
        if checkpoint is not None and report.checkpoint is not None and report.max_batch is not None:
            progress("finding the largest micro-batch (checkpoint what-if)")
            report.checkpoint.max_batch = _largest_batch(model, inputs, gpu, checkpoint=checkpoint[0],
                                                         checkpoint_policy=checkpoint[1], **kwargs)[0]


def _eager_beside(model, inputs, options: StepOptions, trace: str, device: str, gpu: GPU | None, report: Report,
                  progress: Progress) -> dict[str, Any]:
    """The compiled step's figures beside the same step run eager (the report's side-by-side line)."""
    from dataclasses import replace

    progress("tracing the eager step beside the compiled one")
    cap = capture(model, inputs, replace(options, compile=None), mode=trace, progress=progress)
    t, profile = _analyse(cap, replace(options, compile=None), device, progress)
    eager_time = None
    if gpu is not None and device == "cuda":
        from .timing import step_time

        eager_time = step_time(cap, gpu).total
    compiled_time = report.step_time.total if report.step_time is not None else None
    kernels = len({n.meta["kernel"] for n in report.capture.nodes if "kernel" in n.meta})
    compiled_ops = sum(1 for n in report.capture.nodes if n.meta.get("compiled"))
    return {"mode": options.compile, "fused_kernels": kernels, "compiled_ops": compiled_ops,
            "peak": report.memory.peak if report.memory else None, "eager_peak": profile.peak,
            "activations": report.tally.activations_bytes, "eager_activations": t.activations_bytes,
            "step_time_s": compiled_time, "eager_step_time_s": eager_time}


def _model_states_over(report: Report, gpu: GPU) -> str | None:
    """Why no micro-batch can fit when the parameters, gradients and optimizer state alone (and the CUDA
    context) exceed the card, whatever the batch; None otherwise."""
    from .memory import CUDA_RESERVE
    from .render import fmt_bytes

    t = report.tally
    states = t.parameters_bytes + t.gradients_bytes + t.optimizer_state_bytes
    room = gpu.capacity - sum(CUDA_RESERVE.values())
    if states <= room:
        return None
    return (f"the parameters, gradients and optimizer state alone need {fmt_bytes(states)}, more than the "
            f"{fmt_bytes(room)} the card leaves beside the CUDA context: shard them (estimator plan --strategy fsdp)")


def _check_mode(mode: str, grad_accum: Any, quantize: str | None, prompt_len: Any, new_tokens: Any,
                lora: Any = None, *, depth: Any = 2, trace: Any = "auto", optimizer_kwargs: Any = None,
                kv_cache: Any = "dynamic") -> None:
    """The mode and the options that go with it, or a one-line error."""
    from .quantize import check_scheme

    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise UserError(f"depth must be a whole number >= 0 (the module levels the report shows), not {depth!r}")
    if trace not in ("auto", "fake", "real"):
        raise UserError(f"trace must be 'auto', 'fake' or 'real', not {trace!r}")
    if optimizer_kwargs is not None and not isinstance(optimizer_kwargs, Mapping):
        raise UserError(f"optimizer_kwargs must be a dict of the optimizer's options, not "
                        f"{type(optimizer_kwargs).__name__}")
    if mode != "generate" and kv_cache != "dynamic":
        raise UserError(f"kv_cache sizes generation's cache: use mode='generate', or drop it for mode={mode!r}")
    if mode not in ("train", "inference", "generate"):
        raise UserError(f"mode must be 'train', 'inference' or 'generate', not {mode!r}")
    if not isinstance(grad_accum, int) or isinstance(grad_accum, bool) or grad_accum < 1:
        raise UserError(f"grad_accum must be an integer >= 1, not {grad_accum!r}")
    if mode != "train" and grad_accum > 1:
        raise UserError(f"grad_accum applies to training steps; drop it for mode={mode!r}")
    if mode != "generate" and (prompt_len is not None or new_tokens is not None):
        raise UserError("prompt_len and new_tokens size generation: use mode='generate'")
    if lora is not None and mode != "train":
        raise UserError(f"lora sizes fine-tuning steps; drop it for mode={mode!r}")
    check_scheme(quantize, mode, lora is not None)


def _checkpoint_classes(model, checkpoint: Any, compiled: str | None, mode: str) -> tuple[type, ...]:
    """The what-if's classes, or a one-line error: outside training, or inside a compiled region."""
    from .capture.compiled import check_checkpoint_regions

    classes = resolve_classes(model, checkpoint)
    check_checkpoint_regions(model, compiled, classes)
    if classes and mode != "train":
        raise UserError(f"checkpoint is a what-if of training steps (recomputation in backward); mode={mode!r} "
                        f"has no backward: drop it")
    return classes


def _largest_batch(model, inputs, gpu: GPU, checkpoint: tuple[type, ...] = (),
                   **kwargs: Any) -> tuple[int | None, str | None, int | None]:
    """The largest micro-batch that fits on one ``gpu`` (:meth:`estimator.plan.Planner.largest_batch`, DDP on one GPU),
    searched whether or not the given batch fits, with the bytes to spare at it when it was traced there;
    or None and why not ("not searched: ...", or "over ...")."""
    import logging

    from .plan import Planner

    def once(record: logging.LogRecord) -> bool:  # the estimate has said it; the planner's traces need not
        message = record.getMessage()
        return "get no gradient" not in message and "have no cost rule" not in message

    tally_log = logging.getLogger("estimator.tally")
    tally_log.addFilter(once)
    try:
        solve = Planner(model, inputs, gpu=gpu, **kwargs).largest_batch(checkpoint=checkpoint)
    except DataDependentError:  # the search traces the engine on fake tensors only
        return None, "not searched: the model reads tensor values in its forward, and the search traces on fake tensors", None
    except UserError as exc:  # (a forward at a size the user never gave: say which, and why it was tried)
        at = ("the forward at another micro-batch (dimension 0 of the inputs resized as the batch) failed: "
              if str(exc).startswith("the forward pass failed") else "")
        return None, f"not searched: {at}{exc}", None
    finally:
        tally_log.removeFilter(once)
    need = solve.needed_at_answer
    margin = gpu.capacity - need if need and solve.value else None
    return solve.value, solve.reason, margin

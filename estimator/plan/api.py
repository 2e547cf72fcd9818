"""The functions others call: :func:`plan` (one layout) and :func:`compare` (layouts side by side),
each a :class:`~estimator.plan.planner.Planner` for one question."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from ..capture import Progress
from ..errors import UserError
from ..hardware import GPU
from ..loop import check_policy
from .planner import Planner
from .report import Comparison, Plan


def plan(model: torch.nn.Module, inputs: Any, *, gpu: str | GPU, gpus: int = 1, strategy: str = "ddp", tp: int = 1,
         sequence_parallel: bool = False, loss_parallel: bool = False, async_tp: bool = False, pp: int = 1,
         pp_schedule: str = "1f1b",
         microbatches: int = 0, cp: int = 1, cp_rotate: str = "allgather", ep: int = 1,
         optimizer: Any = "adamw", optimizer_kwargs: Mapping[str, Any] | None = None,
         loss_fn=None, precision: str = "bf16-mixed", reduce_dtype: str | None = None, checkpoint: Any = None,
         offload: str | None = None, wrap: Any = None, tokens: float | None = None, samples: float | None = None,
         steps: int | None = None, mfu: float | None = None, solve: Sequence[str] | str = ("batch",),
         gpus_per_node: int = 8, interconnect: str | None = None, inter_node: str | None = None,
         zero_semantics: str = "deepspeed", reshard_after_forward: bool | None = None, device: str = "cuda",
         rank: int = 0, confirm: bool = True, model_name: str | None = None, progress: Progress | None = None,
         trace: str = "auto", solve_unfit: bool = False, keep_output: bool = False, grad_accum: int = 1,
         checkpoint_policy: Any = "full", replicate: bool = True, compile: Any = None, float8: Any = None,
         float8_all_gather: bool = False, etp: int = 1, lora: Any = None, quantize: str | None = None,
         clip_grad_norm: float | None = None, ema: float | None = None, zero_grad: str = "after_step",
         grad_sync: str = "last", gradient_as_bucket_view: bool = False) -> Plan:
    """Plan a training step of ``model`` on ``gpus`` GPUs called ``gpu`` with ``strategy``.

    ``inputs`` are one GPU's micro-batch.  ``ddp``, ``fsdp`` and ``hsdp`` (with ``tp`` tensor
    parallelism) are traced on PyTorch's own engines over a fake process group; ZeRO stages
    ``zero1``-``zero3`` are laid out by hand (``zero_semantics``: ``"deepspeed"`` or ``"paper"``).
    Returns a :class:`~estimator.plan.results.Plan`: per-GPU memory of rank ``rank`` (rows that add up
    to the peak), fits or not (and, when not, the smallest layouts that fit with their step time and time to
    train), the largest micro-batch that fits (searched whether the given one fits or not; ``solve`` may add
    ``"seq"``, searched whether the given size fits or not; ``solve_unfit`` is kept for callers, with no effect;
    a search whose trace at another size fails says so, not searched), step time from the traced
    schedule, time to train for the budget.  ``loss_parallel`` (with ``tp``):
    the head's logits kept sharded by vocabulary, the loss under torch's ``loss_parallel()`` (torchtitan's).
    ``async_tp`` (with ``tp``, ``sequence_parallel`` and ``compile``): torch.compile's micro-pipelined TP, timed by
    :class:`~estimator.plan.schedule.MicroPipelinedTP`.
    ``pp`` pipeline ranks with ``pp_schedule`` (``"gpipe"``, ``"1f1b"``, or ``"interleaved-1f1b"`` and ``"zbv"``
    with two stages per rank) over ``microbatches`` micro-batches (0: one sample each): each stage traced, the
    rank with the highest peak reported (:mod:`estimator.plan.pipeline`).  ``reshard_after_forward`` (FSDP2):
    None is torchtitan's default policy (True, False under ``pp``), or a number of ranks to reshard to.
    ``gradient_as_bucket_view`` (DDP's): the gradients are views into its all-reduce buckets.  ``cp``: context-parallel ranks per sequence,
    attention as torch's ring attention with the ``cp_rotate`` key/value exchange (``"allgather"`` or
    ``"alltoall"``; :mod:`estimator.plan.context`).  ``ep``: expert-parallel ranks per mixture-of-experts layer
    (fsdp or hsdp; all-to-all dispatch, balanced routing assumed; :mod:`estimator.plan.expert`); ``etp`` (with ``ep``
    and ``tp``; torchtitan's ``expert_tensor_parallel_degree``): 1, ep borrows the tp ranks and each routes its share
    of the tokens, or ``tp``, each expert split over the tp ranks and ep borrowing the data-parallel ranks only.
    ``precision`` (default ``bf16-mixed``): see :func:`~estimator.plan.layout.parse_plan_precision`.
    ``device="cpu"`` plans exact bytes without CUDA rounding (tests).  ``trace``: as
    :func:`estimator.estimate`'s (``"auto"``, ``"fake"`` or ``"real"``).  The training loop as
    :func:`estimator.estimate` takes it: ``keep_output``, ``grad_accum`` (micro-batches per optimizer step:
    the gradient sync on the last only, as DDP's ``no_sync`` and FSDP2's ``set_requires_gradient_sync``
    run it, or after every one with ``grad_sync="every"``, Composer's loop and accelerate's ``sync_each_batch``;
    the global batch is micro-batch x data-parallel ranks x ``grad_accum``) and
    ``checkpoint_policy`` for the ``checkpoint`` classes.  ``compile``: the step as torch.compile runs it
    (``"block"`` or ``"model"``, as :func:`estimator.estimate` takes it); ``float8``: ``"tensorwise"`` or
    ``"rowwise"`` (torchao's float8 training, :mod:`estimator.float8`); ``float8_all_gather`` (tensorwise, fsdp or
    hsdp): FSDP2 gathers the float8 weights in float8 (torchao's ``enable_fsdp_float8_all_gather``).  ``lora``
    (and ``quantize="int4"|"int4-dq"``, QLoRA, ddp only): the fine-tuning step as :func:`estimator.estimate` takes
    it (:mod:`estimator.lora`), data parallelism only.  ``clip_grad_norm``: the loop clips the gradients' norm
    before the step (``torch.nn.utils.clip_grad_norm_`` on the engine's gradients, its reduction across ranks
    included); ``ema``: the loop keeps a moving average of the weights (:mod:`estimator.ema`); ``zero_grad``: where
    the loop frees the gradients, as :func:`estimator.estimate` takes it.  Raises
    :class:`~estimator.errors.UserError` for impossible combinations.
    """
    check_policy(checkpoint, checkpoint_policy)
    planner = Planner(model, inputs, gpu=gpu, optimizer=optimizer, optimizer_kwargs=optimizer_kwargs,
                      loss_fn=loss_fn, precision=precision, reduce_dtype=reduce_dtype, wrap=wrap, device=device,
                      gpus_per_node=gpus_per_node, interconnect=interconnect, inter_node=inter_node,
                      zero_semantics=zero_semantics, model_name=model_name, progress=progress, trace=trace,
                      keep_output=keep_output, grad_accum=grad_accum, checkpoint_policy=checkpoint_policy,
                      replicate=replicate, compile=compile, float8=float8, float8_all_gather=float8_all_gather,
                      lora=lora, quantize=quantize, clip_grad_norm=clip_grad_norm, ema=ema, zero_grad=zero_grad,
                      grad_sync=grad_sync)
    return planner.plan(strategy, gpus, tp=tp, sequence_parallel=sequence_parallel, loss_parallel=loss_parallel,
                        async_tp=async_tp,
                        pp=pp, pp_schedule=pp_schedule, microbatches=microbatches, cp=cp, cp_rotate=cp_rotate,
                        ep=ep, etp=etp, checkpoint=checkpoint,
                        offload=offload, tokens=tokens, samples=samples, steps=steps, mfu=mfu, solve=solve,
                        reshard_after_forward=reshard_after_forward, rank=rank, confirm=confirm,
                        solve_unfit=solve_unfit, gradient_as_bucket_view=gradient_as_bucket_view)


def compare(model: torch.nn.Module, inputs: Any, *, gpu: str | GPU | Sequence[str | GPU],
            gpus: int | Sequence[int], strategies: Sequence[str] | None = None, tp: int | Sequence[int] = 1,
            pp: int | Sequence[int] = 1, cp: int | Sequence[int] = 1, ep: int | Sequence[int] = 1,
            pp_schedule: str = "1f1b", microbatches: int = 0, sequence_parallel: bool = False,
            loss_parallel: bool = False, optimizer: Any = "adamw", loss_fn=None, precision: str = "bf16-mixed",
            checkpoint: Any = None,
            offload: str | None = None, wrap: Any = None, tokens=None, samples=None, steps=None, mfu=None,
            gpus_per_node: int = 8, interconnect: str | None = None, inter_node: str | None = None,
            zero_semantics: str = "deepspeed", device: str = "cuda", confirm: bool = False,
            model_name: str | None = None, progress: Progress | None = None, keep_output: bool = False,
            grad_accum: int = 1, checkpoint_policy: Any = "full", compile: Any = None,
            float8: Any = None, float8_all_gather: bool = False, etp: int = 1, grad_sync: str = "last") -> Comparison:
    """Plans side by side: strategies x parallel degrees x (no checkpointing, checkpointing) for each GPU type and
    count, with the recommended row (the fastest that fits).  ``tp``, ``pp``, ``cp``, ``ep``: a degree, or a list of
    degrees to compare (:func:`.comparison.compare_layouts`)."""
    gpu_list = [gpu] if isinstance(gpu, (str, GPU)) or not isinstance(gpu, (list, tuple)) else list(gpu)
    if not gpu_list:
        raise UserError("gpu names no GPU: give one, e.g. gpu='H100'")
    planner = Planner(model, inputs, gpu=gpu_list[0], optimizer=optimizer, loss_fn=loss_fn, precision=precision,
                      wrap=wrap, device=device, gpus_per_node=gpus_per_node, interconnect=interconnect,
                      inter_node=inter_node, zero_semantics=zero_semantics, model_name=model_name, progress=progress,
                      keep_output=keep_output, grad_accum=grad_accum, checkpoint_policy=checkpoint_policy,
                      compile=compile, float8=float8, float8_all_gather=float8_all_gather, grad_sync=grad_sync)
    return planner.compare(gpus, strategies=strategies, tp=tp, pp=pp, cp=cp, ep=ep, pp_schedule=pp_schedule,
                           microbatches=microbatches, sequence_parallel=sequence_parallel,
                           loss_parallel=loss_parallel, checkpoint=checkpoint, offload=offload, tokens=tokens,
                           samples=samples, steps=steps, mfu=mfu, confirm=confirm, gpu=gpu_list, etp=etp)

"""What a capture takes and what it gives: :class:`StepOptions` (loss, optimizer, precision,
training or inference, checkpointing, target, an engine's ``prepare``), :class:`Capture` (the
recorded ops, storages and their lifetimes, the traced tensors alive at the end of the step),
and the internal errors the step raises to its caller (:func:`~.run.capture`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

from ..errors import UserError
from ..graph import OpNode, to_fx
from ..precision import Precision, parse_precision
from ..target import CudaTarget


DATA_DEPENDENT = (DataDependentOutputException, DynamicOutputShapeException)

Progress = Callable[..., None]  # progress(stage: str, detail: str = "")


# Where the training loop calls ``optimizer.zero_grad(set_to_none=True)``:
# * "after_step": after ``optimizer.step()`` (HF Trainer, torchtitan, nanoGPT, PyTorch's quickstart), or at the top
#   of the loop before the forward: no gradient lives through the forward;
# * "before_backward": after the loss and before ``loss.backward()`` (Lightning's automatic optimization:
#   training_step, then zero_grad, then backward; ``loss = ...; opt.zero_grad(); loss.backward(); opt.step()``):
#   the previous step's gradients live through this step's forward;
# * "in_place": ``zero_grad(set_to_none=False)`` (torch's default before 2.0): the gradients stay allocated from the
#   first backward on, zeroed in place; each later backward adds its gradients into them (AccumulateGrad's
#   ``grad += new``: the new gradient a temporary).
ZERO_GRAD = ("after_step", "before_backward", "in_place")


def check_zero_grad(value: Any, mode: str = "train") -> str:
    """``zero_grad``: one of :data:`ZERO_GRAD`; "before_backward" for a training step only."""
    if value not in ZERO_GRAD:
        raise UserError(f"zero_grad must be one of {', '.join(ZERO_GRAD)}, not {value!r}")
    if value != "after_step" and mode != "train":
        raise UserError(f"zero_grad places a training loop's zero_grad(); drop it for mode={mode!r}")
    return value


@dataclass(frozen=True)
class StepOptions:
    """How the step is run: loss, optimizer, precision, training or inference, checkpointing."""

    loss_fn: Callable[[Any], torch.Tensor] | None = None
    optimizer: Any = "adamw"
    optimizer_kwargs: Mapping[str, Any] | None = None
    # the user's parameters' names by id, for an optimizer instance built over them when the step runs a copy of the
    # model (a plan's engines: their parameters are the copy's), matched by name
    param_names: Mapping[int, str] | None = None
    foreach: bool | None = None  # optimizer implementation (None: PyTorch's default for the traced device)
    precision: Precision = parse_precision("fp32")
    train: bool = True  # False: forward only, under torch.no_grad() and model.eval()
    checkpoint: tuple[type, ...] = ()  # module classes run under torch.utils.checkpoint (non-reentrant)
    # which instances of ``checkpoint`` and which of their ops are recomputed: "full", "layer:N", "op", or a
    # ``context_fn`` (see estimator.capture.checkpoint.parse_policy)
    checkpoint_policy: Any = "full"
    # The training loop (see estimator.capture.step.Step.run):
    keep_output: bool = False  # the model's output held through backward and the optimizer step (else dropped
    #                            once the loss is computed, as HF Trainer, Lightning and torchtitan do)
    grad_accum: int = 1  # micro-batches per optimizer step, gradients accumulating (no zero_grad between)
    clip_grad_norm: float | None = None  # torch.nn.utils.clip_grad_norm_(params, max_norm) before the step
    # where the loop calls optimizer.zero_grad(set_to_none=True) (see ZERO_GRAD): the step traced is the same
    zero_grad: str = "after_step"
    ema: float | None = None  # the weights' moving average (its decay), updated after the step (estimator.ema)
    # ``accumulate(module, micro_step, last)``: a context manager around one micro-step's forward and
    # backward (an engine's gradient sync off but on the last: DDP's no_sync, FSDP2's
    # set_requires_gradient_sync); None: nothing
    accumulate: Callable[[Any, int, bool], Any] | None = None
    # Trace six of a stack of identical blocks and replicate the rest (estimator.capture.replicate; each
    # micro-step of gradient accumulation a pass of its own): the same capture as a full trace, in a fraction
    # of the time; False: always trace every block
    replicate: bool = True
    target: str = "cpu"  # "cuda": the kernels CUDA runs where they differ (see estimator.target)
    cuda: CudaTarget | None = None  # the CUDA target's GPU and versions (None: an H100 with this torch)
    # Trace a model as it is, parameters and engine included (see AsIs below): ``prepare(model, fake)``
    # returns (the model to trace, the module to call), its parameters made inside ``fake``.
    prepare: Callable[[torch.nn.Module, Any], tuple[torch.nn.Module, torch.nn.Module]] | None = None
    # one step of transformers' generate() with its KV cache instead of a training step (see .generate)
    generation: Any = None
    # torch.compile: None (eager), "block" (each block of the stack of identical blocks) or "model" (see .compiled)
    compile: str | None = None


@dataclass
class Capture:
    """A captured training step: the fx graph plus what the tallies and the memory simulation need.

    Storages are named by *storage ids* (``sid``), small integers given in order of
    first sight; ``storage_bytes[sid]`` is the size.  ``events`` is the memory
    timeline: ``(node_index, sid, +bytes)`` when a storage is first produced by the
    op recorded as ``nodes[node_index]`` and ``(node_index, sid, -bytes)`` when it is
    freed after that op (index -1: before the first op).  The traced tensors kept
    here (parameters, buffers, inputs, gradients, optimizer state) are the ones
    alive at the end of the step.
    """

    records: list[OpNode]  # placeholders, then every recorded op (getitem included) in order
    nodes: list[OpNode]  # the aten ops in execution order (events index into it)
    outputs: tuple[OpNode, ...]
    mode: str  # "fake" or "real"
    loss_source: str
    module_types: dict[str, str]  # module path -> class name
    module_outputs: dict[str, list[tuple[int, ...]]]  # module path -> output shapes (first call)
    params: dict[str, torch.Tensor]  # name -> the traced parameter, deduplicated (tied weights once)
    param_owner: dict[str, str]  # param/buffer name -> owning module path
    buffers: dict[str, torch.Tensor]
    inputs: list[torch.Tensor]  # flat list of traced input tensors
    saved: dict[int, tuple[int, str]]  # sid -> (nbytes, module) held by autograd at the end of forward
    grads: dict[str, torch.Tensor]  # param name -> traced gradient
    optimizer_state: dict[str, dict[str, torch.Tensor]]  # param name -> state tensors
    optimizer_name: str | None
    storage_bytes: list[int]
    storage_dtype: list[torch.dtype]
    events: list[tuple[int, int, int]]
    sids: dict[str, set[int]]  # category -> sids: parameter, buffer, input, gradient, optimizer_state, saved, loss
    fallback_reason: str | None = None
    assumptions: list[str] = field(default_factory=list)  # what the capture set to make the step deterministic
    # the loop traced: the output held through backward or dropped after the loss; with ``grad_accum`` > 1
    # two micro-steps are traced (the second's nodes have meta["micro_step"] == 1: it stands for micro-steps
    # 2..N, which accumulate into existing gradients) before the optimizer step
    keep_output: bool = False
    grad_accum: int = 1
    clip_grad_norm: float | None = None  # the gradients' norm clipped to it before the optimizer step
    # where the loop frees the gradients (ZERO_GRAD): "before_backward" keeps the previous step's through the forward
    zero_grad: str = "after_step"
    # a step of generate() (see .generate): stage, prompt_len, new_tokens, cache, cache_class, batch, cached
    # (tokens in the cache after the step) and one row per layer of the cache
    generation: dict[str, Any] | None = None
    # class names of the model's nn.Linear subclasses (Falcon's FalconLinear): Linear layers by isinstance, as
    # transformers' bitsandbytes integration picks them (module_types holds class names only)
    linear_classes: frozenset[str] = frozenset()
    # the samples of a batch given as a list of per-sample tensors (torchvision's detection: images C x H x W), which
    # the first tensor's dimension 0 (its channels) does not say; None: dimension 0 of the first input
    samples: int | None = None
    _fx: fx.Graph | None = None

    def node_order(self, middle: str = "accumulate") -> list[int]:
        """Indices into :attr:`nodes` of one whole optimizer step of :attr:`grad_accum` micro-steps, in the
        order they run.  Two micro-steps are traced (:attr:`grad_accum` > 1): the first makes the gradients,
        the second accumulates into them (and, under DDP or FSDP2, is the one that syncs them).  ``middle``
        says which stands for micro-steps 2..N-1: ``"accumulate"`` (the second: on one device every later
        micro-step is it) or ``"first"`` (the first, without the sync the engines skip until the last)."""
        n = len(self.nodes)
        if self.grad_accum <= 2:
            return list(range(n))
        first = [i for i, node in enumerate(self.nodes) if node.meta.get("phase") != "optimizer"
                 and not node.meta.get("micro_step")]
        second = [i for i, node in enumerate(self.nodes) if node.meta.get("micro_step")]
        rest = [i for i, node in enumerate(self.nodes) if node.meta.get("phase") == "optimizer"]
        if middle == "first":
            return first * (self.grad_accum - 1) + second + rest
        return first + second * (self.grad_accum - 1) + rest

    @property
    def graph(self) -> fx.Graph:
        """The step as a ``torch.fx.Graph`` (built on first access; nodes share the records' meta)."""
        if self._fx is None:
            self._fx = to_fx(self.records, self.outputs)
        return self._fx


class ReadsValues(Exception):
    """Raised internally when the step reads tensor values on fake tensors."""


class StepFailed(UserError):
    """The step raised: a user error (bad shapes), or a kernel whose fake version differs from the real one."""

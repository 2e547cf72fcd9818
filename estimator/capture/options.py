"""What a capture takes and what it gives: :class:`StepOptions` (loss, optimizer, precision,
training or inference, checkpointing, target, an engine's ``prepare``), :class:`Capture` (the
recorded ops, storages and their lifetimes, the traced tensors alive at the end of the step),
and the internal errors the step raises to its caller (:func:`~.run.capture`).
"""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class StepOptions:
    """How the step is run: loss, optimizer, precision, training or inference, checkpointing."""

    loss_fn: Callable[[Any], torch.Tensor] | None = None
    optimizer: Any = "adamw"
    optimizer_kwargs: Mapping[str, Any] | None = None
    foreach: bool | None = None  # optimizer implementation (None: PyTorch's default for the traced device)
    precision: Precision = parse_precision("fp32")
    train: bool = True  # False: forward only, under torch.no_grad() and model.eval()
    checkpoint: tuple[type, ...] = ()  # module classes run under torch.utils.checkpoint (non-reentrant)
    target: str = "cpu"  # "cuda": the kernels CUDA runs where they differ (see estimator.target)
    cuda: CudaTarget | None = None  # the CUDA target's GPU and versions (None: an H100 with this torch)
    # Trace a model as it is, parameters and engine included (see AsIs below): ``prepare(model, fake)``
    # returns (the model to trace, the module to call), its parameters made inside ``fake``.
    prepare: Callable[[torch.nn.Module, Any], tuple[torch.nn.Module, torch.nn.Module]] | None = None


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
    _fx: fx.Graph | None = None

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

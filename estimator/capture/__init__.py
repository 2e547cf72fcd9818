"""Capture one training step (forward, loss, backward, optimizer step) as a torch.fx graph.

The step runs on fake tensors (``FakeTensorMode``): shapes, dtypes and aliasing are exact, but
no weight or activation is ever allocated, so a 70B model is captured on a laptop.  The
fake-tensor mode itself records every aten op that reaches the kernels, forward and backward
alike, in execution order, as a light :class:`~estimator.graph.OpNode` record;
``Capture.graph`` turns them into ``call_function`` nodes of an ``fx.Graph`` on first access.
This works for any module, including those ``torch.fx.symbolic_trace`` cannot trace (HF
transformers), because it records what runs rather than reading Python source.

Each node carries, in ``node.meta``:

* ``spec``: :class:`~estimator.rules.registry.TensorSpec` of each tensor output,
* ``storage``: the storage id of each tensor output (views and in-place results share
  their base's id),
* ``module``: the module path that produced it (backward ops inherit the path of the
  forward op whose autograd node runs them, matched by autograd sequence number),
* ``phase``: a :class:`Phase` (``forward``, ``loss``, ``backward`` or ``optimizer``).

Data-dependent Python control flow (``if x.sum() > 0:``) cannot run on fake tensors; the step
is then captured again on small real CPU tensors when the model fits in memory, else a
:class:`~estimator.errors.UserError` names the module and op.

Where each part lives:

* :mod:`.run`: :func:`capture`, the entry point, and the fallback to real CPU tensors;
* :mod:`.step`: the step itself (one method per phase on an ``ExitStack``);
* :mod:`.options`: :class:`StepOptions` (how the step runs) and :class:`Capture` (what it gives);
* :mod:`.as_is`: a model traced as its engine left it (DDP, FSDP2, tensor parallelism);
* :mod:`.recorder`: the recorder (records, storage lifetimes, module attribution), :class:`Phase`;
* :mod:`.fake`: the recording ``FakeTensorMode`` and every private ``FakeTensorMode`` API used;
* :mod:`.inputs`: traced stand-ins for inputs, parameters and buffers;
* :mod:`.loss`: which output is the loss;
* :mod:`.checkpoint`: the activation-checkpointing what-if;
* :mod:`.generate`: one step of transformers' ``generate()`` with its KV cache (:class:`Generation`).
"""

from .generate import KV_CACHES, Generation
from .inputs import split_inputs
from .loss import default_loss, select_loss
from .recorder import (
    FORWARD_PHASES,
    GENERATE_MODULE,
    INPUT_MODULE,
    LOSS_MODULE,
    OPTIMIZER_MODULE,
    Phase,
    tensor_spec,
)
from .options import ZERO_GRAD, Capture, Progress, StepOptions, check_zero_grad
from .run import capture

__all__ = ["capture", "Capture", "StepOptions", "ZERO_GRAD", "check_zero_grad", "Progress", "Phase", "FORWARD_PHASES",
           "LOSS_MODULE",
           "INPUT_MODULE", "OPTIMIZER_MODULE", "GENERATE_MODULE", "Generation", "KV_CACHES", "select_loss",
           "default_loss", "split_inputs", "tensor_spec"]

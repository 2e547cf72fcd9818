"""Capacity planning: one training step of a model on N GPUs, before renting them.

    estimator plan examples/gpt.py:build --gpu H100 --gpus 16 --strategy fsdp --tokens 20B

    >>> from estimator.plan import plan, compare
    >>> p = plan(model, inputs, gpu="H100", gpus=64, strategy="fsdp", tokens=300e9)
    >>> p.fits, p.max_batch, p.step_time_s, p.time_to_train_s, p.to_dict()

Where PyTorch has an engine, the plan traces it instead of imitating it: DDP, FSDP2
(``fully_shard``, with its ``MixedPrecisionPolicy`` and ``reshard_after_forward``) and tensor
parallelism (``parallelize_module``, with or without sequence parallelism) run one step on fake
tensors over a fake process group, one rank at a time, with the existing capture and memory
simulation; ZeRO stages 1-3, which PyTorch has no engine for, are laid out by hand with
DeepSpeed's (or the ZeRO paper's) accounting.

One concept per module:

* :mod:`.layout`: strategies, layouts (mesh, rank), precision policies, impossible combinations;
* :mod:`.engine`: the engines traced on a fake process group;
* :mod:`.tp`: which Linear layers tensor parallelism splits how (from the traced dataflow);
* :mod:`.zero`: ZeRO layouts (DeepSpeed or paper semantics);
* :mod:`.traced`: a traced step read for planning (rows that add up to the peak, collectives);
* :mod:`.schedule`: step time from the traced schedule (per-op time, collectives on links, overlap);
* :mod:`.search`: largest micro-batch / sequence, fewest GPUs;
* :mod:`.results`: typed results; :mod:`.report`: their text;
* :mod:`.planner`: :class:`Planner`; :mod:`.api`: :func:`plan`, :func:`compare`.
"""

from .layout import DEFAULT_PRECISION, OFFLOADS, PRECISIONS, STRATEGIES, ZERO_SEMANTICS, Layout, PlanPrecision
from .api import compare, plan
from .planner import Planner, default_wrap
from .report import Comparison, Plan
from .results import Config, Flops, PerGpu, Solve, StepTime, Suggestion, Training, Verdict
from .traced import ROWS

__all__ = ["plan", "compare", "Planner", "Plan", "Comparison", "PerGpu", "StepTime", "Verdict", "Solve",
           "Suggestion", "Training", "Flops", "Config", "Layout", "PlanPrecision", "STRATEGIES", "OFFLOADS",
           "PRECISIONS", "DEFAULT_PRECISION", "ZERO_SEMANTICS", "ROWS", "default_wrap"]

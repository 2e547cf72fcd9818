"""The numbers of an estimate (:class:`ReportData`): the capture, the tallies, the memory profile,
the what-ifs (checkpointing, weight-only quantization), and what they add up to.

:mod:`estimator.render` shows a :class:`ReportData` as text, markdown, CSV, HTML, JSON and plots;
:class:`estimator.report.Report` is a :class:`ReportData` with those views as methods.  This
module knows nothing of the formats, so the formats can import it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch.fx as fx

from .capture import INPUT_MODULE, LOSS_MODULE, Capture
from .hardware import GPU
from .memory import MemoryProfile
from .quantize import QUANT_SCHEMES, TRACED_4BIT, QuantizedWhatIf, quantized_peak, quantized_what_ifs  # noqa: F401
from .tally import ModuleTally, Tally


def _truncate(path: str, depth: int) -> str:
    if path in (LOSS_MODULE, INPUT_MODULE) or path == "":
        return path
    return ".".join(path.split(".")[:depth])


@dataclass
class ModuleRow:
    path: str
    type: str
    output_shape: str
    params: int
    activations: int
    flops_forward: int
    flops_backward: int
    percent: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# Op names of the kernels a target chooses among (see estimator.target): attention backends (and the
# math path's softmax), batch norm, dropout, recurrent layers.
_KERNEL_KEYS = ("attention", "_safe_softmax", "batch_norm", "dropout", "_cudnn_rnn", "mkldnn_rnn")


@dataclass
class CheckpointWhatIf:
    """The same step with activation checkpointing of the instances of ``classes`` its ``policy`` picks."""

    classes: list[str]
    peak: int
    peak_saved: int
    flops_backward: int
    flops_added: int
    policy: str = "full"  # full, op, layer:N or custom (see estimator.capture.checkpoint)
    matmul_backward: int = 0  # matmul-class FLOPs of its backward, recomputation included
    # the what-if's live bytes over its step, as (phase, total bytes) per op (drawn beside the step's own)
    timeline: list[tuple[str, int]] = field(default_factory=list, repr=False)
    max_batch: int | None = None  # the largest micro-batch that fits the GPU with it (estimate --gpu)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "timeline"}


@dataclass
class ReportData:
    """The numbers of the estimate of one step (the base of :class:`estimator.report.Report`)."""

    capture: Capture
    tally: Tally
    model_name: str = ""
    depth: int = 2
    memory: MemoryProfile | None = None
    device: str = "cuda"
    precision: str = "fp32"
    mode: str = "train"
    checkpoint: CheckpointWhatIf | None = None
    gpu: GPU | None = None  # the GPU the step is sized for (estimate(gpu=...))
    # the largest micro-batch that fits on ``gpu`` (estimator.plan, one GPU, DDP), or None with the reason
    max_batch: int | None = None
    max_batch_note: str | None = None
    max_batch_margin: int | None = None  # bytes to spare on ``gpu`` at ``max_batch`` (traced there)
    # predicted step time on ``gpu`` (estimator.timing; CUDA targets sized for a GPU), else None
    step_time: Any = None
    # mode="generate": the prefill and the last decode step, the KV cache (estimator.generation.GenerationData)
    generation: Any = None
    quantize: str | None = None  # "int8" or "int4": the estimate is sized with those weights (estimator.quantize)
    # estimate(compile=...): the compiled step's figures beside the eager step's (estimator.api._eager_beside)
    compiled: dict[str, Any] | None = None
    # the torch release whose kernel choices the CUDA step follows (estimate(cuda_torch=...), else the installed one)
    cuda_torch: tuple[int, int] | None = None

    # -- access ---------------------------------------------------------------
    @property
    def graph(self) -> fx.Graph:
        """The captured fx graph of the step (forward, loss, backward, optimizer) in execution order."""
        return self.capture.graph

    def to_networkx(self):
        """The captured graph as a ``networkx.DiGraph`` (node name -> attributes; edges are data flow)."""
        from .graph import to_networkx

        return to_networkx(self.capture.records)

    @property
    def unsupported_ops(self) -> list[dict[str, Any]]:
        return self.tally.unsupported

    # -- module table ---------------------------------------------------------
    def module_rows(self, depth: int | None = None) -> list[ModuleRow]:
        """One row per module at ``depth`` (plus (loss) and (input)); rows sum to the totals."""
        depth = self.depth if depth is None else depth
        t = self.tally
        groups: dict[str, list[ModuleTally]] = {}
        for path, m in t.modules.items():
            groups.setdefault(_truncate(path, depth), []).append(m)
        total = (t.flops["forward"] + t.flops["backward"]) or 1
        rows = []
        for key, members in groups.items():
            fwd = sum(m.flops_forward for m in members)
            bwd = sum(m.flops_backward for m in members)
            params = sum(m.params for m in members)
            saved = sum(m.saved_bytes for m in members)
            if key in (LOSS_MODULE, INPUT_MODULE) and not (fwd or bwd or params or saved):
                continue
            shapes = self.capture.module_outputs.get(key, [])
            rows.append(
                ModuleRow(
                    path=key or "(root)",
                    type=self.capture.module_types.get(key, ""),
                    output_shape=", ".join("x".join(map(str, s)) or "scalar" for s in shapes),
                    params=params,
                    activations=saved,
                    flops_forward=fwd,
                    flops_backward=bwd,
                    percent=100.0 * (fwd + bwd) / total,
                )
            )
        return rows

    @property
    def kernels(self) -> dict[str, int]:
        """The kernels the target's choice decided (attention backend, batch norm, dropout, recurrent
        layers) and how many times each runs in the step, forward and backward (every micro-step of gradient
        accumulation): what the estimate assumed."""
        nodes = self.capture.nodes
        # a few hundred kinds of 10^4-10^5 nodes
        by_target = Counter(nodes[i].target for i in self.capture.node_order()) if self.capture.grad_accum > 2 \
            else Counter(node.target for node in nodes)
        counts: dict[str, int] = {}
        for target, n in by_target.items():
            name = str(getattr(target, "overloadpacket", target)).removeprefix("aten.")
            if any(k in name for k in _KERNEL_KEYS):
                counts[name] = counts.get(name, 0) + n
        return counts

    # -- the answer a user reads first ------------------------------------------------
    @property
    def needed(self) -> int | None:
        """Bytes the device needs: the higher of the two peaks plus, for a CUDA target, the reserve (the CUDA
        context outside PyTorch's allocator and the fragmentation allowance; :func:`estimator.memory.gpu_bytes_needed`)."""
        if self.memory is None:
            return None
        from .memory import gpu_bytes_needed, needed_for_peak

        if self.quantize in TRACED_4BIT:
            return gpu_bytes_needed(self.memory)
        if self.quantize:  # sized with the quantized weights: the peak they leave, and its reserve
            peak = self.quantized_peak
            return needed_for_peak(peak) if self.device == "cuda" else peak
        return gpu_bytes_needed(self.memory)

    @property
    def quantized_peak(self) -> int | None:
        """The peak with the weights quantized as ``quantize`` says (None without ``quantize``)."""
        if not self.quantize or self.memory is None:
            return None
        if self.quantize in TRACED_4BIT:  # traced over the 4-bit weights: the trace's own peak
            return max(self.memory.peak, self.memory.peak_first_step)
        return quantized_peak(self.capture, self.device, max(self.memory.peak, self.memory.peak_first_step),
                              self.quantize)

    @property
    def fits(self) -> bool | None:
        """Whether :attr:`needed` fits in the GPU's memory (None without a GPU)."""
        if self.gpu is None or self.needed is None:
            return None
        return self.needed <= self.gpu.capacity

    def fit_dict(self) -> dict[str, Any] | None:
        if self.gpu is None or self.needed is None:
            return None
        return {"gpu": self.gpu.name, "capacity": self.gpu.capacity, "needed": self.needed, "fits": self.fits,
                "margin": self.gpu.capacity - self.needed, "max_batch": self.max_batch,
                "max_batch_note": self.max_batch_note, "max_batch_margin": self.max_batch_margin}

    @property
    def quantized(self) -> list[QuantizedWhatIf]:
        """Weight-only int8 / int4 what-ifs of an inference or generation estimate (empty for training)."""
        if self.mode == "train" or self.memory is None:
            return []
        return quantized_what_ifs(self.capture, self.tally, self.device, self.memory.peak)

    def by_operator(self) -> list[dict[str, Any]]:
        """FLOPs (forward, backward, optimizer) and bytes saved for backward per aten op, most FLOPs first."""
        return [{k: v for k, v in row.items()} for row in self.tally.by_operator]

"""The numbers of an estimate (:class:`ReportData`): the capture, the tallies, the memory profile,
the what-ifs (checkpointing, weight-only quantization), and what they add up to.

:mod:`estimator.render` shows a :class:`ReportData` as text, markdown, CSV, HTML, JSON and plots;
:class:`estimator.report.Report` is a :class:`ReportData` with those views as methods.  This
module knows nothing of the formats, so the formats can import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.fx as fx

from .capture import INPUT_MODULE, LOSS_MODULE, Capture
from .hardware import GPU
from .memory import MemoryProfile
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

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "timeline"}


# Weight-only quantization for inference, as bitsandbytes lays the weights out when transformers /
# accelerate load a model with ``load_in_8bit`` / ``load_in_4bit`` (BitsAndBytesConfig defaults):
#
# * int8, LLM.int8() (``bnb.nn.Linear8bitLt``, ``Int8Params``): the weight as int8 ``CB`` (out x in,
#   1 byte each) plus ``SCB``, one float32 absmax scale per output row (row-wise quantization:
#   Dettmers et al. 2022, "LLM.int8()", section 3; bitsandbytes ``int8_vectorwise_quant``).
# * int4, NF4 / FP4 (``bnb.nn.Linear4bit``, ``Params4bit``, ``quantize_4bit``): two 4-bit values
#   per byte (ceil(out x in / 2) bytes) plus one float32 absmax per block of 64 weights
#   (``blocksize=64``; ``bnb_4bit_use_double_quant=False``, transformers' default).  The matmul
#   dequantizes one layer's weight at a time to the compute dtype (16-bit), a temporary of
#   out x in x 2 bytes.
#
# Only the weights of ``nn.Linear`` (and transformers' ``Conv1D``) layers are quantized, as
# ``replace_with_bnb_linear`` does; biases, embeddings, norms, and what transformers'
# ``get_keys_to_not_convert`` keeps in full precision (the output head ``lm_head``, the module
# holding the last parameter, tied weights) stay as they are.
QUANT_SCHEMES = {
    "int8": dict(layout="bitsandbytes LLM.int8: int8 weights + one float32 scale per output row",
                 bits=8, group=None),
    "int4": dict(layout="bitsandbytes NF4/FP4: 4-bit weights, two per byte + one float32 absmax per 64 weights",
                 bits=4, group=64),
}
INT4_COMPUTE_BYTES = 2  # the 16-bit compute dtype one dequantized layer takes during its matmul


@dataclass
class QuantizedWhatIf:
    """Inference with the weights of the ``nn.Linear`` layers quantized (weight-only), see QUANT_SCHEMES."""

    scheme: str
    layout: str
    layers: int  # Linear layers quantized
    params: int  # their weights' elements
    weights_before: int  # bytes of those weights as traced
    weights_after: int  # bytes quantized (values + scales)
    parameters: int  # all parameter bytes after quantization
    peak: int  # the inference peak with the quantized weights

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


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
        layers) and how many times each runs in the step, forward and backward: what the estimate assumed."""
        counts: dict[str, int] = {}
        for node in self.capture.nodes:
            name = str(getattr(node.target, "overloadpacket", node.target)).removeprefix("aten.")
            if any(k in name for k in _KERNEL_KEYS):
                counts[name] = counts.get(name, 0) + 1
        return counts

    # -- the answer a user reads first ------------------------------------------------
    @property
    def needed(self) -> int | None:
        """Bytes the device needs: the higher of the two peaks plus, for a CUDA target, the reserve (the CUDA
        context outside PyTorch's allocator and the fragmentation allowance; :func:`estimator.memory.gpu_bytes_needed`)."""
        if self.memory is None:
            return None
        from .memory import gpu_bytes_needed

        return gpu_bytes_needed(self.memory)

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
        """Weight-only int8 / int4 what-ifs of an inference estimate (empty for training)."""
        if self.mode != "inference" or self.memory is None:
            return []
        return quantized_what_ifs(self)

    def by_operator(self) -> list[dict[str, Any]]:
        """FLOPs (forward, backward, optimizer) and bytes saved for backward per aten op, most FLOPs first."""
        return [{k: v for k, v in row.items()} for row in self.tally.by_operator]


def _quantizable(report: ReportData) -> list[tuple[str, int, int, int]]:
    """(module path, output features, input features, bytes per weight) of every layer the what-if quantizes:
    ``nn.Linear`` and transformers' ``Conv1D`` (GPT-2; weight stored in x out), as transformers'
    ``replace_with_bnb_linear`` picks them, less what ``get_keys_to_not_convert`` keeps: the output
    head (``lm_head``), the module holding the last parameter, and tied weights (owned by another module)."""
    cap = report.capture
    last_owner = cap.param_owner[next(reversed(cap.params))] if cap.params else None
    layers = []
    for path, kind in cap.module_types.items():
        if kind not in ("Linear", "Conv1D") or path == last_owner or path.rpartition(".")[2] == "lm_head":
            continue
        weight = cap.params.get(f"{path}.weight")
        if weight is None or weight.ndim != 2:  # tied: the weight is owned by another module
            continue
        rows, cols = weight.shape if kind == "Linear" else tuple(reversed(weight.shape))
        layers.append((path, rows, cols, weight.element_size()))
    return layers


def quantized_what_ifs(report: ReportData) -> list[QuantizedWhatIf]:
    """int8 and int4 weight-only what-ifs of an inference estimate (layouts: QUANT_SCHEMES).

    ``parameters``: the parameter bytes with those weights quantized (exact bytes); ``peak``: the
    inference peak less the bytes the quantized weights save (each tensor rounded as the target's
    allocator does), plus, for int4, one layer's weight dequantized to 16 bits (an upper bound: that
    temporary is counted at the peak)."""
    from .memory import round_cuda

    rnd = round_cuda if report.device == "cuda" else (lambda n: n)
    layers = _quantizable(report)
    if not layers or report.memory is None:
        return []
    out = []
    for scheme, spec in QUANT_SCHEMES.items():
        exact_before = exact_after = rounded_saved = elements = largest = 0
        for _path, rows, cols, size in layers:
            n = rows * cols
            elements += n
            if spec["bits"] == 8:
                tensors = [n, 4 * rows]  # int8 CB (out x in) + float32 SCB (out,)
            else:
                tensors = [-(-n // 2), 4 * -(-n // spec["group"])]  # packed 4-bit + float32 absmax per 64
                largest = max(largest, rnd(INT4_COMPUTE_BYTES * n))
            exact_before += n * size
            exact_after += sum(tensors)
            rounded_saved += rnd(n * size) - sum(rnd(t) for t in tensors)
        out.append(QuantizedWhatIf(scheme=scheme, layout=spec["layout"], layers=len(layers), params=elements,
                                   weights_before=exact_before, weights_after=exact_after,
                                   parameters=report.tally.parameters_bytes - (exact_before - exact_after),
                                   peak=report.memory.peak - rounded_saved + largest))
    return out

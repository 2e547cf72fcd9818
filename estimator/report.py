"""The estimate of one step: the numbers, as programs read them (a dict / JSON).

:class:`Report` holds the capture, the tallies and the memory profile and exposes them as
exact integers (:meth:`Report.to_dict`); :mod:`estimator.render` shows them as tables, CSV,
HTML and plots (the methods here that return text delegate to it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.fx as fx

from . import render as _render
from .capture import INPUT_MODULE, LOSS_MODULE, Capture
from .hardware import GPU
from .memory import MemoryProfile
from .render import SCHEMA_VERSION, fmt_bytes, fmt_count, fmt_flops  # noqa: F401  (re-exported)
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


@dataclass
class CheckpointWhatIf:
    """The same step with activation checkpointing on every instance of ``classes``."""

    classes: list[str]
    peak: int
    peak_saved: int
    flops_backward: int
    flops_added: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Report:
    """The estimate of one training step.  ``print(report)`` shows tables; ``to_dict()`` is JSON-ready."""

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

    # -- dict / JSON ----------------------------------------------------------
    def to_dict(self, depth: int | None = None) -> dict[str, Any]:
        t = self.tally
        return {
            "schema_version": SCHEMA_VERSION,
            "model": self.model_name,
            "capture": self.capture.mode,
            "capture_fallback": self.capture.fallback_reason,
            "loss": self.capture.loss_source,
            "optimizer": self.capture.optimizer_name,
            "device": self.device,
            "precision": self.precision,
            "mode": self.mode,
            "gpu": None if self.gpu is None else {"name": self.gpu.name, "memory": self.gpu.memory},
            "params": {"total": t.params_total, "trainable": t.params_trainable},
            "memory": {
                "parameters": t.parameters_bytes,
                "buffers": t.buffers_bytes,
                "gradients": t.gradients_bytes,
                "optimizer_state": t.optimizer_state_bytes,
                "activations": t.activations_bytes,
                "inputs": t.inputs_bytes,
                "by_dtype": {("activations" if k == "saved" else k + "s" if k in ("parameter", "buffer", "gradient", "input")
                              else k): v for k, v in t.memory_by_dtype.items()},
                **(self.memory.to_dict() if self.memory else {}),
            },
            "flops": {
                "forward": t.flops["forward"],
                "backward": t.flops["backward"],
                "total": t.flops["forward"] + t.flops["backward"],
                "matmul_forward": t.flops["matmul_forward"],
                "matmul_backward": t.flops["matmul_backward"],
                "optimizer": t.flops["optimizer"],
                "by_dtype": dict(t.flops_by_dtype),
            },
            "checkpoint": self.checkpoint.to_dict() if self.checkpoint else None,
            "modules": [r.to_dict() for r in self.module_rows(depth)],
            "unsupported_ops": list(t.unsupported),
        }

    # -- text, csv, html (estimator.render) -----------------------------------
    def summary_rows(self) -> list[tuple[str, str]]:
        return _render.summary_rows(self)

    def module_table(self, depth: int | None = None, tablefmt: str = "simple") -> str:
        return _render.module_table(self, depth, tablefmt)

    def unsupported_table(self, tablefmt: str = "simple") -> str:
        return _render.unsupported_table(self, tablefmt)

    def render(self, tablefmt: str = "simple", depth: int | None = None) -> str:
        return _render.render(self, tablefmt, depth)

    def to_markdown(self, depth: int | None = None) -> str:
        return _render.render(self, "github", depth)

    CSV_COLUMNS = _render.CSV_COLUMNS

    def to_csv(self, depth: int | None = None) -> str:
        """One row per module at ``depth`` (the JSON ``modules`` rows): exact integers, bytes and FLOPs."""
        return _render.to_csv(self, depth)

    def to_html(self, depth: int | None = None) -> str:
        """A self-contained page; see :func:`estimator.render.to_html`."""
        return _render.to_html(self, depth)

    def __str__(self) -> str:
        return self.render()

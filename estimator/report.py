"""The estimate as people read it (tables) and as programs read it (a dict / JSON).

Memory is shown in binary units (KiB, MiB, GiB = 2**10, 2**20, 2**30 bytes);
the dict holds exact bytes.  FLOPs follow the project convention: one
multiply-add is 2 FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.fx as fx
from tabulate import tabulate

from .capture import INPUT_MODULE, LOSS_MODULE, Capture
from .memory import MemoryProfile
from .tally import ModuleTally, Tally

SCHEMA_VERSION = 1


def fmt_bytes(n: float) -> str:
    """Binary units: 1536 -> '1.50 KiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # pragma: no cover


def fmt_flops(n: float) -> str:
    """Decimal units: 2.5e9 -> '2.50 GFLOP'."""
    n = float(n)
    for unit in ("", "K", "M", "G", "T", "P", "E"):
        if abs(n) < 1000 or unit == "E":
            return f"{n:.0f} FLOP" if unit == "" else f"{n:.2f} {unit}FLOP"
        n /= 1000
    return f"{n:.2f} EFLOP"  # pragma: no cover


def fmt_count(n: int) -> str:
    return f"{n:,}"


def _depth_of(path: str) -> int:
    return 0 if path == "" else path.count(".") + 1


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
            "params": {"total": t.params_total, "trainable": t.params_trainable},
            "memory": {
                "parameters": t.parameters_bytes,
                "buffers": t.buffers_bytes,
                "gradients": t.gradients_bytes,
                "optimizer_state": t.optimizer_state_bytes,
                "activations": t.activations_bytes,
                "inputs": t.inputs_bytes,
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

    # -- text -----------------------------------------------------------------
    def summary_rows(self) -> list[tuple[str, str]]:
        t = self.tally
        fwd, bwd = t.flops["forward"], t.flops["backward"]
        mm = t.flops["matmul_forward"] + t.flops["matmul_backward"]
        rows = [
            ("Parameters", f"{fmt_count(t.params_total)} ({fmt_count(t.params_trainable)} trainable)"),
            ("Loss", self.capture.loss_source),
            ("Optimizer", self.capture.optimizer_name or "none"),
            ("Target", f"{self.device}, {self.precision}, {self.mode}"),
            ("Memory: parameters", fmt_bytes(t.parameters_bytes)),
            ("Memory: buffers", fmt_bytes(t.buffers_bytes)),
            ("Memory: gradients", fmt_bytes(t.gradients_bytes)),
            ("Memory: optimizer state", fmt_bytes(t.optimizer_state_bytes)),
            ("Memory: activations (saved for backward)", fmt_bytes(t.activations_bytes)),
        ]
        if self.memory is not None:
            m = self.memory
            at = m.peak_at
            where = f"in {at.phase}" + (f", {at.module}" if at.module else "") + (f", {at.op}" if at.op else "")
            rows += [
                ("Memory: peak (steady-state step)", f"{fmt_bytes(m.peak)} ({where})"),
                ("Memory: peak at that moment", ", ".join(f"{k.replace('_', ' ')} {fmt_bytes(v)}"
                                                          for k, v in at.by_category.items() if v)),
                ("Memory: peak (first step)", fmt_bytes(m.peak_first_step)),
            ]
            if m.reserve:
                rows.append(("Memory: reserve outside the allocator",
                             f"{fmt_bytes(sum(m.reserve.values()))} (CUDA context, cuBLAS workspace, fragmentation)"))
        rows += [
            ("FLOPs: forward", fmt_flops(fwd)),
            ("FLOPs: backward", fmt_flops(bwd)),
            ("FLOPs: total", f"{fmt_flops(fwd + bwd)} ({100.0 * mm / max(fwd + bwd, 1):.1f}% matmul-class)"),
        ]
        for dtype, n in sorted(t.flops_by_dtype.items()):
            rows.append((f"FLOPs: {dtype}", fmt_flops(n)))
        if self.checkpoint:
            c = self.checkpoint
            rows.append((f"What-if: checkpoint {', '.join(c.classes)}",
                         f"peak {fmt_bytes(c.peak)} (saves {fmt_bytes(c.peak_saved)}), "
                         f"backward +{fmt_flops(c.flops_added)}"))
        if t.flops["optimizer"]:
            rows.append(("FLOPs: optimizer step", fmt_flops(t.flops["optimizer"])))
        if self.capture.fallback_reason:
            rows.append(("Capture", f"real CPU tensors ({self.capture.fallback_reason})"))
        return rows

    def module_table(self, depth: int | None = None, tablefmt: str = "simple") -> str:
        headers = ["Module", "Type", "Output shape", "Params", "Saved activations", "Fwd FLOPs", "Bwd FLOPs", "%"]
        rows = self.module_rows(depth)
        body = [
            [r.path, r.type, r.output_shape, fmt_count(r.params), fmt_bytes(r.activations),
             fmt_flops(r.flops_forward), fmt_flops(r.flops_backward), f"{r.percent:.1f}"]
            for r in rows
        ]
        t = self.tally
        body.append(["Total", "", "", fmt_count(t.params_total), fmt_bytes(t.activations_bytes),
                     fmt_flops(t.flops["forward"]), fmt_flops(t.flops["backward"]), "100.0"])
        return tabulate(body, headers=headers, tablefmt=tablefmt, disable_numparse=True)

    def unsupported_table(self, tablefmt: str = "simple") -> str:
        if not self.tally.unsupported:
            return ""
        body = [[r["op"], r["count"], r["module"]] for r in self.tally.unsupported]
        return tabulate(body, headers=["Op without a cost rule", "Count", "Module"], tablefmt=tablefmt)

    def render(self, tablefmt: str = "simple", depth: int | None = None) -> str:
        title = f"Training-step estimate{f' of {self.model_name}' if self.model_name else ''}"
        parts = [
            title,
            tabulate(self.summary_rows(), tablefmt=tablefmt, disable_numparse=True),
            f"Per module (depth {self.depth if depth is None else depth})",
            self.module_table(depth, tablefmt),
        ]
        unsupported = self.unsupported_table(tablefmt)
        if unsupported:
            parts += ["Not counted (no rule; FLOPs of these ops are missing from the totals)", unsupported]
        return "\n\n".join(parts) + "\n"

    def to_markdown(self, depth: int | None = None) -> str:
        return self.render("github", depth)

    def __str__(self) -> str:
        return self.render()

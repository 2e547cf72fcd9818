"""The JSON of a report (:func:`to_dict`, schema version :data:`~.units.SCHEMA_VERSION`): exact
integers for bytes and FLOPs, what programs read.  Its keys are listed in ``docs/json.md``."""

from __future__ import annotations

from typing import Any

from ..results import ReportData
from .units import SCHEMA_VERSION
from .words import headline


def to_dict(report: ReportData, depth: int | None = None) -> dict[str, Any]:
    """Every number of ``report`` as a JSON-ready dict; ``depth``: of the ``modules`` rows."""
    t = report.tally
    return {
        "schema_version": SCHEMA_VERSION,
        "model": report.model_name,
        "capture": report.capture.mode,
        "capture_fallback": report.capture.fallback_reason,
        "assumptions": list(report.capture.assumptions),
        "loss": report.capture.loss_source,
        "optimizer": report.capture.optimizer_name,
        "device": report.device,
        "precision": report.precision,
        "mode": report.mode,
        "gpu": None if report.gpu is None else {"name": report.gpu.name, "memory": report.gpu.memory},
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
            **(report.memory.to_dict() if report.memory else {}),
        },
        "flops": {
            "forward": t.flops["forward"],
            "backward": t.flops["backward"],
            "total": t.flops["forward"] + t.flops["backward"],
            "matmul_forward": t.flops["matmul_forward"],
            "matmul_backward": t.flops["matmul_backward"],
            "optimizer": t.flops["optimizer"],
            "by_dtype": dict(t.flops_by_dtype),
            # every micro-batch of a gradient accumulation, and the optimizer step once
            "total_per_optimizer_step": report.capture.grad_accum * (t.flops["forward"] + t.flops["backward"])
            + t.flops["optimizer"],
        },
        "loop": ({"keep_output": report.capture.keep_output, "grad_accum": report.capture.grad_accum,
                  "zero_grad": report.capture.zero_grad,
                  **({"clip_grad_norm": report.capture.clip_grad_norm} if report.capture.clip_grad_norm else {})}
                 if report.mode == "train" else None),
        "checkpoint": report.checkpoint.to_dict() if report.checkpoint else None,
        "compile": dict(report.compiled) if report.compiled else None,
        "modules": [r.to_dict() for r in report.module_rows(depth)],
        "unsupported_ops": list(t.unsupported),
        "kernels": report.kernels,
        "step_time": report.step_time.to_dict() if report.step_time is not None else None,
        "headline": headline(report),
        "needed": report.needed,
        "fit": report.fit_dict(),
        "no_gradient": [dict(r) for r in t.no_gradient],
        "by_operator": report.by_operator(),
        "quantized": [q.to_dict() for q in report.quantized] if report.mode != "train" else None,
        "quantize": None if not report.quantize else {"scheme": report.quantize, "peak": report.quantized_peak},
        "generation": report.generation.to_dict() if report.generation is not None else None,
    }

"""What validate returns: each figure estimated and measured, with its error (:class:`Validation`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ROWS = ("parameters", "buffers", "gradients", "optimizer_state", "activations", "peak",
        "flops_forward", "flops_backward")
# the rows of the serving runs (estimator.validate.serving)
INFERENCE_ROWS = ("parameters", "buffers", "peak", "flops_forward")
GENERATE_ROWS = ("parameters", "buffers", "kv_cache", "peak_prefill", "peak_decode", "flops_prefill", "flops_decode")


@dataclass
class Validation:
    device: str
    device_name: str
    rows: dict[str, dict[str, float]]
    step_time_s: float
    achieved_flops_per_s: float
    mfu: float | None
    peak_flops_per_s: float | None
    tolerance: float  # percent
    notes: list[str] = field(default_factory=list)
    # the step time estimator.timing predicts for this GPU (CUDA runs), and whether it is calibrated
    predicted_step_time_s: float | None = None
    predicted_calibrated: bool | None = None
    mode: str = "train"  # train: step_time_s is a training step's; inference: a forward's; generate: generate()'s
    # generate: the prefill's forward and the last decode step's, measured (median) and predicted (CUDA runs)
    stage_times_s: dict[str, float] | None = None
    predicted_stage_times_s: dict[str, float | None] | None = None

    @property
    def ok(self) -> bool:
        return all(abs(r["error"]) * 100 <= self.tolerance for r in self.rows.values())

    def headline(self) -> str:
        """One line: within the tolerance or not, and the row furthest off."""
        worst = max(self.rows, key=lambda k: abs(self.rows[k]["error"]), default=None)
        off = f"; largest error {worst.replace('_', ' ')} {100 * self.rows[worst]['error']:+.2f}%" \
            if worst and self.rows[worst]["error"] else "; every row exact"
        return f"{'within' if self.ok else 'NOT within'} {self.tolerance:g}% on {self.device_name}{off}"

    def __repr__(self) -> str:  # a notebook cell's last line: the answer, not the dataclass's fields
        return f"<Validation ({self.mode}): {self.headline()}>"

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(self.headline())}\n\n{html.escape(self.render())}</pre>"

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "device_name": self.device_name, "rows": self.rows,
                "step_time_s": self.step_time_s, "achieved_flops_per_s": self.achieved_flops_per_s,
                "mfu": self.mfu, "peak_flops_per_s": self.peak_flops_per_s, "tolerance_percent": self.tolerance,
                "ok": self.ok, "notes": self.notes, "predicted_step_time_s": self.predicted_step_time_s,
                "predicted_calibrated": self.predicted_calibrated, "mode": self.mode,
                "stage_times_s": self.stage_times_s, "predicted_stage_times_s": self.predicted_stage_times_s}

    def render(self, tablefmt: str = "simple") -> str:
        from tabulate import tabulate

        from ..render import fmt_bytes, fmt_flops

        def value(name: str, v: float) -> str:
            """Every figure with its unit: bytes in binary units, FLOPs in decimal ones, exact value beside."""
            if name.startswith("flops"):
                return fmt_flops(v) + (f" ({v:,.0f})" if abs(v) >= 1000 else "")
            return fmt_bytes(v) + (f" ({v:,.0f} B)" if abs(v) >= 1024 else "")

        body = [[name.replace("_", " "), value(name, r["estimated"]), value(name, r["measured"]),
                 f"{100 * r['error']:+.2f}%", "ok" if abs(r["error"]) * 100 <= self.tolerance else "OFF"]
                for name, r in self.rows.items()]
        head = tabulate(body, headers=["", "estimated", "measured", "error", f"within {self.tolerance:g}%"],
                        tablefmt=tablefmt, disable_numparse=True, colalign=("left", "right", "right", "right", "left"))
        mfu = "unknown (pass --peak-tflops)" if self.mfu is None else f"{100 * self.mfu:.1f}%"
        what = {"train": "step time", "inference": "forward", "generate": "generate()"}[self.mode]
        lines = [f"device: {self.device_name}",
                 f"{what}: {_ms(self.step_time_s)} (median)"
                 f"{self._predicted(self.predicted_step_time_s, self.step_time_s)}"]
        for stage, seconds in (self.stage_times_s or {}).items():
            ahead = (self.predicted_stage_times_s or {}).get(stage)
            lines.append(f"  {STAGE_TEXT[stage]}: {_ms(seconds)} (median){self._predicted(ahead, seconds)}")
        lines.append(f"achieved{' (prefill)' if self.mode == 'generate' else ''}: "
                     f"{self.achieved_flops_per_s / 1e12:.3f} TFLOP/s, MFU {mfu}")
        tail = "\n".join(lines)
        return "\n".join([head, tail, *self.notes]) + "\n"


    def _predicted(self, predicted: float | None, measured: float) -> str:
        if predicted is None:
            return ""
        return (f", predicted {_ms(predicted)} ({100 * _error(predicted, measured):+.1f}%"
                f"{'' if self.predicted_calibrated else ', extrapolated constants'})")


STAGE_TEXT = {"prefill": "prefill (the prompt's forward)", "decode": "last decode step (one token's forward)"}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _error(est: float, meas: float) -> float:
    if meas == 0:
        return 0.0 if est == 0 else 1.0
    return (est - meas) / meas

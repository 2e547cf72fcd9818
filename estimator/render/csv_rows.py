"""CSV: one row per module (the JSON ``modules`` rows) or per aten op (the JSON ``by_operator``
rows), exact integers.
"""

from __future__ import annotations

import csv
import io

from ..results import ReportData

# -- csv ------------------------------------------------------------------
CSV_COLUMNS = ("path", "type", "output_shape", "params", "activations", "flops_forward", "flops_backward",
               "percent")
OPERATOR_CSV_COLUMNS = ("op", "count", "flops_forward", "flops_backward", "flops_optimizer", "saved_bytes", "kind")


def to_csv(report: ReportData, depth: int | None = None) -> str:
    """One row per module at ``depth`` (the JSON ``modules`` rows): exact integers, bytes and FLOPs."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in report.module_rows(depth):
        d = r.to_dict()
        d["percent"] = f"{r.percent:.4f}"
        writer.writerow([d[c] for c in CSV_COLUMNS])
    return buf.getvalue()


def operators_csv(report: ReportData) -> str:
    """One row per aten op (the JSON ``by_operator`` rows): exact integers."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(OPERATOR_CSV_COLUMNS)
    for r in report.tally.by_operator:
        writer.writerow([r[c] for c in OPERATOR_CSV_COLUMNS])
    return buf.getvalue()

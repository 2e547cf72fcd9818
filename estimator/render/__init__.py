"""How a report (:class:`~estimator.results.ReportData`) is shown, one module per format.

Every text, markdown and HTML report starts with the headline (:func:`headline`): the memory the
device needs (peak + reserve) and, for a GPU, whether it fits and the largest micro-batch.  The
report holds the numbers; everything here only formats them (memory in binary units, FLOPs in
decimal units, one multiply-add being 2 FLOPs).

* :mod:`.units`: units, labels and colours every format shares;
* :mod:`.words`: titles, places in the step, the headline;
* :mod:`.text`: text and markdown tables;
* :mod:`.csv_rows`: CSV per module or per op;
* :mod:`.json_dict`: the JSON (``to_dict``, schema version ``SCHEMA_VERSION``);
* :mod:`.svg`: the memory timeline as SVG;
* :mod:`.html_page`: the self-contained HTML page;
* :mod:`.plot`: PNG/SVG/PDF through matplotlib.
"""

from .csv_rows import CSV_COLUMNS, OPERATOR_CSV_COLUMNS, operators_csv, to_csv
from .html_page import to_html
from .json_dict import to_dict
from .plot import PLOT_SUFFIXES, plot, plot_formats
from .svg import MAX_SVG_POINTS, timeline_data, timeline_svg
from .text import module_table, no_gradient_table, operators_table, render, summary_rows, unsupported_table
from .units import (
    CATEGORY_COLORS, CATEGORY_LABEL, OPTIMIZER_NAMES, PHASE_NAMES, SCHEMA_VERSION, fmt_bytes, fmt_count, fmt_flops,
    fmt_gb, fmt_seconds, step_time_words,
)
from .words import headline, inputs_words, op_words, optimizer_words, place, title, training

__all__ = [
    "CSV_COLUMNS", "OPERATOR_CSV_COLUMNS", "operators_csv", "to_csv", "to_html", "to_dict", "PLOT_SUFFIXES", "plot",
    "plot_formats", "MAX_SVG_POINTS", "timeline_data", "timeline_svg", "module_table", "no_gradient_table",
    "operators_table", "render", "summary_rows", "unsupported_table", "CATEGORY_COLORS", "CATEGORY_LABEL",
    "OPTIMIZER_NAMES", "PHASE_NAMES", "SCHEMA_VERSION", "fmt_bytes", "fmt_count", "fmt_flops", "fmt_gb", "fmt_seconds",
    "step_time_words", "headline",
    "inputs_words", "op_words", "optimizer_words", "place", "title", "training",
]

"""The estimate of one step as users hold it: :class:`Report`, the numbers of
:class:`~estimator.results.ReportData` with their views (:mod:`estimator.render`) as methods.

``print(report)`` shows tables; ``report.to_dict()`` is JSON-ready (exact integers);
``to_markdown``, ``to_csv``, ``to_html`` and ``operators_csv`` are the other formats.
"""

from __future__ import annotations

from typing import Any

from . import render as _render
from .render import SCHEMA_VERSION, fmt_bytes, fmt_count, fmt_flops  # noqa: F401  (re-exported)
from .results import CheckpointWhatIf, ModuleRow, ReportData  # noqa: F401  (re-exported)
from .quantize import QuantizedWhatIf  # noqa: F401  (re-exported)


class Report(ReportData):
    """The estimate of one training step.  ``print(report)`` shows tables; ``to_dict()`` is JSON-ready."""

    CSV_COLUMNS = _render.CSV_COLUMNS

    def to_dict(self, depth: int | None = None) -> dict[str, Any]:
        """Every number (schema version ``SCHEMA_VERSION``; ``docs/json.md``); ``depth``: of the module rows."""
        return _render.to_dict(self, depth)

    def headline(self) -> str:
        """One line: the memory the device needs and, with a GPU, whether it fits and the largest micro-batch."""
        return _render.headline(self)

    def summary_rows(self) -> list[tuple[str, str]]:
        return _render.summary_rows(self)

    def module_table(self, depth: int | None = None, tablefmt: str = "simple") -> str:
        return _render.module_table(self, depth, tablefmt)

    def unsupported_table(self, tablefmt: str = "simple") -> str:
        return _render.unsupported_table(self, tablefmt)

    def render(self, tablefmt: str = "simple", depth: int | None = None, width: int | None = None,
               operators: bool = False) -> str:
        """Text (``tablefmt="simple"``) or markdown (``"github"``); ``width``: wrap to that many columns;
        ``operators``: add the per-operator table."""
        return _render.render(self, tablefmt, depth, width=width, operators=operators)

    def to_markdown(self, depth: int | None = None, operators: bool = False) -> str:
        return _render.render(self, "github", depth, operators=operators)

    def to_csv(self, depth: int | None = None) -> str:
        """One row per module at ``depth`` (the JSON ``modules`` rows): exact integers, bytes and FLOPs."""
        return _render.to_csv(self, depth)

    def to_html(self, depth: int | None = None) -> str:
        """A self-contained page; see :func:`estimator.render.html_page.to_html`."""
        return _render.to_html(self, depth)

    def operators_csv(self) -> str:
        """One row per aten op (the JSON ``by_operator`` rows)."""
        return _render.operators_csv(self)

    def __str__(self) -> str:
        return self.render()

    def __repr__(self) -> str:
        """The headline (a notebook cell or a REPL shows this, not every field of the capture)."""
        return f"<Report of {self.model_name or 'a model'}: {self.headline()}>"

    def _repr_html_(self) -> str:
        """The HTML report inline in a notebook: the page of :meth:`to_html` in an iframe (its styles and its
        hover script stay inside it; the notebook's own are untouched)."""
        import html

        return (f'<iframe srcdoc="{html.escape(self.to_html(), quote=True)}" title="{html.escape(self.headline())}" '
                f'style="width:100%;height:760px;border:1px solid #ddd;border-radius:4px"></iframe>')

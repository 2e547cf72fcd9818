"""Command line: ``estimator estimate SPEC ...``, ``validate``, ``plan``, ``hardware`` (see :mod:`.main`)."""

from .main import build_parser, main
from .plan import parse_count

__all__ = ["build_parser", "main", "parse_count"]

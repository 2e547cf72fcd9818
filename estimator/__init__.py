"""estimator: what one training step of a PyTorch model costs, before you train.

    >>> from estimator import estimate
    >>> report = estimate(model, inputs, optimizer="adamw")
    >>> print(report)
    >>> report.to_dict()
"""

from . import compat as _compat  # noqa: F401  (first: says which torch release is needed)
from .build import build_empty, empty_weights
from .errors import UserError
from .api import estimate
from .report import Report
from .rules import MATMUL, OTHER, ZERO, register, register_zero

__all__ = ["estimate", "Report", "UserError", "register", "register_zero", "MATMUL", "OTHER", "ZERO",
           "empty_weights", "build_empty"]
__version__ = "0.1.0"

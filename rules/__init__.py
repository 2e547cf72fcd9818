"""Per-op cost rules: one registry (``registry.py``), one module per op family.

Importing this package registers every built-in rule.
"""

from .registry import (  # noqa: F401
    KINDS,
    MATMUL,
    OTHER,
    ZERO,
    OpCall,
    Rule,
    TensorSpec,
    bind,
    lookup,
    register,
    register_zero,
    registered_ops,
)

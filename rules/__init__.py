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

from .registry import aten_ops  # noqa: F401,E402

# The built-in rule families: importing each registers its rules.
from . import (  # noqa: F401,E402
    matmul,
    conv,
    attention,
    rnn,
    norm,
    elementwise,
    reduction,
    pooling,
    losses,
    embedding,
    zero,
    modules,
    distributed,
    detection,
    fft,
    quantization,
    linalg,
)
from .modules import module_buffers, module_formula, module_param_formula, register_module  # noqa: F401,E402

"""torchvision as the test extras install it, for the test processes (pytest's, and the real runs' workers, which
import nothing from ``estimator``): PyPI's wheel links the CUDA torch's libraries, so beside the CPU torch its
import fails registering fake kernels for two operators ("operator torchvision::nms does not exist"), and so
does transformers' (it imports torchvision whenever it is installed).  :func:`load` defines those two schemas
as torchvision's ``csrc/ops/nms.cpp`` does and imports it; the library's own copy of this is
``estimator.compat.import_torchvision``, which the loaders use."""

from __future__ import annotations

import sys
from typing import Any

import torch

_LIBRARY: list[Any] = []


def load() -> Any:
    """torchvision, or None where it is not installed."""
    try:
        import torchvision

        return torchvision
    except ImportError:
        return None
    except RuntimeError as exc:
        if "torchvision::nms" not in str(exc) or _LIBRARY:
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    lib = torch.library.Library("torchvision", "FRAGMENT")  # noqa: TOR901
    for op in ("nms", "qnms"):
        if not hasattr(torch.ops.torchvision, op):
            lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _LIBRARY.append(lib)
    import torchvision

    return torchvision

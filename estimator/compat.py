"""What differs between the Python and torch releases the project supports, looked up in one place.

Optional ops and private APIs are looked up here and return None when this build lacks them;
callers check for None and fall back (a missing op is never a reason to trace on real tensors).
"""

from __future__ import annotations

import enum
from typing import Any

import torch

# The torch releases this project is tested on: 2.11 (the CUDA reference steps' release) and 2.13 (CI).
MIN_TORCH = (2, 11)


def torch_version(text: str | None = None) -> tuple[int, int]:
    """(major, minor) of ``text`` (default: the installed torch)."""
    major, minor = (text or torch.__version__).split("+")[0].split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


if torch_version() < MIN_TORCH:  # pragma: no cover - pip's requirement keeps this from happening
    raise ImportError(f"estimator needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (found {torch.__version__}); "
                      f"upgrade with: pip install 'torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}'")

try:
    StrEnum = enum.StrEnum  # Python >= 3.11
except AttributeError:  # pragma: no cover - Python 3.10
    class StrEnum(str, enum.Enum):  # type: ignore[no-redef]
        """Members are their string values (``str(m)``, ``f"{m}"``, JSON, hashing)."""

        __str__ = str.__str__
        __format__ = str.__format__


def optional_op(packet: str, overload: str = "default") -> Any:
    """``torch.ops.aten.<packet>.<overload>``, or None where this torch build lacks the op."""
    try:
        return getattr(getattr(torch.ops.aten, packet), overload)
    except (AttributeError, RuntimeError):
        return None


def optional_attr(obj: Any, *path: str) -> Any:
    """``obj.a.b...`` for ``path = ("a", "b", ...)``, or None where any step is missing."""
    for name in path:
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


_TORCHVISION_LIBRARY: list[Any] = []  # the schemas' library, kept alive for the process


def import_torchvision() -> Any:
    """torchvision, imported also where its C++ library cannot load.

    PyPI's torchvision wheels link the CUDA torch's libraries (``libtorch_cuda.so``, ``libc10_cuda.so``):
    beside a CPU torch of the same release (the README's ``torch==2.13.0``) the C++ library does not
    load, and the import fails registering Python fake kernels for two of its operators ("operator
    torchvision::nms does not exist"), which breaks transformers too (it imports torchvision whenever it
    is installed).  Those two schemas are defined as torchvision's ``csrc/ops/nms.cpp`` defines them and
    the import is retried: the models are pure PyTorch, and a model that calls torchvision's C++
    operators (the R-CNNs' RoI align, any detector's NMS after inference) fails in torchvision, naming
    them.  None where torchvision is not installed; any other failure as it is."""
    import sys

    try:
        import torchvision

        return torchvision
    except ImportError:
        return None
    except RuntimeError as exc:
        if "torchvision::nms" not in str(exc) or _TORCHVISION_LIBRARY:
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]  # the half-imported package
    lib = torch.library.Library("torchvision", "FRAGMENT")  # noqa: TOR901
    for op in ("nms", "qnms"):
        if not hasattr(torch.ops.torchvision, op):
            lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _TORCHVISION_LIBRARY.append(lib)
    import torchvision

    return torchvision


def torchvision_has_ops() -> bool:
    """Whether torchvision's C++ operators loaded (False where :func:`import_torchvision` stood in)."""
    extension = __import__("sys").modules.get("torchvision.extension")
    return bool(extension is not None and extension._has_ops())

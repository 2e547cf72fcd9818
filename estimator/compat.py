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

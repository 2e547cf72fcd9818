"""What differs between the Python and torch releases the project supports, looked up in one place.

Optional ops and private APIs are looked up here and return None when this build lacks them;
callers check for None and fall back (a missing op is never a reason to trace on real tensors).
"""

from __future__ import annotations

import enum
from typing import Any

import torch

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

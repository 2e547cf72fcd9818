"""Every number of ``report.to_dict()`` of every zoo model equals the golden file.

The golden file (``tests/golden/to_dict.json.gz``, written by ``tests/golden/make.py``) is the
guard for pure refactors: moving code must not move a number.  A deliberate change of behaviour
rewrites the file in its own commit, with the reason in the message.

The numbers are those of one torch release (the file's ``_torch``; CI's): another release
decomposes some ops differently and the CUDA target's kernel choices follow the release, so on
another release the comparison is skipped, not loosened.
"""

from __future__ import annotations

import gzip
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden"))
import make  # noqa: E402

with gzip.open(make.PATH, "rt") as _f:
    GOLDEN = json.load(_f)


def _diff(expected, actual, path="") -> list[str]:
    """Every leaf of ``expected`` that ``actual`` lacks or changes (paths like memory.peak); keys only
    ``actual`` has are additions the schema allows within a version."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = []
        for k in sorted(set(expected) | set(actual)):
            if k not in actual:
                out.append(f"{path}{k}: missing")
            elif k not in expected:
                continue  # a key added within the schema version moves no number
            else:
                out += _diff(expected[k], actual[k], f"{path}{k}.")
        return out
    if isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        return [d for i, (e, a) in enumerate(zip(expected, actual)) for d in _diff(e, a, f"{path}{i}.")]
    return [] if expected == actual else [f"{path.rstrip('.')}: {expected!r} -> {actual!r}"]


@pytest.mark.parametrize("name", make.cases())
@pytest.mark.parametrize("device,precision", make.VARIANTS)
def test_to_dict_unchanged(name, device, precision):
    if GOLDEN.get(make.TORCH_KEY) != make.torch_release():
        pytest.skip(f"the golden numbers are torch {GOLDEN.get(make.TORCH_KEY)}'s; this is {make.torch_release()}")
    if name.startswith("hf_"):
        pytest.importorskip("transformers")
    actual = json.loads(json.dumps(make.snapshot(name, device, precision)))
    diffs = _diff(GOLDEN[make.key(name, device, precision)], actual)
    assert not diffs, f"{len(diffs)} numbers moved, e.g.:\n" + "\n".join(diffs[:15])

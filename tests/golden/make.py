"""Golden ``to_dict()`` of every zoo model: the guard for pure refactors.

    python tests/golden/make.py            # rewrite tests/golden/to_dict.json.gz from the current code

``tests/test_golden.py`` compares every number of ``report.to_dict()`` with this file: a
refactor must leave it unchanged.  A change of behaviour rewrites it in its own commit, whose
message says which numbers moved and why.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
ROOT = os.path.dirname(TESTS)
for _p in (TESTS, ROOT):
    if _p not in sys.path:
        sys.path.insert(0, _p)

PATH = os.path.join(HERE, "to_dict.json.gz")
# (device, precision) variants: the CPU target at fp32 (what the accuracy tests measure) and
# the CUDA target in bf16-mixed (kernel routing, autocast, allocator rounding)
VARIANTS = (("cpu", "fp32"), ("cuda", "bf16-mixed"))


def cases() -> list[str]:
    import zoo

    return [name for name in zoo.ZOO if name != "branchy"]  # branchy: a real-tensor fallback, timing-dependent


def snapshot(name: str, device: str, precision: str) -> dict:
    import torch

    import zoo
    from estimator import estimate

    torch.set_num_threads(min(2, torch.get_num_threads()))
    model, inputs, loss_fn = zoo.ZOO[name]()
    return estimate(model, inputs, loss_fn=loss_fn, device=device, precision=precision).to_dict()


def key(name: str, device: str, precision: str) -> str:
    return f"{name}/{device}/{precision}"


TORCH_KEY = "_torch"  # the torch release (major.minor) the file was written with


def torch_release() -> str:
    import torch

    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def main() -> None:
    logging.getLogger("estimator").setLevel(logging.ERROR)
    out = {TORCH_KEY: torch_release()}
    for name in cases():
        for device, precision in VARIANTS:
            out[key(name, device, precision)] = snapshot(name, device, precision)
            print(key(name, device, precision), file=sys.stderr)
    with gzip.open(PATH, "wt") as f:
        json.dump(out, f, sort_keys=True, separators=(",", ":"))


if __name__ == "__main__":
    main()

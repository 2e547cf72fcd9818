"""A card the hardware table lacks, described in a JSON file: ``--gpu path/to/gpu.json``.

The fields are those ``estimator hardware --format json`` prints for every card (copy one entry and
edit it)::

    {"name": "My-GPU", "memory_gb": 48, "total_memory_bytes": 51160023040, "bandwidth_gbs": 768,
     "peak_tflops": {"fp32": 38.7, "tf32": 77.4, "bf16": 154.8, "fp16": 154.8, "fp8": null},
     "arch": "8.6", "sms": 84, "clock_mhz": 1800, "tdp_w": 300, "l2_mb": 6,
     "links": {"intra_node": "pcie4", "host": "pcie4", "inter_node": "eth-100g"}}

Required: ``name``, ``memory_gb``, ``bandwidth_gbs`` and ``peak_tflops`` with ``fp32``.  The others
are optional: without ``total_memory_bytes`` the capacity is the datasheet figure times the H100's
measured ratio (``estimator.hardware.H100_RATIO``); without ``sms``, ``clock_mhz`` or ``tdp_w`` the
time model leaves out what they carry (wave quantisation, the power limit) and says so; without
``links`` (the names of ``estimator.hardware.LINKS``) the planner takes PCIe 4 inside a node and
400 Gb/s InfiniBand between nodes.  Every
mistake is one line naming the field (a :class:`~estimator.errors.UserError`: exit code 2, no
traceback).  This module reads and checks the file; ``estimator.hardware.gpu_from_json`` builds the
GPU from it.
"""

from __future__ import annotations

import difflib
import json
import os
from typing import Any

from .errors import UserError

_NUMBER = (int, float)
REQUIRED = ("name", "memory_gb", "bandwidth_gbs", "peak_tflops")
# field -> (types, positive number, what it is)
FIELDS: dict[str, tuple[tuple[type, ...], bool, str]] = {
    "name": ((str,), False, "a name, e.g. \"My-GPU\""),
    "memory_gb": (_NUMBER, True, "the datasheet's memory in GB (10^9 bytes), e.g. 48"),
    "total_memory_bytes": ((int,), True, "bytes torch reports (torch.cuda.get_device_properties(0).total_memory)"),
    "bandwidth_gbs": (_NUMBER, True, "memory bandwidth in GB/s, e.g. 768"),
    "peak_tflops": ((dict,), False, "dense peak TFLOP/s per dtype, e.g. {\"fp32\": 38.7, \"bf16\": 154.8}"),
    "arch": ((str, list), False, "the CUDA compute capability, e.g. \"8.6\""),
    "sms": ((int,), True, "streaming multiprocessors (AMD: compute units), e.g. 84"),
    "clock_mhz": (_NUMBER, True, "the boost clock in MHz, e.g. 1800"),
    "tdp_w": (_NUMBER, True, "the board power limit in W, e.g. 300"),
    "l2_mb": (_NUMBER, True, "the L2 cache in MB, e.g. 6"),
    "process_nm": (_NUMBER, True, "the chip's process node in nm, e.g. 8 (default: from arch)"),
    "aliases": ((list,), False, "other names, e.g. [\"my gpu\"]"),
    "links": ((dict,), False, "the links of its system, e.g. {\"intra_node\": \"nvlink4\", \"host\": \"pcie5\", "
                              "\"inter_node\": \"ib-ndr\"}"),
    "total_memory_source": ((str,), False, "where total_memory_bytes comes from"),
}
PEAK_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
LINK_ROLES = ("intra_node", "host", "inter_node")  # the keys of "links"



def read_gpu_file(path: str) -> dict[str, Any]:
    """The checked fields of the GPU described in ``path`` (one JSON object, or a list of one)."""
    where = f"--gpu {path}"
    if not os.path.isfile(path):
        raise UserError(f"{where}: no such file (a GPU name, or a JSON file with the fields of "
                        f"'estimator hardware --format json')")
    try:
        with open(path) as fh:
            data = json.load(fh)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{where}: cannot read it ({exc})") from None
    if isinstance(data, list):
        if len(data) != 1:
            raise UserError(f"{where}: holds {len(data)} entries; put one GPU (one JSON object) in the file")
        data = data[0]
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a JSON object with the fields of 'estimator hardware --format json', "
                        f"not {type(data).__name__}")
    check_fields(data, where)
    return data


def check_fields(data: dict[str, Any], where: str) -> None:
    """Raise a one-line UserError for the first wrong field of ``data``."""
    for key in data:
        if key not in FIELDS:
            close = difflib.get_close_matches(key, list(FIELDS), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known fields: {', '.join(FIELDS)}"
            raise UserError(f"{where}: unknown field {key!r}; {hint}")
    for key in REQUIRED:
        if data.get(key) is None:
            raise UserError(f"{where}: missing field {key!r} ({FIELDS[key][2]})")
    for key, value in data.items():
        types, positive, what = FIELDS[key]
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, types):
            raise UserError(f"{where}: {key} must be {what}, not {json.dumps(value)}")
        if positive and not value > 0 or isinstance(value, float) and value == float("inf"):  # (NaN fails > 0)
            raise UserError(f"{where}: {key} must be a finite number > 0, not {json.dumps(value)}")
    _check_peaks(data["peak_tflops"], where)
    _check_arch(data.get("arch"), where)
    _check_links(data.get("links"), where)
    total, memory = data.get("total_memory_bytes"), float(data["memory_gb"]) * 1e9
    if total is not None and not 0.5 * memory <= total <= 1.2 * memory:
        raise UserError(f"{where}: total_memory_bytes {total} is not within 50-120 % of memory_gb "
                        f"({data['memory_gb']} GB = {memory:.0f} bytes): give bytes, as torch reports them")
    if not str(data["name"]).strip():
        raise UserError(f"{where}: name must not be empty")


def _check_peaks(peaks: dict, where: str) -> None:
    for key, value in peaks.items():
        if key not in PEAK_DTYPES:
            raise UserError(f"{where}: peak_tflops has unknown dtype {key!r}; use {', '.join(PEAK_DTYPES)}")
        if value is not None and (isinstance(value, bool) or not isinstance(value, _NUMBER) or not 0 < value < 1e9):
            raise UserError(f"{where}: peak_tflops.{key} must be a positive number of TFLOP/s or null, "
                            f"not {json.dumps(value)}")
    if not peaks.get("fp32"):
        raise UserError(f"{where}: peak_tflops needs fp32 (the non-tensor-core peak in TFLOP/s, e.g. 38.7)")


def _check_links(links: Any, where: str) -> None:
    """The keys of ``links``; their values are checked against the known links where the GPU is built
    (``estimator.hardware.gpu_from_json``)."""
    for role, name in (links or {}).items():
        if role not in LINK_ROLES:
            raise UserError(f"{where}: links has unknown key {role!r}; use {', '.join(LINK_ROLES)}")
        if not isinstance(name, str):
            raise UserError(f"{where}: links.{role} must be a link name such as \"nvlink4\", not {json.dumps(name)}")


def _check_arch(arch: Any, where: str) -> None:
    if arch is None:
        return
    parts = arch if isinstance(arch, list) else str(arch).split(".")
    if len(parts) != 2 or not all(str(p).isdigit() for p in parts):
        raise UserError(f"{where}: arch must be a compute capability like \"8.6\", not {json.dumps(arch)}")

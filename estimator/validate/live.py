"""What every live run of validate needs: a private copy of the model with real weights on the device, real
inputs, the room to run, the device's name and peak."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..errors import UserError


def materialize_model(model: torch.nn.Module, device: torch.device, dtype: torch.dtype | None) -> torch.nn.Module:
    """A private copy of ``model`` on ``device`` with real weights (random if it had none)."""
    meta = any(t.device.type == "meta" for t in list(model.parameters()) + list(model.buffers()))
    m = copy.deepcopy(model)  # keeps tied weights tied
    if meta:
        tied: dict[int, list[str]] = {}
        for name, p in m.named_parameters(remove_duplicate=False):
            tied.setdefault(id(p), []).append(name)
        m = m.to_empty(device=device)  # makes one tensor per name: tie them again
        for names in tied.values():
            for name in names[1:]:
                owner, _, attr = name.rpartition(".")
                setattr(m.get_submodule(owner), attr, m.get_parameter(names[0]))
        with torch.no_grad():
            for mod in m.modules():
                if hasattr(mod, "reset_parameters"):
                    try:
                        mod.reset_parameters()
                        continue
                    except Exception:  # noqa: BLE001 - fall back to a plain init
                        pass
                for p in mod.parameters(recurse=False):
                    p.normal_(0, 0.02) if p.is_floating_point() else p.zero_()
                for b in mod.buffers(recurse=False):
                    b.fill_(1) if b.is_floating_point() else b.zero_()
    else:
        m = m.to(device)
    if dtype is not None:
        m = m.to(dtype)
    return m


def materialize_inputs(inputs: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    def real(t: torch.Tensor) -> torch.Tensor:
        if t.device.type == "meta":
            t = torch.randn(t.shape, dtype=t.dtype) if t.is_floating_point() else torch.zeros(t.shape, dtype=t.dtype)
        grad = t.requires_grad and t.is_leaf  # (an input that takes a gradient keeps asking for it)
        t = t.detach().to(device)
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        return t.requires_grad_(grad) if grad else t

    return pytree.tree_map_only(torch.Tensor, real, inputs)


def check_room(device: str, est: dict[str, Any], force: bool) -> None:
    """Refuse a run that would not fit (unless ``force``)."""
    if device == "cuda":
        free, _total = torch.cuda.mem_get_info()
        need = est["memory"]["peak"] + sum(est["memory"].get("reserve", {}).values())
    else:
        import os

        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        need = 2 * est["memory"]["peak"]  # the model copy plus the step
    if need > free and not force:
        raise UserError(f"the run needs about {need / 2**30:.2f} GiB but {free / 2**30:.2f} GiB is free on {device}; "
                        f"use smaller inputs or --force")


def device_peak(device: str, policy: Any, gpu: Any, peak_tflops: float | None) -> tuple[str, float | None, list[str]]:
    """(device name, dense peak FLOP/s for the step's matmul dtype or None, notes)."""
    notes = []
    if device != "cuda":
        return "cpu", (peak_tflops * 1e12 if peak_tflops else None), notes
    name = torch.cuda.get_device_name()
    key = {"bf16": "bf16", "fp16": "fp16", "bf16-mixed": "bf16", "fp16-mixed": "fp16"}.get(policy.name)
    if key is None:
        key = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"
    peak = peak_tflops * 1e12 if peak_tflops else (gpu.peak_flops(key) if gpu else None)
    if gpu is None and not peak_tflops:
        notes.append(f"unknown GPU {name!r}: MFU needs --peak-tflops")
    return name, peak, notes

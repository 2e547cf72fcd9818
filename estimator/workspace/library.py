"""What the CUDA libraries add to a captured step (:func:`library_memory`): the cuBLAS workspaces,
every op's kernel temporary (the rules registered with ``@transient``), and the outputs the CUDA
kernel does not place on the GPU (the memory-efficient attention kernel's RNG seed and offset are
host tensors when there is no dropout: :func:`device_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..graph import OpNode
from ..target import CudaTarget
from .cublas import GEMMS, cublas_workspace_bytes, cublaslt_workspace_bytes, thread_of, uses_cublaslt
from .layout import TRANSIENT, layout_of

aten = torch.ops.aten

# -- outputs the CUDA kernel leaves off the GPU -------------------------------------------------------


def device_bytes(node: OpNode, index: int, nbytes: int) -> int:
    """Bytes output ``index`` of ``node`` takes on the GPU (the fake kernel says ``nbytes``)."""
    if node.target is aten._scaled_dot_product_efficient_attention.default and index in (2, 3):
        dropout = node.args[5] if len(node.args) > 5 else node.kwargs.get("dropout_p", 0.0)
        return nbytes if dropout else 0  # philox seed/offset: host tensors without dropout
    return nbytes


# -- the whole step ------------------------------------------------------------------------------------


@dataclass
class LibraryMemory:
    """What the CUDA libraries add to a captured step (see the module docstring)."""

    transients: dict[int, int] = field(default_factory=dict)  # node index -> bytes during the op
    persistent: list[tuple[int, int, str]] = field(default_factory=list)  # (node index, bytes, what), kept
    resize: dict[int, int] = field(default_factory=dict)  # sid -> bytes on the GPU


def library_memory(cap: Any, target: CudaTarget) -> LibraryMemory:
    """The cuBLAS workspaces, kernel temporaries and device sizes of every op of ``cap``."""
    from ..tally import op_call

    out = LibraryMemory()
    seen: set[str] = set()
    ws = cublas_workspace_bytes(target)
    lt = cublaslt_workspace_bytes()
    for index, node in enumerate(cap.nodes):
        target_op = node.target
        if id(target_op) in GEMMS:
            thread = thread_of(node)
            if thread not in seen:
                seen.add(thread)
                out.persistent.append((index, ws, f"cuBLAS workspace ({thread} thread)"))
            if f"lt:{thread}" not in seen and uses_cublaslt(node):
                seen.add(f"lt:{thread}")
                out.persistent.append((index, lt, f"cuBLASLt workspace ({thread} thread)"))
        rule = TRANSIENT.get(getattr(target_op, "overloadpacket", None))
        if rule is not None:
            try:
                nbytes = int(rule(op_call(node), target, layout_of(node)))
            except Exception as exc:  # a rule that cannot handle these arguments is a bug: say where
                raise RuntimeError(f"transient rule for {target_op} failed on {node.format_node()}: {exc}") from exc
            if nbytes > 0:
                out.transients[index] = nbytes
        for i, (sid, spec) in enumerate(zip(node.meta.get("storage", ()), node.meta.get("spec", ()))):
            nbytes = cap.storage_bytes[sid]
            on_device = device_bytes(node, i, nbytes)
            if on_device != nbytes:
                out.resize[sid] = on_device
    return out

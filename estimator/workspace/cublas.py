"""cuBLAS and cuBLASLt workspaces: one per cuBLAS handle, i.e. per thread that runs a GEMM (the
thread of the forward pass and optimizer step, and autograd's device thread for backward),
allocated at the first GEMM of each thread and kept (the reference H100 steps hold 64 MiB of
them in training, 32 MiB in inference).  Size: ``CUBLAS_WORKSPACE_CONFIG`` when set, else
``:4096:8`` = 32 MiB on sm90 and newer, ``:4096:2:16:8`` = 8 MiB + 128 KiB before
(``aten/src/ATen/cuda/CublasHandlePool.cpp``: ``getChosenWorkspaceSize``).  A thread that runs an
``addmm`` through cuBLASLt (a 1-D bias fused in the epilogue: ``Blas.cpp``,
``isInputCompliesAddmmCudaLt``) also gets a cuBLASLt workspace of 1 MiB
(``CUBLASLT_WORKSPACE_SIZE``, in KiB); the reference steps show 65 MiB for models with biased
linear layers, 66 MiB when checkpointing recomputes them in backward.
"""

from __future__ import annotations

import os

import torch

from ..graph import OpNode
from ..target import CudaTarget
from .layout import MiB

aten = torch.ops.aten

# -- cuBLAS ------------------------------------------------------------------------------------------


def cublas_workspace_bytes(target: CudaTarget, config: str | None = None) -> int:
    """One cuBLAS handle's workspace: ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE_KiB:COUNT`` pairs), else the
    default of the architecture (``getChosenWorkspaceSize``)."""
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG") if config is None else config
    if config:
        parts = [p for p in config.split(":") if p]
        try:
            pairs = [(int(parts[i]), int(parts[i + 1])) for i in range(0, len(parts) - 1, 2)]
            if pairs:
                return sum(kib * 1024 * count for kib, count in pairs)
        except ValueError:
            pass
    if target.arch >= (9, 0):
        return 4096 * 1024 * 8  # ":4096:8"
    return 4096 * 1024 * 2 + 16 * 1024 * 8  # ":4096:2:16:8"


def cublaslt_workspace_bytes() -> int:
    """The cuBLASLt workspace: ``CUBLASLT_WORKSPACE_SIZE`` KiB, default 1024."""
    try:
        return int(os.environ.get("CUBLASLT_WORKSPACE_SIZE", "1024")) * 1024
    except ValueError:
        return MiB


GEMMS = frozenset(map(id, (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
                            aten.addmv.default, aten.mv.default, aten.dot.default, aten.addbmm.default)))


def thread_of(node: OpNode) -> str:
    """The host thread that issues ``node``: autograd's device thread runs backward on CUDA."""
    return "autograd" if node.meta.get("phase") == "backward" else "main"


def uses_cublaslt(node: OpNode) -> bool:
    """``isInputCompliesAddmmCudaLt`` for an ``addmm`` (CUDA build): a contiguous 1-D bias fused in the
    epilogue, beta == 1, a 2-D contiguous result, float/half/bf16, both matrices larger than 1 x 1."""
    if node.target is not aten.addmm.default:
        return False
    args = node.args
    bias, mat1, mat2 = (a.meta["spec"][0] if isinstance(a, OpNode) else None for a in args[:3])
    if bias is None or mat1 is None or mat2 is None:
        return False
    beta = node.kwargs.get("beta", args[3] if len(args) > 3 else 1)
    bias_ok = len(bias.shape) == 1 or sum(1 for s in bias.shape if s != 1) <= 1
    return (beta == 1 and bias_ok and bias.shape[-1] == mat2.shape[1]
            and mat1.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64)
            and min(mat1.shape[0], mat1.shape[1], mat2.shape[0], mat2.shape[1]) > 1)

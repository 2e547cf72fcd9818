"""Memory the CUDA libraries take inside the caching allocator that no op returns.

``torch.cuda.max_memory_allocated()`` counts everything the caching allocator hands out, which
includes, besides the tensors of the step (what the capture records):

* **cuBLAS workspaces**, one per cuBLAS handle, i.e. per thread that runs a GEMM: the thread of
  the forward pass and optimizer step, and autograd's device thread for backward.  They are
  allocated at the first GEMM of each thread and kept (the reference H100 steps hold 64 MiB of
  them in training, 32 MiB in inference).  Size: ``CUBLAS_WORKSPACE_CONFIG`` when set, else
  ``:4096:8`` = 32 MiB on sm90 and newer, ``:4096:2:16:8`` = 8 MiB + 128 KiB before
  (``aten/src/ATen/cuda/CublasHandlePool.cpp``: ``getChosenWorkspaceSize``).  A thread that runs
  an ``addmm`` through cuBLASLt (a 1-D bias fused in the epilogue: ``Blas.cpp``,
  ``isInputCompliesAddmmCudaLt``) also gets a cuBLASLt workspace of 1 MiB
  (``CUBLASLT_WORKSPACE_SIZE``, in KiB); the reference steps show 65 MiB for models with biased
  linear layers, 66 MiB when checkpointing recomputes them in backward.
* **Kernel temporaries**: workspaces allocated inside one op and freed before it returns
  (cuDNN convolution and attention workspaces, reduction buffers, sort buffers): per-op rules,
  registered like the FLOP rules (:func:`transient`), pure functions of the op's arguments.
* **Outputs the CUDA kernel does not place on the GPU**: the memory-efficient attention
  kernel's RNG seed and offset are host tensors when there is no dropout (:func:`device_bytes`).

:func:`library_memory` applies them to a captured step; :func:`estimator.memory.simulate` adds
them to the timeline.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .graph import OpNode
from .rules.registry import OpCall, TensorSpec
from .target import CudaTarget

aten = torch.ops.aten
MiB = 1 << 20

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


_GEMMS = frozenset(map(id, (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
                            aten.addmv.default, aten.mv.default, aten.dot.default, aten.addbmm.default)))


def _thread(node: OpNode) -> str:
    """The host thread that issues ``node``: autograd's device thread runs backward on CUDA."""
    return "autograd" if node.meta.get("phase") == "backward" else "main"


def _uses_cublaslt(node: OpNode) -> bool:
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


# -- per-op temporaries ------------------------------------------------------------------------------

TransientRule = Callable[[OpCall, CudaTarget], int]
_TRANSIENT: dict[Any, TransientRule] = {}


def transient(*ops: Any) -> Callable[[TransientRule], TransientRule]:
    """Register ``fn(call, target) -> bytes`` as the temporary memory ``ops`` take while they run."""

    def decorator(fn: TransientRule) -> TransientRule:
        for op in ops:
            _TRANSIENT[getattr(op, "overloadpacket", op)] = fn
        return fn

    return decorator


def _bytes(spec: TensorSpec | None, dtype: torch.dtype | None = None) -> int:
    if spec is None:
        return 0
    return spec.numel * (dtype or spec.dtype).itemsize


@transient(aten._scaled_dot_product_cudnn_attention)
def _cudnn_attention(call: OpCall, target: CudaTarget) -> int:
    """512 B: the reference H100 steps show 512 bytes above the outputs in every cuDNN forward."""
    return 512


@transient(aten._scaled_dot_product_cudnn_attention_backward)
def _cudnn_attention_backward(call: OpCall, target: CudaTarget) -> int:
    """2|Q| + |logsumexp| + 512 B, and 2|Q| more with grouped-query heads (the gradients of the K/V heads
    at the query's head count, summed after).  Fitted on the reference H100 steps: GPT-2 (B8 H12
    L1024 D64 bf16) 25,559,552 B; BERT, T5 (B8 H8 L512 D64) 8,520,192 B; Llama (B4, 16 query and 4
    KV heads, L1024 D64) 33,817,088 B: the formula gives each exactly."""
    q, k, lse = call["query"], call["key"], call["logsumexp"]
    gqa = k.shape[-3] != q.shape[-3]
    return (4 if gqa else 2) * _bytes(q) + _bytes(lse) + 512


@transient(aten._scaled_dot_product_efficient_attention_backward)
def _efficient_attention_backward(call: OpCall, target: CudaTarget) -> int:
    """|Q in float32| + 2|logsumexp|: the float32 gradient accumulator and the row-wise delta.
    Reference H100 steps (fp32): GPT-2 (B8 H12 L1024 D64) 25,952,256 B, BERT/T5 (B8 H8 L512) 8,650,752 B,
    the examples' GPT (B8 H8 L256) 4,325,376 B: the formula gives each exactly."""
    q, lse = call["query"], call["logsumexp"]
    return _bytes(q, torch.float32) + 2 * _bytes(lse)


@transient(aten._scaled_dot_product_flash_attention_backward)
def _flash_attention_backward(call: OpCall, target: CudaTarget) -> int:
    """flash-attn 2's backward buffers (``flash_api.cpp`` ``mha_bwd``): ``softmax_d`` (B, H, L rounded up to
    128) and ``dq_accum`` (B, L rounded to 128, H, D rounded to 32) in float32.  Not measured here (the
    reference GPU runs cuDNN attention)."""
    q = call["query"]
    b, h, length, d = q.shape
    l_r = -(-length // 128) * 128
    d_r = -(-d // 32) * 32
    return 4 * b * h * l_r + 4 * b * l_r * h * d_r


@transient(aten._cudnn_rnn, aten._cudnn_rnn_backward)
def _cudnn_rnn_workspace(call: OpCall, target: CudaTarget) -> int:
    """cuDNN's RNN workspace, scaled from the one configuration measured (reference H100 steps: a 2-layer
    LSTM, hidden 512, 128 steps, batch 16: forward 57,672,192 B in float32, 37,028,352 B in float16;
    backward 131,072 B / 65,536 B more): ``a + b x itemsize`` per layer, step, sequence and hidden unit
    (a = 16,384,512, b = 10,321,920 for those 2 x 128 x 16 x 512 = 2,097,152 units)."""
    input = call["input"]
    weight = call["weight"]
    hidden, layers = call["hidden_size"], call["num_layers"]
    directions = 2 if call["bidirectional"] else 1
    seq, batch = (input.shape[1], input.shape[0]) if call["batch_first"] else (input.shape[0], input.shape[1])
    units = layers * directions * seq * batch * hidden
    itemsize = input.dtype.itemsize
    forward = units / 2_097_152 * (16_384_512 + 10_321_920 * itemsize)
    backward = 65_536 * itemsize / 2 * units / 2_097_152 if call.op.overloadpacket is aten._cudnn_rnn_backward else 0
    return int(forward + backward) if weight else 0


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
    from .tally import op_call

    out = LibraryMemory()
    seen: set[str] = set()
    ws = cublas_workspace_bytes(target)
    lt = cublaslt_workspace_bytes()
    for index, node in enumerate(cap.nodes):
        target_op = node.target
        if id(target_op) in _GEMMS:
            thread = _thread(node)
            if thread not in seen:
                seen.add(thread)
                out.persistent.append((index, ws, f"cuBLAS workspace ({thread} thread)"))
            if f"lt:{thread}" not in seen and _uses_cublaslt(node):
                seen.add(f"lt:{thread}")
                out.persistent.append((index, lt, f"cuBLASLt workspace ({thread} thread)"))
        rule = _TRANSIENT.get(getattr(target_op, "overloadpacket", None))
        if rule is not None:
            nbytes = int(rule(op_call(node), target))
            if nbytes > 0:
                out.transients[index] = nbytes
        for i, (sid, spec) in enumerate(zip(node.meta.get("storage", ()), node.meta.get("spec", ()))):
            nbytes = cap.storage_bytes[sid]
            on_device = device_bytes(node, i, nbytes)
            if on_device != nbytes:
                out.resize[sid] = on_device
    return out

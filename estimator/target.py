"""The CUDA target: the kernels a CUDA build of PyTorch runs, emulated on the CPU fake trace.

The step is traced on CPU (fake) tensors.  Where the CUDA build would run another kernel, or the
same kernel with other saved tensors, the CUDA choice is installed at the dispatcher for the
duration of a capture (:func:`installed`), so that the forward pass, the backward pass and the
recomputation of checkpointed regions inside backward all take it:

* **Scaled-dot-product attention**: the backend ``sdp_utils.cpp`` picks for the target GPU and
  torch release (:meth:`CudaTarget.sdpa_backend`): cuDNN attention (fp16/bf16 on sm90/sm100 with
  cuDNN > 9.15, preferred from torch 2.11), flash (fp16/bf16, no mask), memory-efficient (fp32
  too, masks allowed, no grouped-query heads), else the math path (the L x S probabilities
  saved).  Each backend's aten op is called as the CUDA composite calls it (boolean masks made
  additive, the efficient kernel's mask padded to 16 columns), so its saved tensors are the
  CUDA kernel's (meta kernels give their shapes).
* **Dropout**: ``native_dropout``, the fused CUDA kernel, which keeps a 1-byte boolean mask
  (``Dropout.cpp``: ``is_fused_kernel_acceptable``), not the CPU composite's mask in the
  activation dtype.
* **Batch norm**: ``cudnn_batch_norm`` where ``Normalization.cpp`` (``_batch_norm_impl_index``)
  would pick cuDNN (not for bf16 inputs or weights), else the native kernel.
* **Recurrent layers** (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``): one ``_cudnn_rnn`` over all layers
  (``RNN.cpp``, ``_cudnn_impl``), with the module's weights flattened as ``.cuda()`` leaves them;
  under autocast the weights, input and state are cast to float16, whatever the autocast dtype
  (``autocast_mode.cpp``: ``_cudnn_rnn_cast_reflatten``).  Its reserve space (kept for backward)
  and workspace are modelled in :mod:`estimator.workspace`.
* **Autocast**: CUDA's op lists (``autocast_mode.cpp``, :mod:`estimator.precision`) instead of
  CPU's: softmax, log_softmax, layer norm, pow, exp, sum, losses... in float32.

The overrides are ``torch.library`` kernels registered while a capture runs and removed after;
they act only on the thread that captures (other threads get the original behaviour, except
scaled-dot-product attention, which takes the math path there while a capture is in progress).

Memory the CUDA libraries take inside the caching allocator (cuBLAS workspaces, cuDNN
workspaces, kernel temporaries) is not an op output; :mod:`estimator.workspace` models it.
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .compat import torch_version
from .precision import register_cuda_autocast

aten = torch.ops.aten
DispatchKey = torch._C.DispatchKey
DispatchKeySet = torch._C.DispatchKeySet

_LOW_PRECISION = (torch.float16, torch.bfloat16)


INSTALLED_TORCH = torch_version()

# cuDNN shipped with the default PyPI CUDA wheel of each torch release (cudnn.version() on those
# wheels; 2.11: the reference H100 machine, torch 2.11.0+cu130, reads 91900).  Later releases
# are taken to ship at least 9.19.
_CUDNN_OF_TORCH = {(2, 6): 90100, (2, 7): 90501, (2, 8): 91002, (2, 9): 91002, (2, 10): 91300, (2, 11): 91900}


def parse_release(text: Any) -> tuple[int, int] | None:
    """``cuda_torch`` / ``--cuda-torch``: the torch release that will run the step (``"2.11"``); None: the
    installed one."""
    if text is None:
        return None
    match = re.fullmatch(r"(\d+)\.(\d+)(\.\d+)?", str(text).strip())
    if match is None:
        from .errors import UserError

        raise UserError(f"cuda_torch={text!r}: give a torch release as MAJOR.MINOR, e.g. '2.11'")
    if int(match[1]) < 2:
        from .errors import UserError

        raise UserError(f"cuda_torch={text!r}: the kernel choices of torch 2.0 and later are modelled (1.x has no "
                        f"scaled_dot_product_attention); give 2.0 or later")
    newest = max(max(_CUDNN_OF_TORCH), INSTALLED_TORCH)
    if (int(match[1]), int(match[2])) > (newest[0], newest[1] + 2):  # (a release or two past what is known)
        from .errors import UserError

        raise UserError(f"cuda_torch={text!r}: no such torch release is known (the newest here is "
                        f"{newest[0]}.{newest[1]}); give the release the GPU machine runs, e.g. '2.11'")
    return int(match[1]), int(match[2])


def default_cudnn(torch_version: tuple[int, int]) -> int:
    if torch_version in _CUDNN_OF_TORCH:
        return _CUDNN_OF_TORCH[torch_version]
    return 91900 if torch_version > (2, 11) else 90100


@dataclass(frozen=True)
class CudaTarget:
    """The GPU and software a step is estimated for: what decides the kernels CUDA runs.

    ``arch`` is the compute capability (H100: (9, 0)); ``torch`` the torch release that will run
    the step (default: the one installed here); ``cudnn`` and ``cuda`` the versions its wheel ships.
    """

    arch: tuple[int, int] = (9, 0)
    torch: tuple[int, int] = INSTALLED_TORCH
    cudnn: int = 0  # 0: the default of ``torch``'s wheel
    cuda: int = 13000
    name: str = "H100-SXM"
    sms: int = 0  # the GPU's multiprocessors and threads per multiprocessor (0: those of the GPU called ``name``)
    max_threads_per_sm: int = 0

    def __post_init__(self) -> None:
        if not self.cudnn:
            object.__setattr__(self, "cudnn", default_cudnn(self.torch))

    @classmethod
    def for_gpu(cls, gpu: Any = None, torch_version: tuple[int, int] | None = None) -> "CudaTarget":
        """The target of a :class:`estimator.hardware.GPU` (default: H100) and torch release."""
        version = torch_version or INSTALLED_TORCH
        if gpu is None:
            return cls(torch=version)
        # a GPU without a CUDA compute capability (AMD) is modelled as an sm80-class device
        return cls(arch=gpu.arch or (8, 0), torch=version, name=gpu.name, sms=gpu.sms or 0,
                   max_threads_per_sm=gpu.max_threads_per_sm or 0)

    # -- scaled-dot-product attention: sdp_utils.cpp -----------------------------------------------
    def prefers_cudnn_attention(self) -> bool:
        """``check_prefer_cudnn_attention``: cuDNN first on sm90/sm10x with cuDNN > 9.15 (minor 0 or 3
        on CUDA 12 builds)."""
        major, minor = self.arch
        if self.cudnn <= 91500 or major not in (9, 10):
            return False
        return self.cuda >= 13000 or minor in (0, 3)

    def sdpa_backend(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                     enable_gqa=False) -> str:
        """``"cudnn"``, ``"flash"``, ``"efficient"`` or ``"math"``: ``select_sdp_backend`` for these inputs.

        The priority order is cuDNN, flash, efficient, math when cuDNN is preferred, else flash,
        efficient, math (cuDNN last, after the always-available math path).  A backend turned off
        (``torch.nn.attention.sdpa_kernel``, ``torch.backends.cuda.enable_*_sdp``) is skipped, as torch
        skips it (it was ignored: a math-only block was sized with cuDNN's saves); none left: torch's error."""
        cuda = torch.backends.cuda
        enabled = {"cudnn": cuda.cudnn_sdp_enabled(), "flash": cuda.flash_sdp_enabled(),
                   "efficient": cuda.mem_efficient_sdp_enabled(), "math": cuda.math_sdp_enabled()}
        order = ("cudnn", "flash", "efficient") if self.prefers_cudnn_attention() else ("flash", "efficient")
        params = _SdpParams(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa,
                            torch.is_grad_enabled())
        for backend in order:
            if enabled[backend] and getattr(self, f"_can_use_{backend}")(params):
                return backend
        if not enabled["math"]:
            from .errors import UserError

            on = [name for name, yes in enabled.items() if yes]
            raise UserError(f"scaled_dot_product_attention: No available kernel (a real CUDA step fails the same way): "
                            f"the backends turned on ({', '.join(on) or 'none'}; torch.nn.attention.sdpa_kernel or "
                            f"torch.backends.cuda.enable_*_sdp) take none of these inputs: allow another backend")
        return "math"

    def _can_use_cudnn(self, p: "_SdpParams") -> bool:
        """``can_use_cudnn_attention``."""
        major, _ = self.arch
        if p.dropout_p > 0.0 and 91100 < self.cudnn < 91400:  # cuDNN 9.11-9.13: no dropout
            return False
        if self.torch >= (2, 12) and p.dropout_p * 16.0 != math.floor(p.dropout_p * 16.0):
            return False  # check_cudnn_dropout (pytorch#174245): dropout in steps of 1/16 only
        if not (p.four_d and p.low_precision and (8, 0) <= self.arch <= (12, 1)):
            return False
        if not (p.mask_shape_ok() and p.nonzero_lengths and p.last_dim_stride_one(ignore_singleton=True)
                and p.heads_ok(supports_gqa=True)):
            return False
        b, h, s_q, d_qk = p.query.shape
        s_k, d_v = p.key.shape[-2], p.value.shape[-1]
        if b > 65535 or h > 65535:
            return False
        sm90_or_10x = (major == 9 and self.arch[1] == 0) or major == 10
        limit = 256 if sm90_or_10x and self.cudnn > 92200 else (
            192 if sm90_or_10x and self.cudnn >= 91100 and d_qk == 192 and d_v == 128 else 128)
        if d_qk > limit or d_v > limit or d_qk % 8 or d_v % 8 or s_k == 1:
            return False
        if p.dropout_p != 0.0 and s_q == 1:
            return False
        if p.requires_grad and sm90_or_10x and self.cudnn > 92200:  # check_cudnn_d256_bprop_head_dim
            if not ((d_qk <= 128 and d_v <= 128) or (d_qk, d_v) in ((192, 128), (256, 256))):
                return False
        return True

    def _can_use_flash(self, p: "_SdpParams") -> bool:
        """``can_use_flash_attention``."""
        if not (p.four_d and p.attn_mask is None and p.low_precision and (8, 0) <= self.arch <= (12, 1)):
            return False
        d = (p.query.shape[-1], p.key.shape[-1], p.value.shape[-1])
        if not (d[0] == d[1] == d[2] <= 256):
            return False
        if p.requires_grad and ((8, 6) <= self.arch <= (8, 9) or (12, 0) <= self.arch <= (12, 1)):
            if not (d[0] <= 192 or (p.dropout_p == 0.0 and d[0] > 224)):
                return False
        if p.is_causal and p.query.shape[-2] != p.key.shape[-2]:
            return False
        return p.heads_ok(supports_gqa=True) and p.nonzero_lengths and p.last_dim_stride_one(ignore_singleton=True)

    def _can_use_efficient(self, p: "_SdpParams") -> bool:
        """``can_use_mem_efficient_attention`` (no grouped-query heads up to torch 2.14).

        A mask that requires grad (a learned position bias) goes to the math path: seen on the
        reference H100 steps (torch 2.11), where T5's self-attention with its learned relative bias
        runs the math path in fp32 while its cross-attention (a constant zero bias) runs this kernel."""
        if not (p.four_d and (5, 0) <= self.arch <= (12, 1)):
            return False
        if p.attn_mask is not None and p.attn_mask.requires_grad:
            return False
        half = p.query.dtype in _LOW_PRECISION
        if p.query.dtype not in ((torch.float16, torch.float32, torch.bfloat16) if self.arch >= (8, 0)
                                 else (torch.float16, torch.float32)):
            return False
        if not (p.query.dtype == p.key.dtype == p.value.dtype):
            return False
        alignment = self._gemm_alignment(half)
        d_qk, d_k, d_v = p.query.shape[-1], p.key.shape[-1], p.value.shape[-1]
        if not (d_qk == d_k and d_qk % alignment == 0 and d_v % alignment == 0 and d_qk > 0 and d_v > 0):
            return False
        if self.arch >= (8, 0):
            align_bytes = alignment * p.query.element_size()
            if any(t.numel() and (t.storage_offset() * t.element_size()) % align_bytes
                   for t in (p.query, p.key, p.value)):
                return False
        return p.nonzero_lengths and p.last_dim_stride_one(ignore_singleton=False) and p.heads_ok(supports_gqa=False)

    def _gemm_alignment(self, half: bool) -> int:
        """``minimum_gemm_alignment``: 4 elements from sm80, 128 bits with tensor cores."""
        alignment = 4 if self.arch >= (8, 0) else 1
        tensor_cores = self.arch >= (8, 0) or (self.arch >= (7, 0) and half)
        return max(alignment, 128 // (16 if half else 32)) if tensor_cores else alignment

    # -- batch norm: Normalization.cpp _batch_norm_impl_index -------------------------------------
    @staticmethod
    def uses_cudnn_batch_norm(input, weight, bias, running_mean, running_var, training: bool, eps: float) -> bool:
        """Whether CUDA runs ``cudnn_batch_norm`` (cuDNN does not take bfloat16)."""
        if input.dtype == torch.bfloat16 or (weight is not None and weight.dtype == torch.bfloat16):
            return False
        if input.dtype == torch.float16 and weight is not None and weight.dtype != torch.float32:
            return False
        stats_ok = (running_mean is not None and running_var is not None) or \
            (running_mean is None and running_var is None and training)
        return (weight is not None and bias is not None and stats_ok and input.dim() >= 3
                and input.shape[0] <= (880801 if training else 65535) and eps >= 1e-5
                and input.numel() < 2**31 - 1 and torch.backends.cudnn.enabled)


@dataclass
class _SdpParams:
    query: Any
    key: Any
    value: Any
    attn_mask: Any
    dropout_p: float
    is_causal: bool
    enable_gqa: bool
    grad_mode: bool
    four_d: bool = field(init=False)

    def __post_init__(self) -> None:
        self.four_d = self.query.dim() == self.key.dim() == self.value.dim() == 4

    @property
    def low_precision(self) -> bool:
        return self.query.dtype in _LOW_PRECISION and self.query.dtype == self.key.dtype == self.value.dtype

    @property
    def requires_grad(self) -> bool:
        return self.grad_mode and any(t.requires_grad for t in (self.query, self.key, self.value))

    @property
    def nonzero_lengths(self) -> bool:
        return self.query.shape[-2] != 0 and self.key.shape[-2] != 0

    def last_dim_stride_one(self, ignore_singleton: bool) -> bool:
        ok = all(t.stride(-1) == 1 for t in (self.query, self.key, self.value))
        if ignore_singleton:
            ok = ok or self.query.shape[-1] == 1
        return ok and (self.attn_mask is None or self.attn_mask.stride(-1) == 1)

    def heads_ok(self, supports_gqa: bool) -> bool:
        """``check_batch_size_and_num_heads_dense``."""
        q, k, v = self.query, self.key, self.value
        if not (q.shape[0] == k.shape[0] == v.shape[0]):
            return False
        if self.enable_gqa and supports_gqa:
            return k.shape[-3] == v.shape[-3] and q.shape[-3] % k.shape[-3] == 0
        return q.shape[-3] == k.shape[-3] == v.shape[-3]

    def mask_shape_ok(self) -> bool:
        """``check_attn_mask_shape``: 2-D or broadcastable 4-D masks that need no gradient."""
        m = self.attn_mask
        if m is None:
            return True
        if m.requires_grad:
            return False
        b, h, s_q = self.query.shape[0], self.query.shape[1], self.query.shape[2]
        s_k = self.key.shape[2]
        if m.shape[-2] not in (s_q, 1) or m.shape[-1] not in (s_k, 1):
            return False
        return m.dim() == 2 or (m.dim() == 4 and m.shape[0] in (1, b) and m.shape[1] in (1, h))


# -- the kernels as the CUDA composite calls them ---------------------------------------------------


def _additive(mask, dtype):
    """``convert_boolean_attn_mask``: a boolean mask as the additive float mask the fused kernels take."""
    if mask is not None and mask.dtype == torch.bool:
        return torch.where(mask, torch.zeros((), dtype=dtype), torch.full((), float("-inf"), dtype=dtype))
    return mask


def _pad_mask(mask, query, key):
    """``preprocess_mask``: the efficient kernel's mask padded to a multiple of 16 columns, expanded to
    (B, H, L, S)."""
    s_k = key.shape[-2]
    pad = (-s_k) % 16
    if pad:
        mask = torch.nn.functional.pad(mask, (0, pad))[..., :s_k]
    return mask.expand(query.shape[0], query.shape[1], query.shape[2], s_k)


def _sdpa_cuda(target: CudaTarget, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):
    mask = _additive(attn_mask, query.dtype)
    backend = target.sdpa_backend(query, key, value, mask, dropout_p, is_causal, enable_gqa)
    lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if backend == "cudnn":
        return aten._scaled_dot_product_cudnn_attention(query, key, value, mask, lse, dropout_p, is_causal, False,
                                                        scale=scale)[0]
    if backend == "flash":
        head = query.shape[-1]
        pad = (-head) % 8
        if pad:  # pad_last_dim<8>: the kernel wants head dims in multiples of 8
            query, key, value = (torch.nn.functional.pad(t, (0, pad)) for t in (query, key, value))
        scale = scale if scale is not None else 1.0 / math.sqrt(head)
        out = aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False, scale=scale)[0]
        return out[..., :head] if pad else out
    if backend == "efficient":
        if mask is not None:
            mask = _pad_mask(mask, query, key)
        return aten._scaled_dot_product_efficient_attention(query, key, value, mask, lse, dropout_p, is_causal,
                                                            scale=scale)[0]
    return aten._scaled_dot_product_attention_math(query, key, value, attn_mask, dropout_p, is_causal, None,
                                                   scale=scale, enable_gqa=enable_gqa)[0]


def _dropout_cuda(target: CudaTarget, input, p, train):
    """``at::dropout`` on CUDA: the fused kernel (boolean mask) when ``is_fused_kernel_acceptable``."""
    if train and 0 < p < 1 and input.numel() > 0:
        return aten.native_dropout(input, p, train)[0]
    if p == 1 and train:
        return input * torch.zeros((), dtype=input.dtype)
    return input


def _dropout_cpu(input, p, train):
    """``at::dropout`` as the CPU composite runs it (``_dropout_impl``): for the other threads."""
    if p == 0 or not train or input.numel() == 0:
        return input
    if p == 1:
        return input * torch.zeros((), dtype=input.dtype)
    noise = torch.empty_like(input).bernoulli_(1 - p).div_(1 - p)
    return input * noise


def _batch_norm_cuda(target: CudaTarget, input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled):
    if CudaTarget.uses_cudnn_batch_norm(input, weight, bias, running_mean, running_var, training, eps):
        return aten.cudnn_batch_norm(input.contiguous(), weight, bias, running_mean, running_var, training,
                                     momentum, eps)[0]
    return aten.native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)[0]


_RNN_MODES = {"rnn_relu": 0, "rnn_tanh": 1, "lstm": 2, "gru": 3}


def _rnn_cuda(mode: str, packed: bool = False):
    """``lstm.input`` / ``gru.input`` / ``rnn_*.input`` as ``_cudnn_impl`` runs them on CUDA; with ``packed``
    the ``.data`` overloads (a PackedSequence: ``data`` of all time steps' rows and ``batch_sizes``),
    which cuDNN runs as one ``_cudnn_rnn`` over the packed rows."""

    def run_packed(target: CudaTarget, data, batch_sizes, hx, params, has_biases, num_layers, dropout, train,
                   bidirectional):
        # batch_sizes has values (capture.fake.fake_pack_padded_sequence makes it real); a fake one raises
        # here as the composite would, and the capture traces on real tensors
        return run(target, data, hx, params, has_biases, num_layers, dropout, train, bidirectional, False,
                   batch_sizes.tolist())

    def run(target: CudaTarget, input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
            batch_first, batch_sizes=()):
        lstm = mode == "lstm"
        h0, c0 = (hx[0], hx[1]) if lstm else (hx, None)
        dtype = input.dtype
        if torch.is_autocast_enabled("cpu"):  # _cudnn_rnn_cast_reflatten: always float16
            dtype = torch.float16
        if dtype not in (torch.float32, torch.float16, torch.float64) or not torch.backends.cudnn.enabled:
            raise _NotCudnn
        if dtype != input.dtype:
            input, h0 = input.to(dtype), h0.to(dtype)
            c0 = c0.to(dtype) if c0 is not None else None
            params = [w.to(dtype) for w in params]  # the reflattened float16 copy of the weights
        hidden = h0.shape[-1]
        per_layer = len(params) // (num_layers * (2 if bidirectional else 1))
        proj = params[per_layer - 1].shape[0] if per_layer in (3, 5) else 0  # w_hr: (hidden, proj) weights last
        weight_buf = torch.empty(0, dtype=dtype)  # the flat buffer the parameters live in (.cuda() flattens them)
        out = aten._cudnn_rnn(input, list(params), per_layer, weight_buf, h0, c0, _RNN_MODES[mode], hidden, proj,
                              num_layers, batch_first, dropout, train, bidirectional, list(batch_sizes), None)
        if lstm:
            return out[0], out[1], out[2]
        return out[0], out[1]

    return run_packed if packed else run


class _NotCudnn(Exception):
    """The CUDA build would not run cuDNN for these inputs: the original composite decides."""


def cudnn_rnn_reserve_bytes(mode: int, num_layers: int, directions: int, seq: int, batch: int, hidden: int,
                            itemsize: int) -> int:
    """cuDNN's RNN training reserve space (``cudnnGetRNNTempSpaceSizes``; no meta kernel computes it).

    Fitted on the reference H100 steps (cuDNN 9.19): a 2-layer LSTM, hidden 512, input 256, 128 steps,
    batch 16 reserves 46,137,600 B in float32 and 23,068,928 B in float16, i.e. 5.5 x hidden elements per
    layer, step and sequence, plus 256 B.  Other cells scale with their gate count (LSTM 4, GRU 3, plain
    RNN 1): one configuration measured, so other shapes are an extrapolation."""
    gates = {2: 4, 3: 3}.get(mode, 1)
    per = (gates + 1.5) * hidden  # LSTM: 4 gates + 1.5 => 5.5 x hidden
    return int(num_layers * directions * seq * batch * per * itemsize) + 256


def _cudnn_rnn_meta(input, weight, weight_stride0, weight_buf, hx, cx, mode, hidden_size, proj_size, num_layers,
                    batch_first, dropout, train, bidirectional, batch_sizes, dropout_state):
    """``_cudnn_rnn``'s shapes as the CUDA kernel makes them: a batch-first output is a transposed view of
    a (T, B, H) buffer, and training keeps a reserve space (:func:`cudnn_rnn_reserve_bytes`).  A packed
    sequence (``batch_sizes`` given) is ``input`` (rows of all steps, features): its output has one row
    per input row, and its reserve is sized by its rows (an extrapolation: the reserve was measured on
    padded batches only)."""
    directions = 2 if bidirectional else 1
    out_size = proj_size or hidden_size
    if batch_sizes:
        batch = batch_sizes[0]  # the first step has every sequence
        output = input.new_empty((input.shape[0], out_size * directions))
        steps_x_batch = (input.shape[0], 1)  # rows of all steps
    else:
        seq, batch = (input.shape[1], input.shape[0]) if batch_first else (input.shape[0], input.shape[1])
        output = input.new_empty((seq, batch, out_size * directions))
        if batch_first:
            output = output.transpose(0, 1)
        steps_x_batch = (seq, batch)
    hy = hx.new_empty((num_layers * directions, batch, out_size))
    cy = cx.new_empty((num_layers * directions, batch, hidden_size)) if cx is not None else input.new_empty(0)
    reserve = input.new_empty(cudnn_rnn_reserve_bytes(mode, num_layers, directions, *steps_x_batch, hidden_size,
                                                      input.element_size()) if train else 0, dtype=torch.uint8)
    return output, hy, cy, reserve, weight_buf


def _cudnn_rnn_backward_meta(input, weight, weight_stride0, weight_buf, hx, cx, output, grad_output, grad_hy, grad_cy,
                             mode, hidden_size, proj_size, num_layers, batch_first, dropout, train, bidirectional,
                             batch_sizes, dropout_state, reserve, output_mask):
    """Shapes of ``_cudnn_rnn_backward`` (no meta kernel upstream): the weight gradients are views of one
    flat buffer, as the CUDA kernel returns them (``RNN.cpp``: ``dw`` then ``weight_grads`` views)."""
    grad_input = input.new_empty(input.shape)
    grad_hx = hx.new_empty(hx.shape)
    grad_cx = cx.new_empty(cx.shape) if cx is not None else hx.new_empty(0)
    total = sum(w.numel() for w in weight)
    flat = weight[0].new_empty(total)
    grads, offset = [], 0
    for w in weight:
        grads.append(flat[offset:offset + w.numel()].view(w.shape))
        offset += w.numel()
    return grad_input, grad_hx, grad_cx, grads


def _embedding_bag_cuda_meta(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                             per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """``_embedding_bag`` as the CUDA kernel sizes its outputs (``_embedding_bag_cuda``): ``offset2bag``
    one index per input index in every mode, ``bag_size`` one per offset, ``max_indices`` only for
    max bags.  The meta kernel picks the CPU kernel's sizes when ``offsets`` is on the CPU, which
    integer inputs are while the capture keeps their values (:mod:`estimator.capture.fake`)."""
    num_bags = offsets.shape[0] - (1 if include_last_offset else 0)
    new_index = lambda *shape: weight.new_empty(shape, dtype=indices.dtype)  # noqa: E731  (fake, like weight)
    output = weight.new_empty((num_bags, weight.shape[1]))
    offset2bag = new_index(indices.shape[0])
    bag_size = new_index(offsets.shape[0])
    max_indices = new_index(num_bags, weight.shape[1]) if mode == 2 else new_index(0)  # MODE_MAX = 2
    return output, offset2bag, bag_size, max_indices


# Fake kernels of the CUDA ops whose meta kernel is missing (``_cudnn_rnn_backward``) or says other
# sizes and layouts than the CUDA kernel (``_cudnn_rnn``, ``_embedding_bag``): the capture runs these instead of the fake
# kernel (they make fake tensors of the CUDA shapes, strides and sizes).
FAKE_KERNELS: dict[Any, Callable] = {
    aten._cudnn_rnn.default: _cudnn_rnn_meta,
    aten._cudnn_rnn_backward.default: _cudnn_rnn_backward_meta,
    aten._embedding_bag.default: _embedding_bag_cuda_meta,
    aten._embedding_bag_forward_only.default: _embedding_bag_cuda_meta,
}


# -- installing them for one thread -------------------------------------------------------------------

_lock = threading.Lock()
_active: dict[int, CudaTarget] = {}  # thread id -> the target this thread is capturing for
_library: list[Any] = []  # the installed torch.library.Library while any thread captures


def _current() -> CudaTarget | None:
    return _active.get(threading.get_ident()) if _active else None


def _composite(op: Any, cuda: Callable, other: Callable | None = None) -> Callable:
    """An AutogradCPU kernel: ``cuda(target, ...)`` on a capturing thread; elsewhere ``other(...)`` or the
    original composite (re-dispatched past this key: its inner ops still go through autograd)."""

    def kernel(keyset, *args, **kwargs):
        target = _current()
        if target is not None:
            try:
                return cuda(target, *args, **kwargs)
            except _NotCudnn:
                pass
        elif other is not None:
            return other(*args, **kwargs)
        return op.redispatch(keyset.remove(DispatchKey.AutogradCPU), *args, **kwargs)

    return kernel


def _sdpa_other(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return aten._scaled_dot_product_attention_math(query, key, value, attn_mask, dropout_p, is_causal, None,
                                                   scale=scale, enable_gqa=enable_gqa)[0]


def _register(lib: Any) -> None:
    lib.impl("scaled_dot_product_attention",
             _composite(aten.scaled_dot_product_attention.default, _sdpa_cuda, _sdpa_other),
             "AutogradCPU", with_keyset=True)
    lib.impl("dropout", _composite(aten.dropout.default, _dropout_cuda, _dropout_cpu), "AutogradCPU",
             with_keyset=True)
    lib.impl("batch_norm", _composite(aten.batch_norm.default, _batch_norm_cuda), "AutogradCPU", with_keyset=True)
    for mode in _RNN_MODES:
        lib.impl(f"{mode}.input", _composite(getattr(aten, mode).input, _rnn_cuda(mode)), "AutogradCPU",
                 with_keyset=True)
        lib.impl(f"{mode}.data", _composite(getattr(aten, mode).data, _rnn_cuda(mode, packed=True)), "AutogradCPU",
                 with_keyset=True)
    register_cuda_autocast(lib, lambda: _current() is not None)


@contextlib.contextmanager
def installed(target: CudaTarget):
    """The CUDA kernels above, for the calling thread, for the duration of the block."""
    ident = threading.get_ident()
    with _lock:
        if ident in _active:
            raise RuntimeError("a CUDA-target capture is already running on this thread")
        if not _library:
            lib = torch.library.Library("aten", "IMPL")
            with warnings.catch_warnings():  # "overriding a previously registered kernel": intended, undone below
                warnings.simplefilter("ignore")
                _register(lib)
            touched = _registered_ops(lib)
            _library.append((lib, touched))
            _forget_dispatch(touched)
        _active[ident] = target
    try:
        yield target
    finally:
        with _lock:
            del _active[ident]
            if not _active:
                lib, touched = _library.pop()
                lib._destroy()
                _forget_dispatch(touched)


def _registered_ops(lib: Any) -> list[str]:
    """The op names (``name`` or ``name.overload``) ``lib`` has kernels for (its ``ns/name/key`` records)."""
    return sorted({key.split("/")[1] for key in getattr(lib, "_op_impls", ())})


def _forget_dispatch(names: list[str]) -> None:
    """Empty the Python dispatcher's cache of the ops these kernels override (a graph tracer, AOTAutograd,
    dispatches through it and would keep the kernel it resolved before they were registered, or after)."""
    for name in names:
        packet_name, _, overload = name.partition(".")
        packet = getattr(aten, packet_name, None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        cache = getattr(op, "_dispatch_cache", None)
        if isinstance(cache, dict):
            cache.clear()

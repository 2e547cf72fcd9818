"""Precision policies: how a training step's tensors are typed.

* ``fp32``: everything float32 (4 bytes per element).
* ``bf16`` / ``fp16``: the model is cast (``model.to(dtype)``): parameters,
  gradients, optimizer state and activations in 2 bytes per element.
* ``bf16-mixed`` / ``fp16-mixed``: ``torch.autocast``: float32 master weights,
  gradients and optimizer state; autocast casts the weights of ops on its
  lower-precision list (matmul, convolution, attention...) to bf16/fp16, caches
  those copies for the forward pass, and runs the rest in float32.
  ``fp16-mixed`` adds a ``GradScaler`` (scaled loss, unscale before the step).
* ``fp8``: a what-if, not a trace: the ``bf16-mixed`` step with its linear layers in fp8
  (:func:`fp8_what_if`).

The trace runs these policies for real (on CPU fake tensors), so dtypes,
casts and cached weight copies come from PyTorch itself.  For a CUDA target,
autocast follows CUDA's op lists (:data:`CUDA_AUTOCAST`, installed by
:func:`register_cuda_autocast` while a capture runs) instead of CPU's: CUDA
keeps softmax, log_softmax, layer norm, pow, exp, sums and most losses in
float32, and does not cast the ops only CPU's lists name.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .errors import UserError

POLICIES = ("fp32", "bf16", "fp16", "bf16-mixed", "fp16-mixed", "fp8")


@dataclass(frozen=True)
class Precision:
    name: str
    cast: torch.dtype | None  # dtype the model and floating inputs are cast to
    autocast: torch.dtype | None  # autocast dtype for forward + loss
    grad_scaler: bool
    fp8_linear: bool = False  # the fp8 what-if over this trace (see fp8_what_if)
    kept: frozenset[int] = frozenset()  # ids of the model's tensors the cast leaves as given (see as_given)

    def autocast_context(self):
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast("cpu", dtype=self.autocast)

    def traced_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a floating parameter, buffer or input has under this policy."""
        return self.cast if (self.cast is not None and dtype.is_floating_point) else dtype

    def tensor_dtype(self, t: torch.Tensor) -> torch.dtype:
        """:meth:`traced_dtype` of ``t``'s dtype, or its own when it keeps it (:func:`keep_dtype`)."""
        return t.dtype if getattr(t, KEEP_DTYPE, False) or id(t) in self.kept else self.traced_dtype(t.dtype)


KEEP_DTYPE = "_estimator_keeps_dtype"


def keep_dtype(t: torch.Tensor) -> torch.Tensor:
    """Mark a parameter or buffer that a precision cast leaves as it is (peft's float32 LoRA adapters, which it
    upcasts after any ``model.to(bf16)``; bitsandbytes' quantization statistics); returns ``t``."""
    setattr(t, KEEP_DTYPE, True)
    return t


def as_given(model: torch.nn.Module, precision: Precision) -> tuple[Precision, list[str]]:
    """``precision`` for ``model``: a cast (bf16, fp16) of a model whose floating parameters are (at least 90 %) in that
    dtype already leaves its other floating parameters as they are, since its user cast it and kept those on purpose
    (peft's float32 adapters on a bf16 base, transformers' ``_keep_in_fp32_modules``): casting them too had the
    adapters' gradients and optimizer state at half their bytes (-50 %, the peak -6.3 %); and a note saying so."""
    if precision.cast is None:
        return precision, []
    floats = [p for p in model.parameters() if p.is_floating_point()]
    cast = sum(p.numel() for p in floats if p.dtype == precision.cast)
    other = [p for p in floats if p.dtype != precision.cast]
    if not other or cast < 0.9 * sum(p.numel() for p in floats):  # (a few kept on purpose; else cast it whole)
        return precision, []
    from dataclasses import replace

    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in other})
    return replace(precision, kept=frozenset(id(p) for p in other)), [
        f"precision {precision.name}: the model is in {str(precision.cast).removeprefix('torch.')} already; its "
        f"{sum(p.numel() for p in other):,} parameters in {', '.join(dtypes)} (e.g. peft's adapters) kept as given"]


def parse_precision(name: str | Precision | None) -> Precision:
    if isinstance(name, Precision):
        return name
    key = (name or "fp32").strip().lower()
    table = {
        "fp32": Precision("fp32", None, None, False),
        "bf16": Precision("bf16", torch.bfloat16, None, False),
        "fp16": Precision("fp16", torch.float16, None, False),
        "bf16-mixed": Precision("bf16-mixed", None, torch.bfloat16, False),
        "fp16-mixed": Precision("fp16-mixed", None, torch.float16, True),
        "fp8": Precision("fp8", None, torch.bfloat16, False, fp8_linear=True),
    }
    if key not in table:
        raise UserError(f"unknown precision {name!r}; choose one of {', '.join(POLICIES)}")
    return table[key]


# -- fp8 what-if ------------------------------------------------------------------

FP8_FORWARD = "float8_e4m3fn"  # activations and weights (E4M3: more mantissa)
FP8_BACKWARD = "float8_e5m2"  # gradients (E5M2: more range)
_MATMULS = ("mm", "addmm", "bmm", "baddbmm")


def fp8_what_if(cap, module_types: dict[str, str], flops_by_dtype: dict[str, int],
                linear_types: tuple[str, ...] = ("Linear",)) -> dict:
    """Linear layers in fp8 over a ``bf16-mixed`` trace, as TransformerEngine / torchao float8 train.

    A model, not a trace: the matmuls of ``nn.Linear`` modules run in fp8 (forward GEMM on
    E4M3 inputs and weights; backward GEMMs on E5M2 gradients), everything else as traced.
    Memory: the bf16 weight copies autocast makes for those matmuls become 1-byte E4M3
    copies, and a bf16 input a linear layer saves for backward is saved as an E4M3 copy
    (1 byte per element) when no other op reads it.  Returns ``{"resize": {sid: bytes},
    "flops_by_dtype": {dtype: FLOPs}}`` to apply to the tallies and the memory replay.
    """
    readers: dict[int, set[str]] = {}  # sid -> "linear" / "other": who reads it in the forward pass
    linear_nodes = []
    for node in cap.nodes:
        if node.meta.get("phase") not in ("forward", "loss"):
            continue
        is_linear = (module_types.get(node.meta.get("module", ""), "") in linear_types
                     and str(getattr(node.target, "overloadpacket", "")).removeprefix("aten.") in _MATMULS)
        if is_linear:
            linear_nodes.append(node)
        produced = set(node.meta.get("storage", ()))
        for arg in node.all_input_nodes:
            for sid in arg.meta.get("storage", ()):
                if sid in produced and not is_linear:  # a view or in-place op: the readers of its result count
                    continue
                readers.setdefault(sid, set()).add("linear" if is_linear else "other")
    resize: dict[int, int] = {}
    for node in linear_nodes:
        for arg in node.all_input_nodes:
            for spec, sid in zip(arg.meta.get("spec", ()), arg.meta.get("storage", ())):
                if spec.dtype in (torch.bfloat16, torch.float16) and readers.get(sid) == {"linear"}:
                    resize[sid] = cap.storage_bytes[sid] // spec.dtype.itemsize  # 1 byte per element
    by_dtype = dict(flops_by_dtype)
    for node in cap.nodes:
        cost = node.meta.get("cost")
        phase = node.meta.get("phase")
        if cost is None or not cost.flops or cost.kind != "matmul" or phase not in ("forward", "loss", "backward"):
            continue
        if module_types.get(node.meta.get("module", ""), "") in linear_types and \
                str(getattr(node.target, "overloadpacket", "")).removeprefix("aten.") in _MATMULS:
            to = FP8_BACKWARD if phase == "backward" else FP8_FORWARD
            by_dtype[cost.dtype] = by_dtype.get(cost.dtype, 0) - cost.flops
            by_dtype[to] = by_dtype.get(to, 0) + cost.flops
    return {"resize": resize, "flops_by_dtype": {k: v for k, v in by_dtype.items() if v}}


# -- CUDA's autocast op lists --------------------------------------------------------------------

# aten/src/ATen/autocast_mode.cpp (torch 2.11-2.14): the ops with an AutocastCUDA kernel and no
# AutocastCPU one, by policy.  Ops on both devices' lower-precision lists (mm, addmm, bmm, baddbmm,
# linear, matmul, conv1d/2d/3d, conv_transpose*, prelu, scaled_dot_product_attention) and their fp32
# lists (nll_loss, mse_loss, l1_loss, kl_div, the other losses, cdist) need no change.
CUDA_AUTOCAST: dict[str, tuple[str, ...]] = {
    # cast floating tensors to the autocast dtype
    "lower_precision_fp": (
        "_convolution", "convolution", "cudnn_convolution", "cudnn_convolution_transpose", "einsum", "mv",
        "addmv", "addr", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell",
        "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention"),
    # cast floating tensors to float32
    "fp32": (
        "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
        "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
        "native_layer_norm", "group_norm", "rms_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
        "cosine_similarity", "dist", "pdist", "renorm", "logsumexp", "upsample_nearest1d", "upsample_nearest2d",
        "upsample_nearest3d", "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d",
        "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa", "upsample_trilinear3d",
        "upsample_bicubic2d", "_upsample_bicubic2d_aa"),
    # run with dtype=float32 when the caller gave none (the tensor is read as it is)
    "fp32_set_opt_dtype": (
        "softmax.int", "log_softmax.int", "cumprod", "cumsum", "sum", "sum.dim_IntList", "linalg_vector_norm",
        "linalg_matrix_norm", "linalg_matrix_norm.str_ord"),
    # cast floating tensors to the widest floating dtype among them
    "promote": ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "index_put", "scatter_add",
                "tensordot"),
}
# Ops only CPU's lists name: under a CUDA target they run uncast.  Their CPU policy (for the other
# threads, while a capture is in progress): lower precision, promote, else float32.
_CPU_ONLY_LOWER = frozenset({"conv1d.padding", "conv2d.padding", "conv3d.padding", "_native_multi_head_attention",
                             "mkldnn_rnn_layer", "_addmm_activation"})
_CPU_ONLY_PROMOTE = frozenset({"cat", "stack", "index_copy"})

_AUTOCAST_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)


def _eligible(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


def _cast_all(value: Any, dtype: torch.dtype) -> Any:
    """``cached_cast`` over an argument: floating tensors (and lists of them) to ``dtype``."""
    if _eligible(value):
        return value.to(dtype) if value.dtype != dtype else value
    if isinstance(value, (list, tuple)) and any(_eligible(v) for v in value):
        return type(value)(_cast_all(v, dtype) for v in value)
    return value


def _widest(values: Any) -> torch.dtype | None:
    widest = None
    for v in values:
        for t in (v if isinstance(v, (list, tuple)) else (v,)):
            if _eligible(t):
                widest = t.dtype if widest is None else torch.promote_types(widest, t.dtype)
    return widest


def _apply(policy: str, args: tuple, kwargs: dict, low: torch.dtype, op: Any = None) -> tuple[tuple, dict]:
    """The arguments as an autocast policy passes them on."""
    if policy == "lower_precision_fp":
        return tuple(_cast_all(a, low) for a in args), {k: _cast_all(v, low) for k, v in kwargs.items()}
    if policy == "fp32":
        return (tuple(_cast_all(a, torch.float32) for a in args),
                {k: _cast_all(v, torch.float32) for k, v in kwargs.items()})
    if policy == "promote":
        widest = _widest(list(args) + list(kwargs.values()))
        if widest is None:
            return args, kwargs
        return tuple(_cast_all(a, widest) for a in args), {k: _cast_all(v, widest) for k, v in kwargs.items()}
    if policy == "fp32_set_opt_dtype":
        if not (args and _eligible(args[0])):
            return args, kwargs
        names = [a.name for a in op._schema.arguments]
        at = names.index("dtype") if "dtype" in names else None
        if at is not None and at < len(args):
            if args[at] is None:
                args = args[:at] + (torch.float32,) + args[at + 1:]
        elif kwargs.get("dtype") is None:
            kwargs = {**kwargs, "dtype": torch.float32}
        return args, kwargs
    return args, kwargs  # "none": run uncast


_GRAPH_TRACING = [False]  # a graph tracer runs (AOTAutograd): see graph_tracing


@contextlib.contextmanager
def graph_tracing():
    """Inside, the autocast kernels' fall-through ("none") runs the op with autocast excluded instead of
    redispatching past it: under the Python dispatcher a graph tracer turns on, a redispatch from a Python
    kernel comes back to that kernel.  Ops nested in such an op then run uncast (none of a transformer
    block's are: rotate_half's neg and cat, the residual adds)."""
    previous, _GRAPH_TRACING[0] = _GRAPH_TRACING[0], True
    try:
        yield
    finally:
        _GRAPH_TRACING[0] = previous


def _autocast_kernel(op: Any, policy: str, cpu_policy: str, capturing: Callable[[], bool]) -> Callable:
    """An AutocastCPU kernel.  A casting policy runs the op with autocast off for everything inside it,
    as the C++ wrappers do (``ExcludeDispatchKeyGuard``); "none" is a fallthrough: the op runs uncast
    and the ops inside it still see autocast (CUDA's ``cross_entropy_loss`` has no autocast kernel,
    so its ``nll_loss`` is cast to float32 by nll_loss's own)."""

    def kernel(keyset, *args, **kwargs):
        active = policy if capturing() else cpu_policy
        if active == "none":
            if _GRAPH_TRACING[0]:
                with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
                    return op(*args, **kwargs)
            return op.redispatch(keyset.remove(torch._C.DispatchKey.AutocastCPU), *args, **kwargs)
        args, kwargs = _apply(active, args, kwargs, torch.get_autocast_dtype("cpu"), op)
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
            return op(*args, **kwargs)

    return kernel


def _overload(name: str) -> Any:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


SKIPPED: set[str] = set()  # ops whose autocast kernel this torch registers from Python (it cannot be overridden)


def _impl(lib: Any, name: str, fn: Callable, key: str) -> None:
    """``lib.impl(name, fn, key, with_keyset=True)``, skipping an op whose kernel for ``key`` torch itself
    registers from Python (e.g. ``rms_norm``'s AutocastCPU on torch 2.11): that one keeps torch's policy."""
    try:
        lib.impl(name, fn, key, with_keyset=True)
    except RuntimeError:
        SKIPPED.add(f"{name} ({key})")


def register_cuda_autocast(lib: Any, capturing: Callable[[], bool]) -> None:
    """Register CUDA's autocast policies as AutocastCPU kernels in ``lib`` (a ``torch.library.Library``).

    On a thread for which ``capturing()`` is true, autocast on the CPU trace follows CUDA's lists;
    on other threads each op keeps CPU's policy (none for the CUDA-only ops)."""
    names = torch._C._dispatch_get_all_op_names()
    for policy, ops in CUDA_AUTOCAST.items():
        for name in ops:
            try:
                op = _overload(name)
            except (AttributeError, RuntimeError):  # not in this torch release
                continue
            _impl(lib, name, _autocast_kernel(op, policy, "none", capturing), "AutocastCPU")
    for full in names:
        if not full.startswith("aten::"):
            continue
        if not torch._C._dispatch_has_kernel_for_dispatch_key(full, "AutocastCPU") or \
                torch._C._dispatch_has_kernel_for_dispatch_key(full, "AutocastCUDA"):
            continue
        name = full.removeprefix("aten::")
        cpu_policy = ("lower_precision_fp" if name in _CPU_ONLY_LOWER else
                      "promote" if name in _CPU_ONLY_PROMOTE else "fp32")
        try:
            op = _overload(name)
        except (AttributeError, RuntimeError):
            continue
        _impl(lib, name, _autocast_kernel(op, "none", cpu_policy, capturing), "AutocastCPU")


@contextlib.contextmanager
def cuda_autocast_on_cpu() -> Any:
    """The model's own CUDA autocast in a CUDA-target trace, whose autocast is the CPU's running CUDA's lists
    (:func:`register_cuda_autocast`): ``torch.autocast("cuda", ...)``, ``torch.is_autocast_enabled("cuda")``,
    ``torch.get_autocast_dtype("cuda")`` and so ``custom_fwd``/``custom_bwd(device_type="cuda")`` read and set the
    CPU's state for the block.  A region kept in fp32 with ``autocast("cuda", enabled=False)`` was counted in bf16
    (60 % of a step's matmul FLOPs), and ``custom_fwd(device_type="cuda", cast_inputs=torch.float32)`` left its
    inputs uncast (a matmul of two dtypes, refused, where a GPU runs it)."""
    from torch.amp import autocast_mode as amp

    def cpu(device_type: Any) -> Any:
        return "cpu" if device_type == "cuda" else device_type

    init, cast, enabled, dtype = amp.autocast.__init__, amp._cast, torch.is_autocast_enabled, torch.get_autocast_dtype

    def init_cpu(self: Any, device_type: str, *args: Any, **kwargs: Any) -> None:
        init(self, cpu(device_type), *args, **kwargs)

    gpu_dtype = getattr(torch, "get_autocast_gpu_dtype", None)  # (legacy: torchao's Float8Linear reads it)
    amp.autocast.__init__ = init_cpu
    amp._cast = lambda value, device_type, dtype_: cast(value, cpu(device_type), dtype_)
    def enabled_cpu(device_type: Any = None) -> bool:  # (no argument: CUDA's, legacy)
        return enabled(cpu(device_type) if device_type is not None else "cpu")

    def dtype_cpu(device_type: Any) -> Any:
        return dtype(cpu(device_type))

    torch.is_autocast_enabled, torch.get_autocast_dtype = enabled_cpu, dtype_cpu
    if gpu_dtype is not None:
        torch.get_autocast_gpu_dtype = lambda: dtype("cpu")
    try:
        yield
    finally:
        amp.autocast.__init__, amp._cast, torch.is_autocast_enabled, torch.get_autocast_dtype = init, cast, enabled, dtype
        if gpu_dtype is not None:
            torch.get_autocast_gpu_dtype = gpu_dtype

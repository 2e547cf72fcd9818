"""The fake-tensor mode that records the step, and every private ``FakeTensorMode`` API the capture uses.

:class:`RecordingFakeMode` is a ``FakeTensorMode`` subclass that hands each op to the
:class:`~estimator.capture.recorder.Recorder`: one Python layer per op instead of a recording
mode stacked on ``FakeTensorMode`` (each layer costs every op, ``tensor.device`` queries
included).

Private APIs of ``torch._subclasses.fake_tensor`` live here and nowhere else, each behind a
feature check with a fallback to the public behaviour:

* the dispatch-cache front (``_DispatchCacheValidEntry``, ``_cache_key``,
  ``_output_from_cache_entry``): off when this torch release's signatures differ;
* ``FakeTensorMode.cache_clear`` (the op cache shared by every instance): skipped when absent;
* ``aten._grouped_mm`` (mixture-of-experts layers): handled only where the op exists.

Fake kernels that report another output size than the CPU kernel (``mkldnn_rnn_layer``'s
oneDNN workspace, measured once per shape; ``_embedding_bag``'s ``offset2bag``, one element
longer in storage) are corrected here too (:func:`real_output_bytes`).

**Known values.**  Arithmetic on the inputs' own values (position ids, padding and causal masks,
``mask.all()`` checks, a detector's target boxes matched to its anchors) runs on real CPU tensors, so
that code which reads those values (transformers drops an all-ones attention mask and then lets SDPA
take its causal path; a packed-sequence check reads the position ids; RetinaNet's loss indexes the
anchors its targets match) takes the branch a real run takes.  The user's inputs keep their values
(integer and boolean ones, and floating-point ones that need no gradient, up to
:data:`KNOWN_VALUES_LIMIT` elements: see :func:`~.inputs.keeps_values`), and so do integer and boolean
buffers.  An op runs for real when every tensor it reads is real and what it returns is at most
:data:`KNOWN_VALUES_LIMIT` elements (decided on the meta device first; an op whose output size depends
on the values, such as ``repeat_interleave`` of an image grid, runs when its real inputs are small);
an op that reads no tensor runs for real when it makes integer or boolean values, a constant fill, or
one element (a random draw, or ``torch.empty(1)`` that a draw then fills).  Anything that touches a
fake tensor (a weight, or what a weight computed) stays fake.  Real tensors are counted in memory like
any other.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import weakref
from dataclasses import dataclass
from math import prod
from typing import Any, Callable

import torch
import torch._subclasses.fake_tensor as _fake
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.proxy_tensor import get_proxy_mode as _proxy_mode
from torch.utils._python_dispatch import _disable_current_modes, is_traceable_wrapper_subclass
from torch.utils.weak import WeakIdKeyDictionary

from ..compat import optional_op
from ..rules.registry import bind
from .fake_kernels import bf16_sum_fast_path
from .index_bounds import check_known_indices, check_same_dtype, long_targets
from .recorder import METADATA_QUERY_IDS

GROUPED_MM = optional_op("_grouped_mm")  # torch >= 2.8
MKLDNN_RNN_LAYER = optional_op("mkldnn_rnn_layer")
_EMBEDDING_BAG = frozenset(map(id, (torch.ops.aten._embedding_bag.default,
                                    torch.ops.aten._embedding_bag_forward_only.default)))


def fake_grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """``aten._grouped_mm`` on fake tensors of any dtype.

    Its meta kernel accepts bfloat16 only (written for the CUDA kernel), while the CPU kernel
    and transformers' mixture-of-experts layers use it in float32 too: the output is made as
    the meta kernel makes it, in the dtype the CPU kernel returns."""
    from torch._meta_registrations import _create_grouped_mm_output_tensor

    def meta(t):
        return None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")

    # the shape and (padded) strides from the meta kernel's helper, on meta stand-ins; the output made from
    # mat_a so that it is a fake tensor of the mode (a factory call here, inside the mode's dispatch, would
    # make a real tensor, which the next op would adopt as a new storage)
    with _disable_current_modes():
        shape = _create_grouped_mm_output_tensor(meta(mat_a), meta(mat_b), meta(offs), out_dtype or mat_a.dtype)
    return mat_a.new_empty_strided(shape.shape, shape.stride(), dtype=shape.dtype)


def _contiguous(bound: dict) -> torch.memory_format:
    return torch.contiguous_format


def _suggested_by_input(bound: dict) -> torch.memory_format:
    """``input.suggest_memory_format()``: channels-last for a channels-last 4-D (5-D) input, else contiguous."""
    t = bound["input"]
    last = {4: torch.channels_last, 5: torch.channels_last_3d}.get(t.dim())
    return last if last is not None and not t.is_contiguous() and t.is_contiguous(memory_format=last) \
        else torch.contiguous_format


_HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class KernelOutputs:
    """What a kernel makes that its fake kernel does not (applied after the fake kernel has run).

    ``layout``: the memory format of the first output (the result, or the gradient of the input),
    a function of the op's arguments by name.  ``statistics``: the dtype of outputs 1 and 2 (a
    norm's mean and inverse standard deviation) for a 16-bit input: float32 where the weight or
    bias is float32 (ATen's ``param_scalar_type`` of a mixed-type norm), and, with
    ``accumulate_on_cuda``, always on CUDA (the CUDA kernel allocates them in the accumulate type).
    ``input_dtype``: the first output in the dtype of the argument ``input`` (a gradient ATen allocates
    ``empty_like(input)``).
    """

    layout: Callable[[dict], torch.memory_format] | None = None
    statistics: bool = False
    accumulate_on_cuda: bool = False
    input_dtype: bool = False  # the first output (the input's gradient) in the dtype of argument ``input``

    def __call__(self, func: Any, cuda: bool, *args: Any, **kwargs: Any) -> Any:
        out = func(*args, **kwargs)
        bound = bind(func, args, kwargs)
        outs = [out] if isinstance(out, torch.Tensor) else list(out)
        if self.input_dtype and outs[0] is not None and outs[0].dtype != bound["input"].dtype:
            outs[0] = torch.empty_like(outs[0], dtype=bound["input"].dtype)
        if self.layout is not None and outs[0] is not None:
            layout = self.layout(bound)
            if not outs[0].is_contiguous(memory_format=layout):  # the fake kernel's own is kept where it agrees
                outs[0] = torch.empty_like(outs[0], memory_format=layout)
        if self.statistics and bound["input"].dtype in _HALF:
            mixed = any(isinstance(bound.get(n), torch.Tensor) and bound[n].dtype == torch.float32
                        for n in ("weight", "bias"))
            if mixed or (cuda and self.accumulate_on_cuda):
                outs[1:3] = [t if t.dtype == torch.float32 else t.new_empty(t.shape, dtype=torch.float32)
                             for t in outs[1:3]]
        return outs[0] if isinstance(out, torch.Tensor) else tuple(outs)


# The kernels' own choices (ATen's sources; measured on CPU, tests/test_memory.py):
# * layouts: native_layer_norm_backward allocates dX LEGACY_CONTIGUOUS (layer_norm_backward_cpu/_cuda);
#   the structured _log_softmax_backward_data meta sets a contiguous grad_input; mse_loss_backward is
#   zeros_like(input, LEGACY_CONTIGUOUS); batch norm, forward and backward, allocates
#   empty_like(input, input.suggest_memory_format()).  The fake kernels keep the strides of
#   grad_output or of a transposed input, so a transposed tensor (a pooler over tokens, BatchNorm1d
#   over a transposed sequence, a loss over time-major log-probabilities) came out transposed: the
#   next view of it copied, or the next Linear took another kernel, where the real step does not.
# * statistics: layer, group and batch norm of a bf16/fp16 input with float32 weights (autocast) keep
#   float32 means and inverse deviations (cuDNN's batch norm: the weight's dtype); the CUDA layer and
#   batch norm kernels always do (``toAccumulateType``).  The fake kernels make them in the input's
#   dtype.  The H100 reference steps show it (tests/test_cuda_reference.py).
# * dtype: native_group_norm_backward allocates dX as empty_like(X, X.suggest_memory_format()) (group_norm.cpp):
#   a bf16 input with float32 weights (CPU autocast leaves group norm in bf16) gets a bf16 gradient, where the
#   fake kernel computes it in float32 (UniSpeech's feature encoder: 3,281,920 B per layer more than the step).
_BATCH_NORM = KernelOutputs(layout=_suggested_by_input, statistics=True, accumulate_on_cuda=True)
KERNEL_OUTPUTS: dict[Any, KernelOutputs] = {
    torch.ops.aten.native_layer_norm.default: KernelOutputs(statistics=True, accumulate_on_cuda=True),
    torch.ops.aten.native_group_norm.default: KernelOutputs(statistics=True),
    optional_op("cudnn_batch_norm"): KernelOutputs(statistics=True),  # the weight's dtype: float32
    torch.ops.aten.native_layer_norm_backward.default: KernelOutputs(layout=_contiguous),
    torch.ops.aten._log_softmax_backward_data.default: KernelOutputs(layout=_contiguous),
    torch.ops.aten.mse_loss_backward.default: KernelOutputs(layout=_contiguous),
    torch.ops.aten.native_batch_norm_backward.default: KernelOutputs(layout=_suggested_by_input),
    torch.ops.aten.native_group_norm_backward.default: KernelOutputs(layout=_suggested_by_input, input_dtype=True),
    **{optional_op(*name): _BATCH_NORM for name in (
        ("native_batch_norm", "default"), ("_native_batch_norm_legit", "default"), ("_native_batch_norm_legit", "no_stats"),
        ("_native_batch_norm_legit_no_training", "default"), ("_native_batch_norm_legit_functional", "default"))},
}
KERNEL_OUTPUTS.pop(None, None)  # an op this torch release does not have


def output_kernels(cuda: bool) -> dict[int, Any]:
    """``Recorder.substitute`` entries (id(op) -> function of the op's arguments) for :data:`KERNEL_OUTPUTS`."""
    return {id(op): functools.partial(fix, op, cuda) for op, fix in KERNEL_OUTPUTS.items()}

_REAL_SIZE_CACHE: dict[tuple, dict[int, int]] = {}


# Losses whose reduced (0-d) output keeps the storage of the unreduced one, on CPU and CUDA alike:
# mse_loss and smooth_l1_loss are structured kernels whose meta function allocates the output as the
# elementwise loss (a binary op of input and target) and whose mean_out/sum_out then resizes it to
# 0-d in place; soft_margin_loss and binary_cross_entropy compute into an input-sized output and
# ``resize_({})`` it (ATen's Loss.cpp, BinaryCrossEntropy, Loss.cu).  ``resize_`` keeps the storage, and
# the loss tensor lives until the training loop drops it.
_REDUCED_IN_PLACE = frozenset(map(id, (torch.ops.aten.mse_loss.default, torch.ops.aten.smooth_l1_loss.default,
                                        torch.ops.aten.soft_margin_loss.default,
                                        torch.ops.aten.binary_cross_entropy.default)))


def _reduced_loss_bytes(func: Any, args: tuple, kwargs: dict, outs: list) -> dict[int, int] | None:
    """Storage bytes of a loss that reduces in place (:data:`_REDUCED_IN_PLACE`): the elementwise
    loss's, the broadcast shape of input and target in the output's dtype."""
    if id(func) not in _REDUCED_IN_PLACE or not outs or outs[0].dim() != 0:
        return None  # reduction="none" returns the elementwise loss itself
    bound = bind(func, args, kwargs)
    elements = prod(torch.broadcast_shapes(bound["self"].shape, bound["target"].shape))
    return {0: elements * outs[0].element_size()}


_IM2COL = (torch.ops.aten.im2col.default, torch.ops.aten.col2im.default)


def real_output_bytes(func: Any, args: tuple, kwargs: dict, outs: list, cpu: bool = True) -> dict[int, int] | None:
    """Output sizes (output index -> bytes) where a fake kernel reports another size than the kernel.

    On every target: losses that reduce in place keep their elementwise storage
    (:func:`_reduced_loss_bytes`).  On the CPU (``cpu``):

    * ``aten.mkldnn_rnn_layer`` (``nn.LSTM``/``nn.GRU`` on CPU) returns a oneDNN workspace that
      backward reads; its meta kernel says 0 bytes, the real one is page-aligned parts whose size
      depends on the shapes.  It is measured once per shape by running the CPU kernel on zeros of
      the same shapes (the inputs and weights of one recurrent layer: small).
    * ``aten._embedding_bag`` (``nn.EmbeddingBag``, saved for backward): where the CPU kernel
      fills ``offset2bag`` (mean and max bags, sums off its fast path) it sizes it to
      ``indices + 1`` elements, then shrinks the tensor to ``indices`` with ``resize_``, which
      keeps the storage (ATen's EmbeddingBag.cpp, ``make_offset2bag_out``); the meta kernel's
      storage is the tensor's size.  The CUDA kernel sizes it exactly.

    On every target, ``aten.im2col`` / ``aten.col2im`` (``F.unfold`` / ``F.fold``) make their output with
    ``empty_like(input)`` and ``resize_`` it to its shape, which keeps the larger storage (ATen's Im2Col.cpp,
    Col2Im.cpp and their .cu): a fold's output holds its input's bytes, the kernel area times its own.
    """
    if func in _IM2COL and outs and isinstance(args[0], torch.Tensor):
        held = args[0].numel() * args[0].element_size()
        return {0: held} if held > outs[0].numel() * outs[0].element_size() else None
    reduced = _reduced_loss_bytes(func, args, kwargs, outs)
    if reduced is not None or not cpu:
        return reduced
    if id(func) in _EMBEDDING_BAG:
        offset2bag = outs[1] if len(outs) > 1 else None  # (output, offset2bag, bag_size, max_indices)
        if offset2bag is None or offset2bag.numel() == 0:
            return None  # the sum fast path: no offset2bag
        if bf16_sum_fast_path(func, args, kwargs, outs[0]):
            return {1: 0}
        return {1: (offset2bag.numel() + 1) * offset2bag.element_size()}
    if func is not MKLDNN_RNN_LAYER or func is None:
        return None
    key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else
                (tuple(a) if isinstance(a, list) else a) for a in args)
    hit = _REAL_SIZE_CACHE.get(key)
    if hit is None:
        with _disable_current_modes():
            real = [torch.zeros(a.shape, dtype=a.dtype) if isinstance(a, torch.Tensor) else a for a in args]
            out = func(*real, **kwargs)
        workspace = out[3] if isinstance(out, (tuple, list)) and len(out) > 3 else None
        hit = _REAL_SIZE_CACHE[key] = (
            {3: workspace.untyped_storage().nbytes()} if isinstance(workspace, torch.Tensor) else {})
    return hit


def clear_shared_cache() -> None:
    """Empty the op cache every ``FakeTensorMode`` shares.

    An output rebuilt from that cache does not keep the aliasing between outputs
    (``mkldnn_rnn_layer_backward`` returns one tensor as both bias gradients), so a trace would
    depend on what was traced before it in the process."""
    clear = getattr(FakeTensorMode, "cache_clear", None)
    if clear is not None:
        clear()


KNOWN_VALUES_LIMIT = 1 << 24  # elements an op may return on real tensors (64 MiB of int32)
_SCALAR_READS = frozenset(map(id, (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default,
                                   torch.ops.aten.equal.default)))


def _all_real(values: Any) -> bool | None:
    """True when every tensor in ``values`` (nested lists/tuples) has data, False when one is fake or
    meta, None when there is no tensor."""
    found = None
    for a in values:
        if isinstance(a, torch.Tensor):
            if type(a) is FakeTensor or a.is_meta or is_traceable_wrapper_subclass(a):
                return False  # a subclass (DTensor) holds fake tensors inside
            found = True
        elif isinstance(a, (list, tuple)) and a:
            inner = _all_real(a)
            if inner is False:
                return False
            found = found or inner
    return found


def _runs_on_known_values(func: Any, args: tuple, kwargs: dict, floats: bool = True) -> bool:
    """Whether ``func`` reads only real tensors (at least one) and returns at most :data:`KNOWN_VALUES_LIMIT`
    elements, or reads none and makes small integer/boolean values, a constant fill or one element (or is
    a scalar read of a real tensor): then it runs for real and its values stay known.  ``floats`` False: only
    integer and boolean outputs (a real step's fake backward, where the real tensors are what forward saved
    and floating-point work on them is the backward's own, to be done on fake tensors)."""
    real = _all_real(args)
    if real is False or (kwargs and _all_real(kwargs.values()) is False):
        return False
    if id(func) in _SCALAR_READS:
        return bool(real)
    meta_args, meta_kwargs = pytree.tree_map_only(torch.Tensor, lambda t: t.to("meta"), (args, kwargs))
    if "device" in _argument_names(func):
        meta_kwargs["device"] = torch.device("meta")
    try:
        out = func(*meta_args, **meta_kwargs)
    except Exception:
        # no meta kernel, or an output size that depends on the values (repeat_interleave, nonzero):
        # small real inputs run for real, as a real step would; the rest is for the fake path to decide
        inputs = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        return bool(real) and sum(t.numel() for t in inputs) <= KNOWN_VALUES_LIMIT
    outs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
    if real is None and id(func) in _RANDOM_FACTORIES and len(outs) == 1 and outs[0].numel() == 1:
        return True  # one random draw (LayerDrop's torch.rand([]) < p): real, so a branch on it can be taken
    if real is None and id(func) in _CONSTANT_FACTORIES and len(outs) == 1 and outs[0].numel() <= KNOWN_VALUES_LIMIT:
        return True  # a constant fill (OPT's float all-ones attention mask): its values are known
    integral = all(not (o.is_floating_point() or o.is_complex()) for o in outs)
    return bool(outs) and (bool(real and floats) or integral) and sum(o.numel() for o in outs) <= KNOWN_VALUES_LIMIT


# All-ones fills made from shapes alone, real whatever their dtype: the attention mask a model makes when
# none is given (OPT's and BigBird's float torch.ones), whose values decide whether the mask is skipped.
# Zero fills stay fake: they are states and accumulators (an RNN's h0), whose values no branch reads.
_CONSTANT_FACTORIES = frozenset(map(id, [torch.ops.aten.ones.default]))

# Fills shaped like their input (``ones_like``, ``zeros_like``, ``full_like``) whose output is integral or
# boolean: the values do not depend on the input's, so they are made real whatever the input is (HF's CTC
# heads count frames with ``torch.ones_like(input_values, dtype=torch.long).sum(-1)``).
_LIKE_FILLS = {id(torch.ops.aten.ones_like.default): 1, id(torch.ops.aten.zeros_like.default): 0,
               id(torch.ops.aten.full_like.default): None}  # op -> its fill (None: full_like's argument)


def _integral_fill(args: tuple, kwargs: dict) -> bool:
    src = args[0] if args else None
    if not isinstance(src, torch.Tensor) or src.layout is not torch.strided:
        return False
    dtype = kwargs.get("dtype") or src.dtype
    return not (dtype.is_floating_point or dtype.is_complex) and src.numel() <= KNOWN_VALUES_LIMIT


def _real_fill(fill: Any, src: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """What ``ones_like`` / ``zeros_like`` (``fill``) or ``full_like(src, value)`` gives, as a real CPU tensor."""
    if fill is None:
        fill = args[0] if args else kwargs["fill_value"]
    return torch.full(tuple(src.shape), fill, dtype=kwargs.get("dtype") or src.dtype)


# Ops that take a list of indices in which a boolean mask selects positions (x[mask], x[mask] = v): with a
# mask whose values the trace knows, its positions replace it (ATen's expandTensors does the same), since
# FakeTensorMode treats any boolean index as a data-dependent size (Qwen2-VL-style rotary positions).
_MASK_INDEXED = frozenset(map(id, [torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default,
                                   torch.ops.aten.index_put_.default, torch.ops.aten._index_put_impl_.default]))


def _is_mask(index: Any) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


def _writes_real(args: tuple, kwargs: dict) -> bool:
    """A mutating op with a real tensor among its arguments (a buffer whose values are kept, see
    :func:`~.inputs.keeps_values`): the mode would write a fake copy of it."""
    return any(type(t) is torch.Tensor and not t.is_meta for t in pytree.tree_leaves((args, kwargs)))


def _known_masks(args: tuple) -> bool:
    """A fake tensor indexed by masks that are all real (their values known)."""
    if len(args) < 2 or type(args[0]) is not FakeTensor or not isinstance(args[1], (list, tuple)):
        return False
    masks = [i for i in args[1] if _is_mask(i)]
    return bool(masks) and all(type(m) is torch.Tensor and not m.is_meta for m in masks)


def _masks_as_positions(indices: list) -> list:
    out: list = []
    for index in indices:  # (every mask here is real: _known_masks)
        out.extend(index.nonzero().unbind(1) if _is_mask(index) else [index])  # one index per dim it covers
    return out


# Random factories whose single-element draw runs for real (from the capture's seeded generator): a
# model that compares one draw with a probability (OPT's, BART's and wav2vec2's LayerDrop, stochastic
# depth written by hand) branches on its value, which a fake draw does not have.  ``empty`` of one
# element is the scratch a draw then fills (torchvision's detection transform picks its training size
# with ``torch.empty(1).uniform_(0, n).item()``).
_RANDOM_FACTORIES = frozenset(map(id, [getattr(torch.ops.aten, n).default for n in ("rand", "randn")]
                                  + [torch.ops.aten.rand.generator, torch.ops.aten.randn.generator,
                                     torch.ops.aten.empty.memory_format]))


_ARG_NAMES: dict[int, frozenset[str]] = {}


def _argument_names(func: Any) -> frozenset[str]:
    names = _ARG_NAMES.get(id(func))
    if names is None:
        schema = getattr(func, "_schema", None)
        names = _ARG_NAMES[id(func)] = frozenset(a.name for a in schema.arguments) if schema else frozenset()
    return names


_KEY_SCALARS = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                          torch.memory_format})
_BYPASS = object()


def _signature(fn: Any) -> list[str] | None:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


# The private cache API the fast front uses, as torch 2.11-2.14 have it; without it (other
# releases) the front is off and FakeTensorMode keys every op itself.
FAST_CACHE = (
    all(hasattr(_fake, n) for n in ("_DispatchCacheValidEntry", "_DispatchCacheBypassEntry"))
    and _signature(getattr(FakeTensorMode, "_output_from_cache_entry", None))
    == ["self", "state", "entry", "key", "func", "args"]
    and _signature(getattr(FakeTensorMode, "_cache_key", None)) == ["self", "state", "func", "args", "kwargs"]
    and hasattr(FakeTensorMode, "_cached_dispatch_impl")
    and hasattr(FakeTensorMode, "cache")
)


class RecordingFakeMode(FakeTensorMode):
    """The fake-tensor mode that records: each op dispatched while :meth:`recording_on` is active
    goes through ``recorder.record``."""

    def __init__(self, recorder: Any, **kwargs: Any):
        super().__init__(**kwargs)
        self.rec = recorder
        self.recording = False
        self._depth = 0
        self._fast_entries: dict[tuple, Any] = {}
        self._key_slot: list | None = None
        # real tensors an op mixes with fake ones become fake tensors that stand for them in the recorder
        # (same storage id and record): a real step's backward on fake tensors (.step: _fake_from_here)
        self.adopt_real = False
        # real tensors a computed (fake) value was written into: their values unknown from then on (_stale_written)
        self._stale: WeakIdKeyDictionary = WeakIdKeyDictionary()
        # real tensors an op writes for real (their values known): id -> (a weak reference to the tensor, its values
        # before), put back by restore_written where it still lives (a discriminator's BatchNorm counter in loss_fn
        # went 0 -> 1 -> 2 over two estimates); weak, so that the step's own temporaries die when they would
        self._written: dict[int, tuple[Any, torch.Tensor]] = {}

    def restore_written(self) -> None:
        """Every real tensor the step wrote, as it was before (outside any dispatch mode)."""
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes(), torch.no_grad():
            for ref, before in self._written.values():
                t = ref()
                if t is not None:
                    t.copy_(before)
        self._written.clear()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self._depth or not self.recording or id(func) in METADATA_QUERY_IDS:
            # setup, an op FakeTensorMode runs inside another, or a metadata query
            return self.dispatch(func, types, args, kwargs)
        kwargs = kwargs or {}
        self._depth += 1
        try:
            if len(self._stale):
                args, kwargs = pytree.tree_map_only(
                    torch.Tensor, lambda t: self._stand_in(t) if t in self._stale else t, (args, kwargs))
            if _runs_on_known_values(func, args, kwargs, floats=not self.adopt_real):
                # inside this method the mode is off: ``func`` runs the CPU kernel on the real tensors
                if func._schema.is_mutable:
                    for value, arg in zip(args, func._schema.arguments):
                        if arg.alias_info is not None and arg.alias_info.is_write and type(value) is torch.Tensor:
                            entry = self._written.get(id(value))  # (an id a dead tensor had may come again)
                            if entry is None or entry[0]() is not value:
                                self._written[id(value)] = (weakref.ref(value), value.detach().clone())
                return self.rec.record(func, args, kwargs, func)
            if id(func) in _LIKE_FILLS and _integral_fill(args, kwargs):
                # an integer fill shaped like a fake tensor: its values are known without the input's
                return self.rec.record(func, args, kwargs, functools.partial(_real_fill, _LIKE_FILLS[id(func)]))
            if id(func) in _MASK_INDEXED and _known_masks(args):
                # a fake tensor indexed by a boolean mask whose values are known: as ATen does, the mask's
                # nonzero positions as integer indices, so the output's size is known
                return self.rec.record(func, args, kwargs, lambda *a, **k: self.dispatch(
                    func, types, (a[0], _masks_as_positions(a[1]), *a[2:]), k))
            if func.namespace != "profiler":  # (a failed check names this op, not the one recorded before it)
                self.rec.current_op = func
            check_known_indices(func, args, kwargs)  # (the real kernel's check, where the indices are known)
            check_same_dtype(func, args, kwargs)
            if self.adopt_real or (func._schema.is_mutable and _writes_real(args, kwargs)):
                # (a computed value written into a buffer whose values are kept, MoCo's queue `bank[p:p+B] = z`:
                # the write is to the buffer's storage, not to a fake copy of it the size of the buffer)
                self._stale_written(func, args)
                args, kwargs = pytree.tree_map_only(torch.Tensor, self._stand_in, (args, kwargs))
            # ``dispatch`` is FakeTensorMode.__torch_dispatch__ without its wrappers (a dynamo
            # guard that this method already has, and a call counter)
            return self.rec.record(func, args, kwargs,
                                   lambda *a, **k: self.dispatch(func, types, *long_targets(func, a, k)))
        finally:
            self._depth -= 1

    def _stale_written(self, func: Any, args: tuple) -> None:
        """The real tensors ``func`` writes (with a fake value among its arguments): from here on their values are
        unknown, and every op takes their fake stand-in (an index made by ``Tensor.new`` and filled by a fake
        ``scatter_``, Reformer's inverse permutation, kept the memory's garbage as known values: a false IndexError)."""
        for value, arg in zip(args, func._schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write and type(value) is torch.Tensor \
                    and not value.is_meta and not self.adopt_real:
                self._stale[value] = True

    def _stand_in(self, t: torch.Tensor) -> torch.Tensor:
        """The fake tensor that stands for the real tensor ``t`` (FakeTensorMode's own conversion, which
        keeps views of one storage on one fake storage), adopted by the recorder the first time."""
        if type(t) is not torch.Tensor or t.is_meta:
            return t
        fake = self.from_tensor(t)  # (the same fake tensor for as long as ``t`` lives)
        if not getattr(fake, "_estimator_adopted", False):
            fake._estimator_adopted = True
            self.rec.adopt(fake, t)
        return fake

    @contextlib.contextmanager
    def recording_on(self):
        previous, self.recording = self.recording, True
        try:
            yield
        finally:
            self.recording = previous

    # -- a faster front for FakeTensorMode's dispatch cache -------------------------------
    # FakeTensorMode caches each op's output metadata under a key built in Python from every
    # argument's full TensorMetadata (about a quarter of a trace's time). This front keys the
    # same cache entries by a tuple read straight off the tensors: every field FakeTensorMode's
    # key holds (dtype, shape, stride, device, storage offset and size, requires_grad, conj/neg,
    # inference, quantized; scalars with their type; container types and lengths) plus the
    # global state it holds, so equal tuples mean equal FakeTensorMode keys. Anything it does
    # not know (symbolic sizes, constants, sparse tensors, other argument types) goes the
    # ordinary way.

    def _cached_dispatch_impl(self, func, types, args, kwargs):
        fkey = self._fast_key(func, args, kwargs) if FAST_CACHE else None
        if fkey is None:
            return super()._cached_dispatch_impl(func, types, args, kwargs)
        hit = self._fast_entries.get(fkey)
        if hit is not None:
            if hit is _BYPASS:
                return self._dispatch_impl(func, types, args, kwargs)
            state, entry, key = hit
            return self._output_from_cache_entry(state, entry, key, func, args)
        # A miss: FakeTensorMode dispatches as usual; its key (the first one it computes, before
        # any nested op) is caught by _cache_key below and the entry it made is remembered.
        slot: list = []
        self._key_slot = slot
        out = super()._cached_dispatch_impl(func, types, args, kwargs)
        if not slot:  # no key at all: FakeTensorMode bypasses its cache for this op
            self._fast_entries[fkey] = _BYPASS
            return out
        state, key = slot[0]
        entry = FakeTensorMode.cache.get(key)
        if isinstance(entry, _fake._DispatchCacheValidEntry):
            self._fast_entries[fkey] = (state, entry, key)
        elif isinstance(entry, _fake._DispatchCacheBypassEntry):
            self._fast_entries[fkey] = _BYPASS
        return out

    def _cache_key(self, state, func, args, kwargs):
        slot, self._key_slot = self._key_slot, None
        key = super()._cache_key(state, func, args, kwargs)
        if slot is not None:
            slot.append((state, key))
        return key

    def _fast_key(self, func, args, kwargs) -> tuple | None:
        if self.shape_env is not None or type(func) is not torch._ops.OpOverload:
            return None
        key = [func, torch.get_default_dtype(), torch._C._get_default_device(),
               torch.is_inference_mode_enabled(), _proxy_mode() is not None]
        if not self._key_parts(key, args):
            return None
        if kwargs:
            for name, value in kwargs.items():
                key.append(name)
                if not self._key_parts(key, (value,)):
                    return None
        return tuple(key)

    def _key_parts(self, key: list, values) -> bool:
        for a in values:
            kind = type(a)
            if kind is FakeTensor:
                if a.fake_mode is not self or a.constant is not None or a.layout is not torch.strided:
                    return False
                key.append((a.dtype, a.shape, a.stride(), a.fake_device, a.storage_offset(),
                            a.untyped_storage().nbytes(), a.requires_grad, a.is_conj(), a.is_neg(),
                            a.is_inference(), a.is_quantized))
            elif kind in _KEY_SCALARS:
                key.append(kind)
                key.append(a)
            elif kind is list or kind is tuple or kind is torch.Size:
                key.append(kind)
                key.append(len(a))
                if not self._key_parts(key, a):
                    return False
            else:
                return False
        return True

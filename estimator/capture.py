"""Capture one training step (forward, loss, backward, optimizer step) as a torch.fx graph.

The step runs on fake tensors (``FakeTensorMode``): shapes, dtypes and
aliasing are exact, but no weight or activation is ever allocated, so a 70B
model is captured on a laptop.  The fake-tensor mode itself (a ``FakeTensorMode``
subclass; a ``TorchDispatchMode`` on real tensors) records every aten op
that reaches the kernels, forward and backward alike, in execution order, as a
light :class:`~estimator.graph.OpNode` record; ``Capture.graph`` turns them
into ``call_function`` nodes of an ``fx.Graph`` on first access.  This works for any module,
including those ``torch.fx.symbolic_trace`` cannot trace (HF transformers),
because it records what runs rather than reading Python source.

Each node carries, in ``node.meta``:

* ``spec``: :class:`~estimator.rules.registry.TensorSpec` of each tensor output,
* ``storage``: the storage id of each tensor output (views and in-place results share
  their base's id),
* ``module``: the module path that produced it (backward ops inherit the path of the
  forward op whose autograd node runs them, matched by autograd sequence number),
* ``phase``: ``forward``, ``loss``, ``backward`` or ``optimizer``.

Data-dependent Python control flow (``if x.sum() > 0:``) cannot run on fake
tensors; the step is then captured again on small real CPU tensors when the
model fits in memory, else a :class:`UserError` names the module and op.

Storage lifetimes are observed, not guessed: the recorder holds no reference
to any traced tensor, and a ``weakref.finalize`` on each storage records the
moment it is freed.  Fake tensors follow the same reference counting as real
ones (Python variables, autograd's saved tensors released when their backward
node has run, ``.grad`` accumulation), so the ``events`` list (allocation and
free, in execution order) is the memory timeline of the step; see
:mod:`estimator.memory`.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import logging
import operator
import os
import weakref
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import torch
import torch.fx as fx
import torch._subclasses.fake_tensor as _fake
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)
from torch.fx.experimental.proxy_tensor import get_proxy_mode as _proxy_mode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.nn.utils.stateless import _reparametrize_module
from torch.utils.weak import WeakIdKeyDictionary

from .errors import UnsupportedModelError, UserError
from .graph import OpNode, to_fx
from .optim import build_optimizer, wants_fused
from .precision import Precision, parse_precision
from .rules.registry import TensorSpec
from .target import CudaKernels

log = logging.getLogger(__name__)
aten = torch.ops.aten

PHASES = ("forward", "loss", "backward", "optimizer")
LOSS_MODULE = "(loss)"
INPUT_MODULE = "(input)"
OPTIMIZER_MODULE = "(optimizer)"

# Metadata queries: they return no tensor and do no work, so they are not graph nodes.
_METADATA_QUERIES = frozenset(
    {
        torch.ops.prim.device.default,
        torch.ops.prim.layout.default,
        aten.sym_size.int,
        aten.sym_stride.int,
        aten.sym_numel.default,
        aten.sym_storage_offset.default,
        aten.is_contiguous.default,
        aten.is_contiguous.memory_format,
        aten.is_strides_like_format.default,
        aten.is_non_overlapping_and_dense.default,
        aten.dim.default,
        aten.size.default,
        aten.stride.default,
    }
)
_METADATA_QUERY_IDS = frozenset(map(id, _METADATA_QUERIES))  # OpOverload.__hash__ is Python code: slow
_DATA_DEPENDENT = (DataDependentOutputException, DynamicOutputShapeException)


def _fake_grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """``aten._grouped_mm`` on fake tensors of any dtype.

    Its meta kernel accepts bfloat16 only (written for the CUDA kernel), while the CPU kernel
    and transformers' mixture-of-experts layers use it in float32 too: the output is made as
    the meta kernel makes it, in the dtype the CPU kernel returns."""
    from torch._meta_registrations import _create_grouped_mm_output_tensor

    return _create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype or mat_a.dtype)


_REAL_SIZE_CACHE: dict[tuple, dict[int, int]] = {}


def _real_output_bytes(func: Any, args: tuple, kwargs: dict) -> dict[int, int] | None:
    """Output sizes (output index -> bytes) where a fake kernel reports another size than the CPU one.

    ``aten.mkldnn_rnn_layer`` (``nn.LSTM``/``nn.GRU`` on CPU) returns a oneDNN workspace that
    backward reads; its meta kernel says 0 bytes, the real one is page-aligned parts whose size
    depends on the shapes.  It is measured once per shape by running the CPU kernel on zeros of
    the same shapes (the inputs and weights of one recurrent layer: small).
    """
    if func is not aten.mkldnn_rnn_layer.default:
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


def _identifier(name: str) -> str:
    """A Python identifier for a placeholder name such as ``param_layers.0.weight``."""
    return "".join(c if c.isalnum() else "_" for c in name)


def tensor_spec(t: torch.Tensor) -> TensorSpec:
    return TensorSpec(tuple(t.shape), t.dtype)


@dataclass
class Capture:
    """A captured training step: the fx graph plus what the tallies and the memory simulation need.

    Storages are named by *storage ids* (``sid``), small integers given in order of
    first sight; ``storage_bytes[sid]`` is the size.  ``events`` is the memory
    timeline: ``(node_index, sid, +bytes)`` when a storage is first produced by the
    op recorded as ``nodes[node_index]`` and ``(node_index, sid, -bytes)`` when it is
    freed after that op (index -1: before the first op).  The traced tensors kept
    here (parameters, buffers, inputs, gradients, optimizer state) are the ones
    alive at the end of the step.
    """

    records: list[OpNode]  # placeholders, then every recorded op (getitem included) in order
    nodes: list[OpNode]  # the aten ops in execution order (events index into it)
    outputs: tuple[OpNode, ...]
    mode: str  # "fake" or "real"
    loss_source: str
    module_types: dict[str, str]  # module path -> class name
    module_outputs: dict[str, list[tuple[int, ...]]]  # module path -> output shapes (first call)
    params: dict[str, torch.Tensor]  # name -> the traced parameter, deduplicated (tied weights once)
    param_owner: dict[str, str]  # param/buffer name -> owning module path
    buffers: dict[str, torch.Tensor]
    inputs: list[torch.Tensor]  # flat list of traced input tensors
    saved: dict[int, tuple[int, str]]  # sid -> (nbytes, module) held by autograd at the end of forward
    grads: dict[str, torch.Tensor]  # param name -> traced gradient
    optimizer_state: dict[str, dict[str, torch.Tensor]]  # param name -> state tensors
    optimizer_name: str | None
    storage_bytes: list[int]
    storage_dtype: list[torch.dtype]
    events: list[tuple[int, int, int]]
    sids: dict[str, set[int]]  # category -> sids: parameter, buffer, input, gradient, optimizer_state, saved, loss
    fallback_reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    _fx: fx.Graph | None = None

    @property
    def graph(self) -> fx.Graph:
        """The step as a ``torch.fx.Graph`` (built on first access; nodes share the records' meta)."""
        if self._fx is None:
            self._fx = to_fx(self.records, self.outputs)
        return self._fx


class _Recorder(TorchDispatchMode):
    """Records each dispatched aten op as an fx node, with its module, phase and storage events.

    It holds no strong reference to any tensor it sees, so tensors die when the
    traced program drops them, and each storage's death is recorded.
    """

    def __init__(self, fake: bool):
        super().__init__()
        self.fake = fake
        self.fake_values = fake  # tensor values are unknown (fake or meta), so .item() cannot run
        self.target = "cpu"  # the target device's kernels (see estimator.target)
        # tensor -> the record that produced it: an attribute on the tensors the step makes (cheap on
        # the hot path), a weak dictionary for tensors that are not ours (constants of the model)
        self.constants: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.placeholders: list[OpNode] = []
        self.records: list[OpNode] = []  # every call_function record, getitem included
        self.order: list[OpNode] = []  # aten ops only
        self.phase = "forward"
        self.module_stack: list[str] = []
        self.seq_module: dict[int, tuple[str, OpNode]] = {}  # autograd seq nr -> (module, forward node)
        self.accumulate_owner: Callable[[Any], str] = lambda fn: ""
        self.current_op: Any = None
        self.current_module = ""
        self.n_constants = 0
        # storage bookkeeping
        self.sid_of: dict[int, tuple[int, Any]] = {}  # live storage _cdata -> (sid, weakref to the storage)
        self.storage_bytes: list[int] = []
        self.storage_dtype: list[torch.dtype] = []  # dtype of the first tensor seen on each storage
        self.events: list[tuple[int, int, int]] = []
        self.closed = False

    # -- storages -------------------------------------------------------------
    def sid(self, t: torch.Tensor, nbytes: int | None = None) -> int:
        """The storage id of ``t``; a storage seen for the first time is allocated now
        (``nbytes``: its real size, where the fake kernel's differs)."""
        st = t.untyped_storage()
        cdata = st._cdata
        entry = self.sid_of.get(cdata)
        # The identity check matters: a storage's address can be reused by a new storage before
        # the finalizer of the old one has run.
        if entry is not None and entry[1]() is st:
            return entry[0]
        sid = len(self.storage_bytes)
        nbytes = st.nbytes() if nbytes is None else nbytes
        self.sid_of[cdata] = (sid, weakref.ref(st))
        self.storage_bytes.append(nbytes)
        self.storage_dtype.append(t.dtype)
        self.events.append((len(self.order) - 1, sid, nbytes))
        fin = weakref.finalize(st, self._freed, cdata, sid)
        fin.atexit = False
        return sid

    def adopt(self, twin: torch.Tensor, original: torch.Tensor) -> None:
        """Let ``twin`` stand for ``original``: same storage id and record, no allocation."""
        st = twin.untyped_storage()
        self.sid_of[st._cdata] = (self.sid(original), weakref.ref(st))
        self.set_node(twin, self._node_of(original))

    def _freed(self, cdata: int, sid: int) -> None:
        if self.closed:
            return
        entry = self.sid_of.get(cdata)
        if entry is not None and entry[0] == sid:
            del self.sid_of[cdata]
        self.events.append((len(self.order) - 1, sid, -self.storage_bytes[sid]))

    # -- placeholders -------------------------------------------------------
    def placeholder(self, name: str, t: torch.Tensor, kind: str, module: str = "") -> OpNode:
        node = OpNode("placeholder", _identifier(name), name,
                      meta=dict(spec=(tensor_spec(t),), storage=(self.sid(t),), module=module, phase=kind, kind=kind))
        self.placeholders.append(node)
        if kind == "constant":
            self.constants[t] = node
        else:
            t._estimator_node = node
        return node

    def set_node(self, t: torch.Tensor, node: OpNode) -> None:
        t._estimator_node = node

    def node_of(self, t: torch.Tensor) -> OpNode | None:
        """The record that produced ``t`` (None if none did)."""
        node = getattr(t, "_estimator_node", None)
        return node if node is not None else self.constants.get(t)

    def _node_of(self, t: torch.Tensor) -> OpNode:
        node = self.node_of(t)
        if node is None:  # a tensor created outside the trace (a constant attribute, torch.tensor(...))
            self.n_constants += 1
            node = self.placeholder(f"constant_{self.n_constants}", t, "constant", self._where()[0])
        return node

    def _map(self, value: Any) -> Any:
        """``value`` with every tensor replaced by the record that produced it."""
        if isinstance(value, torch.Tensor):
            return self._node_of(value)
        if isinstance(value, (list, tuple)):
            return type(value)(self._map(v) for v in value) if value else value
        if isinstance(value, dict):
            return {k: self._map(v) for k, v in value.items()}
        return value

    # -- attribution --------------------------------------------------------
    def _where(self) -> tuple[str, OpNode | None]:
        """(module path, forward node) of the op being dispatched now."""
        if self.phase in ("forward", "loss"):
            return (self.module_stack[-1] if self.module_stack else LOSS_MODULE), None
        if self.phase == "backward":
            fn = torch._C._current_autograd_node()
            if self.module_stack:  # recomputation inside backward (activation checkpointing)
                return self.module_stack[-1], None
            if fn is None:
                return LOSS_MODULE, None
            hit = self.seq_module.get(fn._sequence_nr())
            if hit is not None:
                return hit
            return self.accumulate_owner(fn), None
        return OPTIMIZER_MODULE, None

    # -- the hook -----------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.record(func, args, kwargs or {}, func)

    def record(self, func, args, kwargs, run):
        """Run the op (``run(*args, **kwargs)``) and record it."""
        if id(func) in _METADATA_QUERY_IDS:
            return run(*args, **kwargs)
        if func is aten._local_scalar_dense.default and self.fake_values and self.phase == "optimizer":
            # Optimizers read scalar step counts (``step.item()``); any value gives the same shapes.
            # 0.5 keeps formulas such as NAdam's 1 / (1 - mu_product) finite.
            return 0.5
        self.current_op = func
        self.current_module = self.module_stack[-1] if self.module_stack else ""
        node_args = tuple(self._map(a) for a in args)
        node_kwargs = {k: self._map(v) for k, v in kwargs.items()} if kwargs else {}
        if self.fake and func is aten._grouped_mm.default:
            out = _fake_grouped_mm(*args, **kwargs)
        else:
            out = run(*args, **kwargs)
        module, fwd_node = self._where()
        if isinstance(out, torch.Tensor):
            flat_out = [out]
        else:
            flat_out = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        meta: dict[str, Any] = {"module": module, "phase": self.phase}
        node = OpNode("call_function", f"op_{len(self.records)}", func, node_args, node_kwargs, meta)
        self.order.append(node)  # first, so that the allocations below are events of this op
        self.records.append(node)
        meta["spec"] = tuple(tensor_spec(o) for o in flat_out)
        real_sizes = _real_output_bytes(func, args, kwargs) if self.fake and self.target == "cpu" else None
        meta["storage"] = tuple(self.sid(o, real_sizes.get(i) if real_sizes else None) for i, o in enumerate(flat_out))
        if fwd_node is not None:
            meta["forward_node"] = fwd_node
        if self.phase in ("forward", "loss"):
            # The autograd node created for this op (if any) has the latest sequence number.
            self.seq_module[torch.autograd._get_sequence_nr() - 1] = (module, node)
        if isinstance(out, torch.Tensor):
            out._estimator_node = node
        else:
            for i, o in enumerate(flat_out):
                item = OpNode("call_function", f"op_{len(self.records)}", operator.getitem, (node, i), None,
                              dict(spec=(meta["spec"][i],), storage=(meta["storage"][i],), module=module,
                                   phase=self.phase))
                self.records.append(item)
                o._estimator_node = item
        return out


_KEY_SCALARS = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                          torch.memory_format})
_BYPASS = object()
# The private cache API the fast front uses, as torch 2.13 and 2.14 have it; without it (other
# releases) the front is off and FakeTensorMode keys every op itself.
_FAST_CACHE = all(hasattr(_fake, n) for n in ("_DispatchCacheValidEntry", "_DispatchCacheBypassEntry")) and (
    list(inspect.signature(FakeTensorMode._output_from_cache_entry).parameters)
    == ["self", "state", "entry", "key", "func", "args"]) and (
    list(inspect.signature(FakeTensorMode._cache_key).parameters) == ["self", "state", "func", "args", "kwargs"])


class _FakeRecorder(FakeTensorMode):
    """The fake-tensor mode that records: one Python layer per op instead of a recording mode
    stacked on ``FakeTensorMode`` (each layer costs every op, ``tensor.device`` queries included)."""

    def __init__(self, rec: _Recorder, **kwargs: Any):
        super().__init__(**kwargs)
        self.rec = rec
        self.recording = False
        self._depth = 0
        self._fast_entries: dict[tuple, Any] = {}
        self._key_slot: list | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self._depth or not self.recording or id(func) in _METADATA_QUERY_IDS:
            # setup, an op FakeTensorMode runs inside another, or a metadata query
            return self.dispatch(func, types, args, kwargs)
        self._depth += 1
        try:
            # ``dispatch`` is FakeTensorMode.__torch_dispatch__ without its wrappers (a dynamo
            # guard that this method already has, and a call counter)
            return self.rec.record(func, args, kwargs or {},
                                   lambda *a, **k: self.dispatch(func, types, a, k))
        finally:
            self._depth -= 1

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
        fkey = self._fast_key(func, args, kwargs) if _FAST_CACHE else None
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

    @contextlib.contextmanager
    def recording_on(self):
        previous, self.recording = self.recording, True
        try:
            yield
        finally:
            self.recording = previous


# -- loss ---------------------------------------------------------------------


def default_loss(output: Any) -> torch.Tensor:
    """The default loss: the sum of the means of every floating-point output tensor."""
    terms = [
        t.mean()
        for t in pytree.tree_leaves(output)
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad
    ]
    if not terms:
        raise UserError(
            "the model's output has no floating-point tensor that requires grad: "
            "nothing to train; pass loss_fn= or check that parameters require grad"
        )
    loss = terms[0]
    for t in terms[1:]:
        loss = loss + t
    return loss


def select_loss(output: Any, loss_fn: Callable[[Any], torch.Tensor] | None) -> tuple[torch.Tensor, str]:
    """Pick the loss of one step, and say which rule picked it.

    In order: ``loss_fn(output)`` when given; the output itself when it is a
    scalar tensor; ``output.loss`` (HF style) or ``output["loss"]``; else
    :func:`default_loss`.
    """
    if loss_fn is not None:
        return loss_fn(output), "loss_fn(output)"
    if isinstance(output, torch.Tensor) and output.numel() == 1:
        return output.reshape(()) if output.ndim else output, "model output (scalar)"
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss, "output.loss"
    if isinstance(output, Mapping) and isinstance(output.get("loss"), torch.Tensor):
        return output["loss"], 'output["loss"]'
    return default_loss(output), "default: sum of the means of the floating-point outputs"


# -- inputs -------------------------------------------------------------------


def split_inputs(inputs: Any) -> tuple[tuple, dict]:
    """A tensor -> (t,); a tuple/list -> positional args; a dict -> keyword args."""
    if isinstance(inputs, torch.Tensor):
        return (inputs,), {}
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    raise UserError(
        f"inputs must be a tensor, a tuple of positional arguments or a dict of keyword "
        f"arguments, not {type(inputs).__name__}"
    )


def _materialize(t: torch.Tensor) -> torch.Tensor:
    """A real CPU tensor like ``t``: ``t`` itself if real, else random floats / zero integers."""
    if t.device.type != "meta" and not isinstance(t, torch._subclasses.FakeTensor):
        return t
    with torch.no_grad():
        if t.is_floating_point() or t.is_complex():
            out = torch.randn(t.shape, dtype=t.dtype)
        else:
            out = torch.zeros(t.shape, dtype=t.dtype)
    return out.requires_grad_(t.requires_grad)


# -- the capture --------------------------------------------------------------


def _convert_inputs(inputs: Any, make_base: Callable[[tuple[int, ...], torch.dtype], torch.Tensor],
                    dtype_of: Callable[[torch.dtype], torch.dtype]) -> Any:
    """Traced stand-ins for the input tensors that keep their aliasing: the same tensor twice
    (``mha(x, x, x)``) stays one tensor, and views of one storage stay views of one storage
    (a sliced input keeps its whole base alive, as autograd does on the real tensors)."""
    by_id: dict[int, torch.Tensor] = {}
    bases: dict[int, torch.Tensor] = {}

    def convert(t: torch.Tensor) -> torch.Tensor:
        hit = by_id.get(id(t))
        if hit is not None:
            return hit
        storage = t.untyped_storage()
        dtype = dtype_of(t.dtype)
        base = bases.get(storage._cdata)
        whole = t.storage_offset() == 0 and t.is_contiguous() and t.numel() * t.element_size() == storage.nbytes()
        if base is None and whole:  # the common case: a tensor that owns its storage
            out = bases[storage._cdata] = make_base(tuple(t.shape), dtype)
        else:
            if base is None:
                base = bases[storage._cdata] = make_base((storage.nbytes() // t.element_size(),), dtype)
            with torch.no_grad():
                out = base.as_strided(t.shape, t.stride(), t.storage_offset())
        if t.requires_grad:
            try:
                out.requires_grad_(True)
            except RuntimeError:  # a view that autograd will not make a leaf: a detached copy of the view
                out = out.detach().requires_grad_(True)
        by_id[id(t)] = out
        return out

    return pytree.tree_map_only(torch.Tensor, convert, inputs)


def _real_param_copy(t: torch.Tensor, is_param: bool, dtype: torch.dtype) -> torch.Tensor:
    """A private real CPU copy of a parameter or buffer (the user's tensors are never touched)."""
    with torch.no_grad():
        if t.device.type == "meta" or isinstance(t, torch._subclasses.FakeTensor):
            if t.is_floating_point():
                out = torch.randn(t.shape, dtype=dtype) * 0.02 if is_param else torch.ones(t.shape, dtype=dtype)
            else:
                out = torch.zeros(t.shape, dtype=dtype)
        else:
            out = t.detach().to("cpu", dtype=dtype, copy=True)
    return out.requires_grad_(is_param and t.requires_grad)


def _meta_twin(rec: _Recorder, p: torch.Tensor) -> torch.Tensor:
    """A meta tensor standing for the fake parameter ``p`` (and its gradient) in the recorder."""

    def twin(t: torch.Tensor) -> torch.Tensor:
        with _disable_current_modes():  # making the twin is bookkeeping, not part of the step
            out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        rec.adopt(out, t)
        return out

    out = twin(p).requires_grad_(p.requires_grad)
    if p.grad is not None:
        out.grad = twin(p.grad)
    return out


def _grad_scaler():
    return torch.amp.GradScaler("cpu")


def _wrap_checkpointed(model: torch.nn.Module, classes: tuple[type, ...],
                       kernels: Callable[[], Any]) -> Callable[[], None]:
    """Run every instance of ``classes`` under non-reentrant ``torch.utils.checkpoint``; return an undo.

    ``kernels()`` is entered inside the checkpointed function: torch-function modes are not
    active when autograd recomputes the region in backward, so the target's kernels must be
    chosen from inside the region to be the same in the forward pass and the recomputation."""
    if not classes:
        return lambda: None
    from torch.utils.checkpoint import checkpoint

    wrapped = []
    for mod in model.modules():
        if isinstance(mod, classes) and mod is not model:
            original = mod.forward

            def region(*a, __f=original, **k):
                with kernels():
                    return __f(*a, **k)

            def forward(*a, __region=region, **k):
                return checkpoint(__region, *a, use_reentrant=False, **k)

            mod.forward = forward
            wrapped.append(mod)

    def undo() -> None:
        for mod in wrapped:
            del mod.forward  # back to the class's forward

    return undo


def _model_bytes(model: torch.nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def _available_ram() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 4 << 30


@dataclass(frozen=True)
class StepOptions:
    """How the step is run: loss, optimizer, precision, training or inference, checkpointing."""

    loss_fn: Callable[[Any], torch.Tensor] | None = None
    optimizer: Any = "adamw"
    optimizer_kwargs: Mapping[str, Any] | None = None
    foreach: bool | None = None  # optimizer implementation (None: PyTorch's default for the traced device)
    precision: Precision = parse_precision("fp32")
    train: bool = True  # False: forward only, under torch.no_grad() and model.eval()
    checkpoint: tuple[type, ...] = ()  # module classes run under torch.utils.checkpoint (non-reentrant)
    target: str = "cpu"  # "cuda": route ops whose CUDA kernels differ to them (see estimator.target)


def capture(model: torch.nn.Module, inputs: Any, options: StepOptions | None = None, *, mode: str = "auto",
            **kwargs: Any) -> Capture:
    """Capture one training step of ``model`` on ``inputs``.

    ``options`` (or the same fields as keyword arguments) say how the step runs.
    ``mode``: ``"fake"`` (never allocate), ``"real"`` (small real CPU tensors),
    or ``"auto"`` (fake, falling back to real when the model fits in memory and
    the fake trace meets data-dependent control flow or an op whose fake kernel
    rejects what its CPU kernel accepts).
    """
    if not isinstance(model, torch.nn.Module):
        raise UserError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    opts = options or StepOptions(**kwargs)
    args, kw = split_inputs(inputs)
    if mode not in ("auto", "fake", "real"):
        raise ValueError(f"mode must be 'auto', 'fake' or 'real', not {mode!r}")
    if mode == "real":
        return _capture(model, args, kw, opts, fake=False)
    try:
        return _capture(model, args, kw, opts, fake=True)
    except _DataDependent as exc:
        if mode == "fake":
            raise UnsupportedModelError(f"{exc}: data-dependent control flow cannot be traced on fake tensors; "
                                        f"allow a trace on real CPU tensors (trace='auto')") from exc.__cause__
        if not _fits_in_memory(model):
            raise UnsupportedModelError(
                f"{exc}: data-dependent control flow cannot be traced on fake tensors and the model "
                f"is too large to trace on real ones; make the branch shape-only or pass smaller shapes"
            ) from exc.__cause__
        reason = str(exc)
    except _StepFailed as exc:
        from torch.utils.checkpoint import CheckpointError

        if opts.target == "cuda" and _caused_by(exc, (CheckpointError,)):
            # The model checkpoints regions itself; their recomputation in backward runs without
            # torch-function modes, so it would pick CPU kernels where the forward picked CUDA's.
            cap = _capture(model, args, kw, replace(opts, target="cpu"), fake=True)
            cap.fallback_reason = ("attention modelled with CPU kernels: the model's own activation "
                                   "checkpointing recomputes regions outside the CUDA kernel model")
            return cap
        # Either the inputs are wrong (the real trace fails the same way and says so) or an op's
        # fake kernel is stricter than its CPU kernel (the real trace succeeds).
        if mode == "fake" or not _fits_in_memory(model):
            raise
        reason = f"the fake-tensor trace failed ({exc})"
    log.info("%s; capturing again on real CPU tensors", reason)
    cap = _capture(model, args, kw, opts, fake=False)
    cap.fallback_reason = reason
    return cap


def _fits_in_memory(model: torch.nn.Module) -> bool:
    """Whether a real CPU trace (a copy of the weights plus the step's tensors) fits in free RAM."""
    return 3 * _model_bytes(model) <= _available_ram() // 2


class _DataDependent(Exception):
    """Raised internally when the step reads tensor values on fake tensors."""


class _StepFailed(UserError):
    """The step raised: a user error (bad shapes), or a kernel whose fake version differs from the real one."""


def _capture(model, args, kwargs, opts: StepOptions, *, fake: bool) -> Capture:
    if fake:
        # FakeTensorMode's op cache is shared by every instance; an output rebuilt from it does not
        # keep the aliasing between outputs (mkldnn_rnn_layer_backward returns one tensor as both
        # bias gradients), so a trace would depend on what was traced before it in the process.
        FakeTensorMode.cache_clear()
    rec = _Recorder(fake)
    rec.target = opts.target
    fake_mode = _FakeRecorder(rec, allow_non_fake_inputs=True) if fake else None

    def recording():
        """Record the ops run inside: the fake mode records itself; on real tensors, the recorder mode."""
        return fake_mode.recording_on() if in_fake_mode else rec

    module_paths: dict[int, str] = {}
    module_types: dict[str, str] = {}
    for path, mod in model.named_modules(remove_duplicate=True):
        module_paths[id(mod)] = path
        module_types[path] = type(mod).__name__

    named_params = dict(model.named_parameters())  # tied weights appear once
    named_buffers = dict(model.named_buffers())
    param_owner = {n: n.rpartition(".")[0] for n in list(named_params) + list(named_buffers)}

    dtype_of = opts.precision.traced_dtype

    def to_traced(t: torch.Tensor, requires_grad: bool) -> torch.Tensor:
        with fake_mode:
            out = torch.empty_strided(t.shape, t.stride(), dtype=dtype_of(t.dtype), device="cpu")
        return out.requires_grad_(requires_grad)

    if fake:
        params = {n: to_traced(p, p.requires_grad) for n, p in named_params.items()}
        buffers = {n: to_traced(b, False) for n, b in named_buffers.items()}
        def fake_base(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            with fake_mode:
                return torch.empty(shape, dtype=dtype, device="cpu")

        t_args, t_kwargs = _convert_inputs((args, kwargs), fake_base, dtype_of)
    else:
        params = {n: _real_param_copy(p, True, dtype_of(p.dtype)) for n, p in named_params.items()}
        buffers = {n: _real_param_copy(b, False, dtype_of(b.dtype)) for n, b in named_buffers.items()}
        def real_base(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            return _materialize(torch.empty(shape, dtype=dtype, device="meta"))

        real = all(t.device.type != "meta" and not isinstance(t, torch._subclasses.FakeTensor)
                   for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
        if real and opts.precision.cast is None:  # the user's own tensors: aliasing is already right
            t_args, t_kwargs = pytree.tree_map_only(
                torch.Tensor, lambda t: t.detach().requires_grad_(t.requires_grad), (args, kwargs))
        else:
            t_args, t_kwargs = _convert_inputs((args, kwargs), real_base, dtype_of)
    flat_inputs = [t for t in pytree.tree_leaves((t_args, t_kwargs)) if isinstance(t, torch.Tensor)]

    for n, p in params.items():
        rec.placeholder(f"param_{n}", p, "parameter", param_owner[n])
    for n, b in buffers.items():
        rec.placeholder(f"buffer_{n}", b, "buffer", param_owner[n])
    for i, t in enumerate(flat_inputs):
        rec.placeholder(f"input_{i}", t, "input", INPUT_MODULE)

    param_by_id = {id(p): n for n, p in params.items()}

    def accumulate_owner(fn: Any) -> str:
        var = getattr(fn, "variable", None)  # AccumulateGrad holds its leaf
        name = param_by_id.get(id(var)) if var is not None else None
        return param_owner.get(name, "") if name is not None else ""

    rec.accumulate_owner = accumulate_owner

    # Module attribution: forward hooks push and pop the module path.
    module_outputs: dict[str, list[tuple[int, ...]]] = {}
    handles = []

    def pre_hook(mod, _args):
        rec.module_stack.append(module_paths.get(id(mod), type(mod).__name__))

    def post_hook(mod, _args, output):
        path = rec.module_stack.pop() if rec.module_stack else ""
        if path not in module_outputs and rec.phase in ("forward", "loss"):
            module_outputs[path] = [tuple(t.shape) for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]

    for mod in model.modules():
        handles.append(mod.register_forward_pre_hook(pre_hook))
        handles.append(mod.register_forward_hook(post_hook, always_call=True))

    saved: dict[int, tuple[int, str]] = {}
    param_sids = {rec.sid(p) for p in params.values()}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if rec.phase in ("forward", "loss"):
            sid = rec.sid(t)
            if sid not in saved and sid not in param_sids:
                saved[sid] = (rec.storage_bytes[sid], rec._where()[0])
        return t

    was_training = model.training
    model.train(opts.train)
    # Automatic garbage collection frees reference cycles at moments that depend on how many
    # Python objects were made, which differs between runs: none during the step, so that the
    # timeline (and the peak) is the same every time.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    opt_state: dict[str, dict[str, torch.Tensor]] = {}
    optimizer_name = None
    loss = None
    loss_source = "none (inference)"
    use_cuda_kernels = opts.target == "cuda" and fake  # CUDA kernels exist as meta implementations only
    kernel_mode = CudaKernels if use_cuda_kernels else contextlib.nullcontext
    restore_forward = _wrap_checkpointed(model, opts.checkpoint, kernel_mode)
    # The traced tensors stand in for the model's own for the whole step (backward recomputation of
    # checkpointed regions included), as torch.func.functional_call does for a single call.
    swap = _reparametrize_module(model, {**params, **buffers}, tie_weights=True, strict=False)
    kernels = kernel_mode()
    in_fake_mode = False
    # FakeTensorMode logs a traceback when a meta kernel fails; the capture reports the failure itself.
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    fake_log_level = fake_log.level
    try:
        if fake:
            fake_log.setLevel(logging.CRITICAL)
            fake_mode.__enter__()
            in_fake_mode = True
        swap.__enter__()
        kernels.__enter__()
        try:
            if not opts.train:
                with recording(), torch.no_grad():
                    output = _run_forward(model, t_args, t_kwargs, rec)
            else:
                with recording(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    with opts.precision.autocast_context():
                        output = _run_forward(model, t_args, t_kwargs, rec)
                        rec.phase = "loss"
                        loss, loss_source = _guard(rec, lambda: select_loss(output, opts.loss_fn))
                    del output  # a training loop keeps only the loss
                    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                        raise UserError("the loss must be a scalar tensor; check loss_fn")
                    if not loss.requires_grad:
                        raise UserError("the loss does not require grad: no parameter is trainable or the "
                                        "output is detached; check requires_grad and loss_fn")
                with recording():
                    rec.phase = "backward"
                    scaler = _grad_scaler() if opts.precision.grad_scaler else None
                    _guard(rec, (scaler.scale(loss) if scaler else loss).backward)
                rec.phase = "optimizer"
                opt_params = params
                if in_fake_mode and scaler is None and not wants_fused(opts.optimizer, opts.optimizer_kwargs):
                    # The step runs on meta twins of the fake parameters and gradients (same storage
                    # ids): meta kernels skip FakeTensorMode's per-op work, and the state is the same.
                    fake_mode.__exit__(None, None, None)
                    in_fake_mode = False
                    opt_params = {n: _meta_twin(rec, p) for n, p in params.items()}
                opt, optimizer_name = build_optimizer(opts.optimizer, opt_params, named_params,
                                                      opts.optimizer_kwargs, opts.foreach)
                if opt is not None:
                    with recording():
                        if scaler is not None:
                            _guard(rec, lambda: scaler.unscale_(opt))
                        _guard(rec, opt.step)  # GradScaler.step(opt) would skip it on a fake inf check
                        if scaler is not None:
                            _guard(rec, scaler.update)
                    for n, p in opt_params.items():
                        st = opt.state.get(p)
                        if st:
                            opt_state[n] = {k: v for k, v in st.items() if isinstance(v, torch.Tensor)}
        finally:
            kernels.__exit__(None, None, None)
            swap.__exit__(None, None, None)
            if in_fake_mode:
                fake_mode.__exit__(None, None, None)
    finally:
        if gc_was_enabled:
            gc.enable()
        fake_log.setLevel(fake_log_level)
        restore_forward()
        for h in handles:
            h.remove()
        model.train(was_training)

    grads = {n: p.grad for n, p in params.items() if p.grad is not None}
    sids = {
        "parameter": param_sids,
        "buffer": {rec.sid(b) for b in buffers.values()},
        "input": {rec.sid(t) for t in flat_inputs},
        "gradient": {rec.sid(g) for g in grads.values()},
        "optimizer_state": {rec.sid(t) for st in opt_state.values() for t in st.values()},
        "saved": set(saved),
        "loss": {rec.sid(loss)} if loss is not None else set(),
    }
    rec.closed = True
    return Capture(
        records=rec.placeholders + rec.records,
        nodes=rec.order,
        outputs=(rec.node_of(loss),) if loss is not None and rec.node_of(loss) is not None else (),
        mode="fake" if fake else "real",
        loss_source=loss_source,
        module_types=module_types,
        module_outputs=module_outputs,
        params=params,
        param_owner=param_owner,
        buffers=buffers,
        inputs=flat_inputs,
        saved=saved,
        grads=grads,
        optimizer_state=opt_state,
        optimizer_name=optimizer_name,
        storage_bytes=rec.storage_bytes,
        storage_dtype=rec.storage_dtype,
        events=rec.events,
        sids=sids,
    )


def _guard(rec: _Recorder, fn: Callable[[], Any]) -> Any:
    """Run ``fn``; turn data-dependent failures into :class:`_DataDependent`, others into one-line user errors."""
    try:
        return fn()
    except UserError:
        raise
    except Exception as exc:
        where = rec.current_module
        if _caused_by_data_dependence(exc):
            raise _DataDependent(f"module {where or '(root)'!r} reads tensor values in "
                                 f"{rec.current_op} ({rec.phase})") from exc
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if "HigherOrderOperator" in first:
            import re

            hop = (re.search(r"HigherOrderOperator (\w+)", first) or re.search(r"(\w+)", "op")).group(1)
            raise UnsupportedModelError(
                f"the {rec.phase} pass{f' in module {where!r}' if where else ''} uses the higher-order "
                f"operator {hop} (torch.{hop}), which the capture cannot run; use plain Python control "
                f"flow there") from exc
        raise _StepFailed(
            f"the {rec.phase} pass failed{f' in module {where!r}' if where else ''}: "
            f"{type(exc).__name__}: {first}; check the input shapes and dtypes"
        ) from exc


def _caused_by(exc: BaseException | None, types: tuple[type, ...]) -> bool:
    """Whether ``exc`` or an exception in its cause/context chain is one of ``types``."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, types):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def _caused_by_data_dependence(exc: BaseException) -> bool:
    return _caused_by(exc, _DATA_DEPENDENT)


def _run_forward(model, args, kwargs, rec):
    return _guard(rec, lambda: model(*args, **kwargs))

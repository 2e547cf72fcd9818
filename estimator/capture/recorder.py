"""The step recorder: each aten op of the step as a light record, with its module, phase and storages.

The recorder holds no strong reference to any tensor it sees, so tensors die when the traced
program drops them, and each storage's death is recorded (a ``weakref.finalize`` per storage).
Fake tensors follow the same reference counting as real ones (Python variables, autograd's
saved tensors released when their backward node has run, ``.grad`` accumulation), so the
``events`` list (allocation and free, in execution order) is the memory timeline of the step;
see :mod:`estimator.memory`.
"""

from __future__ import annotations

import operator
import weakref
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from ..compat import StrEnum
from ..graph import OpNode
from ..rules.registry import TensorSpec

aten = torch.ops.aten
_LIFTS = (aten.lift_fresh.default, aten.lift_fresh_copy.default)  # a tensor literal made fake

class Phase(StrEnum):
    """Where in the step an op runs.  Members are strings: ``Phase.FORWARD == "forward"``."""

    FORWARD = "forward"
    LOSS = "loss"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


FORWARD_PHASES = (Phase.FORWARD, Phase.LOSS)

# Pseudo-module paths for ops no module of the model runs.
LOSS_MODULE = "(loss)"
INPUT_MODULE = "(input)"
OPTIMIZER_MODULE = "(optimizer)"
GENERATE_MODULE = "(generate)"  # generate()'s own ops around the forward: inputs prepared, the token chosen

# Metadata queries: they return no tensor and do no work, so they are not graph nodes.
METADATA_QUERIES = frozenset(
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
METADATA_QUERY_IDS = frozenset(map(id, METADATA_QUERIES))  # OpOverload.__hash__ is Python code: slow


def _identifier(name: str) -> str:
    """A Python identifier for a placeholder name such as ``param_layers.0.weight``."""
    return "".join(c if c.isalnum() else "_" for c in name)


def tensor_spec(t: torch.Tensor) -> TensorSpec:
    return TensorSpec(tuple(t.shape), t.dtype)


class _ModuleStack(list):
    """The paths of the modules being run, innermost last (pushed and popped by the capture's
    forward hooks).  Before each push and pop, the autograd nodes created since the last recorded
    op are credited to the module running until then: a node whose op the recorder never sees
    (a custom ``autograd.Function`` created just before its forward calls a submodule) belongs to
    the module that created it, not to the next op's."""

    def __init__(self, recorder: "Recorder"):
        super().__init__()
        self.recorder = recorder

    def append(self, path: str) -> None:
        self.recorder._claim_autograd_nodes(self[-1] if self else None, None)
        super().append(path)

    def pop(self, *index: int) -> str:
        self.recorder._claim_autograd_nodes(self[-1] if self else None, None)
        return super().pop(*index)


class Recorder(TorchDispatchMode):
    """Records each dispatched aten op as an :class:`OpNode`, with its module, phase and storage events.

    On fake tensors the fake-tensor mode calls :meth:`record` itself
    (:class:`~estimator.capture.fake.RecordingFakeMode`); on real tensors this class is the
    dispatch mode.
    """

    def __init__(self, fake: bool):
        super().__init__()
        self.fake = fake
        self.fake_values = fake  # tensor values are unknown (fake or meta), so .item() cannot run
        self.target = "cpu"  # the target device's kernels (see estimator.target)
        # tensor -> the record that produced it: an attribute on the tensors the step makes (cheap on
        # the hot path), a weak dictionary for tensors that are not ours (constants of the model)
        self.constants: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.outside_grads: WeakIdKeyDictionary = WeakIdKeyDictionary()  # leaf -> its .grad before the step
        self.placeholders: list[OpNode] = []
        self.records: list[OpNode] = []  # every call_function record, getitem included
        self.order: list[OpNode] = []  # aten ops only
        self.phase = Phase.FORWARD
        self.micro_step = 0  # gradient accumulation: the micro-step being traced (meta["micro_step"] when > 0)
        self.compiled = False  # ops run by a torch.compile region's graph (meta["compiled"]; see .compiled)
        self.compiling = False  # a region being compiled: nothing it runs is the step's
        # the stream ops are issued on: engines traced on the CPU (FSDP2) switch torch.cpu's streams
        # as they switch CUDA streams on a GPU; an op issued on another than this one is tagged with
        # ``meta["stream"]`` (the id of its stream object), which the planner names
        self.default_stream = torch.cpu.current_stream()
        self.module_stack: list[str] = _ModuleStack(self)
        # autograd sequence number -> (module, forward node) of the op whose autograd kernel created
        # that node; ``next_seq`` is the first sequence number no recorded op has claimed yet
        self.seq_module: dict[int, tuple[str, OpNode]] = {}
        self.next_seq = torch.autograd._get_sequence_nr()
        self.accumulate_owner: Callable[[Any], str] = lambda fn: ""
        self.current_op: Any = None
        self.current_module = ""
        self.raised_in: str | None = None  # the innermost module whose forward raised (see failures.guard)
        self.refused: Exception | None = None  # what the model did that the capture refuses (failures.guard)
        self.scalar_value: Any = None  # what a scalar read in the optimizer step gives (optim.steady_scalars)
        self.n_constants = 0
        self.constant_sids: set[int] = set()  # storages first met as constants (none of the step's ops made)
        # storage bookkeeping
        self.sid_of: dict[int, tuple[int, Any]] = {}  # live storage _cdata -> (sid, weakref to the storage)
        self.storage_bytes: list[int] = []
        self.storage_dtype: list[torch.dtype] = []  # dtype of the first tensor seen on each storage
        self.events: list[tuple[int, int, int]] = []
        self.closed = False
        # hooks of the fake-tensor mode (set by the capture): an op run instead of the fake
        # kernel, and the real output sizes where a fake kernel reports others
        self.substitute: dict[int, Callable] = {}  # id(op) -> function
        self.real_sizes: Callable[[Any, tuple, dict, list], dict[int, int] | None] = lambda func, args, kwargs, outs: None

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

    def same_storage(self, real: torch.Tensor, stand_in: torch.Tensor) -> None:
        """``real``'s storage (the user's input tensor) is ``stand_in``'s (its traced stand-in): a tensor the loss
        reads from outside the step (labels a ``loss_fn`` closes over, the very tensor passed as the input) is
        that input, not another copy of it."""
        st = real.untyped_storage()  # (held: a weak reference to it died with this frame, and the lookup missed)
        self.sid_of.setdefault(st._cdata, (self.sid(stand_in), lambda: st))

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
        known = len(self.storage_bytes)
        sid = self.sid(t)
        node = OpNode("placeholder", _identifier(name), name,
                      meta=dict(spec=(tensor_spec(t),), stride=(t.stride(),), storage=(sid,), module=module,
                                phase=kind, kind=kind))
        self.placeholders.append(node)
        if kind == "constant":  # met while an op is being recorded: its autograd node is not claimed yet
            self.constants[t] = node
            if sid >= known:
                self.constant_sids.add(sid)
            if t.is_leaf and t.requires_grad:  # (a trainable module outside the model: see held.kept_outside)
                self.outside_grads[t] = t.grad
        else:
            t._estimator_node = node
            # autograd nodes made while the traced stand-ins were set up (casts of inputs) belong to no op
            self.next_seq = torch.autograd._get_sequence_nr()
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
            if t.is_nested and self.refused is None:  # (its ops reach the capture as its own, not its values')
                from ..errors import UnsupportedModelError

                # raised where the pass returns (capture.failures.guard): raised here, inside the nested
                # tensor's own op called from C++, it aborted the interpreter (pybind11's terminate)
                self.refused = UnsupportedModelError(
                    f"module {self.current_module or '(root)'!r} makes a nested (jagged) tensor, which the capture "
                    f"does not model: pad the sequences (torch.nn.utils.rnn.pad_sequence, or "
                    f"torch.nested.to_padded_tensor) and estimate the padded step, whose bytes and FLOPs bound it")
            self.n_constants += 1
            node = self.placeholder(f"constant_{self.n_constants}", t, "constant", self.where()[0])
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
    def where(self) -> tuple[str, OpNode | None]:
        """(module path, forward node) of the op being dispatched now."""
        if self.phase in FORWARD_PHASES:
            return (self.module_stack[-1] if self.module_stack else LOSS_MODULE), None
        if self.phase == Phase.BACKWARD:
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

    def _claim_autograd_nodes(self, module: str | None, node: OpNode | None) -> None:
        """Credit the autograd nodes created since the last recorded op to ``node`` and its module
        (``module`` None: the module the forward phases give ops outside any module).

        An op's autograd kernel creates its node (taking the next sequence number) just before the
        op reaches this recorder, so the nodes made since the previous op are this op's.  An op that
        makes no node (an in-place update of a buffer, a cast of integer labels in the loss) claims
        nothing: it must not take the node of the op before it, which may be another module's
        (a convolution followed by batch norm's ``num_batches_tracked.add_``).  Nodes made during
        recomputation in backward (activation checkpointing) are claimed the same way.
        """
        seq = torch.autograd._get_sequence_nr()
        if seq > self.next_seq:
            if self.phase != Phase.OPTIMIZER:
                hit = (LOSS_MODULE if module is None else module, node)
                for s in range(self.next_seq, seq):
                    self.seq_module[s] = hit
            self.next_seq = seq

    # -- the hook -----------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.record(func, args, kwargs or {}, func)

    def record(self, func, args, kwargs, run):
        """Run the op (``run(*args, **kwargs)``) and record it."""
        if id(func) in METADATA_QUERY_IDS:
            return run(*args, **kwargs)
        if func is aten._local_scalar_dense.default and self.fake_values and self.phase == Phase.OPTIMIZER:
            # Optimizers read scalar step counts (``step.item()``): a long run's values, which take the branches
            # its steps take (estimator.optim.steady_scalars); 0.5 keeps formulas finite otherwise
            return self.scalar_value(args[0]) if self.scalar_value is not None else 0.5
        if getattr(func, "namespace", None) != "profiler":  # (an engine's profiler marks: not where a step fails)
            self.current_op = func
        self.current_module = self.module_stack[-1] if self.module_stack else ""
        self.raised_in = None  # (an op after a raise: the exception was handled)
        node_args = tuple(self._map(a) for a in args)
        if func in _LIFTS and node_args and isinstance(node_args[0], OpNode):  # (torch.tensor(...) in the step:
            self.constant_sids.discard(node_args[0].meta["storage"][0])  # made now, not held from outside)
        node_kwargs = {k: self._map(v) for k, v in kwargs.items()} if kwargs else {}
        out = (self.substitute.get(id(func)) or run)(*args, **kwargs)
        module, fwd_node = self.where()
        if isinstance(out, torch.Tensor):
            flat_out = [out]
        else:
            flat_out = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        meta: dict[str, Any] = {"module": module, "phase": self.phase}
        if any(map(is_wrapper, pytree.tree_leaves((args, kwargs)))):
            meta["wrapper"] = True  # its subclass ran it as the ops recorded inside it: no cost of its own
        if self.micro_step:
            meta["micro_step"] = self.micro_step
        if self.compiled:
            meta["compiled"] = True
        stream = torch.cpu.current_stream()
        if stream is not self.default_stream:
            meta["stream"] = id(stream)
        node = OpNode("call_function", f"op_{len(self.records)}", func, node_args, node_kwargs, meta)
        self.order.append(node)  # first, so that the allocations below are events of this op
        self.records.append(node)
        meta["spec"] = tuple(tensor_spec(o) for o in flat_out)
        meta["stride"] = tuple(o.stride() for o in flat_out)
        real_sizes = self.real_sizes(func, args, kwargs, flat_out)
        meta["storage"] = tuple(self.sid(o, real_sizes.get(i) if real_sizes else None) for i, o in enumerate(flat_out))
        if fwd_node is not None:
            meta["forward_node"] = fwd_node
        self._claim_autograd_nodes(module, node)
        if isinstance(out, torch.Tensor):
            out._estimator_node = node
        else:
            for i, o in enumerate(flat_out):
                item = OpNode("call_function", f"op_{len(self.records)}", operator.getitem, (node, i), None,
                              dict(spec=(meta["spec"][i],), stride=(meta["stride"][i],), storage=(meta["storage"][i],),
                                   module=module, phase=self.phase, **({"micro_step": self.micro_step}
                                                                      if self.micro_step else {})))
                self.records.append(item)
                o._estimator_node = item
        return out


def is_wrapper(value: Any) -> bool:
    """Whether ``value`` is a tensor of a Python subclass that runs each op as ops on the tensors it wraps (its own
    ``__torch_dispatch__``: torchao's ``Float8TrainingTensor``, whose ``aten.mm`` is the ``_scaled_mm`` and casts
    recorded inside it); FakeTensor and parameters are not.  Decided once per class (every op's arguments ask)."""
    cls = type(value)
    hit = _WRAPPERS.get(cls)
    if hit is None:
        from torch._subclasses.fake_tensor import FakeTensor

        hit = _WRAPPERS[cls] = (issubclass(cls, torch.Tensor) and cls not in (torch.Tensor, torch.nn.Parameter)
                                and not issubclass(cls, FakeTensor)
                                and cls.__torch_dispatch__ is not torch.Tensor.__torch_dispatch__)
    return hit


_WRAPPERS: dict[type, bool] = {}  # class -> is_wrapper's answer

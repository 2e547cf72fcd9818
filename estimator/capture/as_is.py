"""A model traced as it is (``StepOptions.prepare``), for engines that manage their parameters
themselves: DDP, FSDP2 and tensor parallelism on a fake process group.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

from ..graph import OpNode
from .inputs import convert_inputs
from .recorder import Recorder


# -- a model traced as it is (StepOptions.prepare) ---------------------------------------------


class AsIs:
    """Tracing a model as it is, for engines that manage the parameters themselves.

    FSDP2's ``fully_shard``, ``DistributedDataParallel`` and tensor parallelism's
    ``parallelize_module`` own their parameters (DTensors, gradient buckets, unsharded copies
    freed and re-allocated in place), so no stand-ins can be swapped in.  With
    ``StepOptions.prepare`` the step traces the model as the engine left it:

    * ``prepare(model, fake)`` returns ``(model to trace, module to call)``; what it runs inside
      the context manager ``fake`` makes fake tensors of this capture's fake mode (e.g.
      ``model.to_empty(device="cpu")`` on a model built on meta), and the storages it allocates
      there that are still alive when the step starts (DDP's gradient buckets) are live from the
      start: placeholders of kind ``"engine"``.  It runs once per capture attempt, so it should
      build afresh each time;
    * parameters, buffers, gradients, optimizer state and saved tensors that are DTensors are traced
      by their local tensor (this rank's shard): ``Capture.params`` etc. hold local tensors;
    * an op on a tensor subclass (DTensor) is not recorded: the subclass runs it as ops on its
      local tensors, which are;
    * DTensor's sharding propagation (``_sharding_prop.py``: it runs each new op once on fake
      tensors of the global shapes, in the active fake mode, to learn the output's metadata) is
      bookkeeping, not part of the step: nothing it runs is recorded;
    * a functional collective's ``wait_tensor`` returns the tensor it waited for, as its real kernel
      does (the fake kernel makes a new one);
    * a storage resized in place (FSDP2 frees and re-allocates each unsharded parameter with
      ``untyped_storage().resize_()``: ``_fsdp_param.py``, ``free_storage`` / ``alloc_storage``)
      is recorded as a free and, for a new size above 0, a new allocation of a new storage id;
      those ids and the engine placeholders' are ``Capture.sids["engine"]``;
    * the trace is on fake tensors only (there are no real weights to fall back on).
    """

    @staticmethod
    def local(t: torch.Tensor) -> torch.Tensor:
        """The tensor holding the memory: a DTensor's local tensor (this rank's shard), the one tensor a wrapper
        subclass wraps (torchao's float8 weights under FSDP2), recursively; any other tensor as it is."""
        inner = getattr(t, "_local_tensor", None)
        if isinstance(inner, torch.Tensor):
            return AsIs.local(inner)
        flatten = getattr(t, "__tensor_flatten__", None)
        if flatten is not None and type(t) not in (torch.Tensor, torch.nn.Parameter):
            names, _ = flatten()
            if len(names) == 1 and isinstance(getattr(t, names[0], None), torch.Tensor):
                return AsIs.local(getattr(t, names[0]))
        return t

    @staticmethod
    def on_local_shard(p: torch.Tensor) -> bool:
        """Whether an engine's parameter ``p`` is a plain fake tensor or a DTensor over one, sharded or replicated
        as its gradient is (no pending reduction: a ``Partial`` gradient would be reduced by the step's ops)."""
        from torch._subclasses.fake_tensor import FakeTensor

        if type(p) in (torch.nn.Parameter, torch.Tensor) or isinstance(p, FakeTensor):
            return isinstance(p, FakeTensor) and (p.grad is None or isinstance(p.grad, FakeTensor))
        local, placements = getattr(p, "_local_tensor", None), getattr(p, "placements", None)
        if not isinstance(local, FakeTensor) or placements is None:
            return False
        grad = p.grad
        return grad is None or (isinstance(getattr(grad, "_local_tensor", None), FakeTensor)
                                and tuple(grad.placements) == tuple(placements)
                                and not any(pl.is_partial() for pl in placements))

    @staticmethod
    def prepare(model: torch.nn.Module, prepare: Callable, fake_mode: Any):
        """Run ``prepare``; return (model to trace, module to call, tensors it left allocated in ``fake``)."""
        made = _Allocations(fake_mode)
        traced, call = prepare(model, made)
        return traced, call if call is not None else traced, made.alive()

    @staticmethod
    def traced(named_params: dict, named_buffers: dict, args: tuple, kwargs: dict, fake_mode: Any,
               dtype_of: Any = None):
        """(params, buffers, args, kwargs, flat inputs) of the model as it is; inputs made fake, in the dtype
        ``dtype_of`` gives (a model cast to bf16 takes bf16 floating inputs, as the user's loop casts them)."""
        params = {n: AsIs.local(p) for n, p in named_params.items()}
        buffers = {n: AsIs.local(b) for n, b in named_buffers.items()}
        for n, t in {**params, **buffers}.items():
            if not isinstance(t, FakeTensor) or t.fake_mode is not fake_mode:
                raise ValueError(f"StepOptions.prepare left {n} on {t.device} ({type(t).__name__}): "
                                 f"make the parameters and buffers inside the fake context it is given")

        def fake_base(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            with fake_mode:
                return torch.empty(shape, dtype=dtype, device="cpu")

        t_args, t_kwargs = convert_inputs((args, kwargs), fake_base, dtype_of or (lambda dtype: dtype))
        flat = [t for t in pytree.tree_leaves((t_args, t_kwargs)) if isinstance(t, torch.Tensor)]
        return params, buffers, t_args, t_kwargs, flat

    @staticmethod
    @contextlib.contextmanager
    def engine_hooks(rec: "AsIsRecorder"):
        """While the step runs: record in-place storage resizes (``UntypedStorage.resize_``) and pause
        the recorder during DTensor's sharding propagation (when this torch has it)."""
        patches: list[tuple[Any, str, Any]] = []  # (owner, attribute, what it held: None if inherited)

        def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
            patches.append((owner, name, owner.__dict__.get(name)))
            setattr(owner, name, make(getattr(owner, name)))

        def resizing(original):
            def resize_(storage, size):
                before = storage.nbytes()
                out = original(storage, size)
                if storage.nbytes() != before:
                    rec.resized(storage)
                return out
            return resize_

        def paused(original):
            def run(*args, **kwargs):
                previous, rec.paused = rec.paused, True
                try:
                    return original(*args, **kwargs)
                finally:
                    rec.paused = previous
            return run

        patch(torch.UntypedStorage, "resize_", resizing)
        propagator = _sharding_propagator()
        if propagator is not None and hasattr(propagator, "_propagate_tensor_meta_non_cached"):
            patch(propagator, "_propagate_tensor_meta_non_cached", paused)
        try:
            yield
        finally:
            for owner, name, held in reversed(patches):
                if held is None:
                    delattr(owner, name)
                else:
                    setattr(owner, name, held)


class _Allocations(TorchDispatchMode):
    """A context manager (re-entrant) that enters the capture's fake mode and keeps (weakly) the
    fake tensors made inside: what ``prepare`` allocated."""

    def __init__(self, fake_mode: Any):
        super().__init__()
        self.fake_mode = fake_mode
        self.made: list[weakref.ref] = []
        self._stacks: list[contextlib.ExitStack] = []

    def __enter__(self):
        stack = contextlib.ExitStack()
        stack.enter_context(self.fake_mode)
        super().__enter__()
        stack.callback(super().__exit__, None, None, None)
        self._stacks.append(stack)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stacks.pop().close()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, FakeTensor):
                self.made.append(weakref.ref(t))
        return out

    def alive(self) -> list[torch.Tensor]:
        tensors, seen = [], set()
        for ref in self.made:
            t = ref()
            if t is not None and t.untyped_storage()._cdata not in seen:
                seen.add(t.untyped_storage()._cdata)
                tensors.append(t)
        return tensors


class AsIsRecorder(Recorder):
    """The recorder of a model traced as it is (see :class:`AsIs`)."""

    def __init__(self, fake: bool):
        super().__init__(fake)
        self.engine_sids: set[int] = set()
        self._resized_away: set[int] = set()  # freed by a resize: their storage object lives on
        self.paused = False  # in the engine's bookkeeping (DTensor's sharding propagation)
        # A functional collective's wait returns the tensor it waited for (the real kernel aliases it);
        # the fake kernel returns a new tensor, which would count the collective's output twice.
        wait = getattr(getattr(torch.ops, "_c10d_functional", None), "wait_tensor", None)
        if wait is not None:
            self.substitute[id(wait.default)] = lambda tensor: tensor

    def record(self, func, args, kwargs, run):
        if self.paused or _on_subclass(args) or (kwargs and _on_subclass(kwargs.values())):
            return run(*args, **kwargs)  # NotImplemented: the subclass runs it on its local tensors
        return super().record(func, args, kwargs, run)

    def placeholder(self, name: str, t: torch.Tensor, kind: str, module: str = "") -> OpNode | None:
        if kind == "engine" and t.untyped_storage()._cdata in self.sid_of:
            return None  # a parameter's, buffer's or input's storage: registered already
        node = super().placeholder(name, t, kind, module)
        if kind == "engine":
            self.engine_sids.add(node.meta["storage"][0])
        return node

    def resized(self, storage: Any) -> None:
        """``storage`` was resized in place: free its storage id; a new size > 0 is a new allocation."""
        if self.closed:
            return
        cdata = storage._cdata
        entry = self.sid_of.get(cdata)
        dtype = torch.uint8
        if entry is not None and entry[1]() is storage:
            sid = entry[0]
            del self.sid_of[cdata]
            self._resized_away.add(sid)
            self.events.append((len(self.order) - 1, sid, -self.storage_bytes[sid]))
            dtype = self.storage_dtype[sid]
        nbytes = storage.nbytes()
        if nbytes > 0:
            sid = len(self.storage_bytes)
            self.sid_of[cdata] = (sid, weakref.ref(storage))
            self.storage_bytes.append(nbytes)
            self.storage_dtype.append(dtype)
            self.events.append((len(self.order) - 1, sid, nbytes))
            self.engine_sids.add(sid)
            fin = weakref.finalize(storage, self._freed, cdata, sid)
            fin.atexit = False

    def _freed(self, cdata: int, sid: int) -> None:
        if sid not in self._resized_away:
            super()._freed(cdata, sid)


def _on_subclass(values: Any) -> bool:
    """Whether ``values`` (or a list among them) holds a tensor subclass other than FakeTensor (a DTensor)."""
    for v in values:
        if isinstance(v, (list, tuple)):
            if v and _on_subclass(v):
                return True
        elif isinstance(v, torch.Tensor) and type(v) not in _PLAIN_TENSOR_TYPES:
            return True
    return False


_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter, FakeTensor)


def _sharding_propagator() -> type | None:
    """DTensor's ShardingPropagator class, if this torch has it (only looked up, never imported here)."""
    import sys

    module = sys.modules.get("torch.distributed.tensor._sharding_prop")
    return getattr(module, "ShardingPropagator", None)

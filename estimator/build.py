"""Build models without allocating or initialising their weights.

:func:`empty_weights` is a context manager in the spirit of accelerate's
``init_empty_weights``: while it is active,

* every parameter a module registers is moved to the ``meta`` device as soon as it is
  registered (``nn.Module.register_parameter``; buffers too with ``include_buffers=True``),
  so ``nn.Linear(8192, 28672)`` allocates nothing — its ``torch.empty`` is never touched
  and is dropped at once — and a 70B configuration builds in seconds;
* the ``torch.nn.init`` initialisers (``trunc_normal_``, ``normal_``, ``uniform_``,
  ``kaiming_*``, ``xavier_*``, ``zeros_``, ``ones_``, ``constant_``, ``orthogonal_`` ...)
  return their tensor untouched, so constructors that call data-dependent initialisers
  still build: ``nn.init.trunc_normal_`` reads values (``.item()``) and raises
  ``DataDependentOutputException`` on fake tensors, and on meta tensors in some torch
  releases (torchvision's ViT calls it in ``__init__``).

A factory call for 256 MiB or more on the host (``torch.empty``, ``zeros``, ``ones``, ``full``,
``rand``, ``randn``, ``empty_strided``) is made on ``meta`` at once: allocating it first can fail where the
host cannot commit that much (one expert tensor of DeepSeek-V3 is 30 GB).  Other tensors a constructor makes
that are *not* registered as parameters stay ordinary CPU tensors, so code such as ``[x.item() for x in torch.linspace(0, 0.1, depth)]`` (stochastic
depth schedules in torchvision and timm) still runs.  Everything is restored on exit, and
the stand-in initialisers forward to the real ones whenever no ``empty_weights`` block is
active, so a module imported inside the block (``from torch.nn.init import normal_``) keeps
working normally afterwards.

    >>> from estimator import empty_weights, build_empty
    >>> with empty_weights():
    ...     model = MyTransformer(config)        # parameters on meta, nothing initialised
    >>> model = build_empty(torchvision.models.vit_b_16, weights=None)
"""

from __future__ import annotations

import contextlib
import functools
import operator
import sys
import threading
from typing import Any, Callable, Iterator, TypeVar

import torch
import torch.nn as nn

__all__ = ["empty_weights", "build_empty", "INIT_FUNCTIONS"]

T = TypeVar("T")

# torch.nn.init's in-place initialisers (the deprecated un-suffixed aliases call these).
INIT_FUNCTIONS = (
    "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
    "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_",
)

_lock = threading.RLock()
_depth = 0  # how many empty_weights blocks are active (any thread)
_originals: dict[str, Callable[..., Any]] = {}  # name -> the real torch.nn.init function
_stubs: dict[str, Callable[..., Any]] = {}  # name -> the stand-in installed on torch.nn.init


def _stub_for(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def stub(tensor, *args, **kwargs):
        if _depth > 0:
            return tensor
        return original(tensor, *args, **kwargs)  # a leaked reference after the block: behave normally

    stub.__estimator_stub__ = True  # type: ignore[attr-defined]
    return stub


def _install_init_stubs() -> list[tuple[Any, str, Any]]:
    """Replace ``torch.nn.init.X`` (and module globals bound to it) with the stand-ins; return what to undo."""
    init = torch.nn.init
    undo: list[tuple[Any, str, Any]] = []
    replace: dict[int, Callable[..., Any]] = {}
    for name in INIT_FUNCTIONS:
        current = getattr(init, name, None)
        if current is None:
            continue
        if getattr(current, "__estimator_stub__", False):  # already installed by an outer block
            continue
        original = _originals.setdefault(name, current)
        stub = _stubs.get(name)
        if stub is None:
            stub = _stubs[name] = _stub_for(name, original)
        replace[id(current)] = stub
        undo.append((init, name, current))
        setattr(init, name, stub)
    if replace:
        # Modules that did ``from torch.nn.init import trunc_normal_`` (timm, user code) hold the
        # function itself; swap those references too, and put them back on exit.
        for mod in list(sys.modules.values()):
            d = getattr(mod, "__dict__", None)
            if not isinstance(d, dict) or mod is init:
                continue
            try:
                hits = [(k, v) for k, v in d.items() if callable(v) and id(v) in replace]
            except RuntimeError:  # dict changed size (a lazy import in another thread)
                continue
            for k, v in hits:
                if d.get(k) is v:
                    undo.append((mod, k, v))
                    d[k] = replace[id(v)]
    return undo


def _uninstall(undo: list[tuple[Any, str, Any]]) -> None:
    for obj, name, value in reversed(undo):
        if obj is torch.nn.init:
            setattr(obj, name, value)
        else:
            obj.__dict__[name] = value


# A factory call for at least this many bytes on the CPU (or no device) is made on ``meta`` inside the block: a
# parameter that size is moved there at registration anyway, and allocating it first can fail (DeepSeek-V3's
# 256 experts' gate_up_proj is one 30 GB torch.empty, refused where the host has less memory to commit).
LARGE_FACTORY_BYTES = 256 * 2**20
_FACTORIES = frozenset({torch.empty, torch.zeros, torch.ones, torch.rand, torch.randn, torch.empty_strided,
                        torch.full})


_PY_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}


def _as_int(value: Any) -> int | None:
    """``value`` as the int a factory reads it as (``operator.index``: ints, 0-dim integer tensors), else None."""
    if isinstance(value, int):
        return value
    if isinstance(value, torch.Tensor) and (value.dim() != 0 or value.is_floating_point() or value.is_meta):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _requested_bytes(func: Any, args: tuple, kwargs: dict) -> int:
    """Bytes a factory call asks for (0 when its size cannot be read): ``torch.empty(2, 3)``,
    ``torch.empty((2, 3))``, ``torch.full((2, 3), v)``, ``torch.empty_strided((2, 3), (3, 1))``, ``size=``."""
    varargs = func not in (torch.full, torch.empty_strided) and bool(args) and _as_int(args[0]) is not None
    size = args if varargs else (args[0] if args else kwargs.get("size"))
    if not isinstance(size, (tuple, list, torch.Size)):
        return 0
    numel = 1
    for n in size:  # ints, or what torch reads as one (Inkling's sizes are 0-dim integer tensors)
        n = _as_int(n)
        if n is None:
            return 0
        numel *= n
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    # torch also takes Python's types for a dtype (GPT-Neo's ``torch.ones(..., dtype=bool)``)
    dtype = _PY_DTYPES.get(dtype, dtype) if isinstance(dtype, type) else dtype
    return numel * dtype.itemsize if isinstance(dtype, torch.dtype) else 0


class _LargeOnMeta(torch.overrides.TorchFunctionMode):
    """Large host factory calls made on ``meta`` (:data:`LARGE_FACTORY_BYTES`)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FACTORIES and torch.device(kwargs.get("device") or "cpu").type == "cpu" and \
                _requested_bytes(func, args, kwargs) >= LARGE_FACTORY_BYTES:
            kwargs = {**kwargs, "device": "meta"}
            kwargs.pop("pin_memory", None)
        return func(*args, **kwargs)


@contextlib.contextmanager
def empty_weights(include_buffers: bool = False) -> Iterator[None]:
    """Build modules with parameters on ``meta`` and ``torch.nn.init`` disabled (see the module doc).

    Args:
        include_buffers: move registered buffers to ``meta`` too (default: keep them as the
            constructor made them; they are small and some models read them while building).
    """
    global _depth
    old_register_parameter = nn.Module.register_parameter
    old_register_buffer = nn.Module.register_buffer

    def register_parameter(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        old_register_parameter(module, name, param)
        param = module._parameters.get(name)
        if param is not None and param.device.type != "meta":
            cls = type(param)
            extra = dict(param.__dict__)
            extra["requires_grad"] = param.requires_grad
            with torch.no_grad():
                module._parameters[name] = cls(param.to("meta"), **extra)

    def register_buffer(module: nn.Module, name: str, tensor: torch.Tensor | None, persistent: bool = True) -> None:
        old_register_buffer(module, name, tensor, persistent=persistent)
        buf = module._buffers.get(name)
        if buf is not None and buf.device.type != "meta":
            module._buffers[name] = buf.to("meta")

    with _lock:
        undo = _install_init_stubs()
        _depth += 1
        nn.Module.register_parameter = register_parameter  # type: ignore[method-assign]
        if include_buffers:
            nn.Module.register_buffer = register_buffer  # type: ignore[method-assign]
    try:
        with _LargeOnMeta():
            yield
    finally:
        with _lock:
            nn.Module.register_parameter = old_register_parameter  # type: ignore[method-assign]
            nn.Module.register_buffer = old_register_buffer  # type: ignore[method-assign]
            _depth -= 1
            _uninstall(undo)


def build_empty(factory: Callable[..., T], *args: Any, include_buffers: bool = False, **kwargs: Any) -> T:
    """``factory(*args, **kwargs)`` under :func:`empty_weights`: the model's parameters are on ``meta``.

    >>> model = build_empty(MyModel, config)
    >>> model = build_empty(lambda: MyModel(config).to(torch.bfloat16))
    """
    with empty_weights(include_buffers=include_buffers):
        return factory(*args, **kwargs)

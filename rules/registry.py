"""The one registry of per-op cost rules.

A rule is a pure function of an :class:`OpCall` (the op, its arguments bound by
schema name with tensors reduced to :class:`TensorSpec` shapes and dtypes, and
its outputs) that returns a FLOP count.  Rules are keyed by aten overload
packet (``aten.mm`` covers ``aten.mm.default`` and ``aten.mm.out``) and
registered with one decorator::

    @register(aten.mm, kind=MATMUL)
    def mm(call):
        '''2*m*k*n: one multiply-add per (row, column, inner) triple.'''
        return matmul_flops(call["self"].shape, call["mat2"].shape)

FLOP convention, stated once for the whole project: a multiply-add is 2 FLOPs,
as in ``torch.utils.flop_counter``.

``kind`` sorts FLOPs into MATMUL (matmul, convolution, attention, recurrent:
the tensor-core class that ``FlopCounterMode`` also counts) and OTHER
(per-element costs, reported apart).  ZERO marks ops that truly cost nothing
(views, metadata, allocation); an op with no rule at all is *unsupported* and
reported by name, count and module, never counted as zero silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, NamedTuple

import torch

MATMUL = "matmul"
OTHER = "other"
ZERO = "zero"
KINDS = (MATMUL, OTHER, ZERO)


class TensorSpec(NamedTuple):
    """What a rule may know of a tensor: its shape and dtype (no data)."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass(frozen=True, slots=True)
class OpCall:
    """One call of an aten op as a rule sees it.

    ``args`` maps every schema argument name to its value (defaults filled in),
    with tensors replaced by :class:`TensorSpec` and tensor lists by tuples of
    them.  ``outputs`` holds the specs of the tensor outputs only, in order (an
    output that is None, e.g. a gradient ``output_mask`` turned off, is absent).
    """

    op: Any
    args: Mapping[str, Any]
    outputs: tuple[TensorSpec | None, ...]

    def __getitem__(self, name: str) -> Any:
        return self.args[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.args.get(name, default)

    @property
    def out(self) -> TensorSpec:
        """The first tensor output."""
        for o in self.outputs:
            if o is not None:
                return o
        raise ValueError(f"{self.op} has no tensor output")


@dataclass(frozen=True, slots=True)
class Rule:
    fn: Callable[[OpCall], int]
    kind: str

    @property
    def formula(self) -> str:
        """The first line of the rule's docstring: its formula."""
        doc = (self.fn.__doc__ or "").strip()
        return doc.splitlines()[0] if doc else ""


_RULES: dict[Any, Rule] = {}


def _packet(op: Any) -> Any:
    """The registry key of an op: its overload packet (``aten.mm`` for ``aten.mm.default``)."""
    return getattr(op, "overloadpacket", op)


def register(*ops: Any, kind: str = OTHER, override: bool = False) -> Callable:
    """Register ``fn(call) -> flops`` as the rule for one or many aten ops.

    ``ops`` are overload packets (``torch.ops.aten.mm``) or overloads (the rule
    then covers the overload's whole packet).  Registering an op that already
    has a rule raises unless ``override=True``; this is how users replace a
    built-in rule or add one for their own custom op::

        from estimator.rules import register, OTHER

        @register(torch.ops.mylib.fused_gelu, kind=OTHER)
        def fused_gelu(call):
            '''8 FLOPs per output element (tanh approximation).'''
            return 8 * call.out.numel
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")

    def decorator(fn: Callable[[OpCall], int]) -> Callable[[OpCall], int]:
        for op in ops:
            key = _packet(op)
            if key in _RULES and not override:
                raise ValueError(f"{key} already has a rule; pass override=True to replace it")
            _RULES[key] = Rule(fn, kind)
        return fn

    return decorator


def _no_flops(call: OpCall) -> int:
    """0: views, metadata, allocation and copies that do no arithmetic."""
    return 0


def register_zero(*ops: Any, override: bool = False) -> None:
    """Declare ops that truly cost no FLOPs (views, metadata, allocation, copies)."""
    register(*ops, kind=ZERO, override=override)(_no_flops)


def aten_ops(*names: str) -> list[Any]:
    """The ``torch.ops.aten`` overload packets named ``names``, with their in-place variants.

    ``aten_ops("add")`` gives ``[aten.add, aten.add_]``: the in-place op is its own
    packet in torch (``out=`` variants are overloads of the op's packet), and a rule
    for an op holds for its in-place form.  Names missing from this torch build (an
    op added or removed between versions) are skipped, so rule modules load on
    every supported torch.
    """
    found: list[Any] = []
    for name in names:
        for variant in (name, name + "_") if not name.endswith("_") else (name,):
            try:
                packet = getattr(torch.ops.aten, variant)
            except (AttributeError, RuntimeError):
                continue
            if packet not in found:
                found.append(packet)
    return found


_LATE: dict[str, Callable[[], None]] = {}  # op namespace -> registers its rules once its library is loaded


def register_late(namespace: str, registrar: Callable[[], None]) -> None:
    """Call ``registrar`` the first time :func:`lookup` meets an op of ``namespace`` (a library such as
    torchvision defines its ops when it is imported, which the estimator does not do itself)."""
    _LATE[namespace] = registrar


def lookup(op: Any) -> Rule | None:
    """The rule for ``op`` (an overload or packet), or None if it has none."""
    key = _packet(op)
    rule = _RULES.get(key)
    if rule is None and getattr(key, "_qualified_op_name", "").startswith("prims::"):
        # a primitive (forward-mode AD and decompositions run them: prims.add) costs as the aten op of its name
        aten = getattr(torch.ops.aten, key._qualified_op_name.partition("::")[2], None)
        rule = _RULES.get(aten) if aten is not None else None
    if rule is None and _LATE:
        namespace = getattr(key, "_qualified_op_name", "").partition("::")[0]
        registrar = _LATE.pop(namespace, None)
        if registrar is not None:
            registrar()
            rule = _RULES.get(key)
    return rule


def registered_ops() -> Iterable[Any]:
    return _RULES.keys()


# -- binding arguments by schema name ---------------------------------------

_SCHEMA_CACHE: dict[Any, tuple[tuple[str, bool, Any], ...]] = {}


def _schema_args(op: Any) -> tuple[tuple[str, bool, Any], ...]:
    cached = _SCHEMA_CACHE.get(op)
    if cached is None:
        schema = getattr(op, "_schema", None)
        if schema is None:
            cached = ()
        else:
            cached = tuple(
                (a.name, a.has_default_value(), a.default_value if a.has_default_value() else None)
                for a in schema.arguments
            )
        _SCHEMA_CACHE[op] = cached
    return cached


def bind(op: Any, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Bind positional and keyword arguments to the op's schema names, defaults filled in."""
    names = _schema_args(op)
    bound: dict[str, Any] = {}
    for i, (name, has_default, default) in enumerate(names):
        if i < len(args):
            bound[name] = args[i]
        elif name in kwargs:
            bound[name] = kwargs[name]
        elif has_default:
            bound[name] = default
    if not names:  # no schema (python op): keep positions
        bound.update({f"arg{i}": a for i, a in enumerate(args)})
        bound.update(kwargs)
    return bound

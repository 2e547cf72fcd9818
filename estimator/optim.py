"""Optimizers by name, class or instance, rebuilt over the traced parameters.

The optimizer state is never guessed from a table: the real ``torch.optim``
class is constructed over the traced (fake) parameters and its ``step()`` is
run, so the state is exactly what that optimizer stores (Adam's ``exp_avg``,
``exp_avg_sq``, ``max_exp_avg_sq`` with amsgrad, the per-parameter ``step``
tensor, SGD's ``momentum_buffer``, RMSprop's ``square_avg``/``grad_avg``...),
for built-in and user-defined optimizers alike.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from .errors import UserError

# name -> (class, default keyword arguments)
OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any]]] = {
    "sgd": (torch.optim.SGD, {"lr": 1e-3}),
    "sgd-momentum": (torch.optim.SGD, {"lr": 1e-3, "momentum": 0.9}),
    "adam": (torch.optim.Adam, {"lr": 1e-3}),
    "adamw": (torch.optim.AdamW, {"lr": 1e-3}),
    "adagrad": (torch.optim.Adagrad, {"lr": 1e-3}),
    "rmsprop": (torch.optim.RMSprop, {"lr": 1e-3}),
    "adamax": (torch.optim.Adamax, {"lr": 1e-3}),
    "adadelta": (torch.optim.Adadelta, {}),
    "nadam": (torch.optim.NAdam, {"lr": 1e-3}),
    "radam": (torch.optim.RAdam, {"lr": 1e-3}),
}


def parse_optimizer(text: str) -> tuple[str, dict[str, Any]]:
    """Parse ``NAME[:key=value,...]`` (e.g. ``sgd:momentum=0.9``, ``adam:amsgrad=true``)."""
    name, _, rest = text.partition(":")
    name = name.strip().lower()
    if name not in OPTIMIZERS and name != "none":
        raise UserError(f"unknown optimizer {name!r}; choose one of {', '.join(sorted(OPTIMIZERS))} or none")
    kwargs: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise UserError(f"optimizer option {item!r} is not key=value (e.g. sgd:momentum=0.9)")
        kwargs[key.strip()] = _parse_value(value.strip())
    return name, kwargs


def _parse_value(v: str) -> Any:
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    if v.startswith("(") and v.endswith(")"):
        return tuple(_parse_value(x.strip()) for x in v[1:-1].split(",") if x.strip())
    return v


# Optimizers whose step updates each element of a parameter from that element of its gradient and state alone
# (no reduction over a tensor, no communication): on an engine's DTensor parameters their step is the same
# step on each rank's local shards (DTensor runs every op of it on the local tensors), so it can be traced there.
ELEMENTWISE = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad, torch.optim.RMSprop,
               torch.optim.Adamax, torch.optim.Adadelta, torch.optim.NAdam, torch.optim.RAdam, torch.optim.ASGD)


def optimizer_class(spec: Any) -> type | None:
    """The ``torch.optim.Optimizer`` class ``spec`` names (a name, a class or an instance); None for none."""
    if isinstance(spec, str):
        name = parse_optimizer(spec)[0]
        return None if name == "none" else OPTIMIZERS[name][0]
    if isinstance(spec, type):
        return spec
    return type(spec) if spec is not None else None


def elementwise(spec: Any) -> bool:
    """Whether the optimizer ``spec`` is exactly one of :data:`ELEMENTWISE` (a subclass may do more)."""
    return optimizer_class(spec) in ELEMENTWISE


def wants_fused(spec: Any, kwargs: Mapping[str, Any] | None) -> bool:
    """Whether the optimizer asks for a fused implementation (its kernels need a real device type)."""
    if (kwargs or {}).get("fused"):
        return True
    if isinstance(spec, str):
        return bool(parse_optimizer(spec)[1].get("fused"))
    if isinstance(spec, torch.optim.Optimizer):
        return any(g.get("fused") for g in spec.param_groups)
    return False


def build_optimizer(
    spec: Any,
    traced_params: Mapping[str, torch.Tensor],
    model_params: Mapping[str, torch.nn.Parameter],
    kwargs: Mapping[str, Any] | None,
    foreach: bool | None,
) -> tuple[torch.optim.Optimizer | None, str | None]:
    """Construct the optimizer over the traced trainable parameters.

    ``spec`` is a name (``"adamw"``, ``"sgd:momentum=0.9"``), an Optimizer
    class, an Optimizer instance built over the user's parameters (its param
    groups and their options are carried over), or None for no optimizer.
    """
    if spec is None:
        return None, None
    trainable = {n: p for n, p in traced_params.items() if p.requires_grad}
    if not trainable:
        return None, None
    extra = dict(kwargs or {})
    if foreach is not None:
        extra.setdefault("foreach", foreach)
    if isinstance(spec, str):
        name, parsed = parse_optimizer(spec)
        if name == "none":
            return None, None
        cls, defaults = OPTIMIZERS[name]
        options = {**defaults, **parsed, **extra}
        return _construct(cls, list(trainable.values()), options), spec
    if isinstance(spec, type) and issubclass(spec, torch.optim.Optimizer):
        options = {"lr": 1e-3, **extra}
        return _construct(spec, list(trainable.values()), options), spec.__name__
    if isinstance(spec, torch.optim.Optimizer):
        by_id = {id(p): n for n, p in model_params.items()}
        groups = []
        for group in spec.param_groups:
            names = [by_id.get(id(p)) for p in group["params"]]
            if any(n is None for n in names):
                raise UserError("the optimizer holds tensors that are not parameters of the model; "
                                "build it over model.parameters()")
            opts = {k: v for k, v in group.items() if k != "params"}
            groups.append({"params": [trainable[n] for n in names if n in trainable], **opts})
        return _construct(type(spec), groups, {**extra}), type(spec).__name__
    raise UserError(f"optimizer must be a name, a torch.optim.Optimizer class or instance, not {type(spec).__name__}")


def _construct(cls: type, params: Any, options: dict[str, Any]) -> torch.optim.Optimizer:
    try:
        return cls(params, **options)
    except TypeError as exc:
        if "foreach" in options:  # optimizers that take no foreach argument
            options = {k: v for k, v in options.items() if k != "foreach"}
            try:
                return cls(params, **options)
            except TypeError:
                pass
        raise UserError(f"cannot build {cls.__name__} with {options}: {exc}") from exc
    except ValueError as exc:
        raise UserError(f"cannot build {cls.__name__} with {options}: {exc}") from exc

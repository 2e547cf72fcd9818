"""Optimizers by name, class or instance, rebuilt over the traced parameters.

The optimizer state is never guessed from a table: the real ``torch.optim``
class is constructed over the traced (fake) parameters and its ``step()`` is
run, so the state is exactly what that optimizer stores (Adam's ``exp_avg``,
``exp_avg_sq``, ``max_exp_avg_sq`` with amsgrad, the per-parameter ``step``
tensor, SGD's ``momentum_buffer``, RMSprop's ``square_avg``/``grad_avg``...),
for built-in and user-defined optimizers alike.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from .errors import UserError
from .layers import linear_layers, output_head
from .optim8bit import AdamW8bit

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
    "adafactor": (torch.optim.Adafactor, {"lr": 1e-2}),
    "adamw8bit": (AdamW8bit, {"lr": 1e-3}),  # bitsandbytes' bnb.optim.AdamW8bit (estimator.optim8bit)
    # on the hidden matrices, with AdamW on the other parameters (:func:`hidden_matrices`, :func:`muon_and_adamw`)
    "muon": (torch.optim.Muon, {"lr": 2e-2}),
}


def parse_optimizer(text: str) -> tuple[str, dict[str, Any]]:
    """Parse ``NAME[:key=value,...]`` (e.g. ``sgd:momentum=0.9``, ``adam:amsgrad=true``, ``adamw:betas=(0.9,0.95)``:
    a value in parentheses is a tuple, its commas not separating options)."""
    name, _, rest = text.partition(":")
    name = name.strip().lower()
    if name not in OPTIMIZERS and name != "none":
        raise UserError(f"unknown optimizer {name!r}; choose one of {', '.join(sorted(OPTIMIZERS))} or none")
    kwargs: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in _top_level(rest))):
        key, eq, value = item.partition("=")
        if not eq:
            raise UserError(f"optimizer option {item!r} is not key=value (e.g. sgd:momentum=0.9)")
        kwargs[key.strip()] = _parse_value(value.strip())
    return name, kwargs


def _top_level(text: str) -> list[str]:
    """``text`` split at the commas outside parentheses."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    return items + [text[start:]]


def _parse_value(v: str) -> Any:
    low = v.lower()
    if low in ("true", "false", "yes", "no", "on", "off"):
        return low in ("true", "yes", "on")
    if v.count("(") != v.count(")"):
        raise UserError(f"optimizer option value {v!r} has unbalanced parentheses (e.g. betas=(0.9,0.95))")
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
    """The ``torch.optim.Optimizer`` class ``spec`` names (a name, a class or an instance); None for none (and for a
    sequence of optimizers)."""
    if isinstance(spec, (list, tuple)):
        return None
    if isinstance(spec, str):
        name = parse_optimizer(spec)[0]
        return None if name == "none" else OPTIMIZERS[name][0]
    if isinstance(spec, type):
        return spec
    return type(spec) if spec is not None else None


def elementwise(spec: Any) -> bool:
    """Whether the optimizer ``spec`` is exactly one of :data:`ELEMENTWISE` (a subclass may do more); a sequence,
    whether each of its optimizers is."""
    if isinstance(spec, (list, tuple)):
        return bool(spec) and all(map(elementwise, spec))
    return optimizer_class(spec) in ELEMENTWISE


def wants_fused(spec: Any, kwargs: Mapping[str, Any] | None) -> bool:
    """Whether the optimizer asks for a fused implementation (its kernels need a real device type)."""
    if (kwargs or {}).get("fused"):
        return True
    if isinstance(spec, str):
        return bool(parse_optimizer(spec)[1].get("fused"))
    if isinstance(spec, torch.optim.Optimizer):
        return any(g.get("fused") for g in spec.param_groups)
    if isinstance(spec, (list, tuple)):
        return any(wants_fused(s, None) for s in spec)
    return False


def _needs_lr(cls: type) -> bool:
    """Whether ``cls(params)`` needs ``lr``: a parameter without a default (or torch's ``required``)."""
    import inspect

    try:
        lr = inspect.signature(cls.__init__).parameters.get("lr")
    except (TypeError, ValueError):
        return True
    return lr is not None and (lr.default is inspect.Parameter.empty or
                               type(lr.default).__name__ == "_RequiredParameter")


def build_optimizer(
    spec: Any,
    traced_params: Mapping[str, torch.Tensor],
    model_params: Mapping[str, torch.nn.Parameter],
    kwargs: Mapping[str, Any] | None,
    foreach: bool | None,
    model: torch.nn.Module | None = None,
    names: Mapping[int, str] | None = None,
) -> tuple[Any, str | None]:
    """Construct the optimizer over the traced trainable parameters.

    ``spec`` is a name (``"adamw"``, ``"sgd:momentum=0.9"``; ``"muon"``: Muon and AdamW,
    :func:`muon_and_adamw`, which reads ``model``'s layers), an Optimizer
    class, an Optimizer instance built over the user's parameters (its param
    groups and their options are carried over), a list of such instances
    (stepped one after the other, :class:`Chain`), or None for no optimizer.  ``names``: the user's parameters'
    names by id, where ``model_params`` are a copy's (a plan's engine), for an instance's groups.
    """
    if spec is None:
        return None, None
    spec = [_unwrapped(s) for s in spec] if isinstance(spec, (list, tuple)) else _unwrapped(spec)
    _refuse_compiled_steps(spec)
    if any(getattr(s if isinstance(s, type) else type(s), "__module__", "").startswith("bitsandbytes")
           for s in (spec if isinstance(spec, (list, tuple)) else [spec])):
        from .optim8bit import register_bitsandbytes_rules

        register_bitsandbytes_rules()  # (its kernels' ops exist once it is loaded)
    trainable = {n: p for n, p in traced_params.items() if p.requires_grad}
    if not trainable:
        return None, None
    user = dict(kwargs or {})
    # the target's foreach as torch's default picks it for tensors there (CUDA: foreach), under what the user says
    # (a spec's foreach=false, optimizer_kwargs; torch refuses fused and foreach together)
    target = {"foreach": foreach} if foreach is not None and not wants_fused(spec, kwargs) else {}
    extra = {**target, **user}
    if isinstance(spec, str):
        name, parsed = parse_optimizer(spec)
        if name == "none":
            return None, None
        cls, defaults = OPTIMIZERS[name]
        options = {**defaults, **target, **parsed, **user}
        if name == "muon":
            return muon_and_adamw(model, trainable, options, extra), spec
        return _construct(cls, list(trainable.values()), options), spec
    if isinstance(spec, type) and issubclass(spec, torch.optim.Optimizer):
        # (a learning rate only where the class needs one: transformers' Adafactor refuses one with its default
        # relative_step)
        options = {**({"lr": 1e-3} if _needs_lr(spec) else {}), **extra}
        return _construct(spec, list(trainable.values()), options), spec.__name__
    if isinstance(spec, torch.optim.Optimizer):
        return _rebuilt(spec, trainable, model_params, target, user, traced_params, names), type(spec).__name__
    if isinstance(spec, (list, tuple)) and spec and all(isinstance(o, torch.optim.Optimizer) for o in spec):
        chain = Chain([_rebuilt(o, trainable, model_params, target, user, traced_params, names) for o in spec])
        return chain, " + ".join(type(o).__name__ for o in spec)
    if isinstance(spec, (list, tuple)):
        bad = next((o for o in spec if not isinstance(o, torch.optim.Optimizer)), None)
        raise UserError("optimizer is an empty list: give a name, an Optimizer, or a list of Optimizer instances"
                        if not spec else f"a list of optimizers holds instances built over the model's parameters "
                        f"(stepped in turn), not a {type(bad).__name__} ({bad!r}); give one name or class alone")
    raise UserError(f"optimizer must be a name, a torch.optim.Optimizer class or instance, or a list of instances, "
                    f"not {type(spec).__name__}")


def _rebuilt(spec: torch.optim.Optimizer, trainable: Mapping[str, torch.Tensor],
             model_params: Mapping[str, torch.nn.Parameter], target: dict[str, Any],
             user: dict[str, Any], traced: Mapping[str, torch.Tensor] | None = None,
             names: Mapping[int, str] | None = None) -> torch.optim.Optimizer:
    """``spec``'s class over the traced parameters, with its param groups and their options: ``user``'s
    (optimizer_kwargs) over them; a group's ``foreach``/``fused`` left to torch's default (None) takes the
    ``target``'s, as torch's default picks it for parameters on that device (an instance built the usual way,
    ``AdamW(model.parameters())``, runs foreach on CUDA)."""
    by_id = {**(names or {}), **{id(p): n for n, p in model_params.items()}}
    traced = traced or {}
    _check_options(type(spec), user)
    groups = []
    for group in spec.param_groups:
        names = [by_id.get(id(p)) for p in group["params"]]
        if any(n is None for n in names):
            raise UserError("the optimizer holds tensors that are not parameters of the model; "
                            "build it over model.parameters()")
        opts = {k: v for k, v in group.items() if k != "params" and not (k in ("foreach", "fused") and v is None)}
        # (frozen parameters kept in their groups, as the user's optimizer holds them: Adagrad makes its state for
        # every parameter of its groups in its constructor, frozen ones too; the others make none for them)
        groups.append({"params": [trainable.get(n, traced.get(n)) for n in names if n in trainable or n in traced],
                       **opts, **user})
    return _construct(type(spec), groups, {**target, **_constructor_options(spec, user), **user})


def _unwrapped(spec: Any) -> Any:
    """accelerate's ``AcceleratedOptimizer`` (``Accelerator.prepare``): the optimizer it steps, ``.optimizer`` (it
    was refused, with advice to name the class, which lost its groups' options: -3.5 % of state)."""
    inner = getattr(spec, "optimizer", None)
    if type(spec).__module__.startswith("accelerate.") and isinstance(inner, torch.optim.Optimizer):
        return inner
    return spec


def _refuse_compiled_steps(spec: Any) -> None:
    """torchao's low-bit optimizers (``torchao.optim``: AdamW8bit, AdamW4bit, AdamWFp8, _AdamW) run each step as
    ``torch.compile(..., fullgraph=True)``, which Dynamo skips under the capture's dispatch mode ("found no compiled
    frames"), and the skip it caches broke the user's next real step in the same process: refused before the step,
    in one line."""
    specs = spec if isinstance(spec, (list, tuple)) else [spec]
    for s in specs:
        cls = s if isinstance(s, type) else type(s)
        if getattr(cls, "__module__", "").startswith("torchao.optim"):
            bits = "4" if "4bit" in cls.__name__ else "8" if "8bit" in cls.__name__ else None
            near = (f"; its {bits}-bit state is about {'half of ' if bits == '4' else ''}that" if bits else
                    "; for its 8-bit float state, about that")
            raise UserError(f"torchao's {cls.__name__} runs its step through torch.compile(fullgraph=True), which "
                            f"cannot run on the estimate's fake tensors; estimate with optimizer='adamw8bit' "
                            f"(bitsandbytes' 8-bit AdamW: one byte per element and a float32 scale per block{near}) "
                            f"or 'adamw' for 32-bit state")


def _constructor_options(spec: torch.optim.Optimizer, user: dict[str, Any]) -> dict[str, Any]:
    """The options ``spec`` was built with that its constructor takes: its ``defaults`` (a required ``lr``), and
    bitsandbytes' ``args`` (``optim_bits``, ``min_8bit_size``: kept beside the groups, they set the state's
    layout), with ``user``'s (optimizer_kwargs) set on a copy of them; its SGD's ``momentum``, kept as ``betas[0]``."""
    import copy
    import inspect

    try:
        takes = [n for n in inspect.signature(type(spec).__init__).parameters if n not in ("self", "params")]
    except (TypeError, ValueError):
        return {}
    out = {n: spec.defaults[n] for n in takes
           if n in spec.defaults and not (n in ("foreach", "fused") and spec.defaults[n] is None)}
    kept = getattr(spec, "args", None)
    if "args" in takes and kept is not None and hasattr(kept, "__dict__"):
        out["args"] = copy.copy(kept)
        for k, v in user.items():
            if k in vars(kept):
                setattr(out["args"], k, v)
    if "momentum" in takes and "momentum" not in out and isinstance(spec.defaults.get("betas"), tuple):
        out["momentum"] = spec.defaults["betas"][0]
    return out


def _check_options(cls: type, options: Mapping[str, Any]) -> None:
    """``optimizer_kwargs`` over an instance's param groups, where torch keeps a key it does not know without a
    word: a name ``cls`` does not take is refused in one line (as its constructor refuses it)."""
    import inspect

    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(options) - set(params))
    if unknown:
        known = ", ".join(n for n in params if n not in ("self", "params"))
        raise UserError(f"optimizer_kwargs {', '.join(unknown)}: not an option of {cls.__name__} (its options: "
                        f"{known})")


def _construct(cls: type, params: Any, options: dict[str, Any]) -> torch.optim.Optimizer:
    import inspect

    closure = inspect.signature(cls.step).parameters.get("closure")
    if closure is not None and closure.default is inspect.Parameter.empty:
        raise UserError(f"{cls.__name__}.step(closure) re-evaluates the model inside the step (line searches), "
                        f"which the estimate does not model; estimate with a step that takes no closure "
                        f"(e.g. optimizer='adamw')")
    try:
        return _device_checked(cls(params, **options))
    except UserError:
        raise
    except TypeError as exc:
        if "foreach" in options:  # optimizers that take no foreach argument
            options = {k: v for k, v in options.items() if k != "foreach"}
            try:
                return _device_checked(cls(params, **options))
            except TypeError:
                pass
        raise UserError(f"cannot build {cls.__name__} with {options}: {exc}") from exc
    except (ValueError, RuntimeError) as exc:  # torch's own checks of the options (fused with foreach, lr < 0)
        raise UserError(f"cannot build {cls.__name__} with {options}: {exc}") from exc
    except Exception as exc:  # a wrapper (Lookahead(inner), accelerate's AcceleratedOptimizer) built otherwise
        raise UserError(f"cannot rebuild {cls.__name__} over the traced parameters as torch.optim optimizers are "
                        f"built, {cls.__name__}(params, **options) ({type(exc).__name__}: {exc}); pass the optimizer "
                        f"it runs (a wrapper's .optimizer, which keeps its param groups), or its name or class "
                        f"(e.g. optimizer='adamw' or torch.optim.AdamW, with optimizer_kwargs)") from exc


def _device_checked(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """``opt``, refused in one line where it asks for ``capturable=True`` over parameters off the GPU (the trace's
    fake and meta tensors live on the CPU, where torch's capturable step does not run)."""
    if any(g.get("differentiable") for g in opt.param_groups):
        raise UserError(f"{type(opt).__name__}(differentiable=True) keeps the update in autograd's graph (learning "
                        f"through an optimizer, over weights that are not leaves); over a model's parameters torch "
                        f"refuses the in-place update of a leaf that requires grad: drop differentiable")
    params = [p for g in opt.param_groups if g.get("capturable") for p in g["params"]]
    if any(p.device.type in ("cpu", "meta") for p in params):
        raise UserError(f"{type(opt).__name__}(capturable=True) runs on GPU tensors only and the step is traced on "
                        "the CPU: drop capturable (it moves each parameter's step count, one scalar, to the GPU)")
    if isinstance(opt, torch.optim.RAdam):  # (the report's assumptions: the step traced at STEADY_STEP)
        opt.note = ("RAdam traced as a long run's step (step 1,000): its first 5 steps skip the rectified update, "
                    "so a real run's first steps peak lower than the first-step figure")
    return opt


def check_clip(value: Any, mode: str = "train") -> float | None:
    """``clip_grad_norm``: None or a number > 0, for a training step; else a one-line error."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise UserError(f"clip_grad_norm must be a number > 0 (e.g. 1.0), not {value!r}")
    if mode != "train":
        raise UserError(f"clip_grad_norm clips a training step's gradients; drop it for mode={mode!r}")
    return float(value)


def clip_gradients(params: Any, max_norm: float, foreach: bool | None) -> None:
    """The loop's ``torch.nn.utils.clip_grad_norm_(params, max_norm)`` before ``opt.step()`` (HF Trainer's
    ``max_grad_norm=1.0``, torchtitan's ``max_norm``, nanoGPT's ``grad_clip``), as torch 2.13's
    ``nn/utils/clip_grad.py`` runs it with its default ``foreach=None``: each gradient's 2-norm
    (``_foreach_norm`` over plain tensors, CUDA's and the CPU's alike; one ``vector_norm`` each over an engine's
    DTensor gradients, which ``_has_foreach_support`` refuses by type, or with ``foreach=False``), the norm of
    their stack, the coefficient ``min(1, max_norm / (total + 1e-6))`` and the gradients scaled in place by it
    (``_foreach_mul_``, or ``mul_`` each).  Written out rather than called: the traced gradients are fake or
    meta tensors, whose device or type would send torch's own function down the other branch.  On DTensor
    gradients the norms' reduction across ranks comes from DTensor itself."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    use_foreach = foreach is not False and all(getattr(g, "placements", None) is None for g in grads)
    norms = torch._foreach_norm(grads, 2.0) if use_foreach else [torch.linalg.vector_norm(g, 2.0) for g in grads]
    total = torch.linalg.vector_norm(torch.stack(list(norms)), 2.0)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    if use_foreach:
        torch._foreach_mul_(grads, coef)
    else:
        for g in grads:
            g.mul_(coef)


# -- several optimizers, one step ----------------------------------------------------------------------------------


def grads_outside(opt: Any, params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """The gradients of ``params`` that are in none of ``opt``'s param groups: the loop's ``opt.zero_grad()`` never
    frees them, so they stay allocated between steps, each backward adding into them."""
    held = {id(q) for g in opt.param_groups for q in g["params"]}
    return [p.grad for p in params if p.grad is not None and id(p) not in held]


class Chain:
    """Optimizers a training loop steps one after the other (``for opt in optimizers: opt.step()``), as one: their
    ``param_groups`` and ``state`` are the union of theirs.  Muon's authors and ``torch.optim.Muon``'s
    documentation train this way: Muon on the hidden matrices, AdamW on the rest."""

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer], note: str | None = None):
        self.optimizers = list(optimizers)
        self.note = note  # what the split assumed (the report's assumptions)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for o in self.optimizers for g in o.param_groups]

    @property
    def state(self) -> dict[torch.Tensor, dict[str, Any]]:
        merged: dict[torch.Tensor, dict[str, Any]] = {}
        for o in self.optimizers:  # a parameter two of them keep state for (AdamW's moments, the EMA's copy): both
            for p, st in o.state.items():
                merged.setdefault(p, {}).update(st)
        return merged

    def step(self, closure: Any = None) -> None:
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)


def hidden_matrices(model: torch.nn.Module) -> tuple[list[str], str | None]:
    """The parameters Muon updates, by name: the 2-D weights of the model's Linear layers (transformers' Conv1D
    included, :func:`.layers.linear_dims`) and ``nn.MultiheadAttention``'s input projections, but the output head's
    and any tied to an embedding (``torch.optim.Muon``'s documentation: "Muon should only be used for hidden weight
    layers. The input embedding, final output layer, and any internal gains or biases should be optimized using a
    standard method such as AdamW"); and the output head's name (None when none was found)."""
    by_id = {id(p): n for n, p in model.named_parameters()}
    embedded = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    head = output_head(model)
    names = [by_id[id(m.weight)] for _, m in linear_layers(model)
             if id(m.weight) not in embedded and id(m.weight) in by_id and m.weight.ndim == 2]
    # (nn.MultiheadAttention's input projections are parameters of its own, no Linear's: its q/k/v matrices)
    names += [by_id[id(w)] for m in model.modules() if isinstance(m, torch.nn.MultiheadAttention)
              for w in (m.in_proj_weight, m.q_proj_weight, m.k_proj_weight, m.v_proj_weight)
              if w is not None and w.ndim == 2 and id(w) in by_id]
    head_name = next((n for n, m in model.named_modules() if m is head), None)
    return list(dict.fromkeys(names)), head_name


MUON_NOTE = "optimizer muon: "


def muon_note(model: torch.nn.Module, trainable: Mapping[str, torch.Tensor]) -> str:
    """The report's line on :func:`muon_and_adamw`'s split of ``trainable`` (name -> parameter) over ``model``."""
    hidden, head = hidden_matrices(model)
    on_muon = [n for n in hidden if n in trainable]
    rest = [n for n in trainable if n not in set(on_muon)]
    numel = lambda names: sum(trainable[n].numel() for n in names)  # noqa: E731
    return (f"{MUON_NOTE}torch.optim.Muon on {len(on_muon)} hidden matrices ({numel(on_muon):,} parameters), "
            f"AdamW on the other {len(rest)} parameter tensors ({numel(rest):,}: embeddings, "
            + (f"the output head '{head}', " if head else "no output head found, ")
            + "norms' gains, biases), as torch.optim.Muon's documentation advises")


def whole_model_notes(notes: list[str], model: torch.nn.Module, params: Mapping[str, torch.Tensor]) -> list[str]:
    """``notes`` made on a step traced with some of the model's blocks (:mod:`.capture.replicate`), with the
    counts that depend on the blocks made again over the whole ``model`` and its ``params`` (name -> parameter)."""
    trainable = {n: p for n, p in params.items() if p.requires_grad}
    return [muon_note(model, trainable) if n.startswith(MUON_NOTE) else n for n in notes]


def muon_and_adamw(model: torch.nn.Module | None, trainable: Mapping[str, torch.Tensor], options: dict[str, Any],
                   extra: dict[str, Any]) -> Chain:
    """``--optimizer muon``: ``torch.optim.Muon`` (``options``) on :func:`hidden_matrices`, AdamW (lr 1e-3, its
    other defaults; the options of ``extra`` it takes) on the other trainable parameters, stepped in that order."""
    if model is None:
        raise UserError("--optimizer muon needs the model's layers: pass a list of optimizer instances instead")
    hidden, head = hidden_matrices(model)
    on_muon = [n for n in hidden if n in trainable]
    if not on_muon:
        raise UserError("--optimizer muon: the model has no trainable 2-D Linear weight besides its output head "
                        "(Muon updates hidden matrices only); use adamw")
    rest = [n for n in trainable if n not in set(on_muon)]
    note = muon_note(model, trainable)
    muon = _construct(torch.optim.Muon, [trainable[n] for n in on_muon], options)
    optimizers = [muon]
    if rest:
        import inspect

        takes = inspect.signature(torch.optim.AdamW).parameters  # (Muon's own options, adjust_lr_fn: Muon's only)
        optimizers.append(_construct(torch.optim.AdamW, [trainable[n] for n in rest],
                                     {"lr": 1e-3, **{k: v for k, v in extra.items() if k in takes}}))
    return Chain(optimizers, note)


# The step count an optimizer's step is traced at: past the warm-ups whose branches allocate differently (RAdam's
# rectification from step 6, its first 5 steps plain momentum), as most of a run's steps are.
STEADY_STEP = 1000


def steady_scalars(opt: Any) -> Callable[[torch.Tensor], float]:
    """What a scalar read in ``opt.step()`` (``step_t.item()``, ``mu.item()``) gives in a long run's step, the
    tensor's value being unknown on fake tensors: a state ``step`` count :data:`STEADY_STEP`; ASGD's ``mu``
    ``1 / max(1, step - t0)`` (1 until its averaging starts at ``t0``, 1e6 steps by default: the branch that copies
    the parameter); any other 0.5 (finite in formulas such as NAdam's ``1 / (1 - mu_product)``)."""
    keys: dict[int, tuple[str, dict[str, Any]]] = {}
    seen = [-1]

    def value(t: torch.Tensor) -> float:
        if id(t) not in keys and len(opt.state) != seen[0]:  # state made lazily in the step: scan once more
            seen[0] = len(opt.state)
            groups = {id(p): g for g in opt.param_groups for p in g["params"]}
            for p, st in list(opt.state.items()):
                for k, v in st.items():
                    if isinstance(v, torch.Tensor) and v.ndim == 0:
                        keys[id(v)] = (k, groups.get(id(p), {}))
        key, group = keys.get(id(t), ("", {}))
        if key == "step":
            return float(STEADY_STEP)
        if key == "mu":
            return 1.0 / max(1.0, STEADY_STEP - float(group.get("t0", 1e6)))
        return 0.5

    return value


def flat_state(state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """One parameter's optimizer state as ``{key: tensor}``, tensors kept in lists, tuples or dicts named by their
    path (timm's Kron keeps its preconditioners as ``state["Q"] = [Q_0, Q_1]``: ``"Q.0"``, ``"Q.1"``)."""
    out: dict[str, torch.Tensor] = {}

    def visit(key: str, value: Any, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            out[key] = value
        elif depth < 3 and isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                visit(f"{key}.{i}", v, depth + 1)
        elif depth < 3 and isinstance(value, dict):
            for k, v in value.items():
                visit(f"{key}.{k}", v, depth + 1)

    for key, value in state.items():
        visit(str(key), value, 0)
    return out


def state_tensors(opt: Any) -> list[torch.Tensor]:
    """The tensors of ``opt``'s state now (right after its constructor: what it made there, as Adagrad makes its
    sums for every parameter of its groups)."""
    return [v for st in opt.state.values() for v in flat_state(st).values()]


def made_before_loop(opt: Any, early: list[torch.Tensor]) -> list[torch.Tensor]:
    """The state a training loop has before its first step: ``early`` (:func:`state_tensors` after the
    constructor) and the state of the optimizers of a :class:`Chain` that say so (the EMA's copy of the weights,
    which ``AveragedModel`` makes before the loop; traced in the step, where its ops replicate with the blocks)."""
    return early + [t for o in getattr(opt, "optimizers", ()) if getattr(o, "made_before_loop", False)
                    for t in state_tensors(o)]

"""The caller's torch state around an estimate or a plan, which the traced step must not take for its own.

An estimate traces the step its options describe: its precision (not an autocast block the caller is in), its
mode's gradients (training computes them whether the caller is under ``torch.no_grad()`` or
``torch.inference_mode()`` or not), its own fake tensors (not under a ``FakeTensorMode`` or another dispatch
mode the caller entered).  Under the caller's autocast the report said fp32 and counted bf16 (+8.1 % on a small
MLP's peak); under ``no_grad`` the training step had no gradients ("nothing to train"); under the caller's
``FakeTensorMode`` the optimizer's state was made in it and failed.  The caller's grad and dispatch modes are
set aside for the call and put back after it; an autocast block is refused in one line, since the caller
presumably wanted its precision: the ``precision`` option says it.  Device contexts (``with
torch.device("meta")``, a function mode) are kept: a model built under one is analysed as without."""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .errors import UserError
from .said import once_per_call

F = TypeVar("F", bound=Callable[..., Any])


@contextmanager
def apart_from_caller() -> Iterator[None]:
    """Inside the block, the caller's grad mode, inference mode and dispatch modes are set aside (see the module
    doc); an autocast block the caller is in is a one-line error."""
    for device in ("cpu", "cuda"):
        if torch.is_autocast_enabled(device):
            raise UserError(f"called inside torch.autocast({device!r}): the step's precision is the precision option "
                            f"(e.g. precision='bf16-mixed'), not the caller's autocast; call it outside the autocast "
                            f"block")
    with _disable_current_modes(), torch.inference_mode(False), torch.enable_grad(), once_per_call():
        yield


@contextmanager
def dataclasses_flattened(values: Any) -> Iterator[None]:
    """Inside the block, torch's pytree flattens the dataclasses among ``values`` (an input ``Batch(x=...)``)
    as it flattens tuples and dicts: their tensors are the step's inputs (counted as inputs, cast by the
    precision, made fake), where they were opaque (counted as activations, left in fp32 under bf16 and refused).
    Each class registered here is unregistered after."""
    import dataclasses

    import torch.utils._pytree as pytree

    found: dict[type, None] = {}

    def visit(v: Any, depth: int) -> None:
        if depth > 4 or isinstance(v, (torch.Tensor, torch.nn.Module, str, bytes)):
            return
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            if type(v) not in pytree.SUPPORTED_NODES:
                found[type(v)] = None
            for f in dataclasses.fields(v):
                visit(getattr(v, f.name, None), depth + 1)
        elif isinstance(v, (list, tuple)):
            for x in v:
                visit(x, depth + 1)
        elif isinstance(v, dict):
            for x in v.values():
                visit(x, depth + 1)

    visit(values, 0)
    registered = []
    for cls in found:
        try:
            pytree.register_dataclass(cls)
            registered.append(cls)
        except Exception:  # (a field outside __init__, a class torch's pytree declines: left opaque)
            continue
    try:
        yield
    finally:
        for cls in registered:
            pytree._deregister_pytree_node(cls)


def apart_from_caller_during(fn: F) -> F:
    """``fn`` run inside :func:`apart_from_caller`, the dataclasses among its arguments flattened as inputs are."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        inputs = getattr(args[0], "inputs", None) if args and not isinstance(args[0], torch.nn.Module) else None
        with apart_from_caller(), dataclasses_flattened((args[1:], kwargs, inputs)):  # (a Planner's: its own)
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def set_train_mode(model: torch.nn.Module, train: bool, notes: list[str]) -> None:
    """The step's mode on ``model``: eval for inference; for training, ``model.train()``, unless the caller's model
    is in training mode already with some of its modules put in eval (dropout turned off, batch-norm statistics
    frozen for fine-tuning): those are kept, as the caller's loop runs them (``model.train()`` had switched them
    back on: activations +13.2 % on a BERT whose dropout the caller had turned off), and ``notes`` says so.  A root
    in eval mode (transformers' ``from_pretrained`` returns one) is trained whole, as a loop calling
    ``model.train()`` trains it.  The caller puts each module's flag back afterwards."""
    if not train or not model.training:
        model.train(train)
        return
    kept = [name for name, m in model.named_modules() if not m.training]
    if kept:
        kinds = sorted({type(model.get_submodule(n)).__name__ for n in kept})
        notes.append(f"{len(kept)} module(s) the model came with in eval mode stay in eval mode ({', '.join(kinds[:4])}"
                     f"{', ...' if len(kinds) > 4 else ''}), as a loop that does not call model.train() runs them; "
                     f"call model.train() first to train them all")

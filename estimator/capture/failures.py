"""What a failure inside the step becomes: a value read (:class:`~.options.ReadsValues`, for the real-tensor
fallback), an unsupported construct, or a one-line :class:`~.options.StepFailed` naming the pass, module and op
(with a hint at inputs the forward takes and was not given)."""

from __future__ import annotations

import inspect
import re
from typing import Any, Callable, Iterable

import torch

from ..errors import UnsupportedModelError, UserError, from_outside
from .options import DATA_DEPENDENT, ReadsValues, StepFailed


def guard(rec: Any, fn: Callable[[], Any], hint: Callable[[], str]) -> Any:
    """Run ``fn``; turn data-dependent failures into :class:`ReadsValues`, others into one-line user errors
    (``rec``: the recorder, which knows the phase, module and op; ``hint()``: what to check)."""
    try:
        out = fn()
    except UserError:
        raise
    except Exception as exc:
        if from_outside(exc):  # an alarm's or a signal's exception: not the model's error
            raise
        if getattr(rec, "refused", None) is not None:  # what the model did that the capture refuses, first
            raise rec.refused from exc
        where = rec.current_module
        raised_in = getattr(rec, "raised_in", None)  # the innermost module whose forward raised (step's hooks)
        if raised_in is not None and raised_in != where and not caused_by(exc, DATA_DEPENDENT):
            # raised by that module's own code after its last op (or before any): not in the last op recorded
            where, rec.current_op = raised_in, None
        if caused_by(exc, DATA_DEPENDENT):
            raise ReadsValues(f"module {where or '(root)'!r} reads tensor values in "
                              f"{rec.current_op} ({rec.phase})") from exc
        first = _message(exc)
        if "FlexAttention" in first or "flex_attention" in first:  # (its kernels: Inductor's, or a CPU forward only)
            raise UnsupportedModelError(
                f"the {rec.phase} pass{f' in module {where!r}' if where else ''} runs FlexAttention "
                f"(torch.nn.attention.flex_attention), which the capture does not model: estimate the model with "
                f"F.scaled_dot_product_attention (a transformers model: attn_implementation='sdpa'), whose FLOPs and "
                f"bytes bound a sparse block mask's from above") from exc
        if re.search(r"higher.?order.?op", first, re.IGNORECASE):
            found = re.search(r"HigherOrderOperator (\w+)|higher_order\.(\w+)", first)
            hop = (found.group(1) or found.group(2)) if found else "operator"
            raise UnsupportedModelError(
                f"the {rec.phase} pass{f' in module {where!r}' if where else ''} uses the higher-order "
                f"operator {hop} (torch.{hop}), which the capture cannot run; use plain Python control "
                f"flow there") from exc
        unsupported = _unsupported_layout(first, rec.current_op)
        if unsupported:
            raise UnsupportedModelError(f"the {rec.phase} pass{f' in module {where!r}' if where else ''} "
                                        f"{unsupported}") from exc
        in_loss = rec.phase == "loss" and not rec.module_stack  # the loss_fn's own code, outside the model
        line = _raised_by_python(exc)
        if in_loss or line:  # (the op last recorded is not where it failed: the code after it)
            rec.current_op = None
            where = "" if in_loss else where
        op = f" in {rec.current_op}" if rec.current_op is not None else f" at {line}" if line else ""
        advice = "check loss_fn (it gets the model's output)" if in_loss else (
            "the model's code imports a package that is not installed here: install it" if isinstance(exc, ImportError)
            else _view_hint(first) or _no_fake_kernel(exc, first, rec.current_op) or hint())
        raise StepFailed(
            f"the {rec.phase} pass failed{f' in module {where!r}' if where else ''}{op}: "
            f"{type(exc).__name__}: {first}; {advice}"
        ) from exc
    if getattr(rec, "refused", None) is not None:
        raise rec.refused
    return out


def _message(exc: BaseException) -> str:
    """The exception's message on one line: its first line, and the next when the first ends with a colon (a
    package's "install it with pip:" and the command)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()] or [type(exc).__name__]
    text = f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    return text.replace("'FakeTensor' object", "'Tensor' object")  # (the trace's stand-in: the real step's type)


def _raised_by_python(exc: BaseException) -> str | None:
    """Where ``exc`` was raised (``file.py:line (function)``) when by Python code outside torch and this package
    (the model's own code, a hook of the user's, a library it calls) and not inside an op's dispatch (a kernel, a
    fake kernel of the user's): the op last recorded is then not where it failed; else None."""
    import os

    torch_root = os.path.dirname(os.path.abspath(torch.__file__))
    ours = os.path.dirname(os.path.abspath(__file__))
    dispatch = (os.path.join(torch_root, "_ops.py"), os.path.join(torch_root, "_subclasses") + os.sep,
                os.path.join(ours, "fake.py"), os.path.join(ours, "recorder.py"))
    tb, last, frame = exc.__traceback__, None, None
    while tb is not None:
        path = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if path.startswith(dispatch):
            return None  # (raised inside an op's dispatch)
        last, frame, tb = path, tb, tb.tb_next
    if last is None or last.startswith((torch_root + os.sep, os.path.dirname(ours) + os.sep)):
        return None
    return f"{os.path.basename(last)}:{frame.tb_lineno} ({frame.tb_frame.f_code.co_name})"


def _unsupported_layout(first: str, op: Any) -> str | None:
    """What a construct the capture does not model needs, from the failure it caused: sparse tensors (their
    storage cannot be read), torch.func transforms (they refuse the capture's saved-tensor hooks)."""
    if "SparseTensorImpl" in first or "sparse" in str(op or ""):
        return ("makes a sparse tensor, which the capture does not model: estimate it with the dense tensor "
                "(.to_dense()), whose bytes and FLOPs bound the sparse step's from above")
    if "torch.func" in first and "saved tensor hooks" in first:
        return ("runs a torch.func transform (grad, vjp, jacrev, hessian), which cannot run under the capture's "
                "saved-tensor hooks: compute the derivative with torch.autograd.grad(..., create_graph=True), "
                "which the capture traces")
    return None


def _no_fake_kernel(exc: BaseException, first: str, op: Any) -> str | None:
    """What to do for a custom op without a fake (meta) kernel, which the fake trace needs."""
    from torch._subclasses.fake_tensor import UnsupportedOperatorException

    if not (caused_by(exc, (UnsupportedOperatorException,)) or "no fake impl" in first):
        return None
    return (f"{op or 'a custom op'} has no fake (meta) kernel, which the trace needs: register one "
            f"(torch.library.register_fake), or estimate(..., trace='real') from Python (the step run on the model's "
            f"real weights and inputs on the CPU)")


def _view_hint(first: str) -> str | None:
    """What an in-place op on a tensor-parallel layer's local output means (Llama 4's shared expert adds the routed
    experts' output into it): DTensor's ``to_local()`` returns a view made in a custom autograd Function, which
    autograd refuses to modify in place, so the real step under tensor parallelism fails at the same op."""
    if "derivative for" in first and "is not implemented" in first:  # autograd's own refusal, as in a real step
        return "PyTorch has no gradient for that op and input: the real step fails the same way (detach the input)"
    if "Couldn't load custom C++ ops" in first:  # (torchvision's wheel built for another torch: the real step too)
        return ("the extension's C++ ops do not load with this torch, in a real step too: install the build made for "
                "it (for torchvision beside a CPU torch, see docs/install.md)")
    if "_ToTorchTensor" in first and "inplace" in first:
        return ("the model modifies a tensor-parallel layer's output in place, which autograd refuses on DTensor's "
                "to_local() view in a real run too: plan it without --tp (or change that op to out-of-place)")
    return None


def input_hint(call: torch.nn.Module, args: tuple, kwargs: dict) -> str:
    """What to check after a failed pass: the forward's inputs that were not given, when there are any
    (a model that needs an input its signature lets default to None: ViLT's pixel_values)."""
    try:
        params = inspect.signature(call.forward).parameters.values()
    except (TypeError, ValueError, AttributeError):
        params = []
    given = set(kwargs)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    given |= {p.name for p in positional[:len(args)]}
    missing = [p.name for p in params if p.name not in given and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               and p.name not in NOT_INPUTS]
    if not missing:
        return "check the input shapes and dtypes"
    shown = ", ".join(missing[:6]) + (f" (+{len(missing) - 6} more)" if len(missing) > 6 else "")
    return (f"check the input shapes and dtypes, and whether the model needs inputs not given "
            f"(its forward also takes {shown}; a SPEC file path/to/file.py:build can return (model, inputs) "
            f"with them)")


def optimizer_hint(params: Iterable[torch.Tensor]) -> str:
    """What to check after a failed optimizer step over ``params`` (the model's, an engine's DTensors or not)."""
    params = list(params)
    sharded = sum(getattr(p, "placements", None) is not None for p in params)
    if not sharded:
        return "check the optimizer's options"
    if sharded < len(params):  # tensor parallelism alone: what it does not split stays a plain tensor
        return ("the parameters tensor parallelism does not split (norms, biases) stay plain tensors beside its "
                "DTensors when no data-parallel engine takes them, and the optimizer's foreach step refuses the "
                "mix, as in a real run: add --sequence-parallel (the norms become DTensors, as torchtitan runs "
                "TP), or build the optimizer with foreach=False (--optimizer adamw:foreach=False)")
    # an engine's DTensor parameters: the optimizer's own ops run through DTensor's sharding rules, as in a real
    # run (a step that reduces over a sharded matrix in place, Adafactor's, fails there the same way)
    return ("the optimizer's step fails on the engine's sharded (DTensor) parameters, as it would in a real run: "
            "use an element-wise optimizer (adamw, sgd) with this strategy, or --strategy ddp")


# forward arguments that are options, not inputs (transformers' flags)
NOT_INPUTS = frozenset({"return_dict", "output_attentions", "output_hidden_states", "use_cache", "past_key_values",
                        "cache_position", "return_loss", "logits_to_keep", "interpolate_pos_encoding", "kwargs"})


def caused_by(exc: BaseException | None, types: tuple[type, ...]) -> bool:
    """Whether ``exc`` or an exception in its cause/context chain is one of ``types``."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, types):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def unpacked(packed: tuple[torch.Tensor, int]) -> torch.Tensor:
    """A saved tensor as backward reads it, checked as autograd checks its own saved tensors (which it does not
    for tensors packed by hooks): one modified in place after it was saved fails the real backward."""
    t, version = packed
    if t._version != version:
        raise UserError(f"the model modifies in place a tensor autograd saved for backward (shape {list(t.shape)}, "
                        f"at version {t._version}, saved at {version}): the real backward fails with \"one of the "
                        f"variables needed for gradient computation has been modified by an inplace operation\"; "
                        f"make the in-place op after it out of place (e.g. ReLU(inplace=False), x = x + 1)")
    return t

"""``path/to/file.py:callable`` and ``package.module:callable`` SPECs: the callable returns an
``nn.Module`` (inputs then come from ``--input``) or a ``(module, inputs)`` pair; ``--set
key=value`` options become its keyword arguments.  It is built without weights
(:func:`estimator.build.empty_weights`); one that fails so (it reads weight values while
building) is built again normally.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import os
import sys
from typing import Any, Callable, Mapping

import torch

from ..build import empty_weights
from ..errors import UserError, from_outside
from .options import Loaded, SpecOptions, close_matches, first_line

log = logging.getLogger(__name__)


# -- path/to/file.py:callable and package.module:callable -----------------------------------


def _load_callable(spec: str) -> Any:
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise UserError(f"bad SPEC {spec!r}: write path/to/file.py:callable, package.module:callable, "
                        f"hf:MODEL_TYPE, torchvision:NAME or timm:NAME")
    if target.endswith(".py") or os.sep in target or "/" in target:
        path = os.path.abspath(target)
        if not os.path.isfile(path):
            raise UserError(f"no such file: {target} (SPEC is path/to/file.py:callable)")
        name = f"_estimator_spec_{os.path.splitext(os.path.basename(path))[0]}"
        mod_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.path.insert(0, os.path.dirname(path))
        try:
            mod_spec.loader.exec_module(module)
        except Exception as exc:
            raise UserError(f"importing {target} failed: {type(exc).__name__}: {first_line(exc)}") from exc
        finally:
            sys.path.remove(os.path.dirname(path))
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise UserError(f"cannot import module {target!r}: {first_line(exc)}") from exc
        except Exception as exc:
            raise UserError(f"importing {target} failed: {type(exc).__name__}: {first_line(exc)}") from exc
    fn = getattr(module, attr, None)
    if fn is None:
        names = [n for n in dir(module) if callable(getattr(module, n)) and not n.startswith("_")]
        raise UserError(f"{target} has no callable {attr!r}{close_matches(attr, names)}; "
                        f"it has: {', '.join(names[:12]) or 'none'}")
    if not callable(fn):
        raise UserError(f"{target}:{attr} is not callable")
    return fn


def _check_kwargs(fn: Callable[..., Any], kwargs: Mapping[str, Any], what: str) -> None:
    """A one-line error for ``--set`` keys ``fn`` does not take (when its signature says so)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return
    names = [n for n, p in sig.parameters.items()
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    for key in kwargs:
        if key not in names:
            raise UserError(f"{what} takes no option {key!r} (--set {key}=...){close_matches(key, names)}; "
                            f"it takes: {', '.join(names) or 'none'}")


def load_factory(spec: str, opts: SpecOptions) -> Loaded:
    for flag, value in (("--batch", opts.batch), ("--seq", opts.seq), ("--image-size", opts.image_size)):
        if value is not None:
            raise UserError(f"{flag} applies to hf:, torchvision: and timm: specs; for {spec} use --input SHAPE "
                            f"or pass the size to the callable with --set")
    fn = _load_callable(spec)
    _check_kwargs(fn, opts.overrides, f"{spec}()")

    def call() -> Any:
        return fn(**opts.overrides)

    try:
        if opts.empty:
            try:
                built = _build(call, empty=True)
            except UserError:
                raise
            except Exception as exc:  # it reads weight values while building: build it normally
                if from_outside(exc):
                    raise
                log.info("%s() failed without weights (%s: %s); building it with weights",
                         spec, type(exc).__name__, first_line(exc))
                built = call()
        else:
            built = call()
    except UserError:
        raise
    except SystemExit as exc:  # (the process would have exited with the builder's code, saying nothing)
        raise UserError(f"{spec}() called sys.exit({exc.code!r}) while building the model; build it without "
                        f"exiting") from exc
    except Exception as exc:
        if from_outside(exc):
            raise
        text = [f"--set {k}={v!r} was passed as text" for k, v in opts.overrides.items() if isinstance(v, str)]
        raise UserError(f"{spec}() failed: {type(exc).__name__}: {first_line(exc)}"
                        + (f" ({'; '.join(text)})" if text and isinstance(exc, (TypeError, ValueError)) else "")) from exc
    if isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], torch.nn.Module):
        model, inputs = built
    elif isinstance(built, torch.nn.Module):
        model, inputs = built, None
    else:
        raise UserError(f"{spec} must return an nn.Module or a (module, inputs) pair, not {type(built).__name__}")
    return Loaded(model, inputs, name=spec)


def _build(call: Callable[[], Any], empty: bool = True) -> Any:
    if not empty:
        return call()
    with empty_weights():
        return call()

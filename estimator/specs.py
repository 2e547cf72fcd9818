"""Turn what the user typed into a model and inputs.

SPEC forms:

* ``path/to/file.py:callable`` or ``package.module:callable``: the callable returns an
  ``nn.Module`` (inputs then come from ``--input``) or a ``(module, inputs)`` pair.
  ``--set key=value`` options become keyword arguments of the callable.
* ``hf:MODEL_TYPE`` (``hf:gpt2``, ``hf:llama``): a Hugging Face transformers model from
  the default configuration of that type (``AutoConfig.for_model``), ``--set key=value``
  overriding configuration fields (``--set num_hidden_layers=2``);
  ``hf:path/to/config.json`` (or a folder holding one): that configuration.
  The model class is the config's ``architectures`` entry when it names one, else the
  causal LM for decoder types, the masked LM for encoder types (bert), the seq2seq LM for
  encoder-decoder types (t5), the image classifier for vision types (vit), else the base
  model.  Inputs: token ids of ``--batch`` x ``--seq`` with labels, so the model computes
  its own loss; images of ``--batch`` x channels x ``--image-size`` squared with class labels.
* ``torchvision:NAME`` (``torchvision:resnet50``): ``torchvision.models.get_model(NAME,
  weights=None)``, ``--set`` options as builder keyword arguments; inputs ``--batch`` x 3 x
  ``--image-size`` squared (default: the size of the model's weights' preprocessing),
  cross-entropy against class labels.
* ``timm:NAME``: ``timm.create_model(NAME, pretrained=False)``; input size from the model's
  ``pretrained_cfg``; cross-entropy against class labels.

Library models are built without weights (:func:`estimator.build.empty_weights`): nothing
is downloaded, allocated or initialised, so a 70B configuration builds in seconds.  User
factories are built the same way; one that fails so (it reads weight values while
building) is built again normally.

Input shapes: ``8x3x224x224`` (float32) or ``8x1024:int64``; tensors are made on the
``meta`` device, so no memory is allocated for them.

Why one file of this length: each SPEC form (files, ``hf:``, ``torchvision:``, ``timm:``) needs its
own loader, input builder and one-line error messages, and they share the option parsing
(``--batch``, ``--seq``, ``--set``, ``--image-size``); one loader per section below.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from .build import empty_weights
from .errors import UserError

log = logging.getLogger(__name__)

PREFIXES = ("hf", "torchvision", "timm")
DEFAULT_SEQ = 2048  # token models: at most this, or the model's position limit when smaller
FALLBACK_SEQ = 512  # token models whose configuration states no position limit
DEFAULT_IMAGE_SIZE = 224

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float": torch.float32, "fp32": torch.float32, "f32": torch.float32,
    "float64": torch.float64, "double": torch.float64, "fp64": torch.float64,
    "float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "int64": torch.int64, "long": torch.int64, "int32": torch.int32, "int": torch.int32,
    "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name.strip().lower()]
    except KeyError:
        raise UserError(f"unknown dtype {name!r}; use one of {', '.join(sorted(DTYPES))}") from None


def parse_shape(text: str) -> torch.Tensor:
    """``"8x3x224x224"`` or ``"8x1024:int64"`` -> a meta tensor of that shape and dtype."""
    shape_text, _, dtype_text = text.partition(":")
    dtype = parse_dtype(dtype_text) if dtype_text else torch.float32
    parts = shape_text.strip().lower().replace(",", "x").split("x")
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise UserError(f"bad shape {text!r}: write dimensions joined by 'x', e.g. 8x3x224x224 or 8x1024:int64") from None
    if any(s < 0 for s in shape) or not shape_text.strip():
        raise UserError(f"bad shape {text!r}: dimensions must be non-negative integers, e.g. 8x3x224x224")
    return torch.empty(shape, dtype=dtype, device="meta")


def parse_value(text: str) -> Any:
    """A ``--set`` value: int, float, true/false, none/null, a JSON list or object, else the string."""
    s = text.strip()
    low = s.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for conv in (int, float):
        try:
            return conv(s)
        except ValueError:
            pass
    if s[:1] in "[{":
        try:
            return json.loads(s)
        except ValueError:
            pass
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    return s


def parse_overrides(items: list[str] | Mapping[str, Any] | None) -> dict[str, Any]:
    """``["num_hidden_layers=2", "vocab_size=32000"]`` -> ``{"num_hidden_layers": 2, ...}``."""
    if not items:
        return {}
    if isinstance(items, Mapping):
        return dict(items)
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(f"bad --set {item!r}: write key=value, e.g. --set num_hidden_layers=2")
        out[key] = parse_value(value)
    return out


def close_matches(word: str, candidates: list[str] | set[str], n: int = 5) -> str:
    """``"; close matches: a, b"`` (or ``""``) for an error message."""
    cands = sorted(set(candidates))
    hits = difflib.get_close_matches(word, cands, n=n, cutoff=0.6)
    if not hits:
        low = word.lower()
        hits = [c for c in cands if low and (low in c.lower() or c.lower() in low)][:n]
    return f"; close matches: {', '.join(hits)}" if hits else ""


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _short(exc: BaseException) -> str:
    """The message of ``exc`` on one line (multi-line validation messages joined)."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    return " ".join(lines[:3]) if lines else type(exc).__name__


# -- what a SPEC gives ----------------------------------------------------------------------


@dataclass
class Loaded:
    """A model and its example inputs, with what the estimate needs to know about them."""

    model: torch.nn.Module
    inputs: Any
    loss_fn: Callable[[Any], torch.Tensor] | None = None
    name: str = ""  # the SPEC, for the report
    description: str = ""  # the class and the inputs, e.g. "LlamaForCausalLM; input_ids 1x2048, labels"
    config: Any = None  # the transformers configuration for hf: specs

    @property
    def title(self) -> str:
        return f"{self.name} ({self.description})" if self.description else self.name


@dataclass
class SpecOptions:
    input_shapes: list[str] = field(default_factory=list)
    batch: int | None = None
    seq: int | None = None
    image_size: int | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    empty: bool = True  # build user factories without weights (library models always are)


def prefix_of(spec: str) -> str | None:
    head, sep, _ = spec.partition(":")
    return head if sep and head in PREFIXES else None


def load_spec(
    spec: str,
    input_shapes: list[str] | None = None,
    *,
    batch: int | None = None,
    seq: int | None = None,
    image_size: int | None = None,
    overrides: list[str] | Mapping[str, Any] | None = None,
    empty: bool = True,
) -> Loaded:
    """Build the model and inputs a SPEC names (see the module doc); never downloads anything."""
    opts = SpecOptions(list(input_shapes or []), batch, seq, image_size, parse_overrides(overrides), empty)
    for flag, value in (("--batch", batch), ("--seq", seq), ("--image-size", image_size)):
        if value is not None and value < 1:
            raise UserError(f"{flag} must be >= 1, not {value}")
    prefix = prefix_of(spec)
    if prefix is None:
        loaded = _load_factory(spec, opts)
    else:
        target = spec[len(prefix) + 1:].strip()
        if not target:
            raise UserError(f"bad SPEC {spec!r}: write {prefix}:NAME, e.g. "
                            + {"hf": "hf:gpt2", "torchvision": "torchvision:resnet50", "timm": "timm:resnet50"}[prefix])
        loaded = {"hf": _load_hf, "torchvision": _load_torchvision, "timm": _load_timm}[prefix](target, opts)
        loaded.name = spec
    if opts.input_shapes:
        tensors = tuple(parse_shape(s) for s in opts.input_shapes)
        loaded.inputs = tensors[0] if len(tensors) == 1 else tensors
        loaded.loss_fn = None if prefix is None else loaded.loss_fn
        loaded.description = f"{type(loaded.model).__name__}; inputs {', '.join(opts.input_shapes)}"
    if loaded.inputs is None:
        raise UserError(f"{spec} returns a model without inputs: pass --input SHAPE (e.g. --input 8x3x224x224)")
    return loaded


def load(spec: str, input_shapes: list[str] | None = None, **options: Any) -> tuple[torch.nn.Module, Any]:
    """Build ``(model, inputs)`` from a SPEC and optional ``--input`` shapes (see :func:`load_spec`)."""
    loaded = load_spec(spec, input_shapes, **options)
    return loaded.model, loaded.inputs


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
            raise UserError(f"importing {target} failed: {type(exc).__name__}: {_first_line(exc)}") from exc
        finally:
            sys.path.remove(os.path.dirname(path))
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise UserError(f"cannot import module {target!r}: {_first_line(exc)}") from exc
        except Exception as exc:
            raise UserError(f"importing {target} failed: {type(exc).__name__}: {_first_line(exc)}") from exc
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


def _load_factory(spec: str, opts: SpecOptions) -> Loaded:
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
                log.info("%s() failed without weights (%s: %s); building it with weights",
                         spec, type(exc).__name__, _first_line(exc))
                built = call()
        else:
            built = call()
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"{spec}() failed: {type(exc).__name__}: {_first_line(exc)}") from exc
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


# -- hf: --------------------------------------------------------------------------------------


def _import_transformers():
    try:
        import transformers
    except ImportError as exc:
        raise UserError("hf: specs need transformers: pip install 'estimator[hf]'") from exc
    except Exception as exc:
        raise UserError(f"importing transformers failed: {type(exc).__name__}: {_first_line(exc)}") from exc
    transformers.logging.set_verbosity_error()
    return transformers


def _hf_config_fields(cfg: Any) -> set[str]:
    """Names a configuration knows: its stored fields, attribute aliases and constructor arguments."""
    names = set(cfg.to_dict())
    names |= set(getattr(type(cfg), "attribute_map", {}) or {})
    try:
        names |= {n for n, p in inspect.signature(type(cfg).__init__).parameters.items()
                  if n != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    except (TypeError, ValueError):  # pragma: no cover
        pass
    import dataclasses

    if dataclasses.is_dataclass(cfg):
        names |= {f.name for f in dataclasses.fields(cfg)}
    return {n for n in names if not n.startswith("_")}


SPECIAL_HF_KEYS = ("attn_implementation",)


def _split_overrides(cfg: Any, overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]],
                                                                  dict[str, Any]]:
    """Check every ``--set`` key against the configuration; return (top-level, per sub-config, special)."""
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    special: dict[str, Any] = {}
    fields = _hf_config_fields(cfg)
    cname = type(cfg).__name__
    for key, value in overrides.items():
        if key in SPECIAL_HF_KEYS:
            special[key] = value
            continue
        head, dot, tail = key.partition(".")
        if dot:
            sub = getattr(cfg, head, None)
            if sub is None or not hasattr(sub, "to_dict"):
                subs = [n for n in fields if hasattr(getattr(cfg, n, None), "to_dict")]
                raise UserError(f"{cname} has no sub-configuration {head!r} (--set {key}=...)"
                                f"{close_matches(head, subs)}")
            sub_fields = _hf_config_fields(sub)
            if tail not in sub_fields or "." in tail:
                raise UserError(f"{type(sub).__name__} ({cname}.{head}) has no field {tail!r} (--set {key}=...)"
                                f"{close_matches(tail, sub_fields)}")
            nested.setdefault(head, {})[tail] = value
        elif key not in fields:
            raise UserError(f"{cname} has no field {key!r} (--set {key}=...){close_matches(key, fields)}")
        else:
            top[key] = value
    return top, nested, special


def _hf_model_types(transformers) -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return list(CONFIG_MAPPING_NAMES)


def _hf_config(transformers, target: str, overrides: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The configuration a ``hf:`` target names, with the ``--set`` overrides applied."""
    from transformers import AutoConfig

    path = os.path.expanduser(target)
    is_path = os.path.exists(path) or target.endswith(".json") or target.startswith((".", "/", "~"))
    if is_path:
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise UserError(f"no such file: {path} (hf:path/to/config.json or a folder holding config.json)")
        try:
            with open(path) as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot read {path}: {type(exc).__name__}: {_first_line(exc)}") from exc
        if not isinstance(data, dict) or "model_type" not in data:
            raise UserError(f"{path} has no \"model_type\": it is not a transformers config.json")
        model_type = data["model_type"]
        config_class = _config_class(transformers, model_type, f"{path}: model_type")
        base = config_class.from_dict(dict(data))
        top, nested, special = _split_overrides(base, overrides)
        merged = dict(data)
        merged.update(top)
        for head, sub in nested.items():
            merged[head] = _merge_sub(data.get(head) or getattr(base, head).to_dict(), sub)
        try:
            cfg = config_class.from_dict(merged)
        except Exception as exc:
            raise UserError(f"{config_class.__name__}: {_short(exc)}") from exc
        return cfg, special
    if "/" in target:  # a hub id: only a copy already in the local cache, never the network
        try:
            base = AutoConfig.from_pretrained(target, local_files_only=True)
        except Exception as exc:
            raise UserError(f"hf:{target} is neither a local file nor in the Hugging Face cache (no downloads): "
                            f"save its config.json and pass hf:path/to/config.json") from exc
        top, nested, special = _split_overrides(base, overrides)
        try:
            cfg = AutoConfig.from_pretrained(target, local_files_only=True, **top)
        except Exception as exc:
            raise UserError(f"{type(base).__name__}: {_short(exc)}") from exc
        _apply_nested(cfg, nested)
        return cfg, special
    model_type = _model_type(transformers, target)
    config_class = _config_class(transformers, model_type, "hf")
    try:
        base = config_class()
    except Exception as exc:
        raise UserError(f"hf:{target}: {config_class.__name__}() has no default: {_short(exc)}; "
                        f"pass hf:path/to/config.json") from exc
    top, nested, special = _split_overrides(base, overrides)
    kwargs = dict(top)
    for head, sub in nested.items():
        kwargs[head] = _merge_sub(getattr(base, head).to_dict(), sub)
    try:
        cfg = AutoConfig.for_model(model_type, **kwargs)
    except Exception as exc:
        raise UserError(f"{config_class.__name__}: {_short(exc)}") from exc
    return cfg, special


# Fields a configuration derives from another when it is built: a sub-configuration given as a dict
# keeps them, so they are dropped when the field they derive from is overridden.
DERIVED_FIELDS = {"num_hidden_layers": ("layer_types",)}


def _merge_sub(base: dict[str, Any], sub: dict[str, Any]) -> dict[str, Any]:
    """A sub-configuration's dict with ``--set`` values over it (derived fields re-derived)."""
    merged = dict(base)
    for key in sub:
        for derived in DERIVED_FIELDS.get(key, ()):
            if derived not in sub:
                merged.pop(derived, None)
    merged.update(sub)
    return merged


def _apply_nested(cfg: Any, nested: dict[str, dict[str, Any]]) -> None:
    for head, sub in nested.items():
        for k, v in sub.items():
            setattr(getattr(cfg, head), k, v)


def _model_type(transformers, name: str) -> str:
    types = _hf_model_types(transformers)
    if name in types:
        return name
    for variant in (name.lower(), name.lower().replace("-", "_"), name.lower().replace("_", "-")):
        if variant in types:
            return variant
    raise UserError(f"unknown Hugging Face model type {name!r}{close_matches(name.lower(), types)} "
                    f"(hf:MODEL_TYPE takes a transformers model_type, e.g. hf:gpt2, hf:llama, hf:bert, hf:t5)")


def _config_class(transformers, model_type: str, where: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        return CONFIG_MAPPING[model_type]
    except KeyError:
        raise UserError(f"{where} {model_type!r} is not a model type this transformers "
                        f"({transformers.__version__}) knows{close_matches(model_type, _hf_model_types(transformers))}")
    except Exception as exc:  # a model whose extra dependencies are missing
        raise UserError(f"{where} {model_type!r}: {type(exc).__name__}: {_first_line(exc)}") from exc


def _hf_model_class(transformers, cfg: Any) -> tuple[Any, str]:
    """(the model class to build, its task) for a configuration; see the module doc."""
    from transformers.models.auto import modeling_auto as ma

    for arch in getattr(cfg, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls, "architectures"
    mt = cfg.model_type
    order = []
    if getattr(cfg, "is_encoder_decoder", False):
        order.append(("AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"))
        order.append(("AutoModelForSpeechSeq2Seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"))
    if getattr(cfg, "vision_config", None) is not None:
        # vision-language models: the class with the vision tower, the projector and the LM head
        order.append(("AutoModelForImageTextToText", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"))
    order += [
        ("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
        ("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
        ("AutoModelForImageClassification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
        ("AutoModelForCTC", "MODEL_FOR_CTC_MAPPING_NAMES"),  # speech encoders (wav2vec2, HuBERT): the CTC head
        ("AutoModel", "MODEL_MAPPING_NAMES"),
    ]
    for auto_name, mapping_name in order:
        mapping = getattr(ma, mapping_name, {})
        if mt in mapping and hasattr(transformers, auto_name):
            return getattr(transformers, auto_name), auto_name
    raise UserError(f"hf:{mt}: transformers has no model class for this configuration type")


def _max_positions(cfg: Any) -> int | None:
    for c in (cfg, getattr(cfg, "text_config", None)):
        for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
            value = getattr(c, key, None)
            if isinstance(value, int) and value > 0:
                return value
    return None


def _set_image_size(cfg: Any, size: int) -> None:
    """``--image-size``: the configuration's image size (a vision-language model's vision tower's)."""
    vision = getattr(cfg, "vision_config", None)
    if hasattr(cfg, "image_size"):
        cfg.image_size = size
    elif vision is not None and hasattr(vision, "image_size"):
        vision.image_size = size
    elif vision is None:
        raise UserError(f"--image-size: {type(cfg).__name__} has no image_size (a token model: use --seq)")
    # else: a vision tower that takes any size (Qwen2-VL): the inputs follow --image-size


def _load_hf(target: str, opts: SpecOptions) -> Loaded:
    transformers = _import_transformers()
    cfg, special = _hf_config(transformers, target, opts.overrides)
    if opts.image_size is not None:
        _set_image_size(cfg, opts.image_size)
    cls, how = _hf_model_class(transformers, cfg)
    kwargs: dict[str, Any] = {}
    major = int(transformers.__version__.split(".")[0])
    kwargs["dtype" if major >= 5 else "torch_dtype"] = torch.float32  # --precision decides casts
    if "attn_implementation" in special:
        kwargs["attn_implementation"] = special["attn_implementation"]
    build = cls.from_config if how.startswith("Auto") else cls._from_config
    try:
        with empty_weights():
            model = build(cfg, **kwargs)
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"building {getattr(cls, '__name__', cls)} from {type(cfg).__name__} failed: "
                        f"{type(exc).__name__}: {_first_line(exc)}") from exc
    inputs, desc = _hf_inputs(model, cfg, opts)
    return Loaded(model, inputs, name=f"hf:{target}", description=f"{type(model).__name__}; {desc}", config=cfg)


def _hf_inputs(model: torch.nn.Module, cfg: Any, opts: SpecOptions) -> tuple[Any, str]:
    main = getattr(model, "main_input_name", "input_ids")
    batch = opts.batch or 1
    meta = dict(device="meta")
    if _takes(model, "pixel_values") and getattr(cfg, "vision_config", None) is not None \
            and _image_token_id(cfg) is not None:
        return _vlm_inputs(model, cfg, opts)
    if main == "input_values":
        return _ctc_inputs(model, cfg, opts)
    if main == "input_ids":
        if opts.image_size is not None:
            raise UserError(f"--image-size: {type(model).__name__} takes token ids; use --seq")
        limit = _max_positions(cfg)
        seq = opts.seq or (min(limit, DEFAULT_SEQ) if limit else FALLBACK_SEQ)
        if limit and seq > limit:
            log.warning("--seq %d is longer than the model's %d positions: a real run may fail", seq, limit)
        ids = torch.zeros(batch, seq, dtype=torch.int64, **meta)
        inputs = {"input_ids": ids, "labels": ids}
        desc = f"input_ids {batch}x{seq}, labels"
        if getattr(cfg, "is_encoder_decoder", False):
            inputs["decoder_input_ids"] = ids
            desc = f"input_ids {batch}x{seq}, decoder_input_ids {batch}x{seq}, labels"
        return inputs, desc
    if main == "input_features" and getattr(cfg, "is_encoder_decoder", False):
        # speech seq2seq (Whisper): log-mel features of 2 x max_source_positions frames (the
        # encoder's two stride-2 convolutions halve them), decoder tokens and labels
        if opts.image_size is not None:
            raise UserError(f"--image-size: {type(model).__name__} takes audio features; use --seq for the decoder")
        mels = int(getattr(cfg, "num_mel_bins", 80))
        frames = 2 * int(getattr(cfg, "max_source_positions", 1500))
        limit = getattr(cfg, "max_target_positions", None)
        seq = opts.seq or (min(limit, DEFAULT_SEQ) if limit else FALLBACK_SEQ)
        ids = torch.zeros(batch, seq, dtype=torch.int64, **meta)
        inputs = {"input_features": torch.zeros(batch, mels, frames, dtype=torch.float32, **meta),
                  "decoder_input_ids": ids, "labels": ids}
        return inputs, f"input_features {batch}x{mels}x{frames}, decoder_input_ids {batch}x{seq}, labels"
    if main == "pixel_values":
        if opts.seq is not None:
            raise UserError(f"--seq: {type(model).__name__} takes images; use --image-size")
        size = opts.image_size or getattr(cfg, "image_size", None) or DEFAULT_IMAGE_SIZE
        if isinstance(size, (list, tuple)):
            h, w = int(size[0]), int(size[-1])
        else:
            h = w = int(size)
        channels = int(getattr(cfg, "num_channels", 3) or 3)
        pixels = torch.zeros(batch, channels, h, w, dtype=torch.float32, **meta)
        inputs = {"pixel_values": pixels}
        desc = f"pixel_values {batch}x{channels}x{h}x{w}"
        if type(model).__name__.endswith("ForImageClassification"):
            inputs["labels"] = torch.zeros(batch, dtype=torch.int64, **meta)
            desc += ", labels"
        return inputs, desc
    raise UserError(f"hf: makes token or image inputs; {type(model).__name__} takes {main!r}: "
                    f"write a SPEC file that returns (model, inputs)")


def _takes(model: torch.nn.Module, name: str) -> bool:
    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return False


def _image_token_id(cfg: Any) -> int | None:
    for key in ("image_token_id", "image_token_index"):
        value = getattr(cfg, key, None)
        if isinstance(value, int):
            return value
    return None


def _seq_for(cfg: Any, opts: SpecOptions, at_least: int, what: str) -> int:
    limit = _max_positions(cfg)
    seq = opts.seq or max(min(limit, DEFAULT_SEQ) if limit else FALLBACK_SEQ, at_least + 1)
    if seq <= at_least:
        raise UserError(f"--seq {seq} leaves no text after the {at_least} {what}: use --seq {at_least + 1} or more "
                        f"(or a smaller --image-size)")
    if limit and seq > limit:
        log.warning("--seq %d is longer than the model's %d positions: a real run may fail", seq, limit)
    return seq


def _vlm_inputs(model: torch.nn.Module, cfg: Any, opts: SpecOptions) -> tuple[Any, str]:
    """A vision-language model's training batch: one image of ``--image-size`` per sample, its image
    tokens at the start of ``input_ids``, text after them, labels on the text.

    LLaVA-style models (a fixed number of image tokens per image: LLaVA, PaliGemma, Gemma 3, InternVL)
    take ``pixel_values`` of batch x 3 x size x size; Qwen2-VL-style models (patches merged 2 x 2, any
    size) take the flattened patches, ``image_grid_thw`` and ``mm_token_type_ids``.  The tensors are
    real CPU tensors (a few MiB): the model reads the token ids and the grid, so a capture that falls
    back to real tensors needs their values."""
    vision = cfg.vision_config
    batch = opts.batch or 1
    name = type(model).__name__
    image_token = _image_token_id(cfg)
    if hasattr(vision, "spatial_merge_size") and hasattr(vision, "temporal_patch_size") and _takes(model, "image_grid_thw"):
        patch, merge, temporal = int(vision.patch_size), int(vision.spatial_merge_size), int(vision.temporal_patch_size)
        size = opts.image_size or QWEN_VL_IMAGE_SIZE
        if size % (patch * merge):
            raise UserError(f"--image-size {size}: {name} takes images in multiples of {patch * merge} pixels "
                            f"(patch {patch} x merge {merge}), e.g. --image-size {max(1, size // (patch * merge)) * patch * merge}")
        side = size // patch
        channels = int(getattr(vision, "in_channels", 3) or 3)
        n_tokens = side * side // (merge * merge)
        seq = _seq_for(cfg, opts, n_tokens, "image tokens")
        ids, labels = _image_text_ids(batch, seq, n_tokens, image_token)
        inputs = {"input_ids": ids,
                  "pixel_values": torch.zeros(batch * side * side, channels * temporal * patch * patch),
                  "image_grid_thw": torch.tensor([[1, side, side]] * batch),
                  "labels": labels}
        if _takes(model, "mm_token_type_ids"):
            inputs["mm_token_type_ids"] = (ids == image_token).to(torch.int32)
        desc = (f"input_ids {batch}x{seq} ({n_tokens} image tokens each), pixel_values of {batch} image(s) "
                f"{size}x{size} ({batch * side * side} patches), image_grid_thw, labels")
        return _without_checks_on_fake(model, inputs), desc
    size = opts.image_size or getattr(vision, "image_size", None) or DEFAULT_IMAGE_SIZE
    h, w = (int(size[0]), int(size[-1])) if isinstance(size, (list, tuple)) else (int(size), int(size))
    channels = int(getattr(vision, "num_channels", 3) or 3)
    pixels = torch.zeros(batch, channels, h, w)
    n_tokens = _image_tokens(model, cfg, pixels[:1])
    seq = _seq_for(cfg, opts, n_tokens, "image tokens")
    ids, labels = _image_text_ids(batch, seq, n_tokens, image_token)
    inputs = {"input_ids": ids, "pixel_values": pixels, "labels": labels}
    if _takes(model, "token_type_ids"):  # PaliGemma, Gemma 3: image positions marked 1
        inputs["token_type_ids"] = (ids == image_token).to(torch.int64)
    desc = f"input_ids {batch}x{seq} ({n_tokens} image tokens each), pixel_values {batch}x{channels}x{h}x{w}, labels"
    return _without_checks_on_fake(model, inputs), desc


QWEN_VL_IMAGE_SIZE = 448  # Qwen2-VL takes any multiple of 28 pixels; 448 x 448 = 256 image tokens


def _image_text_ids(batch: int, seq: int, n_image: int, image_token: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (image tokens first, then text token 1) and labels (-100 on the image tokens)."""
    ids = torch.ones(batch, seq, dtype=torch.int64)
    ids[:, :n_image] = image_token
    labels = ids.clone()
    labels[:, :n_image] = -100
    return ids, labels


def _image_tokens(model: torch.nn.Module, cfg: Any, pixels: torch.Tensor) -> int:
    """How many tokens one image becomes: the vision tower and projector run on the meta device (the
    weights are not needed for shapes), else the count the configuration states."""
    name = type(model).__name__
    get = getattr(model, "get_image_features", None)
    failure: Exception | None = None
    if get is not None:
        try:
            sig = inspect.signature(get).parameters
            extra = {"image_sizes": torch.tensor([list(pixels.shape[-2:])])} if "image_sizes" in sig else {}
            with torch.no_grad():
                out = get(pixel_values=pixels.to("meta"), **extra)
            features = getattr(out, "pooler_output", out)
            if isinstance(features, (list, tuple)):
                features = features[0]
            if isinstance(features, torch.Tensor) and features.ndim >= 2:
                return features.numel() // features.shape[-1]
        except Exception as exc:  # noqa: BLE001 - a tower that does not run on meta: the configuration's count
            failure = exc
    for key in ("mm_tokens_per_image", "image_seq_length", "num_image_tokens"):
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value > 0:
            return value
    why = f" ({type(failure).__name__}: {_first_line(failure)})" if failure is not None else ""
    raise UserError(f"{name}: cannot tell how many tokens an image of {pixels.shape[-2]}x{pixels.shape[-1]} "
                    f"becomes{why}; this model needs more than pixel_values (tiles, image sizes): write a SPEC "
                    f"file that returns (model, inputs)")


class _ChecksOffOnFake:
    """Forward hooks that set ``TRANSFORMERS_DISABLE_TORCH_CHECK=1`` while the model runs on fake tensors.

    Vision-language models check that the image tokens match the image features by reading tensor
    values (``torch_compilable_check``), which fake tensors do not have; transformers skips these
    checks when that variable is set.  It is set only for a forward on fake tensors and restored
    after it: real runs (``estimator validate``) keep the checks."""

    VAR = "TRANSFORMERS_DISABLE_TORCH_CHECK"

    def __init__(self):
        self.saved: list[str | None] = []

    def pre(self, _module, args, kwargs):
        fake = any(isinstance(t, torch._subclasses.FakeTensor) for t in list(args) + list(kwargs.values()))
        self.saved.append(os.environ.get(self.VAR) if fake else _UNCHANGED)
        if fake:
            os.environ[self.VAR] = "1"

    def post(self, _module, _args, _kwargs, _output):
        previous = self.saved.pop() if self.saved else _UNCHANGED
        if previous is _UNCHANGED:
            return
        if previous is None:
            os.environ.pop(self.VAR, None)
        else:
            os.environ[self.VAR] = previous


_UNCHANGED = "\0unchanged"


def _without_checks_on_fake(model: torch.nn.Module, inputs: dict) -> dict:
    hooks = _ChecksOffOnFake()
    model.register_forward_pre_hook(hooks.pre, with_kwargs=True)
    model.register_forward_hook(hooks.post, with_kwargs=True, always_call=True)
    return inputs


CTC_SAMPLES = 16000 * 10  # speech encoders: 10 s of 16 kHz audio by default


def _ctc_inputs(model: torch.nn.Module, cfg: Any, opts: SpecOptions) -> tuple[Any, str]:
    """Speech encoders with a CTC head (wav2vec2, HuBERT, WavLM): raw audio of ``--seq`` samples and
    labels a quarter as long as the encoder's output frames (real CPU tensors: the CTC loss reads
    the label lengths)."""
    name = type(model).__name__
    if opts.image_size is not None:
        raise UserError(f"--image-size: {name} takes audio; use --seq for the number of audio samples")
    if not _takes(model, "labels"):
        raise UserError(f"hf: {name} takes audio (input_values) and has no loss of its own: write a SPEC file "
                        f"that returns (model, inputs) and a loss")
    batch = opts.batch or 1
    samples = opts.seq or CTC_SAMPLES
    frames = samples
    for kernel, stride in zip(getattr(cfg, "conv_kernel", ()), getattr(cfg, "conv_stride", ())):
        frames = (frames - kernel) // stride + 1
    if frames < 2:
        raise UserError(f"--seq {samples}: too few audio samples for {name}'s feature encoder; use --seq 16000 or more")
    n_labels = max(1, frames // 4)
    inputs = {"input_values": torch.zeros(batch, samples), "labels": torch.ones(batch, n_labels, dtype=torch.int64)}
    return inputs, f"input_values {batch}x{samples} (audio samples), labels {batch}x{n_labels}"


# -- image classifiers: torchvision: and timm: ------------------------------------------------


def classification_loss(output: Any) -> torch.Tensor:
    """Cross-entropy of each (batch, classes) logits tensor in ``output`` against class 0 labels.

    Other outputs (segmentation maps, features) fall back to the default loss.
    """
    import torch.nn.functional as F
    import torch.utils._pytree as pytree

    from .capture import default_loss

    logits = [t for t in pytree.tree_leaves(output)
              if isinstance(t, torch.Tensor) and t.is_floating_point() and t.ndim == 2 and t.requires_grad]
    if not logits:
        return default_loss(output)
    loss = None
    for t in logits:
        labels = torch.zeros(t.shape[0], dtype=torch.int64, device=t.device)
        term = F.cross_entropy(t, labels)
        loss = term if loss is None else loss + term
    return loss


def _image_inputs(opts: SpecOptions, size: int | tuple[int, int], channels: int = 3) -> tuple[torch.Tensor, str]:
    if opts.seq is not None:
        raise UserError("--seq applies to token models; image models take --batch and --image-size")
    batch = opts.batch or 1
    h, w = (size, size) if isinstance(size, int) else size
    return torch.zeros(batch, channels, h, w, device="meta"), f"images {batch}x{channels}x{h}x{w}, class labels"


def _import_vision(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if getattr(exc, "name", None) == name:
            raise UserError(f"{name}: specs need {name}: pip install 'estimator[vision]'") from exc
        raise UserError(f"importing {name} failed: {_first_line(exc)} ({name} must match torch "
                        f"{torch.__version__})") from exc
    except Exception as exc:
        raise UserError(f"importing {name} failed: {type(exc).__name__}: {_first_line(exc)} "
                        f"({name} must match torch {torch.__version__})") from exc


def _construct(call: Callable[[], torch.nn.Module], what: str, known: list[str] | None = None) -> torch.nn.Module:
    import warnings

    try:
        with empty_weights(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # notes about weight initialisation, which is skipped anyway
            return call()
    except TypeError as exc:
        msg = _first_line(exc)
        if "unexpected keyword argument" in msg:
            key = msg.split("'")[-2] if msg.count("'") >= 2 else "?"
            raise UserError(f"{what} takes no option {key!r} (--set {key}=...)"
                            f"{close_matches(key, known or [])}") from exc
        raise UserError(f"building {what} failed: TypeError: {msg}") from exc
    except Exception as exc:
        raise UserError(f"building {what} failed: {type(exc).__name__}: {_first_line(exc)}") from exc


def _load_torchvision(name: str, opts: SpecOptions) -> Loaded:
    tv = _import_vision("torchvision")
    models = tv.models
    names = models.list_models()
    if name not in names:
        raise UserError(f"unknown torchvision model {name!r}{close_matches(name, names)} "
                        f"(torchvision.models.list_models() has {len(names)})")
    kwargs = dict(opts.overrides)
    if opts.image_size is not None and "image_size" not in kwargs:
        kwargs["image_size"] = opts.image_size  # ViT: its positional embeddings depend on the size

    def make(kw):
        def build():
            import inspect

            builder = models.get_model_builder(name)
            if "weights_backbone" in inspect.signature(builder).parameters:
                kw.setdefault("weights_backbone", None)  # detection/segmentation: no backbone download
            return builder(weights=None, **kw)

        return build

    model = _construct_sized(make, kwargs, "image_size", opts, f"torchvision model {name}")
    if name in models.list_models(module=models.detection):
        inputs, desc = detection_inputs(model, opts)
        return Loaded(model, inputs, loss_fn=detection_loss, description=f"{type(model).__name__}; {desc}")
    size = opts.image_size or getattr(model, "image_size", None) or _torchvision_crop(models, name)
    inputs, desc = _image_inputs(opts, size)
    return Loaded(model, inputs, loss_fn=classification_loss, description=f"{type(model).__name__}; {desc}")


DETECTION_IMAGE_SIZE = 800  # torchvision's detection transforms resize the shorter side to 800 anyway


def detection_targets(model: torch.nn.Module, batch: int, height: int, width: int) -> list[dict[str, torch.Tensor]]:
    """One synthetic object per image, as torchvision's detection models take them in training mode:
    ``boxes`` (N, 4) as x1, y1, x2, y2 and ``labels`` (N,); ``masks`` (N, H, W) for Mask R-CNN and
    ``keypoints`` (N, K, 3) for Keypoint R-CNN.  Real CPU tensors (the models check the boxes' values)."""
    heads = getattr(model, "roi_heads", None)
    box = torch.tensor([[0.1 * width, 0.1 * height, 0.6 * width, 0.6 * height]])
    targets = []
    for _ in range(batch):
        t = {"boxes": box.clone(), "labels": torch.ones(1, dtype=torch.int64)}
        if heads is not None and heads.has_mask():
            mask = torch.zeros(1, height, width, dtype=torch.uint8)
            mask[:, int(0.1 * height):int(0.6 * height), int(0.1 * width):int(0.6 * width)] = 1
            t["masks"] = mask
        if heads is not None and heads.has_keypoint():
            k = heads.keypoint_predictor.kps_score_lowres.out_channels
            points = torch.stack([torch.linspace(0.2 * width, 0.5 * width, k), torch.linspace(0.2 * height, 0.5 * height, k),
                                  torch.ones(k)], dim=-1)
            t["keypoints"] = points[None]
        targets.append(t)
    return targets


def detection_inputs(model: torch.nn.Module, opts: SpecOptions) -> tuple[Any, str]:
    """(images, targets) for a torchvision detection model: ``--batch`` images of ``--image-size``
    (default 800) and one synthetic object each; the model returns its losses in training mode."""
    if opts.seq is not None:
        raise UserError("--seq applies to token models; detection models take --batch and --image-size")
    batch, size = opts.batch or 1, opts.image_size or DETECTION_IMAGE_SIZE
    images = [torch.zeros(3, size, size) for _ in range(batch)]
    targets = detection_targets(model, batch, size, size)
    kinds = ", ".join(k for k in targets[0] if k != "boxes")
    return (images, targets), f"{batch} image(s) 3x{size}x{size}, targets (one box, {kinds})"


def detection_loss(output: Any) -> torch.Tensor:
    """The sum of the losses a detection model returns in training mode (a dict of scalars)."""
    if isinstance(output, dict) and output and all(isinstance(v, torch.Tensor) and v.numel() == 1
                                                   for v in output.values()):
        return sum(output.values())
    from .capture import default_loss

    return default_loss(output)


def _construct_sized(make, kwargs: dict, size_key: str, opts: SpecOptions, what: str):
    """Build with the image size passed to the constructor (a ViT's positional embeddings depend on
    it); if the constructor takes no such argument (a CNN: any size works), build without it."""
    try:
        return _construct(make(kwargs), what)
    except UserError:
        if size_key not in kwargs or size_key in opts.overrides:
            raise
        kwargs.pop(size_key)
        return _construct(make(kwargs), what)


def _torchvision_crop(models, name: str) -> int:
    """The crop size of the model's default weights' preprocessing (metadata only, nothing downloaded)."""
    try:
        weights = models.get_model_weights(name)
        crop = weights.DEFAULT.transforms().crop_size
        return int(crop[0] if isinstance(crop, (list, tuple)) else crop)
    except Exception:
        return DEFAULT_IMAGE_SIZE


def _load_timm(name: str, opts: SpecOptions) -> Loaded:
    timm = _import_vision("timm")
    names = timm.list_models()
    if name not in names:
        raise UserError(f"unknown timm model {name!r}{close_matches(name, names)} "
                        f"(timm.list_models() has {len(names)})")
    kwargs = dict(opts.overrides)
    if opts.image_size is not None and "img_size" not in kwargs:
        kwargs["img_size"] = opts.image_size

    def make(kw):
        return lambda: timm.create_model(name, pretrained=False, **kw)

    model = _construct_sized(make, kwargs, "img_size", opts, f"timm model {name}")
    cfg = getattr(model, "pretrained_cfg", None) or {}
    input_size = cfg.get("input_size") or (3, DEFAULT_IMAGE_SIZE, DEFAULT_IMAGE_SIZE)
    channels = int(kwargs.get("in_chans", input_size[0]))
    size = opts.image_size or (int(input_size[1]), int(input_size[2]))
    inputs, desc = _image_inputs(opts, size, channels)
    return Loaded(model, inputs, loss_fn=classification_loss, description=f"{type(model).__name__}; {desc}")

"""``hf:MODEL_TYPE``, ``hf:path/to/config.json`` (or a folder holding one) and ``hf:org/name`` (the
local Hugging Face cache only): a transformers model built without weights from that
configuration, ``--set key=value`` overriding configuration fields (dotted for
sub-configurations).

The model class is the config's ``architectures`` entry when it names one, else the seq2seq LM
for encoder-decoder types (t5), the image-text-to-text class for configurations with a vision
tower, the masked LM for encoder types (bert), the causal LM for decoder types, the image
classifier for vision types (vit), the CTC head for speech encoders, else the base model.
"""

from __future__ import annotations

import copy
import inspect
import json
import os
from typing import Any

import torch

from ..build import empty_weights
from ..errors import UserError
from .hf_fixups import cache_off_without_attention, composite_parts, derived_fields, undeclared_field, unset_fields
from .hf_inputs import inputs_for
from .signature import required
from .options import Loaded, SpecOptions, close_matches, first_line, short_message


# -- hf: --------------------------------------------------------------------------------------


def import_transformers():
    from ..compat import import_torchvision

    try:  # transformers imports torchvision when it is installed: PyPI's beside a CPU torch needs help
        import_torchvision()
    except Exception:  # noqa: BLE001 - broken otherwise: transformers says so, or manages without it
        pass
    try:
        import transformers
    except ImportError as exc:
        raise UserError("hf: specs need transformers: pip install 'estimator[hf]'") from exc
    except Exception as exc:
        raise UserError(f"importing transformers failed: {type(exc).__name__}: {first_line(exc)}") from exc
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
        added = key.startswith("+")  # (+field=value: a field the configuration class does not declare)
        key = key[1:] if added else key
        head, dot, tail = key.partition(".")
        if dot:  # a sub-configuration's field, at any depth (encoder.text_config.num_hidden_layers)
            *path, field = key.split(".")
            parent, where = cfg, cname
            for part in path:
                sub = getattr(parent, part, None)
                if sub is None or not hasattr(sub, "to_dict"):
                    subs = [n for n in _hf_config_fields(parent) if hasattr(getattr(parent, n, None), "to_dict")]
                    raise UserError(f"{where} has no sub-configuration {part!r} (--set {key}=...)"
                                    f"{close_matches(part, subs)}")
                parent, where = sub, f"{where}.{part}"
            sub_fields = _hf_config_fields(parent)
            if field not in sub_fields and not added:
                raise UserError(f"{type(parent).__name__} ({where}) has no field {field!r} (--set {key}=...)"
                                f"{close_matches(field, sub_fields)}; --set +{key}=... adds a field the "
                                f"configuration class does not declare")
            nested.setdefault(head, {})[tail] = value
        elif key not in fields and not added:
            raise UserError(f"{cname} has no field {key!r} (--set {key}=...){close_matches(key, fields)}; "
                            f"--set +{key}=... adds a field the configuration class does not declare")
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
            raise UserError(f"cannot read {path}: {type(exc).__name__}: {first_line(exc)}") from exc
        if not isinstance(data, dict) or "model_type" not in data:
            raise UserError(f"{path} has no \"model_type\": it is not a transformers config.json")
        model_type = data["model_type"]
        config_class = _config_class(transformers, model_type, f"{path}: model_type")
        base = config_class.from_dict(dict(data))
        top, nested, special = _split_overrides(base, overrides)
        merged = dict(data)
        merged.update({**per_layer_lists(data, top), **top})
        for head, sub in nested.items():
            merged[head] = _merge_sub(data.get(head) or getattr(base, head).to_dict(), sub)
        try:
            cfg = config_class.from_dict(merged)
        except Exception as exc:
            raise UserError(f"{config_class.__name__}: {short_message(exc)}") from exc
        return cfg, special
    if "/" in target:  # a hub id: only a copy already in the local cache, never the network
        try:
            base = AutoConfig.from_pretrained(target, local_files_only=True)
        except Exception as exc:
            raise UserError(f"hf:{target} is neither a local file nor in the Hugging Face cache (no downloads): "
                            f"save its config.json and pass hf:path/to/config.json") from exc
        top, nested, special = _split_overrides(base, overrides)
        top = {**per_layer_lists(base.to_dict(), top), **top}
        try:
            cfg = AutoConfig.from_pretrained(target, local_files_only=True, **top)
        except Exception as exc:
            raise UserError(f"{type(base).__name__}: {short_message(exc)}") from exc
        _apply_nested(cfg, nested)
        return cfg, special
    model_type = _model_type(transformers, target)
    config_class = _config_class(transformers, model_type, "hf")
    parts = composite_parts(model_type)
    try:
        base = config_class(**copy.deepcopy(parts[0])) if parts else config_class()  # (it pops their model_type)
    except Exception as exc:
        raise UserError(f"hf:{target}: {config_class.__name__}() has no default: {short_message(exc)}; "
                        f"pass hf:path/to/config.json") from exc
    top, nested, special = _split_overrides(base, overrides)
    kwargs = {**(parts[0] if parts else {}), **per_layer_lists(base.to_dict(), top), **top}
    if parts:
        special["note"] = parts[1]
    for head, sub in nested.items():
        kwargs[head] = _merge_sub(getattr(base, head).to_dict(), sub)
    try:
        cfg = AutoConfig.for_model(model_type, **kwargs)
    except Exception as exc:
        raise UserError(f"{config_class.__name__}: {short_message(exc)}") from exc
    return cfg, special


# Fields a configuration derives from another when it is built: a sub-configuration given as a dict
# keeps them, so they are dropped when the field they derive from is overridden.
DERIVED_FIELDS = {"num_hidden_layers": ("layer_types",)}


def _merge_sub(base: dict[str, Any], sub: dict[str, Any]) -> dict[str, Any]:
    """A sub-configuration's dict with ``--set`` values over it (derived fields re-derived)."""
    merged = dict(base)
    deeper: dict[str, dict[str, Any]] = {}
    for key in [k for k in sub if "." in k]:  # a field of a sub-configuration of this one
        head, _, tail = key.partition(".")
        deeper.setdefault(head, {})[tail] = sub[key]
    sub = {k: v for k, v in sub.items() if "." not in k}
    for key in sub:
        for derived in DERIVED_FIELDS.get(key, ()):
            if derived not in sub:
                merged.pop(derived, None)
    merged.update({**per_layer_lists(base, sub), **sub})
    for head, fields in deeper.items():
        inner = merged.get(head)
        merged[head] = _merge_sub(inner.to_dict() if hasattr(inner, "to_dict") else dict(inner or {}), fields)
    return merged


LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
# Fields that list layers by index (0-based): SAM's (and DeepSeek-VL's high-resolution tower's) global-attention
# layers, Qwen2.5-VL's full-attention blocks
LAYER_INDEX_FIELDS = ("global_attn_indexes", "fullatt_block_indexes")


def per_layer_lists(base: dict[str, Any], sets: dict[str, Any]) -> dict[str, Any]:
    """The per-layer lists of a configuration ``base`` (one entry per layer: Zamba2's and Llama 4's
    ``layer_types``, Gemma 3n's ``intermediate_size`` and ``activation_sparsity_pattern``) resized to a layer
    count that ``sets`` gives (``--set num_hidden_layers=2``, :func:`_resized`).  Lists ``sets`` gives itself are left alone; a list is per-layer when its length is the
    configuration's layer count (four or more, so that a short tuple is not taken for one)."""
    out: dict[str, Any] = {}
    for key in LAYER_COUNTS:
        old, new = base.get(key), sets.get(key)
        if not (isinstance(old, int) and isinstance(new, int) and old >= 4 and new >= 1 and new != old):
            continue
        for name, value in base.items():
            if name not in sets and isinstance(value, (list, tuple)) and len(value) == old:
                out[name] = type(value)(_resized(list(value), new))
        out.update(_backbone_outputs(base, sets, old, new))
        for name in LAYER_INDEX_FIELDS:
            value = base.get(name)
            if name not in sets and isinstance(value, (list, tuple)) and value \
                    and all(isinstance(i, int) and 0 <= i < old for i in value):
                moved = list(dict.fromkeys(i * new // old for i in value))  # (layer k of old at k x new / old)
                out[name] = type(value)(moved)
        table = base.get("per_layer_config")
        if isinstance(table, dict) and table and all(str(k).isdigit() for k in table) \
                and "per_layer_config" not in sets:
            kinds = base.get("layer_types")
            kept = _kept_layers(list(kinds) if isinstance(kinds, (list, tuple)) and len(kinds) == old
                                else list(range(old)), new)
            out["per_layer_config"] = _per_layer_dict({str(k): v for k, v in table.items()}, kept)
        shared = base.get("num_kv_shared_layers")
        if isinstance(shared, int) and shared > 0 and "num_kv_shared_layers" not in sets:
            kinds = out.get("layer_types", sets.get("layer_types")) or [None] * new
            out["num_kv_shared_layers"] = _kv_shared_count(shared * new // old, list(kinds))
    return out


def _backbone_outputs(base: dict[str, Any], sets: dict[str, Any], old: int, new: int) -> dict[str, Any]:
    """A backbone's output stages (``out_features`` ``stage6 ... stage24`` of DPT's ViT, ``out_indices``) at the same
    depths of a stack of ``new`` layers (stage ``k`` -> ``ceil(k x new / old)``), where they stay distinct."""
    indices = base.get("out_indices")
    if "out_features" in sets or "out_indices" in sets or not isinstance(indices, (list, tuple)) or not indices:
        return {}
    if not all(isinstance(i, int) and 0 < i <= old for i in indices):
        return {}  # (negative or stem indices: left as they are)
    moved = [-(-i * new // old) for i in indices]
    if len(set(moved)) != len(moved):
        return {}  # (fewer layers than outputs: the configuration's own error says so)
    return {"out_indices": moved, "out_features": [f"stage{i}" for i in moved]}


def _kv_shared_count(shared: int, kinds: list[Any]) -> int:
    """Gemma 3n's (and Gemma 4's) ``num_kv_shared_layers`` for a shrunk stack of layers of ``kinds``: the last
    layers reuse the keys and values of the last earlier layer of their kind, so at most the stack's share of
    the default count (15 of 35 layers) and no more than leaves an earlier layer of each shared kind."""
    shared = min(shared, len(kinds) - 1)
    while shared > 0 and not set(kinds[len(kinds) - shared:]) <= set(kinds[:len(kinds) - shared]):
        shared -= 1
    return max(shared, 0)


def _resized(items: list[Any], new: int) -> list[Any]:
    """``new`` entries of a per-layer list: fewer keep the first layer of each kind (a hybrid stack keeps its
    attention layers) and spread the rest over the stack, in order; more repeat the pattern."""
    return [items[i] for i in _kept_layers(items, new)]


def _per_layer_dict(table: dict[str, Any], kept: list[int]) -> dict[str, Any]:
    """Gemma 4's ``per_layer_config`` (``{"05": {"head_dim": 512}, ...}``, keyed by layer index) for the stack of
    the layers ``kept`` (old indices, in their new order)."""
    width = max(len(k) for k in table)
    return {f"{new:0{width}d}": table[f"{old:0{width}d}"] for new, old in enumerate(kept)
            if f"{old:0{width}d}" in table}


def _kept_layers(items: list[Any], new: int) -> list[int]:
    """The old layers (indices into ``items``, one entry per layer) that a stack of ``new`` layers keeps."""
    old = len(items)
    if new >= old:
        return [i % old for i in range(new)]
    chosen: list[int] = []
    for i, item in enumerate(items):  # the first layer of each kind, as far as they go
        if len(chosen) < new and all(items[j] != item for j in chosen):
            chosen.append(i)
    spread = [round(k * (old - 1) / max(new - 1, 1)) for k in range(new)]
    for i in spread:
        if len(chosen) < new and i not in chosen:
            chosen.append(i)
    for i in range(old):  # (spread indices that collided)
        if len(chosen) < new and i not in chosen:
            chosen.append(i)
    return sorted(chosen)


def _apply_nested(cfg: Any, nested: dict[str, dict[str, Any]]) -> None:
    for head, sub in nested.items():
        for k, v in sub.items():
            *path, field = [head, *k.split(".")]
            target = cfg
            for part in path:
                target = getattr(target, part)
            setattr(target, field, v)


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
        raise UserError(f"{where} {model_type!r}: {type(exc).__name__}: {first_line(exc)}") from exc


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
        entry = mapping.get(mt)
        if isinstance(entry, (tuple, list)) and getattr(transformers, entry[0], None) is not None:
            # several classes for one type (DeiT, LeViT: the head and the head "WithTeacher"): the Auto class
            # picks by ``architectures``, which a configuration made from its defaults lacks; the first
            return getattr(transformers, entry[0]), entry[0]
        if entry is not None and hasattr(transformers, auto_name):
            return getattr(transformers, auto_name), auto_name
    cls = _class_for_config(transformers, cfg)
    if cls is not None:
        return cls, "class"
    raise UserError(f"hf:{mt}: transformers has no model class for this configuration type")


def _class_for_config(transformers, cfg: Any) -> Any:
    """A class for a configuration no Auto class takes (sub-models such as ``clap_text_model`` or
    ``blip_vision_model``, task-only types such as depth estimation): the other task mappings of
    ``modeling_auto`` (in alphabetical order: the first that names the type), then the model classes of the
    modeling modules of the configuration's package whose ``config_class`` is the configuration's class, or
    whose constructor declares it
    (``ClapTextConfig`` -> ``ClapTextModel`` first, then a ``...Model``, then any)."""
    import inspect

    from transformers.models.auto import modeling_auto as ma

    mt = cfg.model_type
    for name in sorted(n for n in dir(ma) if n.startswith("MODEL_FOR_") and n.endswith("_MAPPING_NAMES")):
        entry = getattr(ma, name).get(mt) if isinstance(getattr(ma, name), dict) else None
        for cls_name in (entry,) if isinstance(entry, str) else (entry or ()):
            cls = getattr(transformers, cls_name, None)
            if cls is not None:
                return cls
    base = getattr(transformers, "PreTrainedModel")
    found = [c for module in _modeling_modules(cfg) for c in vars(module).values()
             if inspect.isclass(c) and issubclass(c, base) and c.__module__ == module.__name__
             and (getattr(c, "config_class", None) is type(cfg) or _takes_config(c, type(cfg)))]
    preferred = type(cfg).__name__.removesuffix("Config") + "Model"
    found.sort(key=lambda c: (c.__name__ != preferred, not c.__name__.endswith("Model"), c.__name__))
    return found[0] if found else None


def _modeling_modules(cfg: Any) -> list[Any]:
    """The modeling modules of a configuration's package: ``modeling_<name>`` first, then the others
    (``blip_text_model``'s ``BlipTextModel`` lives in ``modeling_blip_text``); those whose extra dependencies are
    missing are left out."""
    import importlib
    import pkgutil

    own = type(cfg).__module__.replace(".configuration_", ".modeling_")
    package = own.rsplit(".", 1)[0]
    try:
        names = sorted(m.name for m in pkgutil.iter_modules(importlib.import_module(package).__path__)
                       if m.name.startswith("modeling_"))
    except Exception:  # noqa: BLE001 - a package that cannot be imported
        return []
    modules = []
    for name in sorted(names, key=lambda n: f"{package}.{n}" != own):
        try:
            modules.append(importlib.import_module(f"{package}.{name}"))
        except Exception:  # noqa: BLE001 - a module whose extra dependencies are missing
            continue
    return modules


def _takes_config(cls: Any, config_class: type) -> bool:
    """Whether ``cls.__init__`` declares ``config: <config_class>``: a sub-model that inherits its family's
    ``config_class`` but is built from its own configuration (Aimv2TextModel from Aimv2TextConfig)."""
    import inspect

    try:
        param = inspect.signature(cls.__init__).parameters.get("config")
    except (TypeError, ValueError):  # pragma: no cover
        return False
    annotation = getattr(param, "annotation", None)
    return (annotation if isinstance(annotation, str) else getattr(annotation, "__name__", None)) == config_class.__name__


def _set_image_size(cfg: Any, size: int) -> None:
    """``--image-size``: the configuration's image size (a vision-language model's vision tower's)."""
    vision = getattr(cfg, "vision_config", None)
    if hasattr(cfg, "image_size"):
        cfg.image_size = size
    elif vision is not None and hasattr(vision, "image_size"):
        vision.image_size = size
    elif vision is None and not isinstance(getattr(cfg, "patch_size", None), int):
        raise UserError(f"--image-size: {type(cfg).__name__} has no image_size (a token model: use --seq)")
    # else: a vision tower that takes any size (Qwen2-VL's, or the tower alone, cut into patch_size patches):
    # the inputs follow --image-size


def load_hf(target: str, opts: SpecOptions) -> Loaded:
    transformers = import_transformers()
    cfg, special = _hf_config(transformers, target, opts.overrides)
    if opts.image_size is not None:
        _set_image_size(cfg, opts.image_size)
    cls, how = _hf_model_class(transformers, cfg)
    kwargs: dict[str, Any] = {}
    major = int(transformers.__version__.split(".")[0])
    kwargs["dtype" if major >= 5 else "torch_dtype"] = torch.float32  # --precision decides casts
    if "attn_implementation" in special:
        kwargs["attn_implementation"] = special["attn_implementation"]
    head = special.pop("note", "") + cache_off_without_attention(cfg) + _media_tokens_in_vocabulary(cfg)
    try:
        model = _build(cls, how, cfg, kwargs)
    except UserError:
        raise
    except Exception as exc:
        model, filled = None, derived_fields(cfg)  # fields the configuration leaves unset, derived as others do
        if filled:
            try:
                model, head = _build(cls, how, cfg, kwargs), head + filled
            except UserError:
                raise
            except Exception:  # noqa: BLE001 - the first failure is the one to report
                pass
        if model is None:
            model, more = _base_instead(transformers, cfg, cls, how, kwargs, exc)
            head += more
    if type(model).forward is torch.nn.Module.forward:
        raise UserError(_no_forward(transformers, model, cfg))
    if "inference_session" in required(model):  # SAM 3 / EdgeTAM video trackers
        raise UserError(f"hf:{cfg.model_type}: {type(model).__name__}.forward runs only inside an inference session "
                        f"(a video tracker's state, which its processor builds frame by frame), so there is no "
                        f"training step to trace: estimate its image model or write a SPEC file")
    head += _query_token_placeholder(cfg) + _default_language(model, cfg)
    inputs, desc = inputs_for(model, cfg, opts)
    return Loaded(model, inputs, name=f"hf:{target}", description=f"{type(model).__name__}{head}; {desc}",
                  config=cfg)


def _base_instead(transformers, cfg: Any, cls: Any, how: str, kwargs: dict[str, Any],
                  exc: Exception) -> tuple[torch.nn.Module, str]:
    """The base model when the task head ``cls`` cannot be built from the configuration (a CTC head needs the
    ``vocab_size`` a default configuration lacks), with the description's note; else the head's failure, as a
    one-line error."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    failed = UserError(f"building {getattr(cls, '__name__', cls)} from {type(cfg).__name__} failed: "
                       f"{type(exc).__name__}: {first_line(exc)}{unset_fields(cfg, exc)}{undeclared_field(cfg, exc)}")
    base = getattr(transformers, "AutoModel", None)
    if not how.startswith("AutoModelFor") or base is None or cfg.model_type not in MODEL_MAPPING_NAMES:
        raise failed from exc
    try:
        model = _build(base, "AutoModel", cfg, kwargs)
    except Exception:  # noqa: BLE001 - the head's failure is the one to report
        raise failed from exc
    why = first_line(exc).split(". ")[0]
    return model, f" (the base model: {how} cannot be built from this configuration: {why})"


def _default_language(model: torch.nn.Module, cfg: Any) -> str:
    """X-MOD's language adapters need a language (``set_default_language``, else its forward raises "Input language
    unknown"): the configuration's first, as its documentation's examples set it; the note, or ''."""
    languages = getattr(cfg, "languages", None)
    setter = getattr(model, "set_default_language", None)
    if setter is None or getattr(cfg, "default_language", None) is not None or not languages:
        return ""
    setter(languages[0])
    return f" (language {languages[0]}: the first of its adapters)"


def _media_tokens_in_vocabulary(cfg: Any) -> str:
    """LLaVA's default configuration (as llava-1.5's) puts its image token at id 32,000 of a 32,000-token text
    vocabulary: the checkpoints grow the embedding to hold it (32,064 rows), a model built from the defaults
    looks the id up past its table and fails.  The text vocabulary is grown to the largest media token id + 1 as
    the checkpoints do (what the ids are does not change the step's cost).  Returns the note, or ''."""
    text = getattr(cfg, "text_config", None) or cfg
    vocab = getattr(text, "vocab_size", None)
    ids = [v for k in ("image_token_index", "image_token_id", "video_token_index", "video_token_id")
           if isinstance(v := getattr(cfg, k, None), int) and not isinstance(v, bool)]
    if not isinstance(vocab, int) or not ids or max(ids) < vocab:
        return ""
    text.vocab_size = max(ids) + 1
    return f" (text vocabulary {vocab:,} -> {max(ids) + 1:,} to hold the media token id {max(ids):,}, as checkpoints do)"


def _query_token_placeholder(cfg: Any) -> str:
    """BLIP-2 and InstructBLIP put their ``num_query_tokens`` query outputs where ``input_ids`` holds the image
    token, whose id the checkpoints add to the language model's vocabulary (``image_token_index``: 50265 in
    OPT's 50,272 for Salesforce/blip2-opt-2.7b).  A configuration made from the defaults has none, and the
    forward then fails; the last id of the text vocabulary stands for it (what it is does not change the step's
    cost).  Returns the note for the description, or ''."""
    keys = [k for k in ("image_token_index", "image_token_id", "video_token_index", "video_token_id") if k in vars(cfg)]
    key = keys[0] if keys else "image_token_id"  # (InstructBLIP-Video: its video token)
    vocab = getattr(getattr(cfg, "text_config", None), "vocab_size", None)
    if getattr(cfg, key, 0) is not None or not isinstance(getattr(cfg, "num_query_tokens", None), int) or \
            not isinstance(vocab, int):
        return ""
    setattr(cfg, key, vocab - 1)
    return f" (the {key.split('_')[0]} token: id {vocab - 1}, the configuration has none)"


def _no_forward(transformers, model: torch.nn.Module, cfg: Any) -> str:
    """The one-line refusal for a model class with no forward of its own (Bark, Qwen2.5-Omni: pipelines that
    transformers runs only through ``generate()`` or their parts' own methods), naming the parts to estimate."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    parts = [f"hf:{v.model_type}" for v in vars(cfg).values()
             if isinstance(v, transformers.PretrainedConfig) and v.model_type in CONFIG_MAPPING_NAMES]
    way = (f"estimate one of its parts ({', '.join(parts)}), or write a SPEC file that builds one" if parts else
           "write a SPEC file, path/to/file.py:build whose build() returns (one of its parts, inputs)")
    return (f"hf:{cfg.model_type}: {type(model).__name__} has no forward of its own (transformers runs it only "
            f"through generate() or its parts' methods), so there is no training step to trace: {way}")


def _build(cls: Any, how: str, cfg: Any, kwargs: dict[str, Any]) -> torch.nn.Module:
    """``cls`` built from ``cfg`` with meta weights: an Auto class by ``from_config``, a model class (or the
    configuration's architectures) by ``_from_config``."""
    build = cls.from_config if how.startswith("Auto") else cls._from_config
    with empty_weights():
        return build(cfg, **kwargs)

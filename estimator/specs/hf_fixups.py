"""Configurations transformers cannot build or train from as they stand, completed the way its own
configurations complete them, each completion said in the model's description.

* :func:`derived_fields`: ``head_dim`` and ``num_key_value_heads`` left ``None`` by a configuration class
  whose model reads them (HunYuan, Ministral, Nemotron in transformers 5.17: ``self.head_dim**-0.5`` on
  ``None``).  Every other decoder configuration derives them so (``LlamaConfig``: ``head_dim = hidden_size //
  num_attention_heads``; ``num_key_value_heads = num_attention_heads`` when not given: multi-head attention).
  Applied only when the build fails, so a configuration that builds is never changed.
* :func:`cache_off_without_attention`: a hybrid model (Bamba, Jamba, GraniteMoeHybrid: attention heads in its
  configuration) whose layer types hold no attention layer (their default configurations, or a shrunk one)
  builds a hybrid KV cache whose ``get_seq_length`` raises without one, in the real step as in the traced one; with
  ``use_cache=False`` (what training scripts set, and what transformers sets under gradient checkpointing) the
  step runs.  A cache is an inference structure: the training step holds no more without it (its keys and
  values are the tensors attention saves for backward).
"""

from __future__ import annotations

from typing import Any

# layer kinds of a hybrid model's ``layer_types`` / ``layers_block_type`` that hold no attention (every other
# kind is, or may be, an attention layer: "full_attention", "compressed_sparse_attention", "hybrid", ...)
NON_ATTENTION_KINDS = frozenset({"linear_attention", "mamba", "mamba2", "recurrent", "conv", "ssm", "moe", "mlp"})


def derived_fields(cfg: Any) -> str:
    """Fill ``head_dim`` / ``num_key_value_heads`` where they are ``None`` and the fields they derive from are
    integers; returns the description's note ('' when nothing was filled)."""
    notes = []
    for config in (cfg, *_sub_configs(cfg)):
        own = vars(config)  # (not getattr: a per-layer field of Diffusion Gemma raises on global access)
        heads, hidden = own.get("num_attention_heads"), own.get("hidden_size")
        if not isinstance(heads, int) or heads <= 0:
            continue
        if "head_dim" in own and own["head_dim"] is None and isinstance(hidden, int):
            config.head_dim = hidden // heads
            notes.append(f"head_dim {config.head_dim} (hidden_size / num_attention_heads)")
        if "num_key_value_heads" in own and own["num_key_value_heads"] is None:
            config.num_key_value_heads = heads
            notes.append(f"num_key_value_heads {heads} (num_attention_heads: multi-head attention)")
    return f" ({'; '.join(notes)}: the configuration leaves them unset)" if notes else ""


def cache_off_without_attention(cfg: Any) -> str:
    """``use_cache=False`` for a hybrid configuration whose layers hold no attention layer; the note, or ''."""
    kinds = _layer_kinds(cfg)
    if not kinds or vars(cfg).get("use_cache") is not True:
        return ""
    if not set(kinds) <= NON_ATTENTION_KINDS or not isinstance(vars(cfg).get("num_attention_heads"), int):
        return ""  # an attention layer, or a model with none to place (Mamba: its own cache, which works)
    cfg.use_cache = False
    return (f" (use_cache=False: its {len(kinds)} layers hold no attention layer, and transformers' hybrid "
            f"cache needs one)")


def _layer_kinds(cfg: Any) -> list[Any] | None:
    for name in ("layers_block_type", "layer_types"):
        try:
            kinds = getattr(cfg, name, None)
        except Exception:  # noqa: BLE001 - a derived property that cannot be computed on this configuration
            continue
        if isinstance(kinds, (list, tuple)) and kinds and all(isinstance(k, str) for k in kinds):
            return list(kinds)
    return None


def _sub_configs(cfg: Any) -> list[Any]:
    from transformers import PretrainedConfig

    return [v for v in vars(cfg).values() if isinstance(v, PretrainedConfig)]


# Composite configurations with no default of their own (``EncoderDecoderConfig()`` raises: "not both
# ``encoder`` and ``decoder`` sub-configurations are passed"): the parts the transformers documentation pairs
# in its examples of each (bert2bert; ViT + GPT-2; wav2vec2 + BERT; the dual encoder's ViT + BERT), each at
# its defaults, so ``--set encoder.num_hidden_layers=...`` shrinks them as any sub-configuration.
COMPOSITE_PARTS = {
    "encoder-decoder": {"encoder": "bert", "decoder": "bert"},
    "vision-encoder-decoder": {"encoder": "vit", "decoder": "gpt2"},
    "speech-encoder-decoder": {"encoder": "wav2vec2", "decoder": "bert"},
    "vision-text-dual-encoder": {"vision_config": "vit", "text_config": "bert"},
}


def composite_parts(model_type: str) -> tuple[dict[str, dict[str, Any]], str] | None:
    """The sub-configurations' dicts of a composite type with no default (a decoder beside an encoder gets
    cross-attention, as ``from_encoder_decoder_configs`` gives it), and the description's note; None for
    another type."""
    from transformers import AutoConfig

    parts = COMPOSITE_PARTS.get(model_type)
    if parts is None:
        return None
    subs = {key: AutoConfig.for_model(part).to_dict() for key, part in parts.items()}
    if "encoder" in subs and "decoder" in subs:
        subs["decoder"].update(is_decoder=True, add_cross_attention=True)
    named = ", ".join(f"{key} {part}" for key, part in parts.items())
    return subs, f" (its parts: {named} at their defaults; pass hf:path/to/config.json for others)"


# Fields a configuration may leave None on purpose (token ids, bookkeeping): never named as the cause
BENIGN_NONE = frozenset({
    "transformers_version", "architectures", "dtype", "torch_dtype", "problem_type", "pad_token_id", "bos_token_id",
    "eos_token_id", "sep_token_id", "decoder_start_token_id", "mask_token_id", "tokenizer_class", "prefix",
    "finetuning_task", "id2label", "label2id", "task_specific_params", "cross_attention_hidden_size",
    "_commit_hash", "_name_or_path", "output_gate_type"})


def unset_fields(cfg: Any, exc: BaseException) -> str:
    """For a build that failed on a ``None`` (``'NoneType' object is not subscriptable``, ``int * NoneType``) or
    that names a field left ``None`` (Autoformer: "The `prediction_length` config needs to be specified"), the
    configuration's unset fields (those it names, else all) and the way to set them, as a clause for the one-line
    error; '' when the failure is another or no field is unset."""
    unset = [k for k, v in cfg.to_dict().items() if v is None and k not in BENIGN_NONE and not k.startswith("_")]
    named = [k for k in unset if k in str(exc)]  # "The `prediction_length` config needs to be specified"
    if named:
        unset = named
    elif "NoneType" not in str(exc):
        return ""
    if not unset:
        return ""
    shown = ", ".join(unset[:6]) + (f" and {len(unset) - 6} more" if len(unset) > 6 else "")
    return f"; {type(cfg).__name__} leaves {shown} unset: give them with --set {unset[0]}=... or a config.json"


def undeclared_field(cfg: Any, exc: BaseException) -> str:
    """For a build that failed reading a field its configuration class does not declare (``'T5Gemma2TextConfig'
    object has no attribute 'dropout_rate'``: the model reads it, the class never sets it), the way to give it,
    as a clause for the one-line error; '' for another failure."""
    import re

    found = re.search(r"'(\w+Config)' object has no attribute '(\w+)'", str(exc))
    if not isinstance(exc, AttributeError) or found is None:
        return ""
    owner, field = found.groups()
    paths = _paths_to(cfg, owner, "", 3)
    if not paths:
        return ""
    return (f"; the model reads {field}, which {owner} does not declare: give it with --set +{paths[0]}{field}=... "
            f"(a config.json that has it works too)")


def _paths_to(cfg: Any, owner: str, prefix: str, depth: int) -> list[str]:
    """``--set`` prefixes of the (sub-)configurations of class ``owner``: '' for ``cfg`` itself, ``talker_config.
    text_config.`` for one two levels down (Qwen3-Omni-MoE's talker)."""
    found = [prefix] if type(cfg).__name__ == owner else []
    for k, v in vars(cfg).items() if depth > 0 else ():
        if hasattr(v, "to_dict") and not k.startswith("_"):
            found += _paths_to(v, owner, f"{prefix}{k}.", depth - 1)
    return found

"""An audio-language model's training batch (AudioFlamingo 3, Qwen2-Audio, GLM-ASR, Granite Speech ...): a clip
per sample, its audio tokens at the start of ``input_ids``, text after them, labels on the text, as the models'
processors lay them out (one ``audio_token_id`` per audio embedding the tower and projector make).

How many tokens a clip becomes comes from the model itself: its ``get_audio_features`` (the model's or its base
model's) traced by the estimator's capture on fake tensors, as image tokens are counted
(:mod:`.hf_image_tokens`); the real step checks that the counts match ("Audio features and audio tokens do not
match"), so a batch without them (text alone beside the clips) is no batch the model trains on.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

from .hf_image_tokens import features_count, image_text_ids


def audio_token_id(cfg: Any) -> int | None:
    """The token id that stands for one audio embedding in ``input_ids``, or None for another model."""
    for key in ("audio_token_id", "audio_token_index"):
        value = getattr(cfg, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def audio_features_of(model: torch.nn.Module) -> Any:
    return getattr(model, "get_audio_features", None) or getattr(getattr(model, "model", None), "get_audio_features",
                                                                  None)


def audio_tokens(model: torch.nn.Module, clip: dict[str, torch.Tensor]) -> int:
    """How many audio embeddings (tokens) one clip becomes: ``get_audio_features`` traced on fake tensors with
    the clip's inputs it takes (features and their mask)."""
    get = audio_features_of(model)
    params = inspect.signature(get).parameters
    return features_count(model, get, {k: v for k, v in clip.items() if k in params}, {})


def _frames(features: torch.Tensor, cfg: Any) -> int:
    """Frames of log-mel ``features`` (batch x mels x frames, or batch x frames x mels)."""
    mels = getattr(getattr(cfg, "audio_config", None), "num_mel_bins", None)
    return int(features.shape[1] if features.ndim == 3 and features.shape[-1] == mels else features.shape[-1])


def audio_text_inputs(model: torch.nn.Module, cfg: Any, clips: dict[str, torch.Tensor], shown: str, batch: int,
                      seq_for: Callable[[int, str], int]) -> tuple[dict, str] | None:
    """The batch of an audio-language model (``clips``: the features and masks its forward takes, ``shown``
    their description, ``seq_for(n, what)`` the sequence for ``n`` leading tokens), or None where the model has
    no audio token, no ``get_audio_features``, or one that does not trace on a clip and its masks."""
    token, get = audio_token_id(cfg), audio_features_of(model)
    features = clips.get("input_features")
    if token is None or get is None or not isinstance(features, torch.Tensor):
        return None
    clips = dict(clips)
    for name, p in inspect.signature(get).parameters.items():  # masks it requires (GLM-ASR's): every frame valid
        if name.endswith("mask") and p.default is inspect.Parameter.empty and name not in clips:
            clips[name] = torch.ones(batch, _frames(features, cfg), dtype=torch.int64)
    try:
        n_tokens = audio_tokens(model, {k: v[:1] for k, v in clips.items()})
    except Exception:  # noqa: BLE001 - features it takes otherwise (Music Flamingo's need the token ids)
        return None
    seq = seq_for(n_tokens, "audio tokens")
    ids, labels = image_text_ids(batch, seq, n_tokens, token)
    inputs = {"input_ids": ids, **clips, "labels": labels}
    return inputs, f"input_ids {batch}x{seq} ({n_tokens} audio tokens each), {shown}, labels"

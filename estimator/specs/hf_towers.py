"""The batch of a ``hf:`` model whose forward takes neither token ids nor whole images: the vision tower
of a Qwen2-VL-style model (image patches and their ``grid_thw``) and audio encoders (log-mel features,
or raw audio for a model with no loss of its own: codecs, audio classifiers' encoders).

The layout of such a tensor is not in the configuration: Qwen2-VL's tower takes its patches flattened
to ``C*T*P*P`` values, Kimi-VL's as ``C x P x P`` images; Parakeet takes features as frames x mels,
CLAP as 1 x frames x mels.  The loader builds the layouts the configuration allows and keeps the
first one the model's forward runs on (a forward on fake tensors, the estimator's own capture:
nothing is allocated, a full-size model included); the description says which.  None running is a
one-line error that names what was tried and the SPEC-file way out.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import UserError
from .options import SpecOptions, default_seq, first_line
from .signature import required, takes

TOWER_IMAGE_SIZE = 448  # pixels per side when --image-size is not given: Qwen2-VL's 256 image tokens
AUDIO_FRAMES = 1000  # log-mel frames when --seq is not given: 10 s at the usual 10 ms hop
AUDIO_SECONDS = 1  # raw audio for a model with no loss of its own (codecs train on 0.4-1 s segments)
MEL_KEYS = ("num_mel_bins", "n_mels", "feature_size", "input_feat_size", "num_mel_filters", "mel_bins")


def takes_grid(model: torch.nn.Module, cfg: Any) -> bool:
    """A vision tower fed patches and ``grid_thw`` (Qwen2-VL, GLM-4V, Kimi-VL, PaddleOCR-VL ...)."""
    return takes(model, "grid_thw") and isinstance(getattr(cfg, "patch_size", None), int)


def grid_inputs(model: torch.nn.Module, cfg: Any, opts: SpecOptions) -> tuple[dict, str]:
    """``--batch`` images of ``--image-size`` (default ``TOWER_IMAGE_SIZE``) cut into patches of
    ``patch_size``, one ``[1, side, side]`` grid row per image: real CPU tensors (the tower reads the
    grid to place its rotary positions and windows), in the first of :func:`grid_layouts` the tower runs on."""
    return first_that_runs(model, grid_layouts(model, cfg, opts), "image patches and grid_thw")


def grid_layouts(model: torch.nn.Module, cfg: Any, opts: SpecOptions) -> list[tuple[dict, str]]:
    """The patch layouts a tower fed ``grid_thw`` may take (flattened, the patch embedding's width, C x T x
    P x P, C x P x P, one packed sequence), each as ``(inputs, description)``; see :func:`grid_inputs`."""
    name = type(model).__name__
    if opts.seq is not None:
        raise UserError(f"--seq: {name} takes image patches; use --image-size")
    batch = opts.batch or 1
    patch = int(cfg.patch_size)
    temporal = int(getattr(cfg, "temporal_patch_size", None) or 1)
    merge = int(getattr(cfg, "spatial_merge_size", None) or getattr(cfg, "merge_size", None) or 1)
    channels = int(getattr(cfg, "in_channels", None) or getattr(cfg, "num_channels", None) or 3)
    size = opts.image_size or TOWER_IMAGE_SIZE
    side = patches_per_side(name, size, patch, merge)
    n = batch * side * side  # patches of all images, one row each
    first = required(model)[0]
    flat = channels * temporal * patch * patch
    layouts = [((n, flat), f"{n}x{flat} (flattened)")]
    width = _patch_embedding_width(model)
    if width not in (None, flat):  # a temporal patch the configuration names otherwise (MuseGlimmer's patch_temporal)
        layouts.append(((n, width), f"{n}x{width} (the patch embedding's input width)"))
    if temporal > 1:
        layouts.append(((n, channels, temporal, patch, patch), f"{n}x{channels}x{temporal}x{patch}x{patch}"))
    layouts.append(((n, channels, patch, patch), f"{n}x{channels}x{patch}x{patch}"))
    layouts.append(((1, n, channels, patch, patch), f"1x{n}x{channels}x{patch}x{patch} (one packed sequence)"))
    candidates = []
    for shape, shown in layouts:
        inputs = {first: torch.zeros(shape), "grid_thw": torch.tensor([[1, side, side]] * batch)}
        if takes(model, "merge_sizes"):  # VideoLLaMA 3: each image's merge
            inputs["merge_sizes"] = torch.tensor([merge] * batch)
        candidates.append((inputs, f"{first} {shown}: {batch} image(s) {size}x{size} in patches of {patch}, grid_thw"))
    return candidates


def patches_per_side(name: str, size: int, patch: int, merge: int) -> int:
    """Patches along one side of a ``size`` x ``size`` image cut into ``patch`` x ``patch`` patches that the
    model merges ``merge`` x ``merge`` (Qwen2-VL-style towers): ``size`` must be a multiple of ``patch x
    merge`` (a one-line error naming the nearest size that is)."""
    if size % (patch * merge):
        raise UserError(f"--image-size {size}: {name} takes images in multiples of {patch * merge} pixels "
                        f"(patch {patch} x merge {merge}), e.g. --image-size {max(1, size // (patch * merge)) * patch * merge}")
    return size // patch


def _patch_embedding_width(model: torch.nn.Module) -> int | None:
    """The input width of the first Linear whose name says patch (a tower that embeds flattened patches)."""
    for name, mod in model.named_modules():
        if "patch" in name and isinstance(mod, torch.nn.Linear):
            return int(mod.in_features)
    return None


def takes_audio(model: torch.nn.Module, cfg: Any, main: str) -> bool:
    """An audio model the token, Whisper and CTC paths do not take: log-mel features (encoders, or a
    CTC head on features), or raw audio without labels."""
    first = (required(model) or [main])[0]
    if first in FEATURE_KEYS or main in FEATURE_KEYS:
        return not getattr(cfg, "is_encoder_decoder", False)
    return main == "input_values" and not takes(model, "labels")


def _configs(cfg: Any) -> list[Any]:
    """The configuration and its audio or encoder sub-configuration (a CTC model's ``encoder_config``)."""
    return [cfg] + [getattr(cfg, k) for k in ("encoder_config", "audio_config") if getattr(cfg, k, None) is not None]


def _first_int(cfg: Any, keys: tuple[str, ...]) -> int | None:
    for c in _configs(cfg):
        for key in keys:
            value = getattr(c, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


MASKS = ("attention_mask", "input_features_mask", "feature_attention_mask", "padding_mask")
FEATURE_KEYS = ("input_features", "audio_mel")  # log-mel features (Gemma 3n's audio encoder: audio_mel)
PADDING_MASKS = ("audio_mel_mask",)  # masks that mark the padded frames True (Gemma 3n), all False unpadded


def _masks(model: torch.nn.Module, batch: int, frames: int) -> dict[str, torch.Tensor]:
    """Every required ``*mask`` argument and the usual optional ones (``MASKS``): all frames valid, as a
    feature extractor returns them for unpadded audio."""
    names = [n for n in required(model) if n.endswith("mask")] + [n for n in MASKS if takes(model, n)]
    return {n: torch.zeros(batch, frames, dtype=torch.bool) if n in PADDING_MASKS else
            torch.ones(batch, frames, dtype=torch.int64) for n in dict.fromkeys(names)}


def _first_layer(model: torch.nn.Module) -> tuple[str, int] | None:
    """The first Linear or Conv1d of the model (in registration order) and its input width: the layout
    an audio encoder's features enter by, when the configuration names their width otherwise."""
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            return "linear", int(mod.in_features)
        if isinstance(mod, torch.nn.Conv1d):
            return "conv1d", int(mod.in_channels)
    return None


def _feature_layouts(model: torch.nn.Module, cfg: Any, batch: int, frames: int) -> list[tuple[tuple, str]]:
    mels = _first_int(cfg, MEL_KEYS) or 80
    shapes = [((batch, frames, mels), f"{batch}x{frames}x{mels} (frames x mels)"),
              ((batch, mels, frames), f"{batch}x{mels}x{frames} (mels x frames)"),
              ((batch, 1, frames, mels), f"{batch}x1x{frames}x{mels}")]
    first = _first_layer(model)
    if first is not None and first[1] != mels:  # stacked frames (Granite Speech) or another name for the width
        kind, width = first
        shapes.append(((batch, frames, width), f"{batch}x{frames}x{width} (the first {kind}'s width)") if kind == "linear"
                      else ((batch, width, frames), f"{batch}x{width}x{frames} (the first {kind}'s width)"))
    return shapes


def audio_inputs(model: torch.nn.Module, cfg: Any, opts: SpecOptions, main: str) -> tuple[dict, str]:
    """Log-mel features (``--seq`` frames, default twice the encoder's ``max_source_positions`` as for
    Whisper, else ``AUDIO_FRAMES``) or raw audio (``--seq`` samples, default ``AUDIO_SECONDS`` at the
    configuration's sampling rate), in the layouts of :func:`_feature_layouts` or mono/channels-first
    audio; masks all valid; a model with a CTC head gets labels a sixteenth as long as the frames, a
    model with no loss of its own is trained on the default loss (the report says which)."""
    name = type(model).__name__
    if opts.image_size is not None:
        raise UserError(f"--image-size: {name} takes audio; use --seq for the number of frames or samples")
    batch = opts.batch or 1
    first = (required(model) or [main])[0]
    if first in FEATURE_KEYS or main in FEATURE_KEYS:
        positions = _first_int(cfg, ("max_source_positions",))
        frames = opts.seq or (2 * positions if positions else AUDIO_FRAMES)
        shapes = _feature_layouts(model, cfg, batch, frames)
        if takes(model, "feature_lens"):  # Qwen2.5-Omni's audio encoder: the batch packed as mels x all frames
            mels = _first_int(cfg, MEL_KEYS) or 80
            shapes.insert(0, ((mels, batch * frames), f"{mels}x{batch * frames} (mels x the {batch} clips' frames), "
                                                      "feature_lens"))
        key, unit = (first if first in FEATURE_KEYS else "input_features"), "log-mel frames"
    else:
        frames = opts.seq or AUDIO_SECONDS * (_first_int(cfg, ("sampling_rate",)) or 16000)
        channels = _first_int(cfg, ("audio_channels",)) or 1
        shapes = [((batch, frames), f"{batch}x{frames}"), ((batch, channels, frames), f"{batch}x{channels}x{frames}")]
        length, mels = getattr(cfg, "max_length", None), getattr(cfg, "num_mel_bins", None)
        if isinstance(length, int) and isinstance(mels, int) and opts.seq is None:  # AST: a spectrogram
            shapes.insert(0, ((batch, length, mels), f"{batch}x{length}x{mels} (frames x mels)"))
            frames = length
        key, unit = "input_values", "audio samples"
    candidates = []
    for shape, shown in shapes:
        inputs: dict[str, Any] = {key: torch.zeros(shape), **_masks(model, batch, frames)}
        if takes(model, "feature_lens"):  # each clip's frames (real: the encoder cuts its windows by them)
            inputs["feature_lens"] = torch.full((batch,), frames, dtype=torch.int64)
        desc = f"{key} {shown} ({unit})"
        if takes(model, "labels"):  # a CTC head: short label sequences (the loss reads their lengths)
            n_labels = max(1, frames // 16)
            inputs["labels"] = torch.ones(batch, n_labels, dtype=torch.int64)
            desc += f", labels {batch}x{n_labels}"
        else:
            desc += "; no loss of its own: the default loss"
        candidates.append((inputs, desc))
    optional = [n for n in MASKS if takes(model, n) and n not in required(model)]
    if optional:  # then the same layouts without the optional masks (Qwen2-Audio's encoder takes a 4-D float
        # attention mask where a feature extractor's would be 2-D: it runs on unpadded audio without one)
        candidates += [({k: v for k, v in inputs.items() if k not in optional},
                        desc.replace(f"({unit})", f"({unit}, no mask)", 1))
                       for inputs, desc in candidates]
    return first_that_runs(model, candidates, f"audio ({key})")


def speech_seq2seq_inputs(model: torch.nn.Module, cfg: Any, opts: SpecOptions) -> tuple[dict, str]:
    """Speech encoder-decoders (Whisper, Canary, Cohere ASR, Parakeet's transducers): log-mel features of
    twice the configuration's ``max_source_positions`` frames (Whisper's two stride-2 convolutions halve
    them; ``AUDIO_FRAMES`` without it), decoder tokens of ``--seq`` and labels where the forward takes
    them.  An encoder whose first layer is a Conv1d over the mel bins (Whisper) takes mels x frames, at
    once, with no probe; Speech2Text (``input_feat_per_channel`` in its configuration) frames x mels, which
    its subsampler transposes; any other gets the layouts of :func:`_feature_layouts`, the first its
    forward runs on."""
    if opts.image_size is not None:
        raise UserError(f"--image-size: {type(model).__name__} takes audio features; use --seq for the decoder")
    batch, meta = opts.batch or 1, {"device": "meta"}
    mels = _first_int(cfg, MEL_KEYS) or 80
    positions = _first_int(cfg, ("max_source_positions",))
    frames = 2 * positions if positions else AUDIO_FRAMES
    seq = opts.seq or default_seq(getattr(cfg, "max_target_positions", None))
    ids = torch.zeros(batch, seq, dtype=torch.int64, **meta)
    tokens, shown = {"decoder_input_ids": ids}, f"decoder_input_ids {batch}x{seq}"
    if takes(model, "labels"):
        tokens["labels"], shown = ids, shown + ", labels"
    if isinstance(getattr(cfg, "input_feat_per_channel", None), int):  # Speech2Text: frames x mels, which its
        mels = cfg.input_feat_per_channel * int(getattr(cfg, "input_channels", 1) or 1)  # subsampler transposes
        shapes = [((batch, frames, mels), f"{batch}x{frames}x{mels} (frames x mels)")]
    elif _first_layer(model) == ("conv1d", mels):  # Whisper, as it was always given
        shapes = [((batch, mels, frames), f"{batch}x{mels}x{frames}")]
    else:
        shapes = _feature_layouts(model, cfg, batch, frames)
    # (no attention mask: with an all-ones mask Canary's and Cohere ASR's estimates hold 192,000 B more
    # activations than their real steps, +0.15 %, not yet explained; without one both are exact)
    candidates = [({"input_features": torch.zeros(shape, dtype=torch.float32, **meta), **tokens},
                   f"input_features {text}, {shown}") for shape, text in shapes]
    if takes(model, "attention_mask"):  # then with one, for a transducer that counts its frames by it (Parakeet's
        candidates += [({**inputs, "attention_mask": torch.ones(batch, frames, dtype=torch.int64)},  # RNN-T, TDT)
                        desc.replace(f", {shown}", f", attention_mask {batch}x{frames}, {shown}"))
                       for inputs, desc in candidates]
    return first_that_runs(model, candidates, "log-mel features (input_features) and decoder tokens")


SERIES_LENGTH = 512  # time steps when neither --seq nor the configuration's context_length says


def takes_series(model: torch.nn.Module, main: str) -> bool:
    """A time-series model (PatchTST, PatchTSMixer, TimesFM 2.5): its forward needs ``past_values``."""
    return main == "past_values" or (required(model) or [None])[0] == "past_values"


def series_inputs(model: torch.nn.Module, cfg: Any, opts: SpecOptions) -> tuple[dict, str]:
    """``--batch`` series of ``--seq`` time steps (default the configuration's ``context_length``) in its
    ``num_input_channels`` channels, batch x steps x channels or, for a univariate model, batch x steps (the
    layout the forward runs on, tried in that order); real zeros (the models' scalers read the values).  A model
    that computes no loss from them (the bare encoders, forecasting heads without future values) is trained on
    the default loss, and the description says so."""
    name = type(model).__name__
    if opts.image_size is not None:
        raise UserError(f"--image-size: {name} takes a time series; use --seq for its length")
    if "past_time_features" in required(model):
        return _lagged_series(model, cfg, opts)
    batch = opts.batch or 1
    length = opts.seq or int(getattr(cfg, "context_length", None) or SERIES_LENGTH)
    channels = int(getattr(cfg, "num_input_channels", None) or 1)
    # a pretraining head computes its own loss from the past values (masked patches); the others compute one only
    # from future values or labels, which this batch does not have
    loss = "" if name.endswith("ForPretraining") else "; no loss on these inputs: the default loss"
    candidates = [({"past_values": torch.zeros(batch, length, channels)},
                   f"past_values {batch}x{length}x{channels} (series x steps x channels){loss}"),
                  ({"past_values": torch.zeros(batch, length)}, f"past_values {batch}x{length} (series x steps){loss}")]
    for k, (inputs, desc) in enumerate(candidates):  # TimesFM 1: every step valid (padding 0), frequency class 0
        if takes(model, "past_values_padding"):
            inputs["past_values_padding"] = torch.zeros(inputs["past_values"].shape, dtype=torch.int64)
            desc = desc.replace(loss, "") + ", past_values_padding (every step valid)" + loss
        if takes(model, "freq"):
            inputs["freq"] = torch.zeros(batch, 1, dtype=torch.int64)
            desc = desc.replace(loss, "") + ", freq (class 0: high frequency)" + loss
        candidates[k] = (inputs, desc)
    return first_that_runs(model, candidates, "a time series (past_values)")


def _lagged_series(model: torch.nn.Module, cfg: Any, opts: SpecOptions) -> tuple[dict, str]:
    """The Time Series Transformer family (Informer, Autoformer): ``context_length`` steps plus the
    largest lag of ``lags_sequence`` of past values with their time features and observed mask, and the
    ``prediction_length`` future values and time features its distribution head's loss is computed on (real
    zeros: the scaler reads them); static features where the configuration has any."""
    batch, width = opts.batch or 1, int(getattr(cfg, "input_size", 1) or 1)
    context = int(cfg.context_length)
    if opts.seq is not None and opts.seq != context:
        raise UserError(f"--seq: {type(model).__name__} reads its configuration's context_length ({context} steps); "
                        f"use --set context_length={opts.seq}")
    length, future = context + max(cfg.lags_sequence), int(cfg.prediction_length)
    features = int(getattr(cfg, "num_time_features", 0) or 0)
    tail = () if width == 1 else (width,)
    inputs: dict[str, Any] = {
        "past_values": torch.zeros(batch, length, *tail), "past_time_features": torch.zeros(batch, length, features),
        "past_observed_mask": torch.ones(batch, length, *tail), "future_values": torch.zeros(batch, future, *tail),
        "future_time_features": torch.zeros(batch, future, features)}
    for key, count, dtype in (("static_categorical_features", "num_static_categorical_features", torch.int64),
                              ("static_real_features", "num_static_real_features", torch.float32)):
        n = int(getattr(cfg, count, 0) or 0)
        if n:
            inputs[key] = torch.zeros(batch, n, dtype=dtype)
    shape = "x".join(str(d) for d in (batch, length, *tail))
    loss = "" if type(model).__name__.endswith("ForPrediction") else "; no loss of its own: the default loss"
    return inputs, (f"past_values {shape} ({context} steps and {length - context} of lags), past_time_features, "
                    f"past_observed_mask, future_values and future_time_features of {future} steps{loss}")


def first_that_runs(model: torch.nn.Module, candidates: list[tuple[dict, str]], what: str) -> tuple[dict, str]:
    """The first ``(inputs, description)`` whose forward runs (the estimator's capture of a forward on
    fake tensors); one candidate is returned untried."""
    if len(candidates) == 1:
        return candidates[0]
    from ..capture.options import StepOptions
    from ..capture.run import capture

    failures = []
    for inputs, desc in candidates:
        try:
            capture(model, inputs, StepOptions(train=False, optimizer="none"), mode="auto")
        except UserError as exc:
            failures.append(first_line(exc))
            continue
        return inputs, desc
    missing = [f for f in failures if "requires the" in f and "library" in f]
    if missing:  # a layout that ran up to a loss in an optional library (Parakeet's RNN-T loss in torchaudio)
        raise UserError(f"hf: {type(model).__name__}: {missing[0]}")
    raise UserError(f"hf: {type(model).__name__} takes {what}, but none of the {len(candidates)} layouts tried ran "
                    f"(first: {failures[0]}); write a SPEC file, path/to/file.py:build whose build() returns "
                    f"(model, inputs) (docs/cli.md, SPEC forms)")


def naflex_patches(model: torch.nn.Module, cfg: Any, batch: int, size: int | None) -> tuple[dict, str] | None:
    """A NaFlex vision tower (SigLIP 2: its forward takes ``spatial_shapes`` and ``pixel_attention_mask``): the
    image as patches, batch x patches x (C x P x P), every patch valid, and each image's grid of patches (real
    CPU integers: the tower resizes its position embeddings to them).  ``size`` (``--image-size``) makes a
    grid of size / P per side; else the configuration's ``num_patches`` as a square.  None for another model."""
    if not (takes(model, "spatial_shapes") and takes(model, "pixel_attention_mask")):
        return None
    vision = getattr(cfg, "vision_config", None) or cfg
    patch, channels = int(vision.patch_size), int(getattr(vision, "num_channels", 3) or 3)
    side = size // patch if size else int(round(int(getattr(vision, "num_patches", 256)) ** 0.5))
    n = side * side
    inputs = {"pixel_values": torch.zeros(batch, n, channels * patch * patch, device="meta"),
              "pixel_attention_mask": torch.ones(batch, n, dtype=torch.int64),
              "spatial_shapes": torch.tensor([[side, side]] * batch, dtype=torch.int64)}
    return inputs, (f"pixel_values {batch}x{n}x{channels * patch * patch} ({side}x{side} patches of "
                    f"{channels}x{patch}x{patch}), pixel_attention_mask, spatial_shapes")


SPECTROGRAM_FRAMES = 100  # a vocoder's input: 100 mel frames (about 1 s at a 10 ms hop) when --seq does not say


def spectrogram_inputs(model: torch.nn.Module, cfg: Any, opts: SpecOptions, name: str) -> tuple[dict, str]:
    """A vocoder (HiFi-GAN, BigVGAN) on a mel spectrogram: ``--seq`` frames (default ``SPECTROGRAM_FRAMES``) of
    the configuration's ``model_in_dim`` / ``mel_dim`` bins, frames x mels or mels x frames (the first its
    forward runs on); no loss of its own, so the default loss."""
    if opts.image_size is not None:
        raise UserError(f"--image-size: {type(model).__name__} takes a spectrogram; use --seq for its frames")
    batch, frames = opts.batch or 1, opts.seq or SPECTROGRAM_FRAMES
    mels = _first_int(cfg, ("model_in_dim", "mel_dim", "num_mel_bins")) or 80
    candidates = [({name: torch.zeros(batch, frames, mels)},
                   f"{name} {batch}x{frames}x{mels} (frames x mels); no loss of its own: the default loss"),
                  ({name: torch.zeros(batch, mels, frames)},
                   f"{name} {batch}x{mels}x{frames} (mels x frames); no loss of its own: the default loss")]
    return first_that_runs(model, candidates, f"a mel spectrogram ({name})")


TRAJECTORY_STEPS = 20  # Decision Transformer's context of 20 timesteps (Chen et al. 2021, Atari/Gym K)


def trajectory_inputs(model: torch.nn.Module, cfg: Any, opts: SpecOptions) -> tuple[dict, str]:
    """Decision Transformer: ``--batch`` trajectories of ``--seq`` timesteps (default ``TRAJECTORY_STEPS``): the
    configuration's ``state_dim`` states and ``act_dim`` actions, rewards and returns-to-go, timesteps (real
    integers: an embedding index) and an all-ones mask; no loss of its own, so the default loss."""
    if opts.image_size is not None:
        raise UserError(f"--image-size: {type(model).__name__} takes trajectories; use --seq for their timesteps")
    batch, steps = opts.batch or 1, opts.seq or TRAJECTORY_STEPS
    states, actions = int(cfg.state_dim), int(cfg.act_dim)
    inputs = {"states": torch.zeros(batch, steps, states), "actions": torch.zeros(batch, steps, actions),
              "rewards": torch.zeros(batch, steps, 1), "returns_to_go": torch.zeros(batch, steps, 1),
              "timesteps": torch.zeros(batch, steps, dtype=torch.int64),
              "attention_mask": torch.ones(batch, steps, dtype=torch.int64)}
    return inputs, (f"states {batch}x{steps}x{states}, actions {batch}x{steps}x{actions}, rewards, returns_to_go, "
                    f"timesteps, attention_mask; no loss of its own: the default loss")

"""The training batch of a ``hf:`` model, by what its ``forward`` takes: token ids with labels (the
model computes its own loss; encoder-decoder models get decoder ids too), images with class
labels, Whisper's log-mel features, raw audio with CTC labels for speech encoders, and a
vision-language model's images with their image tokens in the text.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

import torch

from ..errors import UserError
from .hf_towers import (audio_inputs, first_that_runs, grid_inputs, grid_layouts, naflex_patches, patches_per_side,
                        series_inputs, spectrogram_inputs, speech_seq2seq_inputs, takes_audio, takes_grid,
                        takes_series, trajectory_inputs)
from .hf_audio_tokens import audio_text_inputs, audio_token_id
from .hf_flat_patches import flat_patch_inputs, positioned_patch_inputs, takes_flat_patches, takes_positioned_patches
from .hf_image_tokens import (VIDEO_FRAMES, any_resolution_tiles, image_text_ids, image_tokens, latent_positions,
                              more_pixels, needs_image_sizes, queried_size)
from .hf_tiles import takes_tiles, tiled_inputs
from .options import DEFAULT_IMAGE_SIZE, SpecOptions, default_seq, usable_positions
from .signature import required, takes

log = logging.getLogger(__name__)


def max_positions(cfg: Any) -> int | None:
    for c in (cfg, getattr(cfg, "text_config", None)):
        for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
            value = getattr(c, key, None)
            if isinstance(value, int) and value > 0:
                return value
    return None


def position_limit(model: torch.nn.Module, cfg: Any) -> int | None:
    """The most tokens ``model`` takes: :func:`max_positions`, less the offset of position tables that start past
    their padding row (RoBERTa and its kin number positions from ``padding_idx + 1``, so a table of 514 takes
    512 tokens; a real step past that indexes out of the table)."""
    limit = max_positions(cfg)
    if limit is None:
        return None
    for name, module in model.named_modules():
        if name.endswith("position_embeddings") and isinstance(module, torch.nn.Embedding) \
                and module.num_embeddings == limit:
            return usable_positions(module)
    return limit


def inputs_for(model: torch.nn.Module, cfg: Any, opts: SpecOptions) -> tuple[Any, str]:
    """The model's batch and its description; without labels when ``opts.labels`` is False (inference and
    generation feed the inputs alone, so the model computes no loss)."""
    inputs, desc = _batch_for(model, cfg, opts)
    if not opts.labels and isinstance(inputs, dict) and "labels" in inputs:
        inputs = {k: v for k, v in inputs.items() if k != "labels"}
        desc = desc.replace(", labels", "").replace(", class labels", "")
    return inputs, desc


def _batch_for(model: torch.nn.Module, cfg: Any, opts: SpecOptions) -> tuple[Any, str]:
    main = getattr(model, "main_input_name", "input_ids")
    if isinstance(main, (list, tuple)):  # (OneFormer names two: pixel_values, task_inputs)
        main = main[0]
    batch = opts.batch or 1
    meta = dict(device="meta")
    if takes_tiles(model):  # Llama 3.2 Vision: tiles of each image and their aspect ratio
        return tiled_inputs(model, cfg, opts)
    if takes(model, "pixel_values") and getattr(cfg, "vision_config", None) is not None \
            and _image_token_id(cfg) is not None:
        return _vlm_inputs(model, cfg, opts)
    if takes_positioned_patches(model) and not takes(model, "input_ids"):  # Gemma 4's tower: patches, positions
        return positioned_patch_inputs(model, cfg, opts)
    if takes_flat_patches(model):  # Pix2Struct, Kosmos-2.5: a page of flattened patches
        return flat_patch_inputs(model, cfg, opts)
    if takes_grid(model, cfg):  # a Qwen2-VL-style vision tower: patches and their grid
        return grid_inputs(model, cfg, opts)
    if takes_audio(model, cfg, main):  # log-mel features, or raw audio without a loss of its own
        return audio_inputs(model, cfg, opts, main)
    if main == "input_values":
        return _ctc_inputs(model, cfg, opts)
    if main == "inputs" and takes(model, "input_values") and getattr(cfg, "is_encoder_decoder", False):
        return _speech_text_inputs(model, cfg, opts)
    if takes_series(model, main):  # a time series: past values in their channels
        return series_inputs(model, cfg, opts)
    body = getattr(model, "perceiver", model)  # (the heads hold the Perceiver as .perceiver)
    if main == "inputs" and type(getattr(body, "input_preprocessor", None)).__name__ == "PerceiverTextPreprocessor":
        return _perceiver_text_inputs(model, cfg, opts)
    if main == "input_ids" and not takes(model, "input_ids"):
        main = _first_required(model) or main  # a vision tower that keeps the default main_input_name
    if main in ("spectrogram", "mel_spectrogram"):  # a vocoder
        return spectrogram_inputs(model, cfg, opts, main)
    if main == "states" and takes(model, "returns_to_go"):  # Decision Transformer: trajectories
        return trajectory_inputs(model, cfg, opts)
    if main in EMBEDDING_INPUTS and all(n == main or n.endswith("mask") for n in required(model)):
        # a module fed another's hidden states alone (FLAVA's fusion tower, a Q-Former)
        return _embedding_inputs(model, cfg, opts, main)
    if main == "input_ids":
        if opts.image_size is not None:
            raise UserError(f"--image-size: {type(model).__name__} takes token ids; use --seq")
        limit = position_limit(model, cfg)
        seq = opts.seq or default_seq(limit)
        # generation: the last decode step's token sits at position prompt + new tokens - 1
        positions = seq + max(0, opts.new_tokens - 1)
        if limit and positions > limit and opts.new_tokens:
            log.warning("--prompt-len %d and --new-tokens %d need %d positions, more than the model's %d: a real "
                        "run may fail", seq, opts.new_tokens, positions, limit)
        elif limit and seq > limit:
            log.warning("--seq %d is longer than the model's %d positions: a real run may fail", seq, limit)
        ids = torch.zeros(batch, seq, dtype=torch.int64, **meta)
        inputs = {"input_ids": ids}
        desc = f"input_ids {batch}x{seq}"
        if getattr(cfg, "is_encoder_decoder", False):
            inputs["decoder_input_ids"] = ids
            desc += f", decoder_input_ids {batch}x{seq}"
        if takes(model, "labels") and type(model).__name__.endswith(("ForImageClassification",
                                                                   "ForSequenceClassification")):
            inputs["labels"] = torch.zeros(batch, dtype=torch.int64, **meta)  # a class per sample (ImageGPT)
            desc += ", class labels"
        elif takes(model, "labels"):  # sub-models (text towers) have no loss of their own
            inputs["labels"] = ids
            desc += ", labels"
        codebooks = getattr(cfg, "num_codebooks", None)
        if isinstance(codebooks, int) and codebooks > 1:  # an audio-token decoder (MusicGen): maybe one row of
            inputs, desc = _codebook_tokens(model, inputs, desc, batch, seq, codebooks)  # ids per codebook
        return _with_side_inputs(model, cfg, opts, inputs, desc)
    if main == "input_features" and getattr(cfg, "is_encoder_decoder", False):
        return speech_seq2seq_inputs(model, cfg, opts)
    if main in ("pixel_values", "pixel_values_videos"):
        return _image_inputs(model, cfg, opts, key=main)
    raise UserError(f"hf: makes token ids, images, log-mel features, audio or time series; {type(model).__name__}.forward "
                    f"needs {_needs(model, main)}: write a SPEC file, path/to/file.py:build whose build() returns "
                    f"(model, inputs) with them (docs/cli.md, SPEC forms)")


EMBEDDING_INPUTS = ("hidden_states", "inputs_embeds", "query_embeds", "context")


def _perceiver_text_inputs(model: torch.nn.Module, cfg: Any, opts: SpecOptions) -> tuple[dict, str]:
    """Perceiver's text models take token ids as ``inputs`` (its text preprocessor embeds them): ``--batch`` x
    ``--seq`` ids; labels per sample (classification) or, for masked LM, one per position its decoder queries
    (``max_position_embeddings`` of them, whatever the input's length)."""
    if opts.image_size is not None:
        raise UserError(f"--image-size: {type(model).__name__} takes token ids; use --seq")
    limit = position_limit(model, cfg)
    batch, seq = opts.batch or 1, opts.seq or default_seq(limit)
    ids = torch.zeros(batch, seq, dtype=torch.int64, device="meta")
    if type(model).__name__.endswith("ForSequenceClassification"):
        return {"inputs": ids, "labels": torch.zeros(batch, dtype=torch.int64, device="meta")}, \
            f"inputs {batch}x{seq} (token ids), class labels"
    queried = limit or seq
    labels = torch.zeros(batch, queried, dtype=torch.int64, device="meta")
    return {"inputs": ids, "labels": labels}, \
        f"inputs {batch}x{seq} (token ids), labels {batch}x{queried} (the decoder's {queried} positions)"


def _embedding_inputs(model: torch.nn.Module, cfg: Any, opts: SpecOptions, name: str) -> tuple[dict, str]:
    """A module whose forward takes another module's output (``EMBEDDING_INPUTS``: FLAVA's fusion tower, BLIP-2's
    Q-Former, Idefics2's perceiver, a speech encoder fed its features): ``--batch`` x ``--seq`` vectors of the
    configuration's ``input_dim`` (the features it projects) or ``hidden_size``, every other required mask all ones,
    and the states a cross-attention reads (``encoder_hidden_size``) where it takes them; no loss of its own, so the
    default loss."""
    if opts.image_size is not None:
        raise UserError(f"--image-size: {type(model).__name__} takes {name}; use --seq for its length")
    width = getattr(cfg, "input_dim", None) if name == "hidden_states" else None
    width = width if isinstance(width, int) else getattr(cfg, "hidden_size", None)
    if not isinstance(width, int):
        raise UserError(f"hf: {type(model).__name__}.forward needs {name!r} and its configuration has no hidden_size: "
                        f"write a SPEC file, path/to/file.py:build whose build() returns (model, inputs)")
    batch, seq = opts.batch or 1, opts.seq or default_seq(max_positions(cfg))
    inputs = {name: torch.zeros(batch, seq, width, device="meta")}
    masks = [n for n in required(model) if n != name and n.endswith("mask")]
    inputs.update({n: torch.ones(batch, seq, dtype=torch.int64) for n in masks})
    shown = "".join(f", {n}" for n in masks)
    cross = getattr(cfg, "encoder_hidden_size", None)
    if takes(model, "encoder_hidden_states") and isinstance(cross, int):  # BLIP-2's Q-Former: the image features
        inputs["encoder_hidden_states"] = torch.zeros(batch, seq, cross, device="meta")  # its cross-attention reads
        shown += f", encoder_hidden_states {batch}x{seq}x{cross}"
    return inputs, f"{name} {batch}x{seq}x{width} (another module's output){shown}; no loss of its own: the default loss"


def _codebook_tokens(model: torch.nn.Module, inputs: dict, desc: str, batch: int, seq: int,
                     codebooks: int) -> tuple[dict, str]:
    """Token ids as given, or, where the forward does not run on them, one row per sample and codebook
    (MusicGen's decoder: batch x codebooks rows of ``seq`` ids, its labels batch x seq x codebooks)."""
    ids = torch.zeros(batch * codebooks, seq, dtype=torch.int64, device="meta")
    alt = {"input_ids": ids}
    alt_desc = f"input_ids {batch * codebooks}x{seq} ({batch} samples x {codebooks} codebooks)"
    if "labels" in inputs:
        alt["labels"] = torch.zeros(batch, seq, codebooks, dtype=torch.int64, device="meta")
        alt_desc += f", labels {batch}x{seq}x{codebooks}"
    return first_that_runs(model, [(inputs, desc), (alt, alt_desc)], "token ids")


def _first_required(model: torch.nn.Module) -> str | None:
    names = required(model)
    return names[0] if names else None


def _needs(model: torch.nn.Module, main: str) -> str:
    names = required(model) or [main]
    return ", ".join(repr(n) for n in names)


def _image_inputs(model: torch.nn.Module, cfg: Any, opts: SpecOptions, key: str = "pixel_values") -> tuple[Any, str]:
    """Images of the configuration's size (a video's frames for models with ``num_frames`` or
    ``frames_per_clip``, in the configuration or its vision tower's: ViViT, X-CLIP, V-JEPA 2, VideoPrism), as
    ``key`` (``pixel_values_videos`` where the forward takes that), with class labels for a classifier, a
    prompt image and mask for in-context segmentation (SegGPT), the caption's tokens for a captioning model
    (BLIP)."""
    batch = opts.batch or 1
    meta = dict(device="meta")
    captions = takes(model, "input_ids") and getattr(cfg, "text_config", None) is not None
    decoded = getattr(cfg, "is_encoder_decoder", False) and takes(model, "decoder_input_ids")
    if opts.seq is not None and not (captions or decoded):
        raise UserError(f"--seq: {type(model).__name__} takes images; use --image-size")
    vision = getattr(cfg, "vision_config", None)
    size = (opts.image_size or _setting(cfg, vision, ("image_size", "crop_size")) or _scaled_size(cfg)
            or DEFAULT_IMAGE_SIZE)
    if isinstance(size, (list, tuple)):
        h, w = int(size[0]), int(size[-1])
    else:
        h = w = int(size)
    channels = int(getattr(cfg, "num_channels", 3) or 3)
    frames = _setting(cfg, vision, ("num_frames", "frames_per_clip"))
    naflex = naflex_patches(model, cfg, batch, opts.image_size)
    if naflex is not None:  # SigLIP 2's tower: patches and their grid
        (inputs, desc), pixels = naflex, None
    elif cfg.model_type in _keypoint_matching():  # SuperGlue, LightGlue, EfficientLoFTR: pairs of images
        pixels = torch.zeros(batch, 2, channels, h, w, dtype=torch.float32, **meta)
        desc = f"{key} {batch}x2x{channels}x{h}x{w} (image pairs)"
    elif isinstance(frames, int) and frames > 0:  # a video model: batch x frames x C x H x W, or for a tower
        pixels = torch.zeros(batch, frames, channels, h, w, dtype=torch.float32, **meta)  # that takes the frames
        desc = f"{key} {batch}x{frames}x{channels}x{h}x{w} (video)"  # as a batch (X-CLIP's), batch * frames
        (pixels, desc) = _video_layout(model, key, pixels, desc)
    else:
        pixels = torch.zeros(batch, channels, h, w, dtype=torch.float32, **meta)
        desc = f"{key} {batch}x{channels}x{h}x{w}"
    if pixels is not None:
        inputs = {key: pixels}
    prompts = [n for n in required(model) if n != "pixel_values" and (n.endswith("pixel_values")
                                                                       or n.endswith("masks"))]
    if prompts:  # in-context segmentation (SegGPT): a prompt image and its mask, stacked on the input in
        if opts.image_size is None and h == 2 * w:  # height: the configuration's size is the stack's
            h //= 2
            pixels = inputs[key] = pixels[..., :h, :].clone()  # its own storage, as a processor's images
            desc = desc.replace(f"x{2 * h}x{w}", f"x{h}x{w}")
        for name in prompts:
            inputs[name] = torch.zeros(pixels.shape, dtype=pixels.dtype, **meta)
        desc += f", {', '.join(prompts)} like pixel_values"
    task = getattr(cfg, "task_seq_len", None)
    if "task_inputs" in required(model) and isinstance(task, int):  # OneFormer: the task prompt's tokens
        inputs["task_inputs"] = torch.zeros(batch, task, dtype=torch.int64, **meta)  # ("the task is semantic")
        desc += f", task_inputs {batch}x{task}"
    if type(model).__name__.endswith("ForImageClassification") and takes(model, "labels"):
        inputs["labels"] = torch.zeros(batch, dtype=torch.int64, **meta)
        desc += ", labels"
    elif captions:  # image captioning (BLIP): the caption's tokens, and labels when it has a loss
        limit = max_positions(cfg.text_config)
        seq = opts.seq or default_seq(limit)
        latents = getattr(cfg, "latent_query_num", None)
        if takes(model, "image_embeds_position_mask") and isinstance(latents, int):  # Kosmos-2: the image's
            seq = _seq_for(cfg, opts, latents + 1, "image tokens")  # latent queries after <image>, where the
            inputs["image_embeds_position_mask"] = latent_positions(batch, seq, latents)  # mask marks them
            desc += f", image_embeds_position_mask ({latents} image tokens each)"
        ids = torch.zeros(batch, seq, dtype=torch.int64, **meta)
        inputs["input_ids"] = ids
        desc += f", input_ids {batch}x{seq}"
        if takes(model, "labels"):
            inputs["labels"] = ids
            desc += ", labels"
        return _with_qformer_text(model, cfg, inputs, desc, seq)
    elif decoded:  # an image encoder and a text decoder (VisionEncoderDecoderModel): the text, as labels too
        seq = opts.seq or default_seq(max_positions(getattr(cfg, "decoder", cfg)))
        ids = torch.zeros(batch, seq, dtype=torch.int64, **meta)
        inputs.update(decoder_input_ids=ids, labels=ids)
        desc += f", decoder_input_ids {batch}x{seq}, labels"
    return inputs, desc


def _scaled_size(cfg: Any) -> int | None:
    """The smallest image a multi-scale model takes (Depth Pro: patches of ``patch_size`` pixels cut from the image
    scaled by each of ``scaled_images_ratios``, the smallest of which must still hold one: 384 / 0.25 = 1,536)."""
    ratios, patch = getattr(cfg, "scaled_images_ratios", None), getattr(cfg, "patch_size", None)
    if not ratios or not isinstance(patch, int):
        return None
    return math.ceil(patch / min(ratios))


def _video_layout(model: torch.nn.Module, key: str, video: torch.Tensor, desc: str) -> tuple[torch.Tensor, str]:
    """A video as batch x frames x C x H x W, or, where a forward that needs nothing else does not run on that,
    its frames as one batch (X-CLIP's vision tower: batch * frames x C x H x W)."""
    if not set(required(model)) <= {key}:  # a video-text model (VideoPrism's CLIP): its forward needs the text
        return video, desc  # too, which comes after, so no probe; the video layout
    b, f, c, h, w = video.shape
    frames = video.reshape(b * f, c, h, w)
    inputs, shown = first_that_runs(model, [({key: video}, desc),
                                            ({key: frames}, f"{key} {b * f}x{c}x{h}x{w} ({b} videos of {f} frames)")],
                                    "a video (pixel_values)")
    return inputs[key], shown


def _keypoint_matching() -> Any:
    """The model types transformers' keypoint-matching mapping names (their forward takes image pairs)."""
    from transformers.models.auto import modeling_auto

    return getattr(modeling_auto, "MODEL_FOR_KEYPOINT_MATCHING_MAPPING_NAMES", {})


def _setting(cfg: Any, vision: Any, keys: tuple[str, ...]) -> Any:
    """The first of ``keys`` set in the configuration, else in its vision tower's, else in its backbone's
    (ViTPose: the image size is the ViT backbone's, 256 x 192)."""
    for c in (cfg, vision, getattr(cfg, "backbone_config", None)):
        for k in keys:
            value = getattr(c, k, None) if c is not None else None
            if value:
                return value
    return None


def _with_qformer_text(model: torch.nn.Module, cfg: Any, inputs: dict, desc: str, text: int) -> tuple[dict, str]:
    """InstructBLIP's ``qformer_input_ids``: its processor tokenizes the prompt again for the Q-Former, so the
    Q-Former reads the ``text`` tokens too (within its positions), all attended."""
    qformer = getattr(cfg, "qformer_config", None)
    if not takes(model, "qformer_input_ids") or qformer is None:
        return inputs, desc
    limit = getattr(qformer, "max_position_embeddings", None)
    n = min(text, limit) if isinstance(limit, int) else text
    batch = next(v for k, v in inputs.items() if k.startswith("pixel_values")).shape[0]
    inputs["qformer_input_ids"] = torch.zeros(batch, n, dtype=torch.int64, device="meta")
    inputs["qformer_attention_mask"] = torch.ones(batch, n, dtype=torch.int64, device="meta")
    return inputs, desc + f", qformer_input_ids {batch}x{n} (the text again, for the Q-Former)"


VISUAL_REGIONS = 36  # LXMERT's region features per image (its pre-training's Faster R-CNN boxes)


def _with_side_inputs(model: torch.nn.Module, cfg: Any, opts: SpecOptions, inputs: dict, desc: str) -> tuple[dict, str]:
    """A token model's inputs plus the image its forward needs without a vision sub-configuration: an
    image of the configuration's size (ViLT), or region features and boxes (LXMERT's visual_feats and
    visual_pos, ``VISUAL_REGIONS`` per sample)."""
    batch = inputs["input_ids"].shape[0]
    vision = getattr(cfg, "vision_config", None)
    source = cfg if vision is None else vision  # ViLT's own image size, or a dual encoder's vision tower's (CLIP)
    size = getattr(source, "image_size", None)
    naflex = naflex_patches(model, cfg, batch, opts.image_size)
    if naflex is not None:  # SigLIP 2: the image as patches and their grid, with the contrastive loss
        inputs.update(naflex[0])
        desc += ", " + naflex[1]
        if takes(model, "return_loss"):
            inputs["return_loss"] = True
            desc += ", return_loss"
    elif takes(model, "pixel_values") and isinstance(size, int):
        size = opts.image_size or size
        channels = int(getattr(source, "num_channels", 3) or 3)
        frames = _setting(cfg, vision, ("num_frames",))
        if isinstance(frames, int) and frames > 0:  # a video-text dual encoder (X-CLIP): frames per sample
            inputs["pixel_values"] = torch.zeros(batch, frames, channels, size, size, device="meta")
            desc += f", pixel_values {batch}x{frames}x{channels}x{size}x{size} (video)"
        elif takes(model, "image_attention_mask"):  # IDEFICS: images per sample, each text token seeing them
            seq = inputs["input_ids"].shape[1]
            inputs["pixel_values"] = torch.zeros(batch, 1, channels, size, size, device="meta")
            inputs["image_attention_mask"] = torch.ones(batch, seq, 1, dtype=torch.int64)
            desc += f", pixel_values {batch}x1x{channels}x{size}x{size} (one image per sample), image_attention_mask"
        else:
            inputs["pixel_values"] = torch.zeros(batch, channels, size, size, device="meta")
            desc += f", pixel_values {batch}x{channels}x{size}x{size}"
        if takes(model, "return_loss") and "labels" not in inputs:  # CLIP-style contrastive loss
            inputs["return_loss"] = True
            desc += ", return_loss"
    audio = _audio_tower(model, cfg) if "pixel_values" not in inputs else None
    if audio is not None:  # an audio-text dual encoder (CLAP, PE-Audio): the audio its tower runs on
        key = "input_features" if takes(model, "input_features") else "input_values"
        clips, shown = audio_inputs(audio, cfg.audio_config, replace(opts, seq=None, batch=batch), key)
        clips = {k: v for k, v in clips.items() if takes(model, k) and k not in ("attention_mask", "labels")}
        spoken = audio_text_inputs(model, cfg, clips, shown.split(";")[0], batch,
                                   lambda n, what: _seq_for(cfg, opts, n, what))
        if spoken is not None:  # an audio-language model: the clip's audio tokens lead its text, else text alone
            return first_that_runs(model, [spoken, (inputs, desc)], "token ids and audio")
        if audio_token_id(cfg) is not None:  # clips need their tokens, which cannot be counted here: text alone
            return inputs, desc
        inputs.update(clips)
        desc += ", " + shown.split(";")[0]
        if takes(model, "return_loss"):
            inputs["return_loss"] = True
            desc += ", return_loss"
    if "bbox" in required(model) or (takes(model, "bbox") and hasattr(cfg, "dim_bbox")):
        # a document model that needs each token's box (BROS: dim_bbox 8 coordinates, its forward raises without)
        dim = int(getattr(cfg, "dim_bbox", 4) or 4)
        inputs["bbox"] = torch.zeros(batch, inputs["input_ids"].shape[1], dim, device="meta")
        desc += f", bbox {batch}x{inputs['input_ids'].shape[1]}x{dim} (one box per token)"
    feat, pos = getattr(cfg, "visual_feat_dim", None), getattr(cfg, "visual_pos_dim", None)
    if takes(model, "visual_feats") and isinstance(feat, int) and isinstance(pos, int):
        inputs["visual_feats"] = torch.zeros(batch, VISUAL_REGIONS, feat, device="meta")
        inputs["visual_pos"] = torch.zeros(batch, VISUAL_REGIONS, pos, device="meta")
        desc += f", visual_feats {batch}x{VISUAL_REGIONS}x{feat}, visual_pos {batch}x{VISUAL_REGIONS}x{pos}"
    return inputs, desc


def _audio_tower(model: torch.nn.Module, cfg: Any) -> torch.nn.Module | None:
    """The audio tower of a model that takes text and audio (its child named for audio, beside an
    ``audio_config``): an audio-text dual encoder (a contrastive ``return_loss``) or an audio-language model
    (an audio token), or None.  (Another model's clips would need tokens it has no id for: Voxtral's.)"""
    audio_input = takes(model, "input_features") or takes(model, "input_values")
    if getattr(cfg, "audio_config", None) is None or not audio_input:
        return None
    if not takes(model, "return_loss") and audio_token_id(cfg) is None:
        return None
    return next((m for name, m in model.named_children() if "audio" in name), None)


def _image_token_id(cfg: Any) -> int | None:
    for key in ("image_token_id", "image_token_index", "video_token_id", "video_token_index"):
        value = getattr(cfg, key, None)
        if isinstance(value, int):
            return value
    return None


def _seq_for(cfg: Any, opts: SpecOptions, at_least: int, what: str) -> int:
    if opts.new_tokens:  # (estimator.generation.prompt_inputs refuses the same for a model given as it is)
        raise UserError(f"--mode generate sizes text generation from the prompt's token ids; this model's prompt "
                        f"also holds {at_least} {what}, which generate() encodes first: size the forward with --mode "
                        f"inference")
    limit = max_positions(cfg)
    seq = opts.seq or max(default_seq(limit), at_least + 1)
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
    if hasattr(vision, "spatial_merge_size") and hasattr(vision, "temporal_patch_size") and takes(model, "image_grid_thw"):
        patch, merge, temporal = int(vision.patch_size), int(vision.spatial_merge_size), int(vision.temporal_patch_size)
        size = opts.image_size or QWEN_VL_IMAGE_SIZE
        side = patches_per_side(name, size, patch, merge)
        channels = int(getattr(vision, "in_channels", 3) or 3)
        n_tokens = side * side // (merge * merge)
        seq = _seq_for(cfg, opts, n_tokens, "image tokens")
        ids, labels = image_text_ids(batch, seq, n_tokens, image_token)
        inputs = {"input_ids": ids,
                  "pixel_values": torch.zeros(batch * side * side, channels * temporal * patch * patch),
                  "image_grid_thw": torch.tensor([[1, side, side]] * batch),
                  "labels": labels}
        if takes(model, "mm_token_type_ids"):
            inputs["mm_token_type_ids"] = (ids == image_token).to(torch.int32)
        desc = (f"input_ids {batch}x{seq} ({n_tokens} image tokens each), pixel_values of {batch} image(s) "
                f"{size}x{size} ({batch * side * side} patches), image_grid_thw, labels")
        return inputs, desc
    tower = _grid_tower(model) if takes(model, "image_grid_thw") else None
    if tower is not None:  # other towers fed patches and their grid (Kimi-K2.5, PaddleOCR-VL, ERNIE-4.5-VL ...)
        return _grid_vlm_inputs(model, cfg, opts, tower, image_token)
    naflex = naflex_patches(model, cfg, batch, opts.image_size)
    if naflex is not None:  # a NaFlex tower (LFM2-VL's SigLIP 2): patches, their mask and each image's grid
        patches, shown = naflex
        first = {k: v[:1] for k, v in patches.items() if k != "pixel_values"}
        pixels_a_side = patches["spatial_shapes"][:1] * int(vision.patch_size)  # (for the error message)
        n_tokens, _ = image_tokens(model, cfg, patches["pixel_values"][:1], pixels_a_side, side=first)
        seq = _seq_for(cfg, opts, n_tokens, "image tokens")
        ids, labels = image_text_ids(batch, seq, n_tokens, image_token)
        return {"input_ids": ids, **patches, "labels": labels}, \
            f"input_ids {batch}x{seq} ({n_tokens} image tokens each), {shown}, labels"
    size = opts.image_size or queried_size(cfg, vision) or getattr(vision, "image_size", None) or DEFAULT_IMAGE_SIZE
    h, w = (int(size[0]), int(size[-1])) if isinstance(size, (list, tuple)) else (int(size), int(size))
    channels = int(getattr(vision, "num_channels", 3) or 3)
    tiles = any_resolution_tiles(model, cfg, h, w)
    crop = int(vision.image_size) if tiles else h  # (a tile is the tower's own size)
    # (ones, not zeros: Idefics2 drops all-zero images as padding)
    pixels = torch.ones(batch, tiles, channels, crop, crop) if tiles else torch.ones(batch, channels, h, w)
    sizes = torch.tensor([[h, w]] * batch)  # (each image's size before tiling: LLaVA-NeXT unpads by it)
    frames = VIDEO_FRAMES if "Video" in name else 1  # (InstructBLIP-Video: a clip of frames per sample)
    second = more_pixels(model, cfg, batch, channels)  # (a second tower's images: DeepSeek-VL-Hybrid's high-res)
    firsts = {k: v[:1] for k, v in second.items()}
    n_tokens, per_sample = image_tokens(model, cfg, pixels[:1], sizes[:1], frames, firsts)
    if per_sample:
        pixels = pixels.unsqueeze(1).expand(-1, frames, -1, -1, -1).contiguous()
    seq = _seq_for(cfg, opts, n_tokens, "image tokens")
    ids, labels = image_text_ids(batch, seq, n_tokens, image_token)
    inputs = {"input_ids": ids, "pixel_values": pixels, **second, "labels": labels}
    if takes(model, "token_type_ids"):  # PaliGemma, Gemma 3: image positions marked 1
        inputs["token_type_ids"] = (ids == image_token).to(torch.int64)
    shown = f"{batch}x{channels}x{h}x{w}"
    if per_sample:
        shown = f"{batch}x{frames}x{channels}x{h}x{w} " + (f"({frames} frames a clip)" if frames > 1 else
                                                             "(one image per sample)")
    if tiles:
        inputs["image_sizes"] = sizes
        shown = f"{batch}x{tiles}x{channels}x{crop}x{crop} ({tiles} tiles of each {h}x{w} image), image_sizes"
    elif needs_image_sizes(model):  # Mistral 3, LightOnOCR (Pixtral's tower): each image's size
        inputs["image_sizes"] = sizes
        shown += ", image_sizes"
    shown += "".join(f", {k} {'x'.join(map(str, v.shape))}" for k, v in second.items())
    desc = f"input_ids {batch}x{seq} ({n_tokens} image tokens each), pixel_values {shown}, labels"
    return _with_qformer_text(model, cfg, inputs, desc, seq - n_tokens)


def _grid_tower(model: torch.nn.Module) -> torch.nn.Module | None:
    """The vision sub-module of a vision-language model that takes patches and ``grid_thw``, if any."""
    for _, module in model.named_modules():
        if module is not model and takes_grid(module, getattr(module, "config", None)):
            return module
    return None


def _grid_vlm_inputs(model: torch.nn.Module, cfg: Any, opts: SpecOptions, tower: torch.nn.Module,
                     image_token: int) -> tuple[dict, str]:
    """A vision-language model whose tower takes patches and their grid: ``--batch`` images of ``--image-size``,
    each ``(side / merge)^2`` image tokens at the start of ``input_ids`` (the tower merges ``merge`` x ``merge``
    patches: ``spatial_merge_size``, Kimi's ``merge_kernel_size``), ``image_grid_thw``, labels on the text;
    the patches in the first of the tower's layouts (:func:`~.hf_towers.grid_layouts`) the whole model's forward
    runs on (PaddleOCR-VL adds the packed sequence's batch dimension itself)."""
    vision = tower.config
    batch = opts.batch or 1
    kernel = getattr(vision, "merge_kernel_size", None)
    merge = int(getattr(vision, "spatial_merge_size", None) or (kernel[0] if kernel else None)
                or getattr(vision, "merge_size", None) or 1)
    candidates = []
    for patches, shown in grid_layouts(tower, vision, replace(opts, batch=batch, seq=None)):
        grid = patches["grid_thw"]
        side = int(grid[0, 1])
        n_tokens = side * side // (merge * merge)
        seq = _seq_for(cfg, opts, n_tokens, "image tokens")
        ids, labels = image_text_ids(batch, seq, n_tokens, image_token)
        pixels = next(v for k, v in patches.items() if k not in ("grid_thw", "merge_sizes"))
        inputs = {"input_ids": ids, "pixel_values": pixels, "image_grid_thw": grid, "labels": labels}
        if takes(model, "mm_token_type_ids"):
            inputs["mm_token_type_ids"] = (ids == image_token).to(torch.int32)
        if takes(model, "image_merge_sizes"):  # VideoLLaMA 3: each image's merge
            inputs["image_merge_sizes"] = torch.tensor([merge] * batch)
        candidates.append((inputs, f"input_ids {batch}x{seq} ({n_tokens} image tokens each), "
                                   f"{shown.replace('grid_thw', 'image_grid_thw')}, labels"))
    return first_that_runs(model, candidates, "image patches and image_grid_thw")


QWEN_VL_IMAGE_SIZE = 448  # Qwen2-VL takes any multiple of 28 pixels; 448 x 448 = 256 image tokens


CTC_SAMPLES = 16000 * 10  # speech encoders: 10 s of 16 kHz audio by default


def _ctc_inputs(model: torch.nn.Module, cfg: Any, opts: SpecOptions) -> tuple[Any, str]:
    """Speech encoders with a CTC head (wav2vec2, HuBERT, WavLM): raw audio of ``--seq`` samples and
    labels a quarter as long as the encoder's output frames (real CPU tensors: the CTC loss reads
    the label lengths)."""
    name = type(model).__name__
    if opts.image_size is not None:
        raise UserError(f"--image-size: {name} takes audio; use --seq for the number of audio samples")
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


def _speech_text_inputs(model: torch.nn.Module, cfg: Any, opts: SpecOptions) -> tuple[Any, str]:
    """A raw-audio encoder with a text decoder (SpeechEncoderDecoderModel: wav2vec2 + BERT): ``CTC_SAMPLES``
    samples of audio (``--seq`` is the decoder's) and the decoder's tokens, as labels too."""
    if opts.image_size is not None:
        raise UserError(f"--image-size: {type(model).__name__} takes audio; use --seq for the decoder's tokens")
    batch, meta = opts.batch or 1, {"device": "meta"}
    seq = opts.seq or default_seq(max_positions(getattr(cfg, "decoder", cfg)))
    ids = torch.zeros(batch, seq, dtype=torch.int64, **meta)
    inputs = {"input_values": torch.zeros(batch, CTC_SAMPLES, **meta), "decoder_input_ids": ids, "labels": ids}
    return inputs, f"input_values {batch}x{CTC_SAMPLES} (audio samples), decoder_input_ids {batch}x{seq}, labels"

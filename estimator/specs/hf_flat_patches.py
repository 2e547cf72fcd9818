"""The batch of a ``hf:`` model fed its image as a list of patches: ``flattened_patches`` (Pix2Struct, Kosmos-2.5),
or patches with ``pixel_position_ids`` (Gemma 4's vision tower).

Their image processors cut a page into at most ``max_patches`` patches of 16 x 16 pixels and give each as
one row: its row and column index (read as embedding indices), then its ``16 * 16 * 3`` pixel values
(``patch_embed_hidden_size``), padded with zero rows to ``max_patches`` and an ``attention_mask`` marking
the real ones.  The patch count is the processor's default: a page of that many patches is what the
model trains on (Pix2StructImageProcessor ``max_patches = 2048``, Kosmos2_5ImageProcessor ``4096``), capped
by the configuration's embedding of positions (``seq_len``, ``max_num_patches``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..errors import UserError
from .hf_image_tokens import latent_positions
from .options import SpecOptions, default_seq
from .signature import takes

# the image processors' default patches per page, by model family (transformers 5.17
# image_processing_pix2struct.py and image_processing_kosmos2_5.py: ``max_patches``)
PROCESSOR_MAX_PATCHES = {"Pix2Struct": 2048, "Kosmos2_5": 4096}


def takes_flat_patches(model: torch.nn.Module) -> bool:
    return takes(model, "flattened_patches")


def flat_patch_inputs(model: torch.nn.Module, cfg: Any, opts: SpecOptions) -> tuple[dict, str]:
    """``--batch`` pages of the processor's patch count (``--image-size`` is not theirs: a page is any size,
    resized to fit the patches), ``attention_mask`` all ones; a model with a text decoder gets ``--seq``
    decoder tokens as labels (Pix2Struct's conditional generation shifts them itself)."""
    name = type(model).__name__
    if opts.image_size is not None:
        raise UserError(f"--image-size: {name} takes a page cut into flattened patches, resized to fit "
                        f"{_patches(name, cfg)} of them; leave --image-size out")
    vision = getattr(cfg, "vision_config", None) or cfg
    width = getattr(vision, "patch_embed_hidden_size", None)
    if not isinstance(width, int):
        raise UserError(f"hf: {name}.forward needs 'flattened_patches' and its configuration has no "
                        f"patch_embed_hidden_size: write a SPEC file, path/to/file.py:build whose build() returns "
                        f"(model, inputs)")
    batch, n = opts.batch or 1, _patches(name, cfg)
    inputs: dict[str, torch.Tensor] = {
        "flattened_patches": torch.zeros(batch, n, 2 + width),  # (row, column, pixels...) per patch
        # integer ones (the processors' are float): values the trace keeps, so a mask of ones is skipped as the
        # real step skips it (transformers' create_bidirectional_mask reads ``mask.all()``)
        "attention_mask": torch.ones(batch, n, dtype=torch.int64)}
    desc = f"flattened_patches {batch}x{n}x{2 + width} ({n} patches a page: row, column, {width} pixel values), " \
           "attention_mask"
    text = getattr(cfg, "text_config", None)
    latents = getattr(cfg, "latent_query_num", None)
    if takes(model, "input_ids") and takes(model, "image_embeds_position_mask") and isinstance(latents, int):
        return _with_image_tokens(model, cfg, opts, inputs, desc, latents)
    if text is not None and takes(model, "labels"):
        seq = opts.seq or default_seq(getattr(text, "n_positions", None) or getattr(text, "max_position_embeddings",
                                                                                      None))
        inputs["labels"] = torch.ones(batch, seq, dtype=torch.int64)
        desc += f", labels {batch}x{seq} (the decoder's tokens)"
    elif opts.seq is not None:
        raise UserError(f"--seq: {name} takes a page of flattened patches and no text; leave --seq out")
    return inputs, desc


def _patches(name: str, cfg: Any) -> int:
    vision = getattr(cfg, "vision_config", None) or cfg
    family = next((k for k in PROCESSOR_MAX_PATCHES if name.startswith(k)), None)
    limit = getattr(vision, "seq_len", None) or getattr(vision, "max_num_patches", None)
    n = PROCESSOR_MAX_PATCHES.get(family, limit or 2048)
    return min(n, limit) if isinstance(limit, int) else n


def _with_image_tokens(model: torch.nn.Module, cfg: Any, opts: SpecOptions, inputs: dict, desc: str,
                       latents: int) -> tuple[dict, str]:
    """Kosmos-2.5: the page's ``latent_query_num`` image embeddings (2,048) take the token positions after the
    first, where ``image_embeds_position_mask`` marks them, then text; labels on the text."""
    batch = inputs["flattened_patches"].shape[0]
    text = getattr(cfg, "text_config", cfg)
    limit = getattr(text, "max_position_embeddings", None)
    seq = opts.seq or max(default_seq(limit), latents + 33)
    if seq <= latents + 1:
        raise UserError(f"--seq {seq} leaves no text after the {latents} image tokens: use --seq {latents + 2} or more")
    ids = torch.ones(batch, seq, dtype=torch.int64)
    mask = latent_positions(batch, seq, latents)
    labels = ids.clone()
    labels[:, :1 + latents] = -100
    inputs.update(input_ids=ids, image_embeds_position_mask=mask, labels=labels)
    inputs.pop("attention_mask")  # (the forward's attention_mask is the text's; the tower masks its padding rows)
    return inputs, f"input_ids {batch}x{seq} ({latents} image tokens each), " + \
        desc.replace(", attention_mask", "") + ", image_embeds_position_mask, labels"


# Gemma 4's image processor (image_processing_gemma4.py): ``max_soft_tokens = 280`` image tokens, each the pool of
# ``pooling_kernel_size``^2 = 9 patches, so at most 2,520 patches, the rest padding at position -1
GEMMA4_SOFT_TOKENS = 280


def takes_positioned_patches(model: torch.nn.Module) -> bool:
    return takes(model, "pixel_position_ids")


def positioned_patch_inputs(model: torch.nn.Module, cfg: Any, opts: SpecOptions) -> tuple[dict, str]:
    """``--batch`` square images as Gemma 4's processor gives them: the largest square of patches whose side is a
    multiple of the pooling kernel within its 2,520 patches (48 x 48 = 2,304, 256 image tokens; ``--image-size``
    for another, rounded down to whole pooled cells), padded to 2,520 rows at position -1."""
    name = type(model).__name__
    if opts.seq is not None:
        raise UserError(f"--seq: {name} takes image patches; use --image-size")
    patch, kernel = int(cfg.patch_size), int(getattr(cfg, "pooling_kernel_size", 1) or 1)
    most = GEMMA4_SOFT_TOKENS * kernel * kernel
    side = math.isqrt(most) // kernel * kernel
    if opts.image_size is not None:
        side = opts.image_size // (patch * kernel) * kernel
        if not 0 < side * side <= most:
            raise UserError(f"--image-size {opts.image_size}: {name} takes {kernel * patch} to "
                            f"{math.isqrt(most) // kernel * kernel * patch} pixels a side")
    batch, n = opts.batch or 1, side * side
    rows = torch.arange(side).repeat_interleave(side)
    grid = torch.stack([rows, torch.arange(side).repeat(side)], dim=-1)  # (row, column) of each real patch
    positions = torch.full((batch, most, 2), -1, dtype=torch.int64)
    positions[:, :n] = grid
    pixels = torch.zeros(batch, most, 3 * patch * patch)
    return {"pixel_values": pixels, "pixel_position_ids": positions}, \
        (f"pixel_values {batch}x{most}x{3 * patch * patch} ({side}x{side} patches of a {side * patch}-pixel image, "
         f"padded to {most}), pixel_position_ids; no loss of its own: the default loss")

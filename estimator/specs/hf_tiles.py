"""The batch of a ``hf:`` model that cuts each image into tiles with an aspect-ratio id (Llama 3.2 Vision,
``Mllama``).

Its image processor resizes an image to the best of ``supported_aspect_ratios`` (rows x columns of tiles of
``image_size`` pixels, at most ``max_num_tiles``) and pads the tiles to ``max_num_tiles``; the tower runs on
every tile, padded ones included, and reads ``aspect_ratio_ids`` (the ratio's index in the list, plus one)
for its tile position embeddings and ``aspect_ratio_mask`` for the real tiles.  An image of ``--image-size``
pixels (default: the largest square the tiles allow, 2 x 2 tiles of 560 for the published 11B) uses the
square ratio of ``ceil(size / image_size)`` tiles a side.  The text model cross-attends to the tiles from
the first ``<|image|>`` token on (``cross_attention_mask``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..errors import UserError
from .hf_image_tokens import image_text_ids
from .options import SpecOptions, default_seq
from .signature import takes


def takes_tiles(model: torch.nn.Module) -> bool:
    return takes(model, "aspect_ratio_ids")


def tiled_inputs(model: torch.nn.Module, cfg: Any, opts: SpecOptions) -> tuple[dict, str]:
    """One tiled image per sample (see the module doc); with token ids (one image token, then text; labels on
    the text) for the whole model, the tiles alone for the vision tower."""
    vision = getattr(cfg, "vision_config", None) or cfg
    name = type(model).__name__
    tile, most = int(vision.image_size), int(vision.max_num_tiles)
    ratios = [tuple(r) for r in vision.supported_aspect_ratios]
    squares = [r[0] for r in ratios if r[0] == r[1]]
    size = opts.image_size or max(squares) * tile
    side = math.ceil(size / tile)
    if (side, side) not in ratios:
        raise UserError(f"--image-size {size}: {name} tiles images into at most {most} tiles of {tile} pixels "
                        f"({', '.join(f'{r[0]}x{r[1]}' for r in ratios)}); use --image-size {max(squares) * tile} "
                        f"or less")
    batch, used = opts.batch or 1, side * side
    inputs: dict[str, torch.Tensor] = {
        "pixel_values": torch.zeros(batch, 1, most, int(getattr(vision, "num_channels", 3) or 3), tile, tile),
        "aspect_ratio_ids": torch.full((batch, 1), ratios.index((side, side)) + 1, dtype=torch.int64),
        "aspect_ratio_mask": (torch.arange(most) < used).to(torch.int64).expand(batch, 1, most).clone()}
    desc = (f"pixel_values {batch}x1x{most}x3x{tile}x{tile} (one {size}x{size} image: {side}x{side} tiles, padded "
            f"to {most}), aspect_ratio_ids, aspect_ratio_mask")
    if not takes(model, "input_ids"):
        if opts.seq is not None:
            raise UserError(f"--seq: {name} takes images; use --image-size")
        return inputs, desc
    seq = opts.seq or default_seq(getattr(getattr(cfg, "text_config", cfg), "max_position_embeddings", None))
    ids, labels = image_text_ids(batch, seq, 1, int(cfg.image_token_index))
    mask = torch.zeros(batch, seq, 1, most, dtype=torch.int64)
    mask[:, :, 0, :used] = 1  # every token from the image token on sees the image's real tiles
    inputs.update(input_ids=ids, cross_attention_mask=mask, labels=labels)
    return inputs, f"input_ids {batch}x{seq} (1 image token each), {desc}, cross_attention_mask, labels"

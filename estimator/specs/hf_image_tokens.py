"""How many tokens one image becomes in a ``hf:`` vision-language model, and the image layout its tower takes.

The count comes from the model itself: its ``get_image_features`` (or its base model's), traced by the
estimator's own capture on fake tensors (nothing is allocated, a full-size model included), or else the count
its configuration states (``mm_tokens_per_image``, ``num_query_tokens`` ...).  The layout: images as batch x C
x H x W, or with an images-per-sample dimension where the tower unpacks five (Idefics2; a video model's clip of
frames), tiled at any resolution (LLaVA-NeXT's ``image_grid_pinpoints``), sized for a projector that maps only
some patch counts (Aria).
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch

from ..errors import UserError
from .options import first_line
from .signature import takes


def queried_size(cfg: Any, vision: Any) -> int | None:
    """The image size of a projector that maps only some patch counts to queries (Aria's
    ``projector_patch_to_query_dict``, {1225: 128, 4900: 256}): the smallest count's square side in patches."""
    counts = getattr(cfg, "projector_patch_to_query_dict", None)
    patch = getattr(vision, "patch_size", None)
    if not isinstance(counts, dict) or not counts or not isinstance(patch, int):
        return None
    return math.isqrt(min(int(k) for k in counts)) * patch


def any_resolution_tiles(model: torch.nn.Module, cfg: Any, h: int, w: int) -> int | None:
    """How many crops of the tower's size an ``h`` x ``w`` image is cut into by a model that tiles images at
    any resolution (LLaVA-NeXT, LLaVA-OneVision: the best of ``image_grid_pinpoints`` plus the whole image
    resized), by its modeling file's own ``image_size_to_num_patches``; None for another model."""
    import sys

    count = getattr(sys.modules.get(type(model).__module__), "image_size_to_num_patches", None)
    pinpoints = getattr(cfg, "image_grid_pinpoints", None)
    crop = getattr(cfg.vision_config, "image_size", None)
    if count is None or not isinstance(pinpoints, list) or not isinstance(crop, int) or not takes(model, "image_sizes"):
        return None
    return int(count(image_size=[h, w], grid_pinpoints=pinpoints, patch_size=crop))


VIDEO_FRAMES = 4  # frames a clip for a video-language model (InstructBLIP-Video's processor samples 4)


def image_tokens(model: torch.nn.Module, cfg: Any, pixels: torch.Tensor, sizes: torch.Tensor,
                 frames: int = 1, side: dict[str, torch.Tensor] | None = None) -> tuple[int, bool]:
    """How many tokens one image (of size ``sizes``, one row) becomes, and whether the model takes its images
    with an images-per-sample dimension (batch x images x C x H x W: Idefics2): the vision tower and projector
    (``get_image_features``, the model's or its base model's) traced by the estimator's capture on fake tensors
    (nothing allocated; a mask of known values is read as the real step reads it), else the count the
    configuration states."""
    name = type(model).__name__
    get = image_features_of(model)
    failure: Exception | None = None
    for per_sample in (False, True) if get is not None else ():
        try:
            shaped = pixels.unsqueeze(1).expand(-1, frames, -1, -1, -1) if per_sample else pixels
            return _features_per_image(model, get, shaped, sizes, side or {}), per_sample
        except Exception as exc:  # noqa: BLE001 - a tower that does not trace so: the configuration's count
            failure = failure or exc
            if "expected 5, got 4" not in str(exc):  # (4-D images where it unpacks 5: images per sample)
                break
    for key in ("mm_tokens_per_image", "image_seq_length", "num_image_tokens", "num_query_tokens"):
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value > 0:  # (per image; a video model's clip: per frame)
            return value * frames, frames > 1
    why = f" ({type(failure).__name__}: {first_line(failure)})" if failure is not None else ""
    raise UserError(f"{name}: cannot tell how many tokens an image of {int(sizes[0, 0])}x{int(sizes[0, 1])} "
                    f"becomes{why}; this model needs more than pixel_values (tiles, image sizes): write a SPEC "
                    f"file that returns (model, inputs)")


def image_features_of(model: torch.nn.Module) -> Any:
    return getattr(model, "get_image_features", None) or getattr(getattr(model, "model", None), "get_image_features",
                                                                  None)


def needs_image_sizes(model: torch.nn.Module) -> bool:
    """Whether the model's image features need each image's size (a required ``image_sizes``: Pixtral's tower);
    LLaVA takes it too, for Pixtral towers only (a CLIP tower fails on it)."""
    get = image_features_of(model)
    param = inspect.signature(get).parameters.get("image_sizes") if get is not None else None
    return param is not None and param.default is inspect.Parameter.empty


class Features(torch.nn.Module):
    """``get_image_features`` (or ``get_audio_features``) as a module's forward, its first image's features as
    the output."""

    def __init__(self, owner: torch.nn.Module, get: Any, extra: dict) -> None:
        super().__init__()
        self.owner, self.get, self.extra = owner, get, extra

    def forward(self, **inputs: torch.Tensor) -> torch.Tensor:
        out = self.get(**inputs, **self.extra)
        features = next((f for f in (getattr(out, "pooler_output", None), getattr(out, "last_hidden_state", None))
                         if f is not None), out)  # (the projected features; Llama 4 leaves them as the last state)
        if isinstance(features, (list, tuple)):  # (one tensor per image: LLaVA-NeXT)
            features = features[0]
        if not isinstance(features, torch.Tensor) or features.ndim < 2:
            raise TypeError(f"{getattr(self.get, '__name__', 'get_features')} gave {type(features).__name__}, not "
                            f"features")
        return features


def _features_per_image(model: torch.nn.Module, get: Any, pixels: torch.Tensor, sizes: torch.Tensor,
                        side: dict[str, torch.Tensor]) -> int:
    params = inspect.signature(get).parameters
    extra = {"image_sizes": sizes} if "image_sizes" in params else {}
    configs = (model.config, getattr(model.config, "vision_config", None))
    for name, p in params.items():  # required settings the model's forward takes from its configuration
        found = [getattr(c, name) for c in configs if hasattr(c, name)]
        if p.default is inspect.Parameter.empty and name not in ("pixel_values", "image_sizes", *side) and found:
            extra[name] = found[0]  # (Llama 4's vision_feature_select_strategy)
    return features_count(model, get, {"pixel_values": pixels.to("meta"), **side}, extra)


def features_count(model: torch.nn.Module, get: Any, inputs: dict[str, torch.Tensor], extra: dict) -> int:
    """How many embeddings ``get(**inputs, **extra)`` (the model's ``get_image_features`` or
    ``get_audio_features``) makes: traced by the estimator's capture of a forward on fake tensors."""
    from ..capture.options import StepOptions
    from ..capture.run import capture

    cap = capture(Features(model, get, extra), inputs, StepOptions(train=False, optimizer="none"), mode="auto")
    return math.prod(cap.module_outputs[""][0][:-1])


def more_pixels(model: torch.nn.Module, cfg: Any, batch: int, channels: int) -> dict[str, torch.Tensor]:
    """Images a second tower needs beside ``pixel_values`` (DeepSeek-VL-Hybrid's ``high_res_pixel_values``): each
    ``<name>_pixel_values`` the image features require, at the size of the configuration's ``<name>_vision_config``."""
    get = image_features_of(model)
    params = inspect.signature(get).parameters if get is not None else {}
    out = {}
    for name, p in params.items():
        tower = getattr(cfg, name.replace("pixel_values", "vision_config"), None)
        size = getattr(tower, "image_size", None)
        if name.endswith("_pixel_values") and p.default is inspect.Parameter.empty and isinstance(size, int):
            out[name] = torch.ones(batch, channels, size, size)
    return out


def image_text_ids(batch: int, seq: int, n_image: int, image_token: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (image tokens first, then text token 1) and labels (-100 on the image tokens)."""
    ids = torch.ones(batch, seq, dtype=torch.int64)
    ids[:, :n_image] = image_token
    labels = ids.clone()
    labels[:, :n_image] = -100
    return ids, labels


def latent_positions(batch: int, seq: int, latents: int) -> torch.Tensor:
    """``image_embeds_position_mask`` of Kosmos-2 and Kosmos-2.5: the image's ``latent_query_num`` embeddings take
    the token positions after the first (``<image>``), marked 1; text after them."""
    mask = torch.zeros(batch, seq, dtype=torch.int64)
    mask[:, 1:1 + latents] = 1
    return mask

"""``torchvision:NAME`` (``torchvision.models.get_model(NAME, weights=None)``) and ``timm:NAME``
(``timm.create_model(NAME, pretrained=False)``): ``--set`` options as builder keyword arguments;
images of ``--batch`` x 3 x ``--image-size`` squared (default: the size of the model's weights'
preprocessing, or timm's ``pretrained_cfg``), cross-entropy against class labels; detection
models get one synthetic object per image and sum the losses they return.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch

from ..build import empty_weights
from ..compat import import_torchvision, torchvision_has_ops
from ..errors import UserError
from .options import DEFAULT_IMAGE_SIZE, Loaded, SpecOptions, close_matches, first_line


# -- image classifiers: torchvision: and timm: ------------------------------------------------


def classification_loss(output: Any) -> torch.Tensor:
    """Cross-entropy of each (batch, classes) logits tensor in ``output`` against class 0 labels.

    Other outputs (segmentation maps, features) fall back to the default loss.
    """
    import torch.nn.functional as F
    import torch.utils._pytree as pytree

    from ..capture import default_loss

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
    labels = ", class labels" if opts.labels else ""
    return torch.zeros(batch, channels, h, w, device="meta"), f"images {batch}x{channels}x{h}x{w}{labels}"


def matching_torchvision(torch_version: str | None = None, cpu: bool | None = None) -> str:
    """The pip command that installs the torchvision built for a torch release: torchvision 0.N+15 goes with
    torch 2.N (pytorch/vision's README, "Installation": 2.11 -> 0.26, 2.13 -> 0.28, 2.14 -> 0.29).  Each
    wheel is built against one torch build: PyPI's torchvision links the CUDA torch's libraries
    (``libtorch_cuda.so``, ``libc10_cuda.so``), so beside the CPU torch its operators fail to register
    ("operator torchvision::nms does not exist"), and a CPU torch (``torch.version.cuda`` None, e.g.
    ``2.13.0+cpu``) needs the CPU torchvision of PyTorch's CPU wheel index."""
    from ..compat import torch_version as parse

    major, minor = parse(torch_version or torch.__version__)
    if major != 2:
        return "pip install the torchvision built for your torch"
    cpu = torch.version.cuda is None if cpu is None else cpu
    pin = f"torchvision=={major - 2}.{minor + 15}.*"
    return f"pip install '{pin}'" + (" --index-url https://download.pytorch.org/whl/cpu" if cpu else "")


def _import_vision(name: str):
    fix = f"install the torchvision built for torch {torch.__version__}: {matching_torchvision()}"
    try:
        import_torchvision()  # PyPI's torchvision beside a CPU torch (timm imports it too)
        return importlib.import_module(name)
    except ImportError as exc:
        if getattr(exc, "name", None) == name:
            raise UserError(f"{name}: specs need {name}: {matching_torchvision()}, then pip install "
                            f"'estimator[vision]'") from exc
        raise UserError(f"importing {name} failed: {first_line(exc)}; {fix}") from exc
    except Exception as exc:  # "operator torchvision::nms does not exist": a torchvision built for another torch
        raise UserError(f"importing {name} failed: {type(exc).__name__}: {first_line(exc)}; {fix}") from exc


def _construct(call: Callable[[], torch.nn.Module], what: str, known: list[str] | None = None) -> torch.nn.Module:
    import contextlib
    import warnings

    def build(device: Any) -> torch.nn.Module:
        with empty_weights(), warnings.catch_warnings(), device:
            warnings.simplefilter("ignore")  # notes about weight initialisation, which is skipped anyway
            return call()

    try:
        try:
            return build(contextlib.nullcontext())
        except (RuntimeError, NotImplementedError) as exc:
            # a builder that runs its layers on a probe it makes (SSDlite's backbone, for its channels) or copies
            # what it computed from a weight into a buffer (Swin V2's log-spaced coordinates) meets meta
            # weights: everything made on meta
            if "device" not in str(exc) and "meta" not in str(exc):
                raise
            return build(torch.device("meta"))
    except TypeError as exc:
        msg = first_line(exc)
        if "unexpected keyword argument" in msg:
            key = msg.split("'")[-2] if msg.count("'") >= 2 else "?"
            raise UserError(f"{what} takes no option {key!r} (--set {key}=...)"
                            f"{close_matches(key, known or [])}") from exc
        raise UserError(f"building {what} failed: TypeError: {msg}") from exc
    except Exception as exc:
        raise UserError(f"building {what} failed: {type(exc).__name__}: {first_line(exc)}") from exc


def load_torchvision(name: str, opts: SpecOptions) -> Loaded:
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
    if isinstance(model, models.detection.generalized_rcnn.GeneralizedRCNN) and not torchvision_has_ops():
        raise UserError(f"torchvision:{name} trains with torchvision's C++ operators (the RPN's NMS, RoI align), "
                        f"which this torchvision cannot load beside torch {torch.__version__}: "
                        f"{matching_torchvision()}")
    if name in models.list_models(module=models.detection):
        inputs, desc = detection_inputs(model, opts)
        return Loaded(model, inputs, loss_fn=detection_loss, description=f"{type(model).__name__}; {desc}")
    size = opts.image_size or getattr(model, "image_size", None) or _torchvision_crop(models, name)
    if name in models.list_models(module=models.video):
        inputs, desc = _video_inputs(opts, size, _torchvision_clip(models, name))
    elif name in models.list_models(module=models.optical_flow):  # RAFT: forward(image1, image2)
        (first, desc), (second, _) = _image_inputs(opts, size), _image_inputs(opts, size)
        inputs, desc = (first, second), desc.replace("images", "image pairs (two frames)") \
            .replace(", class labels", "")
    else:
        inputs, desc = _image_inputs(opts, size)
    return Loaded(model, inputs, loss_fn=classification_loss, description=f"{type(model).__name__}; {desc}")


def _video_inputs(opts: SpecOptions, size: int, clip: int) -> tuple[torch.Tensor, str]:
    """Clips of ``--batch`` x 3 x frames x ``--image-size`` squared, as torchvision's video classifiers take
    them (channels before time); the frames are ``--seq`` (default ``clip``: the weights' clip length)."""
    batch, frames = opts.batch or 1, opts.seq or clip
    labels = ", class labels" if opts.labels else ""
    return (torch.zeros(batch, 3, frames, size, size, device="meta"),
            f"videos {batch}x3x{frames}x{size}x{size} ({frames} frames: --seq){labels}")


def _torchvision_clip(models, name: str) -> int:
    """Frames per clip of a video model's default weights: the ``clip_len`` their accuracy was measured with
    (torchvision's weight documentation: 16 for R3D, MC3, R(2+1)D and MViT, 32 for Swin3D, 128 for S3D), 16
    where it does not say."""
    import re

    try:
        found = re.search(r"clip_len=(\d+)", models.get_model_weights(name).DEFAULT.meta.get("_docs", ""))
        return int(found.group(1)) if found else 16
    except Exception:
        return 16


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
    (default 800) and one synthetic object each; the model returns its losses in training mode.  Without
    labels (inference), the images alone."""
    if opts.seq is not None:
        raise UserError("--seq applies to token models; detection models take --batch and --image-size")
    batch, size = opts.batch or 1, opts.image_size or DETECTION_IMAGE_SIZE
    images = [torch.zeros(3, size, size) for _ in range(batch)]
    if not opts.labels:  # inference: images alone (in eval mode the model returns its detections)
        return (images,), f"{batch} image(s) 3x{size}x{size}"
    targets = detection_targets(model, batch, size, size)
    kinds = ", ".join(k for k in targets[0] if k != "boxes")
    return (images, targets), f"{batch} image(s) 3x{size}x{size}, targets (one box, {kinds})"


def detection_loss(output: Any) -> torch.Tensor:
    """The sum of the losses a detection model returns in training mode (a dict of scalars)."""
    if isinstance(output, dict) and output and all(isinstance(v, torch.Tensor) and v.numel() == 1
                                                   for v in output.values()):
        return sum(output.values())
    from ..capture import default_loss

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


def load_timm(name: str, opts: SpecOptions) -> Loaded:
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

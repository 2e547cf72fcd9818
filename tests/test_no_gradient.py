"""No trainable parameter left out silently: parameters without a gradient are reported, and hf:
vision-language and speech models get every input they need.

Ground truth: the same model with real weights, one real CPU training step on the same inputs
(``p.grad is None`` after ``backward()``); a real forward of a vision-language model also checks
that the image tokens match the image features (transformers raises otherwise).
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import zoo
from estimator import estimate
from estimator.specs import detection_loss, detection_targets, load_spec


def _real_no_grad(model: nn.Module, inputs: dict, loss_fn=None) -> tuple[set[str], int]:
    """Names of trainable parameters without a gradient after a real step, and the gradient bytes."""
    out = model(**inputs) if isinstance(inputs, dict) else model(*inputs) if isinstance(inputs, tuple) else model(inputs)
    loss = loss_fn(out) if loss_fn is not None else (out.loss if hasattr(out, "loss") else out)
    loss.backward()
    params = dict(model.named_parameters())
    missing = {n for n, p in params.items() if p.requires_grad and p.grad is None}
    return missing, sum(p.grad.numel() * p.grad.element_size() for p in params.values() if p.grad is not None)


def _reported(report) -> set[str]:
    return {name for row in report.tally.no_gradient for name in row["params"]}


def test_unused_parameters_are_reported_with_count_bytes_module_and_a_warning(caplog):
    model, inputs, loss_fn = zoo.unused_param()
    with caplog.at_level(logging.WARNING, logger="estimator"):
        report = estimate(model, inputs, loss_fn=loss_fn, device="cpu")
    teacher = dict(model.teacher.named_parameters())
    # every parameter of the module without a gradient, with its element count and bytes
    assert report.tally.no_gradient == [{
        "module": "teacher", "type": "Linear", "params": [f"teacher.{n}" for n in teacher],
        "count": sum(p.numel() for p in teacher.values()),
        "bytes": sum(p.numel() * p.element_size() for p in teacher.values())}]
    assert report.to_dict()["no_gradient"] == report.tally.no_gradient
    real, real_inputs, _ = zoo.unused_param()
    missing, _ = _real_no_grad(real, real_inputs)
    assert _reported(report) == missing
    warnings = [r.getMessage() for r in caplog.records if "no gradient" in r.getMessage()]
    assert len(warnings) == 1 and "teacher" in warnings[0] and f"{report.tally.no_gradient[0]['count']:,}" in warnings[0]
    assert "teacher" in report.render() and "no gradient" in report.render()
    # inference: no parameter gets a gradient, and that is not a finding
    assert estimate(model, inputs, device="cpu", mode="inference").tally.no_gradient == []


def test_models_whose_parameters_all_get_gradients_report_none():
    model, inputs, loss_fn = zoo.gpt()
    assert estimate(model, inputs, loss_fn=loss_fn, device="cpu").tally.no_gradient == []


# -- hf: vision-language and speech models -----------------------------------------------------------

LLAVA = ["text_config.num_hidden_layers=1", "text_config.hidden_size=32", "text_config.intermediate_size=64",
         "text_config.num_attention_heads=2", "text_config.num_key_value_heads=1", "text_config.vocab_size=128",
         "image_token_id=127", "vision_config.num_hidden_layers=2", "vision_config.hidden_size=32",
         "vision_config.intermediate_size=64", "vision_config.num_attention_heads=2", "vision_config.patch_size=8",
         "vision_config.projection_dim=32"]
QWEN2_VL = ["text_config.num_hidden_layers=1", "text_config.hidden_size=32", "text_config.intermediate_size=64",
            "text_config.num_attention_heads=2", "text_config.num_key_value_heads=1", "text_config.vocab_size=160",
            'text_config.rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}',
            "image_token_id=151", "video_token_id=152", "vision_start_token_id=153", "vision_end_token_id=154",
            "vision_config.depth=1", "vision_config.embed_dim=32", "vision_config.hidden_size=32",
            "vision_config.num_heads=2"]


def _real_copy(loaded):
    """The model a SPEC built (on meta), built again with real random weights from its configuration."""
    torch.manual_seed(0)
    return type(loaded.model)(loaded.config)


GEMMA3 = ["text_config.num_hidden_layers=1", "text_config.hidden_size=32", "text_config.intermediate_size=64",
          "text_config.num_attention_heads=2", "text_config.num_key_value_heads=1", "text_config.head_dim=16",
          "text_config.vocab_size=300", "image_token_id=299", "boi_token_id=297", "eoi_token_id=298",
          "vision_config.num_hidden_layers=1", "vision_config.hidden_size=32", "vision_config.intermediate_size=64",
          "vision_config.num_attention_heads=2", "vision_config.patch_size=8", "mm_tokens_per_image=4"]


@pytest.mark.parametrize("spec,sets,size,cls", [
    ("hf:llava", LLAVA, 32, "LlavaForConditionalGeneration"),
    ("hf:gemma3", GEMMA3, 32, "Gemma3ForConditionalGeneration"),  # a pooled tower: the configuration's count
    ("hf:qwen2_vl", QWEN2_VL, 56, "Qwen2VLForConditionalGeneration"),
])
def test_vision_language_models_get_images_and_image_tokens(spec, sets, size, cls):
    pytest.importorskip("transformers")
    loaded = load_spec(spec, overrides=sets, image_size=size, seq=40, batch=2)
    assert type(loaded.model).__name__ == cls and hasattr(loaded.model, "lm_head")
    inputs = loaded.inputs
    assert {"input_ids", "pixel_values", "labels"} <= set(inputs)
    # A real step on the same inputs: transformers checks that the image tokens match the image
    # features of an image of --image-size (it raises otherwise); what gets no gradient there is what
    # the estimate reports (LLaVA reads the vision tower's second-to-last layer, so the last layer and
    # the post-layernorm get none, in a real run too).
    missing, grad_bytes = _real_no_grad(_real_copy(loaded), inputs)
    report = estimate(loaded.model, inputs, device="cpu")
    assert _reported(report) == missing
    assert report.tally.gradients_bytes == grad_bytes
    vision = next(p for p, _ in loaded.model.named_modules() if p.endswith(("vision_tower", "visual")))
    rows = {r.path: r for r in report.module_rows(depth=2)}
    assert rows[vision].flops_forward > 0 and rows[vision].flops_backward > 0


def test_image_size_sets_the_vision_towers_size_and_the_number_of_image_tokens():
    pytest.importorskip("transformers")
    counts = {}
    for size in (32, 64):
        loaded = load_spec("hf:llava", overrides=LLAVA, image_size=size, seq=80)
        assert tuple(loaded.inputs["pixel_values"].shape) == (1, 3, size, size)
        counts[size] = int((loaded.inputs["input_ids"] == 127).sum())
    assert counts == {32: (32 // 8) ** 2, 64: (64 // 8) ** 2}  # (size / patch 8)^2 patches, CLS dropped
    with pytest.raises(Exception, match="leaves no text after the 64 image tokens"):
        load_spec("hf:llava", overrides=LLAVA, image_size=64, seq=64)
    with pytest.raises(Exception, match="multiples of 28 pixels"):
        load_spec("hf:qwen2_vl", overrides=QWEN2_VL, image_size=50, seq=64)


def test_speech_encoders_get_audio_and_their_ctc_head():
    pytest.importorskip("transformers")
    sets = ["num_hidden_layers=1", "hidden_size=32", "num_attention_heads=2", "intermediate_size=64",
            "conv_dim=[16,16,16,16,16,16,16]", "num_conv_pos_embeddings=16", "vocab_size=32",
            "layerdrop=0.0"]  # layer drop skips a random layer per step: no fixed answer to compare
    loaded = load_spec("hf:wav2vec2", overrides=sets, seq=4000, batch=2)
    assert type(loaded.model).__name__ == "Wav2Vec2ForCTC"
    assert tuple(loaded.inputs["input_values"].shape) == (2, 4000)
    missing, grad_bytes = _real_no_grad(_real_copy(loaded), loaded.inputs)
    report = estimate(loaded.model, loaded.inputs, device="cpu")
    assert report.capture.loss_source == "output.loss"
    assert _reported(report) == missing and report.tally.gradients_bytes == grad_bytes


class _Heads(nn.Module):
    """A stand-in for torchvision's RoIHeads: Mask R-CNN and Keypoint R-CNN heads."""

    def __init__(self, mask: bool, keypoints: int | None):
        super().__init__()
        self.mask, self.keypoints = mask, keypoints
        if keypoints:
            self.keypoint_predictor = nn.Module()
            self.keypoint_predictor.kps_score_lowres = nn.ConvTranspose2d(8, keypoints, 4)

    def has_mask(self):
        return self.mask

    def has_keypoint(self):
        return self.keypoints is not None


@pytest.mark.parametrize("mask,keypoints", [(False, None), (True, None), (False, 17)])
def test_detection_targets_have_what_each_torchvision_head_needs(mask, keypoints):
    model = nn.Module()
    model.roi_heads = _Heads(mask, keypoints)
    targets = detection_targets(model, batch=3, height=64, width=96)
    assert len(targets) == 3
    for t in targets:
        x1, y1, x2, y2 = t["boxes"][0].tolist()
        assert 0 <= x1 < x2 <= 96 and 0 <= y1 < y2 <= 64 and t["labels"].tolist() == [1]
        assert ("masks" in t) == mask and ("keypoints" in t) == bool(keypoints)
        if mask:
            assert t["masks"].shape == (1, 64, 96) and t["masks"].sum() > 0
        if keypoints:
            assert t["keypoints"].shape == (1, keypoints, 3)
    losses = {"loss_classifier": torch.tensor(1.5), "loss_box_reg": torch.tensor(0.25)}
    assert detection_loss(losses).item() == 1.75


def test_torchvision_detection_models_train_with_synthetic_targets():
    try:
        import torchvision.extension
        from torchvision.models import detection  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - not installed, or built for another torch
        pytest.skip(f"torchvision not usable here: {exc}")
    if not torchvision.extension._has_ops():  # PyPI's wheel beside the CPU torch: Faster R-CNN's RoI ops
        pytest.skip("torchvision's C++ operators (roi_align) do not load beside this torch")
    loaded = load_spec("torchvision:fasterrcnn_mobilenet_v3_large_320_fpn", image_size=320,
                       overrides=["weights_backbone=None"])
    images, targets = loaded.inputs
    assert len(images) == 1 and set(targets[0]) == {"boxes", "labels"}
    report = estimate(loaded.model, loaded.inputs, loss_fn=loaded.loss_fn, device="cpu")
    assert report.tally.flops["backward"] > 0

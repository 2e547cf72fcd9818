"""Consistency checks of vision-language models run on the estimate's trace as in a real step (issue 25
item 9): the image token ids are real tensors whose values the capture keeps, so transformers' check
that the image tokens match the image features is evaluated, not switched off.  A PaliGemma whose
projector's width differs from the language model's is refused, as its real step fails; a consistent one
is estimated.  The truth is the real step of the same configuration, run in the test."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from estimator import estimate  # noqa: E402
from estimator.errors import UserError  # noqa: E402
from estimator.specs import load_spec  # noqa: E402
from sweep import materialize  # noqa: E402

pytestmark = pytest.mark.hf

SMALL = {"text_config.num_hidden_layers": 1, "text_config.hidden_size": 32, "text_config.intermediate_size": 64,
         "text_config.num_attention_heads": 2, "text_config.num_key_value_heads": 1, "text_config.head_dim": 16,
         "vision_config.num_hidden_layers": 1, "vision_config.hidden_size": 32, "vision_config.intermediate_size": 64,
         "vision_config.num_attention_heads": 2, "vision_config.image_size": 56, "vision_config.patch_size": 14}


def _real_forward_error(overrides: dict) -> Exception | None:
    loaded = load_spec("hf:paligemma", batch=1, seq=24, overrides=overrides)
    model = materialize(loaded.model)  # random weights; the constructor's buffers kept
    inputs = {k: (torch.zeros(v.shape, dtype=v.dtype) if v.is_meta else v) for k, v in loaded.inputs.items()}
    try:
        model(**inputs)
    except Exception as exc:  # noqa: BLE001 - transformers' own check
        return exc
    return None


@pytest.mark.parametrize("projection", [32, 48])
def test_image_tokens_and_features_are_checked_as_the_real_step_checks_them(projection):
    overrides = {**SMALL, "projection_dim": projection, "vision_config.projection_dim": projection}
    real_error = _real_forward_error(overrides)
    loaded = load_spec("hf:paligemma", batch=1, seq=24, overrides=overrides)
    if projection == 32:  # the projector's width is the language model's: both run
        assert real_error is None
        assert estimate(loaded.model, loaded.inputs, device="cpu").to_dict()["memory"]["activations"] > 0
    else:  # 48 != 32: the real step raises transformers' check, and so does the estimate, in one line
        assert isinstance(real_error, ValueError) and "do not match" in str(real_error)
        with pytest.raises(UserError, match="Image features and image tokens do not match") as info:
            estimate(loaded.model, loaded.inputs, device="cpu")
        assert "\n" not in str(info.value)

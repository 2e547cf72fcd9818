"""A fixed subset of the zoo sweep (``benchmarks/zoo_sweep.py``), one model type per architecture family:
built by the ``hf:`` loader at the sweep's size (2 layers, width 64, 4 heads; batch 2 x 32 tokens or the
model's own image size), estimated on the CPU target (fp32, AdamW) and compared with a real CPU step of
the same model measured in the same test (``tests/sweep.py``: parameters, buffers, gradients, AdamW
state, activations held at backward, matmul FLOPs forward and backward).  Every number must be equal.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from sweep import sweep_one  # noqa: E402

pytestmark = pytest.mark.hf

FAMILIES = {
    "gpt2": "decoder, learned positions, tied head",
    "falcon": "decoder, parallel attention and MLP",
    "mixtral": "decoder, mixture of experts",
    "opt": "decoder with LayerDrop's random draw and a float all-ones mask",
    "bert": "encoder, masked LM",
    "deberta-v2": "encoder, disentangled attention",
    "t5": "encoder-decoder, relative position buckets",
    "bigbird_pegasus": "encoder-decoder, block-sparse attention",
    "whisper": "speech encoder-decoder (log-mel features)",
    "vit": "vision transformer, image classification",
    "convnext": "convolutional, image classification",
    "dpt": "dense prediction (depth) on a ViT backbone",
    "chinese_clip": "dual encoder, contrastive loss",
    "blip": "image captioning (image + caption tokens)",
    "clap_text_model": "a sub-model no Auto class takes",
}


@pytest.mark.parametrize("model_type", list(FAMILIES), ids=list(FAMILIES))
def test_every_number_equals_a_real_step(model_type):
    rec = sweep_one(model_type)
    assert rec["outcome"] == "exact", (FAMILIES[model_type], {k: rec.get(k) for k in
                                       ("outcome", "errors", "message", "truth_error", "level", "inputs")})
    assert rec["estimate_s"] < 10  # the bound on the 2-core machine, at the sweep's sizes

"""The ``hf:`` loader on model types the Auto classes do not take, and on inputs it must build or name
(issue 25 items 7 and 8).  Shapes come from the built model's own forward signature and configuration."""

from __future__ import annotations

import inspect

import pytest
import torch

pytest.importorskip("transformers")

from estimator import estimate  # noqa: E402
from estimator.errors import UserError  # noqa: E402
from estimator.specs import load_spec  # noqa: E402

pytestmark = pytest.mark.hf


@pytest.mark.parametrize("model_type,cls", [
    ("clap_text_model", "ClapTextModel"),  # sub-models: in no Auto mapping the loader used
    ("groupvit_vision_model", "GroupViTVisionModel"),
    ("owlv2_text_model", "Owlv2TextModel"),
    ("chmv2", "CHMv2ForDepthEstimation"),  # a task mapping beyond the ones the loader tried first
])
def test_types_without_an_auto_class_are_built_with_inputs_their_forward_takes(model_type, cls):
    loaded = load_spec(f"hf:{model_type}", batch=2, overrides={})
    assert type(loaded.model).__name__ == cls
    params = inspect.signature(loaded.model.forward).parameters
    assert set(loaded.inputs) <= set(params)  # no labels for a tower with no loss of its own


def test_a_head_the_configuration_cannot_make_gives_the_base_model_and_says_so():
    """Wav2Vec2-BERT's default configuration has no vocabulary size, so its CTC head (the class the loader
    picks for speech encoders) cannot be built: the base encoder is estimated, on the default loss, and the
    description says why; every number equals a real step of the same model."""
    from sweep import COMPARED, _get, materialize, real_inputs, shrink_overrides

    from groundtruth import measure

    shrunk = {k: v for k, v in shrink_overrides("wav2vec2-bert", 2).items() if k != "vocab_size"}  # (the sweep's)
    overrides = {**shrunk, "max_source_positions": 32}  # 64 frames, not 10,000
    loaded = load_spec("hf:wav2vec2-bert", batch=2, overrides=overrides)
    assert type(loaded.model).__name__ == "Wav2Vec2BertModel"
    assert "the base model: AutoModelForCTC cannot be built" in loaded.description
    assert "vocabulary size" in loaded.description and "the default loss" in loaded.description
    d = estimate(loaded.model, loaded.inputs, loss_fn=loaded.loss_fn, device="cpu", precision="fp32").to_dict()
    truth = measure(materialize(loaded.model), real_inputs(loaded.inputs), "adamw", loss_fn=loaded.loss_fn)
    assert {name: _get(d, path) for name, (path, _) in COMPARED.items()} == \
        {name: truth[key] for name, (_, key) in COMPARED.items()}


def test_a_model_with_no_forward_of_its_own_is_refused_naming_its_parts():
    """Bark is a pipeline of sub-models that transformers runs only through generate(): no forward, so no
    training step; the refusal names the part a configuration type exists for (its codec, EnCodec)."""
    with pytest.raises(UserError) as info:
        load_spec("hf:bark", batch=1)
    msg = str(info.value)
    assert "BarkModel has no forward of its own" in msg and "hf:encodec" in msg and "\n" not in msg


def test_a_video_text_dual_encoder_gets_its_frames_from_the_vision_configuration():
    """X-CLIP's frames are in its vision tower's configuration (num_frames 8): batch x 8 x 3 x 224 x 224 beside
    the tokens (a 4-D image fails in its forward), and the estimate of that batch runs."""
    loaded = load_spec("hf:xclip", batch=2, overrides={"text_config.num_hidden_layers": 1,
                                                       "vision_config.num_hidden_layers": 1})
    assert tuple(loaded.inputs["pixel_values"].shape) == (2, 8, 3, 224, 224)
    assert "(video)" in loaded.description
    d = estimate(loaded.model, loaded.inputs, device="cpu").to_dict()
    assert d["memory"]["activations"] > 0 and not d["unsupported_ops"]


def test_a_forward_that_needs_what_hf_cannot_make_is_refused_naming_its_inputs():
    with pytest.raises(UserError) as info:
        load_spec("hf:pi0", batch=1)  # a robot policy: its action embeddings
    msg = str(info.value)
    assert "'action_embeds'" in msg and "SPEC file" in msg and "\n" not in msg


@pytest.mark.parametrize("model_type,shape", [("patchtst", (2, 32, 1)), ("timesfm2_5", (2, 32))])
def test_a_time_series_model_gets_past_values_in_the_layout_its_forward_runs_on(model_type, shape):
    """PatchTST takes series x steps x channels (1 channel in its default configuration), TimesFM 2.5 univariate
    series x steps (the channels layout fails in its forward): --seq 32 steps, --batch 2 series; neither computes a
    loss from past values alone, and the description says the default loss is used."""
    loaded = load_spec(f"hf:{model_type}", batch=2, seq=32, overrides={"num_hidden_layers": 1})
    assert tuple(loaded.inputs["past_values"].shape) == shape
    assert "the default loss" in loaded.description


def test_a_vision_tower_fed_patches_gets_them_in_the_layout_its_forward_runs_on():
    """Qwen2.5-VL's tower alone (refused before this loader made patches): 448 px in patches of 14 is
    32 x 32 = 1,024 patches of 3 x 2 x 14 x 14 = 1,176 values, one [1, 32, 32] grid row."""
    loaded = load_spec("hf:qwen2_5_vl_vision", batch=1, overrides={"depth": 1, "hidden_size": 64,
                                                                   "intermediate_size": 128, "out_hidden_size": 64})
    assert tuple(loaded.inputs["hidden_states"].shape) == (1024, 1176)
    assert loaded.inputs["grid_thw"].tolist() == [[1, 32, 32]]
    assert "(flattened)" in loaded.description
    # --image-size reaches the tower alone (its configuration has no image_size): 112 px = 8 x 8 patches of 14
    small = load_spec("hf:qwen2_5_vl_vision", batch=2, image_size=112, overrides={
        "depth": 1, "hidden_size": 64, "intermediate_size": 128, "out_hidden_size": 64})
    assert tuple(small.inputs["hidden_states"].shape) == (2 * 8 * 8, 1176)
    assert small.inputs["grid_thw"].tolist() == [[1, 8, 8]] * 2
    with pytest.raises(Exception, match="multiples of 28 pixels"):  # patch 14 x merge 2
        load_spec("hf:qwen2_5_vl_vision", image_size=100, overrides={"depth": 1, "hidden_size": 64,
                                                                     "intermediate_size": 128, "out_hidden_size": 64})


@pytest.mark.parametrize("model_type,overrides,needed", [
    ("vilt", {"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
              "image_size": 64}, {"input_ids", "pixel_values"}),
    ("lxmert", {"l_layers": 1, "x_layers": 1, "r_layers": 1, "hidden_size": 32, "intermediate_size": 64,
                "num_attention_heads": 2, "visual_feat_dim": 64}, {"input_ids", "visual_feats", "visual_pos"}),
    ("vivit", {"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
               "num_frames": 4, "image_size": 32}, {"pixel_values"}),
])
def test_side_inputs_are_built_and_the_step_runs(model_type, overrides, needed):
    loaded = load_spec(f"hf:{model_type}", batch=1, overrides=overrides)
    assert needed <= set(loaded.inputs)
    if model_type == "vivit":  # video: batch x frames x channels x H x W, frames from the configuration
        assert tuple(loaded.inputs["pixel_values"].shape) == (1, 4, 3, 32, 32)
    d = estimate(loaded.model, loaded.inputs, device="cpu").to_dict()
    assert d["memory"]["activations"] > 0 and not d["unsupported_ops"]


class NeedsMask(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, mask=None, return_dict=None):
        return (self.lin(x) * mask).sum()  # fails when mask is not given


def test_a_failed_pass_names_the_inputs_not_given():
    with pytest.raises(UserError) as info:
        estimate(NeedsMask(), torch.randn(2, 4), device="cpu")
    msg = str(info.value)
    assert "its forward also takes mask;" in msg and "return_dict" not in msg and "\n" not in msg


TOWERS = {"text_config.num_hidden_layers": 1, "text_config.hidden_size": 32, "text_config.intermediate_size": 64,
          "text_config.num_attention_heads": 2, "vision_config.num_hidden_layers": 1, "vision_config.hidden_size": 32,
          "vision_config.intermediate_size": 64, "vision_config.num_attention_heads": 2,
          "vision_config.image_size": 32, "vision_config.patch_size": 16}


@pytest.mark.parametrize("model_type,needed", [
    ("chinese_clip", {"input_ids", "pixel_values", "return_loss"}),  # a dual encoder and its contrastive loss
    ("blip", {"pixel_values", "input_ids", "labels"}),  # image captioning: the image and the caption's tokens
])
def test_two_tower_models_get_both_inputs(model_type, needed):
    loaded = load_spec(f"hf:{model_type}", batch=1, seq=8, overrides=TOWERS)
    assert needed <= set(loaded.inputs)
    assert tuple(loaded.inputs["pixel_values"].shape) == (1, 3, 32, 32)  # the vision tower's image size
    d = estimate(loaded.model, loaded.inputs, device="cpu").to_dict()
    assert d["memory"]["activations"] > 0


def test_in_context_segmentation_gets_its_prompt_image_and_mask():
    # SegGPT's configuration size (896 x 448) is the prompt stacked on the input: each is 448 x 448
    loaded = load_spec("hf:seggpt", batch=1, overrides={"num_hidden_layers": 1, "hidden_size": 32,
                                                        "num_attention_heads": 2, "mlp_dim": 64})
    h, w = loaded.config.image_size
    for name in ("pixel_values", "prompt_pixel_values", "prompt_masks"):
        assert tuple(loaded.inputs[name].shape) == (1, 3, h // 2, w), name
    d = estimate(loaded.model, loaded.inputs, device="cpu").to_dict()
    assert d["memory"]["activations"] > 0


def test_set_reaches_a_sub_configuration_of_a_sub_configuration():
    # T5Gemma 2's encoder holds a text and a vision tower: --set encoder.text_config.num_hidden_layers=1
    loaded = load_spec("hf:t5gemma2", batch=1, seq=8, overrides={"encoder.text_config.num_hidden_layers": 1,
                                                                  "encoder.vision_config.num_hidden_layers": 1,
                                                                  "decoder.num_hidden_layers": 1})
    cfg = loaded.config
    assert (cfg.encoder.text_config.num_hidden_layers, cfg.encoder.vision_config.num_hidden_layers,
            cfg.decoder.num_hidden_layers) == (1, 1, 1)
    with pytest.raises(UserError, match="close matches: num_hidden_layers"):
        load_spec("hf:t5gemma2", overrides={"encoder.text_config.num_hiden_layers": 1})
    with pytest.raises(UserError, match="has no sub-configuration 'txt_config'"):
        load_spec("hf:t5gemma2", overrides={"encoder.txt_config.num_hidden_layers": 1})


def test_speech2text_gets_frames_by_mels_and_xmod_its_first_language():
    """Speech2Text's subsampler transposes frames x mels (its configuration's input_feat_per_channel x
    input_channels bins), where Whisper's first convolution takes mels x frames; X-MOD's forward raises without a
    language, so the loader sets its configuration's first and says so.  Loading only: both are exact against real
    steps in the sweep (benchmarks/zoo_sweep.jsonl)."""
    s2t = load_spec("hf:speech_to_text", batch=2, seq=8, overrides={"encoder_layers": 1, "decoder_layers": 1})
    mels = s2t.config.input_feat_per_channel * s2t.config.input_channels
    features = s2t.inputs["input_features"]
    assert features.shape[0] == 2 and features.shape[2] == mels and features.shape[1] != mels
    xmod = load_spec("hf:xmod", batch=2, seq=8, overrides={"num_hidden_layers": 1})
    first = xmod.config.languages[0]
    assert f"language {first}" in xmod.description and xmod.config.default_language == first


def test_vitpose_images_take_the_backbones_size():
    """ViTPose's configuration keeps the image size (256 x 192, height x width) in its ViT backbone's; a square
    image of the default size fails its forward ("doesn't match model").  Loading only: exact against a real
    step in the sweep (benchmarks/zoo_sweep.jsonl)."""
    vitpose = load_spec("hf:vitpose", batch=2)  # built on the meta device: the defaults cost nothing
    height, width = vitpose.config.backbone_config.image_size
    assert tuple(vitpose.inputs["pixel_values"].shape) == (2, 3, height, width) and height != width


def test_a_video_tracker_that_needs_an_inference_session_is_refused_as_having_no_training_step():
    """SAM 3's video tracker runs only on an inference session its processor builds frame by frame: no forward
    a training step could call, refused in one line that says so."""
    with pytest.raises(UserError) as info:
        load_spec("hf:sam3_video", batch=1)
    msg = str(info.value)
    assert "runs only inside an inference session" in msg and "no training step" in msg and "\n" not in msg


def test_gemma4_vision_patches_come_with_their_positions_padded_as_its_processor_pads_them():
    """Gemma 4's tower takes patches and their (row, column); its processor pads to max_soft_tokens x kernel^2
    patches at position -1 (hf_flat_patches.GEMMA4_SOFT_TOKENS): the largest square of whole pooled cells is
    real, the rest padding, and the estimate of that batch runs."""
    from estimator.specs.hf_flat_patches import GEMMA4_SOFT_TOKENS

    loaded = load_spec("hf:gemma4_vision", batch=2, overrides={"num_hidden_layers": 1, "hidden_size": 32,
                                                               "intermediate_size": 64, "num_attention_heads": 2,
                                                               "num_key_value_heads": 2, "head_dim": 16})
    cfg = loaded.config
    kernel = cfg.pooling_kernel_size
    most = GEMMA4_SOFT_TOKENS * kernel * kernel
    positions = loaded.inputs["pixel_position_ids"]
    assert tuple(loaded.inputs["pixel_values"].shape) == (2, most, 3 * cfg.patch_size ** 2)
    real = (positions[0] >= 0).all(-1)
    side = int(positions[0, real, 0].max()) + 1  # rows of real patches
    assert int(real.sum()) == side * side and side % kernel == 0 and (side + kernel) ** 2 > most
    d = estimate(loaded.model, loaded.inputs, device="cpu").to_dict()
    assert d["memory"]["activations"] > 0 and not d["unsupported_ops"]

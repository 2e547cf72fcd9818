"""One model type of the transformers zoo, shrunk, estimated and measured: the core of the zoo sweep.

:func:`sweep_one` builds ``hf:MODEL_TYPE`` through the estimator's own loader (the configuration's
defaults, shrunk by :func:`shrink_overrides`: 2 layers, width 64, 4 heads), runs :func:`estimator.estimate`
on the CPU target (fp32, AdamW) and a real CPU training step of the same model with random weights
(:func:`groundtruth.measure`: saved-tensor hooks, real ``.grad``, real optimizer state, the fixed
``FlopCounterMode``), and compares every number of ``test_accuracy.GROUPS``.  It never raises: the
outcome is one of

- ``exact``: every number equal;
- ``differs``: the estimate ran and some number differs (the relative error of each is kept);
- ``refused``: the estimator said why in one line (a :class:`~estimator.errors.UserError`);
- ``crash``: the estimator raised anything else (a defect);
- ``no-truth``: the estimate ran but the real step does not (transformers itself fails on these inputs);
- ``unbuilt``: neither the shrunk nor the default configuration builds.

Used by ``benchmarks/zoo_sweep.py`` (every type, one subprocess each) and ``tests/test_zoo_sweep.py``
(a fixed subset, one per family).
"""

from __future__ import annotations

import copy
import re
import time
import traceback
from typing import Any

import torch

from groundtruth import measure

# (estimate path in to_dict(), ground-truth key), as test_accuracy compares them
COMPARED = {
    "params": (("params", "total"), "params_total"),
    "param_bytes": (("memory", "parameters"), "param_bytes"),
    "buffer_bytes": (("memory", "buffers"), "buffer_bytes"),
    "gradients": (("memory", "gradients"), "grad_bytes"),
    "optimizer_state": (("memory", "optimizer_state"), "optimizer_state_bytes"),
    "activations": (("memory", "activations"), "activation_bytes"),
    "flops_forward": (("flops", "matmul_forward"), "matmul_forward"),
    "flops_backward": (("flops", "matmul_backward"), "matmul_backward"),
}

# Sizes the sweep sets wherever a configuration (or one of its sub-configurations) has the field as an
# integer: two layers of width 64 with 4 heads of 16, a 128-wide MLP.
LAYERS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
          "num_encoder_layers", "num_decoder_layers", "depth")
WIDTHS = {"hidden_size": 64, "d_model": 64, "n_embd": 64, "embed_dim": 64, "intermediate_size": 128,
          "ffn_dim": 128, "d_ff": 128, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "n_inner": 128,
          "num_attention_heads": 4, "n_head": 4, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 16, "rotary_dim": 16, "moe_intermediate_size": 128,
          "shared_expert_intermediate_size": 128, "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4,
          "num_experts_per_tok": 2, "num_experts_per_token": 2, "kv_lora_rank": 32, "q_lora_rank": 32,
          "qk_nope_head_dim": 16,
          "qk_rope_head_dim": 16, "v_head_dim": 16, "encoder_hidden_size": 64, "projection_dim": 64,
          "out_hidden_size": 64, "word_embed_proj_dim": 64, "num_heads": 4,
          # Mamba-2 mixers of hybrid models (Bamba, GraniteMoeHybrid, Falcon-H1, Jamba): heads x head size =
          # expand (2) x hidden size (64) = 128 (Falcon-H1: its own mamba_d_ssm, 8 x 8)
          "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_ssm": 64, "mamba_d_state": 16, "mamba_chunk_size": 16,
          "mamba_dt_rank": 16,
          # Gemma 3n's and Gemma 4's per-layer token embeddings (vocabulary x layers x this width)
          "hidden_size_per_layer_input": 16}
# Fields some default configurations leave None though their model reads them (Dots1's expert counts,
# DeepSeek-V2's routing groups, ESM's vocabulary, Autoformer's horizon): set at levels 1 and 2 (not
# sliding_window: None is "no window" to most families)
UNSET = {"n_shared_experts": 1, "n_routed_experts": 4, "num_local_experts": 4, "num_experts_per_tok": 2,
         "n_group": 1, "topk_group": 1, "vocab_size": 64, "prediction_length": 24}
# Types whose smallest buildable configuration is not the sweep's rule: Zamba ties the shared attention of
# layer 1 to the other hybrid layers' (``tie_weights_keys``), so it needs two hybrid layers (1 and 3 of 4);
# Gemma 3's defaults pool 14 x 14 patches (224 / 16) to 256 = 16 x 16 tokens (a pooling kernel of 0), so
# 49 = 7 x 7 tokens (a kernel of 2)
SHAPED = {"zamba": {"num_hidden_layers": 4, "attn_layer_period": 2, "attn_layer_offset": 1},
          "gemma3": {"mm_tokens_per_image": 49}, "shieldgemma2": {"mm_tokens_per_image": 49},
          # ESM-C's attention has no grouped key/value heads
          "esmc": {"num_key_value_heads": 4},
          # Mamba-2's heads x head size = expand (2) x hidden size (64)
          "mamba2": {"num_heads": 8},
          # Fun-ASR-Nano's adaptor is a quarter of its text model's width
          "fun_asr_nano": {"adaptor_config.intermediate_size": 16},
          # Qwen2.5-Omni's talker takes the thinker's states (3,584 wide by default)
          "qwen2_5_omni_talker": {"embedding_size": 64},
          # depth models that read 4 stages of their ViT backbone (6, 12, 18 and 24 of 24 layers): 4 layers, so that
          # the loader moves them to 1-4
          "zoedepth": {"backbone_config.num_hidden_layers": 4}, "chmv2": {"backbone_config.num_hidden_layers": 4},
          # Mistral 4's head is its two parts (16 + 16), half of it rotated (the default's partial_rotary_factor)
          "mistral4": {"head_dim": 32},
          # ERNIE 4.5-VL rotates height, width and time on sections of a head's 8 frequencies (its defaults: 22,
          # 22 and 20 of 64), height and width alike
          "ernie4_5_vl_moe_text": {"rope_parameters": {"rope_theta": 500000.0, "rope_type": "default",
                                                       "mrope_section": [3, 3, 2]}},
          "ernie4_5_vl_moe": {"text_config.rope_parameters": {"rope_theta": 500000.0, "rope_type": "default",
                                                              "mrope_section": [3, 3, 2]}},
          # Pixtral towers' default images are 1,540 px (3,025 tokens each, 3.7 GB of real attention): 224 px
          "mistral3": {"vision_config.image_size": 224}, "lighton_ocr": {"vision_config.image_size": 224},
          # V-JEPA 2's clips: 16 frames of 128 px, not 64 of 256
          "vjepa2": {"frames_per_clip": 16, "crop_size": 128},
          # vision adapters that take the tower's merged patches: MuseGlimmer's 2 x 2 of 64 (its defaults' 6,144 of
          # 1,536), Kimi K2.5's projection of the tower's width
          "muse_glimmer": {"out_hidden_size": 256, "projector_hidden_size": 64},
          "kimi_k25": {"projection_hidden_size": 64},
          # Wav2Vec2-BERT's default input is twice its 5,000 positions (the loader's rule for Whisper-style encoders):
          # 200 s of 20 ms frames, 3.2 GB of real attention scores; 500 positions make it 1,000 frames
          "wav2vec2-bert": {"max_source_positions": 500},
          # LongCat-Flash's experts (512 routed and 256 zero-compute ones, 12 per token) and their widths
          "longcat_flash": {"moe_topk": 2, "zero_expert_num": 2, "expert_ffn_hidden_size": 128,
                            "ffn_hidden_size": 128, "qk_head_dim": 32},
          # RemBERT's embeddings (input and output) and Perceiver's latents
          "rembert": {"input_embedding_size": 64, "output_embedding_size": 64},
          "perceiver": {"d_latents": 64, "num_latents": 32, "num_self_attends_per_block": 2},
          # widths of their own names: xLSTM's embedding, XLM's (and FlauBERT's) embedding
          # (xLSTM at 128: its configuration rounds the key width, hidden x 0.5, up to 64 where its model does not)
          "xlstm": {"hidden_size": 128, "embedding_dim": 128}, "xlm": {"emb_dim": 64}, "flaubert": {"emb_dim": 64},
          # a default configuration that leaves the padding token unset where the forward reads it (ESM's
          # position ids): the value the published checkpoints use
          "esm": {"pad_token_id": 1},
          # Reformer trains only on sequences of prod(axial_pos_shape) tokens (64 x 64 by default), its axial
          # position embeddings summing to the hidden size: 4 x 8 = the sweep's 32 tokens, 16 + 48 = 64 wide
          "reformer": {"axial_pos_shape": [4, 8], "axial_pos_embds_dim": [16, 48]},
          # VipLLaVA concatenates 5 of its tower's hidden states (-2, -5, -8, -11 and 6 of 24 layers): 5 of the
          # 3 a 2-layer tower has
          "vipllava": {"vision_feature_layers": [-2, -1, 0, 1, 2]},
          # Step3p7's (and Step3p5's) text model has sliding-window layers and leaves the window unset (any window:
          # its cost at the sweep's 32 tokens is the full attention's)
          "step3p7": {"text_config.sliding_window": 512}, "step3p5": {"sliding_window": 512},
          # Idefics3's (and SmolVLM's) default image size, 224, is 7 patches of 32 a side, not a multiple of its pixel
          # shuffle (2)
          "idefics3": {"vision_config.image_size": 448}, "smolvlm": {"vision_config.image_size": 448},
          # fields the model reads and its configuration class does not declare (its defaults cannot build):
          # T5Gemma 2's text encoder's dropout, Pix2Struct's text initializer; LFM2-MoE leaves its layer kinds unset
          # (one convolution and one attention layer)
          "t5gemma2_text": {"+dropout_rate": 0.0}, "pix2struct_text_model": {"+initializer_range": 0.02},
          "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
          # CLAP's audio tower (Swin stages doubling 96 wide) ends 192 wide after the sweep's 2 stages, the width its
          # projection takes (its own tower alone, clap_audio_model, has no projection)
          "clap": {"audio_config.hidden_size": 192},
          # ModernVBERT's default image size, 224, is not a multiple of its pixel shuffle: 14 patches a side by 4,
          # where 512 gives 32
          "modernvbert": {"vision_config.image_size": 512},
          # Pix2Struct's text attention projects heads x d_kv back with a hidden x hidden weight: d_kv 64 / 4 heads
          "pix2struct": {"text_config.d_kv": 16},
          # Mllama's tower concatenates its output with intermediate layers' (intermediate_layers_indices, of 32
          # layers by default): layers 0 and 1 of the sweep's 2, 64 x 3 wide
          # Llama 4's vision adapter takes the pixel-shuffled patches (hidden / ratio^2 = 64 / 0.25) into a layer
          # of the tower's intermediate_size: 256, as the defaults' 1,408 x 4 = 5,632; its projections 64 wide
          "llama4": {"vision_config.intermediate_size": 256, "vision_config.projector_input_dim": 64,
                     "vision_config.projector_output_dim": 64, "vision_config.vision_output_dim": 64},
          "llama4_vision_model": {"intermediate_size": 256},
          # and its text model cross-attends to the image at layers 3, 8, ... of 40: at layer 1 of the sweep's 2 (else
          # no layer reads the tower and no gradient reaches it); tiles of 224 px, not 448
          "mllama": {"vision_config.intermediate_layers_indices": [0, 1], "vision_config.vision_output_dim": 192,
                     "text_config.cross_attention_layers": [1], "vision_config.image_size": 224},
          "mllama_vision_model": {"intermediate_layers_indices": [0, 1], "vision_output_dim": 192}}
SEQ, BATCH = 32, 2
MAX_TRUTH_PARAMS = 150_000_000  # a real AdamW step of more (x16 bytes) is too slow and large for the sweep


def _int_fields(cfg: Any) -> dict[str, int]:
    return {k: v for k, v in cfg.to_dict().items() if isinstance(v, int) and not isinstance(v, bool)}


def _subconfigs(cfg: Any) -> dict[str, Any]:
    own = vars(cfg)  # (not getattr: Diffusion Gemma's per-layer fields raise on global access)
    return {k: own[k] for k in cfg.to_dict() if hasattr(own.get(k), "to_dict") and not k.startswith("_")}


def shrink_overrides(model_type: str, level: int) -> dict[str, Any]:
    """``--set`` overrides for ``level`` 2 (layers and widths), 1 (layers only) or 0 (the defaults)."""
    from estimator.specs.hf import _hf_config, import_transformers

    if level == 0:
        return {}
    cfg, _ = _hf_config(import_transformers(), model_type, {})  # the loader's (composites: their default parts)
    out: dict[str, Any] = {}
    levels = [("", cfg)]
    for name, sub in _subconfigs(cfg).items():  # sub-configurations, and theirs (an encoder's text tower)
        levels.append((f"{name}.", sub))
        levels += [(f"{name}.{inner}.", c) for inner, c in _subconfigs(sub).items()]
    for prefix, c in levels:
        fields = _int_fields(c)
        unset = {k for k, v in c.to_dict().items() if v is None}
        out.update({prefix + key: value for key, value in UNSET.items() if key in unset})
        for key in LAYERS:
            if key == "num_layers" and isinstance(c.to_dict().get("depths"), list):
                continue  # Swin's stage count, derived from its depths (a backbone's stage names follow it)
            if fields.get(key, 0) > 2:
                out[prefix + key] = 2
        # (a timm tower keeps its own widths whatever its configuration's: Gemma 3n's MobileNetV5, FastVLM's FastViT)
        if level >= 2 and not isinstance(getattr(c, "architecture", None), str):
            for key, value in WIDTHS.items():
                if key in fields and fields[key] > value:
                    out[prefix + key] = value
                per_layer = c.to_dict().get(key)  # (Gemma 3n's MLP widths, one per layer of the shrunk stack)
                if isinstance(per_layer, list) and per_layer and all(isinstance(v, int) for v in per_layer):
                    layers = out.get(prefix + "num_hidden_layers", len(per_layer))
                    out[prefix + key] = [min(v, value) for v in per_layer[:layers]]
            depths = c.to_dict().get("depths")
            if isinstance(depths, list) and "num_filters" in fields and all(isinstance(d, int) for d in depths):
                # a convolutional codec's stages (VibeVoice's tokenizers: 32 filters doubling over 7 stages of 3-8
                # blocks): one block each, from 4 filters
                out.update({prefix + "depths": [1] * len(depths),
                            prefix + "num_filters": min(fields["num_filters"], 4)})
            if "kv_lora_rank" in fields and prefix + "num_attention_heads" in out:
                # multi-head latent attention (DeepSeek-V2 and its kin) has no grouped key/value heads
                out[prefix + "num_key_value_heads"] = out[prefix + "num_attention_heads"]
            rope = getattr(c, "rope_parameters", None)
            if isinstance(rope, dict) and rope and prefix + "num_attention_heads" in out and _uses_mrope(c):
                head = out.get(prefix + "head_dim") or fields.get("head_dim") \
                    or out.get(prefix + "hidden_size", 64) // out[prefix + "num_attention_heads"]
                sections = _mrope_sections(rope, head)
                # (its own sections where they fit; Qwen3.5 rotates a quarter of the head, 2 frequencies, and
                # interleaves its own sections, which it clips to the head)
                if sum(rope.get("mrope_section") or ()) != sum(sections) and min(sections) > 0:
                    out[prefix + "rope_parameters"] = {**rope, "mrope_section": sections}
    out.update(_vocabulary_with_special_tokens(cfg))
    return {**out, **SHAPED.get(model_type, {})}


def _vocabulary_with_special_tokens(cfg: Any) -> dict[str, int]:
    """A text vocabulary that holds the composite's own special tokens: many default configurations put the
    image token just past their text model's default vocabulary (LLaVA-NeXT 32000 of 32,000, Idefics2 32001,
    Janus 100581 of 32,000), where the real embedding fails; the published checkpoints' vocabularies hold them
    (llava-v1.6-vicuna-7b: 32,064)."""
    text = vars(cfg).get("text_config")
    vocab = getattr(text, "vocab_size", None)
    ids = [v for k, v in cfg.to_dict().items() if k.endswith(("token_id", "token_index")) and isinstance(v, int)
           and not isinstance(v, bool)]
    if not isinstance(vocab, int) or not ids or max(ids) < vocab:
        return {}
    return {"text_config.vocab_size": max(ids) + 1}


def _mrope_sections(rope: dict, head: int) -> list[int]:
    """Multimodal rotary sections (temporal, height, width) for the shrunk head: a head of ``head`` (WIDTHS'
    64 / 4 = 16) rotating a ``partial_rotary_factor`` of its dimensions has ``ceil(head x partial / 2)``
    frequencies (the modeling files' ``arange(0, dim, 2)``), split as the defaults' 16:24:24 (Qwen2-VL; full
    heads of 16: 2, 3, 3) with the remainder on the last (GLM-4V-MoE rotates half: 4 frequencies, 1, 1, 2)."""
    partial = float(rope.get("partial_rotary_factor") or 1.0)
    pairs = -(-int(head * partial) // 2)
    temporal = max(1, pairs // 4)
    height = max(1, (pairs - temporal) // 2)
    return [temporal, height, pairs - temporal - height]


def _uses_mrope(cfg: Any) -> bool:
    """Whether the configuration's model family splits its rotary frequencies into multimodal sections (its
    modeling file reads ``mrope_section``)."""
    import glob
    import os
    import sys

    module = sys.modules.get(type(cfg).__module__)
    folder = os.path.dirname(getattr(module, "__file__", "") or "")
    for path in glob.glob(os.path.join(folder, "modeling_*.py")) if folder else []:
        with open(path, encoding="utf-8") as f:
            if "mrope_section" in f.read():
                return True
    return False


def materialize(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose meta parameters are real random CPU tensors (tied ones kept tied); the
    buffers the constructor made (``position_ids``, rotary tables) keep their values."""
    m = copy.deepcopy(model)
    made: dict[int, torch.nn.Parameter] = {}
    gen = torch.Generator().manual_seed(0)
    for mod in m.modules():
        for name, p in list(mod._parameters.items()):
            if p is None or p.device.type != "meta":
                continue
            if id(p) not in made:
                data = torch.empty(p.shape, dtype=p.dtype)
                data.normal_(0, 0.02, generator=gen) if data.is_floating_point() else data.zero_()
                made[id(p)] = torch.nn.Parameter(data, requires_grad=p.requires_grad)
            mod._parameters[name] = made[id(p)]
        for name, b in list(mod._buffers.items()):
            if b is not None and b.device.type == "meta":
                mod._buffers[name] = torch.ones(b.shape, dtype=b.dtype) if name == "running_var" \
                    else torch.zeros(b.shape, dtype=b.dtype)
    return m


def without_layerdrop(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with LayerDrop off, the loop the estimate states it assumes (every layer runs): a real step
    with LayerDrop skips layers at random, so it is not the step the estimate describes."""
    for module in model.modules():
        for holder in (module, getattr(module, "config", None)):
            if holder is not None and isinstance(getattr(holder, "layerdrop", None), float):
                setattr(holder, "layerdrop", 0.0)
    return model


def real_inputs(inputs: Any) -> Any:
    import torch.utils._pytree as pytree

    made: dict[int, torch.Tensor] = {}  # one real tensor per meta tensor: inputs that share one stay shared

    def real(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.device.type != "meta":
            return t
        if id(t) not in made:
            made[id(t)] = torch.randn(t.shape, dtype=t.dtype) if t.is_floating_point() \
                else torch.zeros(t.shape, dtype=t.dtype)
        return made[id(t)]

    return pytree.tree_map(real, inputs)


def _get(d: dict, path: tuple) -> Any:
    for k in path:
        d = d[k]
    return d


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _load(load_spec, model_type: str, overrides: dict[str, Any]):
    """The loader's batch at a short sequence (token models; a vision-language model: its image tokens and 32 more)
    or its default inputs (images, audio)."""
    from estimator.errors import UserError
    from estimator.specs.hf_inputs import max_positions

    try:
        loaded = load_spec(f"hf:{model_type}", batch=BATCH, seq=SEQ, overrides=overrides)
        limit = max_positions(loaded.config) if loaded.config is not None else None
        if limit is not None and limit < SEQ:  # OWL-ViT's text tower: 16 positions
            loaded = load_spec(f"hf:{model_type}", batch=BATCH, seq=limit, overrides=overrides)
        if not any(unit in (loaded.description or "") for unit in ("(audio samples)", "(log-mel frames)")):
            return loaded  # audio: its own length (SEQ samples or frames are too few for most encoders)
    except UserError as exc:
        if not (str(exc).startswith("--seq") or "takes audio" in str(exc)):
            raise
        least = re.search(r"use --seq (\d+) or more", str(exc))
        if least:  # a vision-language model: its image tokens, then the sweep's 32 tokens of text
            return load_spec(f"hf:{model_type}", batch=BATCH, seq=int(least.group(1)) + SEQ - 1, overrides=overrides)
    return load_spec(f"hf:{model_type}", batch=BATCH, overrides=overrides)


def sweep_one(model_type: str, levels: tuple[int, ...] = (2, 1, 0)) -> dict[str, Any]:
    """The sweep's record of one model type (see the module doc); never raises."""
    from estimator.errors import UserError
    from estimator.specs import load_spec

    rec: dict[str, Any] = {"type": model_type}
    loaded = None
    for level in levels:  # the smallest configuration that builds and whose real step runs
        try:
            overrides = shrink_overrides(model_type, level)
            loaded = _load(load_spec, model_type, overrides)
        except UserError as exc:
            rec.update(outcome="refused", message=str(exc), level=level)
            continue
        except Exception as exc:  # noqa: BLE001 - a defect of the loader: recorded, the sweep goes on
            rec.update(outcome="crash", message=_line(exc), where="load", level=level)
            continue
        for stale in ("outcome", "message", "where", "truth_error"):  # a smaller configuration's failure
            rec.pop(stale, None)
        rec.update(level=level, overrides=overrides)
        truth, out_of_memory = _truth(rec, loaded)
        if truth is None and "too large" in rec.get("truth_error", ""):
            break  # the next level is larger still
        if truth is None and level != levels[-1] and not out_of_memory:
            continue  # (the next level is larger: out of memory there too)
        break
    if loaded is None:
        rec.setdefault("outcome", "unbuilt")
        return rec
    return _estimate_and_compare(rec, loaded, truth)


def sweep_spec(spec: str, **options: Any) -> dict[str, Any]:
    """The sweep's record of one model the loader builds from ``spec`` as it is (``torchvision:resnet18``: no
    configuration to shrink), at batch :data:`BATCH` and the loader's default input size unless ``options``
    say otherwise; the outcomes of :func:`sweep_one`; never raises."""
    from estimator.errors import UserError
    from estimator.specs import load_spec

    rec: dict[str, Any] = {"type": spec, "options": options}
    try:
        loaded = load_spec(spec, batch=BATCH, **options)
    except UserError as exc:
        return {**rec, "outcome": "refused", "message": str(exc)}
    except Exception as exc:  # noqa: BLE001 - a defect of the loader
        return {**rec, "outcome": "crash", "message": _line(exc), "where": "load"}
    truth, _ = _truth(rec, loaded)
    return _estimate_and_compare(rec, loaded, truth)


def _truth(rec: dict[str, Any], loaded: Any) -> tuple[dict | None, bool]:
    """The real CPU step of ``loaded`` (random weights) measured, or None with ``rec["truth_error"]`` (and
    whether it ran out of memory); the model's class and inputs recorded."""
    rec.update(cls=type(loaded.model).__name__, inputs=loaded.description)
    n_params = sum(p.numel() for p in loaded.model.parameters())
    if n_params > MAX_TRUTH_PARAMS:  # a real step this size takes minutes and GBs: estimate only
        rec.update(outcome="no-truth", truth_error=f"{n_params:,} parameters: too large for the real step")
        return None, False
    try:
        real = without_layerdrop(materialize(loaded.model))
        t0 = time.perf_counter()
        truth = measure(real, real_inputs(loaded.inputs), "adamw", loss_fn=loaded.loss_fn)
        rec["truth_s"] = round(time.perf_counter() - t0, 2)
        return truth, False
    except Exception as exc:  # noqa: BLE001 - the model's own failure on these inputs
        rec.update(outcome="no-truth", truth_error=_line(exc))
        return None, isinstance(exc, MemoryError) or "can't allocate memory" in str(exc)


def _estimate_and_compare(rec: dict[str, Any], loaded: Any, truth: dict | None) -> dict[str, Any]:
    """The estimate of ``loaded`` (CPU target, fp32, AdamW) beside ``truth``: the record completed."""
    from estimator import estimate
    from estimator.errors import UserError

    try:
        t0 = time.perf_counter()
        d = estimate(loaded.model, loaded.inputs, loss_fn=loaded.loss_fn, device="cpu", precision="fp32",
                     optimizer="adamw", model_name=loaded.name).to_dict()
        rec["estimate_s"] = round(time.perf_counter() - t0, 2)
    except UserError as exc:  # where the real step fails too, the model cannot run these inputs either
        rec.update(outcome="refused" if truth is not None or "truth_error" not in rec or "too large" in
                   rec["truth_error"] else "no-truth", message=str(exc))
        return rec
    except Exception as exc:  # noqa: BLE001
        rec.update(outcome="crash", message=_line(exc), where="estimate", trace=traceback.format_exc()[-2000:])
        return rec
    rec["unsupported"] = sorted({r["op"] for r in d.get("unsupported_ops", []) if r.get("module") != "(optimizer)"})
    # trainable parameters the step leaves without a gradient: a type fed only part of its inputs shows here (a
    # vision tower the text never reaches), beside those a model leaves unused by design (an unused pooler)
    rec["no_gradient"] = sum(int(r.get("count", 0)) for r in d.get("no_gradient", []))
    if truth is None:
        return rec
    errors = {}
    for name, (path, key) in COMPARED.items():
        est, meas = _get(d, path), truth[key]
        if est != meas:
            errors[name] = {"estimate": est, "measured": meas, "rel": (est - meas) / meas if meas else None}
    rec.update(outcome="differs" if errors else "exact", errors=errors)
    return rec


def estimate_alone(rec: dict[str, Any]) -> float:
    """Seconds the estimate of ``rec``'s model takes, the model built as the sweep built it (its overrides or
    loader options) in this process: the sweep runs it alone with the machine's threads, the time a user
    waits, where the sweep's own ``estimate_s`` ran on one thread beside another type's real step."""
    from estimator import estimate
    from estimator.specs import load_spec

    spec = rec["type"]
    loaded = load_spec(spec, batch=BATCH, **rec.get("options", {})) if ":" in spec else \
        _load(load_spec, spec, rec.get("overrides") or {})
    t0 = time.perf_counter()
    estimate(loaded.model, loaded.inputs, loss_fn=loaded.loss_fn, device="cpu", precision="fp32", optimizer="adamw",
             model_name=loaded.name)
    return round(time.perf_counter() - t0, 2)


def import_torchvision() -> Any:
    """torchvision, also beside the CPU torch (:func:`estimator.compat.import_torchvision`); ImportError where
    it is not installed."""
    from estimator.compat import import_torchvision as imported

    tv = imported()
    if tv is None:
        raise ImportError("torchvision is not installed", name="torchvision")
    return tv


# frames of a video model's clip in the sweep (the weights' own go up to 128, S3D's: too slow for a real step)
SWEEP_CLIP = 16


def sweep_torchvision(name: str) -> dict[str, Any]:
    """:func:`sweep_spec` of ``torchvision:NAME`` (weights' input size; video models :data:`SWEEP_CLIP` frames),
    with its family: the ``torchvision.models`` module that lists it."""
    tv = import_torchvision()
    models = tv.models
    family = next((label for label, module in (("detection", models.detection), ("segmentation", models.segmentation),
                                               ("video", models.video), ("optical flow", models.optical_flow),
                                               ("quantized", models.quantization))
                   if name in models.list_models(module=module)), "classification")
    options = {"seq": SWEEP_CLIP} if family == "video" else {}
    return {**sweep_spec(f"torchvision:{name}", **options), "family": f"torchvision {family}"}


def sweep_timm(name: str) -> dict[str, Any]:
    """:func:`sweep_spec` of ``timm:NAME`` at the size of its pretrained configuration, with the timm module that
    defines it (its architecture: ``resnet``, ``vision_transformer``, ...)."""
    import_torchvision()  # timm imports torchvision
    from timm.models import _registry

    module = getattr(_registry, "_model_to_module", {}).get(name, "")
    return {**sweep_spec(f"timm:{name}"), "family": "timm", "module": module}

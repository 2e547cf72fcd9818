"""Inference and serving (issue 23 item 4): inference without labels, ``--quantize`` answering in the headline,
and generation sizing, ``estimate(mode="generate")``, against a real CPU ``generate()``.

The truth is measured in each test: transformers' ``generate()`` (greedy, as the estimate assumes) on a
small model with random weights under the live-tensor tracker (``instruments.LiveTracker``), its windows
bracketed by forward pre-hooks: the prefill is everything up to the second forward (the first forward,
the token chosen, the loop's state grown), the last decode step everything from the last forward's start
to the end of ``generate()``.  The estimate traces the same two steps on fake tensors.
"""

from __future__ import annotations

import pytest
import torch

from instruments import LiveTracker

transformers = pytest.importorskip("transformers")

from estimator import estimate  # noqa: E402
from estimator.build import empty_weights  # noqa: E402

P, N, B = 16, 8, 2  # prompt tokens, new tokens, batch


def _config(name: str):
    if name.startswith("llama"):  # 4 query heads sharing 2 key/value heads; llama_deep: more layers than the
        # capture traces of a training step's stack of blocks (estimator.capture.blocks.TRACED_BLOCKS, 6)
        return transformers.LlamaConfig(num_hidden_layers=8 if name == "llama_deep" else 2, hidden_size=64,
                                        intermediate_size=128,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                                        eos_token_id=None, pad_token_id=0)
    if name == "mistral_window":  # a sliding window of 4 tokens, shorter than the prompt: each decode step's cat
        # leaves a view of the last 3 tokens of a 4-token storage (the estimate held the prompt's: +9.8 % at 64)
        return transformers.MistralConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                                          sliding_window=4, eos_token_id=None, pad_token_id=0)
    if name == "mamba":  # a state-space model: fixed-size recurrent states, no keys and values
        return transformers.MambaConfig(num_hidden_layers=2, hidden_size=64, state_size=16, vocab_size=1000,
                                        eos_token_id=None, pad_token_id=0)
    return transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, eos_token_id=None,
                                   pad_token_id=0)


def _model(name: str, real: bool):
    cls = (transformers.LlamaForCausalLM if name.startswith("llama") else
           transformers.MistralForCausalLM if name == "mistral_window" else
           transformers.MambaForCausalLM if name == "mamba" else transformers.GPT2LMHeadModel)
    if real:
        torch.manual_seed(0)
        return cls(_config(name)).eval()
    with empty_weights():
        return cls(_config(name))


def _live_generate(name: str, cache: str, dtype: torch.dtype, prompt: int = P) -> tuple[int, int]:
    """(prefill peak, last decode step peak) of a real ``generate()`` of N tokens after ``prompt``, in live bytes."""
    model = _model(name, real=True).to(dtype)
    ids = torch.randint(1, 1000, (B, prompt))
    tracker, calls, windows = LiveTracker(), [0], {}

    def pre(_module, _args):
        calls[0] += 1
        if calls[0] in (2, N):  # the prefill ends where the 2nd forward starts; the last decode step starts
            windows[calls[0]] = tracker.peak
            tracker.reset_peak()

    model.register_forward_pre_hook(pre)
    with tracker:
        for t in [*model.parameters(), *model.buffers(), ids]:
            tracker.register(t)
        tracker.reset_peak()
        kwargs = {"cache_implementation": "static"} if cache == "static" else {}
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N, do_sample=False, **kwargs)
    assert out.shape == (B, prompt + N) and calls[0] == N  # one prefill and N - 1 decode steps
    return windows[2], tracker.peak


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("name,precision,dtype", [("llama_gqa", "fp32", torch.float32),
                                                   ("llama_gqa", "bf16", torch.bfloat16),
                                                   ("gpt2", "fp32", torch.float32),
                                                   ("llama_deep", "fp32", torch.float32),
                                                   ("mamba", "fp32", torch.float32)])
def test_prefill_and_decode_peaks_match_a_live_generate(name, precision, dtype, cache):
    prefill, decode = _live_generate(name, cache, dtype)
    r = estimate(_model(name, real=False), {"input_ids": torch.zeros(B, P, dtype=torch.int64, device="meta")},
                 device="cpu", precision=precision, mode="generate", new_tokens=N, kv_cache=cache)
    g = r.generation
    assert g.stages["prefill"].peak == pytest.approx(prefill, rel=0.01), (g.stages["prefill"].peak, prefill)
    assert g.stages["decode"].peak == pytest.approx(decode, rel=0.01), (g.stages["decode"].peak, decode)
    # the report's memory is the step with the higher peak
    assert r.memory.peak == g.stages[g.binding].peak == max(s.peak for s in g.stages.values())


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_sliding_window_shorter_than_the_prompt_holds_its_window(cache):
    """Mistral with a window of 4 after a prompt of 64: the dynamic cache's decode step holds a view of the last 3
    tokens of the previous step's 4-token cat, where the estimate held the whole prompt's storage (decode peak
    +9.8 %); the static cache holds the window alike."""
    prefill, decode = _live_generate("mistral_window", cache, torch.float32, prompt=64)
    r = estimate(_model("mistral_window", real=False), {"input_ids": torch.zeros(B, 64, dtype=torch.int64,
                                                                                 device="meta")},
                 device="cpu", precision="fp32", mode="generate", new_tokens=N, kv_cache=cache)
    stages = r.generation.stages
    assert stages["prefill"].peak == pytest.approx(prefill, rel=0.01), (stages["prefill"].peak, prefill)
    assert stages["decode"].peak == pytest.approx(decode, rel=0.01), (stages["decode"].peak, decode)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_kv_cache_is_per_layer_gqa_aware_and_as_transformers_allocates_it(cache):
    cfg = _config("llama_gqa")
    r = estimate(_model("llama_gqa", real=False), {"input_ids": torch.zeros(B, P, dtype=torch.int64, device="meta")},
                 device="cpu", precision="bf16", mode="generate", new_tokens=N, kv_cache=cache)
    g = r.generation
    head_dim = cfg.hidden_size // cfg.num_attention_heads  # 64 / 4 = 16
    shape = [B, cfg.num_key_value_heads, P + N - 1, head_dim]  # the cache at the last decode step: P + N - 1 = 23
    assert [row["keys"] for row in g.layers] == [shape] * cfg.num_hidden_layers
    assert {row["dtype"] for row in g.layers} == {"bfloat16"}
    # 2 (keys, values) x layers x batch x KV heads x tokens x head dim x 2 bytes = 2*2*2*2*23*16*2 = 11,776, and a
    # StaticLayer's position counter (cumulative_length: one int64, 8 bytes) per layer: every byte the cache holds
    counters = 8 * cfg.num_hidden_layers if cache == "static" else 0
    assert g.kv_cache_bytes == 2 * cfg.num_hidden_layers * B * cfg.num_key_value_heads * (P + N - 1) * head_dim * 2 \
        + counters
    assert g.cache_class == ("DynamicCache" if cache == "dynamic" else "StaticCache")
    # the prefill: a DynamicCache holds the prompt's P tokens, a StaticCache is allocated whole already
    per_token = (g.kv_cache_bytes - counters) // (P + N - 1)
    expected = P * per_token if cache == "dynamic" else g.kv_cache_bytes
    assert g.stages["prefill"].memory.timeline[-1].by_category["kv_cache"] >= expected
    assert "grouped-query attention" in r.render() and "KV cache" in r.headline()


def test_a_state_space_cache_is_its_fixed_size_states():
    """Mamba's cache (transformers 5: a LinearAttentionLayer per layer) holds a convolution state of the last
    conv_kernel inputs and an SSM state per channel, whatever the tokens: counted and described as such."""
    cfg = _config("mamba")
    r = estimate(_model("mamba", real=False), {"input_ids": torch.zeros(B, P, dtype=torch.int64, device="meta")},
                 device="cpu", precision="fp32", mode="generate", new_tokens=N)
    g = r.generation
    inner = cfg.intermediate_size  # expand x hidden = 2 x 64 = 128 channels
    assert [row["states"] for row in g.layers] == [{"conv_states": [B, inner, cfg.conv_kernel],
                                                    "recurrent_states": [B, inner, cfg.state_size]}] * 2
    # 2 layers x batch 2 x 128 channels x (4 + 16) x 4 bytes = 40,960
    assert g.kv_cache_bytes == 2 * B * inner * (cfg.conv_kernel + cfg.state_size) * 4
    assert "recurrent-state cache" in r.headline() and "(fixed size)" in r.render()
    import importlib.util

    if importlib.util.find_spec("mamba_ssm") is None:  # (the sequential scan the fake trace ran, said so)
        assert "MambaMixer: transformers' PyTorch reference path (mamba_ssm" in r.render()


def test_generate_from_the_command_line(capsys):
    from estimator.cli import main

    code = main(["estimate", "hf:llama", "--set", "num_hidden_layers=2", "--set", "hidden_size=64",
                 "--set", "intermediate_size=128", "--set", "num_attention_heads=4", "--set", "num_key_value_heads=2",
                 "--set", "vocab_size=1000", "--mode", "generate", "--prompt-len", "16", "--new-tokens", "8",
                 "--batch", "2", "--gpu", "L4", "--kv-cache", "static", "--format", "json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    import json

    d = json.loads(out.out)
    assert d["mode"] == "generate" and d["precision"] == "bf16" and "labels" not in d["model"]
    g = d["generation"]
    assert g["prompt_len"] == 16 and g["new_tokens"] == 8 and g["cache_class"] == "StaticCache"
    assert g["cache_len"] == 16 + 8 - 1 and set(g["stages"]) == {"prefill", "decode"}
    assert d["needed"] == d["fit"]["needed"] and d["headline"].startswith("Generating 8 tokens after a 16-token prompt")
    assert g["tokens_per_s"] > 0  # timed on the L4


def test_generation_past_the_positions_is_one_line():
    """GPT-2's 1,024 learned positions: a prompt of 1,000 and 100 new tokens read position 1,098, where a real
    generate() fails (the position embedding's index out of range): a warning first, then one line, exit 2, as
    the command runs; the warning joins the error line (a failing command prints one line)."""
    import subprocess
    import sys

    spec = [sys.executable, "-m", "estimator", "estimate", "hf:gpt2", "--set", "n_layer=2", "--set", "n_embd=64",
            "--set", "n_head=4", "--mode", "generate", "--new-tokens", "100"]
    proc = subprocess.run([*spec, "--prompt-len", "1000"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines() == [
        "estimator: error: generate() runs past the model's positions: a prompt of 1000 tokens and 100 new ones take "
        "positions 0 to 1098, and a real run fails there too (index 1097 is out of bounds for dimension 0 with size "
        "1024); use a shorter --prompt-len or fewer --new-tokens (--prompt-len 1000 and --new-tokens 100 need 1099 "
        "positions, more than the model's 1024: a real run may fail)"]


def test_generate_refuses_a_prompt_with_images_in_one_line(capsys):
    """A vision-language model's prompt holds image tokens that generate() encodes first: refused in one line,
    from the command line (before the prompt length is checked) and from the API (inputs beside the token ids)."""
    from estimator.cli import main
    from estimator.errors import UserError

    assert main(["estimate", "hf:llava", "--mode", "generate", "--prompt-len", "64", "--new-tokens", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("estimator: error: --mode generate sizes text generation from the prompt's token ids; this "
                       "model's prompt also holds 576 image tokens, which generate() encodes first: size the forward "
                       "with --mode inference")
    ids = torch.zeros(B, P, dtype=torch.int64, device="meta")
    with pytest.raises(UserError, match="also hold pixel_values, which generate"):
        estimate(_model("gpt2", real=False), {"input_ids": ids, "pixel_values": torch.zeros(B, 3, 8, 8, device="meta")},
                 mode="generate", new_tokens=N, device="cpu")


def test_generate_refuses_what_it_cannot_size():
    from estimator.errors import UserError

    mlp = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(UserError, match="prepare_inputs_for_generation"):
        estimate(mlp, torch.zeros(2, 4, dtype=torch.int64), mode="generate", new_tokens=4, device="cpu")
    with pytest.raises(UserError, match="new_tokens"):
        estimate(_model("gpt2", real=False), torch.zeros(2, 4, dtype=torch.int64), mode="generate", device="cpu")
    with pytest.raises(UserError, match="prompt_len and new_tokens size generation"):
        estimate(mlp, torch.zeros(2, 4), new_tokens=4, device="cpu")
    # an encoder-decoder with its usual inputs: said to be one (its decoder_input_ids were called media to encode)
    with empty_weights():
        t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(
            d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16, vocab_size=500, decoder_start_token_id=0))
    ids = torch.zeros(2, 12, dtype=torch.int64, device="meta")
    with pytest.raises(UserError, match="is an encoder-decoder"):
        estimate(t5, {"input_ids": ids, "decoder_input_ids": ids[:, :4]}, mode="generate", new_tokens=4, device="cpu")


def test_a_generation_config_asking_for_beams_is_said():
    """Checkpoints ship num_beams > 1 in their generation_config, which a bare generate() runs (a real run: peak
    +48 %, cache 4x the greedy one here): the estimate sizes greedy search and says so."""
    model = _model("gpt2", real=False)
    model.generation_config.num_beams = 4
    r = estimate(model, {"input_ids": torch.zeros(B, P, dtype=torch.int64, device="meta")}, device="cpu",
                 mode="generate", new_tokens=N)
    assert any("num_beams=4" in a for a in r.capture.assumptions)


def test_a_generation_config_asking_for_a_static_cache_is_sized_with_it():
    """A checkpoint's generation_config may ask for cache_implementation="static", which a bare generate() builds:
    the estimate sized a DynamicCache (0.93x of a real run's peaks) and said nothing. The real run here is generate()
    with the static cache."""
    prefill, decode = _live_generate("llama_gqa", "static", torch.float32)
    model = _model("llama_gqa", real=False)
    model.generation_config.cache_implementation = "static"
    r = estimate(model, {"input_ids": torch.zeros(B, P, dtype=torch.int64, device="meta")}, device="cpu",
                 mode="generate", new_tokens=N)
    g = r.generation
    assert g.stages["prefill"].peak == pytest.approx(prefill, rel=0.01), (g.stages["prefill"].peak, prefill)
    assert g.stages["decode"].peak == pytest.approx(decode, rel=0.01), (g.stages["decode"].peak, decode)
    assert any("cache_implementation='static'" in a for a in r.capture.assumptions)


def test_what_greedy_sizing_leaves_out_is_said():
    """Sampling with num_return_sequences > 1 expands the batch (a real run's cache 3x): the note said the cache was
    the same as greedy search's. A left-padded prompt (a mask with zeros) makes generate() build a 4-D mask the
    unpadded sizing leaves out (a real prefill +3.6 %): said."""
    model = _model("gpt2", real=False)
    model.generation_config.do_sample, model.generation_config.num_return_sequences = True, 3
    ids = torch.zeros(B, P, dtype=torch.int64, device="meta")
    r = estimate(model, {"input_ids": ids}, device="cpu", mode="generate", new_tokens=N)
    assert any("num_return_sequences=3" in a and "3x the cache" in a for a in r.capture.assumptions)
    mask = torch.ones(B, P, dtype=torch.int64)
    mask[0, :3] = 0
    padded = estimate(_model("gpt2", real=False), {"input_ids": ids, "attention_mask": mask}, device="cpu",
                      mode="generate", new_tokens=N)
    assert any("pads some prompts" in a for a in padded.capture.assumptions)


def test_inference_feeds_no_labels_so_the_peak_is_not_the_loss(capsys):
    import json

    from estimator.cli import main

    small = ["hf:gpt2", "--set", "n_layer=1", "--set", "n_embd=64", "--set", "n_head=2", "--seq", "32", "--device", "cpu",
             "--format", "json", "--precision", "fp32"]
    assert main(["estimate", *small, "--mode", "inference"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["model"] == "hf:gpt2 (GPT2LMHeadModel; input_ids 1x32)" and d["loss"] == "none (inference)"
    assert d["memory"]["peak_module"] != "(loss)" and "cross_entropy" not in json.dumps(d["by_operator"])
    # the truth: a serving loop's forward under no_grad, without labels, on real tensors (the steady state: the
    # previous output held until the new one is assigned, as the estimate's inference peak is)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=64, n_head=2)).eval()
    ids = torch.zeros(1, 32, dtype=torch.int64)
    tracker = LiveTracker()
    with tracker, torch.no_grad():
        for t in [*model.parameters(), *model.buffers(), ids]:
            tracker.register(t)
        out = model(input_ids=ids)
        tracker.reset_peak()
        out = model(input_ids=ids)
    assert out.loss is None
    assert d["memory"]["peak"] == pytest.approx(tracker.peak, rel=0.01)


def test_quantize_answers_in_the_headline(capsys):
    """A 13B-shaped Llama does not fit an L4 in bf16 and fits with int4 weights: --quantize int4 says so first."""
    from estimator.cli import main
    from estimator.memory import needed_for_peak
    from estimator.render import fmt_bytes

    spec = ["hf:llama", "--set", "num_hidden_layers=40", "--set", "hidden_size=5120", "--set", "intermediate_size=13824",
            "--set", "num_attention_heads=40", "--set", "num_key_value_heads=40", "--seq", "64", "--mode", "inference",
            "--gpu", "L4", "--format", "json"]
    import json

    assert main(["estimate", *spec]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["estimate", *spec, "--quantize", "int4"]) == 0
    int4 = json.loads(capsys.readouterr().out)
    assert not plain["fit"]["fits"] and plain["headline"].startswith("Inference needs")
    # without --quantize the headline says which quantization would fit (int8 first: the smaller change), and
    # what it would need: the int8 what-if's peak with the reserve on it
    int8_needs = needed_for_peak({q["scheme"]: q for q in plain["quantized"]}["int8"]["peak"])
    assert int8_needs <= plain["fit"]["capacity"]
    assert f"; fits with int8 weights (needs {fmt_bytes(int8_needs)}: --quantize int8)" in plain["headline"]
    assert int4["fit"]["fits"] and int4["headline"].startswith("Inference with int4 weights (NF4, bitsandbytes) needs")
    assert ": fits on L4" in int4["headline"]
    # the headline's figure is the step traced over bitsandbytes' 4-bit weights (estimator.qlora's stand-ins): its
    # own peak and reserve; the int4 what-if every unquantized inference report shows (the peak less the bytes the
    # weights save, plus one layer's dequantized weight) bounds it from above
    what_if = {q["scheme"]: q for q in plain["quantized"]}["int4"]
    assert int4["quantize"] == {"scheme": "int4", "peak": int4["memory"]["peak"]}
    assert int4["needed"] == int4["memory"]["peak"] + sum(int4["memory"]["reserve"].values())
    assert int4["memory"]["peak"] <= what_if["peak"]


@pytest.mark.parametrize("name", ["llama_gqa", "whisper"])
def test_inference_holds_the_cache_its_output_returns(name):
    """An inference forward with the config's use_cache returns past_key_values (a decoder's keys and values; an
    encoder-decoder's cross-attention keys and values of the whole encoder output too), and a loop that holds
    its output (``out = model(x)``) holds them until the next forward returns.  Truth: that loop run for real
    under the live-tensor tracker, its steady-state (second) iteration."""
    from livetracker import measure_peaks

    if name == "whisper":
        cfg = transformers.WhisperConfig(encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4,
                                         decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                         vocab_size=1000, max_source_positions=1500, num_mel_bins=80, pad_token_id=0,
                                         bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
        inputs = {"input_features": torch.zeros(B, 80, 3000), "decoder_input_ids": torch.zeros(B, 32, dtype=torch.long)}
        cls = transformers.WhisperForConditionalGeneration
    else:
        cfg, cls = _config(name), transformers.LlamaForCausalLM
        inputs = {"input_ids": torch.zeros(B, 256, dtype=torch.long)}
    torch.manual_seed(0)
    real = cls(cfg).eval()
    truth = measure_peaks(real, inputs, None, None, train=False, steps=2)[-1]
    with empty_weights():
        model = cls(cfg)
    r = estimate(model, {k: v.to("meta") for k, v in inputs.items()}, device="cpu", precision="fp32",
                 mode="inference")
    assert r.memory.peak == pytest.approx(truth, rel=0.01), (r.memory.peak, truth)
    assert "the output holds the model's cache (past_key_values" in r.render()


def test_a_static_cache_under_autocast_fails_as_the_real_generate_does():
    """Under CPU autocast a Llama's StaticCache is allocated in the keys' fp32 (the rotary step promotes them)
    while v_proj's values come in bf16: the real generate() fails in index_copy_, whose fake kernel did not check
    the dtypes, so the estimate sized a run that cannot happen.  Now the real kernel's error, in one line."""
    from estimator.errors import UserError

    model = _model("llama_gqa", real=True)
    with pytest.raises(RuntimeError, match="same dtype"), torch.autocast("cpu", dtype=torch.bfloat16):
        model.generate(torch.randint(1, 1000, (B, P)), max_new_tokens=2, do_sample=False,
                       cache_implementation="static")
    with pytest.raises(UserError, match="index_copy_.*same dtype") as info:
        estimate(_model("llama_gqa", real=False), {"input_ids": torch.zeros(B, P, dtype=torch.int64, device="meta")},
                 device="cpu", precision="bf16-mixed", mode="generate", new_tokens=N, kv_cache="static")
    assert "\n" not in str(info.value)

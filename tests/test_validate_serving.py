"""validate --mode inference and --mode generate: the estimate beside a real forward or a real generate().

Two layers of truth: validate's own measurements (real tensors, its live tracker, FlopCounterMode) must agree
with the estimate, and with this file's independent ones (``tests/instruments.py``: a live-tensor tracker and a
fixed FlopCounterMode that share no code with the estimator) taken on a separate real copy of the model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from instruments import LiveTracker, flop_counter

pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# a Llama with grouped-query attention (4 query heads, 2 key/value heads) and a GPT-2, two layers of width 64
LLAMA = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=1000)
GPT2 = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=1000)
B, P, N = 2, 16, 6  # batch, prompt tokens, new tokens


def _load(model_type: str, overrides: dict, seq: int = P):
    from sweep import import_torchvision

    import_torchvision()
    from estimator.specs import load_spec

    return load_spec(f"hf:{model_type}", batch=B, seq=seq, overrides=overrides, labels=False)


def _real(model):
    from sweep import materialize

    return materialize(model).eval()


def _truth_generate(model, new_tokens: int, kv_cache: str) -> dict[str, int]:
    """This file's own measurement of a greedy generate() on another real copy (tests/livetracker.py)."""
    from livetracker import measure_generate

    ids = torch.randint(1, 100, (B, P), generator=torch.Generator().manual_seed(0))
    return measure_generate(_real(model), ids, new_tokens, kv_cache)


@pytest.mark.parametrize("model_type,overrides,kv_cache", [("llama", LLAMA, "dynamic"), ("llama", LLAMA, "static"),
                                                           ("gpt2", GPT2, "dynamic")])
def test_generate_against_a_real_generate(model_type, overrides, kv_cache):
    from estimator.validate import validate
    from estimator.validate.result import GENERATE_ROWS

    loaded = _load(model_type, overrides)
    result = validate(loaded.model, loaded.inputs, device="cpu", precision="fp32", mode="generate", new_tokens=N,
                      kv_cache=kv_cache, steps=1, tolerance=1.0)
    assert tuple(result.rows) == GENERATE_ROWS and result.mode == "generate"
    assert result.ok, result.render()
    truth = _truth_generate(loaded.model, N, kv_cache)
    for name, value in truth.items():  # validate's measurements are this file's, on another real copy
        assert result.rows[name]["measured"] == value, (name, result.rows[name], value)
    assert set(result.stage_times_s) == {"prefill", "decode"} and all(t > 0 for t in result.stage_times_s.values())
    text = result.render()
    assert "prefill (the prompt's forward)" in text and "last decode step" in text


def _zoo_overrides(model_type: str) -> dict:
    """The zoo sweep's shrunk configuration of ``model_type`` (2 layers of width 64)."""
    with open(os.path.join(ROOT, "benchmarks", "zoo_sweep.jsonl"), encoding="utf-8") as f:
        return next(r.get("overrides") or {} for r in map(json.loads, f) if r["type"] == model_type)


@pytest.mark.parametrize("model_type,use_cache", [
    ("falcon_h1", None),  # attention and Mamba mixers side by side in every layer: keys, values and states
    ("jamba", None),  # its shrunk configuration holds no attention layer: use_cache=False (hf_fixups)
    ("llama", False),  # a configuration's own use_cache=False: generate() keeps no cache
])
def test_generate_hybrid_caches_and_no_cache(model_type, use_cache):
    from estimator import estimate
    from estimator.validate import validate

    overrides = {**(LLAMA if model_type == "llama" else _zoo_overrides(model_type)),
                 **({} if use_cache is None else {"use_cache": use_cache})}
    loaded = _load(model_type, overrides)
    result = validate(loaded.model, loaded.inputs, device="cpu", precision="fp32", mode="generate", new_tokens=N,
                      steps=1, tolerance=1.0)
    assert result.ok, result.render()
    truth = _truth_generate(loaded.model, N, "dynamic")
    assert {k: result.rows[k]["measured"] for k in truth} == truth
    g = estimate(loaded.model, loaded.inputs, device="cpu", precision="fp32", mode="generate", new_tokens=N).generation
    if model_type == "falcon_h1":  # each layer's row holds its keys, values and states; every byte of them counted
        assert all("keys" in r and "states" in r for r in g.layers) and not g.states_only
        assert g.kv_cache_bytes == truth["kv_cache"] > 0
    else:  # no cache: the last decode step feeds the whole sequence but the last token (P + N - 1)
        assert g.cache == "none" and g.kv_cache_bytes == truth["kv_cache"] == 0
        assert g.stages["decode"].tokens == P + N - 1 and g.stages["decode"].cached == 0


def test_static_cache_without_use_cache_is_refused():
    from estimator import UserError, estimate

    loaded = _load("llama", {**LLAMA, "use_cache": False})
    with pytest.raises(UserError, match="use_cache=False"):
        estimate(loaded.model, loaded.inputs, device="cpu", mode="generate", new_tokens=N, kv_cache="static")


def test_generate_of_one_token_has_no_decode_rows():
    from estimator.validate import validate

    loaded = _load("llama", LLAMA)
    result = validate(loaded.model, loaded.inputs, device="cpu", precision="fp32", mode="generate", new_tokens=1,
                      steps=1, tolerance=1.0)
    assert "peak_decode" not in result.rows and "flops_decode" not in result.rows and result.ok, result.render()
    assert any("prefill only" in n for n in result.notes)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "bf16-mixed"])
def test_inference_against_a_real_forward(precision):
    from estimator.validate import validate
    from estimator.validate.result import INFERENCE_ROWS

    loaded = _load("llama", LLAMA)
    result = validate(loaded.model, loaded.inputs, device="cpu", precision=precision, mode="inference", steps=1,
                      tolerance=1.0)
    assert tuple(result.rows) == INFERENCE_ROWS and result.ok, result.render()
    # this file's own measurement: the second of two forwards (the first's output, its cache included, held), and
    # the forward's matmul FLOPs; under bf16 the model is cast whole, buffers too (the rotary table's inv_freq)
    real = _real(loaded.model)
    cast = {"bf16": torch.bfloat16}.get(precision)
    real = real.to(cast) if cast else real
    ids = loaded.inputs["input_ids"]
    ids = torch.zeros(ids.shape, dtype=ids.dtype)
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16-mixed" else \
        torch.autocast("cpu", enabled=False)
    tracker, counter = LiveTracker(), flop_counter()
    with torch.no_grad(), amp, tracker:
        for t in [*real.parameters(), *real.buffers(), ids]:
            tracker.register(t)
        with counter:
            out = real(input_ids=ids)
        tracker.reset_peak()
        out = real(input_ids=ids)  # noqa: F841 - held, as a loop's ``out = model(x)``
    buffers = sum(b.untyped_storage().nbytes() for b in real.buffers())
    assert result.rows["peak"]["measured"] == tracker.peak
    assert result.rows["flops_forward"]["measured"] == counter.get_total_flops()
    assert result.rows["buffers"]["measured"] == result.rows["buffers"]["estimated"] == buffers


def test_training_loop_options_are_refused_outside_training():
    from estimator import UserError
    from estimator.validate import validate

    loaded = _load("llama", LLAMA)
    with pytest.raises(UserError, match="grad_accum"):
        validate(loaded.model, loaded.inputs, device="cpu", mode="inference", grad_accum=2)
    with pytest.raises(UserError, match="mode='generate'"):
        validate(loaded.model, loaded.inputs, device="cpu", new_tokens=4)


def _cli(*args: str) -> subprocess.CompletedProcess:
    flags = [f"--set={k}={v}" for k, v in LLAMA.items()]
    return subprocess.run([sys.executable, "-m", "estimator", "validate", "hf:llama", *flags, "--device", "cpu",
                           "--steps", "1", "--batch", str(B), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_cli_validate_generate_and_its_errors(capsys):
    ok = _cli("--mode", "generate", "--prompt-len", str(P), "--new-tokens", str(N), "--format", "json")
    assert ok.returncode == 0, ok.stderr
    d = json.loads(ok.stdout)
    assert d["mode"] == "generate" and d["ok"] is True and set(d["stage_times_s"]) == {"prefill", "decode"}
    from estimator.cli import main  # the mistakes in process (test_cli.py runs such lines as a subprocess)

    flags = [f"--set={k}={v}" for k, v in LLAMA.items()]
    for args, message in ((("--mode", "generate"), "needs --new-tokens"),
                          (("--mode", "inference", "--optimizer", "sgd"), "drop --optimizer"),
                          (("--new-tokens", "4"), "add --mode generate")):
        assert main(["validate", "hf:llama", *flags, "--device", "cpu", *args]) == 2, args
        out, err = capsys.readouterr()
        lines = [ln for ln in err.splitlines() if ln.startswith("estimator: error")]
        assert out == "" and len(lines) == 1 and message in lines[0], err


@pytest.mark.parametrize("model_type,precision,quantize", [("llama", "fp32", "int4"), ("llama", "bf16", "int4-dq"),
                                                           ("gpt2", "fp32", "int4")])  # (GPT-2: Conv1D layers)
@pytest.mark.parametrize("mode", ["inference", "generate"])
def test_4bit_serving_against_bitsandbytes(mode, model_type, precision, quantize):
    """``--quantize int4`` in validate: the real model's Linear layers bitsandbytes' Linear4bit quantized for real (its
    CPU kernels; FlopCounterMode given a formula for its fused 4-bit matmuls), beside the estimate traced over the
    4-bit stand-ins: every row within 1 % (parameters and buffers, the quantization state, to the byte)."""
    pytest.importorskip("bitsandbytes")
    from estimator.validate import validate

    loaded = _load(model_type, LLAMA if model_type == "llama" else GPT2)
    extra = {"new_tokens": N} if mode == "generate" else {}
    result = validate(loaded.model, loaded.inputs, device="cpu", precision=precision, mode=mode, steps=1,
                      tolerance=1.0, quantize=quantize, **extra)
    assert result.ok, result.render()
    assert result.rows["parameters"]["error"] == result.rows["buffers"]["error"] == 0
    flops = [k for k in result.rows if k.startswith("flops")]
    assert all(result.rows[k]["measured"] > 0 and result.rows[k]["error"] == 0 for k in flops)

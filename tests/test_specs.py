"""SPECs: weight-free construction, hf:/torchvision:/timm: models, --set, and their one-line errors.

Ground truth comes from the libraries in the same run: a model built by the library's own
constructor (on meta for the big default configurations, with real weights for shrunk ones)
must have exactly the parameters of the model a SPEC builds.  The only typed-in numbers are
the exact counts the issue states for the libraries' default configurations.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from estimator import UserError, build_empty, empty_weights, estimate
from estimator.build import INIT_FUNCTIONS
from estimator.specs import load, load_spec, parse_overrides, parse_value

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _numel(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _shapes(model: nn.Module) -> dict:
    return {n: (tuple(p.shape), p.dtype, p.requires_grad) for n, p in model.named_parameters()}


def _import_or_skip(name: str):
    """Like pytest.importorskip, but also skips a library that is installed and fails to import
    (torchvision built for another torch: 'operator torchvision::nms does not exist')."""
    try:
        return importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"{name} not usable here: {type(exc).__name__}: {exc}")


# -- empty_weights ------------------------------------------------------------------------------


class _Odd(nn.Module):
    """A constructor that initialises with torch.nn.init (also through a from-import) and reads
    a CPU schedule with .item(), like torchvision's ViT and timm's stochastic depth."""

    def __init__(self, depth: int = 3):
        super().__init__()
        from torch.nn.init import trunc_normal_

        self.rates = [x.item() for x in torch.linspace(0, 0.1, depth)]
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(depth))
        self.pos = nn.Parameter(torch.zeros(1, 4, 16))
        self.register_buffer("table", torch.arange(8))
        nn.init.trunc_normal_(self.pos, std=0.02)
        trunc_normal_(self.blocks[0].weight, std=0.02)
        nn.init.orthogonal_(self.blocks[1].weight)


def test_empty_weights_puts_parameters_on_meta_and_restores_everything():
    originals = {n: getattr(nn.init, n) for n in INIT_FUNCTIONS if hasattr(nn.init, n)}
    register_parameter, register_buffer = nn.Module.register_parameter, nn.Module.register_buffer
    reference = _Odd()
    with empty_weights():
        model = _Odd()
        # The initialisers do nothing inside the block, even on fake tensors, where the real
        # trunc_normal_ reads values and raises DataDependentOutputException.
        with FakeTensorMode():
            t = torch.empty(4, 4)
            assert nn.init.trunc_normal_(t) is t
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert model.table.device.type == "cpu" and torch.equal(model.table, torch.arange(8))  # buffers kept
    assert _shapes(model) == _shapes(reference) and model.rates == reference.rates
    assert {n: getattr(nn.init, n) for n in originals} == originals
    assert nn.Module.register_parameter is register_parameter and nn.Module.register_buffer is register_buffer
    # Parameters built after the block are real and initialised again.
    after = nn.Linear(8, 8)
    assert after.weight.device.type == "cpu" and after.weight.abs().sum() > 0


class _Huge(nn.Module):
    """One 4 TiB parameter (2^40 fp32 elements, as DeepSeek-V3's 30 GB expert tensor on a smaller host), made by
    ``torch.empty`` before it is registered, beside a small host tensor the constructor reads."""

    def __init__(self):
        super().__init__()
        self.experts = nn.Parameter(torch.empty(2**10, 2**15, 2**15))
        self.schedule = torch.linspace(0, 1, 4).tolist()


def test_a_parameter_too_large_to_allocate_is_made_on_meta_at_once():
    modes = torch._C._len_torch_function_stack()
    with empty_weights():
        model = _Huge()
        small = torch.zeros(3)
    assert model.experts.device.type == "meta" and model.experts.shape == (2**10, 2**15, 2**15)
    assert model.schedule == torch.linspace(0, 1, 4).tolist() and small.device.type == "cpu"  # small ones stay real
    assert torch._C._len_torch_function_stack() == modes  # the mode is gone after the block


def test_a_factory_given_a_python_type_for_its_dtype_is_built():
    # GPT-Neo's attention builds its causal mask as torch.tril(torch.ones((2048, 2048), dtype=bool)); torch takes
    # Python's bool/int/float for a dtype, and sizing the request must too. 2^14 x 2^14 bools = 256 MiB, the
    # threshold (so on meta); a 4 x 4 one stays real with its values.
    with empty_weights():
        mask = torch.ones((2**14, 2**14), dtype=bool)
        small = torch.ones((4, 4), dtype=bool)
        steps = torch.zeros(3, dtype=int)
    assert mask.device.type == "meta" and mask.dtype == torch.bool
    assert small.device.type == "cpu" and bool(small.all()) and steps.dtype == torch.int64


def test_a_factory_given_its_sizes_as_integer_tensors_is_sized_as_torch_reads_them():
    # Inkling's vision layers compute their widths as 0-dim integer tensors: torch.empty((out, in)) reads them
    # through __index__. 2^14 x 2^14 fp32 = 1 GiB, over the 256 MiB threshold: made on meta, not allocated.
    side = torch.tensor(2**14)
    with empty_weights():
        big = torch.empty((side, side))
        big_varargs = torch.empty(side, side)
        small = torch.zeros((torch.tensor(3), 2))
    assert big.device.type == "meta" and big.shape == (2**14, 2**14) and big_varargs.device.type == "meta"
    assert small.device.type == "cpu" and small.shape == (3, 2)


def test_a_leaked_reference_to_an_initialiser_still_initialises(tmp_path):
    # A module first imported inside the block keeps the stand-in it imported by name;
    # outside the block it must behave like the real initialiser.
    (tmp_path / "late_module.py").write_text("from torch.nn.init import normal_\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with empty_weights():
            import late_module
        t = torch.zeros(100)
        late_module.normal_(t)
        assert t.abs().sum() > 0
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("late_module", None)


def test_build_empty_keeps_parameter_classes_and_flags_and_restores_on_error():
    class Frozen(nn.Module):
        def __init__(self, fail: bool = False):
            super().__init__()
            self.emb = nn.Embedding(10, 4, padding_idx=0)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight  # tied
            self.emb.weight.requires_grad_(False)
            if fail:
                raise RuntimeError("boom")

    model = build_empty(Frozen)
    assert model.head.weight is model.emb.weight and isinstance(model.emb.weight, nn.Parameter)
    assert model.emb.weight.device.type == "meta" and not model.emb.weight.requires_grad
    assert _numel(model) == 40
    init = dict(vars(nn.init))
    with pytest.raises(RuntimeError, match="boom"):
        build_empty(Frozen, fail=True)
    assert dict(vars(nn.init)) == init


def test_include_buffers_moves_buffers_to_meta():
    with empty_weights(include_buffers=True):
        bn = nn.BatchNorm1d(8)
    assert {t.device.type for t in list(bn.parameters()) + list(bn.buffers())} == {"meta"}


def test_user_factories_build_without_weights_or_with_them_when_they_must(tmp_path):
    spec = tmp_path / "factories.py"
    spec.write_text(
        "import torch\n"
        "from torch import nn\n"
        "def plain(width=8):\n"
        "    return nn.Linear(width, 4), torch.randn(2, width)\n"
        "def reads_values():\n"
        "    m = nn.Linear(8, 4)\n"
        "    assert m.weight.abs().sum().item() >= 0\n"
        "    return m, torch.randn(2, 8)\n"
    )
    model, inputs = load(f"{spec}:plain", overrides=["width=16"])
    assert model.weight.device.type == "meta" and tuple(model.weight.shape) == (4, 16)
    assert inputs.device.type == "cpu"  # inputs the factory makes are not touched
    model, _ = load(f"{spec}:reads_values")  # fails on meta, so built normally
    assert model.weight.device.type == "cpu"
    with pytest.raises(UserError, match="takes no option 'widht'.*close matches: width"):
        load(f"{spec}:plain", overrides=["widht=3"])
    with pytest.raises(UserError, match="--batch applies to hf:"):
        load_spec(f"{spec}:plain", batch=3)


def test_set_values_parse_as_int_float_bool_none_or_text():
    assert parse_value("2") == 2 and parse_value("1e-5") == 1e-5 and parse_value("0.5") == 0.5
    assert parse_value("True") is True and parse_value("false") is False and parse_value("none") is None
    assert parse_value("eager") == "eager" and parse_value("[1, 2]") == [1, 2] and parse_value("'12'") == "12"
    assert parse_overrides(["a=1", "b = x"]) == {"a": 1, "b": "x"}
    with pytest.raises(UserError, match="key=value"):
        parse_overrides(["novalue"])


# -- hf: ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


@pytest.mark.parametrize("model_type,expected", [
    # Exact counts stated by the issue for the libraries' default configurations (GPT-2 small,
    # with its tied LM head; Llama-7B); each is also compared with the library's own model.
    ("gpt2", 124_439_808),
    ("llama", 6_738_415_616),
])
def test_hf_default_configs_have_the_libraries_exact_parameter_counts(transformers, model_type, expected):
    loaded = load_spec(f"hf:{model_type}")
    assert _numel(loaded.model) == expected
    assert {p.device.type for p in loaded.model.parameters()} == {"meta"}
    cfg = transformers.AutoConfig.for_model(model_type)
    with torch.device("meta"):
        theirs = transformers.AutoModelForCausalLM.from_config(cfg)
    assert _shapes(loaded.model) == _shapes(theirs)


def test_hf_set_overrides_match_the_library_built_normally(transformers):
    sets = ["num_hidden_layers=2", "hidden_size=64", "num_attention_heads=4", "vocab_size=512",
            "max_position_embeddings=128", "tie_word_embeddings=false"]
    loaded = load_spec("hf:gpt2", overrides=sets, batch=3, seq=16)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=128,
                                  tie_word_embeddings=False)
    theirs = transformers.GPT2LMHeadModel(cfg)  # real weights: small
    assert _shapes(loaded.model) == _shapes(theirs) and _numel(loaded.model) == _numel(theirs)
    assert loaded.config.n_layer == 2 and not loaded.config.tie_word_embeddings
    assert tuple(loaded.inputs["input_ids"].shape) == (3, 16) and "labels" in loaded.inputs
    assert loaded.description.startswith("GPT2LMHeadModel; input_ids 3x16")
    # Derived fields follow: Llama's head_dim comes from hidden_size / heads at construction.
    llama = load_spec("hf:llama", overrides=["hidden_size=256", "num_attention_heads=4", "num_hidden_layers=1",
                                            "intermediate_size=512", "vocab_size=128"])
    assert llama.model.model.layers[0].self_attn.q_proj.weight.shape == (256, 256)


@pytest.mark.parametrize("model_type,cls,keys", [
    ("bert", "BertForMaskedLM", {"input_ids", "labels"}),
    ("t5", "T5ForConditionalGeneration", {"input_ids", "decoder_input_ids", "labels"}),
    ("vit", "ViTForImageClassification", {"pixel_values", "labels"}),
])
def test_hf_picks_the_model_class_and_inputs_by_task(transformers, model_type, cls, keys):
    small = {"bert": ["num_hidden_layers=1", "hidden_size=32", "num_attention_heads=2", "intermediate_size=64",
                      "vocab_size=100"],
             "t5": ["num_layers=1", "num_decoder_layers=1", "d_model=32", "d_kv=8", "num_heads=4", "d_ff=64",
                    "vocab_size=100"],
             "vit": ["num_hidden_layers=1", "hidden_size=32", "num_attention_heads=2", "intermediate_size=64",
                     "image_size=32", "patch_size=8"]}[model_type]
    loaded = load_spec(f"hf:{model_type}", overrides=small, batch=2, seq=None if model_type == "vit" else 8)
    assert type(loaded.model).__name__ == cls and set(loaded.inputs) == keys
    report = estimate(loaded.model, loaded.inputs, device="cpu")
    assert report.capture.loss_source == "output.loss"
    assert report.tally.params_total == _numel(loaded.model)
    if model_type == "vit":
        assert tuple(loaded.inputs["pixel_values"].shape) == (2, 3, 32, 32)


def test_hf_config_json_file_and_folder(transformers, tmp_path):
    cfg = transformers.AutoConfig.for_model("llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(tmp_path)  # writes config.json
    theirs = transformers.LlamaForCausalLM(cfg)
    for target in (str(tmp_path / "config.json"), str(tmp_path)):
        loaded = load_spec(f"hf:{target}", seq=32)
        assert _shapes(loaded.model) == _shapes(theirs)
    loaded = load_spec(f"hf:{tmp_path / 'config.json'}", overrides=["num_hidden_layers=1"])
    assert len(loaded.model.model.layers) == 1
    with pytest.raises(UserError, match="no such file"):
        load_spec(f"hf:{tmp_path / 'missing.json'}")
    (tmp_path / "bad.json").write_text(json.dumps({"hidden_size": 3}))
    with pytest.raises(UserError, match="model_type"):
        load_spec(f"hf:{tmp_path / 'bad.json'}")


@pytest.mark.parametrize("spec,sets,pattern", [
    ("hf:lama", [], r"unknown Hugging Face model type 'lama'; close matches: llama"),
    ("hf:gpt2", ["n_layr=2"], r"GPT2Config has no field 'n_layr' .*close matches: n_layer"),
    ("hf:llama", ["num_hiden_layers=2"], r"LlamaConfig has no field 'num_hiden_layers'.*num_hidden_layers"),
    ("hf:llama", ["text_config.x=1"], r"LlamaConfig has no sub-configuration 'text_config'"),
    ("hf:llama", ["hidden_size=abc"], r"LlamaConfig: .*hidden_size"),
    ("hf:nobody-xyz/none-such", [], r"neither a local file nor in the Hugging Face cache"),
])
def test_hf_errors_are_one_line_and_name_what_to_fix(transformers, spec, sets, pattern):
    with pytest.raises(UserError, match=pattern) as info:
        load_spec(spec, overrides=sets)
    assert "\n" not in str(info.value)


def test_hf_set_plus_adds_a_field_the_configuration_class_does_not_declare(transformers):
    """T5Gemma 2's text encoder reads ``dropout_rate``, which T5Gemma2TextConfig never sets: its default fails to
    build, the error says how to give the field, and ``--set +dropout_rate=...`` gives it (the built dropout
    modules hold the value); a plain ``--set`` of an undeclared field stays a typo error that names the + form."""
    shrink = ["num_hidden_layers=1", "hidden_size=64", "intermediate_size=128", "num_attention_heads=4",
              "num_key_value_heads=2", "head_dim=16"]
    with pytest.raises(UserError, match=r"reads dropout_rate, which T5Gemma2TextConfig does not declare: give it "
                                        r"with --set \+dropout_rate=\.\.\.") as info:
        load_spec("hf:t5gemma2_text", seq=16, overrides=shrink)
    assert "\n" not in str(info.value)
    loaded = load_spec("hf:t5gemma2_text", seq=16, overrides=shrink + ["+dropout_rate=0.25"])
    assert loaded.config.dropout_rate == 0.25
    assert {m.p for m in loaded.model.modules() if isinstance(m, torch.nn.Dropout)} == {0.25}
    with pytest.raises(UserError, match=r"has no field 'dropout_rat'.*--set \+dropout_rat=\.\.\. adds a field"):
        load_spec("hf:t5gemma2_text", seq=16, overrides=shrink + ["dropout_rat=0.25"])


# -- torchvision: and timm: (the test extras install both; conftest imports PyPI's torchvision beside the CPU torch)


@pytest.mark.parametrize("name,expected,size", [
    # Exact counts stated by the issue; each is also compared with torchvision's own model.
    ("resnet50", 25_557_032, 224),
    ("vit_b_16", 86_567_656, 224),
])
def test_torchvision_models_have_the_libraries_exact_parameter_counts(name, expected, size):
    tv = _import_or_skip("torchvision")
    loaded = load_spec(f"torchvision:{name}", batch=2)
    assert _numel(loaded.model) == expected
    assert {p.device.type for p in loaded.model.parameters()} == {"meta"}
    assert _shapes(loaded.model) == _shapes(tv.models.get_model(name, weights=None))
    assert tuple(loaded.inputs.shape) == (2, 3, size, size)


def test_torchvision_image_size_options_and_errors():
    tv = _import_or_skip("torchvision")
    vit = load_spec("torchvision:vit_b_16", image_size=64)  # ViT: the size is a constructor argument
    assert _shapes(vit.model) == _shapes(tv.models.vit_b_16(image_size=64))
    assert tuple(vit.inputs.shape) == (1, 3, 64, 64)
    assert tuple(load_spec("torchvision:inception_v3").inputs.shape)[-1] == 299  # from its weights' metadata
    small = load_spec("torchvision:resnet18", batch=2, image_size=32, overrides=["num_classes=10"])
    report = estimate(small.model, small.inputs, loss_fn=small.loss_fn, device="cpu")
    assert report.tally.params_total == _numel(tv.models.resnet18(num_classes=10))
    with pytest.raises(UserError, match="unknown torchvision model 'resnet5'; close matches: resnet50"):
        load_spec("torchvision:resnet5")
    with pytest.raises(UserError, match="takes no option 'foo'"):
        load_spec("torchvision:resnet18", overrides=["foo=1"])


def test_timm_models():
    timm = _import_or_skip("timm")
    loaded = load_spec("timm:resnet18", batch=2)
    assert _shapes(loaded.model) == _shapes(timm.create_model("resnet18", pretrained=False))
    assert {p.device.type for p in loaded.model.parameters()} == {"meta"}
    size = timm.create_model("resnet18", pretrained=False).pretrained_cfg["input_size"]
    assert tuple(loaded.inputs.shape) == (2, *size)
    vit = load_spec("timm:vit_tiny_patch16_224", image_size=64)
    assert _shapes(vit.model) == _shapes(timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64))
    with pytest.raises(UserError, match="unknown timm model 'resnet1'; close matches:"):
        load_spec("timm:resnet1")


def test_missing_vision_library_says_which_extra():
    for name in ("torchvision", "timm"):
        try:
            importlib.import_module(name)
        except ImportError:
            with pytest.raises(UserError, match=r"estimator\[vision\]"):
                load_spec(f"{name}:resnet18")
        except Exception:  # noqa: BLE001 - installed but broken: a one-line error naming the library
            with pytest.raises(UserError, match=f"importing {name} failed"):
                load_spec(f"{name}:resnet18")


# -- the command line ---------------------------------------------------------------------------


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    """The command line in this process (the progress test below runs it as a real process)."""
    from estimator.cli import main

    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_hf_spec_with_sets_batch_and_seq(transformers, capsys):
    code, out, err = _cli(capsys, "estimate", "hf:gpt2", "--set", "num_hidden_layers=1", "--set", "n_embd=64",
                          "--set", "n_head=2", "--batch", "2", "--seq", "32", "--format", "json", "--device", "cpu")
    assert code == 0, err
    assert err == ""  # no progress line when stderr is not a terminal
    d = json.loads(out)
    theirs = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=64, n_head=2))
    assert d["params"]["total"] == _numel(theirs)
    assert d["model"] == "hf:gpt2 (GPT2LMHeadModel; input_ids 2x32, labels)" and d["loss"] == "output.loss"


@pytest.mark.parametrize("args,needle", [
    (("hf:gpt2", "--set", "n_layr=2"), "GPT2Config has no field 'n_layr'"),
    (("hf:lama",), "close matches: llama"),
    (("examples/mlp.py:build", "--seq", "8"), "--seq applies to hf:"),
    (("examples/mlp.py:build", "--set", "batchsize=2"), "takes no option 'batchsize'"),
    (("hf:gpt2", "--set", "oops"), "key=value"),
    (("hf:gpt2", "--batch", "0"), "--batch must be >= 1"),
])
def test_cli_spec_errors_are_one_line_exit_2(transformers, capsys, args, needle):
    code, out, err = _cli(capsys, "estimate", *args)
    assert code == 2 and out == "", err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("estimator: error:") and needle in lines[0], err


def test_cli_progress_only_on_a_terminal(transformers):
    import pty
    import threading

    master, slave = pty.openpty()
    chunks: list[bytes] = []

    def drain() -> None:  # read while the command runs, so a full terminal buffer never blocks it
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        proc = subprocess.run([sys.executable, "-m", "estimator", "estimate", "hf:gpt2", "--set", "n_layer=1",
                               "--set", "n_embd=64", "--set", "n_head=2", "--seq", "16", "--format", "json"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=slave, timeout=300,
                              env={**os.environ, "ESTIMATOR_PROGRESS_DELAY": "0"})  # draw at once: no race
    finally:
        os.close(slave)
        reader.join(timeout=10)
        os.close(master)
    err = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0, err
    assert "estimator: " in err and "\x1b[K" in err  # a status line, rewritten in place
    assert err.endswith("\r\x1b[K")  # and erased at the end
    json.loads(proc.stdout)  # stdout carries only the report


def test_hf_speech_seq2seq_builds_the_generation_model_with_audio_features(transformers):
    # Whisper is encoder-decoder but not in the text seq2seq mapping: the speech seq2seq class,
    # log-mel input features of 2 x max_source_positions frames, decoder tokens and labels.
    sets = ["encoder_layers=1", "decoder_layers=1", "d_model=64", "encoder_attention_heads=2",
            "decoder_attention_heads=2", "encoder_ffn_dim=64", "decoder_ffn_dim=64",
            "max_source_positions=64", "max_target_positions=32"]
    loaded = load_spec("hf:whisper", overrides=sets, batch=2)
    assert type(loaded.model).__name__ == "WhisperForConditionalGeneration"
    assert tuple(loaded.inputs["input_features"].shape) == (2, loaded.config.num_mel_bins, 128)
    d = estimate(loaded.model, loaded.inputs, device="cpu").to_dict()
    assert d["loss"] == "output.loss" and not d["unsupported_ops"]


# -- issue 23 item 8: the [vision] extra pins the torchvision of the README's torch; a mismatched one says what
# to install, in one line


def test_the_vision_extra_pins_the_torchvision_of_the_readme_torch():
    from estimator.specs.vision import matching_torchvision

    readme = open(os.path.join(ROOT, "README.md")).read()
    torch_pin = re.search(r"pip install torch==(\d+\.\d+)\.\d+", readme).group(1)  # the set-up command's torch
    pyproject = open(os.path.join(ROOT, "pyproject.toml")).read()
    vision = re.search(r'^vision = \[(.*)\]$', pyproject, re.M).group(1)
    pin = re.search(r'"(torchvision==[^"]+)"', vision).group(1)
    # torchvision 0.N+15 goes with torch 2.N: 2.13 -> 0.28
    assert matching_torchvision(torch_pin, cpu=False) == f"pip install '{pin}'" == "pip install 'torchvision==0.28.*'"
    assert matching_torchvision("2.11", cpu=False) == "pip install 'torchvision==0.26.*'"
    assert matching_torchvision("2.14.1+cpu", cpu=True) == ("pip install 'torchvision==0.29.*' --index-url "
                                                            "https://download.pytorch.org/whl/cpu")


def test_a_torchvision_built_for_another_torch_is_one_line_naming_the_install(monkeypatch, capsys):
    import importlib

    import torch

    from estimator.specs import vision

    real = importlib.import_module

    def broken(name, *args, **kwargs):
        if name == "torchvision":  # what PyPI's torchvision does beside a CPU torch
            raise RuntimeError("operator torchvision::nms does not exist")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(vision.importlib, "import_module", broken)
    code, out, err = _cli(capsys, "estimate", "torchvision:resnet18", "--device", "cpu")
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    assert "operator torchvision::nms does not exist" in lines[0]
    assert vision.matching_torchvision() in lines[0] and f"torch {torch.__version__}" in lines[0]


def test_a_torchvision_video_model_takes_clips_of_its_weights_clip_length():
    """torchvision's video classifiers take (batch, 3, frames, H, W); the frames default to the ``clip_len`` the
    weights' documentation gives (read from it here: a stand-in ``models`` module), ``--seq`` overrides them."""
    from types import SimpleNamespace

    from estimator.specs.options import SpecOptions
    from estimator.specs.vision import _torchvision_clip, _video_inputs

    docs = "The accuracies are estimated on video-level with parameters `frame_rate=15`, `clip_len=32`."
    def weights(meta):
        return SimpleNamespace(get_model_weights=lambda name: SimpleNamespace(DEFAULT=SimpleNamespace(meta=meta)))

    models = weights({"_docs": docs})
    clip = _torchvision_clip(models, "swin3d_t")
    assert str(clip) in docs
    x, desc = _video_inputs(SpecOptions(batch=2), 112, clip)
    assert tuple(x.shape) == (2, 3, clip, 112, 112) and f"{clip} frames" in desc
    x, _ = _video_inputs(SpecOptions(batch=2, seq=8), 112, clip)
    assert x.shape[2] == 8
    assert _torchvision_clip(weights({}), "r3d_18") == 16  # the Kinetics clips of R3D, MC3, R(2+1)D and MViT

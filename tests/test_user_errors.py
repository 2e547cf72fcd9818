"""Inputs a new user gives that once ended in a traceback or a wrong hint (found by trying about 200 commands as
ML engineers write them), each now a one-line error with exit code 2 that says what to fix.  The commands run in
this process (``main``, as the console script calls it; tests/test_cli.py runs the real console entry)."""

from __future__ import annotations

import os

import pytest

from test_cli import ROOT, _one_line_error


def run(*args: str):
    """``estimator ARGS`` in this process (as the console script calls ``main``), from the repository root: its exit
    code, stdout and stderr (a raise other than the one-line errors fails the test with its traceback)."""
    import contextlib
    import io
    import types

    from estimator.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # (argparse's --help and version exits)
            code = exc.code
    return types.SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def test_an_output_that_cannot_be_written_is_refused_before_the_work(tmp_path):
    folder = tmp_path / "r.json"
    folder.mkdir()
    _one_line_error(run("estimate", "examples/mlp.py:build", "--device", "cpu", "--output", str(folder)),
                    "is a directory")
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o500)
    try:
        if not os.access(locked, os.W_OK):  # (root writes anywhere)
            _one_line_error(run("estimate", "examples/mlp.py:build", "--device", "cpu", "--output",
                                str(locked / "r.json")), "not writable")
    finally:
        os.chmod(locked, 0o700)
    assert list(tmp_path.rglob("*.estimator-*")) == []


def test_a_wrap_class_that_splits_tied_weights_is_refused():
    """GPT's output head shares the token embedding's weight: wrapping Linear alone puts it in two FSDP2 groups,
    which ``fully_shard`` refuses (it raised from inside the fake process group's rank)."""
    _one_line_error(run("plan", "examples/gpt.py:build", "--gpu", "H100", "--gpus", "8", "--strategy", "fsdp",
                        "--wrap", "Linear"), "lm_head.weight and wte.weight")


def test_a_plan_with_nothing_to_train_is_refused(tmp_path):
    spec = tmp_path / "frozen.py"
    spec.write_text("import torch\n\ndef build():\n    m = torch.nn.Linear(4, 2)\n    m.requires_grad_(False)\n"
                    "    return m, torch.randn(3, 4)\n")
    _one_line_error(run("plan", f"{spec}:build", "--gpu", "H100", "--gpus", "2"), "requires grad")


def test_the_fp8_what_if_says_why_the_batch_is_not_searched():
    proc = run("estimate", "examples/gpt.py:build", "--gpu", "H100", "--precision", "fp8")
    assert proc.returncode == 0, proc.stderr
    headline = " ".join(proc.stdout.split("\n\n")[1].split())
    assert "not searched: --precision fp8 is a what-if" in headline and "unknown precision" not in headline


def _tiny_gpt():
    import importlib.util

    spec = importlib.util.spec_from_file_location("_gpt_example", os.path.join(os.path.dirname(__file__), "..",
                                                                                "examples", "gpt.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build(batch=2, seq=64)


def test_a_gpu_without_the_steps_tensor_cores_is_said_and_its_mfu_stays_a_fraction():
    """bf16-mixed on a T4 (fp16 tensor cores only): the plan's MFU once divided the time model's fp16-rate step
    by the fp32 peak (138 % in a --compare row); now both use the rate the matmuls are timed at, and the
    estimate and the plan say the card has no bf16 tensor cores."""
    from estimator import estimate
    from estimator.hardware import lookup
    from estimator.plan import plan

    model, inputs = _tiny_gpt()
    t4 = lookup("T4")
    report = estimate(model, inputs, gpu="T4", precision="bf16-mixed", solve_batch=False)
    assert any("T4 has no bf16 tensor cores" in n for n in report.capture.assumptions)
    planned = plan(model, inputs, gpu="T4", gpus=2, strategy="ddp", precision="bf16-mixed", solve=())
    assert any("T4 has no bf16 tensor cores" in n for n in planned.notes)
    assert planned.flops.peak_flops_per_s == t4.matmul_peak("bf16") == t4.peak_flops("fp16")
    assert 0 < planned.flops.mfu < 1
    assert t4.lacks("fp16") is None and lookup("H100").lacks("bf16") is None


def test_float8_on_a_gpu_without_float8_tensor_cores_is_refused():
    from estimator import estimate
    from estimator.errors import UserError

    pytest.importorskip("torchao")
    model, inputs = _tiny_gpt()
    with pytest.raises(UserError, match="float8 tensor cores"):
        estimate(model, inputs, gpu="A100", float8="tensorwise")


def test_options_a_user_mistypes_are_refused_in_one_line():
    _one_line_error(run("estimate", "examples/mlp.py:build", "--device", "cpu", "--optimizer", "adamw:betas=(0.9,0.95"),
                    "unbalanced parentheses")
    _one_line_error(run("plan", "examples/mlp.py:build", "--gpu", "H100", "--steps", "1.5"), "whole number")
    _one_line_error(run("validate", "examples/mlp.py:build", "--device", "cpu", "--tolerance", "-5"), "--tolerance")
    _one_line_error(run("validate", "examples/mlp.py:build", "--device", "cpu", "--peak-tflops", "0"),
                    "--peak-tflops")


def test_yes_and_no_are_booleans_in_optimizer_options():
    """``amsgrad=no`` once reached Adam as the string "no", which Python takes as true (AMSGrad on)."""
    from estimator.optim import parse_optimizer

    assert parse_optimizer("adam:amsgrad=no,foreach=yes") == ("adam", {"amsgrad": False, "foreach": True})


def test_generation_requests_outside_what_generate_runs_say_so():
    """One new token after a one-token prompt failed reshaping an empty decode step: generate() runs the prefill
    alone, and so does the estimate (any prompt length)."""
    for prompt in ("1", "4"):
        proc = run("estimate", "hf:gpt2", "--set", "n_layer=1", "--mode", "generate", "--prompt-len", prompt,
                   "--new-tokens", "1", "--gpu", "H100")
        assert proc.returncode == 0, proc.stderr
        assert "the prefill alone (no decode step)" in proc.stdout and "decode step " not in proc.stdout
    _one_line_error(run("estimate", "hf:gpt2", "--set", "n_layer=1", "--mode", "generate", "--prompt-len", "0",
                        "--new-tokens", "4"), "--prompt-len must be >= 1")
    _one_line_error(run("estimate", "examples/gpt.py:build", "--mode", "generate", "--prompt-len", "16",
                        "--new-tokens", "4"), "--prompt-len sizes hf: prompts")


def test_llavas_default_configuration_builds_a_model_that_runs():
    """``hf:llava`` from its defaults: the image token (id 32,000) sits past the 32,000-token text vocabulary, as
    llava-1.5's configuration has it before its checkpoint grows the embedding; the loader grows it as the
    checkpoints do, and the real model's forward runs on the inputs it builds (it failed indexing the embedding)."""
    import torch

    from estimator.specs import load

    shrunk = {"text_config.num_hidden_layers": 1, "vision_config.num_hidden_layers": 1, "text_config.hidden_size": 64,
              "text_config.intermediate_size": 128, "text_config.num_attention_heads": 4,
              "text_config.num_key_value_heads": 2}
    model, inputs = load("hf:llava", overrides=shrunk, seq=600)
    assert model.config.text_config.vocab_size == model.config.image_token_id + 1
    from sweep import materialize

    real = materialize(model)
    with torch.no_grad():
        assert torch.isfinite(real(**inputs).loss)


def test_compare_and_a_single_fsdp_plan_name_the_precision_each_uses():
    """--compare runs each engine in its own mixed precision (FSDP2's MixedPrecisionPolicy, DDP's autocast): its
    header said "(bf16-mixed)" over fsdp-bf16 rows, and a single --strategy fsdp plan under autocast needs more than
    the compare's fsdp row without saying why."""
    from estimator.plan import Planner

    model, inputs = _tiny_gpt()
    planner = Planner(model, inputs, gpu="H100", precision="bf16-mixed")
    cmp = planner.compare([2], strategies=["ddp", "fsdp"], with_checkpointing=False)
    names = {p.config.strategy: p.config.precision for p in cmp.plans}
    assert names == {"ddp": "bf16-mixed", "fsdp": "fsdp-bf16"}
    assert "bf16-mixed / fsdp-bf16: each engine's own" in cmp.render().split("\n\n")[1]
    single = planner.plan("fsdp", 2, solve=())
    assert any("--precision fsdp-bf16 is FSDP2's MixedPrecisionPolicy" in n for n in single.notes)


@pytest.mark.parametrize("args, needle", [
    (("--microbatches", "4"), "add --pp 2"),
    (("--pp-schedule", "gpipe"), "add --pp 2"),
    (("--cp-rotate", "alltoall"), "add --cp 2"),
    (("--strategy", "fsdp", "--zero-semantics", "paper"), "zero1, zero2 or zero3"),
    (("--wrap", "Block"), "DDP has none"),
    (("--strategy", "fsdp", "--reshard-after-forward", "false", "--compare"), "without --compare"),
])
def test_plan_options_without_the_option_they_shape_are_refused(args, needle):
    """Each changed nothing (the plan byte for byte the same without it), as --sequence-parallel without --tp would
    have, which was refused already."""
    _one_line_error(run("plan", "examples/gpt.py:build", "--gpu", "H100", "--gpus", "4", *args), needle)


def test_a_run_that_fails_prints_one_line_with_the_warning_that_explains_it():
    """``--seq 1024`` on BERT (512 positions): the warning about the positions came on its own line before the
    error; the warnings of a command are held to its end, and a failing command's error carries them."""
    from test_cli import run as run_console  # (the console entry: logging as a fresh process configures it)

    proc = run_console("estimate", "hf:bert", "--set", "num_hidden_layers=1", "--seq", "1024")
    _one_line_error(proc, "longer than the model's 512 positions")
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, needle", [
    (("estimate", "examples/mlp.py:build", "--device", "cpu", "--checkpoint-policy", "op"), "add --checkpoint CLASS"),
    (("validate", "examples/mlp.py:build", "--device", "cpu", "--checkpoint-policy", "op"),
     "drop --checkpoint-policy"),
    (("plan", "examples/gpt.py:build", "--gpu", "H100", "--quantize", "int4"), "estimate --mode inference"),
    (("estimate", "examples/gpt.py:build", "--gpu", "H100", "--cuda-torch", "1.13"), "2.0 or later"),
    (("estimate", "hf:llama", "--set", "num_hidden_layers=1", "--batch", "4", "--input", "2x128:int64"),
     "drop --batch"),
])
def test_errors_name_the_option_given_and_what_to_do(args, needle):
    _one_line_error(run(*args), needle)


def test_a_gpu_file_with_a_nan_is_refused_at_its_field(tmp_path):
    import json

    entry = json.loads(run("hardware", "--format", "json").stdout)
    entry = next(e for e in entry if e["name"] == "RTX-A6000") if isinstance(entry, list) else entry
    entry.update(name="Mine", aliases=[], memory_gb=float("nan"))
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(entry))
    _one_line_error(run("estimate", "examples/mlp.py:build", "--gpu", str(path)), "memory_gb must be a finite number")


def _api_calls():
    import torch
    from torch import nn

    from estimator import estimate
    from estimator.plan import compare, plan

    m, x = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)), torch.randn(4, 8)
    nan = float("nan")
    return {
        "gpus as text": (lambda: plan(m, x, gpu="L4", gpus="2"), "whole number"),
        "gpus as a bool": (lambda: plan(m, x, gpu="L4", gpus=True), "whole number"),
        "tp as a float": (lambda: plan(m, x, gpu="L4", gpus=2, tp=2.0), "whole number"),
        "gpu as a list": (lambda: estimate(m, x, gpu=["L4"]), "GPU name"),
        "gpu as a number": (lambda: compare(m, x, gpu=5, gpus=2), "GPU name"),
        "no gpus": (lambda: compare(m, x, gpu="L4", gpus=[]), "at least one"),
        "optimizer_kwargs as a list": (lambda: estimate(m, x, optimizer_kwargs=[1], device="cpu"), "dict"),
        "trace unknown": (lambda: estimate(m, x, trace="xyz", device="cpu"), "trace must be"),
        "depth as text": (lambda: estimate(m, x, depth="2", device="cpu"), "depth must be"),
        "solve unknown": (lambda: plan(m, x, gpu="L4", gpus=2, solve="foo"), "solve takes"),
        "tokens nan": (lambda: plan(m, x, gpu="L4", gpus=2, tokens=nan), "finite number"),
        "samples inf": (lambda: plan(m, x, gpu="L4", gpus=2, samples=float("inf")), "finite number"),
        "kv_cache in training": (lambda: estimate(m, x, kv_cache="static", device="cpu"), "mode='generate'"),
        # training-loop options that were accepted and ignored
        "optimizer in inference": (lambda: estimate(m, x, mode="inference", optimizer="sgd", device="cpu"),
                                   "optimizer shapes a training step"),
        "keep_output in inference": (lambda: estimate(m, x, mode="inference", keep_output=True, device="cpu"),
                                     "keep_output shapes a training step"),
        "ema without an optimizer": (lambda: estimate(m, x, optimizer="none", ema=0.999, device="cpu"),
                                     "optimizer is none"),
        "clip without an optimizer": (lambda: estimate(m, x, optimizer=None, clip_grad_norm=1.0, device="cpu"),
                                      "drop clip_grad_norm"),
        "kwargs misspelt over an instance": (
            lambda: estimate(m, x, optimizer=torch.optim.Adam(m.parameters()), optimizer_kwargs={"amsgrd": True},
                             device="cpu"), "amsgrd: not an option of Adam"),
        "capturable on the CPU trace": (lambda: estimate(m, x, optimizer="adamw:capturable=true", device="cpu"),
                                        "drop capturable"),
        # an empty batch: the time model and the search divided by it (ZeroDivisionError tracebacks)
        "empty batch, estimate on a GPU": (lambda: estimate(m, x[:0], gpu="H100"), "batch is empty"),
        "empty batch, plan": (lambda: plan(m, x[:0], gpu="H100"), "batch is empty"),
        "a torch release from the future": (lambda: estimate(m, x, gpu="H100", cuda_torch="9.9"),  # (was taken)
                                            "no such torch release"),
        "an empty list of optimizers": (lambda: estimate(m, x, optimizer=[], device="cpu"), "an empty list"),
        "a list holding a name": (lambda: estimate(m, x, optimizer=["adamw"], device="cpu"), "not a str"),
    }


@pytest.mark.parametrize("case", list(_api_calls()))
def test_python_api_arguments_of_the_wrong_kind_are_one_line_user_errors(case):
    """Each raised a raw TypeError, AttributeError, ValueError or OverflowError (or was accepted and failed later:
    ``depth="2"`` in every view of the report, ``tokens=nan`` after the traces)."""
    from estimator.errors import UserError

    call, needle = _api_calls()[case]
    with pytest.raises(UserError, match=needle) as info:
        call()
    assert "\n" not in str(info.value)


def test_compare_takes_one_strategy_by_name():
    import torch
    from torch import nn

    from estimator.plan import compare

    cmp = compare(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)), torch.randn(4, 8), gpu="L4", gpus=2,
                  strategies="fsdp")
    assert {p.config.strategy for p in cmp.plans} == {"fsdp"}
    # each JSON row names its pipeline degree too (a ddp and a ddp x pp 2 row read the same without it)
    assert [row["pp"] for row in cmp.to_dict()["rows"]] == [p.config.pp for p in cmp.plans]


def test_a_plans_time_rows_add_up_to_its_step():
    """Compute, exposed communication, host transfers and the GPU's wait for kernel launches (shown in the HTML
    alone before) add up to the step time, in the text and the JSON."""
    from estimator.plan import plan

    model, inputs = _tiny_gpt()
    p = plan(model, inputs, gpu="L4", gpus=2, strategy="fsdp", solve=())
    t = p.to_dict()["time"]
    assert t["compute_s"] + t["exposed_comm_s"] + t["offload_s"] + t["launch_wait_s"] == pytest.approx(t["step_time_s"])
    if t["launch_wait_s"] >= 5e-6:
        assert "GPU waiting for kernel launches" in p.render()


def test_api_messages_say_where_the_user_went_wrong():
    """A loss_fn that fails is named (the error named the model's last module and op); a module instance passed
    as a checkpoint class is told apart from a class the model lacks; a validation's repr is its answer."""
    import torch
    from torch import nn

    from estimator import estimate
    from estimator.errors import UserError
    from estimator.validate import validate

    m, x = nn.Sequential(nn.Linear(4, 4)), torch.randn(2, 4)
    with pytest.raises(UserError, match=r"the loss pass failed( at \S+ \(.*\))?: AttributeError.*check loss_fn"):
        estimate(m, x, loss_fn=lambda out: out.nonexistent, device="cpu")
    with pytest.raises(UserError, match="not a module instance"):
        estimate(m, x, checkpoint=nn.Linear(2, 2), device="cpu")
    result = validate(m, x, device="cpu", steps=1)
    assert repr(result).startswith("<Validation (train): within 5% on cpu") and "\n" not in repr(result)
    breakdown = estimate(m, x, device="cpu").to_dict()["memory"]["peak_breakdown"]
    assert all(type(k) is str for k in breakdown)  # plain strings, not Category members


def test_a_prompt_past_the_positions_says_so_in_the_api():
    """GPT-2's 1,024 positions and a prompt of 2,000 tokens: the API's error named an IndexError in the embedding
    (the command line's joined a warning); it says the prompt runs past the positions, as for too many new tokens."""
    import torch

    from estimator import estimate
    from estimator.errors import UserError

    pytest.importorskip("transformers")
    from estimator.compat import import_torchvision

    import_torchvision()
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=64, n_head=4))
    with pytest.raises(UserError, match=r"runs past the model's positions.*more than its 1,024"):
        estimate(model, {"input_ids": torch.zeros(1, 2000, dtype=torch.long)}, mode="generate", new_tokens=4)


def test_loops_and_models_the_estimate_cannot_run_as_given_say_what_to_do():
    """Lazy modules not yet initialised (a raw RuntimeError traceback from the CLI) and an optimizer whose step
    needs a closure (LBFGS: "missing 1 required positional argument", with advice about its options) are one-line
    errors that say what to do; a plain dataclass output with loss None is trained on its floating-point fields
    (it said the output held nothing to train)."""
    from dataclasses import dataclass

    import torch
    from torch import nn

    from estimator import UserError, estimate

    lazy = nn.Sequential(nn.LazyLinear(16), nn.ReLU(), nn.LazyLinear(4))
    with pytest.raises(UserError, match=r"lazy modules are not initialised .*run one forward") as info:
        estimate(lazy, torch.randn(2, 8), device="cpu")
    lazy(torch.randn(2, 8))  # initialised as the message says: estimated
    assert estimate(lazy, torch.randn(2, 8), device="cpu").tally.params_total == 8 * 16 + 16 + 16 * 4 + 4
    with pytest.raises(UserError, match="re-evaluates the model inside the step") as info:
        estimate(nn.Linear(8, 4), torch.randn(2, 8), device="cpu", optimizer=torch.optim.LBFGS)
    assert "\n" not in str(info.value)

    @dataclass
    class Out:
        logits: torch.Tensor
        loss: torch.Tensor | None = None

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 4)

        def forward(self, x):
            return Out(self.lin(x))

    report = estimate(Model(), torch.randn(2, 8), device="cpu")
    assert report.tally.gradients_bytes == (8 * 4 + 4) * 4  # every parameter got its gradient


def test_an_unknown_option_points_to_its_subcommands_help(capsys):
    """argparse's "unrecognized arguments" came from the top-level parser and pointed to 'estimator --help',
    which does not list a subcommand's options."""
    from estimator.cli.main import main

    assert main(["estimate", os.path.join(ROOT, "examples", "mlp.py") + ":build", "--bogus"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "estimator: error: unrecognized arguments: --bogus (see 'estimator estimate --help')"


def test_a_forward_error_names_the_module_that_raised_it():
    """A module's own code that raises before its first op was reported in the previous module's last op ("in
    module 'encoder.1' in aten.mul.Tensor" for a decoder that needs an input not given)."""
    import torch

    from estimator import estimate
    from estimator.errors import UserError

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x, ids=None):
            y = self.lin(x)
            if ids is None:
                raise ValueError("decoder needs ids")
            return y

    class EncDec(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.1))
            self.decoder = Decoder()

        def forward(self, x, ids=None):
            return self.decoder(self.encoder(x), ids).sum()

    with pytest.raises(UserError) as err:
        estimate(EncDec(), torch.randn(2, 8), device="cpu")
    # (and where in the model's code: the line that raised)
    assert "in module 'decoder' at test_user_errors.py:" in str(err.value)
    assert "(forward): ValueError: decoder needs ids" in str(err.value)


def test_the_models_own_code_raising_is_not_blamed_on_the_last_op():
    """A model's Python (or a library it calls) that raises after its last op was reported as failing in that op
    ("failed in aten.sigmoid.default: ImportError: ... install it with pip:"), cut at the first line and with
    advice on input shapes.  Now no op, the message's continuation, and what to do about a missing package."""
    import torch

    from estimator import estimate
    from estimator.errors import UserError

    class NeedsScipy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            self.lin(x).sigmoid()
            raise ImportError("the matcher requires the scipy library. You can install it with pip:\n`pip install scipy`")

    with pytest.raises(UserError) as info:
        estimate(NeedsScipy(), torch.randn(2, 4), device="cpu")
    text = str(info.value)
    assert "\n" not in text and "aten." not in text and "pip install scipy" in text and "not installed" in text

    class Misspelt(torch.nn.Module):  # the real step: "'Tensor' object has no attribute ..." (not the trace's type)
        def forward(self, x):
            return x.sum().nonexistent_attribute

    with pytest.raises(AttributeError, match="'Tensor' object"):
        Misspelt()(torch.randn(2, 4))
    with pytest.raises(UserError, match="'Tensor' object has no attribute 'nonexistent_attribute'"):
        estimate(Misspelt(), torch.randn(2, 4), device="cpu")


def test_models_fsdp2_refuses_or_fails_on_are_one_line_errors_and_other_layouts_still_plan():
    """A scalar parameter (CLIP's logit_scale): fully_shard raises "doesn't support scalar parameters", which came
    out as a raw traceback (--compare and a DDP plan's suggestions died with it).  Batch norm under FSDP2's bf16
    parameters: its weight cast, its running statistics fp32, the real step fails (shown below on the CPU kernel,
    as FSDP2 casts it), which the trace's meta kernels did not check."""
    import torch
    import torch.nn.functional as F

    from estimator.errors import UserError
    from estimator.plan import compare, plan

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 4)
            self.temp = torch.nn.Parameter(torch.tensor(2.0))

        def forward(self, x):
            return (self.lin(x) * self.temp).sum()

    x = torch.randn(4, 8)
    with pytest.raises(UserError, match="refuses scalar parameters") as info:
        plan(Scaled(), x, gpu="H100", gpus=2, strategy="fsdp", device="cpu", solve=())
    assert "\n" not in str(info.value)
    rows = compare(Scaled(), x, gpu="H100", gpus=2, device="cpu")
    assert any(r.config.strategy == "ddp" for r in rows.plans)
    with pytest.raises(RuntimeError):  # the real kernel as FSDP2's MixedPrecisionPolicy(bf16) leaves batch norm
        F.batch_norm(torch.randn(4, 3, dtype=torch.bfloat16), torch.zeros(3), torch.ones(3),
                     torch.ones(3, dtype=torch.bfloat16), torch.zeros(3, dtype=torch.bfloat16), training=True)
    cnn = torch.nn.Sequential(torch.nn.Linear(8, 3), torch.nn.BatchNorm1d(3))
    with pytest.raises(UserError, match="batch norm"):
        plan(cnn, x, gpu="H100", gpus=2, strategy="fsdp", precision="fsdp-bf16", device="cpu", solve=())
    assert plan(cnn, x, gpu="H100", gpus=2, strategy="fsdp", precision="bf16-mixed", device="cpu", solve=()).fits


def test_a_ddp_plan_with_parameters_that_get_no_gradient_says_ddp_raises():
    """A parameter the forward never uses: a real DDP step raises at its next iteration unless built with
    find_unused_parameters=True (measured on gloo); the plan said nothing of it."""
    import torch

    from estimator.plan import plan

    class Unused(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.extra = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)

        def forward(self, x):
            return self.lin(x).sum()

    p = plan(Unused(), torch.randn(4, 8), gpu="H100", gpus=2, strategy="ddp", device="cpu", solve=())
    assert any("find_unused_parameters=True" in n for n in p.notes)

"""The command line: outputs, help, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args: str, cwd: str = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "estimator", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def _one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("estimator: error:")]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_json_output_has_the_schema(tmp_path):
    out = tmp_path / "r.json"
    proc = run("estimate", "examples/mlp.py:build", "--format", "json", "--output", str(out), "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(out.read_text())
    assert set(d["params"]) >= {"total", "trainable"}
    assert set(d["memory"]) >= {"parameters", "buffers", "gradients", "optimizer_state", "activations", "peak"}
    assert set(d["flops"]) >= {"forward", "backward", "matmul_forward", "matmul_backward", "by_dtype"}
    assert isinstance(d["modules"], list) and isinstance(d["unsupported_ops"], list)
    # The example's parameters, counted from the module itself in this run.
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        import mlp
    finally:
        sys.path.pop(0)
    model, _ = mlp.build()
    assert d["params"]["total"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("fmt,marker", [("table", "Per module"), ("markdown", "|")])
def test_table_and_markdown(fmt, marker):
    proc = run("estimate", "examples/cruncher.py:build", "--format", fmt, "--depth", "1")
    assert proc.returncode == 0, proc.stderr
    assert marker in proc.stdout and "Memory: peak" in proc.stdout


def test_input_shapes_from_the_command_line():
    proc = run("estimate", "examples/vgg.py:model", "--input", "2x3x32x32", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["loss"].startswith("default")


def test_help_documents_every_option_with_an_example():
    top = run("--help")
    assert top.returncode == 0 and "estimate" in top.stdout
    sub = run("estimate", "--help")
    assert sub.returncode == 0
    for option in ("--input", "--optimizer", "--device", "--format", "--depth", "--precision", "--mode",
                   "--checkpoint", "--output", "--plot", "--debug"):
        assert option in sub.stdout
    assert "examples:" in sub.stdout and "e.g." in sub.stdout


@pytest.mark.parametrize(
    "args,needles",
    [
        (("estimate", "examples/nothere.py:build"), ("no such file",)),
        (("estimate", "examples/mlp.py:nope"), ("no callable 'nope'",)),
        (("estimate", "examples/mlp.py"), ("bad SPEC",)),
        (("estimate", "no_such_package_xyz:build"), ("cannot import module",)),
        (("estimate", "examples/vgg.py:model", "--input", "2x3xfoo"), ("bad shape",)),
        (("estimate", "examples/vgg.py:model"), ("--input",)),
        (("estimate", "examples/vgg.py:model", "--input", "2x5x32x32"), ("features.0", "channels")),
        (("estimate", "examples/mlp.py:build", "--optimizer", "lion"), ("unknown optimizer",)),
        (("estimate", "examples/mlp.py:build", "--checkpoint", "Nope"), ("no module of that class",)),
        (("estimate", "examples/mlp.py:build", "--input", "4x8:complex7"), ("unknown dtype",)),
        # (a comparison's rows searched no sequence: it was dropped without a word)
        (("plan", "examples/mlp.py:build", "--gpu", "H100", "--compare", "--solve", "seq"),
         ("--solve seq answers for one layout",)),
    ],
)
def test_user_errors_are_one_line_exit_2(args, needles):
    _one_line_error(run(*args), *needles)


def test_nothing_half_written_on_error(tmp_path):
    out = tmp_path / "r.json"
    proc = run("estimate", "examples/vgg.py:model", "--input", "2x5x32x32", "--format", "json", "--output", str(out))
    assert proc.returncode == 2
    assert not out.exists() and os.listdir(tmp_path) == []


def test_debug_shows_the_traceback():
    proc = run("estimate", "examples/mlp.py:nope", "--debug")
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_higher_order_operators_are_named_not_blamed_on_shapes(tmp_path):
    spec = tmp_path / "cond.py"
    spec.write_text(
        "import torch\n"
        "class C(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.l = torch.nn.Linear(4, 4)\n"
        "    def forward(self, x):\n"
        "        h = self.l(x)\n"
        "        return torch.cond(h.sum() > 0, lambda h: h.sin(), lambda h: h.cos(), (h,)).mean()\n"
        "def build():\n"
        "    return C(), torch.randn(2, 4)\n")
    _one_line_error(run("estimate", f"{spec}:build"), "higher-order operator cond")


# -- issue 23 item 5: every bad command line one line, exit 2 (run in this process through estimator.cli.main) --


def _main(capsys, *args: str) -> tuple[int, str, str]:
    from estimator.cli import main

    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("args,needle", [
    # argparse's own refusals: the message alone, not the 10-17 lines of usage before it
    (("estimate", "examples/mlp.py:build", "--seq", "abc"), "argument --seq: invalid int value: 'abc'"),
    (("estimate", "examples/mlp.py:build", "--precision", "bf17"), "argument --precision: invalid choice: 'bf17'"),
    (("plan", "examples/mlp.py:build"), "the following arguments are required: --gpu"),
    (("plan", "examples/mlp.py:build", "--gpu", "H100", "--tokens", "100Q"), "'100Q' is not a count"),
    (("plan", "examples/mlp.py:build", "--gpu", "H100", "--gpus", "eight"), "'eight' is not a number"),
    (("estimate",), "the following arguments are required: SPEC"),
    # (validate runs --mode inference and generate: a model that takes no token ids cannot generate)
    (("validate", "examples/mlp.py:build", "--mode", "generate", "--new-tokens", "4", "--device", "cpu"),
     "has no prepare_inputs_for_generation"),
    # accepted silently before
    (("estimate", "examples/mlp.py:build", "--format", "csv", "--output", "r.json"),
     "--format csv but --output r.json names a json file"),
    (("plan", "examples/mlp.py:build", "--gpu", "H100", "--format", "json", "--output", "plan.md"),
     "--format json but --output plan.md names a markdown file"),
    (("estimate", "hf:gpt2", "--set", "num_hidden_layers=-1"), "--set num_hidden_layers=-1: a layer count must be"),
    (("estimate", "hf:llama", "--set", "text_config.num_hidden_layers=0"), "a layer count must be an integer >= 1"),
    (("estimate", "hf:gpt2", "--set", "n_layer=0"), "--set n_layer=0: a layer count"),
    (("estimate", "examples/mlp.py:build", "--mode", "inference", "--zero-grad", "before-backward"),
     "drop --zero-grad"),
    (("estimate", "examples/mlp.py:build", "--mode", "inference", "--optimizer", "sgd"),
     "--optimizer applies to training steps; --mode inference"),
    (("estimate", "examples/mlp.py:build", "--mode", "inference", "--keep-output"), "--keep-output applies"),
    (("estimate", "examples/mlp.py:build", "--mode", "inference", "--grad-accum", "4"), "--grad-accum applies"),
    (("estimate", "examples/mlp.py:build", "--mode", "inference", "--checkpoint", "Linear"),
     "--checkpoint is a what-if of training steps"),
    (("validate", "examples/mlp.py:build", "--checkpoint", "Linear"), "--checkpoint is a what-if of 'estimator estimate'"),
    (("estimate", "examples/mlp.py:build", "--clip-grad-norm", "0"), "clip_grad_norm must be a number > 0"),
    (("estimate", "examples/mlp.py:build", "--ema", "1.5"), "a number between 0 and 1"),
    (("plan", "examples/mlp.py:build", "--gpu", "H100", "--ema", "0"), "a number between 0 and 1"),
    (("estimate", "examples/mlp.py:build", "--mode", "inference", "--clip-grad-norm", "1"),
     "--clip-grad-norm applies to training steps"),
    (("estimate", "examples/mlp.py:build", "--quantize", "int4"), "add --lora (QLoRA: adapters trained over them), or size serving with estimate --mode inference or generate"),
    (("estimate", "examples/mlp.py:build", "--prompt-len", "8"), "--prompt-len size generation: add --mode generate"),
    (("estimate", "hf:gpt2", "--mode", "generate", "--prompt-len", "8"), "--mode generate needs --new-tokens"),
    (("estimate", "examples/mlp.py:build", "--cuda-torch", "2.x"), "give a torch release as MAJOR.MINOR"),
    (("plan", "examples/mlp.py:build", "--gpu", "H100", "--cuda-torch", "latest"), "give a torch release as MAJOR."),
    (("validate", "examples/mlp.py:build", "--cuda-torch", "2.7"), "unrecognized arguments: --cuda-torch 2.7"),
])
def test_every_bad_command_line_is_one_line_exit_2(tmp_path, monkeypatch, capsys, args, needle):
    monkeypatch.chdir(tmp_path)  # a refused --output must leave nothing behind
    if any(a.startswith("hf:") for a in args):
        pytest.importorskip("transformers")
    args = tuple(os.path.join(ROOT, a) if a.startswith("examples/") else a for a in args)
    code, out, err = _main(capsys, *args)
    lines = err.strip().splitlines()
    assert code == 2 and out == "", err
    assert len(lines) == 1 and lines[0].startswith("estimator: error: ") and needle in lines[0], err
    assert os.listdir(tmp_path) == []


def test_estimate_validate_and_plan_share_their_defaults():
    import argparse

    from estimator.cli import build_parser
    from estimator.cli.options import precision_of

    parser = build_parser()
    spec = "examples/mlp.py:build"
    defaults = {cmd: parser.parse_args([cmd, spec] + (["--gpu", "H100"] if cmd == "plan" else []))
                for cmd in ("estimate", "validate", "plan")}
    assert {precision_of(a) for a in defaults.values()} == {"bf16-mixed"}
    # serving: weights cast, as models are served
    assert precision_of(parser.parse_args(["estimate", spec, "--mode", "inference"])) == "bf16"
    # the optimizer and the loop are filled in the same way by every command (None: not given on the line)
    assert {(a.optimizer, a.grad_accum, a.keep_output) for a in defaults.values()} == {(None, None, False)}
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for cmd in ("estimate", "validate", "plan"):
        text = commands[cmd].format_help()  # what --help prints
        assert "(default: bf16-mixed, the same in estimate, validate and plan" in " ".join(text.split()), cmd


def test_a_builders_exit_text_set_values_and_plot_suffixes_are_said_in_one_line(tmp_path):
    """A builder that calls sys.exit(3) exited 3 saying nothing; a --set value taken as text showed only torch's
    "expected one of:"; --plot x.gif without matplotlib asked to install it, which would then refuse .gif."""
    (tmp_path / "m.py").write_text(
        "import sys, torch\n"
        "def build(batch=2):\n    return torch.nn.Linear(4, 2), torch.randn(batch, 4)\n"
        "def leaves():\n    sys.exit(3)\n")
    _one_line_error(run("estimate", "m.py:leaves", "--device", "cpu", cwd=str(tmp_path)), "called sys.exit(3)")
    _one_line_error(run("estimate", "m.py:build", "--set", "batch=abc", "--device", "cpu", cwd=str(tmp_path)),
                    "--set batch='abc' was passed as text")
    _one_line_error(run("estimate", "m.py:build", "--device", "cpu", "--plot", "x.gif", cwd=str(tmp_path)),
                    "unknown image suffix '.gif'")
    assert not (tmp_path / "x.gif").exists()

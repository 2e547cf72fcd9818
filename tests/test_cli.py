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

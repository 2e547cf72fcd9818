"""Inputs a new user gives that once ended in a traceback or a wrong hint (found by trying about 200 commands as
ML engineers write them), each now a one-line error with exit code 2 that says what to fix."""

from __future__ import annotations

import os

from test_cli import _one_line_error, run


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

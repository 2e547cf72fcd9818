"""validate (estimate vs a live run) and the hardware table."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import zoo
from estimator import UserError
from estimator.hardware import GPUS, lookup, match_device_name
from estimator.validate import validate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name", ["mlp", "gpt", "vgg", "mobilenet", "hf_gpt2"])
def test_cpu_validation_within_tolerance(name):
    if name in zoo.HF:
        pytest.importorskip("transformers")
    model, inputs, loss_fn = zoo.ZOO[name]()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    training = model.training
    result = validate(model, inputs, loss_fn=loss_fn, device="cpu", steps=1, tolerance=1.0)
    d = result.to_dict()
    assert set(d["rows"]) == {"parameters", "buffers", "gradients", "optimizer_state", "activations", "peak",
                              "flops_forward", "flops_backward"}
    assert result.ok, result.render()
    assert d["step_time_s"] > 0 and d["achieved_flops_per_s"] > 0 and d["mfu"] is None
    # The user's model is untouched.
    assert model.training == training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_meta_model_is_materialised_for_the_run():
    model, inputs, loss_fn = zoo.ZOO["mlp"](device="meta")
    result = validate(model, inputs, loss_fn=loss_fn, device="cpu", steps=1)
    assert result.rows["parameters"]["error"] == 0 and result.rows["flops_forward"]["error"] == 0


def test_refuses_when_it_would_not_fit(monkeypatch):
    model, inputs, loss_fn = zoo.ZOO["mlp"]()
    monkeypatch.setattr(os, "sysconf", lambda name: 1)  # 1 page of 1 byte free
    with pytest.raises(UserError, match="--force"):
        validate(model, inputs, loss_fn=loss_fn, device="cpu", steps=1)


def test_cli_validate_exit_codes():
    ok = subprocess.run([sys.executable, "-m", "estimator", "validate", "examples/mlp.py:build", "--device", "cpu",
                         "--steps", "1", "--format", "json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["ok"] is True


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["gpt", "vgg", "hf_gpt2"])
def test_gpu_validation(name):
    model, inputs, loss_fn = zoo.ZOO[name]()
    result = validate(model, inputs, loss_fn=loss_fn, device="cuda", steps=3, tolerance=5.0,
                      precision="bf16-mixed")
    assert result.rows["parameters"]["error"] == 0
    assert abs(result.rows["peak"]["error"]) < 0.05, result.render()
    assert result.predicted_step_time_s is not None and "predicted" in result.render()


def test_hardware_table_has_the_required_gpus_and_lecture_figures():
    names = {g.name for g in GPUS}
    assert {"V100", "A100-40GB", "A100-80GB", "H100-SXM", "H100-PCIe", "H200", "B200", "L4", "L40S", "RTX3090",
            "RTX4090", "MI300X"} <= names
    # CS336 lecture 2: A100 19.5 TFLOP/s fp32 and 312 bf16; H100 67.5 fp32 (datasheet: 67) and 989.5 bf16 dense.
    assert lookup("a100").peak_flops("fp32") == 19.5e12 and lookup("A100-80GB").peak_flops("bf16") == 312e12
    assert lookup("h100").peak_flops("bf16") == pytest.approx(989.5e12, rel=1e-3)
    assert match_device_name("NVIDIA H100 80GB HBM3").name == "H100-SXM"
    assert match_device_name("NVIDIA A100-SXM4-80GB").name == "A100-80GB"
    assert match_device_name("Some Future GPU") is None


def test_unknown_gpu_lists_close_names():
    with pytest.raises(UserError, match="H100"):
        lookup("H10")


def test_cli_hardware():
    proc = subprocess.run([sys.executable, "-m", "estimator", "hardware", "--format", "json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    assert {g["name"] for g in json.loads(proc.stdout)} == {g.name for g in GPUS}


def test_meta_model_with_tied_weights_stays_tied():
    model, inputs, loss_fn = zoo.ZOO["tied"](device="meta")
    result = validate(model, inputs, loss_fn=loss_fn, device="cpu", steps=1)
    assert result.rows["parameters"]["error"] == 0, result.render()


def test_rendered_rows_carry_units():
    from estimator.render import fmt_bytes, fmt_flops
    from estimator.validate import ROWS, Validation

    values = {name: (3 << 20) + i for i, name in enumerate(ROWS)}  # a few MiB each, distinct
    rows = {name: {"estimated": v, "measured": v + 1, "error": 1 / v} for name, v in values.items()}
    text = Validation("cpu", "cpu", rows, 0.5, 1e9, None, None, 5.0).render()
    for name, v in values.items():
        line = next(ln for ln in text.splitlines() if ln.startswith(name.replace("_", " ")))
        unit = fmt_flops if name.startswith("flops") else fmt_bytes
        assert unit(v) in line and unit(v + 1) in line and f"{v:,}" in line


def test_gpu_run_shows_the_predicted_step_time():
    """On a GPU the validation puts estimator.timing's prediction beside the measured median."""
    from estimator.validate import Validation

    v = Validation("cuda", "NVIDIA H100 80GB HBM3", {}, 0.050, 1e12, None, None, 5.0,
                   predicted_step_time_s=0.055, predicted_calibrated=True)
    text = v.render()
    # (55 - 50) / 50 = +10.0 %
    assert "step time: 50.00 ms (median), predicted 55.00 ms (+10.0%)" in text
    assert v.to_dict()["predicted_step_time_s"] == 0.055
    cpu = Validation("cpu", "cpu", {}, 0.050, 1e12, None, None, 5.0)
    assert "predicted" not in cpu.render() and cpu.to_dict()["predicted_step_time_s"] is None


def test_validate_measures_the_loop_the_estimate_models():
    """validate's live run measured another loop than the estimate's: a submodule the user put in eval ran in
    training mode (activations -6.67 % read as a miss), an input that requires grad was detached (backward FLOPs
    +18.18 %), the EMA's copies of the buffers were left out of its optimizer-state row (+131 % read as a miss).
    Each run here must agree within 1 %; the fp8 what-if and an optimizer in inference are refused in one line."""
    torch.manual_seed(0)
    frozen = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(),
                                 torch.nn.Linear(64, 4))
    frozen[1].eval()
    assert validate(frozen, torch.randn(16, 32), device="cpu", steps=1, tolerance=1.0).ok
    x = torch.randn(16, 32).requires_grad_(True)
    assert validate(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4)), x,
                    device="cpu", steps=1, tolerance=1.0).ok

    class WithTable(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(32, 32)
            self.register_buffer("table", torch.randn(512, 32))

        def forward(self, x):
            return self.lin(x + self.table[: x.shape[0]]).pow(2).mean()

    assert validate(WithTable(), torch.randn(16, 32), loss_fn=lambda o: o, device="cpu", steps=1, tolerance=1.0,
                    ema=0.999).ok
    # no optimizer: the model's own zero_grad frees the gradients, as the estimate's loop (peak -24 % read as a
    # miss); RAdam's steady state is its rectified 6th step, the estimate's figure (+34 % read as a miss)
    assert validate(WithTable(), torch.randn(16, 32), loss_fn=lambda o: o, device="cpu", steps=1, tolerance=1.0,
                    optimizer="none").ok
    assert validate(WithTable(), torch.randn(16, 32), loss_fn=lambda o: o, device="cpu", steps=1, tolerance=1.0,
                    optimizer="radam").ok
    # fp16-mixed: GradScaler skips the first steps (their gradients overflow at its first scales), which made no state
    # (0 B measured, +100 % read as a miss): measured once a step has stepped
    torch.manual_seed(0)
    tiny = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    result = validate(tiny, torch.randn(8, 32), device="cpu", precision="fp16-mixed", steps=1, tolerance=1.0)
    assert result.rows["optimizer_state"]["measured"] > 0 and result.ok, result.render()
    with pytest.raises(UserError, match="fp8 is a what-if"):
        validate(WithTable(), torch.randn(16, 32), loss_fn=lambda o: o, device="cpu", precision="fp8")
    with pytest.raises(UserError, match="optimizer shape"):
        validate(WithTable(), torch.randn(16, 32), device="cpu", mode="inference", optimizer="sgd")

"""The estimator on a GPU that none of its constants was fitted on: one NVIDIA H200, measured by this project.

Ground truth: ``tests/data/h200`` (see its README; torch 2.11, recorded by ``benchmarks/record_kernels.py`` and
``benchmarks/record_h100.py``).  The H200's time model is the H100's measured constants on the H200's
datasheet (``estimator/timing/catalog.py: SIBLINGS``); its capacity is the hardware table's.  Estimated here
on CPU fake tensors:

* the capacity torch reports, from the table;
* the largest micro-batch of three searches, equal to the largest that ran three steps on the card;
* steady-state and first-step peaks (``max_memory_allocated``) within 1 %;
* single kernels (NeuSight's shapes and method): the shipped model and the structure fitted on the public GPUs
  without the H200, each against its measured fp32 kernels and bf16 GEMMs;
* training steps: fp32 transformer steps within 10 %, and the others within the bounds the comments give.

``benchmarks/h200.py`` prints every table (16 steps, 9 peaks, the kernels).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import h100_cases  # noqa: E402
from test_public_kernels import FK, PK  # noqa: E402

DATA = os.path.join(HERE, "data", "h200")


def _lines(name: str) -> list[dict]:
    return h100_cases.recorded("h200", name)


DEVICE = json.load(open(os.path.join(DATA, "device.json")))
TORCH = DEVICE["torch"].split("+")[0]
MEMORY = {(r["case"], r["precision"], json.dumps(r["loop"])): r for r in _lines("memory.jsonl")}
TIMING = {(r["case"], r["precision"]): r["step_s_median"] for r in _lines("timing.jsonl")}


def _estimate(case_fn, precision: str, **kwargs):
    from estimator import estimate

    logging.getLogger("estimator").setLevel(logging.ERROR)
    model, inputs, loss_fn = case_fn()
    return estimate(model, inputs, loss_fn=loss_fn, optimizer="adamw:lr=1e-05", device="cuda", precision=precision,
                    gpu="H200", cuda_torch=TORCH, **kwargs)


def test_capacity_is_what_the_card_reports():
    """``total_memory`` of the table's H200 against ``get_device_properties(0).total_memory`` on the card
    (150,109,880,320 B): the table held 143,156 MiB from another printout (64 KiB more) and now this card's."""
    from estimator.hardware import lookup

    assert lookup("NVIDIA H200").capacity == DEVICE["total_memory"]
    assert DEVICE["mem_get_info_total"] == DEVICE["total_memory"]


@pytest.mark.parametrize("rec", _lines("maxbatch.jsonl"), ids=lambda r: f"{r['case']}__{r['precision']}")
def test_largest_micro_batch_is_the_one_that_ran(rec):
    """The search's answer is the largest batch that ran three steps on the H200, one more ran out of memory
    (as ``test_h100_loops``; the card has 1.77x the H100's bytes, and the answers are 1.79, 1.78 and 1.79x)."""
    pytest.importorskip("transformers")
    assert rec["exact"] and rec["smallest_failing"] == rec["largest"] + 1
    report = _estimate(h100_cases.SEARCHES[rec["case"]](8), rec["precision"])
    assert report.max_batch == rec["largest"], (report.max_batch, rec["largest"], report.max_batch_note)


# (case, precision, step-time bounds as estimated / measured): fp32 transformer steps held to the 10 %
# (GPT-2 124M 0.990); the others to their ratio as first measured (2026-11-28) widened by about 0.1, so a change
# that makes them worse fails: GPT-2 124M bf16 0.859 (now 0.856) and the Qwen2-0.5B shape bf16 0.785 (0.779;
# estimated GPU-bound at 76 ms with 87 ms of host work; measured 125 ms, 8 % slower than on the H100 where the
# same estimate is 0.92x); the small CNN 0.502 (0.494; a launch-bound step of 3.05 ms: 2.45 ms on the H100,
# 2.18 ms on another start of it); ConvNeXt-Tiny bf16 0.966 (0.957) and fp32 0.887 (0.886; 0.714 before its
# channels-last depthwise convolutions
# were timed as cuDNN runs them, estimator/timing/depthwise.py; held to the 10 % from above and 20 %
# below).
# The last field: whether the measured step falls in the estimate's likely range (11 of the 16 steps do, the
# sibling band's kernel figures coming from the H200's own kernels; the 5 out are host- or launch-bound).
STEPS = [("gpt2_124m", "fp32", (0.90, 1.10), True), ("gpt2_124m", "bf16-mixed", (0.75, 1.10), True),
         ("qwen2_05b_b4", "bf16-mixed", (0.68, 1.10), False), ("small_cnn_b64", "fp32", (0.40, 1.10), False),
         ("convnext_tiny_b32", "bf16-mixed", (0.90, 1.10), True), ("convnext_tiny_b32", "fp32", (0.80, 1.10), True)]


@pytest.mark.parametrize("case,precision,bounds,in_band", STEPS, ids=[f"{c}__{p}" for c, p, _, _ in STEPS])
def test_peak_and_step_time_on_the_h200(case, precision, bounds, in_band):
    """One estimate per case: its peaks (the output released before backward, as the recorder's loop) within
    1 % of ``max_memory_allocated()`` on the card, its step time within ``bounds`` of the measured median, and
    the measured median inside the likely range or not, as ``in_band`` says."""
    pytest.importorskip("transformers")
    report = _estimate(h100_cases.MODELS[case], precision, solve_batch=False)
    rec = MEMORY[(case, precision, "{}")]
    assert report.memory.peak == pytest.approx(rec["steps"][1]["peak"], rel=0.01)
    assert report.memory.peak_first_step == pytest.approx(rec["steps"][0]["peak"], rel=0.01)
    measured = TIMING[(case, precision)]
    ratio = report.step_time.total / measured
    assert bounds[0] <= ratio <= bounds[1], ratio
    lo, hi = report.step_time.likely
    assert (lo <= measured <= hi) == in_band, (lo / measured, hi / measured)


@pytest.fixture(scope="module")
def unseen():
    fit = FK.fit_all(PK.load_sample(), per_family=120)
    files = [os.path.join(DATA, f) for f in ("kernels.csv.gz", "kernels_bf16.csv.gz")]
    return FK.unseen(fit, [k for path in files for k in PK.load_sample(path)])["H200"]


def test_kernel_data():
    fp32 = PK.load_sample(os.path.join(DATA, "kernels.csv.gz"))
    half = PK.load_sample(os.path.join(DATA, "kernels_bf16.csv.gz"))
    assert {k.gpu for k in fp32 + half} == {"H200"} and {k.dtype for k in half} == {"bfloat16"}
    assert {k.family for k in fp32} == {"gemm", "conv", "elementwise", "reduction", "norm"}
    assert {k.family for k in half} == {"gemm"} and all(k.latency_s > 0 for k in fp32 + half)
    assert "MIT License" in open(os.path.join(DATA, "LICENSE.neusight-shapes")).read()


def test_shipped_model_on_the_h200s_kernels(unseen):
    """The H100's constants on the H200's datasheet against the H200's own kernels (fp32, TF32 off, and bf16
    GEMMs; kernels at least 3x the harness's floor).  Measured (``benchmarks/fit_kernels.py --sample``):
    median |error| elementwise 3.8 %, fp32 GEMMs 12.8 %, bf16 GEMMs 15.7 % (leading dimensions' alignment
    applied: 4.5x slower than aligned ones when K or N is 2 bytes off), layer norm 10.0 %, softmax 24.7 % (23.2 % since the reduction class refit),
    fp32 convolutions 22.8 % (13.0, 15.5 and 23.4 % before the H100 refit of 2026-11-28).  Bound: the earlier
    figure + 5 points; the summed time of the memory-bound classes and GEMMs within 25 % (measured 0.90
    elementwise, 1.01 fp32 GEMMs, 0.87 bf16 GEMMs)."""
    shipped, half = unseen["shipped"], unseen["shipped_half"]
    for fam, measured in (("elementwise", 0.038), ("gemm", 0.130), ("norm", 0.100), ("reduction", 0.247),
                          ("conv", 0.234)):
        assert shipped[fam]["error"] <= measured + 0.05, (fam, shipped[fam])
    assert half["gemm"]["error"] <= 0.155 + 0.05, half["gemm"]
    for fam in ("elementwise", "gemm"):
        assert abs(math.log(shipped[fam]["time_ratio"])) <= math.log(1.25), (fam, shipped[fam])
    assert abs(math.log(half["gemm"]["time_ratio"])) <= math.log(1.25), half["gemm"]


def test_sibling_band_is_the_h200s_transfer_error(unseen):
    """A GPU timed from a sibling's constants carries, per family, the |median log error| of the H100's
    constants on the H200's own kernels (timing_structure.json ``sibling_band``): recomputed here from the data."""
    from estimator.timing import catalog

    shipped = catalog.sibling_band()
    figures = FK.sibling_band({"H200": unseen})
    assert set(shipped) == {"gemm", "conv", "memory", "tensor"}
    for fam, value in shipped.items():
        assert figures[fam] == pytest.approx(value, rel=1e-6), fam
    band = catalog.load_model("H200").band
    assert all(band[fam] == pytest.approx(max(value, 0.0)) for fam, value in shipped.items())


def test_structure_on_an_unseen_gpu(unseen):
    """The structural model (fitted on the 8 public GPUs, none of them the H200) predicting the H200's fp32
    kernels from its table entry: median |error| GEMMs 16.6 %, elementwise 13.5 %, layer norm 20.6 %, softmax
    21.2 % (bound: + 5 points), within the held-out errors of the public GPUs (GEMMs 14-36 %, elementwise
    3-14 %: test_public_kernels).  Its fp32 convolutions miss by 2.3x (median ratio 0.43): the convolution /
    GEMM ratio comes from GPUs before Hopper (cuDNN 8.9 on A100, V100, T4, P100, P4; the public H100 has
    GEMMs only), so no measured GPU tells it Hopper's; asserted so, for a change to show."""
    held = unseen["held_out"]
    for fam, measured in (("gemm", 0.166), ("elementwise", 0.135), ("norm", 0.206), ("reduction", 0.212)):
        assert held[fam]["error"] <= measured + 0.05, (fam, held[fam])
    assert held["conv"]["bias"] < 0.6, held["conv"]

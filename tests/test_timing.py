"""The step-time model (estimator/timing/) against measured H100 training steps.

Ground truth: tests/data/cuda_reference (real H100 measurements, see its README): median step
times and per-op CUDA-event times.  No expected time here is typed by hand: predictions are
compared with those measurements, and the constants are refitted without the model under test
(leave one model out: every batch size, length and precision of it) by benchmarks/fit_timing.py.
"""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
import sys
from pathlib import Path

import pytest
import torch

from estimator import estimate
from estimator import timing as T
from estimator.hardware import lookup as lookup_gpu
from estimator.rules.matmul import mm_flops

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "cuda_reference" / "timing"


def _fit_module():
    spec = importlib.util.spec_from_file_location("fit_timing", ROOT / "benchmarks" / "fit_timing.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fit_timing", module)
    spec.loader.exec_module(module)
    return module


F = _fit_module()

STEP_TOLERANCE = 0.10  # the goal: a held-out case's step within 10% of its measured median
STEP_BOUND = 0.25  # no held-out case is further off than this
MATMUL_TOLERANCE = 0.15  # a big matmul within 15% of its measured kernel time
# ... for at least this share of the big matmuls of all held-out cases: measured 0.793 (median error 8.6 %) since the
# depthwise convolutions are timed from their own kernels and left the fit (0.869 before, median 8.5 %): their
# n = 1 "GEMMs" had held the shared size constant n0 at 9.8 (now 12.1), and the fp32 attention bmm of the Llama
# fp32 cases ([64, 1024, 1024] with a 64-wide side) moved from 1.04-1.22x to 1.15-1.25x of their kernels while
# the held-out steps improved (16 -> 17 within 10 %, median error 9.5 % -> 8.5 %).  Bound: 0.793 - 4 points.
MATMUL_SHARE = 0.75

# Held-out cases the model misses by more than STEP_TOLERANCE, and why (strict: when one of them
# comes within the tolerance, the test fails until it is taken off this list).  The measured
# spread is max/min of the 5 synced steps the median comes from.
KNOWN_MISSES = {
    "bert_small__bf16-mixed": "launch-bound: host time of BERT's ops overestimated (predicted 1.12x)",
    "example_gpt__bf16-mixed": "launch-bound: host time overestimated (1.15x): the example GPT has less "
                               "Python per op than the HF models that set the forward's host constant",
    "example_gpt__fp32": "kernels right (7.6 ms of GPU work for 7.5 ms measured) but the simulated host "
                         "leaves the GPU idle longer than the real one (1.15x)",
    "example_vgg__bf16-mixed": "launch-bound: host time underestimated (0.87x)",
    "gpt2_124m_b2__bf16-mixed": "launch-bound; the 5 measured steps spread 34.9-42.3 ms (0.81x)",
    "llama_small_b1__bf16-mixed": "launch-bound; the 5 measured steps spread 32.7-40.4 ms (0.87x)",
    "mixtral_small__bf16-mixed": "sort-based index_put (~0.3 ms each) and the fp32 grouped-GEMM fallback are "
                                 "slower than modelled, and no other model has them (0.81x)",
    "mixtral_small__fp32": "as bf16-mixed (0.82x)",
    "mobilenet_v3_small_b64__bf16-mixed": "host-bound (about 19 ms of host work, 10 ms of GPU): held out, its ops' "
                                          "host constants come from the other models (1.13x)",
    "mobilenet_v3_small_b64__fp32": "as bf16-mixed (1.15x)",
    "resnet50_b16__bf16-mixed": "launch-bound; the 5 measured steps spread 23.9-30.8 ms (0.75x)",
    "resnet50_b64__bf16-mixed": "held out, the convolution constants come from VGG and MobileNet only (1.14x)",
    "resnet50_b64__fp32": "as resnet50_b64 bf16-mixed (1.13x)",
    "resnet50_b256__bf16-mixed": "as resnet50_b64 (1.13x)",
    "resnet50_b256__fp32": "as resnet50_b64 (1.13x)",
    "t5_small__fp32": "held out, 1.11x (1.09x until bf16 attention left the fit for its kernel measurements, "
                      "2026-11-28): its fp32 memory-efficient attention carries T5's position bias, and no other "
                      "model's does",
}


@pytest.fixture(scope="module")
def cases():
    return F.load_cases(str(DATA))


@pytest.fixture(scope="module")
def shipped():
    return T.load_model("H100-SXM")


@pytest.fixture(scope="module")
def lomo_rows(cases):
    return {f"{r['case']}__{r['precision']}": r for r in F.lomo(cases)}


def _case_keys():
    return sorted(p.name.removesuffix(".json.gz") for p in DATA.glob("*__*.json.gz"))


# -- the reference data and the constructors -------------------------------------------------


def test_reference_copy_is_complete(cases):
    """Every reference case is there, with its measured steps and one op record per op."""
    readme = (DATA.parent / "README.md").read_text()
    assert "H100" in readme and "torch 2.11.0" in readme
    assert len(cases) == 32
    for c in cases:
        assert c.step_s > 0 and len(c.works) == len(c.measured) == len(c.timed) > 0
        assert statistics.median(c.meta["step_s_all"]) == pytest.approx(c.step_s)


@pytest.mark.parametrize("key", ["example_gpt__bf16-mixed", "example_vgg__fp32", "lstm_2x512__bf16-mixed"])
def test_flops_from_records_equal_capture_and_rules(cases, key):
    """The two constructors agree: FLOPs per kind and phase from the CUDA reference records equal
    those from this project's capture of the same model, and those equal the rules' tally."""
    case = next(c for c in cases if c.key == key)
    net, inputs, loss_fn = F.build_case(case.name)
    report = estimate(net, inputs, loss_fn=loss_fn, device="cuda", precision=case.precision, keep_output=True)

    def by_kind(works):
        out: dict[tuple[str, str], int] = {}
        for w in works:
            if w.kind in T.COMPUTE_KINDS:
                out[(w.kind, w.phase)] = out.get((w.kind, w.phase), 0) + w.flops
        return out

    captured = T.works_of(report)
    assert by_kind(captured) == by_kind(case.works)
    tally = report.tally.flops
    model_flops = sum(w.flops for w in captured if w.kind in T.COMPUTE_KINDS and w.phase != "optimizer")
    assert model_flops == tally["matmul_forward"] + tally["matmul_backward"]


def test_gemm_shape_and_alignment_of_gpt2_lm_head(cases):
    """The LM head of GPT-2 in bf16: [8192, 768] @ [768, 50257], a 2-byte aligned leading dimension."""
    case = next(c for c in cases if c.key == "gpt2_124m__bf16-mixed")
    head = max((w for w in case.works if w.kind == T.MATMUL and w.phase == "forward"), key=lambda w: w.flops)
    tokens, vocab, hidden = 8 * 1024, 50257, 768  # record/cuda_trace.py: batch 8 x 1024, GPT2Config defaults
    assert (head.m, head.n, head.k) == (tokens, vocab, hidden)
    assert head.flops == mm_flops((tokens, hidden), (hidden, vocab))
    # 50257 bf16 elements = 100514 bytes: its lowest set bit is 2
    assert head.align == (vocab * 2) & -(vocab * 2) == 2


def test_math_helpers():
    # a broadcast [1, 4] viewed as [3, 4] (stride 0 on dim 0) addresses 4 elements, not 12
    assert T.footprint((3, 4), (0, 1)) == T.footprint((1, 4), (4, 1)) == 4
    assert T.alignment_bytes([64, 128], 2) == 16  # 128-byte and 256-byte rows: fully aligned
    n = 8  # 1024 / 128 blocks: the causal kernel does the n (n + 1) / 2 blocks on and below the diagonal
    assert T.causal_fraction(1024, 1024) == pytest.approx(n * (n + 1) / 2 / n ** 2)
    assert T.soft_max_p(3.0, 4.0, 2.0) == pytest.approx(math.hypot(3.0, 4.0))
    # 10 tensors of 65536 elements are 10 chunks; one launch takes 110 tensors and 320 chunks
    assert T.foreach_launches([65536] * 10, 1) == 1
    assert T.foreach_launches([65536] * 321, 1) == max(math.ceil(321 / 110), math.ceil(321 / 320))


# -- the fit reproduces the library's formulas ------------------------------------------------


def test_vectorised_fit_equals_gpu_seconds(cases, shipped):
    """The fit's vectorised kernel formulas (benchmarks/fit_timing.py) are timing.gpu_seconds."""
    feats = F._Features.of(cases, dict(shipped.peaks), timed=True)
    p = {k: torch.tensor(getattr(shipped, k), dtype=torch.float64)
         for k in ("launch_s", "library_s", "bandwidth", "overlap_p", "attention_backward", "conv_backward",
                   "fill_rows", "n0", "k0", "align_gamma")}
    p["memory_eff"] = torch.tensor([shipped.memory_eff[c] for c in T.MEMORY_CLASSES], dtype=torch.float64)
    p["eff"] = torch.tensor([shipped.eff[k] for k in feats.eff_keys], dtype=torch.float64)
    predicted = feats.predict(p)
    expected = torch.tensor([T.gpu_seconds(w, shipped) for w, _, _ in feats.rows], dtype=torch.float64)
    assert torch.allclose(predicted, expected, rtol=1e-9, atol=0)


def test_host_fit_linearisation_is_exact(cases, shipped):
    """The host fit's (a, b) equals the simulated step at the constants it was taken at."""
    table, classes = dict(shipped.cpu_inop), dict(shipped.cpu_inop_class)
    view = shipped.cpu_view
    c = torch.tensor([view["backward"], view["forward"] - view["backward"], 1.0, shipped.cpu_tensor],
                     dtype=torch.float64)
    for case in cases:
        tl = F._Timeline(case, [T.gpu_seconds(w, shipped) for w in case.works], table, classes)
        a, b = tl.linearise(c)
        assert float(a @ c) + b == pytest.approx(T.simulate(case.works, shipped).total, rel=1e-12)


def test_shipped_constants_are_the_fit(cases, shipped):
    """estimator/data/timing_h100.json is what benchmarks/fit_timing.py fits on the copied data."""
    refit = F.fit(cases)
    for name in ("launch_s", "library_s", "bandwidth", "overlap_p", "fill_rows", "n0", "k0", "align_gamma",
                 "cpu_tensor"):
        assert getattr(refit, name) == pytest.approx(getattr(shipped, name), rel=1e-3), name
    for key, value in shipped.eff.items():
        assert refit.eff[key] == pytest.approx(value, rel=1e-3), key
    assert refit.cpu_view == pytest.approx(dict(shipped.cpu_view), rel=1e-3)
    assert shipped.calibrated and "fitted on 32" in shipped.source


def test_provenance_of_every_constant(shipped, cases):
    prov = shipped.provenance
    keys = {c.key for c in cases}
    assert set(prov["cases"]) == keys and "torch 2.11.0" in prov["measurements"]
    kernels = prov["kernels"]
    for name in ("launch_s", "bandwidth", "attention_backward", "conv_backward", "align_gamma"):
        assert kernels[name]["fitted_from"] and set(kernels[name]["fitted_from"]) <= keys
    for key in shipped.eff:
        entry = kernels["eff"][key]
        assert entry.get("fitted_from") or entry.get("assumed_equal_to") in shipped.eff
    # the misaligned vocabularies (GPT-2's 50257, BERT's 30522) are among the alignment's sources
    assert {"gpt2_124m__bf16-mixed", "bert_small__bf16-mixed"} <= set(kernels["align_gamma"]["fitted_from"])


def test_extrapolated_gpu(shipped):
    """A GPU without measurements of its own or of a sibling: the structural model's constants
    (estimator/timing/structure.py) on its datasheet, the H100's host constants."""
    rtx = lookup_gpu("RTX4090")
    model = T.load_model(rtx)
    assert not model.calibrated and "extrapolated" in model.source
    s = T.catalog.structure()
    assert model.bandwidth == pytest.approx(s.bandwidth_frac * rtx.bandwidth)
    assert model.peaks["bf16"] == rtx.peak["bf16"] and model.cpu_view == shipped.cpu_view
    headroom = T.structure.power_headroom(rtx)
    assert model.eff["matmul.fp32"] == pytest.approx(s.gemm_eff * T.structure.power_factor(headroom, s.headroom0,
                                                                                           s.alpha))


# -- leave one model out ---------------------------------------------------------------------


@pytest.mark.parametrize("key", [
    pytest.param(k, marks=pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[k])) if k in KNOWN_MISSES else k
    for k in _case_keys()])
def test_held_out_step_within_10_percent(lomo_rows, key):
    row = lomo_rows[key]
    assert abs(row["ratio"] - 1) <= STEP_TOLERANCE, (
        f"{key}: predicted {row['predicted_s'] * 1e3:.1f} ms, measured {row['measured_s'] * 1e3:.1f} ms")


def test_held_out_steps_bounded(lomo_rows):
    worst = max(lomo_rows.values(), key=lambda r: abs(r["ratio"] - 1))
    assert abs(worst["ratio"] - 1) <= STEP_BOUND, worst["case"]
    within = sum(abs(r["ratio"] - 1) <= STEP_TOLERANCE for r in lomo_rows.values())
    assert within == len(lomo_rows) - len(KNOWN_MISSES)


def test_held_out_big_matmuls(lomo_rows):
    """Per op: the big GEMMs (by FLOPs, 80% of each case's timed GEMM FLOPs) of held-out models."""
    errors = [abs(m["predicted_s"] / m["measured_s"] - 1) for r in lomo_rows.values() for m in r["matmuls"]]
    assert len(errors) > 300
    assert sum(e <= MATMUL_TOLERANCE for e in errors) >= MATMUL_SHARE * len(errors)
    assert statistics.median(errors) <= 0.10


# -- the API on this project's capture -----------------------------------------------------------


@pytest.fixture(scope="module")
def gpt_report():
    net, inputs, _ = F.build_case("example_gpt")
    return estimate(net, inputs, device="cuda", precision="bf16-mixed")


def test_step_time_on_a_capture(gpt_report, cases):
    st = T.step_time(gpt_report, "H100")
    assert st.calibrated and st.gpu == "H100-SXM"
    assert st.forward + st.backward + st.optimizer == pytest.approx(st.total)
    assert min(st.forward, st.backward, st.optimizer) > 0
    assert st.total >= max(st.gpu_busy, 0.0) and st.total <= st.gpu_busy + st.host
    assert st.achieved_flops == pytest.approx(st.model_flops / st.total)
    assert st.mfu == pytest.approx(st.model_flops / (st.total * lookup_gpu("H100").peak["bf16"]))
    top = st.top(5)
    assert [o.gpu_s for o in top] == sorted((o.gpu_s for o in st.ops), reverse=True)[:5]
    assert json.dumps(st.to_dict())
    measured = next(c for c in cases if c.key == "example_gpt__bf16-mixed").step_s
    assert abs(st.total / measured - 1) <= STEP_BOUND


def test_steady_state_drops_first_step_optimizer_state(gpt_report):
    """The capture traces step 1, which creates AdamW's state (zeros_like per tensor); a steady step
    does not."""
    first = T.works_of(gpt_report, steady_state=False)
    steady = T.works_of(gpt_report)
    dropped = [w for w in first if w not in steady]
    assert dropped and all(w.phase == "optimizer" for w in dropped)
    assert T.step_time(gpt_report).total < T.simulate(first, T.load_model()).total


def test_timeline_host_and_gpu_bound():
    gpu, host = [1e-3] * 4, [1e-5] * 4
    total, _ = T.timeline(gpu, host, [False] * 4)
    assert total == pytest.approx(host[0] + sum(gpu))  # GPU-bound: the first launch, then the kernels
    total, _ = T.timeline(host, gpu, [False] * 4)
    assert total == pytest.approx(sum(gpu) + host[-1])  # host-bound: the host, then the last kernel
    total, _ = T.timeline([1e-3, 0.0, 1e-3], [1e-5, 1e-5, 1e-5], [False, True, False])
    assert total == pytest.approx(1e-5 + 1e-3 + 1e-5 + 1e-3)  # the sync waits for the first kernel


def test_packed_sequence_rnn_work_equals_the_rules():
    """A PackedSequence LSTM on the CUDA target is one _cudnn_rnn over rows [sum of lengths, I]: its time
    model reads the rows (not steps x batch of a padded input), so its FLOPs equal the rules' tally."""
    import zoo

    net, inputs, loss_fn = zoo.packed_lstm()
    report = estimate(net, inputs, loss_fn=loss_fn, device="cuda")
    rnn = [w for w in T.works_of(report) if w.kind == T.RNN]
    assert len(rnn) == 2  # forward and backward
    model_flops = sum(w.flops for w in T.works_of(report) if w.kind in T.COMPUTE_KINDS and w.phase != "optimizer")
    tally = report.tally.flops
    assert model_flops == tally["matmul_forward"] + tally["matmul_backward"]

"""``estimate(float8=...)``: float8 training as torchao's ``convert_to_float8_training`` runs it
(estimator.float8).

Ground truth measured in the same test: the same model converted by torchao for real and one training step run
on CPU tensors (torchao's float8 layers run there), under ``saved_tensors_hooks`` (what the float8 layers save
for backward) and ``FlopCounterMode`` (FLOPs per module).  Beside it the H100 recording
(tests/data/h100_loops/compile.jsonl): peaks of float8 steps on the GPU.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

pytest.importorskip("torchao")


def _real_float8_step(model, inputs, loss_fn, recipe):
    """(saved bytes by dtype, FlopCounterMode's counts by module) of a real CPU step of ``model`` converted by
    torchao with torchtitan's filter (every Linear but the output head)."""
    from torch.utils.flop_counter import FlopCounterMode
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    real = copy.deepcopy(model)
    convert_to_float8_training(real, config=Float8LinearConfig.from_recipe_name(recipe),
                               module_filter_fn=lambda m, fqn: fqn.rpartition(".")[2] != "lm_head")
    kept = {t.untyped_storage().data_ptr() for t in list(real.parameters()) + list(real.buffers())}
    saved: dict[int, tuple[int, str]] = {}

    def pack(x):
        storage = x.untyped_storage()
        if storage.data_ptr() not in kept:
            saved[storage.data_ptr()] = (storage.nbytes(), str(x.dtype).removeprefix("torch."))
        return x

    with FlopCounterMode(display=False) as counter:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            loss = loss_fn(real(**inputs))
        loss.backward()
    by_dtype: dict[str, int] = {}
    for n, dtype in saved.values():
        by_dtype[dtype] = by_dtype.get(dtype, 0) + n
    return by_dtype, counter.get_flop_counts()


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_step_saves_and_counts_what_torchaos_step_does(recipe):
    """What the float8 layers save (bytes per dtype) equals the real step's; the float8 GEMMs' FLOPs equal
    FlopCounterMode's matmul FLOPs of every layer but the output head (torchao's layers on CPU tensors run their
    GEMMs as matmuls FlopCounterMode counts; the head stays in high precision)."""
    pytest.importorskip("transformers")
    import test_compile
    from estimator import estimate

    _, model, inputs, loss_fn = test_compile.llama_case(compiled=False)
    report = estimate(model, inputs, device="cpu", precision="fp32", float8=recipe, solve_batch=False)
    saved, counts = _real_float8_step(model, inputs, loss_fn, recipe)
    assert dict(report.tally.memory_by_dtype["saved"]) == saved
    assert not report.tally.unsupported
    matmul = torch.ops.aten.mm
    total = counts["Global"][matmul]
    head = counts["LlamaForCausalLM.lm_head"][matmul]
    float8 = sum(v for k, v in report.tally.flops_by_dtype.items() if k.startswith("float8"))
    assert float8 == total - head  # (the real step's attention on CPU is not in FlopCounterMode's mm)
    # and the converted layers' aten.mm (on torchao's Float8TrainingTensor, run as the _scaled_mm inside it) no
    # second time in high precision: the estimate's aten.mm is the head's alone (it was every layer's: +41 %)
    rows = next(r for r in report.tally.by_operator if r["op"] == "aten.mm")
    assert rows["flops_forward"] + rows["flops_backward"] == head
    assert any(note.startswith(f"float8 {recipe}") for note in report.capture.assumptions)


def test_float8_without_torchao_says_what_to_install(monkeypatch):
    from estimator import estimate
    from estimator.errors import UserError

    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # import fails as if not installed
    with pytest.raises(UserError, match="pip install torchao"):
        estimate(torch.nn.Linear(32, 32), torch.randn(4, 32), device="cpu", float8="tensorwise")


def test_a_model_with_no_convertible_layer_is_refused():
    from estimator import estimate
    from estimator.errors import UserError

    with pytest.raises(UserError, match="converts no layer"):
        estimate(torch.nn.Linear(30, 30), torch.randn(4, 30), device="cpu", float8="rowwise")


_COMPILE = [json.loads(line) for line in open(os.path.join(HERE, "data", "h100_loops", "compile.jsonl"))]
# the float8 steps the H100 ran (155M Llama, bf16-mixed, every Linear but lm_head in float8): eager tensorwise
# and, compiled per block, tensorwise and rowwise
FLOAT8 = [(None, "tensorwise", 0.01), ("block", "tensorwise", 0.04), ("block", "rowwise", 0.04)]


@pytest.mark.parametrize("compile_,recipe,tolerance", FLOAT8, ids=[f"{c}-{r}" for c, r, _ in FLOAT8])
def test_float8_peaks_on_the_h100(compile_, recipe, tolerance):
    """The steady-state peak within ``tolerance`` of max_memory_allocated (eager 0.991x; compiled 1.032x and
    1.033x: what Inductor's float8 graphs keep is not all modelled, docs/compile.md)."""
    pytest.importorskip("transformers")
    import h100_cases
    from estimator import estimate

    logging.getLogger("estimator").setLevel(logging.ERROR)
    rec = next(r for r in _COMPILE if r["case"] == "llama_small" and r["compile"] == compile_
               and r["float8"] == recipe and r["pass"] == "warm")
    model, inputs, loss_fn = h100_cases.MODELS["llama_small"]()
    report = estimate(model, inputs, loss_fn=loss_fn, optimizer="adamw:lr=1e-05", device="cuda",
                      precision="bf16-mixed", gpu="H100", cuda_torch="2.11", compile=compile_, float8=recipe,
                      solve_batch=False)
    assert report.memory.peak == pytest.approx(rec["steps"][1]["peak"], rel=tolerance)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_each_float8_gemm_is_timed_as_the_kernel_torchao_calls(recipe, monkeypatch):
    """The variant of every ``_scaled_mm`` (timing.float8: scale granularity and fast accumulation) is the one
    torchao's real layers call, recorded here by wrapping ``torch._scaled_mm`` around a real CPU step: the output
    GEMM with fast accumulation, the gradient GEMMs without; rowwise gradients run the tensorwise kernel with the
    scales applied afterwards (torchao's ``addmm_float8_unwrapped``)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from estimator.capture import capture
    from estimator.capture.options import StepOptions
    from estimator.float8 import converted
    from estimator.timing import float8
    from estimator.timing.records import OpWork

    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))

    x = torch.randn(32, 64)
    calls, real_mm = [], torch._scaled_mm

    def recording(a, b, scale_a, scale_b, *args, use_fast_accum=False, **kwargs):
        calls.append(float8.variant(scale_a.numel(), use_fast_accum))
        return real_mm(a, b, scale_a, scale_b, *args, use_fast_accum=use_fast_accum, **kwargs)

    real = build()
    convert_to_float8_training(real, config=Float8LinearConfig.from_recipe_name(recipe))
    monkeypatch.setattr(torch, "_scaled_mm", recording)
    real(x).sum().backward()
    monkeypatch.undo()
    model, _ = converted(build(), recipe)
    cap = capture(model, x, StepOptions(optimizer=None))
    estimated = [OpWork.from_node(n).backend for n in cap.nodes if "_scaled_mm" in str(getattr(n, "target", ""))]
    assert sorted(estimated) == sorted(calls)
    assert set(calls) == {f"{recipe}_fast", "tensorwise"}


def test_float8_gemm_ratios_are_the_fit_on_the_h200s_kernels():
    """``estimator/data/float8.json`` is ``benchmarks/fit_float8.py``'s fit of the measured float8 GEMMs (each
    variant's fraction of the float8 peak over the bf16 GEMMs' fraction of the bf16 peak, one H200 run): refitted
    here from the kernels, the ratios agree; with them the shipped model misses the float8 kernels the torchao
    layers run as it misses the bf16 GEMMs of the same run (the ratio cancels that bias)."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))
    import fit_float8 as F

    import estimator.timing as T
    from estimator.timing import float8

    model, harness, kernels = T.load_model("H200"), F.harness(), F.load()
    of = lambda v: [k for k in kernels if k.variant == v]  # noqa: E731
    bf16 = F.fit_variant(of("bf16"), model, harness)
    shipped = float8.table()["relative"]
    for variant in float8.VARIANTS:
        assert F.fit_variant(of(variant), model, harness) / bf16 == pytest.approx(shipped[variant], rel=1e-6)
    bf16_bias = F.errors(of("bf16"), model, harness)["bias"]
    for variant in ("tensorwise_fast", "tensorwise", "rowwise_fast"):  # what torchao's layers call
        assert F.errors(of(variant), model, harness)["bias"] == pytest.approx(bf16_bias, rel=0.03)


# the float8 steps an H200 ran (tests/data/h200/compile.jsonl): Llama 3 8B's widths with 4 layers, one sequence of
# 8,192 tokens, bf16-mixed, each decoder layer compiled, every Linear but lm_head in float8.  Measured: tensorwise
# 164.6 ms and 38,633 MiB, rowwise 177.0 ms and 38,633 MiB.  Estimated 2026-11-28: 38.66 GiB (1.025: Inductor's
# float8 graphs keep less than the estimate's, docs/compile.md); 145.5 ms (0.884) and 148.9 ms (0.841), under the
# step for what the profile of the tensorwise step (tests/data/h200/profiles.jsonl.gz) shows and the model lacks:
# Inductor's float8 cast and amax kernels took 22.2 ms where their bytes at the elementwise rate give 12.6, and the
# cuDNN attention backward 3.0 ms per layer where the time model gives 2.3.  Step bounds:
# those ratios, 3 points either side.
H200_FLOAT8 = [("block", "tensorwise", (0.857, 0.917)), ("block", "rowwise", (0.814, 0.874))]


@pytest.mark.parametrize("compile_,recipe,bounds", H200_FLOAT8, ids=[f"{c}-{r}" for c, r, _ in H200_FLOAT8])
def test_float8_steps_of_an_8b_width_model_on_the_h200(compile_, recipe, bounds):
    """Peak within 3 % of the H200's measurement, step time within the bounds the comment above explains (the
    H200's time model is the H100's constants on its datasheet; the float8 ratios and the attention efficiencies
    are fitted on H200 kernels, never on steps)."""
    pytest.importorskip("transformers")
    import h100_cases
    from estimator import estimate

    logging.getLogger("estimator").setLevel(logging.ERROR)
    rec = next(r for r in h100_cases.recorded("h200", "compile.jsonl") if r["case"] == "llama3_8b_l4"
               and r["compile"] == compile_ and r["float8"] == recipe)
    model, inputs, loss_fn = h100_cases.MODELS["llama3_8b_l4"]()
    report = estimate(model, inputs, loss_fn=loss_fn, optimizer="adamw:lr=1e-05", device="cuda",
                      precision="bf16-mixed", gpu="H200", cuda_torch="2.11", compile=compile_, float8=recipe,
                      solve_batch=False)
    assert report.memory.peak == pytest.approx(rec["steps"][1]["peak"], rel=0.03)
    assert bounds[0] <= report.step_time.total / rec["step_s_median"] <= bounds[1]


@pytest.mark.parametrize("fit,key,spread", [("eager_host_factors", "eager_host_factor", 0.3),
                                             ("eager_scaling_factors", "eager_scaling_factor", 0.1)])
def test_the_eager_float8_factors_are_the_fit_of_the_single_layers(fit, key, spread):
    """``eager_host_factor`` and ``eager_scaling_factor`` in ``estimator/data/float8.json`` are
    ``benchmarks/fit_float8.py``'s medians over the single float8 layers of float8_layers.csv, refitted here: the
    host time of the layers whose bf16 forward + backward is host-bound (each layer's own factor within 30 % of it:
    1.56-2.29 around 1.84), and the GPU time of the scaling and cast kernels of those that are GPU-bound over the
    bandwidth model's (within 10 %: 1.59-1.79 around 1.71)."""
    pytest.importorskip("torchao")
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))
    import statistics

    import fit_float8 as F

    from estimator.timing import float8

    factors = [v for _, v in getattr(F, fit)()]
    shipped = float8.table()[key]
    assert len(factors) == 10 and statistics.median(factors) == pytest.approx(shipped, rel=1e-9)
    assert all(abs(v / shipped - 1) < spread for v in factors)


# The eager float8 steps of the 155M Llama (8 layers, 56 float8 Linears, 4 x 1,024 tokens: host-bound), measured
# on both cards (tests/data/h100_loops/compile.jsonl, tests/data/h200/compile.jsonl), held out of the fit above
# (single layers only).  Measured 166.4 ms (H100) and 179.1 ms (H200) where the same model in bf16 eager takes
# about 50: torchao's Python around each float8 layer's ops, about 2.3 ms per layer's forward and backward.
# Estimated 2026-11-29 before the factor: 97 and 94 ms (0.58, 0.53); with it 155.7 and 154.3 ms (0.935, 0.862).
# Bounds: within 15 %.  The 8B widths' eager float8 step is GPU-bound (276.1 ms measured on the H200): the host
# factor leaves it at 1.002 (within 3 %).  On 2026-11-30 each converted layer's aten.mm (on torchao's
# Float8TrainingTensor, run as the _scaled_mm inside it) was no longer timed as a bf16 GEMM besides it: the 8B
# step fell to 0.811; the layers' scaling and cast kernels, timed by the bandwidth model, take 1.71x that on the
# H200's single GPU-bound layers (timing.float8.scaling_factor, fitted there), which puts it at 0.995; the host
# factor refitted on the right ops (it read the ops at the timed list's positions in the capture's): 153.9 and
# 152.4 ms (0.924, 0.851).
EAGER_FLOAT8 = [("h100_loops", "H100", "llama_small", 0.15), ("h200", "H200", "llama_small", 0.15),
                ("h200", "H200", "llama3_8b_l4", 0.03)]


@pytest.mark.parametrize("data,gpu,case,tolerance", EAGER_FLOAT8, ids=[f"{g}-{c}" for _, g, c, _ in EAGER_FLOAT8])
def test_eager_float8_steps_pay_the_subclass_host_time(data, gpu, case, tolerance):
    pytest.importorskip("transformers")
    pytest.importorskip("torchao")
    import h100_cases
    from estimator import estimate

    logging.getLogger("estimator").setLevel(logging.ERROR)
    rec = next(r for r in h100_cases.recorded(data, "compile.jsonl") if r["case"] == case and r["compile"] is None
               and r["float8"] == "tensorwise" and r.get("step_s_median"))  # (the timed pass: "main")
    model, inputs, loss_fn = h100_cases.MODELS[case]()
    report = estimate(model, inputs, loss_fn=loss_fn, optimizer="adamw:lr=1e-05", device="cuda",
                      precision="bf16-mixed", gpu=gpu, cuda_torch="2.11", float8="tensorwise", solve_batch=False)
    assert report.step_time.total / rec["step_s_median"] == pytest.approx(1, abs=tolerance)
    from estimator.timing.simulate import work_nodes

    nodes, at = report.capture.nodes, work_nodes(report)  # the factor is on the float8 layers' ops only
    tagged = {nodes[at[o.index]].meta.get("module", "").rsplit(".", 1)[-1] for o in report.step_time.ops
              if nodes[at[o.index]].meta.get("subclass")}
    assert tagged == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}

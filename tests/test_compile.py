"""``estimate(compile=...)``: the step as torch.compile runs it (estimator.capture.compiled).

Ground truth measured in the same test: the model compiled for real with Inductor's CPU backend (C++ code
generated and built by the machine's compiler), one training step run under ``saved_tensors_hooks``: the
storages its compiled functions save for backward.  The estimate runs AOTAutograd's joint graph and its
min-cut partitioner on fake tensors; what forward saves must be the same bytes.  Beside it, the H100
recording (tests/data/h100_loops/compile.jsonl, ``benchmarks/record_h100.py``): peaks and step times of
compiled steps on the GPU, never used to fit anything.
"""

from __future__ import annotations

import json
import logging
import os
import sys

import pytest
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _real_compiled_saves(build: str, tmp_path) -> list[tuple[int, str, list[int]]]:
    """(bytes, dtype, shape) of each storage a real compiled step saves for backward, parameters and buffers
    left out (the estimate counts them apart), measured in a fresh Python process: a real torch.compile leaves
    state behind in its process (Dynamo's and Inductor's caches and registrations) that the other tests must
    not see.  ``build``: a function of this module returning (compiled callable, model, inputs, loss_fn)."""
    import shutil
    import subprocess

    if not (shutil.which("g++") or shutil.which("c++")):
        pytest.skip("Inductor's CPU backend builds its kernels with a C++ compiler, and none is on PATH")
    script = f"""
import json, sys, torch
sys.path.insert(0, {HERE!r})
import torchvision_env
torchvision_env.load()
import test_compile as t
call, model, inputs, loss_fn = t.{build}()
kept = {{x.untyped_storage().data_ptr() for x in list(model.parameters()) + list(model.buffers())}}
saved = {{}}
def pack(x):
    storage = x.untyped_storage()
    if storage.data_ptr() not in kept:
        saved[storage.data_ptr()] = (storage.nbytes(), str(x.dtype), list(x.shape))
    return x
pack = torch._dynamo.disable(pack)  # (a graph break, an LSTM's, would have Dynamo trace into the hook)
with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
    loss = loss_fn(call(**inputs) if isinstance(inputs, dict) else call(inputs))
loss.backward()
print(json.dumps(list(saved.values())))
"""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return [tuple(x) for x in json.loads(done.stdout.strip().splitlines()[-1])]


def llama_case(compiled: bool = True):
    """A two-layer Llama, each decoder layer compiled on its own (torchtitan's way) when ``compiled``."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128, use_cache=False)
    model = transformers.LlamaForCausalLM(cfg)
    if compiled:
        for i, layer in enumerate(model.model.layers):
            model.model.layers[i] = torch.compile(layer)
    ids = torch.randint(0, 128, (2, 32))
    return model, model, {"input_ids": ids, "labels": ids}, lambda out: out.loss


def test_saved_activations_of_a_compiled_transformer_block_are_inductors(tmp_path):
    """Each decoder layer compiled on its own: the bytes saved for backward equal the real Inductor step's, and
    differ from the eager step's (the partitioner recomputes pointwise results)."""
    pytest.importorskip("transformers")
    from estimator import estimate

    _, model, inputs, loss_fn = llama_case(compiled=False)
    report = estimate(model, inputs, device="cpu", compile="block", solve_batch=False)
    truth = sum(n for n, _, _ in _real_compiled_saves("llama_case", tmp_path))
    assert report.tally.activations_bytes == truth
    assert report.compiled["eager_activations"] != truth  # the eager step saves other tensors
    assert report.compiled["fused_kernels"] > 0


class _SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.GELU(),
                                      nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def _cnn_loss(out):
    return out.logsumexp(-1).mean()


def cnn_case():
    torch.manual_seed(0)
    model = _SmallCNN()
    return torch.compile(model), model, torch.randn(8, 3, 32, 32), _cnn_loss


def test_saved_activations_of_a_compiled_cnn_are_inductors_but_its_weight_layouts(tmp_path):
    """A CNN compiled whole: the estimate saves what AOTAutograd's partition saves; the real CPU step saves
    those and, beside them, each convolution weight copied to another layout (Inductor's layout optimization
    after the partition, which the estimate does not model): the difference is exactly those copies."""
    from estimator import estimate

    _, model, x, loss_fn = cnn_case()
    report = estimate(model, x, loss_fn=loss_fn, device="cpu", compile="model", solve_batch=False)
    assert not report.tally.unsupported
    saved = _real_compiled_saves("cnn_case", tmp_path)
    weights = {tuple(m.weight.shape) for m in model.modules() if isinstance(m, nn.Conv2d)}
    copies = [n for n, dtype, shape in saved if tuple(shape) in weights]
    assert len(copies) == len(weights)
    assert report.tally.activations_bytes == sum(n for n, _, _ in saved) - sum(copies)
    assert report.compiled["activations"] < report.compiled["eager_activations"]
    # and the report says so, with the count the real step copies
    assert any(f"one per convolution wider than 1x1: {len(copies)} here" in n for n in report.capture.assumptions)


def test_a_compiled_model_keeps_its_batchnorm_statistics_in_place():
    """AOTAutograd applies a graph's buffer updates (BatchNorm's running statistics) to the module's own tensors:
    the buffers stay the model's through the step, as the real compiled step's ``named_buffers()`` are the same
    storages after it (the capture once took the traced stand-ins the compilation swapped in for them, freed the
    real ones at the step's end, and the CUDA allocator's replay then failed on a second free)."""
    from estimator import estimate

    compiled, model, x, loss_fn = cnn_case()
    before = {n: b.untyped_storage().data_ptr() for n, b in model.named_buffers()}
    loss_fn(compiled(x)).backward()
    assert {n: b.untyped_storage().data_ptr() for n, b in model.named_buffers()} == before
    report = estimate(model, x, loss_fn=loss_fn, device="cuda", compile="model", solve_batch=False)
    assert report.to_dict()["memory"]["buffers"] == sum(b.untyped_storage().nbytes() for b in model.buffers())
    buffers = report.capture.sids["buffer"]
    assert not [e for e in report.capture.events if e[1] in buffers and e[2] < 0]  # never freed


def test_a_model_wrapped_by_torch_compile_is_estimated_compiled():
    """``model = torch.compile(model)`` before the loop: the OptimizedModule crashed the process (a segfault under
    bf16-mixed, "cpu and meta" under fp32).  It is the original module compiled whole, as the wrapper runs it:
    the figures of ``compile="model"`` on the module itself, said in the report; ``compile=`` still chooses."""
    from estimator import estimate
    from estimator.plan import Planner

    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    x = torch.randn(32, 64)
    for precision in ("fp32", "bf16-mixed"):
        wrapped = estimate(torch.compile(model), x, device="cpu", precision=precision)
        direct = estimate(model, x, device="cpu", precision=precision, compile="model")
        assert wrapped.to_dict()["memory"] == direct.to_dict()["memory"]
        assert any("wrapped by torch.compile" in a for a in wrapped.capture.assumptions)
    eager = estimate(torch.compile(model), x, device="cpu", compile="eager")
    assert eager.to_dict()["memory"] == estimate(model, x, device="cpu").to_dict()["memory"]
    plan = Planner(torch.compile(model), x, gpu="H100").plan("ddp", 1, solve=())
    assert plan.config.model == "Sequential" and any("wrapped by torch.compile" in n for n in plan.notes)


def test_fusion_frees_what_only_a_kernel_reads():
    """x -> mul -> add -> relu -> mm: the three pointwise ops are one kernel; the tensors between them take no
    memory, the kernel's output (read by the matmul, a library kernel) does; the kernel reads x once and writes
    its output once."""
    from estimator.capture import capture
    from estimator.capture.options import StepOptions

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(64, 32))

        def forward(self, x):
            h = torch.relu(x * 2.0 + 1.0)  # [16, 64]: one fused kernel
            return h @ self.w

    cap = capture(Net(), torch.randn(16, 64), StepOptions(compile="model", optimizer=None))
    forward = [n for n in cap.nodes if n.meta.get("compiled") and n.meta.get("phase") == "forward"]
    kernels = {n.meta["kernel"] for n in forward if "kernel" in n.meta}
    assert len(kernels) == 1
    fused = [n for n in forward if "kernel" in n.meta]
    made = [sid for n in fused for sid in n.meta["storage"]]
    assert [cap.storage_bytes[s] for s in made[:-1]] == [0] * (len(made) - 1)
    last = next(n for n in fused if "fused" in n.meta)
    # reads x (16 x 64 fp32 = 4,096 B); writes its output (the relu, 4,096 B: the matmul and backward read it)
    assert last.meta["fused"]["read"] == 16 * 64 * 4
    assert last.meta["fused"]["written"] == cap.storage_bytes[made[-1]] == 16 * 64 * 4


def test_a_region_aotautograd_cannot_trace_runs_its_submodules_compiled():
    """A forward that reads a tensor's value (``.item()``) cannot be one graph: its submodules are compiled one by
    one (Dynamo's graph breaks split it likewise) and the report says so."""
    from estimator import estimate

    class Reads(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(32, 32), nn.Linear(32, 32)

        def forward(self, x):
            h = self.a(x)
            if (h.sum() > 0).item():  # data-dependent: a graph break under torch.compile
                h = h * 2
            return self.b(torch.relu(h))

    report = estimate(Reads(), torch.randn(8, 32), device="cpu", compile="model", trace="real", solve_batch=False)
    assert any("compiled one by one" in note for note in report.capture.assumptions)
    assert report.compiled["compiled_ops"] > 0


def test_bad_compile_values_are_one_line_errors():
    from estimator import estimate
    from estimator.errors import UserError

    with pytest.raises(UserError, match="compile must be one of block, model"):
        estimate(nn.Linear(4, 4), torch.randn(2, 4), device="cpu", compile="max-autotune")


# -- the H100 recording -----------------------------------------------------------------------------------

_COMPILE = [json.loads(line) for line in open(os.path.join(HERE, "data", "h100_loops", "compile.jsonl"))]


def _recorded(case: str, compile_: str | None) -> tuple[dict, dict]:
    """(the memory record, the timing record) of a case: the ``warm`` pass measured memory beside other work,
    the ``main`` pass ran alone and timed the step."""
    pick = [r for r in _COMPILE if r["case"] == case and r["compile"] == compile_ and r["float8"] is None]
    warm = next((r for r in pick if r["pass"] == "warm"), None)
    main = next(r for r in pick if r["pass"] == "main")
    return warm or main, main


def _kernel_record(case: str, compile_: str | None) -> dict | None:
    """One profiled step of the recording's third call (kernels.jsonl.gz): every GPU kernel's name and
    microseconds, or None where the case was not profiled."""
    import gzip

    with gzip.open(os.path.join(HERE, "data", "h100_loops", "kernels.jsonl.gz"), "rt") as f:
        for line in f:
            rec = json.loads(line)
            if rec["case"] == case and rec["compile"] == compile_ and rec["float8"] is None:
                return rec
    return None


def _kernel_sum(case: str, compile_: str | None) -> float | None:
    """Seconds of GPU kernels in one profiled step (:func:`_kernel_record`), or None."""
    rec = _kernel_record(case, compile_)
    return rec["total_us"] * 1e-6 if rec is not None else None


# (case, compile, peak tolerance): the peaks and times of compiled steps on the H100 (bf16-mixed), measured
# outside the estimator: Llama-155M per block 4,896,889,344 B / 23.4 ms, GPT-2 124M whole 6,455,664,128 B /
# 33.6 ms.  Whole-model Llama (0.945x) and ResNet-18 (0.940x) peaks are below the card's by more: Inductor's
# buffer reuse and layout choices are not modelled (see docs/compile.md); they are held to 7 %.
H100_COMPILED = [("llama_small", "block", 0.01), ("gpt2_124m", "model", 0.01), ("llama_small", "model", 0.07),
                 ("resnet18_b32", "model", 0.07)]


@pytest.mark.parametrize("case,compile_,tolerance", H100_COMPILED, ids=[f"{c}-{m}" for c, m, _ in H100_COMPILED])
def test_compiled_steps_on_the_h100(case, compile_, tolerance):
    """The peak (max_memory_allocated of the steady-state step) within ``tolerance``; where the step was
    profiled, the GPU's busy time within 5 % of its kernels' sum, and the transformers' step within 20 % of the
    wall time (the gap between the kernels' sum and the wall is mostly the optimizer's host synchronisations,
    which the capture does not see: 3.3 ms of the Llama's 23.4; estimated 0.90x per block, 0.84x whole)."""
    pytest.importorskip("transformers")
    import h100_cases
    from estimator import estimate

    logging.getLogger("estimator").setLevel(logging.ERROR)
    memory, timing = _recorded(case, compile_)
    model, inputs, loss_fn = h100_cases.MODELS[case]()
    report = estimate(model, inputs, loss_fn=loss_fn, optimizer="adamw:lr=1e-05", device="cuda",
                      precision="bf16-mixed", gpu="H100", cuda_torch="2.11", compile=compile_, solve_batch=False)
    assert report.memory.peak == pytest.approx(memory["steps"][1]["peak"], rel=tolerance)
    kernels = _kernel_sum(case, compile_)
    if kernels is not None:
        assert report.step_time.gpu_busy == pytest.approx(kernels, rel=0.05)
    if case != "resnet18_b32":
        assert report.step_time.total == pytest.approx(timing["step_s_median"], rel=0.20)
    rec = _kernel_record(case, compile_)
    if rec is not None:
        # The kernels Inductor generated are the step's Triton launches (the optimizer and the eager code
        # launch none): GPT-2 whole 343, Llama-155M per block 232.  The fusion is approximated (one kernel per
        # connected group of non-library ops at one library depth: 321 and 280, 0.94x and 1.21x): held to 25 %.
        # (Merging across library depths where no cycle results, Inductor's own rule, gives 235 and 208 and
        # moves the GPU time out of its 5 %: Triton also splits by iteration space, which is not modelled.)
        launched = sum(name.startswith("triton_") for name, _ in rec["kernels"])
        assert report.compiled["fused_kernels"] == pytest.approx(launched, rel=0.25), launched


def test_fsdp_plan_compiled_saves_what_the_compiled_step_saves():
    """FSDP2 shards parameters, gradients and optimizer state, not activations: the compiled blocks under
    fully_shard (traced on a fake process group of 4 ranks) save what the same blocks compiled on one device save
    (checked against a real Inductor step above), plus what FSDP2's own hooks save, the same bytes as in the eager
    step (33,024 B here); and less than the eager plan."""
    pytest.importorskip("transformers")
    from estimator import estimate
    from estimator.plan import plan

    _, model, inputs, _ = llama_case(compiled=False)
    saved = {}
    for compile_ in (None, "block"):
        single = estimate(model, inputs, device="cpu", compile=compile_, precision="fp32", solve_batch=False)
        ranked = plan(model, inputs, gpu="H100", gpus=4, strategy="fsdp", device="cpu", precision="fp32",
                      compile=compile_, solve=())
        saved[compile_] = (single.tally.activations_bytes, ranked.per_gpu.saved_activations, ranked.notes)
    (eager_one, eager_fsdp, _), (one, fsdp, notes) = saved[None], saved["block"]
    assert fsdp - one == eager_fsdp - eager_one
    assert fsdp < eager_fsdp
    assert any("torch.compile per block" in note for note in notes)


def test_checkpointed_compiled_blocks_save_only_their_inputs():
    """torchtitan applies activation checkpointing, then torch.compile, to each block: a block checkpointed in
    full keeps only its inputs whether or not it is compiled, so the compiled step saves exactly what the eager
    one saves (the rest of the model runs eager in both), and its recomputation reruns the compiled graph."""
    transformers = pytest.importorskip("transformers")
    from estimator.capture import capture
    from estimator.capture.options import StepOptions
    from estimator.tally import tally

    _, model, inputs, _ = llama_case(compiled=False)
    model.config.use_cache = True  # transformers' default: the checkpointed step turns it off, as transformers does
    block = transformers.models.llama.modeling_llama.LlamaDecoderLayer
    caps = {c: capture(model, inputs, StepOptions(checkpoint=(block,), compile=c)) for c in (None, "block")}
    assert model.config.use_cache is True  # put back
    assert tally(caps["block"]).activations_bytes == tally(caps[None]).activations_bytes
    recomputed = [n for n in caps["block"].nodes if n.meta.get("compiled") and n.meta.get("phase") == "backward"
                  and "mm" in str(n.target)]
    assert recomputed  # the compiled graphs run in backward (recomputed forward and the backward graph)
    assert any("use_cache=False" in note for note in caps["block"].assumptions)


def test_tensor_parallel_plan_of_compiled_blocks_splits_what_the_eager_one_splits():
    """The Megatron pairs are read from the eager step (a compiled graph's ops run in its region's module, not in
    their Linear layers, and the MLP's pair went unseen, left replicated: the compiled plan held more parameters
    per rank and, under sequence parallelism, failed).  With compiled blocks the plan shards every Linear the eager
    plan shards, each rank holds the same parameter bytes, and sequence parallelism traces."""
    pytest.importorskip("transformers")
    from estimator.plan import Planner

    _, model, inputs, _ = llama_case(compiled=False)
    planners = {c: Planner(model, inputs, gpu="H100", device="cpu", precision="fsdp-bf16", compile=c)
                for c in (None, "block")}
    eager, compiled = planners[None].tp_plan(), planners["block"].tp_plan()
    assert (compiled.colwise, compiled.rowwise) == (eager.colwise, eager.rowwise)
    assert any("mlp" in p for p in compiled.rowwise)
    for sp in (False, True):
        plans = {c: p.plan("fsdp", 4, tp=2, sequence_parallel=sp, solve=()) for c, p in planners.items()}
        assert plans["block"].per_gpu.parameters == plans[None].per_gpu.parameters
        assert plans["block"].per_gpu.saved_activations < plans[None].per_gpu.saved_activations


class _Blocks(nn.Module):
    """Six pre-norm MLP blocks (a stack compile='block' compiles one by one)."""

    def __init__(self, d: int = 64, h: int = 256, n: int = 6):
        super().__init__()
        self.inp, self.out = nn.Linear(32, d), nn.Linear(d, 10)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(d), nn.Linear(d, h), nn.GELU(), nn.Linear(h, d))
                                     for _ in range(n)])

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = x + b(x)
        return self.out(x)


def test_compiling_a_block_keeps_none_of_its_inputs():
    """The first run of each compiled region (its compilation) ran on the step's own tensors, and its graph held
    them in a reference cycle no collection freed during the step: every block's input lived to the end (6 x 48 x
    64 x 4 B at the optimizer step, +2.2 % on this peak against a real Inductor step measured with the profiler).
    Autograd frees whatever a step saved once its backward has run: nothing saved is live in the optimizer step."""
    from estimator import estimate

    torch.manual_seed(0)
    report = estimate(_Blocks(), torch.randn(48, 32), loss_fn=lambda out: out.pow(2).mean(), device="cpu",
                      compile="block", solve_batch=False)
    optimizer = [p for p in report.memory.timeline if "optimizer" in str(p.phase)]
    assert optimizer and all(p.by_category.get("saved", 0) == 0 for p in optimizer)
    assert report.compiled["eager_peak"] == report.memory.peak  # (these blocks save what eager saves)


def test_checkpointing_inside_a_compiled_region_is_refused_in_one_line():
    """AOTAutograd traced the checkpoint's ops inline, so the what-if read the compiled step without its
    recomputation (flops_added 0; its peak +26 % against a real torch.compile of checkpointed blocks). The block's
    own class under compile='block' is checkpointed around the compiled block, as torchtitan applies both."""
    from estimator import estimate
    from estimator.errors import UserError

    model, x = _Blocks(), torch.randn(16, 32)

    def loss_fn(out):
        return out.pow(2).mean()

    for compile_, cls in (("model", nn.Sequential), ("block", nn.Linear)):
        with pytest.raises(UserError, match="inside the compiled .* not modelled") as info:
            estimate(model, x, loss_fn=loss_fn, device="cpu", compile=compile_, checkpoint=cls, solve_batch=False)
        assert "\n" not in str(info.value)
    ck = estimate(model, x, loss_fn=loss_fn, device="cpu", compile="block", checkpoint=nn.Sequential,
                  solve_batch=False).checkpoint
    assert ck.flops_added > 0  # (recomputed: the compiled blocks run again in backward)


def test_a_transformers_model_with_its_cache_on_compiles_whole():
    """use_cache=True (transformers' default) made the whole-model region return a DynamicCache, which AOTAutograd
    cannot: it fell back to compiling submodules (saved -6.25 %, peak +6.3 % against a real torch.compile of a
    Qwen2, which Dynamo compiles as one graph). The training step's cache is off now, said in the report, and the
    step is the one of use_cache=False (exact against the real compiled step, 16 B apart, when measured)."""
    transformers = pytest.importorskip("transformers")
    from estimator import estimate

    def build(use_cache: bool):
        cfg = transformers.Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=2, num_key_value_heads=1, use_cache=use_cache)
        torch.manual_seed(0)
        return transformers.Qwen2ForCausalLM(cfg)

    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    on = estimate(build(True), {"input_ids": ids, "labels": ids}, device="cpu", compile="model", solve_batch=False)
    off = estimate(build(False), {"input_ids": ids, "labels": ids}, device="cpu", compile="model", solve_batch=False)
    notes = on.capture.assumptions
    assert any("KV cache off" in n for n in notes) and not any("could not be traced" in n for n in notes)
    assert on.tally.activations_bytes == off.tally.activations_bytes
    assert on.memory.peak == off.memory.peak


class _PairBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x):
        return self.fc(x).relu(), None


class _PairNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([_PairBlock(), _PairBlock()])

    def forward(self, x):
        for b in self.blocks:
            x, _ = b(x)
        return x.sum()


def pair_case(compiled: bool = True):
    """(the model with each block compiled, or not; the same model for the saves' harness; inputs; loss)."""
    torch.manual_seed(0)
    model = _PairNet()
    if compiled:
        for i, b in enumerate(model.blocks):
            model.blocks[i] = torch.compile(b)
    return model, model, torch.randn(8, 32), lambda out: out


def test_a_region_returning_none_beside_a_tensor_compiles(tmp_path):
    """A compiled region's outputs were matched to its graph's by None placeholders, so a None it returns itself
    took a tensor (StopIteration: a tiny Mixtral or Qwen2-MoE, whose attention becomes a region of its own, could
    not be estimated compiled).  What it saves equals a real Inductor step's."""
    from estimator import estimate

    _, model, x, loss_fn = pair_case(compiled=False)
    report = estimate(model, x, loss_fn=loss_fn, device="cpu", compile="block", solve_batch=False)
    real = _real_compiled_saves("pair_case", tmp_path)
    assert report.tally.activations_bytes == sum(n for n, _, _ in real)


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.a, self.b = torch.nn.LayerNorm(64), torch.nn.Linear(64, 128), torch.nn.Linear(128, 64)

    def forward(self, x):
        return x + self.b(torch.nn.functional.gelu(self.a(self.norm(x))))


def _scale(x):
    return x * 2 + 1


_compiled_scale = torch.compile(_scale)


class _WithCompiledParts(torch.nn.Module):
    def __init__(self, how):
        super().__init__()
        self.how = how
        self.b0, self.b1 = _Block(), _Block()
        if how == "submodule":
            self.b1 = torch.compile(self.b1)
        elif how == "method":
            self.b1.compile()

    def forward(self, x):
        x = self.b1(self.b0(x))
        return _compiled_scale(x) if self.how == "function" else _scale(x) if self.how == "plain function" else x


@pytest.mark.parametrize("how", ["submodule", "method", "function"])
def test_torch_compile_inside_the_model_is_traced_eager_and_said(how):
    """A compiled submodule, Module.compile() or a compiled function called in forward: Dynamo and Inductor ran on
    the trace's fake tensors and Inductor's kernel killed the process (SIGSEGV), or failed on "cpu and meta". They
    run eager in the capture: the numbers are the eager model's, and the report says so (which submodule, or which
    compiled function: Dynamo's callback for it, asked at each call, names it)."""
    from livetracker import measure_peaks

    from estimator import estimate

    torch.manual_seed(0)
    x, loss_fn = torch.randn(8, 16, 64), lambda o: o.pow(2).mean()
    plain = _WithCompiledParts("plain function" if how == "function" else "none")  # the same step, uncompiled
    report = estimate(_WithCompiledParts(how), x, device="cpu", loss_fn=loss_fn)
    # truth: the uncompiled step run for real (peaks) and its estimate's FLOPs (checked against real steps elsewhere)
    first, steady = measure_peaks(plain, x, lambda p: torch.optim.AdamW(p), loss_fn)
    assert (report.memory.peak_first_step, report.memory.peak) == (first, steady)
    plain_report = estimate(plain, x, device="cpu", loss_fn=loss_fn)
    assert report.tally.flops == plain_report.tally.flops
    said = "torch.compile in the model ran eager (b1" if how != "function" else \
        "torch.compile'd function in forward ran eager (_scale)"
    assert sum(said in a for a in report.capture.assumptions) == 1
    assert not any("function in forward" in a for a in plain_report.capture.assumptions)


def test_a_wrapper_with_the_eager_backend_is_the_eager_step_and_others_say_what_is_modelled():
    """torch.compile(model, backend=...) was modelled as Inductor's whatever the backend: backend='eager' saved
    63.6 % more for real (it is the eager step); aot_eager's partition is not Inductor's, and the note says so."""
    from estimator import estimate

    torch.manual_seed(0)
    x = torch.randn(8, 16, 64)
    eager = estimate(_Block(), x, device="cpu", loss_fn=lambda o: o.pow(2).mean())
    wrapped = estimate(torch.compile(_Block(), backend="eager"), x, device="cpu", loss_fn=lambda o: o.pow(2).mean())
    assert wrapped.tally.activations_bytes == eager.tally.activations_bytes and wrapped.compiled is None
    assert any("backend='eager'" in a for a in wrapped.capture.assumptions)
    aot = estimate(torch.compile(_Block(), backend="aot_eager"), x, device="cpu", loss_fn=lambda o: o.pow(2).mean())
    assert any("backend 'aot_eager' is modelled as Inductor's" in a for a in aot.capture.assumptions)


class _Recurrent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.head = torch.nn.Linear(16, 32), torch.nn.Linear(64, 10)
        self.lstm = torch.nn.LSTM(32, 64, num_layers=2, batch_first=True)

    def forward(self, x):
        y, _ = self.lstm(torch.tanh(self.emb(x)))
        return self.head(y[:, -1])


def dropout_case():
    """An MLP with dropout (p=0.1), compiled whole."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(256, 10))
    return torch.compile(model), model, torch.randn(32, 64), lambda out: out.pow(2).mean()


def lstm_case():
    """A two-layer LSTM between two Linear layers, compiled whole."""
    torch.manual_seed(0)
    model = _Recurrent()
    return torch.compile(model), model, torch.randn(4, 12, 16), lambda out: out.pow(2).mean()


@pytest.mark.parametrize("build", ["dropout_case", "lstm_case"])
def test_dropout_compiles_and_recurrent_layers_break_the_graph(build, tmp_path):
    """Dropout in a region failed the capture's partition (Inductor's pass fusing the random seeds reads the fake
    mode compile_fx sets), so the region ran eager: +29.5 % over a real compiled step's saves on this MLP, +13-14 %
    on GPT-2. Dynamo does not compile nn.LSTM (allow_rnn off): it breaks the graph and runs eager, where the
    capture compiled it (0.40x). What each estimate counts equals what a real Inductor CPU step saves."""
    from estimator import estimate

    _, model, x, loss_fn = globals()[build]()
    report = estimate(model, x, loss_fn=loss_fn, device="cpu", compile="model", solve_batch=False)
    real = _real_compiled_saves(build, tmp_path)
    assert report.tally.activations_bytes == sum(n for n, _, _ in real)
    assert not report.tally.unsupported  # (the random prims of a compiled dropout have their rule)
    if build == "lstm_case":
        assert any("Dynamo does not compile LSTM" in a for a in report.capture.assumptions)

"""Capacity planning (estimator.plan) against a real distributed run, and its arithmetic.

The real engine: two processes on CPU with the gloo backend (``tests/dist_worker.py``) train
the example GPT with ``DistributedDataParallel`` and with FSDP2 ``fully_shard`` (on every
``Block`` and the root); each rank measures its parameter, gradient and optimizer-state bytes
from the real tensors (DTensor local shards) and the peak of live bytes over a steady-state
iteration.  The plan of the same configuration (``device="cpu"``: exact bytes, no CUDA
rounding) must match the model states exactly and the peak within 2 %.  (The worker gives
FSDP2 a reduce-scatter without gloo's copy of its input, whose release from a gloo thread is
timing-dependent; NCCL's reduce-scatter makes no copy either: see ``dist_worker.py``.)
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import math
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest
import torch

from estimator import UserError, estimate
from estimator.hardware import GPU, lookup
from estimator.memory import CUDA_RESERVE, FRAGMENTATION
from estimator.plan import STRATEGIES, Planner, add_plan_parser, compare, parse_count, plan, run_plan, shard_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "dist_worker.py")


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"_plan_example_{name}", os.path.join(ROOT, "examples", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpt = _example("gpt")
mlp = _example("mlp")


def _gpt(model: dict, batch: int, seq: int):
    """The example GPT on the meta device (nothing allocated) and integer inputs."""
    with torch.device("meta"):
        m = gpt.GPT(gpt.GPTConfig(**model))
    idx = torch.zeros(batch, seq, dtype=torch.long)
    return m, (idx, idx.clone())


# -- the real engine ------------------------------------------------------------------

# vocab 257 and 101 are odd: FSDP2 pads those embeddings' dim 0 to a multiple of the world size.
CASES = [
    {"name": "wide", "model": {"vocab_size": 257, "block_size": 64, "n_layer": 3, "n_head": 4, "n_embd": 64},
     "batch": 4, "seq": 64, "strategies": ["ddp", "fsdp", "fsdp_keep"]},
    {"name": "states", "model": {"vocab_size": 101, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 96},
     "batch": 1, "seq": 16, "strategies": ["ddp", "fsdp", "fsdp_keep"]},
]
RUNS = [(c["name"], s, r) for c in CASES for s in c["strategies"] for r in (0, 1)]


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    pytest.importorskip("torch.distributed.fsdp", reason="FSDP2 (fully_shard) is not available")
    from torch.distributed import fsdp

    if not hasattr(fsdp, "fully_shard"):
        pytest.skip("FSDP2 fully_shard is not available in this torch")
    d = tmp_path_factory.mktemp("dist")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    config = json.dumps({"cases": CASES})
    procs = [subprocess.Popen([sys.executable, WORKER, str(r), "2", str(d / "init"), str(d / f"r{r}.json"), config],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail("the 2-rank gloo run did not finish in 240 s")
    for r, (p, (_, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r} failed:\n{err[-4000:]}"
    return [json.loads((d / f"r{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def planned():
    """Plans of every (case, strategy, rank), exact bytes (device cpu)."""
    out = {}
    for case in CASES:
        model, inputs = _gpt(case["model"], case["batch"], case["seq"])
        planner = Planner(model, inputs, gpu="H100", device="cpu")
        for s in case["strategies"]:
            for r in (0, 1):
                p = planner.plan("fsdp" if s.startswith("fsdp") else s, 2, rank=r, solve=(),
                                 reshard_after_forward=s != "fsdp_keep")
                out[(case["name"], s, r)] = p
    return out


@pytest.mark.parametrize("case,strategy,rank", RUNS)
def test_model_states_match_the_real_engine_exactly(real_runs, planned, case, strategy, rank):
    real = real_runs[rank]["cases"][case][strategy]
    g = planned[(case, strategy, rank)].per_gpu
    for key in ("parameters", "gradients", "optimizer_state"):
        assert g[key] == real[key], (key, g[key], real[key])


@pytest.mark.parametrize("case,strategy,rank", RUNS)
def test_peak_matches_the_real_engine(real_runs, planned, case, strategy, rank):
    real = real_runs[rank]["cases"][case][strategy]
    g = planned[(case, strategy, rank)].per_gpu
    assert g["peak"] == pytest.approx(real["peak"], rel=0.02), (g["peak"], real["peak"], real["peak_op"])


def test_fsdp_shards_like_torch_chunk_with_padding(real_runs):
    """Each rank's real rows are torch.chunk's; FSDP2 stores ceil(d0 / N) rows (padded)."""
    for r in (0, 1):
        shapes = real_runs[r]["cases"]["wide"]["fsdp"]["local_shapes"]
        full = real_runs[r]["cases"]["wide"]["ddp"]["local_shapes"]
        for name, shape in shapes.items():
            d0 = full[name][0]
            assert shape[0] == shard_rows(d0, 2, r)[0], (name, shape, d0)
    for d0 in range(1, 13):
        for world in range(1, 6):
            chunks = torch.chunk(torch.arange(d0), world)
            for r in range(world):
                real = len(chunks[r]) if r < len(chunks) else 0
                assert shard_rows(d0, world, r) == (real, len(chunks[0])), (d0, world, r)


# -- ZeRO arithmetic -----------------------------------------------------------------


def _mlp_divisible():
    """Every dim 0 divisible by 4: no padding."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 64))
    return model, torch.randn(8, 64)


def test_zero_stages_follow_the_paper_for_mixed_precision_adam():
    """Rajbhandari et al. 2020: 16P, 4P + 12P/N, 2P + 14P/N, 16P/N bytes per rank (mixed-precision Adam).

    P counted from the model; S = Adam's per-tensor ``step`` scalars (4 bytes each, on every rank).
    """
    model, x = _mlp_divisible()
    P = sum(p.numel() for p in model.parameters())
    S = 4 * len(list(model.parameters()))
    N = 4
    planner = Planner(model, x, gpu="A100-80GB", precision="bf16-mixed", optimizer="adam", device="cpu")
    expect = {
        "ddp": 16 * P + S,  # fp32 params 4P + fp32 grads 4P + exp_avg, exp_avg_sq 8P
        "zero1": 4 * P + 12 * P // N + S,  # bf16 params 2P + bf16 grads 2P + (fp32 master 4P + 8P) / N
        "zero2": 2 * P + 14 * P // N + S,  # bf16 params 2P + (bf16 grads 2P + 12P) / N
        "zero3": 16 * P // N + S,  # (2P + 2P + 12P) / N
        "fsdp": 16 * P // N + S,  # (fp32 params 4P + fp32 grads 4P + 8P) / N
    }
    for strategy, total in expect.items():
        g = planner.plan(strategy, N, solve=()).per_gpu
        assert g["parameters"] + g["gradients"] + g["optimizer_state"] == total, strategy


def test_checkpoint_size_full_and_sharded():
    model, x = _mlp_divisible()
    report = estimate(model, x, device="cpu")
    full = report.tally.parameters_bytes + report.tally.buffers_bytes + report.tally.optimizer_state_bytes
    n_tensors = len(list(model.parameters()))
    p = plan(model, x, gpu="H100", gpus=4, strategy="fsdp", device="cpu", solve=())
    assert p.checkpoint_size["full"] == full
    # 4 ranks hold a quarter of every tensor; the 4-byte step scalars are on every rank (3 extra copies).
    assert 4 * p.checkpoint_size["per_rank"] == full + 3 * 4 * n_tensors
    d = plan(model, x, gpu="H100", gpus=4, strategy="ddp", device="cpu", solve=())
    assert d.checkpoint_size["per_rank"] == full


# -- largest batch and sequence --------------------------------------------------------


def _gpu_fitting(peak: int, extra: int) -> GPU:
    """A GPU whose capacity is ``peak`` + the planner's reserve for it + ``extra`` bytes."""
    reserve = sum(CUDA_RESERVE.values()) + int(FRAGMENTATION * peak)
    h100 = lookup("H100")
    return GPU("test-gpu", peak + reserve + extra, h100.bandwidth, dict(h100.peak))


def _fits(gpu: GPU, peak: int) -> bool:
    return peak + sum(CUDA_RESERVE.values()) + int(FRAGMENTATION * peak) <= gpu.memory


def test_largest_batch_is_confirmed_by_tracing_it_and_the_next():
    model, (x, target) = mlp.build(batch=16)
    # Capacity: the measured peak at batch 50 plus a third of one sample's increment.
    p50 = estimate(model, mlp.build(batch=50)[1], device="cuda").memory.peak
    p51 = estimate(model, mlp.build(batch=51)[1], device="cuda").memory.peak
    gpu = _gpu_fitting(p50, (p51 - p50) // 3)
    p = plan(model, (x, target), gpu=gpu, gpus=1, strategy="ddp")
    assert p.max_batch == 50, p.max_batch_check
    assert p.max_batch_check["confirmed"]
    # Independently: estimate() at the answer fits, at the answer + 1 does not.
    assert _fits(gpu, p50) and not _fits(gpu, p51)


def test_largest_batch_under_fsdp_is_confirmed():
    model, inputs = _gpt({"vocab_size": 512, "block_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 64}, 2, 64)
    planner = Planner(model, inputs, gpu="L4")
    layout = planner.layout("fsdp", 4, 1, None, True)
    b, info = planner.solve("batch", layout)
    assert info["confirmed"] and b > 2
    for value, fits in ((b, True), (b + 1, False)):
        m, i = _gpt({"vocab_size": 512, "block_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 64}, value, 64)
        peak = Planner(m, i, gpu="L4").plan("fsdp", 4, solve=(), raise_if_impossible=False).per_gpu["peak"]
        assert _fits(planner.gpu, peak) is fits, (value, peak)


def test_longest_sequence_is_confirmed_by_tracing():
    cfg = {"vocab_size": 256, "block_size": 4096, "n_layer": 2, "n_head": 4, "n_embd": 64}
    model, inputs = _gpt(cfg, 2, 32)
    peak_at = lambda s: estimate(*_gpt(cfg, 2, s), device="cuda").memory.peak  # noqa: E731
    p300, p301 = peak_at(300), peak_at(301)
    gpu = _gpu_fitting(p300, (p301 - p300) // 2)
    p = plan(model, inputs, gpu=gpu, gpus=1, solve=("seq",))
    assert p.max_seq == 300, p.max_seq_check
    assert p.max_seq_check["confirmed"]


# -- time ------------------------------------------------------------------------------


def test_roofline_compute_bound_matmul():
    """One 8192x4096 @ 4096x4096 fp32 matmul forward on an H100: 2*8192*4096*4096 FLOPs / 67 TFLOP/s
    (fp32 peak; 4.1 ms) dominates its 335 MB of traffic / 3.35 TB/s (0.1 ms)."""
    with torch.device("meta"):
        model = torch.nn.Linear(4096, 4096, bias=False)
    x = torch.empty(8192, 4096, device="meta")
    p = plan(model, x, gpu="H100", solve=(), loss_fn=lambda y: y.mean())
    mm = 2 * 8192 * 4096 * 4096 / 67e12
    assert p.time["by_phase_s"]["forward"] == pytest.approx(mm, rel=0.03)


def test_roofline_memory_bound_elementwise():
    """x * w on 2**28 fp32 elements, then the loss y.sum(): no matmul, traffic-bound at 3.35 TB/s."""

    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(()))

        def forward(self, x):
            return x * self.w

    x = torch.empty(2**28, device="meta")
    p = plan(Scale(), x, gpu="H100", solve=(), loss_fn=lambda y: y.sum())
    mul = (2**28 * 4 * 2 + 4) / 3.35e12  # reads x (1 GiB) and w (4 B), writes y (1 GiB)
    total = (2**28 * 4 + 4) / 3.35e12  # the loss reads y, writes a 4-byte scalar
    assert p.time["by_phase_s"]["forward"] == pytest.approx(mul + total, rel=0.01)


def test_communication_volumes_and_time_to_train():
    cfg = {"vocab_size": 512, "block_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 64}
    model, inputs = _gpt(cfg, 4, 64)
    planner = Planner(model, inputs, gpu="H100")
    report = estimate(model, inputs)
    grads = report.tally.gradients_bytes
    N = 8
    ddp = planner.plan("ddp", N, tokens=1e9, solve=())
    # Ring all-reduce: each GPU sends 2 (N - 1) / N of the gradients.
    assert ddp.time["comm_bytes"]["all_reduce gradients"] == int(2 * (N - 1) / N * grads)
    # Steps: ceil(tokens / (micro-batch 4 x 64 tokens x 8 GPUs)).
    assert ddp.time["steps"] == math.ceil(1e9 / (4 * 64 * N))
    fsdp = planner.plan("fsdp", N, steps=1000, mfu=0.4, solve=())
    assert fsdp.time["comm_bytes"]["reduce_scatter gradients"] == int((N - 1) / N * grads)
    # With --mfu: time = steps * matmul FLOPs per GPU per step / (mfu * peak(dtype)).
    f = fsdp.flops
    assert fsdp.time_to_train_s == pytest.approx(1000 * f["model_flops_per_step_per_gpu"] / (0.4 * 67e12), rel=1e-6)
    # PaLM appendix B: 6N + 12 L H Q T FLOPs per token agrees with the traced matmul FLOPs.
    assert f["six_nd_per_token"] == pytest.approx(f["traced_per_token"], rel=0.05)
    assert f["attention_per_token"] == 12 * 2 * 4 * 16 * 64  # 12 x L=2 x H=4 x Q=16 x T=64


# -- comparison, JSON, errors -----------------------------------------------------------


def test_compare_has_a_row_per_strategy_with_and_without_checkpointing():
    cfg = {"vocab_size": 512, "block_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 64}
    model, inputs = _gpt(cfg, 4, 64)
    c = compare(model, inputs, gpu="H100", gpus=16, tokens=1e8, confirm=False)
    rows = c.to_dict()["rows"]
    assert [(r["strategy"], bool(r["checkpoint"])) for r in rows] == [(s, k) for s in STRATEGIES for k in (False, True)]
    by = {(r["strategy"], bool(r["checkpoint"])): r for r in rows}
    for s in STRATEGIES:
        assert by[(s, True)]["peak"] < by[(s, False)]["peak"]  # checkpointing keeps less
        assert by[(s, True)]["step_time_s"] > by[(s, False)]["step_time_s"]  # and recomputes
        assert by[(s, True)]["max_batch"] >= by[(s, False)]["max_batch"]
    assert by[("fsdp", False)]["peak"] < by[("zero1", False)]["peak"] < by[("ddp", False)]["peak"]
    assert "Strategy" in c.render()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="estimator")
    add_plan_parser(parser.add_subparsers(dest="command"))
    return parser


def _cli(argv: list[str]) -> tuple[int, str, str]:
    """``estimator plan ...``: through estimator.cli when it has the subcommand, else the same handling."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            from estimator.cli import build_parser, main

            sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
            if "plan" in sub.choices:
                return main(argv), out.getvalue(), err.getvalue()
        except ImportError:  # pragma: no cover
            pass
        args = _parser().parse_args(argv)
        try:
            rc = run_plan(args)
        except UserError as exc:
            print(f"estimator: error: {exc}", file=sys.stderr)
            rc = 2
    return rc, out.getvalue(), err.getvalue()


def test_cli_json_has_the_schema(tmp_path):
    out = tmp_path / "plan.json"
    rc, _, err = _cli(["plan", "examples/mlp.py:build", "--gpu", "L4", "--gpus", "4", "--strategy", "zero2",
                       "--samples", "1M", "--format", "json", "--output", str(out)])
    assert rc == 0, err
    d = json.loads(out.read_text())
    assert {"gpu", "gpus", "strategy", "per_gpu", "capacity", "fits", "max_batch", "step_time_s",
            "time_to_train_s"} <= set(d)
    assert {"parameters", "gradients", "optimizer_state", "activations", "peak"} <= set(d["per_gpu"])
    assert d["gpu"] == "L4" and d["gpus"] == 4 and d["strategy"] == "zero2"
    assert d["capacity"] == lookup("L4").memory and isinstance(d["fits"], bool)
    assert isinstance(d["max_batch"], int) and d["step_time_s"] > 0 and d["time_to_train_s"] > 0


def test_every_option_is_documented_with_an_example():
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    p = sub.choices["plan"]
    for action in p._actions:
        if action.option_strings and action.dest not in ("help",):
            assert "e.g." in (action.help or ""), action.option_strings
    assert "examples:" in (p.epilog or "")
    assert parse_count("300B") == 3e11 and parse_count("1.5T") == 1.5e12 and parse_count("10000") == 1e4


@pytest.mark.parametrize("argv,needle", [
    (["--gpu", "H10"], "H100"),  # unknown GPU: close names
    (["--gpu", "H100", "--gpus", "6", "--tp", "3"], "does not divide the 4 attention heads"),
    (["--gpu", "H100", "--gpus", "1", "--strategy", "zero3"], "use --strategy ddp"),
    (["--gpu", "H100", "--gpus", "8", "--tp", "3"], "does not divide --gpus 8"),
    (["--gpu", "H100", "--gpus", "2", "--offload", "params", "--strategy", "zero2"], "zero3, fsdp or hsdp"),
])
def test_impossible_inputs_are_one_line_errors(tmp_path, argv, needle):
    spec = tmp_path / "m.py"
    spec.write_text(
        "import sys, torch\nsys.path.insert(0, %r)\nimport gpt\n"
        "def build():\n"
        "    with torch.device('meta'):\n"
        "        m = gpt.GPT(gpt.GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=4, n_embd=64))\n"
        "    idx = torch.zeros(2, 32, dtype=torch.long)\n"
        "    return m, (idx, idx)\n" % os.path.join(ROOT, "examples"))
    rc, out, err = _cli(["plan", f"{spec}:build", *argv])
    assert rc == 2 and not out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("estimator: error:") and needle in lines[0], err


def test_a_model_that_fits_on_no_number_of_gpus(tmp_path):
    with torch.device("meta"):  # 64 x 12,500^2 = 1e10 parameters: 160 GB of fp32 Adam model states
        big = torch.nn.Sequential(*[torch.nn.Linear(12_500, 12_500, bias=False) for _ in range(64)])
    x = torch.empty(4, 12_500, device="meta")
    with pytest.raises(UserError, match="fits on no number of GPUs with ddp"):
        plan(big, x, gpu="L4", gpus=8, strategy="ddp", solve=())
    # Sharded, it fits on enough GPUs: the plan says how many.
    p = plan(big, x, gpu="L4", gpus=8, strategy="fsdp", solve=())
    assert not p.fits and p.min_gpus > 8
    assert Planner(big, x, gpu="L4").plan("fsdp", p.min_gpus, solve=()).fits
    assert not Planner(big, x, gpu="L4").plan("fsdp", p.min_gpus - 1, solve=()).fits

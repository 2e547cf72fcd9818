"""Capacity planning (estimator.plan) against the real engines, DeepSpeed's formulas, and its own contracts.

The real engines: processes on CPU with the gloo backend (``tests/dist_worker.py``) train the
example GPT on 2 ranks and the example Llama on 4 ranks (a 2 x 2 mesh for tensor parallelism)
with DDP, FSDP2 and FSDP2 x TP (with and without sequence parallelism), in fp32, under autocast
(``bf16-mixed``) and with FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16)``, with and without
activation checkpointing; each rank measures its parameter, gradient and optimizer-state bytes
from the real tensors and the peak of live bytes over a steady-state iteration.  The plan of the
same configuration and rank (``device="cpu"``: exact bytes, no CUDA rounding) must match the
model states exactly and the peak within 1 %.  The real runs happen once per session, while the
plans are traced.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
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
from estimator.memory import CUDA_RESERVE, FRAGMENTATION, simulate
from estimator.plan import PRECISIONS, STRATEGIES, Planner, compare, plan
from estimator.plan.layout import Layout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "dist_worker.py")


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"_plan_example_{name}", os.path.join(ROOT, "examples", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpt = _example("gpt")
llama = _example("llama")
mlp = _example("mlp")


def _gpt(model: dict, batch: int, seq: int):
    """The example GPT on the meta device (nothing allocated) and integer inputs."""
    with torch.device("meta"):
        m = gpt.GPT(gpt.GPTConfig(**model))
    idx = torch.zeros(batch, seq, dtype=torch.long)
    return m, (idx, idx.clone())


def _llama(model: dict, batch: int, seq: int):
    with torch.device("meta"):
        m = llama.Llama(llama.LlamaConfig(**model))
    idx = torch.zeros(batch, seq, dtype=torch.long)
    return m, (idx, idx.clone())


# -- the real engines ------------------------------------------------------------------------------------------

def _runs(*specs):
    out = []
    for spec in specs:
        strategy, precision, ck, *rest = spec
        extra = dict(rest[0]) if rest else {}
        tag = "-".join([strategy + ("-tp" if extra.get("tp") else "") + ("-sp" if extra.get("sp") else "")
                        + ("-lp" if extra.get("lp") else "") + (f"-f8{extra['f8']}" if extra.get("f8") else "")
                        + ("-keep" if extra.get("reshard") is False else "")
                        + (f"-reshard{extra['reshard']}" if type(extra.get("reshard")) is int else "")
                        + (f"-accum{extra['accum']}" if extra.get("accum") else "")
                        + ("-synceach" if extra.get("sync") == "every" else "")
                        + ("-bucketview" if extra.get("bucket_view") else "")
                        + (f"-{extra['opt']}" if extra.get("opt") else "") + ("-lora" if extra.get("lora") else "")
                        + ("-clip" if extra.get("clip") else "")
                        + {"before_backward": "-zerobb", "in_place": "-zerokeep"}.get(extra.get("zero"), ""),
                        precision,
                        "ckpt" if ck else "nockpt"])
        out.append({"id": tag, "strategy": strategy, "precision": precision, "checkpoint": ck, **extra})
    return out


# vocab 257 and 250 do not divide the shard groups: FSDP2 pads dim 0, TP splits it unevenly.
GPT_CASE = {"name": "gpt", "model": "gpt", "world": 2, "ranks": [0, 1], "checkpoint": "Block",
            "config": {"vocab_size": 257, "block_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 64},
            "batch": 4, "seq": 64, "runs": _runs(
                # each engine in fp32, autocast and (FSDP2) MixedPrecisionPolicy, with and without checkpointing
                ("ddp", "fp32", False), ("ddp", "bf16-mixed", True),
                ("fsdp", "fp32", False), ("fsdp", "fsdp-bf16", False), ("fsdp", "fsdp-bf16", True),
                ("fsdp", "bf16-mixed", True), ("fsdp", "fp32", False, {"reshard": False}),
                # gradient accumulation over 3 micro-steps, the sync on the last (DDP no_sync, FSDP2
                # set_requires_gradient_sync)
                ("ddp", "fp32", False, {"accum": 3}), ("fsdp", "fp32", False, {"accum": 3}),
                # Muon on the blocks' matrices and AdamW on the rest (its Newton-Schulz steps on FSDP2's DTensors;
                # on DDP's plain tensors it is tests/test_muon_adafactor.py's single-device step), with the gradients'
                # norm clipped before the step (torch's clip_grad_norm_, max norm 1.0: one norm per DTensor gradient)
                ("fsdp", "fp32", False, {"opt": "muon", "clip": 1.0}),
                # LoRA (peft's layers on qkv and proj, the rest frozen) under DDP (clipped: foreach norms over plain
                # tensors) and FSDP2's bf16 policy
                ("ddp", "fp32", False, {"lora": True, "clip": 1.0}), ("fsdp", "fsdp-bf16", True, {"lora": True}),
                # zero_grad() after the loss, before backward (Lightning's automatic optimization): the previous
                # step's gradients (DDP's plain ones, FSDP2's sharded DTensors) held through the forward
                ("ddp", "fp32", False, {"zero": "before_backward"}),
                ("fsdp", "fsdp-bf16", False, {"zero": "before_backward", "accum": 3}),
                # zero_grad(set_to_none=False): the gradients kept (DDP's, FSDP2's sharded ones), each backward's
                # added into them
                ("ddp", "fp32", False, {"zero": "in_place"}),
                ("fsdp", "fsdp-bf16", False, {"zero": "in_place", "accum": 3}))}
LLAMA_CASE = {"name": "llama", "model": "llama", "world": 4, "ranks": [0, 3], "checkpoint": "Block",
              "config": {"vocab_size": 250, "dim": 64, "hidden_dim": 96, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                         "max_seq_len": 64},
              "batch": 2, "seq": 32, "runs": _runs(
                  ("ddp", "fp32", True), ("fsdp", "fsdp-bf16", True),
                  # FSDP2 resharding after forward to groups of 2 of the 4 ranks (an int reshard_after_forward: was
                  # planned as True, 0.91-0.95 of the real peaks)
                  ("fsdp", "fp32", False, {"reshard": 2}),
                  ("fsdp", "fp32", False, {"tp": 2}), ("fsdp", "fsdp-bf16", True, {"tp": 2}),
                  ("fsdp", "fp32", False, {"tp": 2, "sp": True}), ("fsdp", "fsdp-bf16", True, {"tp": 2, "sp": True}),
                  ("fsdp", "bf16-mixed", False, {"tp": 2, "sp": True}),
                  # loss parallelism: the logits and their gradient sharded by vocabulary (250 over 2 ranks)
                  ("fsdp", "fp32", False, {"tp": 2, "lp": True}),
                  ("fsdp", "fsdp-bf16", True, {"tp": 2, "sp": True, "lp": True}),
                  # torchao's float8 (tensorwise), the weights gathered in bf16 or in float8 (all-gather)
                  ("fsdp", "fsdp-bf16", False, {"f8": "tensorwise"}), ("fsdp", "fsdp-bf16", True, {"f8": "all-gather"}))}
# weights larger than a micro-batch's activations (1 x 8 tokens): gradient accumulation synced on the last micro-step
# (FSDP2 holds the unsharded gradients between them) or after every one (Composer's loop under FSDP, accelerate's
# sync_each_batch: reduce-scattered each time, none held), whose peaks differ by about those gradients
WIDE_CASE = {"name": "wide", "model": "gpt", "world": 2, "ranks": [0], "checkpoint": "Block",
             "config": {"vocab_size": 64, "block_size": 8, "n_layer": 2, "n_head": 4, "n_embd": 256},
             "batch": 1, "seq": 8, "runs": _runs(("fsdp", "fp32", False, {"accum": 3}),
                                                 ("fsdp", "fp32", False, {"accum": 3, "sync": "every"}),
                                                 # DDP's gradients as views into its buckets (a real peak 0.81x the
                                                 # default's here: no gradient of their own)
                                                 ("ddp", "fp32", False), ("ddp", "fp32", False, {"bucket_view": True}))}
CASES = [GPT_CASE, LLAMA_CASE, WIDE_CASE]
RUNS = [(c["name"], r["id"], rank) for c in CASES for r in c["runs"] for rank in c["ranks"]]


def _start(case: dict, directory) -> list[subprocess.Popen]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    config = json.dumps({"cases": [case]})
    return [subprocess.Popen([sys.executable, WORKER, str(r), str(case["world"]), str(directory / "init"),
                              str(directory / f"r{r}.json"), config], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for r in range(case["world"])]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """The real runs (started first, running while the plans are traced) and the plans."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    from torch.distributed import fsdp

    if not hasattr(fsdp, "fully_shard"):
        pytest.skip("FSDP2 fully_shard is not available in this torch")
    started = []
    for case in CASES:
        d = tmp_path_factory.mktemp(case["name"])
        started.append((case, d, _start(case, d)))
    plans = {}
    try:
        for case in CASES:
            build = _gpt if case["model"] == "gpt" else _llama
            model, inputs = build(case["config"], case["batch"], case["seq"])
            planners = {}
            for run in case["runs"]:
                key = (run["precision"], run.get("accum", 1), run.get("f8"), run.get("opt", "adamw"), run.get("lora"),
                       run.get("clip"), run.get("zero", "after_step"), run.get("sync", "last"))
                planner = planners.get(key)
                if planner is None:
                    planner = planners[key] = Planner(model, inputs, gpu="H100", device="cpu", optimizer=key[3],
                                                      lora="r=8,alpha=16,targets=qkv+proj" if key[4] else None,
                                                      clip_grad_norm=key[5], zero_grad=key[6],
                                                      precision=run["precision"], grad_accum=key[1],
                                                      grad_sync=key[7],
                                                      float8="tensorwise" if key[2] else None,
                                                      float8_all_gather=key[2] == "all-gather")
                for rank in case["ranks"]:
                    plans[(case["name"], run["id"], rank)] = planner.plan(
                        run["strategy"], case["world"], tp=run.get("tp", 1), sequence_parallel=run.get("sp", False),
                        loss_parallel=run.get("lp", False),
                        checkpoint=case["checkpoint"] if run["checkpoint"] else None,
                        reshard_after_forward=run.get("reshard", True), rank=rank, solve=(),
                        gradient_as_bucket_view=run.get("bucket_view", False))
        real = {}
        for case, d, procs in started:
            outs = [p.communicate(timeout=420) for p in procs]
            for r, (p, (_, err)) in enumerate(zip(procs, outs)):
                assert p.returncode == 0, f"{case['name']} rank {r} failed:\n{err[-4000:]}"
            for r in range(case["world"]):
                for key, value in json.loads((d / f"r{r}.json").read_text())["runs"].items():
                    real[(*key.split("/"), r)] = value
    except BaseException:
        for _, _, procs in started:
            for p in procs:
                p.kill()
        raise
    return real, plans


@pytest.mark.parametrize("case,run,rank", RUNS)
def test_model_states_match_the_real_engine_exactly(engines, case, run, rank):
    real, plans = engines
    x, g = real[(case, run, rank)], plans[(case, run, rank)].per_gpu
    assert (g.parameters, g.gradients, g.optimizer_state) == (x["parameters"], x["gradients"], x["optimizer_state"])


@pytest.mark.parametrize("case,run,rank", RUNS)
def test_peak_matches_the_real_engine_within_one_percent(engines, case, run, rank):
    real, plans = engines
    x, g = real[(case, run, rank)], plans[(case, run, rank)].per_gpu
    assert g.peak == pytest.approx(x["peak"], rel=0.01), (g.peak, x["peak"], x["peak_op"], g.peak_op)


def test_syncing_every_micro_step_holds_no_unsharded_gradients(engines):
    """``grad_sync="every"`` (Composer's loop under FSDP, accelerate's ``sync_each_batch``): the plan took every
    accumulating loop for FSDP2 under ``set_requires_gradient_sync(False)``, whose unsharded gradients live between
    micro-steps (MPT-7B on 8 A100s planned 91.5 GiB, does not fit, for a published run's 63.2). Each loop's real
    peak is within 1 % of its plan (test_peak_matches_the_real_engine_within_one_percent); here the two real
    loops differ, and the plans by as much."""
    real, plans = engines
    last, every = ("fsdp-accum3-fp32-nockpt", "fsdp-accum3-synceach-fp32-nockpt")
    gap_real = real[("wide", last, 0)]["peak"] - real[("wide", every, 0)]["peak"]
    gap_plan = plans[("wide", last, 0)].per_gpu.peak - plans[("wide", every, 0)].per_gpu.peak
    assert gap_real > 0.05 * real[("wide", last, 0)]["peak"]  # (the case discriminates)
    assert gap_plan == pytest.approx(gap_real, rel=0.05), (gap_plan, gap_real)


def test_each_rank_holds_the_engines_local_shards(engines):
    """Shapes of every parameter as the real rank holds it (FSDP2 padding, TP's uneven vocabulary split)."""
    real, _ = engines
    case = LLAMA_CASE
    model, inputs = _llama(case["config"], case["batch"], case["seq"])
    planner = Planner(model, inputs, gpu="H100", device="cpu", precision="fp32")
    for rank in case["ranks"]:
        step = planner.traced(planner_layout(planner, "fsdp", 4, tp=2, rank=rank))
        traced = {n: list(p.shape) for n, p in step.cap.params.items()}
        assert traced == real[("llama", "fsdp-tp-fp32-nockpt", rank)]["local_shapes"]


def planner_layout(planner, strategy, gpus, **kw):
    from estimator.plan.layout import Layout

    return Layout(strategy, gpus, gpus_per_node=planner.gpus_per_node, **kw)


def test_loss_parallel_keeps_only_the_local_vocabulary_shard_of_returned_logits():
    """A Hugging Face decoder returns its logits beside the loss: under loss parallelism they are a DTensor of
    the global shape whose storage is the local shard.  The step's output is that shard, and the peak falls by
    more than the full logits' share the rank no longer holds (the real engine's bytes are checked on the
    example Llama in test_peak_matches_the_real_engine_within_one_percent)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    ids = torch.zeros(2, 32, dtype=torch.long)
    planner = Planner(model, {"input_ids": ids, "labels": ids}, gpu="H100", device="cpu", precision="fp32")
    off, on = (planner.plan("fsdp", 4, tp=2, loss_parallel=lp, solve=()) for lp in (False, True))
    step = planner.traced(replace(Layout("fsdp", 4, 2), loss_parallel=True))
    out = sum(step.cap.storage_bytes[s] for s in step.cap.sids["output"])
    assert out == 2 * 32 * 500 * 4 + 4  # (batch, seq, vocab / tp) fp32 logits, the local shard only; the fp32 loss
    assert on.per_gpu.peak < off.per_gpu.peak - 2 * 32 * 500 * 4
    assert "loss parallel" in on.render() and on.to_dict()["loss_parallel"] is True


# -- rows, reserve, precision ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_rows_add_up_to_the_peak_for_every_strategy_and_precision(device):
    model, inputs = _llama({"vocab_size": 96, "dim": 32, "hidden_dim": 48, "n_layers": 2, "n_heads": 4,
                            "n_kv_heads": 2, "max_seq_len": 16}, 2, 16)
    # (CPU: the exact-bytes path on two precisions; on the CUDA path, which adds the workspaces row, every kind
    # of precision: fp32, a model cast, autocast in both dtypes (fp16 adds GradScaler's state), FSDP2's policy;
    # fp16 and fsdp-fp16 run the code paths of bf16 and fsdp-bf16)
    for precision in ("fp32", "bf16", "bf16-mixed", "fp16-mixed", "fsdp-bf16") if device == "cuda" \
            else ("fp32", "bf16-mixed"):
        planner = Planner(model, inputs, gpu="H100", device=device, precision=precision)
        for strategy in STRATEGIES:
            if precision.startswith("fsdp-") and strategy not in ("fsdp", "hsdp"):
                with pytest.raises(UserError, match="MixedPrecisionPolicy"):
                    planner.plan(strategy, 16, solve=())
                continue
            p = planner.plan(strategy, 16, solve=())
            assert sum(p.per_gpu.rows.values()) == p.per_gpu.peak, (precision, strategy, p.per_gpu.rows)
            # (the fit is checked at the first step's peak where it is higher, and the plan says so)
            first = next((n for n in p.notes if n.startswith("the first step peaks higher")), None)
            assert p.verdict.needed == p.per_gpu.peak + sum(p.verdict.reserve.values()) or \
                (first and p.verdict.needed > p.per_gpu.peak + sum(p.verdict.reserve.values()))
            # what the caching allocator needs beyond the peak: simulated on the traced step (CUDA engines),
            # the 2.5 % first guess for ZeRO laid out by hand (and on CPU, where no allocator runs)
            traced = planner.traced(planner_layout(planner, strategy, 16), ())
            simulated = traced.fragmentation() if device == "cuda" and strategy not in (
                "zero1", "zero2", "zero3") else None
            expected = simulated if simulated is not None else int(FRAGMENTATION * p.per_gpu.peak)
            assert p.verdict.reserve["fragmentation"] == expected, (precision, strategy)


def test_the_rows_replay_is_memorys_replay():
    """Without re-sizing, the planner's replay of a traced step gives estimator.memory's steady-state peak."""
    model, inputs = _gpt({"vocab_size": 128, "block_size": 32, "n_layer": 2, "n_head": 2, "n_embd": 32}, 2, 32)
    planner = Planner(model, inputs, gpu="H100", device="cuda", precision="bf16-mixed")
    for strategy in ("ddp", "fsdp"):
        step = planner.traced(planner_layout(planner, strategy, 4))
        assert step.peak("cuda").total == simulate(step.cap, "cuda").peak
        assert step.peak("cpu").total == simulate(step.cap, "cpu").peak


def test_fsdp_mixed_precision_policy_keeps_gradients_and_buffers_in_the_param_dtype():
    """MixedPrecisionPolicy(param_dtype=bf16): parameters gathered, gradients reduced in bf16 (FSDP2's
    default reduce dtype), so the all-gather and reduce-scatter move half the bytes of fp32."""
    model, inputs = _gpt({"vocab_size": 128, "block_size": 32, "n_layer": 2, "n_head": 2, "n_embd": 32}, 2, 32)
    fp32 = Planner(model, inputs, gpu="H100", device="cpu", precision="fp32").plan("fsdp", 8, solve=())
    bf16 = Planner(model, inputs, gpu="H100", device="cpu", precision="fsdp-bf16").plan("fsdp", 8, solve=())
    reduce32 = Planner(model, inputs, gpu="H100", device="cpu", precision="fsdp-bf16",
                       reduce_dtype="fp32").plan("fsdp", 8, solve=())
    for kind in ("all_gather", "reduce_scatter"):
        assert bf16.time.comm_bytes_per_gpu[kind] == pytest.approx(fp32.time.comm_bytes_per_gpu[kind] / 2, rel=0.02)
    assert reduce32.time.comm_bytes_per_gpu["reduce_scatter"] == pytest.approx(
        fp32.time.comm_bytes_per_gpu["reduce_scatter"], rel=1e-6)
    # The sharded parameters, their gradients and the optimizer state stay fp32 (the policy casts copies).
    assert (bf16.per_gpu.parameters, bf16.per_gpu.gradients, bf16.per_gpu.optimizer_state) == \
        (fp32.per_gpu.parameters, fp32.per_gpu.gradients, fp32.per_gpu.optimizer_state)


def test_default_precision_is_bf16_mixed():
    model, x = mlp.build(batch=4)
    assert plan(model, x, gpu="H100", solve=()).config.precision == "bf16-mixed"


# -- ZeRO: DeepSpeed's estimators and the paper -------------------------------------------------------------------


def _mlp_divisible():
    """Every dim 0 divisible by 8: no padding."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 64))
    return model, torch.randn(8, 64)


def _model_to_params(model):
    """DeepSpeed's ``model_to_params`` (stage3.py): total parameters, and the most any one module owns."""
    total = sum({p.data_ptr(): p.numel() for p in model.parameters()}.values())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return total, largest


@pytest.mark.parametrize("n", [2, 8])
def test_zero_model_states_equal_deepspeeds_estimators(n):
    """deepspeed/runtime/zero/stage_1_and_2.py estimate_zero2_model_states_mem_needs and stage3.py
    estimate_zero3_model_states_mem_needs (cpu_offload=False), Adam in bf16 mixed precision, as
    independent arithmetic of the model's parameters."""
    model, x = _mlp_divisible()
    psi, largest = _model_to_params(model)
    planner = Planner(model, x, gpu="A100-80GB", precision="bf16-mixed", optimizer="adam", device="cpu")

    def states(strategy):
        g = planner.plan(strategy, n, solve=()).per_gpu
        return g.parameters + g.gradients + g.optimizer_state

    assert states("zero2") == 2 * psi + int(18 * psi / n)  # stage_1_and_2.py, cpu_offload=False
    assert states("zero3") == int(18 * psi / n)  # stage3.py, without its largest_layer_memory term ...
    z3 = planner.plan("zero3", n, solve=())
    assert z3.per_gpu.rows["gathered_parameters"] == 4 * largest  # ... which is the gathering buffer
    # Stage 1 keeps the 16-bit gradients whole: 2 (params) + 2 (grads) + (4 + 4 + 8) / N.
    assert states("zero1") == 4 * psi + 16 * psi // n
    # The reduction bucket: reduce_bucket_size (5e8 elements) of bf16, at most the gradients' size.
    assert planner.plan("zero2", n, solve=()).per_gpu.rows["comm_buffers"] == 2 * min(500_000_000, psi)


def test_zero_offload_equals_deepspeeds_cpu_offload_estimates():
    model, x = _mlp_divisible()
    psi, largest = _model_to_params(model)
    planner = Planner(model, x, gpu="A100-80GB", precision="bf16-mixed", optimizer="adam", device="cpu")
    g = planner.plan("zero2", 8, offload="optimizer", solve=()).per_gpu
    assert g.parameters + g.gradients + g.optimizer_state == 2 * psi  # gpu_mem = 2 * total_params
    z3 = planner.plan("zero3", 8, offload="params", solve=())
    assert z3.per_gpu.parameters + z3.per_gpu.gradients + z3.per_gpu.optimizer_state == 0
    assert z3.per_gpu.rows["gathered_parameters"] == 4 * largest  # gpu_mem = largest_layer_memory


def test_zero_paper_semantics():
    """Rajbhandari et al. 2020, §5.1, K = 12: 4P + 12P/N, 2P + 14P/N, 16P/N; no bucket."""
    model, x = _mlp_divisible()
    psi, _ = _model_to_params(model)
    n = 4
    planner = Planner(model, x, gpu="A100-80GB", precision="bf16-mixed", optimizer="adam", device="cpu",
                      zero_semantics="paper")
    expect = {"zero1": 4 * psi + 12 * psi // n, "zero2": 2 * psi + 14 * psi // n, "zero3": 16 * psi // n}
    for strategy, total in expect.items():
        p = planner.plan(strategy, n, solve=())
        g = p.per_gpu
        assert g.parameters + g.gradients + g.optimizer_state == total, strategy
        assert g.rows["comm_buffers"] == 0
        assert "paper semantics" in p.config.engine


# -- largest batch, longest sequence, smallest layout ---------------------------------------------------------------


def _gpu_with(capacity: int) -> GPU:
    """An H100 (its architecture decides the kernels and workspaces, hence the peak) of ``capacity`` bytes."""
    from dataclasses import replace

    return replace(lookup("H100"), name="test-gpu", memory=capacity, total_memory=None)


def _gpu_fitting(peak: int, extra: int) -> GPU:
    """A GPU whose capacity is ``peak`` + the planner's first-guess reserve for it + ``extra`` bytes."""
    return _gpu_with(peak + sum(CUDA_RESERVE.values()) + int(FRAGMENTATION * peak) + extra)


def test_largest_batch_is_confirmed_by_tracing_it_and_the_next():
    model, (x, target) = mlp.build(batch=16)
    # Capacity: what the step needs at batch 50 (estimate's ``needed``: the allocator simulated, whose need
    # grows in 2 MiB segments, and the context).  The answer is the largest batch that needs no more than
    # that, by independent estimates at it and at the next batch.
    need = lambda b: estimate(model, mlp.build(batch=b)[1], device="cuda", precision="bf16-mixed").needed  # noqa: E731
    gpu = _gpu_with(need(50))
    p = plan(model, (x, target), gpu=gpu, gpus=1, strategy="ddp")
    assert p.max_batch >= 50 and p.batch.confirmed, p.batch
    assert need(p.max_batch) <= gpu.capacity < need(p.max_batch + 1)
    assert p.batch.needed_at_answer == need(p.max_batch)


def test_largest_batch_under_fsdp_is_confirmed():
    cfg = {"vocab_size": 512, "block_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 64}
    model, inputs = _gpt(cfg, 2, 64)
    # a GPU with room for about 40 micro-batches (what FSDP on 4 needs at 40, plus 1 MiB): the search's traces
    # stay small (on an L4 the answer is about 31,000 and each trace takes a second; an H100 of that size)
    gpu = _gpu_with(Planner(*_gpt(cfg, 40, 64), gpu="H100").plan("fsdp", 4, solve=(), suggest=False).verdict.needed
                    + 2**20)
    planner = Planner(model, inputs, gpu=gpu)
    p = planner.plan("fsdp", 4)
    assert p.batch.confirmed and p.max_batch > 2
    for value, fits in ((p.max_batch, True), (p.max_batch + 1, False)):  # an independent plan at that batch
        other = Planner(*_gpt(cfg, value, 64), gpu=gpu).plan("fsdp", 4, solve=(), suggest=False)
        assert other.fits is fits, (value, other.verdict.needed)


def test_a_micro_batch_too_large_still_gets_the_largest_that_fits():
    """The given micro-batch does not fit: the search still answers the largest that does, confirmed by
    independent plans at it (fits) and one more (does not)."""
    cfg = {"vocab_size": 256, "block_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 64}
    fits_at = lambda b: Planner(*_gpt(cfg, b, 64), gpu="H100", precision="fp32").plan(  # noqa: E731
        "fsdp", 4, solve=(), gpu=gpu, suggest=False)
    gpu = _gpu_fitting(Planner(*_gpt(cfg, 3, 64), gpu="H100", precision="fp32").plan("fsdp", 4, solve=()).per_gpu.peak, 0)
    p = Planner(*_gpt(cfg, 8, 64), gpu="H100", precision="fp32").plan("fsdp", 4, gpu=gpu)
    assert not p.fits and p.max_batch >= 1 and p.batch.confirmed
    assert fits_at(p.max_batch).fits and not fits_at(p.max_batch + 1).fits
    assert f"a micro-batch of {p.max_batch} fits" in p.render().splitlines()[0]


def test_longest_sequence_is_confirmed_by_tracing():
    cfg = {"vocab_size": 256, "block_size": 4096, "n_layer": 2, "n_head": 4, "n_embd": 64}
    model, inputs = _gpt(cfg, 2, 32)
    need_at = lambda s: estimate(*_gpt(cfg, 2, s), device="cuda", precision="bf16-mixed").needed  # noqa: E731
    gpu = _gpu_with(need_at(300))
    p = plan(model, inputs, gpu=gpu, gpus=1, solve=("seq",))
    assert p.max_seq >= 300 and p.seq.confirmed, p.seq
    assert need_at(p.max_seq) <= gpu.capacity < need_at(p.max_seq + 1)


def test_a_plan_that_does_not_fit_names_the_smallest_layout_that_does():
    with torch.device("meta"):  # 24 x 4096^2 = 403M parameters: 6.4 GB of fp32 Adam model states
        big = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096, bias=False) for _ in range(24)])
    x = torch.empty(2, 4096, device="meta")
    planner = Planner(big, x, gpu="L4", precision="fp32")
    gpu = _gpu_fitting(3 << 30, 0)  # 3 GiB of peak allowed
    p = planner.plan("fsdp", 2, gpu=gpu, steps=1000)
    assert not p.fits and p.max_batch == 0 and p.time_to_train_s is None  # the model states alone do not fit
    best = p.verdict.suggestions[0]
    assert best.strategy == "fsdp" and best.gpus > 2
    # its step time and time to train are those of its own plan
    own = planner.plan("fsdp", best.gpus, solve=(), gpu=gpu, steps=1000)
    assert (best.step_time_s, best.time_to_train_s) == (own.step_time_s, own.time_to_train_s)
    assert best.time_to_train_s == pytest.approx(1000 * own.step_time_s)
    # Independently: it fits on that many GPUs and not on the candidate below (a multiple of 8 GPUs above 8).
    assert planner.plan("fsdp", best.gpus, solve=(), gpu=gpu).fits
    below = best.gpus - 8 if best.gpus > 8 else best.gpus // 2
    assert not planner.plan("fsdp", below, solve=(), gpu=gpu).fits
    ddp = planner.plan("ddp", 8, solve=(), gpu=gpu)  # ddp shards nothing: the suggestion is fsdp
    assert not ddp.fits and ddp.verdict.suggestions[0].strategy == "fsdp"


# -- time -----------------------------------------------------------------------------------------------------------


def test_step_time_is_the_timing_models_on_one_gpu():
    """One GPU, no communication: the plan's step is estimator.timing's step of the same model (the
    model ``estimate --gpu`` reports), up to DDP's own ops (bucket copies) in the plan's trace."""
    cfg = {"vocab_size": 512, "block_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 64}
    model, inputs = _gpt(cfg, 4, 64)
    p = plan(model, inputs, gpu="H100", gpus=1, strategy="ddp", solve=())
    r = estimate(model, inputs, gpu="H100", precision="bf16-mixed", solve_batch=False)
    assert p.step_time_s == pytest.approx(r.step_time.total, rel=0.10), (p.step_time_s, r.step_time.total)
    assert p.time.exposed_comm_s == pytest.approx(0.0, abs=1e-9)  # nothing to wait for on one GPU
    assert "calibrated per-op times" in p.time.model
    # a GPU without measurements of its own (or of a sibling chip) says its constants are extrapolated
    assert "extrapolated" in plan(model, inputs, gpu="RTX4090", gpus=1, strategy="ddp", solve=()).time.model


def test_communication_from_the_traced_collectives():
    """Ring volumes of the collectives the engines issued: DDP all-reduces every gradient once,
    2(N-1)/N of them; FSDP2 all-gathers the (padded) parameters in forward and again in backward
    (every unit but the root, which it keeps) and reduce-scatters the gradients."""
    cfg = {"vocab_size": 512, "block_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 64}
    model, inputs = _gpt(cfg, 4, 64)
    planner = Planner(model, inputs, gpu="H100", precision="fp32", device="cpu")
    grads = estimate(model, inputs, device="cpu").tally.gradients_bytes  # one device's gradients
    n = 8
    ddp = planner.plan("ddp", n, solve=())
    assert ddp.time.comm_bytes_per_gpu["all_reduce"] == pytest.approx(2 * (n - 1) / n * grads, rel=1e-6)
    fsdp = planner.plan("fsdp", n, solve=())
    assert fsdp.time.comm_bytes_per_gpu["reduce_scatter"] == pytest.approx((n - 1) / n * grads, rel=0.01)
    assert fsdp.time.exposed_comm_s <= fsdp.time.comm_s + 1e-12
    assert fsdp.time.step_time_s >= fsdp.time.compute_s


def test_exposed_communication_grows_as_the_link_slows():
    # wide enough for the GPU, not the host's launches, to set the pace (a launch-bound step hides
    # its collectives behind the host whatever the link)
    cfg = {"vocab_size": 512, "block_size": 256, "n_layer": 2, "n_head": 8, "n_embd": 1024}
    model, inputs = _gpt(cfg, 8, 256)
    fast = Planner(model, inputs, gpu="H100", interconnect="nvlink4").plan("fsdp", 8, solve=())
    slow = Planner(model, inputs, gpu="H100", interconnect="eth-100g").plan("fsdp", 8, solve=())
    assert fast.time.compute_s == pytest.approx(slow.time.compute_s)
    assert slow.time.exposed_comm_s > fast.time.exposed_comm_s
    # the bandwidth terms scale by nvlink4 / 100 GbE = 36; both add NCCL's ring latency per collective
    assert fast.time.comm_s < slow.time.comm_s < fast.time.comm_s * 450e9 / 12.5e9


def test_fsdp_side_streams_are_the_engines():
    """FSDP2 switches streams as it runs (``_fsdp_collectives.py``): the casts and the copy into the
    all-gather buffer on the copy-in stream, the reduce-scatter's copy-in (chunk_cat) on the compute
    stream, the cast of the reduced gradient back to fp32 on the reduce-scatter stream."""
    cfg = {"vocab_size": 96, "dim": 32, "hidden_dim": 48, "n_layers": 2, "n_heads": 4, "n_kv_heads": 4,
           "max_seq_len": 16}
    model, inputs = _llama(cfg, 2, 16)
    planner = Planner(model, inputs, gpu="H100", precision="fsdp-bf16", device="cpu")
    planner.plan("fsdp", 4, solve=())
    step = next(st for st in planner._steps.values() if st.collectives)
    names = {i: str(getattr(n.target, "overloadpacket", n.target)) for i, n in enumerate(step.cap.nodes)}
    on = {stream: {names[i] for i, s in step.streams.items() if s == stream} for stream in set(step.streams.values())}
    assert {"fsdp.all_gather_copy_in", "aten._foreach_copy_"} <= on["all_gather_copy_in"]
    assert "aten._to_copy" in on["reduce_scatter"]  # reduced bf16 gradient -> the fp32 shard's dtype
    assert all(i not in step.streams for i, name in names.items() if name == "fsdp.chunk_cat")
    assert set(on) <= {"all_gather_copy_in", "all_gather", "reduce_scatter", "all_reduce"}


def test_fsdp_prefetch_hides_communication_that_compute_covers():
    """A Llama-7B-wide model on 1,024 A100s: each layer's all-gathers and reduce-scatter (~13 ms over
    the rails) take less than its compute, so with FSDP2's one-ahead prefetch only the first
    all-gathers and the last reduce-scatters are exposed: four more layers add compute and
    communication but no exposed time."""
    cfg = {"vocab_size": 32000, "dim": 4096, "hidden_dim": 11008, "n_heads": 32, "n_kv_heads": 32,
           "max_seq_len": 4096}
    times = []
    for layers in (2, 6):
        model, inputs = _llama({**cfg, "n_layers": layers}, 1, 4096)
        p = Planner(model, inputs, gpu="A100-80GB", precision="fsdp-bf16").plan("fsdp", 1024, solve=())
        times.append(p.time)
    short, deep = times
    assert deep.comm_s - short.comm_s > 0.04  # 4 layers x 3 collectives x ~4 ms or more
    assert deep.exposed_comm_s - short.exposed_comm_s < 0.02 * (deep.comm_s - short.comm_s)
    assert deep.exposed_comm_s < 0.1 * deep.comm_s + short.exposed_comm_s


def test_collective_time_is_nccls_ring_over_the_nic_rails():
    """Across nodes each rank of a node sends through its own NIC: a DGX A100's 8 x 200 Gb/s reach
    8 x 24 GB/s = 192 GB/s of bus bandwidth, the figure NVIDIA measures (NVIDIA/nccl#812); one rank
    per node gets one NIC; inside a node the NVLink rate.  Large messages cost bytes over the bus
    bandwidth, small ones NCCL's ring latency (src/graph/tuning.cc)."""
    from estimator.hardware import link
    from estimator.plan.schedule import bus_bandwidth, collective_time, ring_latency
    from estimator.plan.traced import Collective
    nvlink, hdr = link("nvlink3"), link("ib-hdr")
    big = 2**30
    dgx = Collective("all_reduce", big, 16, nodes=2, per_node=8)
    assert bus_bandwidth(dgx, nvlink, hdr) == pytest.approx(192e9)
    assert bus_bandwidth(Collective("all_reduce", big, 16, nodes=16, per_node=1), nvlink, hdr) == pytest.approx(24e9)
    # 4 x 200 Gb/s shared by 8 GPUs is 100 Gb/s per GPU: NCCL's target for it is 96 GB/s (nccl-tests#119)
    assert bus_bandwidth(Collective("all_reduce", big, 24, nodes=3, per_node=8), nvlink, link("ib-edr")) == \
        pytest.approx(96e9)
    assert bus_bandwidth(Collective("all_reduce", big, 8, nodes=1, per_node=8), nvlink, hdr) == nvlink.bandwidth
    seconds, lk = collective_time(dgx, nvlink, hdr)
    assert lk is hdr
    # all-reduce over 16 ranks: each GPU sends 2 (16-1)/16 of 1 GiB at 192 GB/s, + the ring's latency
    assert seconds == pytest.approx(2 * 15 / 16 * big / 192e9 + ring_latency(dgx, nvlink, "simple"))
    # Simple's ring latency: 8.4 us base + 28 steps x 3.4 us (NVLink) + 2 steps x 9.6 us (network)
    assert ring_latency(dgx, nvlink, "simple") == pytest.approx((8.4 + 28 * 3.4 + 2 * 9.6) * 1e-6)
    tiny = Collective("all_gather", 1024, 8, nodes=1, per_node=8)  # 1 KiB: LL's latency wins
    # LL: 3.6 us + 7 hops x 0.47 us, and 7/8 KiB at a third of 300 GB/s
    assert collective_time(tiny, nvlink, hdr)[0] == pytest.approx((3.6 + 7 * 0.47) * 1e-6 + 7 / 8 * 1024 / 100e9)


def test_time_to_train_and_flops_per_token():
    cfg = {"vocab_size": 512, "block_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 64}
    model, inputs = _gpt(cfg, 4, 64)
    planner = Planner(model, inputs, gpu="H100")
    n = 8
    p = planner.plan("fsdp", n, tokens=1e9, solve=())
    assert p.training.steps == math.ceil(1e9 / (4 * 64 * n))  # tokens / (micro-batch 4 x 64 tokens x 8 GPUs)
    assert p.time_to_train_s == pytest.approx(p.training.steps * p.step_time_s)
    m = planner.plan("fsdp", n, steps=1000, mfu=0.4, solve=())
    f = m.flops
    assert m.time_to_train_s == pytest.approx(1000 * f.model_flops_per_step_per_gpu / (0.4 * 989.4e12), rel=1e-6)
    # PaLM appendix B: 6N + 12 L H Q T FLOPs per token agrees with the traced matmul FLOPs.
    assert f.six_n_per_token == pytest.approx(f.traced_per_token, rel=0.05)
    assert f.attention_per_token == 12 * 2 * 4 * 16 * 64  # 12 x L=2 x H=4 x Q=16 x T=64


# -- comparison, sweeps, progress ---------------------------------------------------------------------------------------


def test_compare_rows_and_the_recommended_one():
    cfg = {"vocab_size": 512, "block_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 64}
    # (batch 32: activations outweigh the CUDA workspaces, so checkpointing shows)
    model, inputs = _gpt(cfg, 32, 64)
    c = compare(model, inputs, gpu="H100", gpus=16, tokens=1e8)
    rows = c.to_dict()["rows"]
    assert [(r["strategy"], bool(r["checkpoint"])) for r in rows] == [(s, k) for s in STRATEGIES for k in (False, True)]
    for r in rows:
        assert {"micro_batch", "global_batch", "step_time_s", "mfu", "time_to_train_s", "max_batch"} <= set(r)
        assert r["global_batch"] == r["micro_batch"] * (16 // 1)
    by = {(r["strategy"], bool(r["checkpoint"])): r for r in rows}
    for s in STRATEGIES:
        assert by[(s, True)]["peak"] < by[(s, False)]["peak"]  # checkpointing keeps less
    best = min((r for r in rows if r["fits"]), key=lambda r: r["time_to_train_s"])
    assert best["recommended"] and sum(r["recommended"] for r in rows) == 1
    assert "Fastest (*):" in c.render()


def test_sweep_over_gpu_types_and_counts_is_one_table():
    model, x = mlp.build(batch=8)
    c = Planner(model, x, gpu="L4").compare([2, 4], strategies=["fsdp"], gpu=["L4", "H100"], with_checkpointing=False)
    assert [(p.config.gpu, p.config.gpus) for p in c.plans] == [("L4", 2), ("L4", 4), ("H100-SXM", 2), ("H100-SXM", 4)]


def test_progress_is_reported():
    model, x = mlp.build(batch=8)
    stages = []
    plan(model, x, gpu="H100", gpus=2, strategy="fsdp", solve=(), progress=lambda s, d="": stages.append(s))
    assert any(s.startswith("tracing fsdp on 2 GPUs") for s in stages)
    assert any("tracing backward" in s for s in stages)


# -- command line ----------------------------------------------------------------------------------------------------


def _cli(argv: list[str]) -> tuple[int, str, str]:
    from estimator.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse rejects a value itself (usage, then one error line)
            rc = exc.code
    return rc, out.getvalue(), err.getvalue()


def test_cli_json_has_the_schema(tmp_path):
    out = tmp_path / "plan.json"
    rc, _, err = _cli(["plan", "examples/mlp.py:build", "--gpu", "L4", "--gpus", "4", "--strategy", "zero2",
                       "--samples", "1M", "--format", "json", "--output", str(out)])
    assert rc == 0, err
    d = json.loads(out.read_text())
    assert {"gpu", "gpus", "strategy", "per_gpu", "capacity", "fits", "max_batch", "step_time_s",
            "time_to_train_s", "engine", "precision"} <= set(d)
    assert {"parameters", "gradients", "optimizer_state", "rows", "peak"} <= set(d["per_gpu"])
    assert sum(d["per_gpu"]["rows"].values()) == d["per_gpu"]["peak"]
    assert d["gpu"] == "L4" and d["gpus"] == 4 and d["strategy"] == "zero2" and d["precision"] == "bf16-mixed"
    assert d["capacity"] == lookup("L4").capacity and isinstance(d["fits"], bool)
    assert isinstance(d["max_batch"], int) and d["step_time_s"] > 0 and d["time_to_train_s"] > 0


def test_cli_shares_estimates_spec_options(tmp_path):
    """--batch/--seq/--set reach an hf: spec (the loss is the model's), as for estimate."""
    pytest.importorskip("transformers")
    out = tmp_path / "p.json"
    rc, _, err = _cli(["plan", "hf:gpt2", "--set", "n_layer=1", "--set", "n_embd=64", "--set", "n_head=2",
                       "--batch", "3", "--seq", "32", "--gpu", "H100", "--gpus", "2", "--strategy", "fsdp",
                       "--format", "json", "--output", str(out)])
    assert rc == 0, err
    d = json.loads(out.read_text())
    assert (d["micro_batch"], d["seq"]) == (3, 32)


def test_cli_a_plan_that_does_not_fit_is_an_answer(tmp_path):
    rc, out, err = _cli(["plan", "examples/gpt.py:build", "--gpu", "L4", "--gpus", "1", "--set", "batch=512",
                         "--precision", "fp32"])
    assert rc == 0, err
    assert out.startswith("DOES NOT FIT on 1 x L4") and "Time to train" not in out
    # the answer a user needs next: the largest micro-batch that fits this layout (searched though 512 does not)
    assert "; a micro-batch of " in out.splitlines()[0] and "Largest micro-batch that fits" in out


def test_every_option_is_documented_with_an_example():
    import argparse

    from estimator.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    p = sub.choices["plan"]
    for action in p._actions:
        if action.option_strings and action.dest not in ("help", "debug"):
            assert "e.g." in (action.help or ""), action.option_strings
    assert "examples:" in (p.epilog or "")
    precision = next(a for a in p._actions if a.dest == "precision")
    from estimator.cli.options import precision_of  # the default, the same in estimate and validate (issue 23)

    assert precision_of(p.parse_args(["examples/gpt.py:build", "--gpu", "H100"])) == "bf16-mixed"
    assert "default: bf16-mixed" in precision.help


@pytest.mark.parametrize("argv,needle", [
    (["--gpu", "H10"], "H100"),  # unknown GPU: close names
    (["--gpu", "H100", "--gpus", "6", "--tp", "3"], "does not divide the 4 attention heads"),
    (["--gpu", "H100", "--gpus", "1", "--strategy", "zero3"], "use --strategy ddp"),
    (["--gpu", "H100", "--gpus", "8", "--tp", "3"], "does not divide --gpus 8"),
    (["--gpu", "H100", "--gpus", "2", "--offload", "params", "--strategy", "zero2"], "zero3, fsdp or hsdp"),
    (["--gpu", "H100", "--gpus", "2", "--strategy", "zero2", "--precision", "fsdp-bf16"], "MixedPrecisionPolicy"),
    (["--gpu", "H100", "--gpus", "4", "--strategy", "zero2", "--tp", "2"], "hand for tp 1"),
    (["--gpu", "H100", "--gpus", "x"], "comma-separated"),
    (["--gpu", "H100", "--gpus", "2", "--strategy", "fsdp", "--loss-parallel"], "add --tp 2"),
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
    lines = [line for line in err.strip().splitlines() if not line.startswith("usage:") and line.strip()]
    assert needle in lines[-1], err


# -- models with data-dependent control flow -------------------------------------------------------------------


class _ValueBranch(torch.nn.Module):
    """Reads a tensor value in forward (``if torch.isfinite(h).all()``, as models guard against bad
    inputs): fake tensors cannot take the branch.  Finite inputs always take it, so the op sequence
    does not change with the batch."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(2048, 2048)
        self.b = torch.nn.Linear(2048, 2048)

    def forward(self, x):
        h = self.a(x)
        if not torch.isfinite(h).all():
            raise ValueError("non-finite activations")
        return self.b(h)


def test_a_model_that_reads_values_plans_zero_without_tracing_at_the_answer():
    """The engines (DDP, FSDP2, TP) are traced on fake tensors only: the error says what to do.  A
    ZeRO layout uses the one-device step, which falls back to real CPU tensors; its largest batch
    is then interpolated and not confirmed by traces at the answer (which would run the model for
    real at that size)."""
    model, x = _ValueBranch(), torch.ones(4, 2048)
    with pytest.raises(UserError, match="zero1/zero2/zero3"):
        plan(model, x, gpu="H100", gpus=8, strategy="fsdp", solve=())
    p = plan(model, x, gpu="H100", gpus=8, strategy="zero3")
    assert p.batch.value and p.batch.value > 4 and p.batch.confirmed is False
    assert "real CPU tensors" in p.batch.method
    assert any("reads tensor values" in n for n in p.notes)


def test_estimate_says_why_it_did_not_search_the_batch_of_a_model_that_reads_values():
    r = estimate(_ValueBranch(), torch.ones(4, 2048), gpu="H100")
    assert r.max_batch is None and "reads tensor values" in r.max_batch_note
    assert "largest micro-batch not searched: the model reads tensor values" in str(r)


class _Locked(torch.nn.Module):
    """A module with an attribute copy.deepcopy cannot copy (a lock)."""

    def __init__(self):
        super().__init__()
        import threading

        self.lin, self.lock = torch.nn.Linear(8, 8), threading.Lock()

    def forward(self, x):
        with self.lock:
            return self.lin(x)


def test_a_model_that_cannot_be_copied_is_a_one_line_error_for_plan_and_a_note_for_estimate():
    """The engines are traced on a meta copy of the model: a lock among its attributes made plan, and
    estimate --gpu's largest-batch search, crash with "cannot pickle '_thread.lock' object"."""
    with pytest.raises(UserError, match="copy.deepcopy failed .*_thread.lock.*__deepcopy__"):
        plan(_Locked(), torch.randn(4, 8), gpu="H100", gpus=2, strategy="fsdp")
    r = estimate(_Locked(), torch.randn(4, 8), gpu="H100")
    assert r.fits and r.max_batch is None and r.max_batch_note.startswith("not searched: the planner traces")
    assert "largest micro-batch not searched: the planner traces the engines on a copy" in r.headline()


# -- gradient accumulation ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_gradient_accumulation_syncs_once_per_step_and_multiplies_the_global_batch(strategy):
    """``grad_accum`` micro-steps under the engine: the global batch is micro-batch x ranks x N, the gradient
    collectives run once per optimizer step (DDP's no_sync, FSDP2's set_requires_gradient_sync), and the
    compute is N micro-steps' (forward + backward each) and one optimizer step's."""
    model, inputs = _gpt({"vocab_size": 96, "block_size": 32, "n_layer": 2, "n_head": 4, "n_embd": 32}, 2, 16)
    one = plan(model, inputs, gpu="H100", gpus=4, strategy=strategy, solve=())
    four = plan(model, inputs, gpu="H100", gpus=4, strategy=strategy, solve=(), grad_accum=4)
    assert four.config.global_batch == 4 * one.config.global_batch == 4 * 2 * 4
    assert four.training is None or four.training.samples_per_step == 4 * one.training.samples_per_step
    reduce = "all_reduce" if strategy == "ddp" else "reduce_scatter"
    # the gradients' collective: the same bytes once per step (FSDP2 all-gathers its parameters every micro-step)
    assert four.time.comm_bytes_per_gpu[reduce] == one.time.comm_bytes_per_gpu[reduce]
    if strategy == "fsdp":
        assert four.time.comm_bytes_per_gpu["all_gather"] == pytest.approx(4 * one.time.comm_bytes_per_gpu["all_gather"])
    fb_one = one.time.by_phase_s["forward"] + one.time.by_phase_s["backward"]
    fb_four = four.time.by_phase_s["forward"] + four.time.by_phase_s["backward"]
    # four micro-steps: the three without sync skip the engine's reduction bookkeeping on the compute stream
    # (FSDP2's chunk_cat and casts, DDP's bucket copies), the later ones add into the gradients
    assert 3 * fb_one < fb_four < 4.5 * fb_one


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_gradient_accumulation_flops_are_every_micro_batch_once(strategy):
    """Model FLOPs under ``grad_accum``: per token one micro-batch's (the trace's later micro-step stands for
    micro-steps 2..N and is not counted again), per optimizer step N micro-batches', and the MFU over the whole
    step.  Truth: FlopCounterMode on a real forward + backward of one micro-batch (tests/instruments.py's fixes)."""
    from instruments import flop_counter

    cfg = {"vocab_size": 96, "block_size": 32, "n_layer": 2, "n_head": 4, "n_embd": 32}
    model, inputs = _gpt(cfg, 2, 16)
    one = plan(model, inputs, gpu="H100", gpus=4, strategy=strategy, solve=())
    four = plan(model, inputs, gpu="H100", gpus=4, strategy=strategy, solve=(), grad_accum=4)
    torch.manual_seed(0)
    real = gpt.GPT(gpt.GPTConfig(**cfg))
    with flop_counter() as counter:
        real(*inputs).backward()
    counted = counter.get_total_flops()  # every op FlopCounterMode knows: matmuls and attention here
    assert one.flops.model_flops_per_step_per_gpu == counted
    assert four.flops.model_flops_per_step_per_gpu == 4 * counted  # 4 micro-batches of 2 x 16 tokens
    assert four.flops.traced_per_token == one.flops.traced_per_token == counted / (2 * 16)
    assert four.flops.attention_per_token == one.flops.attention_per_token == 12 * 2 * 4 * 8 * 16  # 12 L H Q T
    # the step is ~4 micro-steps' compute: the MFU stays within the optimizer step's share of the single one's
    assert four.flops.mfu == pytest.approx(one.flops.mfu, rel=0.25)


def test_a_plan_leaves_the_interpreters_exception_hook_as_it_was():
    """torch's init_process_group wraps sys.excepthook to prefix "[rank0]: " to every traceback line, once per
    call: after a few plans a script's traceback read "[rank0]: [rank0]: [rank0]: ...".  Put back after each
    fake process group."""
    import sys

    before = sys.excepthook
    planner = Planner(torch.nn.Sequential(torch.nn.Linear(8, 8)), torch.randn(4, 8), gpu="H100")
    for gpus in (2, 4):
        planner.plan("fsdp", gpus, solve=())
    assert sys.excepthook is before


def test_a_layout_that_fits_on_no_number_of_gpus_says_so_and_what_to_change():
    """One micro-batch's activations larger than the card (a 4096-wide layer on 2M rows: 32 GiB of fp32 input on a
    16 GB T4): no GPU count fits, and the plan printed DOES NOT FIT with nothing after it."""
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(4096, 4096))
    x = torch.empty(1, 2_000_000, 4096, device="meta")
    p = Planner(model, x, gpu="T4", precision="fp32").plan("fsdp", 2, solve=())
    assert not p.fits and not p.verdict.suggestions
    assert "No number of GPUs fits" in p.render() and "--checkpoint" in p.render()
    assert "activations and what sharding leaves whole" in p.render()
    # rows of a batch: a smaller micro-batch fits, and that is what it says first (it said to buy a larger GPU)
    rows = Planner(model, torch.empty(2_000_000, 4096, device="meta"), gpu="T4", precision="fp32").plan("fsdp", 2)
    assert not rows.fits and rows.max_batch and f"a micro-batch of {rows.max_batch:,} fits" in rows.render()
    # a card the CUDA context and the workspaces nearly fill: that is what to say, not the activations (the
    # estimate said "no micro-batch fits on one GPU (estimator plan shards it over several)", the plan blamed them)
    from dataclasses import replace

    from estimator.hardware import lookup
    from estimator.memory import CUDA_RESERVE

    small = replace(lookup("T4"), total_memory=CUDA_RESERVE["cuda_context"] + (8 << 20))
    q = Planner(torch.nn.Sequential(torch.nn.Linear(64, 64)), torch.randn(8, 64), gpu=small).plan("fsdp", 2, solve=())
    assert not q.fits and not q.verdict.suggestions
    assert "the CUDA context alone takes" in q.render() and "--checkpoint" not in q.render()


def test_the_plans_sequence_is_a_sequence():
    """A plan read dim 1 of any input as its sequence: an image batch planned as "micro-batch 8 x 3" (channels), a
    feature batch as "8 x 16384" (features).  Token ids and (batch, time, features) frames have one; images and
    feature vectors none."""
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(), torch.nn.LazyLinear(4))
    conv(torch.randn(1, 3, 16, 16))
    cases = [(conv, torch.randn(8, 3, 16, 16), None),
             (torch.nn.Sequential(torch.nn.Linear(64, 4)), torch.randn(8, 64), None),
             (torch.nn.Sequential(torch.nn.Linear(64, 4)), torch.randn(8, 10, 64), 10)]
    for model, x, seq in cases:
        p = Planner(model, x, gpu="H100").plan("ddp", 1, solve=())
        assert p.config.seq == seq and ("micro-batch 8 x" in p.render()) is (seq is not None), x.shape


def test_a_plan_in_bf16_casts_the_inputs_as_the_model():
    """--precision bf16 casts the model; the engine's trace kept the floating inputs in fp32, so a convolution
    with a bias failed ("Input type (float) and bias type (c10::BFloat16) should be the same") and a
    bias-free one ran in fp32 (a VGG's largest batch 2,322 where the estimate's own step fits 4,239).  Truth: a
    real step of the model cast to bf16 with its input cast alike (saved activations, model states)."""
    import groundtruth

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(16 * 8 * 8, 10))
    x = torch.randn(4, 3, 8, 8)

    def loss_fn(out):
        return out.float().pow(2).mean()

    p = plan(model, x, gpu="L4", gpus=1, strategy="ddp", precision="bf16", device="cpu", loss_fn=loss_fn,
             solve=())
    truth = groundtruth.measure(model.to(torch.bfloat16), x.to(torch.bfloat16), "adamw", loss_fn=loss_fn)
    assert p.per_gpu.saved_activations == truth["activation_bytes"]
    assert (p.per_gpu.gradients, p.per_gpu.optimizer_state) == (truth["grad_bytes"], truth["optimizer_state_bytes"])

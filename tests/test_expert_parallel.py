"""Expert parallelism (``--ep``, estimator.plan.expert) against real runs of torchtitan's recipe.

The truth: tests/dist_worker.py trains transformers' Mixtral (4 experts, top-2; tests/moe_worker.py) on 2 and 4
CPU processes (gloo) with expert parallelism as torchtitan applies it: the experts' weights sharded on the expert
dimension over the ep ranks, the token rows sent to their experts' ranks and back by all-to-all on the splits
the real counts give, FSDP2 on each experts module over the ranks holding the same experts (before the blocks),
on the rest over all ranks.  Routing is made balanced there (token t's j-th choice is expert (t x 2 + j) mod 4),
the case the plan assumes and says.  Each rank's model states come from the real tensors, its peak from a
live-storage tracker over a steady-state step.  The plan of the same layout (``device="cpu"``: exact bytes)
must give the model states exactly and the peak within 1 %.

Measured on 2026-11-27 (plan against real, every rank measured): FSDP2 without ep +0.00 %, ep 2 +0.00 %, ep 2
under ``fsdp-bf16`` +0.00 %, ep 2 over the 2 ranks of a context-parallel pair (torch's ring attention, the flash
op given a CPU kernel as in tests/test_context_parallel.py) -0.05 % on both, ep 2 x efsdp 2 (4 processes)
+0.06 %, ep 4 (4 processes) +0.00 %.  With tensor parallelism (dp 2 x tp 2, torchtitan's ``apply_moe_ep_tp``,
the worker's own implementation in tests/moe_worker.py), on 2026-11-29, every rank: tp 2 +0.0008 %, tp 2 with
sequence parallelism +0.0008 %, that with ep 2 +0.0002 %, tp 2 with ep 4 +0.0002 %, ep 2 with the experts split
over the tp pair (``etp`` 2, with and without sequence parallelism) +0.0002 %; the model states exact.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from estimator import UserError
from estimator.plan import Planner
from gloo_runs import assert_peak_within, assert_states_exact, real_and_planned

pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIG = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 4, "vocab_size": 250, "max_position_embeddings": 64, "num_local_experts": 4,
          "num_experts_per_tok": 2}
BATCH, SEQ = 4, 32
CASE = {"name": "mixtral", "model": "mixtral", "config": CONFIG, "batch": BATCH, "seq": SEQ, "runs": [
    {"id": "fsdp", "strategy": "fsdp", "precision": "fp32", "checkpoint": False},
    {"id": "fsdp-ep2", "strategy": "fsdp", "precision": "fp32", "checkpoint": False, "ep": 2},
    {"id": "fsdp-ep2-bf16", "strategy": "fsdp", "precision": "fsdp-bf16", "checkpoint": False, "ep": 2},
    # ep borrows the cp ranks (torchtitan's ParallelDims): the 2 ranks share each sequence and the experts
    {"id": "fsdp-cp2-ep2", "strategy": "fsdp", "precision": "fp32", "checkpoint": False, "ep": 2, "cp": 2}]}
WORLD = 2
# 4 processes: ep 2 inside 2 efsdp groups (FSDP2 shards each expert over 2 ranks), and ep 4 (one expert per rank);
# tensor parallelism on a (dp 2, tp 2) mesh as torchtitan's apply_moe_ep_tp composes it with the experts: split on
# their intermediate dimension (no ep, with and without sequence parallelism), or ep borrowing the 2 tp ranks
# (ep 2: efsdp 2) or the whole mesh (ep 4), each tp rank routing half the tokens (etp = 1)
WIDE = {**CASE, "name": "mixtral-4", "runs": [
    {"id": "fsdp-ep2-efsdp2", "strategy": "fsdp", "precision": "fp32", "checkpoint": False, "ep": 2},
    {"id": "fsdp-ep4", "strategy": "fsdp", "precision": "fp32", "checkpoint": False, "ep": 4},
    {"id": "fsdp-tp2", "strategy": "fsdp", "precision": "fp32", "checkpoint": False, "tp": 2},
    {"id": "fsdp-tp2-sp", "strategy": "fsdp", "precision": "fp32", "checkpoint": False, "tp": 2, "sp": True},
    {"id": "fsdp-tp2-sp-ep2", "strategy": "fsdp", "precision": "fp32", "checkpoint": False, "tp": 2, "sp": True,
     "ep": 2},
    {"id": "fsdp-tp2-ep4", "strategy": "fsdp", "precision": "fp32", "checkpoint": False, "tp": 2, "ep": 4},
    # torchtitan's ExpertTensorParallel (etp = tp): each expert split over the tp pair as well, ep 2 over the ranks
    # holding the same tp slice
    {"id": "fsdp-tp2-sp-ep2-etp2", "strategy": "fsdp", "precision": "fp32", "checkpoint": False, "tp": 2, "sp": True,
     "ep": 2, "etp": 2}]}
WIDE_WORLD = 4
RANKS = {"mixtral": [0, 1], "mixtral-4": [0, 3]}


def _model_and_inputs(config: dict = CONFIG):
    from transformers import MixtralConfig, MixtralForCausalLM

    with torch.device("meta"):
        model = MixtralForCausalLM(MixtralConfig(**config))
    idx = torch.zeros(BATCH, SEQ, dtype=torch.long)
    return model, {"input_ids": idx, "labels": idx.clone()}


def _planner(precision: str = "fp32", config: dict = CONFIG) -> Planner:
    return Planner(*_model_and_inputs(config), gpu="H100", device="cpu", precision=precision)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The real runs (started first, running while the plans are traced) and the plans, by run id and rank."""
    launches = [(CASE, WORLD, tmp_path_factory.mktemp("ep")), (WIDE, WIDE_WORLD, tmp_path_factory.mktemp("ep4"))]

    def plans() -> dict:
        planners = {p: _planner(p) for p in ("fp32", "fsdp-bf16")}
        return {(run["id"], rank): planners[run["precision"]].plan(
            run["strategy"], world, ep=run.get("ep", 1), cp=run.get("cp", 1), tp=run.get("tp", 1),
            sequence_parallel=run.get("sp", False), etp=run.get("etp", 1), rank=rank, solve=())
                for case, world, _ in launches for run in case["runs"] for rank in RANKS[case["name"]]}
    return real_and_planned(launches, RANKS, plans)


RUNS = [(run["id"], rank) for case in (CASE, WIDE) for run in case["runs"] for rank in RANKS[case["name"]]]


@pytest.mark.parametrize("run,rank", RUNS)
def test_model_states_match_the_real_run_exactly(runs, run, rank):
    assert_states_exact(runs, run, rank)


@pytest.mark.parametrize("run,rank", RUNS)
def test_peak_matches_the_real_run_within_one_percent(runs, run, rank):
    assert_peak_within(runs, run, rank)


def test_the_dispatch_and_combine_are_torchtitans_all_to_alls():
    """Per MoE layer of an ep group (balanced routing): in forward one all-to-all of the E per-expert counts (int32)
    and two of the routed rows (dispatch and combine), each the rank's tokens x top-k rows of the hidden size; in
    backward their two gradients (``all_to_all_single_autograd``).  Each experts module is gathered by FSDP2 over
    the ranks that hold the same experts (efsdp = 4 GPUs / ep 2 = 2), the rest of a block over all 4."""
    from estimator.plan.layout import Layout

    ep, layers, experts = 2, CONFIG["num_hidden_layers"], CONFIG["num_local_experts"]
    rows = BATCH * SEQ * CONFIG["num_experts_per_tok"]  # 4 x 32 tokens, top-2: 256 rows
    row_bytes = rows * CONFIG["hidden_size"] * 4  # fp32
    planner = _planner()
    step = planner.traced(Layout("fsdp", 4, gpus_per_node=planner.gpus_per_node, ep=ep))
    a2a = [c for c in step.collectives.values() if c.kind == "all_to_all"]
    counts = [c for c in a2a if c.nbytes == experts * 4]
    routed = [c for c in a2a if c.nbytes == row_bytes]
    assert len(counts) == layers and len(routed) == 4 * layers and len(a2a) == 5 * layers, a2a
    assert all(c.group_size == ep for c in a2a)
    gathers = [c for c in step.collectives.values() if c.kind == "all_gather"]
    # the experts' weights: gate_up (E, 2I, H) and down (E, H, I), fp32, E / ep of them per rank
    expert_bytes = experts // ep * 3 * CONFIG["intermediate_size"] * CONFIG["hidden_size"] * 4
    assert {c.group_size for c in gathers if c.nbytes == expert_bytes} == {2}
    assert any(c.group_size == 4 for c in gathers)


def test_under_tensor_parallelism_each_tp_rank_routes_its_share_of_the_tokens():
    """ep 2 x tp 2 on 4 GPUs with sequence parallelism (torchtitan's etp = 1: the ep group is the tp pair): per MoE
    layer one all-to-all of the counts and four of the routed rows, each of this rank's half of the tokens x top-k
    rows, in a group of 2; the layer's input all-gathered from the sequence shards (as the attention's is) and its
    output, a partial sum, reduce-scattered back, both over the tp pair and of the full [batch, sequence, hidden]
    tensor.  Without ep the experts are split on their intermediate dimension: no all-to-all, a rank's experts
    module 1/tp of each expert (before FSDP2 shards it over the dp pair)."""
    from estimator.plan.layout import Layout

    layers, experts, hidden, top_k = (CONFIG[k] for k in ("num_hidden_layers", "num_local_experts", "hidden_size",
                                                          "num_experts_per_tok"))
    tokens, tp = BATCH * SEQ, 2
    planner = _planner()
    step = planner.traced(Layout("fsdp", 4, tp=tp, sequence_parallel=True, gpus_per_node=planner.gpus_per_node, ep=2))
    a2a = [c for c in step.collectives.values() if c.kind == "all_to_all"]
    rows = [c for c in a2a if c.nbytes == tokens // tp * top_k * hidden * 4]  # (64 tokens x 2) rows of 64 fp32
    assert len(rows) == 4 * layers and len(a2a) == 5 * layers and {c.group_size for c in a2a} == {2}, a2a
    full = tokens * hidden * 4  # [4, 32, 64] fp32: the gathered input, the summed output
    tp_full = [c for c in step.collectives.values() if c.tp and c.nbytes == full]
    kinds = sorted(c.kind for c in tp_full)
    # per layer: attention and MoE inputs gathered in forward, their outputs reduce-scattered; backward the reverse
    assert kinds.count("reduce_scatter") >= 2 * layers and kinds.count("all_gather") >= 2 * layers, kinds
    plain = planner.traced(Layout("fsdp", 4, tp=tp, sequence_parallel=True, gpus_per_node=planner.gpus_per_node))
    assert not [c for c in plain.collectives.values() if c.kind == "all_to_all"]
    assert any("TensorParallel for experts" in n for n in plain.notes)
    assert any("borrows the 2 tensor-parallel ranks" in n for n in step.notes)
    # etp 2 (ExpertTensorParallel): every tp rank dispatches all the tokens, over the 2 ranks holding its tp slice
    split = planner.traced(Layout("fsdp", 4, tp=tp, sequence_parallel=True, gpus_per_node=planner.gpus_per_node,
                                  ep=2, etp=2))
    a2a = [c for c in split.collectives.values() if c.kind == "all_to_all"]
    assert len([c for c in a2a if c.nbytes == tokens * top_k * hidden * 4]) == 4 * layers and len(a2a) == 5 * layers
    assert any("etp = 2" in n for n in split.notes) and not any("borrows" in n for n in split.notes)


def test_experts_fewer_than_the_sharded_ranks_under_tp_are_sharded_on_dimension_1():
    """tp 2 on 16 GPUs: 8 data-parallel ranks for 4 experts.  FSDP2 on dimension 0 would pad the experts to 8 rows
    (rank 0 a whole expert's tp shard: 1/4 of it, not 1/8); on dimension 1 every rank holds 1/16 of every weight,
    so a rank's parameters are the model's fp32 bytes / 16 (to FSDP2's padding of each tensor to 16 rows)."""
    model, _ = _model_and_inputs()
    total = sum(p.numel() for p in model.parameters()) * 4  # fp32 bytes, 213,056 parameters
    plan = _planner().plan("fsdp", 16, tp=2, sequence_parallel=True, solve=())
    assert plan.per_gpu.parameters == pytest.approx(total / 16, rel=0.05)
    assert any("sharded on dimension 1" in n for n in plan.notes)


def test_each_rank_holds_its_experts():
    """ep 2 on 2 GPUs: FSDP2's shards of the experts are the same size as without ep (E/ep experts on 1 rank vs E
    over 2), but a rank gathers only its E/2 experts: less gathered memory at the peak; the config and the
    title say ep; the API's plan() takes ep as the Planner does."""
    from estimator.plan import plan

    plain, ep = (_planner().plan("fsdp", 2, ep=e, solve=()) for e in (1, 2))
    assert plan(*_model_and_inputs(), gpu="H100", gpus=2, strategy="fsdp", ep=2, device="cpu", precision="fp32",
                solve=()).to_dict() == ep.to_dict()
    assert ep.per_gpu.parameters == plain.per_gpu.parameters
    assert ep.per_gpu.rows["gathered_parameters"] < plain.per_gpu.rows["gathered_parameters"]
    assert ep.config.ep == 2 and ep.to_dict()["ep"] == 2 and "x ep 2" in ep.render().splitlines()[2]
    assert any("balanced routing assumed" in n for n in ep.notes)


@pytest.mark.parametrize("kw,message", [
    ({"ep": 3, "gpus": 3}, "does not divide the 4 experts"),
    ({"ep": 2, "gpus": 3}, "divides 3"),
    ({"ep": 2, "strategy": "ddp"}, "use --strategy fsdp or hsdp"),
    ({"ep": 2, "strategy": "zero2"}, "use --strategy fsdp or hsdp"),
    ({"ep": 2, "tp": 2, "cp": 2, "gpus": 8}, "multiple of --cp 2 x --tp 2"),
    ({"ep": 2, "tp": 2, "etp": 3, "gpus": 4}, "--etp must be 1"),
    ({"tp": 2, "etp": 2, "gpus": 4}, "add --ep"),
    ({"ep": 4, "tp": 2, "etp": 2, "gpus": 4}, "ep that divides 2"),
    ({"ep": 0}, "--ep must be >= 1"),
])
def test_impossible_expert_parallel_layouts_are_one_line_errors(kw, message):
    kw = {"strategy": "fsdp", "gpus": 2, **kw}
    with pytest.raises(UserError, match=message):
        _planner().plan(kw.pop("strategy"), kw.pop("gpus"), solve=(), **kw)


def test_a_model_without_experts_is_a_one_line_error():
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import llama

    with torch.device("meta"):
        model = llama.Llama(llama.LlamaConfig(vocab_size=64, dim=32, hidden_dim=48, n_layers=1, n_heads=2,
                                              n_kv_heads=2, max_seq_len=16))
    idx = torch.zeros(2, 16, dtype=torch.long)
    with pytest.raises(UserError, match="no experts module"):
        Planner(model, (idx, idx.clone()), gpu="H100", device="cpu").plan("fsdp", 2, ep=2, solve=())


def test_cli_passes_ep_to_the_planner(monkeypatch, capsys):
    """``--ep`` and ``--etp`` reach ``Planner.plan``, also for every row of ``--compare`` (``--etp`` for the rows whose
    tp it is)."""
    from estimator.cli.main import main

    def seen(self, strategy, gpus, **kw):
        raise UserError(f"seen ep={kw['ep']} etp={kw['etp']}")

    monkeypatch.setattr(Planner, "plan", seen)
    spec = os.path.join(ROOT, "examples", "llama.py") + ":build"
    assert main(["plan", spec, "--gpu", "H100", "--gpus", "4", "--strategy", "fsdp", "--ep", "2"]) == 2
    assert "seen ep=2 etp=1" in capsys.readouterr().err
    assert main(["plan", spec, "--gpu", "H100", "--gpus", "4", "--strategy", "fsdp", "--tp", "2", "--ep", "2",
                 "--etp", "2"]) == 2
    assert "seen ep=2 etp=2" in capsys.readouterr().err
    assert main(["plan", spec, "--gpu", "H100", "--gpus", "4", "--ep", "2", "--compare"]) == 2
    err = capsys.readouterr().err  # every row refused by the stand-in: "no layout applies: ... seen ep=2 ..."
    assert len(err.strip().splitlines()) == 1 and "seen ep=2" in err


def test_an_all_to_all_across_nodes_sends_each_gpus_share_through_its_own_nic():
    """16 ranks in 2 nodes of 8, a 64 MiB buffer: each GPU sends 8/16 of it to the other node through its own
    NIC (400 Gb/s = 50 GB/s at NCCL's 24/25) and 7/16 over NVLink at the same time; the slower part plus a
    ring's latency.  A ring all-gather of the same buffer uses all 8 rails of the node: 15/16 of it at
    min(NVLink 450, 8 x 48 = 384 GB/s), over 3x faster than the all-to-all's 8/16 at 48 GB/s."""
    from estimator.hardware import link
    from estimator.plan.schedule import NIC_EFFICIENCY, collective_time, ring_latency
    from estimator.plan.traced import Collective

    intra, inter = link("nvlink4"), link("ib-ndr")
    size = 64 * 2**20
    c = Collective("all_to_all", size, 16, nodes=2, per_node=8)
    across = 8 / 16 * size / (inter.bandwidth * NIC_EFFICIENCY)
    inside = 7 / 16 * size / intra.bandwidth
    t, lk = collective_time(c, intra, inter)
    assert t == pytest.approx(ring_latency(c, intra, "simple") + max(across, inside)) and lk is inter
    ring, _ = collective_time(Collective("all_gather", size, 16, nodes=2, per_node=8), intra, inter)
    assert ring < t / 3


def test_compare_keeps_ep_on_every_row_and_says_which_strategies_cannot():
    """``--compare --ep 2`` on 2 GPUs: the fsdp row is planned with ep 2, its layout column says so; ddp and the
    ZeRO stages cannot shard experts and are listed as not applicable."""
    cmp = _planner().compare(2, ep=2, with_checkpointing=False)
    assert {p.config.strategy for p in cmp.plans} == {"fsdp"} and all(p.config.ep == 2 for p in cmp.plans)
    assert all(r["ep"] == 2 for r in cmp.to_dict()["rows"])
    assert "fsdp x ep 2" in cmp.render()
    for s in ("ddp", "zero1", "zero2", "zero3"):
        assert any(x.startswith(f"{s} x ep 2 on 2 GPUs") and "fsdp or hsdp" in x for x in cmp.skipped), cmp.skipped


def test_without_ep_experts_fewer_than_the_ranks_are_sharded_on_dimension_1():
    """FSDP2 over 8 ranks without ep: the 4 experts' weights are sharded on dimension 1 as torchtitan's apply_fsdp
    shards them (dimension 0 would give rank 0 a whole expert, twice its share); every other parameter on
    dimension 0.  Rank 0 holds ceil(size / 8) of each tensor's sharded dimension (FSDP2's padded chunks), fp32."""
    import math

    model, _ = _model_and_inputs()
    expected = 0
    for name, p in model.named_parameters():
        dim = 1 if ".experts." in name else 0
        expected += math.ceil(p.shape[dim] / 8) * (p.numel() // p.shape[dim]) * 4
    plan = _planner().plan("fsdp", 8, solve=())
    assert plan.per_gpu.parameters == expected
    assert any("sharded on dimension 1" in n and "4 experts are fewer than the 8" in n for n in plan.notes)


def test_six_n_counts_the_parameters_a_token_activates():
    """The 6N cross-check of a mixture of experts counts each expert's weights at top-k / E (2 of 4 here): the
    weights of the Linear layers (attention, router, head) in full, the experts' 3-D weights at half; the
    embedding and the norms enter no matmul."""
    model, _ = _model_and_inputs()
    dense = sum(p.numel() for n, p in model.named_parameters() if p.ndim == 2 and "embed_tokens" not in n)
    experts = sum(p.numel() for n, p in model.named_parameters() if p.ndim == 3)
    p = _planner().plan("fsdp", 2, solve=())
    assert p.flops.matmul_params == dense + experts * 2 // 4


EP_BIAS_CHECK = """
import sys, tempfile, torch, torch.distributed as dist
from estimator.compat import import_torchvision
import_torchvision()  # PyPI's torchvision beside the CPU torch (the test extras): transformers imports it
import transformers
from torch.distributed.device_mesh import init_device_mesh
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts
from estimator.plan.expert import experts_forward
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
torch.manual_seed(0)
cfg = transformers.AutoConfig.for_model("gpt_oss", hidden_size=16, intermediate_size=8, num_local_experts=4,
                                        num_experts_per_tok=2)
experts = GptOssExperts(cfg)
for p in experts.parameters():
    torch.nn.init.normal_(p, std=0.5)
x, idx, w = torch.randn(12, 16), torch.stack([torch.randperm(4)[:2] for _ in range(12)]), torch.rand(12, 2)
truth = experts(x, idx, w)
truth.square().sum().backward()
grads = {n: p.grad.clone() for n, p in experts.named_parameters()}
experts.zero_grad()
ours = experts_forward(init_device_mesh("cpu", (1,)))(experts, x, idx, w)
ours.square().sum().backward()
assert experts.has_bias
assert torch.allclose(ours, truth, atol=1e-5), (ours - truth).abs().max()
for n, p in experts.named_parameters():
    assert torch.allclose(p.grad, grads[n], atol=1e-4), n
dist.destroy_process_group()
print("same")
"""


def test_experts_with_biases_dispatch_to_what_transformers_computes():
    """gpt-oss's experts carry a bias row per expert: the dispatching forward the plan traces (estimator.plan.
    expert.experts_forward) adds each received row's expert's bias as transformers' grouped path does. Run for real
    (one gloo rank, in its own process: a process group is global) against transformers' own experts forward
    on random weights: the same output and the same gradients of all four expert tensors, biases included;
    and a plan of gpt-oss under --ep 2 holds E / ep of each bias's rows on a rank."""
    import subprocess

    from estimator.plan.layout import Layout
    from estimator.specs import load

    done = subprocess.run([sys.executable, "-c", EP_BIAS_CHECK], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0 and done.stdout.strip().endswith("same"), done.stderr[-2000:]
    model, inputs = load("hf:gpt_oss", batch=2, seq=32, overrides=dict(
        num_hidden_layers=1, hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
        num_local_experts=4, head_dim=16))
    planner = Planner(model, inputs, gpu="H100", device="cpu", precision="fp32")
    step = planner.traced(Layout("fsdp", 2, gpus_per_node=planner.gpus_per_node, ep=2))
    shapes = {n: list(p.shape) for n, p in step.cap.params.items() if n.endswith("_bias") and ".experts." in n}
    # 4 experts over ep 2: 2 rows each on this rank (FSDP2 over the efsdp = 2 / 2 = 1 rank keeps them whole)
    assert shapes and all(s[0] == 4 // 2 for s in shapes.values()), shapes


def test_tokens_that_do_not_split_over_tp_are_a_one_line_error():
    """ep with tp (etp 1) splits each MoE layer's batch x sequence tokens evenly over the tp ranks, as torchtitan's
    ReordererSequenceParallel does: 3 x 31 = 93 tokens over 2 ranks is refused, saying what to change (and nothing
    about head-count views, the hint for other failures under tp)."""
    model, _ = _model_and_inputs()
    idx = torch.zeros(3, 31, dtype=torch.long)
    planner = Planner(model, {"input_ids": idx, "labels": idx.clone()}, gpu="H100", device="cpu", precision="fp32")
    with pytest.raises(UserError, match=r"93 tokens .* divisible by 2$"):
        planner.plan("fsdp", 4, tp=2, ep=2, solve=())

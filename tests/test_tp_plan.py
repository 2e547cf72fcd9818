"""Tensor parallelism's pairs (estimator.plan.tp) against the plans transformers ships for its models.

The planner reads Megatron's colwise/rowwise pairs from the traced dataflow, with no table of names.  transformers
states each architecture's own plan (``config.base_model_tp_plan``: ``"layers.*.self_attn.q_proj": "colwise"``, ...),
written by the model's authors for its ``tp_plan="auto"``: the truth here.  For each of 21 architectures (tiny
random configurations, built on ``meta``): the derived colwise and rowwise Linear layers are those the shipped plan
marks ``colwise`` and ``rowwise``; a norm the shipped plan keeps whole on every rank (``replicated_with_grad_allreduce``:
Qwen3's and Gemma 3's per-head ``q_norm`` and ``k_norm``) is not run on sequence shards; a block whose experts the
shipped plan splits (``moe_tp_experts``) is a mixture-of-experts block of the planner's.  Then each plans under
``--tp 2`` with sequence parallelism (the trace runs the split model on local shards, so a wrong pair fails it;
the sliding windows are shorter than the sequence, so those models' masks are explicit and built for the whole
sequence).
Until 2026-11-29 a per-head norm ended the pairs' walk (Qwen3's q and k projections were left whole and its plan
failed in the attention), and under sequence parallelism a tied embedding's output was not cut to the sequence
shard (Gemma: the sequence doubled), a norm feeding a residual sum returned a DTensor (Gemma 2, 3) and a block
without a norm before its attention took the residual stream's shard for the whole sequence (Exaone 4).
"""

from __future__ import annotations

import re

import pytest
import torch

from estimator.plan import Planner

transformers = pytest.importorskip("transformers")

SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
ARCHITECTURES = {  # config class -> extra fields (head_dim: Qwen3 and Gemma 3 default to 128 whatever the width)
    "LlamaConfig": {},
    "MistralConfig": {"sliding_window": 8},  # shorter than the sequence (16): an explicit mask
    "Qwen3Config": {"head_dim": 16},
    "GemmaConfig": {"head_dim": 16},  # embedding and head tied
    "Gemma2Config": {"head_dim": 16, "sliding_window": 8},  # norms after the attention and the MLP as well
    "Gemma3TextConfig": {"head_dim": 16, "sliding_window": 8},
    "Exaone4Config": {"head_dim": 16},  # norms after the attention and the MLP only: their input is the residual
    "Qwen2Config": {},  # biases on q, k, v
    "CohereConfig": {},  # attention and MLP in parallel from one norm
    "Starcoder2Config": {},  # a two-Linear MLP (c_fc, c_proj), LayerNorm
    "GraniteConfig": {},
    "GPTNeoXConfig": {},  # fused query_key_value
    "MixtralConfig": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "Qwen3MoeConfig": {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                       "decoder_sparse_step": 1},
    # q and k normalized over all heads: the attention's projections gathered (transformers' colwise_gather_output)
    "Olmo2Config": {},
    "Olmo3Config": {"sliding_window": 8},
    "OlmoeConfig": {"num_experts": 4, "num_experts_per_tok": 2},
    # fused projections cut at fixed offsets (qkv_proj at num_heads x head_dim, gate_up_proj in two): gathered
    "Phi3Config": {"pad_token_id": 0},
    "GlmConfig": {"head_dim": 16, "pad_token_id": 0},
    # the final norm applied to the embeddings too, before the blocks (its output joins the residual stream there)
    "NanoChatConfig": {},
    # a learnable sink per attention head (split with the heads), sliding windows shorter than the sequence
    "GraniteMoeSWAConfig": {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8},
}


def _planner(name: str) -> Planner:
    from estimator.compat import import_torchvision

    import_torchvision()
    config = getattr(transformers, name)(**SMALL, **ARCHITECTURES[name])
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    ids = torch.zeros(2, 16, dtype=torch.long)
    return Planner(model, {"input_ids": ids, "labels": ids.clone()}, gpu="H100", device="cpu", precision="fp32")


def _shipped(planner: Planner, style: str, of: str = "modules") -> set[str]:
    """The model's module paths (``of="parameters"``: parameter names) the shipped plan gives ``style`` (its patterns
    are relative to the base model)."""
    plan = type(planner.model.config).base_model_tp_plan
    patterns = [re.compile(r"(^|\.)" + re.escape(k).replace(r"\*", r"\d+") + "$") for k, v in plan.items() if v == style]
    names = planner.model.named_modules() if of == "modules" else planner.model.named_parameters()
    return {p for p, _ in names if any(r.search(p) for r in patterns)}


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_pairs_are_the_ones_transformers_ships(name):
    planner = _planner(name)
    tp = planner.tp_plan()
    gathered = set(tp.gathered)  # (OLMo 2: q, k, v gathered after their projections, o split before its own)
    assert set(tp.colwise) - gathered == _shipped(planner, "colwise")
    assert set(tp.rowwise) - gathered == _shipped(planner, "rowwise")
    assert set(tp.colwise) & gathered == _shipped(planner, "colwise_gather_output")
    assert set(tp.rowwise) & gathered == _shipped(planner, "rowwise_split_input")
    whole = _shipped(planner, "replicated_with_grad_allreduce")
    assert not whole & set(tp.norms)
    assert set(tp.moe) == {p.rpartition(".")[0] for p in _shipped(planner, "moe_tp_experts")}
    # a parameter of its own the shipped plan splits colwise: Granite MoE SWA's per-head sinks (split on dimension 0)
    assert set(tp.per_head) == {p for p in _shipped(planner, "colwise", of="parameters")
                                if p.rpartition(".")[0] not in tp.colwise}
    plan = planner.plan("fsdp", 4, tp=2, sequence_parallel=True, solve=())
    assert plan.per_gpu.peak > 0


TP_RUNS = [{"id": "fsdp-tp2", "strategy": "fsdp", "precision": "fp32", "checkpoint": False, "tp": 2},
           {"id": "fsdp-tp2-sp", "strategy": "fsdp", "precision": "fp32", "checkpoint": False, "tp": 2, "sp": True}]
RANKS = [0, 3]  # (of the 4 processes: dp 2 x tp 2)
RUN_RANKS = [(r["id"], k) for r in TP_RUNS for k in RANKS]


def _case(name: str, config: dict) -> dict:
    """A tests/dist_worker.py case: ``name``'s model (tests/moe_worker.py's ``build_<name>`` and
    ``<name>_tensor_parallel``), batch 4 x 32 tokens, tp 2 with and without sequence parallelism."""
    return {"name": name, "model": name, "config": config, "batch": 4, "seq": 32, "runs": TP_RUNS}


def _real_and_planned(case: dict, model_class: str, config_class: str, tmp_path_factory) -> tuple[dict, dict]:
    """The case run for real on 4 gloo processes, and planned for the same ranks meanwhile."""
    from gloo_runs import real_and_planned

    def plans() -> dict:
        from estimator.compat import import_torchvision

        import_torchvision()
        with torch.device("meta"):
            model = getattr(transformers, model_class)(getattr(transformers, config_class)(**case["config"]))
        ids = torch.zeros(case["batch"], case["seq"], dtype=torch.long)
        planner = Planner(model, {"input_ids": ids, "labels": ids.clone()}, gpu="H100", device="cpu", precision="fp32")
        return {(run["id"], rank): planner.plan("fsdp", 4, tp=2, sequence_parallel=run.get("sp", False), rank=rank,
                                                solve=())
                for run in case["runs"] for rank in RANKS}
    return real_and_planned([(case, 4, tmp_path_factory.mktemp(case["name"]))], {case["name"]: RANKS}, plans)


def _matches(runs: tuple[dict, dict], run: str, rank: int) -> None:
    from gloo_runs import assert_peak_within, assert_states_exact

    assert_states_exact(runs, run, rank)
    assert_peak_within(runs, run, rank)


# Gemma 2 for real on a dp 2 x tp 2 gloo mesh (tests/dist_worker.py; its plan written out independently in
# tests/moe_worker.py's gemma2_tensor_parallel): the embedding and head tied and left whole, the post-norms feeding the
# residual sum; with sequence parallelism the embedding's output cut to the sequence shard and the head's input
# gathered.  The sequence (32) is longer than the sliding window (16), so the sliding layers take an explicit mask,
# which under sequence parallelism the real run builds for the whole sequence and passes in (transformers would
# build it from the local shard), and the plan builds inside the forward from a full-length stand-in
# (estimator.plan.tp.full_length_masks).  Measured on 2026-11-29, every rank: tp 2 +0.0010 %, with sequence
# parallelism -0.058 % (the real run's masks are inputs, held from the start); the model states exact.
GEMMA2 = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 250, "max_position_embeddings": 64,
          "sliding_window": 16}
GEMMA2_CASE = _case("gemma2", GEMMA2)


@pytest.fixture(scope="module")
def gemma2_runs(tmp_path_factory):
    return _real_and_planned(GEMMA2_CASE, "Gemma2ForCausalLM", "Gemma2Config", tmp_path_factory)


@pytest.mark.parametrize("run,rank", RUN_RANKS)
def test_gemma2_under_tp_matches_the_real_run(gemma2_runs, run, rank):
    _matches(gemma2_runs, run, rank)


def test_a_norm_over_all_heads_gathers_the_heads():
    """OLMo 2 normalizes q and k over the whole projection (all heads): its heads cannot be split between the
    projections and the attention, so, as transformers' own plan runs it (colwise_gather_output, rowwise_split_input),
    q, k and v are gathered after their sharded projections, the attention runs whole on every rank and o_proj
    splits its input (until 2026-11-29 --tp was refused)."""
    planner = _planner("Olmo2Config")
    tp = planner.tp_plan()
    attn = {f"model.layers.{i}.self_attn.{n}" for i in range(2) for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
    assert set(tp.gathered) == attn and {n.rpartition(".")[2] for n in tp.cross_head_norms} == {"q_norm", "k_norm"}
    assert not set(tp.cross_head_norms) & set(tp.norms)
    assert planner.plan("fsdp", 4, tp=2, sequence_parallel=True, solve=()).per_gpu.peak > 0


def test_gpt_oss_sinks_split_with_their_heads():
    """GPT-OSS joins a learnable sink per head to each head's scores (``torch.cat`` with the local heads' scores):
    under tp each rank holds its own heads' sinks (the trace failed in that cat until 2026-11-29).  Its experts have
    biases, so they are split by --ep (torchtitan's etp 1), not by tp."""
    from estimator.compat import import_torchvision

    import_torchvision()
    config = transformers.GptOssConfig(**SMALL, head_dim=16, num_local_experts=4, num_experts_per_tok=2)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    ids = torch.zeros(2, 16, dtype=torch.long)
    planner = Planner(model, {"input_ids": ids, "labels": ids.clone()}, gpu="H100", device="cpu", precision="fp32")
    sinks = sorted(n for n, p in model.named_parameters() if n.endswith(".sinks"))
    assert sinks and planner.tp_plan().per_head == sinks
    plan = planner.plan("fsdp", 4, tp=2, ep=2, solve=())
    assert any("model.layers.0.self_attn.sinks" in n for n in plan.notes) and plan.per_gpu.peak > 0


# torchtitan's DeepSeek-V3 recipe (torchtitan/models/deepseek_v3/infra/parallelize.py) on transformers' names: wq_b
# and wkv_b colwise, wo rowwise, wq_a, wkv_a and their norms whole on every rank (NoParallel) on the gathered
# sequence; the shared experts colwise/rowwise inside the MoE block, whose output is a partial sum reduced once.
# transformers' DeepSeek-V3 plan splits none of the attention, so the recipe is written out here.
MLA = {"first_k_dense_replace": 1, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
       "moe_intermediate_size": 32, "kv_lora_rank": 32, "q_lora_rank": 32, "qk_nope_head_dim": 16,
       "qk_rope_head_dim": 16, "v_head_dim": 16}


@pytest.mark.parametrize("sp", [False, True])
def test_deepseek_v3_attention_and_shared_experts_as_torchtitan_splits_them(sp):
    from estimator.compat import import_torchvision

    import_torchvision()
    config = transformers.DeepseekV3Config(**{**SMALL, "num_key_value_heads": 4}, **MLA)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    ids = torch.zeros(2, 16, dtype=torch.long)
    planner = Planner(model, {"input_ids": ids, "labels": ids.clone()}, gpu="H100", device="cpu", precision="fp32")
    tp = planner.tp_plan()
    attn = [f"model.layers.{i}.self_attn." for i in range(2)]
    assert set(tp.colwise) == {a + n for a in attn for n in ("q_b_proj", "kv_b_proj")} | {
        "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj",
        "model.layers.1.mlp.shared_experts.gate_proj", "model.layers.1.mlp.shared_experts.up_proj"}
    assert set(tp.rowwise) == {a + "o_proj" for a in attn} | {"model.layers.0.mlp.down_proj",
                                                               "model.layers.1.mlp.shared_experts.down_proj"}
    # the low-rank norms precede the split (until 2026-11-29 q_a_layernorm was taken for a norm over all heads, and
    # --tp refused every MLA model); they run on the gathered sequence, not on shards
    assert not tp.cross_head_norms and tp.moe == ["model.layers.1.mlp"]
    assert not {a + n for a in attn for n in ("q_a_layernorm", "kv_a_layernorm")} & set(tp.norms)
    plan = planner.plan("fsdp", 4, tp=2, sequence_parallel=sp, solve=())
    assert plan.per_gpu.peak > 0


def test_deepseek_v32_indexer_stays_whole():
    """DeepSeek-V3.2's sparse attention: a lightning indexer (its own q and k projections, a k_norm over its keys)
    scores the keys and top-k *indices* select those each query attends to.  No feature flows from the indexer into
    the heads (only integer indices), so its Linear layers and norm pair with nothing and stay whole, as the shipped
    plan leaves them; until 2026-11-29 the walk followed the indices back into the indexer, split its projections
    and refused --tp over its k_norm.  The configuration's defaults with two layers (the shapes are traced on meta)."""
    from estimator.compat import import_torchvision

    import_torchvision()
    config = transformers.DeepseekV32Config(num_hidden_layers=2)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    ids = torch.zeros(2, 16, dtype=torch.long)
    planner = Planner(model, {"input_ids": ids, "labels": ids.clone()}, gpu="H100", device="cpu", precision="fp32")
    tp = planner.tp_plan()
    assert set(tp.colwise) == _shipped(planner, "colwise") and set(tp.rowwise) == _shipped(planner, "rowwise")
    assert not any(".indexer." in p for p in tp.colwise + tp.rowwise + tp.cross_head_norms)
    assert planner.plan("fsdp", 4, tp=2, sequence_parallel=True, solve=()).per_gpu.peak > 0


def test_qwen3_next_linear_attention_runs_whole_on_the_gathered_sequence():
    """Qwen3-Next's linear-attention layers (Gated DeltaNet: a recurrence over the whole sequence) pair no Linears and
    stay whole on every rank, as transformers' plan leaves them.  Under sequence parallelism such a part takes the
    whole sequence: its input is all-gathered and its output cut back to the rank's shard (until 2026-11-29 it ran
    on the shard, and its gated norm was put on sequence shards, which failed the trace)."""
    from estimator.compat import import_torchvision

    import_torchvision()
    config = transformers.Qwen3NextConfig(**SMALL, head_dim=16, num_experts=4, num_experts_per_tok=2,
                                          moe_intermediate_size=32, shared_expert_intermediate_size=32, use_cache=False)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    ids = torch.zeros(2, 16, dtype=torch.long)
    planner = Planner(model, {"input_ids": ids, "labels": ids.clone()}, gpu="H100", device="cpu", precision="fp32")
    tp = planner.tp_plan()
    linear = [f"model.layers.{i}.linear_attn" for i, kind in enumerate(config.layer_types)
              if kind == "linear_attention"]
    assert linear and set(linear) <= set(tp.whole)
    assert set(tp.colwise) == _shipped(planner, "colwise") and set(tp.rowwise) == _shipped(planner, "rowwise")
    assert not any(n.startswith(tuple(p + "." for p in linear)) for n in tp.norms)
    assert planner.plan("fsdp", 4, tp=2, sequence_parallel=True, solve=()).per_gpu.peak > 0


# DeepSeek-V3's multi-head latent attention for real on a dp 2 x tp 2 gloo mesh (tests/dist_worker.py; torchtitan's
# recipe written out independently in tests/moe_worker.py's deepseek_tensor_parallel), dense layers: q_b_proj and
# kv_b_proj colwise, o_proj rowwise, the low-rank projections and their norms whole on the gathered sequence.
# Measured on 2026-11-29, all four ranks: states exact, peaks +0.0011 % (tp 2) and +0.0012 % (tp 2 + sp).
DEEPSEEK = {**SMALL, "num_key_value_heads": 4, "max_position_embeddings": 64, **MLA, "first_k_dense_replace": 2}
DEEPSEEK_CASE = _case("deepseek", DEEPSEEK)


@pytest.fixture(scope="module")
def deepseek_runs(tmp_path_factory):
    return _real_and_planned(DEEPSEEK_CASE, "DeepseekV3ForCausalLM", "DeepseekV3Config", tmp_path_factory)


@pytest.mark.parametrize("run,rank", RUN_RANKS)
def test_deepseek_v3_mla_under_tp_matches_the_real_run(deepseek_runs, run, rank):
    _matches(deepseek_runs, run, rank)


# Qwen3-Next's linear attention (Gated DeltaNet, transformers' torch implementation on CPU) whole on every rank, for
# real on a dp 2 x tp 2 gloo mesh with dense MLPs split (tests/moe_worker.py's qwen3_next_tensor_parallel); under
# sequence parallelism its input gathered to the whole sequence and its output cut back to the shard.  Measured on
# 2026-11-29, all four ranks: states exact, peaks within 4 bytes of 6.28 MB (tp 2) and 6.17 MB (tp 2 + sp).
QWEN3_NEXT = {**SMALL, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
              "shared_expert_intermediate_size": 32, "mlp_only_layers": [0, 1], "use_cache": False,
              "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 16,
              "linear_value_head_dim": 16}
QWEN3_NEXT_CASE = _case("qwen3_next", QWEN3_NEXT)


@pytest.fixture(scope="module")
def qwen3_next_runs(tmp_path_factory):
    return _real_and_planned(QWEN3_NEXT_CASE, "Qwen3NextForCausalLM", "Qwen3NextConfig", tmp_path_factory)


@pytest.mark.parametrize("run,rank", RUN_RANKS)
def test_qwen3_next_linear_attention_under_tp_matches_the_real_run(qwen3_next_runs, run, rank):
    _matches(qwen3_next_runs, run, rank)


# OLMo 2 for real on a dp 2 x tp 2 gloo mesh with transformers' own plan for it (tests/moe_worker.py's
# olmo2_tensor_parallel): q, k, v gathered after their sharded projections, o_proj splitting its whole input.
# Measured on 2026-11-29, all four ranks: states exact, peaks +0.0010 % (tp 2) and +0.0011 % (tp 2 + sp).
OLMO2_CASE = _case("olmo2", {**SMALL, "vocab_size": 250})


@pytest.fixture(scope="module")
def olmo2_runs(tmp_path_factory):
    return _real_and_planned(OLMO2_CASE, "Olmo2ForCausalLM", "Olmo2Config", tmp_path_factory)


@pytest.mark.parametrize("run,rank", RUN_RANKS)
def test_olmo2_gathered_heads_under_tp_match_the_real_run(olmo2_runs, run, rank):
    _matches(olmo2_runs, run, rank)


def test_gemma4_per_layer_gate_stays_whole():
    """Gemma 4 multiplies the output of each layer's per_layer_input_gate by a per-layer input computed before the
    blocks (of the gate's width) and projects it back with per_layer_projection: split colwise, the gate's shard
    would meet the whole per-layer input (the trace failed).  A Linear whose whole output meets a tensor from outside
    the block pairs with nothing, and the two stay whole, as the shipped plan keeps them."""
    from estimator.compat import import_torchvision

    import_torchvision()
    config = transformers.Gemma4TextConfig(**SMALL, head_dim=16, hidden_size_per_layer_input=16)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    ids = torch.zeros(2, 16, dtype=torch.long)
    planner = Planner(model, {"input_ids": ids, "labels": ids.clone()}, gpu="H100", device="cpu", precision="fp32")
    tp = planner.tp_plan()
    assert set(tp.colwise) == _shipped(planner, "colwise") and set(tp.rowwise) == _shipped(planner, "rowwise")
    assert not any("per_layer" in p for p in tp.colwise + tp.rowwise)
    assert planner.plan("fsdp", 4, tp=2, solve=()).per_gpu.peak > 0


def test_kimi_linear_gates_beside_whole_projections_stay_whole():
    """Kimi Linear's delta attention (KDA) computes low-rank gates (f_a_proj -> f_b_proj, g_a_proj -> g_b_proj: a
    Linear feeding a Linear) beside q, k, v and o projections that pair with nothing, and its output is o_proj's: the
    gates' pairs are dropped and the attention runs whole on every rank, as the shipped plan keeps it (split, the
    gates met whole tensors under sequence parallelism)."""
    from estimator.compat import import_torchvision

    import_torchvision()
    config = transformers.KimiLinearConfig(**{**SMALL, "num_key_value_heads": 4}, head_dim=16, moe_intermediate_size=32,
                                           num_experts=4, num_experts_per_token=2, kv_lora_rank=32,
                                           qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, use_cache=False,
                                           pad_token_id=0)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    ids = torch.zeros(2, 16, dtype=torch.long)
    planner = Planner(model, {"input_ids": ids, "labels": ids.clone()}, gpu="H100", device="cpu", precision="fp32")
    tp = planner.tp_plan()
    assert set(tp.colwise) == _shipped(planner, "colwise") and set(tp.rowwise) == _shipped(planner, "rowwise")
    assert not any("_a_proj" in p or "_b_proj" in p for p in tp.colwise + tp.rowwise)
    assert planner.plan("fsdp", 4, tp=2, sequence_parallel=True, solve=()).per_gpu.peak > 0


def test_minimax_normed_residual_stays_on_its_shard():
    """MiniMax keeps the normed input as the residual (``residual = norm(x); x = residual * alpha + attn(residual) *
    beta``): under sequence parallelism the norm returns its local shard, as the residual stream is, and the
    attention's gather takes that shard (the norm's DTensor had met the attention's local output in the sum)."""
    from estimator.compat import import_torchvision

    import_torchvision()
    config = transformers.MiniMaxConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    ids = torch.zeros(2, 16, dtype=torch.long)
    planner = Planner(model, {"input_ids": ids, "labels": ids.clone()}, gpu="H100", device="cpu", precision="fp32")
    tp = planner.tp_plan()
    assert {f"model.layers.{i}.input_layernorm" for i in range(2)} <= set(tp.post_norms)
    assert planner.plan("fsdp", 4, tp=2, sequence_parallel=True, solve=()).per_gpu.peak > 0


def test_an_in_place_op_on_a_tensor_parallel_output_is_refused_as_a_real_run_refuses_it():
    """Llama 4's MoE adds the routed experts' output into its shared expert's output in place (``out.add_``); under
    tensor parallelism that output is DTensor's ``to_local()`` view, which autograd will not modify in place (a real
    2-rank gloo run of torch 2.13's RowwiseParallel fails with the same "Output 0 of _ToTorchTensor is a view"):
    one line that says so and what to change, not a hint at the input shapes."""
    from estimator.errors import UserError
    from estimator.specs import load

    model, inputs = load("hf:llama4_text", batch=1, seq=32, overrides=dict(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, intermediate_size_mlp=128, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=4, vocab_size=256))
    with pytest.raises(UserError, match="modifies a tensor-parallel layer's output in place.*without --tp") as err:
        Planner(model, inputs, gpu="H100").plan("fsdp", 4, tp=2, solve=())
    assert "check the input shapes" not in str(err.value)


def test_tp_on_a_model_with_only_a_head_to_split_is_refused():
    """A stack of Linears ending in a 1-wide head: no column/row pair in the blocks, only the head 'split': the
    plan was made (each rank holding the whole trunk at half the data-parallel degree: 75,268 B of parameters
    per rank at tp 1, 149,508 at tp 2)."""
    from estimator.errors import UserError
    from estimator.plan import plan

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1))
    with pytest.raises(UserError, match="no Linear layer pairs.*only the output head or the embedding.*--tp 1"):
        plan(model, torch.randn(8, 16), gpu="H100", gpus=4, strategy="fsdp", tp=2, device="cpu", precision="fp32",
             loss_fn=lambda out: out.pow(2).mean(), solve=())


def test_tp_alone_says_what_a_real_foreach_step_refuses_and_how_to_run_it():
    """Tensor parallelism over every GPU (no data-parallel engine): the norms stay plain tensors beside the split
    Linears' DTensors, and torch's foreach optimizer step refuses the mix (a real 1-rank gloo step of AdamW with
    foreach=True raises the same "got mixed torch.Tensor and DTensor"). The message told the user to use AdamW
    and DDP, which the plan already did; it says what runs now, and each of those runs plans."""
    from estimator.errors import UserError
    from estimator.specs import load

    model, inputs = load("hf:llama", batch=2, seq=16, overrides=dict(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=256))
    with pytest.raises(UserError, match="--sequence-parallel.*foreach=False") as err:
        Planner(model, inputs, gpu="H100").plan("ddp", 2, tp=2, solve=())
    assert "use an element-wise optimizer" not in str(err.value) and "head count" not in str(err.value)
    assert Planner(model, inputs, gpu="H100").plan("ddp", 2, tp=2, sequence_parallel=True, solve=()).verdict.fits
    assert Planner(model, inputs, gpu="H100", optimizer="adamw:foreach=False").plan("ddp", 2, tp=2,
                                                                                   solve=()).verdict.fits

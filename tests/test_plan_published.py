"""Time to train against a published run (issue 13's goal): Llama-2-7B pretraining.

Touvron et al. 2023 ("Llama 2", Table 2): 184,320 A100-80GB GPU-hours for the 7B model on 2.0T
tokens, global batch 4M tokens of 4,096-token sequences (section 2.2), i.e. 1,024 GPUs with one
sequence each.  The plan (FSDP2 with its bf16 MixedPrecisionPolicy, decoder layers checkpointed,
AdamW, the default links of a DGX A100 cluster, no --mfu) must be within 15 %.
``benchmarks/plan_llama2.py`` prints the same figure with its breakdown (~35 s on 2 cores).
"""

import pytest

from estimator.plan import Planner

pytest.importorskip("transformers")

META_GPU_HOURS = 184_320  # Llama 2 paper, Table 2, 7B


def test_llama2_7b_gpu_hours_within_15_percent_of_metas():
    from estimator.specs import load

    model, inputs = load("hf:llama", batch=1, seq=4096, overrides=dict(
        hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096))
    gpus = 1024
    p = Planner(model, inputs, gpu="A100-80GB", precision="fsdp-bf16").plan(
        "fsdp", gpus, checkpoint="LlamaDecoderLayer", tokens=2.0e12, solve=())
    assert p.training.steps == -(-int(2.0e12) // (gpus * 4096))  # 2T tokens / (1,024 x 4,096 per step)
    gpu_hours = p.time_to_train_s * gpus / 3600
    assert gpu_hours == pytest.approx(META_GPU_HOURS, rel=0.15), gpu_hours
    # FSDP2's prefetch hides all but the first all-gathers and the last reduce-scatters
    assert p.time.exposed_comm_s < 0.1 * p.time.comm_s

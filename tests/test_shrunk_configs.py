"""Configurations shrunk with ``--set`` that the loader keeps consistent (issue 25 items 6 and 9), each checked by
building the model and running a real forward of it (a real step where the test says so) in the same test:

- Gemma 3n's ``num_kv_shared_layers`` (the last 15 of 35 layers reuse an earlier layer's keys and values) shrinks
  with the layer count, keeping an earlier layer of each shared kind;
- Gemma 4's ``per_layer_config`` (keyed by layer index: the full-attention layers' wider heads) follows the
  layers a shrunk stack keeps;
- a backbone's output stages (DPT's ``stage6 ... stage24``) move to the same depths of a shallower backbone;
- RoBERTa-style position tables (numbered from ``padding_idx + 1``) limit the default sequence to what a real
  step takes (512 of 514 rows);
- an index out of a fake tensor's range, where the indices' values are known, is refused as the real kernel
  refuses it.
"""

from __future__ import annotations

import pytest
import torch

from estimator import estimate
from estimator.errors import UserError
from estimator.specs import load_spec
from estimator.specs.hf import _hf_config, _kv_shared_count, import_transformers

transformers = pytest.importorskip("transformers")

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}


def _real_forward_runs(loaded) -> None:
    from sweep import materialize, real_inputs

    model = materialize(loaded.model)
    inputs = real_inputs(loaded.inputs)
    out = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    assert out is not None


@pytest.mark.parametrize("layers", [2, 5, 10])
def test_gemma3n_shares_keys_and_values_only_with_a_layer_of_its_kind(layers):
    default = transformers.Gemma3nTextConfig()
    cfg, _ = _hf_config(import_transformers(), "gemma3n_text", {"num_hidden_layers": layers})
    kinds, shared = list(cfg.layer_types), cfg.num_kv_shared_layers
    # at most the stack's share of the default's count: 15 x layers // 35
    assert shared <= default.num_kv_shared_layers * layers // default.num_hidden_layers
    first = layers - shared
    assert set(kinds[first:]) <= set(kinds[:first])  # (the model's own lookup: an earlier layer of each kind)
    # the model builds (transformers' index() into the earlier layers' kinds raised before)
    with torch.device("meta"):
        transformers.Gemma3nForCausalLM(cfg)


def test_kv_shared_count_backs_off_until_each_kind_has_an_earlier_layer():
    # 2 layers [sliding, full]: sharing the full layer would need an earlier full one: none shared
    assert _kv_shared_count(1, ["sliding", "full"]) == 0
    # 5 layers, 4 sliding then 1 full: the default's share is 2 (15 x 5 // 35); the full layer has no earlier one
    assert _kv_shared_count(2, ["s", "s", "s", "s", "f"]) == 0
    assert _kv_shared_count(3, ["s", "f", "s", "f", "s", "f"]) == 3


def test_gemma3n_shrunk_runs_a_real_forward():
    loaded = load_spec("hf:gemma3n_text", batch=1, seq=16, overrides={
        "num_hidden_layers": 5, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": 64,
        "vocab_size": 64})
    _real_forward_runs(loaded)


def test_gemma4_per_layer_settings_follow_the_kept_layers():
    default = transformers.Gemma4TextConfig()
    cfg, _ = _hf_config(import_transformers(), "gemma4_text", {"num_hidden_layers": 2})
    table = {int(k): v for k, v in cfg.to_dict()["per_layer_config"].items()}
    assert all(0 <= k < 2 for k in table)
    default_table = {int(k): v for k, v in default.to_dict()["per_layer_config"].items()}
    # the default's table names its full-attention layers (5, 11, ...)
    assert {default.layer_types[k] for k in default_table} == {"full_attention"}
    # the kept full-attention layer keeps its wider head; the kept sliding one has none of the table's settings
    assert table and {cfg.layer_types[k] for k in table} == {"full_attention"}
    assert all(v == default_table[min(default_table)] for v in table.values())
    with torch.device("meta"):
        transformers.Gemma4ForCausalLM(cfg)


def test_backbone_outputs_move_with_its_depth():
    loaded = load_spec("hf:zoedepth", batch=1, overrides={"backbone_config.num_hidden_layers": 4,
                                                          **{f"backbone_config.{k}": v for k, v in SMALL.items()}})
    # stages 6, 12, 18 and 24 of 24 layers are stages 1-4 of 4 (ceil(k x 4 / 24))
    assert loaded.model.config.backbone_config.out_features == ["stage1", "stage2", "stage3", "stage4"]
    _real_forward_runs(loaded)


@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta", "bert"])
def test_default_sequence_fits_the_position_table(model_type):
    loaded = load_spec(f"hf:{model_type}", batch=1, overrides={"num_hidden_layers": 1, **SMALL})
    table = loaded.model.config.max_position_embeddings
    pad = getattr(loaded.model.config, "pad_token_id", None)
    seq = loaded.inputs["input_ids"].shape[1]
    # RoBERTa numbers positions from padding_idx + 1: 512 - (1 + 1) = 510 tokens; BERT from 0: all 512
    assert seq == (table - pad - 1 if model_type != "bert" else table)
    _real_forward_runs(loaded)


class _Lookup(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(10, 4)

    def forward(self, ids):
        return self.table(ids).sum()


class _Gather(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2, 6))

    def forward(self, index):
        return torch.gather(self.w, 1, index).sum()


@pytest.mark.parametrize("module, good, bad", [
    (_Lookup, torch.tensor([[1, 9]]), torch.tensor([[1, 10]])),
    (_Gather, torch.tensor([[0, 5], [1, 2]]), torch.tensor([[0, 6], [1, 2]])),
])
def test_known_indices_out_of_range_are_refused_as_the_real_step_refuses_them(module, good, bad):
    model = module()
    model(good).backward()  # the real step takes the good indices ...
    with pytest.raises((IndexError, RuntimeError)):
        model(bad)  # ... and refuses the bad ones
    assert estimate(module(), (good,)).to_dict()["memory"]["parameters"] > 0
    with pytest.raises(UserError, match="out of bounds"):
        estimate(module(), (bad,))


def test_layer_index_lists_follow_the_layer_count():
    # SAM's global-attention layers 2, 5, 8 and 11 of 12 are layers 0 and 1 of 2 (k x 2 // 12, once each); DeepSeek-VL
    # Hybrid reads the hidden state after its first global layer, hidden_states[2 + 1], out of the 3 a 2-layer tower
    # returns before
    cfg, _ = _hf_config(import_transformers(), "deepseek_vl_hybrid", {"high_res_vision_config.num_hidden_layers": 2})
    assert list(cfg.high_res_vision_config.global_attn_indexes) == [0, 1]
    loaded = load_spec("hf:sam_vision_model", batch=1, image_size=128, overrides={
        "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "mlp_dim": 128, "output_channels": 32})
    assert list(loaded.model.config.global_attn_indexes) == [0, 1]
    _real_forward_runs(loaded)


def test_the_sequence_search_stops_where_the_position_table_does():
    from sweep import materialize

    from estimator.plan.search import position_limit

    loaded = load_spec("hf:roberta", batch=1, overrides={"num_hidden_layers": 1, **SMALL})
    limit, source = position_limit(loaded.model)
    assert limit == 510 and "padding_idx" in source  # 512 rows, positions from padding_idx + 1 = 2
    model = materialize(loaded.model)
    model(input_ids=torch.full((1, limit), 5)).logits.sum().backward()  # the real step takes 510 tokens ...
    with pytest.raises((IndexError, RuntimeError), match="out of"):
        model(input_ids=torch.full((1, limit + 1), 5))  # ... and not 511

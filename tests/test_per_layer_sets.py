"""``--set num_hidden_layers=N`` on configurations with one entry per layer (issue 25 item 6): Zamba2's and Llama
4's ``layer_types``, Gemma 3n's ``intermediate_size`` and ``activation_sparsity_pattern`` are resized with the
count, each kind of layer kept while N allows (a hybrid stack keeps an attention layer)."""

from __future__ import annotations

import pytest

from estimator.specs.hf import _hf_config, _resized, import_transformers

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_zamba2_layer_types_follow_the_layer_count(n):
    base = transformers.Zamba2Config()
    cfg, _ = _hf_config(import_transformers(), "zamba2", {"num_hidden_layers": n})
    assert cfg.num_hidden_layers == n and len(cfg.layer_types) == n
    assert set(cfg.layer_types) == set(base.layer_types) if n >= len(set(base.layer_types)) else True
    assert set(cfg.layer_types) <= set(base.layer_types)


@pytest.mark.parametrize("model_type, head", [("llama4", "text_config"), ("gemma3n", "text_config")])
def test_sub_configurations_resize_their_per_layer_lists(model_type, head):
    base = getattr(transformers.AutoConfig.for_model(model_type), head)
    lists = {k: len(v) for k, v in base.to_dict().items()
             if isinstance(v, (list, tuple)) and len(v) == base.num_hidden_layers}
    assert lists  # the configuration has per-layer lists (else this test tests nothing)
    cfg, _ = _hf_config(import_transformers(), model_type, {f"{head}.num_hidden_layers": 2})
    sub = getattr(cfg, head)
    assert sub.num_hidden_layers == 2
    assert all(len(getattr(sub, k)) == 2 for k in lists), {k: len(getattr(sub, k)) for k in lists}


def test_resizing_keeps_order_kinds_and_repeats():
    assert _resized(list("aaaaabaaab"), 3) == ["a", "a", "b"]
    assert _resized(list("ab"), 5) == list("ababa")
    assert _resized([7] * 6, 2) == [7, 7]

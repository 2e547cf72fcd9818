"""Replicated blocks: a stack of identical blocks traced for five of them and the rest copied
(:mod:`estimator.capture.replicate`) gives the same capture as tracing every block.

Truth: the same estimate or plan with ``replicate=False`` (every block traced), in the same test;
every number of ``to_dict()`` must be equal (FLOPs, bytes, peaks through the simulated caching
allocator, step times, plan rows and schedules), on models small enough to trace in full.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import llama  # noqa: E402

import estimator.capture.run as run  # noqa: E402
from estimator import estimate  # noqa: E402
from estimator.capture.blocks import TRACED_BLOCKS, find_repeats  # noqa: E402
from estimator.plan import plan  # noqa: E402


def _llama(layers: int = 9):
    cfg = llama.LlamaConfig(vocab_size=256, dim=64, hidden_dim=96, n_layers=layers, n_heads=4, n_kv_heads=2,
                            max_seq_len=32)
    with torch.device("meta"):
        m = llama.Llama(cfg)
    idx = torch.zeros(2, 32, dtype=torch.long)
    return m, (idx, idx)


def _hf(kind: str, auto: str, **cfg):
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(kind, **cfg)
    torch.manual_seed(0)
    model = getattr(transformers, auto).from_config(config)
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids, "labels": ids}


@pytest.fixture
def expanded(monkeypatch):
    """Counts the captures that were replicated (a fallback to a full trace would pass silently)."""
    calls = []
    original = run.expand

    def spy(cap, repeats, n):
        out = original(cap, repeats, n)
        calls.append((repeats.count, len(cap.nodes), len(out.nodes)))
        return out

    monkeypatch.setattr(run, "expand", spy)
    return calls


def _same(a: dict, b: dict) -> list[str]:
    a, b = json.loads(json.dumps(a)), json.loads(json.dumps(b))
    return [k for k in set(a) | set(b) if a.get(k) != b.get(k)]


MODELS = {
    "llama": lambda: _llama(),
    "hf_gpt2": lambda: _hf("gpt2", "AutoModelForCausalLM", vocab_size=256, n_embd=64, n_layer=8, n_head=4,
                           n_positions=64),
    "hf_bert": lambda: _hf("bert", "AutoModelForMaskedLM", vocab_size=256, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=8, num_attention_heads=4),
    "hf_mixtral": lambda: _hf("mixtral", "AutoModelForCausalLM", vocab_size=256, hidden_size=64, intermediate_size=96,
                              num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                              num_experts_per_tok=2),
}
VARIANTS = {
    "cpu-fp32": dict(device="cpu"),
    "cpu-bf16-mixed": dict(device="cpu", precision="bf16-mixed"),
    "cuda-bf16-mixed-timed": dict(device="cuda", precision="bf16-mixed", gpu="H100", solve_batch=False),
    "cuda-keep-output": dict(device="cuda", keep_output=True),
    "inference": dict(device="cpu", mode="inference"),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("name", list(MODELS))
def test_a_replicated_estimate_equals_the_full_trace(name, variant, expanded):
    model, inputs = MODELS[name]()
    kw = dict(VARIANTS[variant])
    if kw.get("mode") == "inference" and isinstance(inputs, dict):
        inputs = {k: v for k, v in inputs.items() if k != "labels"}
    ours = estimate(model, inputs, **kw)
    assert expanded and expanded[0][1] < expanded[0][2], "the blocks were traced in full"
    full = estimate(model, inputs, replicate=False, **kw)
    assert len(ours.capture.nodes) == len(full.capture.nodes)
    assert _same(ours.to_dict(), full.to_dict()) == []


def test_checkpointing_policies_replicate_too(expanded):
    model, inputs = _llama()
    for policy in ("full", "op", "layer:2"):
        ours = estimate(model, inputs, device="cpu", checkpoint="Block", checkpoint_policy=policy)
        full = estimate(model, inputs, device="cpu", checkpoint="Block", checkpoint_policy=policy, replicate=False)
        assert _same(ours.to_dict(), full.to_dict()) == [], policy
    assert expanded


@pytest.mark.parametrize("layout", [dict(strategy="fsdp"), dict(strategy="ddp", gpus=1), dict(strategy="fsdp", tp=2),
                                    dict(strategy="hsdp"), dict(strategy="zero3"),
                                    dict(strategy="fsdp", checkpoint="Block")],
                         ids=["fsdp", "one-gpu", "fsdp-tp", "hsdp", "zero3", "fsdp-ckpt"])
def test_a_replicated_plan_equals_the_full_trace(layout, expanded):
    model, inputs = _llama()
    layout = {"gpus": 16, **layout}
    ours = plan(model, inputs, gpu="H100", solve=(), tokens=1e9, **layout)
    assert expanded, "the engine's blocks were traced in full"
    full = plan(model, inputs, gpu="H100", solve=(), tokens=1e9, replicate=False, **layout)
    assert _same(ours.to_dict(), full.to_dict()) == []


@pytest.mark.parametrize("kw", [dict(device="cpu", grad_accum=2),
                                dict(device="cuda", precision="bf16-mixed", grad_accum=3, keep_output=True)],
                         ids=["cpu-accumulate-2", "cuda-accumulate-3"])
def test_gradient_accumulation_replicates_each_micro_step(kw, expanded):
    """Each micro-step's forward and backward is a pass of its own over the blocks (block_layout)."""
    model, inputs = _llama()
    ours = estimate(model, inputs, **kw)
    assert expanded, "the blocks were traced in full"
    full = estimate(model, inputs, replicate=False, **kw)
    assert _same(ours.to_dict(), full.to_dict()) == []


@pytest.mark.parametrize("kw", [dict(clip_grad_norm=1.0), dict(optimizer="muon"), dict(ema=0.99, lora="r=4"),
                                dict(optimizer="adamw8bit", precision="bf16-mixed")],
                         ids=["clip", "muon", "ema-lora", "adamw8bit"])
def test_the_loop_replicates_too(kw, expanded):
    """The loop's own ops over every parameter: clip_grad_norm_'s stack of per-tensor norms grows with the copies
    (one norm per parameter, as the full trace stacks them), and what the report says of the optimizer's split
    (Muon's hidden matrices) counts the whole model's parameters, not the traced blocks'."""
    model, inputs = _llama()
    ours = estimate(model, inputs, device="cpu", **kw)
    assert expanded, "the blocks were traced in full"
    full = estimate(model, inputs, device="cpu", replicate=False, **kw)
    assert _same(ours.to_dict(), full.to_dict()) == []


def test_ddp_traces_every_block():
    """DDP buckets the gradients of the whole model at construction (its buffers and all-reduces depend on
    the number of blocks): its traces are never replicated, and its plan is the full trace's."""
    model, inputs = _llama()
    ours = plan(model, inputs, gpu="H100", gpus=16, strategy="ddp", solve=())
    full = plan(model, inputs, gpu="H100", gpus=16, strategy="ddp", solve=(), replicate=False)
    assert _same(ours.to_dict(), full.to_dict()) == []


def test_what_is_not_replicated():
    """Fewer than seven blocks, blocks of different shapes, or one module called several times: no stack."""
    assert find_repeats(_llama(7)[0]) is None  # 7 blocks: traced in full (TRACED_BLOCKS + 2 at least)
    assert TRACED_BLOCKS == 6 and find_repeats(_llama(8)[0]).count == 8
    shared = torch.nn.Linear(4, 4)
    assert find_repeats(torch.nn.Sequential(*[shared] * 8)) is None
    mixed = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(7)] + [torch.nn.Linear(4, 8)])
    assert find_repeats(mixed) is None


def test_blocks_that_depend_on_their_index_are_traced_in_full(expanded):
    """A block whose ops depend on its index (every other one scales its output) runs two op sequences:
    the replication sees it and traces every block; the estimate is the full trace's."""

    class Alternating(torch.nn.Module):
        def __init__(self, i):
            super().__init__()
            self.i = i
            self.lin = torch.nn.Linear(16, 16)

        def forward(self, x):
            y = self.lin(x)
            return y * 2 if self.i % 2 else torch.relu(y)

    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Sequential(*[Alternating(i) for i in range(8)]))
    x = torch.randn(4, 16)
    ours = estimate(model, x, device="cpu")
    assert not expanded
    assert _same(ours.to_dict(), estimate(model, x, device="cpu", replicate=False).to_dict()) == []


class _Shifted(torch.nn.Module):
    """A block whose behaviour a scalar setting picks (Swin's shifted windows), with its layer index."""

    def __init__(self, index: int, shift: int, drop: float):
        super().__init__()
        self.lin, self.layer_idx, self.shift, self.drop_rate = torch.nn.Linear(8, 8), index, shift, drop

    def forward(self, x):
        return x + self.lin(torch.roll(x, self.shift, -1) if self.shift else x)


def test_blocks_whose_settings_alternate_are_not_replicated_and_index_schedules_are():
    from estimator.capture.blocks import find_repeats

    def stack(shift_of):  # layer_idx and a linear stochastic-depth rate follow the index (inside a model)
        return torch.nn.Sequential(torch.nn.Sequential(*[_Shifted(i, shift_of(i), 0.01 * i) for i in range(8)]))

    assert find_repeats(stack(lambda i: 0)).count == 8
    assert find_repeats(stack(lambda i: 3 * (i % 2))) is None  # shifted every other block: traced in full

"""Optimizers that are not element-wise: Muon (with AdamW beside it), Adafactor and bitsandbytes' 8-bit AdamW,
against a real CPU step.

``--optimizer muon`` is ``torch.optim.Muon`` on the hidden matrices and AdamW on the rest, as Muon's authors and
``torch.optim.Muon``'s documentation train (a loop that steps both); a list of optimizer instances is that loop
as the user wrote it.  ``adafactor`` is ``torch.optim.Adafactor`` (factored second moments).  Truth, measured here:
the optimizer state as the real tensors after real ``step()`` calls (distinct storages), the optimizer step's
matmul FLOPs as ``FlopCounterMode`` counts them around the real steps (Muon's Newton-Schulz iterations), and the
peak of the real loop with the live-tensor tracker (``livetracker.measure_peaks``, two iterations).  Each model's
Muon split is written out here by name, apart from the estimator's rule (``estimator.optim.hidden_matrices``).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from instruments import flop_counter
from livetracker import measure_peaks
from zoo import tiny_llama

from estimator import estimate
from estimator.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import gpt  # noqa: E402  (examples/gpt.py: its lm_head tied to the token embedding)


class Classifier(nn.Module):
    """Convolutions, then two Linears: Muon takes the hidden one, the last (10 classes) is the output head."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.hidden = nn.Linear(16 * 8 * 8, 64)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(F.relu(self.hidden(F.relu(self.conv(x)).flatten(1))))


def _gpt():
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(vocab_size=512, block_size=64, n_layer=2, n_head=4, n_embd=64))
    idx = torch.randint(0, 512, (2, 64), generator=torch.Generator().manual_seed(1))
    # Muon: the attention's qkv and proj, the MLP's two Linears, in each of 2 blocks (lm_head is the embedding)
    hidden = [f"blocks.{i}.{m}.weight" for i in range(2) for m in ("attn.qkv", "attn.proj", "mlp.0", "mlp.2")]
    return model, (idx, idx), None, hidden


def _llama():
    pytest.importorskip("transformers")
    model, inputs = tiny_llama()
    # Muon: the 7 projections of each decoder layer; lm_head (untied here) and the embedding on AdamW
    hidden = [f"model.layers.{i}.{m}_proj.weight" for i in range(2)
              for m in ("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "mlp.gate", "mlp.up", "mlp.down")]
    return model, inputs, None, hidden


def _classifier():
    torch.manual_seed(0)
    model = Classifier()
    x = torch.randn(4, 3, 8, 8)
    y = torch.randint(0, 10, (4,), generator=torch.Generator().manual_seed(2))
    return model, x, lambda out: F.cross_entropy(out, y), ["hidden.weight"]


class _Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 32)
        self.block = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, 50)

    def forward(self, ids):
        return self.head(self.block(self.embed(ids)))


def _encoder():
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (4, 16), generator=torch.Generator().manual_seed(1))
    # Muon: nn.MultiheadAttention's in_proj_weight (its q, k, v: a parameter of its own, no Linear's), its out_proj
    # and the feed-forward's two Linears
    hidden = ["block.self_attn.in_proj_weight", "block.self_attn.out_proj.weight", "block.linear1.weight",
              "block.linear2.weight"]
    return _Encoder(), ids, lambda out: F.cross_entropy(out.flatten(0, 1), ids.flatten()), hidden


MODELS = {"gpt": _gpt, "llama": _llama, "classifier": _classifier, "encoder": _encoder}


class _Both:
    """The real loop's optimizers: Muon, then AdamW, stepped one after the other."""

    def __init__(self, *optimizers):
        self.optimizers = optimizers

    def step(self):
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none=True):
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_tensors(self):
        return [v for o in self.optimizers for st in o.state.values() for v in st.values() if torch.is_tensor(v)]


def _muon_and_adamw(named, hidden):
    """``named``: (name, parameter) pairs of the model the loop trains."""
    named = [(n, p) for n, p in named if p.requires_grad]
    muon = torch.optim.Muon([p for n, p in named if n in hidden], lr=2e-2)
    return _Both(muon, torch.optim.AdamW([p for n, p in named if n not in hidden], lr=1e-3))


def _factory(model, spec, hidden):
    names = [n for n, _ in model.named_parameters()]
    if spec == "muon":
        return lambda params: _muon_and_adamw(list(zip(names, params)), hidden)
    return lambda params: _Both(torch.optim.Adafactor(list(params), lr=1e-2))


def _loss_of(loss_fn):
    return loss_fn if loss_fn is not None else (lambda out: out.loss if hasattr(out, "loss") else out)


def _real_step(model, inputs, loss_fn, spec, hidden):
    """One real step: the optimizer's state bytes (distinct storages) and its step's matmul FLOPs."""
    m = copy.deepcopy(model)
    out = m(**inputs) if isinstance(inputs, dict) else m(*inputs) if isinstance(inputs, tuple) else m(inputs)
    _loss_of(loss_fn)(out).backward()
    opt = _factory(m, spec, hidden)(m.parameters())
    counter = flop_counter()
    with counter:
        opt.step()
    state = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in opt.state_tensors()}
    return sum(state.values()), counter.get_total_flops()


def _optimizer_matmul_flops(report) -> int:
    return sum(r["flops_optimizer"] for r in report.to_dict()["by_operator"] if r["kind"] == "matmul")


@pytest.mark.parametrize("spec", ["muon", "adafactor"])
@pytest.mark.parametrize("name", list(MODELS))
def test_state_flops_and_peak_match_a_real_step(name, spec):
    model, inputs, loss_fn, hidden = MODELS[name]()
    state, flops = _real_step(model, inputs, loss_fn, spec, hidden)
    first, steady = measure_peaks(copy.deepcopy(model), inputs, _factory(model, spec, hidden), _loss_of(loss_fn))
    report = estimate(model, inputs, loss_fn=loss_fn, optimizer=spec, device="cpu")
    assert report.to_dict()["memory"]["optimizer_state"] == state
    assert _optimizer_matmul_flops(report) == flops
    if spec == "muon":
        assert flops > 0  # the Newton-Schulz iterations: 5 x (X X^T, then two addmm) per matrix
    assert report.memory.peak == pytest.approx(steady, rel=0.01), (report.memory.peak, steady)
    assert report.memory.peak_first_step == pytest.approx(first, rel=0.01), (report.memory.peak_first_step, first)


def test_a_list_of_optimizers_is_the_loop_that_steps_each():
    model, inputs, loss_fn, hidden = _gpt()
    both = _muon_and_adamw(list(model.named_parameters()), hidden)
    by_list = estimate(model, inputs, optimizer=list(both.optimizers), device="cpu")
    by_name = estimate(model, inputs, optimizer="muon", device="cpu")
    assert by_list.capture.optimizer_name == "Muon + AdamW"
    for key in ("optimizer_state", "peak", "peak_first_step"):
        assert by_list.to_dict()["memory"][key] == by_name.to_dict()["memory"][key], key
    assert _optimizer_matmul_flops(by_list) == _optimizer_matmul_flops(by_name) > 0


def test_the_split_is_stated_in_the_report():
    model, inputs, _, hidden = _llama()
    report = estimate(model, inputs, optimizer="muon", device="cpu")
    note = next(n for n in report.to_dict()["assumptions"] if n.startswith("optimizer muon"))
    # 14 projections of 64 x 64 (q, o), 32 x 64 (k, v), 128 x 64 (gate, up, down) per layer x 2 layers
    numel = 2 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 128 * 64)
    assert f"on {len(hidden)} hidden matrices ({numel:,} parameters)" in note and "'lm_head'" in note


def test_muon_without_a_hidden_matrix_is_a_user_error():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))
    with pytest.raises(UserError, match="no trainable 2-D Linear weight besides its output head"):
        estimate(model, torch.randn(2, 3, 8, 8), optimizer="muon", device="cpu")
    with pytest.raises(UserError, match="a list of optimizers holds instances.*not a str"):
        estimate(model, torch.randn(2, 3, 8, 8), optimizer=[torch.optim.SGD(model.parameters()), "adamw"])


def test_cli_muon_on_the_example():
    out = subprocess.run([sys.executable, "-m", "estimator", "estimate", "examples/gpt.py:build", "--optimizer",
                          "muon:lr=0.02", "--set", "batch=2", "--set", "seq=64", "--format", "json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    # qkv, proj, mlp.0 and mlp.2 in each of the example's 4 blocks
    assert any("torch.optim.Muon on 16 hidden matrices" in n for n in report["assumptions"])
    assert report["flops"]["optimizer"] > report["flops"]["total"]  # Newton-Schulz on 16 matrices at batch 2 x 64


def test_plans_say_what_they_cannot_run():
    """FSDP2 with Adafactor fails on the DTensor parameters as a real run does (an in-place op on a norm that is
    partial over the shards; seen on a real 2-rank gloo run of torch 2.13): one line that says what to change.
    ZeRO, laid out by hand for element-wise steps, names what it does not model for Muon."""
    from estimator.plan import plan

    model, inputs, _, _ = _gpt()
    with pytest.raises(UserError, match="fails on the engine.s sharded .DTensor. parameters, as it would in a real"):
        plan(model, inputs, gpu="H100", gpus=2, strategy="fsdp", optimizer="adafactor", solve=())
    notes = plan(model, inputs, gpu="H100", gpus=2, strategy="zero2", optimizer="muon", solve=()).notes
    assert any("muon reduces over whole matrices" in n for n in notes)


# -- bitsandbytes' 8-bit AdamW ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_adamw8bit_state_and_peaks_match_bitsandbytes(name):
    """``--optimizer adamw8bit`` against ``bnb.optim.AdamW8bit`` run for real on the CPU: its uint8 moments (one
    byte per element each), one float32 absmax per 256 elements of each, the shared quantization maps, and
    float32 moments for parameters under 4,096 elements (the norms' and biases'): state bytes equal, peaks within
    1 % of the live-tensor tracker."""
    bnb = pytest.importorskip("bitsandbytes")
    model, inputs, loss_fn, _ = MODELS[name]()
    m = copy.deepcopy(model)
    out = m(**inputs) if isinstance(inputs, dict) else m(*inputs)
    _loss_of(loss_fn)(out).backward()
    opt = bnb.optim.AdamW8bit(m.parameters(), lr=1e-3)
    opt.step()
    tensors = [v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)]
    state = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())
    first, steady = measure_peaks(copy.deepcopy(model), inputs, lambda p: bnb.optim.AdamW8bit(p, lr=1e-3),
                                  _loss_of(loss_fn))
    report = estimate(model, inputs, loss_fn=loss_fn, optimizer="adamw8bit", device="cpu")
    assert report.to_dict()["memory"]["optimizer_state"] == state
    assert report.memory.peak == pytest.approx(steady, rel=0.01), (report.memory.peak, steady)
    assert report.memory.peak_first_step == pytest.approx(first, rel=0.01), (report.memory.peak_first_step, first)
    assert report.to_dict()["unsupported_ops"] == []


def test_adamw8bit_under_fsdp_fails_as_a_real_run_does():
    """bitsandbytes' update kernel on FSDP2's DTensor parameters: "got mixed torch.Tensor and DTensor" in a real
    2-rank gloo run of torch 2.13 and bitsandbytes 0.50, and in the plan, with what to change."""
    from estimator.plan import plan

    model, inputs, _, _ = _gpt()
    with pytest.raises(UserError, match="mixed torch.Tensor and DTensor.*use an element-wise optimizer"):
        plan(model, inputs, gpu="H100", gpus=2, strategy="fsdp", optimizer="adamw8bit", solve=())
    ddp = plan(model, inputs, gpu="H100", gpus=2, strategy="ddp", optimizer="adamw8bit", solve=())
    adamw = plan(model, inputs, gpu="H100", gpus=2, strategy="ddp", solve=())
    assert ddp.per_gpu.optimizer_state < adamw.per_gpu.optimizer_state / 3  # 2 bytes per element against 8


def test_transformers_adafactor_given_as_a_class_runs_as_its_default():
    """A class is built over the parameters as ``cls(params)``; the estimate added ``lr=1e-3``, which transformers'
    Adafactor refuses with its default ``relative_step=True`` ("Cannot combine manual `lr` and `relative_step=True`"):
    a step that runs was refused. A learning rate is given only where the class has no default. Truth: the state of
    a real step of ``Adafactor(model.parameters())``."""
    pytest.importorskip("transformers")
    from estimator.compat import import_torchvision

    import_torchvision()
    from transformers.optimization import Adafactor

    model, x, loss_fn, _ = _classifier()
    real = copy.deepcopy(model)
    opt = Adafactor(real.parameters())
    loss_fn(real(x)).backward()
    opt.step()
    state = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
             for st in opt.state.values() for t in st.values() if torch.is_tensor(t)}
    report = estimate(model, x, loss_fn=loss_fn, optimizer=Adafactor, device="cpu")
    assert report.to_dict()["memory"]["optimizer_state"] == sum(state.values())

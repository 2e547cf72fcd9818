"""The caller's torch state around an estimate or a plan (:mod:`estimator.caller`) and the loop options a caller
gives (:mod:`estimator.loop`): each case against the same call made outside that state, or a one-line error."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from estimator import estimate
from estimator.errors import UserError
from estimator.plan import plan


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)), torch.randn(16, 32)


def _numbers(report) -> tuple:
    d = report.to_dict()
    return d["memory"], d["flops"], d["precision"]


@pytest.mark.parametrize("state", ["no_grad", "inference_mode", "fake_mode"])
def test_the_callers_grad_and_dispatch_modes_do_not_reach_the_step(state):
    """Under ``no_grad`` / ``inference_mode`` the training step had no gradient ("nothing to train"); under the
    caller's FakeTensorMode the optimizer's state was made in it and failed, blaming the optimizer.  The same
    numbers as outside now; the plan too."""
    model, x = _model()
    outside = _numbers(estimate(model, x, device="cpu"))
    outside_plan = plan(model, x, gpu="H100", device="cpu", solve=()).per_gpu
    context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode, "fake_mode": FakeTensorMode}[state]
    with context():
        if state == "fake_mode":  # the model and its input made inside the caller's fake mode
            model, x = _model()
        assert _numbers(estimate(model, x, device="cpu")) == outside
        assert plan(model, x, gpu="H100", device="cpu", solve=()).per_gpu == outside_plan
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


def test_an_autocast_block_around_the_call_is_a_one_line_error():
    """Under the caller's autocast the report said fp32 and counted bf16 FLOPs (its peak +8.1 % over a real
    autocast step's); the precision option says it."""
    model, x = _model()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(UserError, match="precision='bf16-mixed'") as info:
            estimate(model, x, device="cpu")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(keep_output="no"), "keep_output is True"),  # ("no" was read as True)
    (dict(checkpoint_policy="op"), "give checkpoint="),  # (ignored without classes)
    (dict(checkpoint=nn.LSTM), "LSTM: no module of that class"),  # (a what-if that checkpointed nothing)
    # the model's own class: reported as checkpointed with nothing wrapped (matmul backward -33.6 % below a
    # real step with the whole model checkpointed)
    (dict(checkpoint=nn.Sequential), "Sequential: the only module of that class is the model itself"),
    (dict(checkpoint="Sequential"), "Sequential: the only module of that class is the model itself"),
    (dict(optimizer="none", optimizer_kwargs={"lr": 0.1}), "optimizer_kwargs are the optimizer's options"),
])
def test_loop_options_that_would_be_ignored_are_one_line_errors(kwargs, needle):
    model, x = _model()
    with pytest.raises(UserError, match=needle) as info:
        estimate(model, x, device="cpu", **kwargs)
    assert "\n" not in str(info.value)


def test_plan_refuses_the_same_loop_options():
    model, x = _model()
    for kwargs, needle in ((dict(keep_output="no"), "keep_output is True"),
                           (dict(checkpoint_policy="op"), "give checkpoint=")):
        with pytest.raises(UserError, match=needle):
            plan(model, x, gpu="H100", device="cpu", solve=(), **kwargs)


def test_a_model_with_nothing_to_train_says_there_is_no_optimizer_step():
    """Only the input takes gradients: the optimizer was dropped without a word (torch.optim refuses an empty
    parameter list); an EMA of weights nothing trains is refused."""
    model, x = _model()
    model.requires_grad_(False)
    x = x.clone().requires_grad_(True)
    report = estimate(model, x, device="cpu", optimizer="sgd:momentum=0.9")
    assert report.tally.optimizer_state_bytes == 0
    assert any("no optimizer step" in a for a in report.capture.assumptions)
    with pytest.raises(UserError, match="drop ema"):
        estimate(model, x, device="cpu", ema=0.999)


def test_muon_options_go_to_muon_only():
    """``optimizer="muon"`` with a Muon-only option in optimizer_kwargs failed building the AdamW half ("cannot
    build AdamW ... adjust_lr_fn"); it takes the option in its spec string, and now in the kwargs alike."""
    model, x = _model()
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    by_kwargs = estimate(model, x, device="cpu", optimizer="muon", optimizer_kwargs={"adjust_lr_fn": "match_rms_adamw"})
    by_spec = estimate(model, x, device="cpu", optimizer="muon:adjust_lr_fn=match_rms_adamw")
    assert _numbers(by_kwargs) == _numbers(by_spec)


def test_a_warning_is_said_once_per_call(caplog):
    """The checkpoint what-if tallies the step a second time: its warnings (parameters without a gradient, ops
    without a rule) were logged twice by one estimate, and once per engine trace by a plan."""

    class Blk(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 8)

        def forward(self, x):
            return torch.relu(self.a(x))

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks, self.unused = nn.Sequential(Blk(), Blk()), nn.Linear(8, 8)

        def forward(self, x):
            return self.blocks(x).mean()

    def said() -> int:
        return sum("get no gradient" in r.getMessage() for r in caplog.records)

    with caplog.at_level("WARNING", logger="estimator"):
        estimate(M(), torch.randn(4, 8), device="cpu", checkpoint="Blk")
        assert said() == 1
        estimate(M(), torch.randn(4, 8), device="cpu")  # a second call says it again
        assert said() == 2


def test_modules_the_caller_put_in_eval_stay_so_in_the_step_and_after_it():
    """Dropout turned off by the caller (``.eval()`` on its layers, a model in training mode): the step switched it
    back on (``model.train()``: activations +13.2 % on a BERT) and left every module in training mode afterwards,
    so the caller's next real step ran dropout it had turned off. Truth: a real step with the same flags."""
    import sys
    import os

    sys.path.insert(0, os.path.dirname(__file__))
    from groundtruth import measure

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Dropout(0.5), nn.GELU(), nn.Linear(64, 64), nn.Dropout(0.5),
                          nn.Linear(64, 4))
    model[1].eval(), model[4].eval()
    x = torch.randn(16, 32)
    flags = [m.training for m in model.modules()]
    report = estimate(model, x, device="cpu", optimizer="adamw")
    assert [m.training for m in model.modules()] == flags
    truth = measure(model, x)  # (its copy keeps the flags too)
    assert report.tally.activations_bytes == truth["activation_bytes"]
    assert any("stay in eval mode (Dropout)" in a for a in report.capture.assumptions)
    plan(model, x, gpu="H100", device="cpu", solve=())
    assert [m.training for m in model.modules()] == flags
    model.eval()  # a root in eval (from_pretrained's) is trained whole, as a loop calling model.train() trains it
    whole = estimate(model, x, device="cpu", optimizer="adamw")
    assert whole.tally.activations_bytes > report.tally.activations_bytes and not model.training


def test_plan_takes_an_optimizer_instance_on_every_engine():
    """An optimizer built over model.parameters() (a Trainer's, with its weight-decay groups) was refused under
    ddp and fsdp ("build it over model.parameters()", as it was): the engines trace a copy of the model, whose
    parameters are matched by name now. Its groups' options are kept: AMSGrad on the weights alone makes its third
    state for them only, as the estimate (checked against a real step elsewhere) counts."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    opt = torch.optim.AdamW([{"params": weights, "amsgrad": True}, {"params": biases, "weight_decay": 0.0}])
    x = torch.randn(16, 32)
    state = estimate(model, x, device="cpu", optimizer=opt).tally.optimizer_state_bytes
    real = copy.deepcopy(model)  # truth: the state a real step of the same groups makes
    w, b = [p for n, p in real.named_parameters() if n.endswith("weight")], [p for n, p in real.named_parameters()
                                                                            if n.endswith("bias")]
    real_opt = torch.optim.AdamW([{"params": w, "amsgrad": True}, {"params": b, "weight_decay": 0.0}])
    real(x).pow(2).mean().backward()
    real_opt.step()
    assert state == sum(t.nbytes for st in real_opt.state.values() for t in st.values())
    for strategy, gpus in (("ddp", 1), ("ddp", 2), ("fsdp", 2)):
        p = plan(model, x, gpu="H100", device="cpu", optimizer=opt, strategy=strategy, gpus=gpus, solve=())
        held = p.per_gpu.optimizer_state
        assert held == state if strategy == "ddp" else state / 2 - 64 < held < state / 2 + 64, (strategy, held)


def test_accelerates_optimizer_wrapper_is_the_optimizer_it_steps():
    """Accelerator.prepare's AcceleratedOptimizer was refused, with advice to name the class, which lost its groups'
    options (AMSGrad in one group: -3.5 % of the state). It is its .optimizer now. Truth: a real step's state."""
    accelerate = pytest.importorskip("accelerate")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 8))
    decay = [p for p in model.parameters() if p.ndim == 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "amsgrad": True}])
    prepared, wrapped = accelerate.Accelerator(cpu=True).prepare(model, opt)
    x = torch.randn(16, 32)
    report = estimate(prepared, x, loss_fn=lambda o: o.square().mean(), optimizer=wrapped, device="cpu")
    prepared(x).square().mean().backward()
    wrapped.step()
    assert report.tally.optimizer_state_bytes == sum(t.nbytes for st in opt.state.values() for t in st.values())


def test_tensors_in_a_dataclass_input_are_inputs():
    """A batch given as a dataclass (``Batch(x=...)``): torch's pytree left it opaque, so its tensor was counted as an
    activation (inputs 0, the report's "Inputs -"), not cast under ``precision="bf16"`` (a false refusal: "addmm ...
    bfloat16 and float32") and the plan found no batch dimension. The real loop's peak (live tracker) is the same as
    with the tensor given plain; the class is left unregistered after."""
    import dataclasses

    import torch.utils._pytree as pytree
    from livetracker import measure_peaks

    @dataclasses.dataclass
    class Batch:
        x: torch.Tensor

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(256, 256)

        def forward(self, batch):
            return self.lin(batch.x).pow(2).mean()

    torch.manual_seed(0)
    x = torch.randn(512, 256)
    _, steady = measure_peaks(Net(), (Batch(x),), lambda p: torch.optim.AdamW(p, lr=1e-3), lambda o: o)
    report = estimate(Net(), (Batch(x),), loss_fn=lambda o: o, device="cpu")
    assert report.memory.peak == steady and report.to_dict()["memory"]["inputs"] == x.nbytes
    bf16 = estimate(Net(), (Batch(x),), loss_fn=lambda o: o, device="cpu", precision="bf16")
    assert bf16.to_dict()["memory"]["inputs"] == x.nbytes // 2  # (cast, as a tensor given plain is)
    planned = plan(Net(), (Batch(x),), gpu="H100", gpus=2, strategy="fsdp", device="cpu", loss_fn=lambda o: o,
                   solve=())
    assert planned.to_dict()["global_batch"] == 2 * 512
    assert Batch not in pytree.SUPPORTED_NODES

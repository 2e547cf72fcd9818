"""The real-tensor fallback: a model that reads values its weights computed (a detector's loss masking its
predicted boxes, as torchvision's GIoU loss does) is traced with a real forward, then, where the forward's ops
were large enough for fake ones to be cheaper (``step.FAKE_BACKWARD_OP_BYTES``), backward and the optimizer step on
fake tensors; a backward that reads values too is traced on real tensors throughout.  Every number
equals the real step's, measured in the same test (``groundtruth.measure``: saved-tensor hooks, real
gradients and AdamW state, FlopCounterMode; ``measure_peaks``: the live-tensor tracker)."""

from __future__ import annotations

import copy

import pytest
import torch

import groundtruth
from estimator import estimate
from estimator.capture import step as step_module
from estimator.capture.step import Step
from livetracker import measure_peaks


class MasksItsPredictions(torch.nn.Module):
    """Boxes predicted by a small convolutional head; the loss keeps the boxes whose corners are in order, as
    torchvision's generalized_box_iou_loss does (``intersection[mask] = ...``), so the sizes depend on what the
    weights computed."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                                        torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1))

    def forward(self, images):
        boxes = self.body(images).flatten(2).transpose(1, 2)  # (B, H * W, 4)
        x1, y1, x2, y2 = boxes.unbind(-1)
        ordered = (x2 > x1) & (y2 > y1)  # values of the weights' output
        area = torch.zeros_like(x1)
        area[ordered] = (x2[ordered] - x1[ordered]) * (y2[ordered] - y1[ordered])
        return area.sum() + boxes.pow(2).mean()


class ReadsInBackward(torch.autograd.Function):
    """An identity whose backward reads a value of the gradient it is given (a gradient check written by hand).
    A value of what forward saved is known (real) in the fake backward; the gradient's is not."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 0 if (grad.abs().max() + x.abs().max()).item() > 1e30 else grad


class ReadsForwardAndBackward(MasksItsPredictions):
    def forward(self, images):
        return super().forward(ReadsInBackward.apply(self.body[0](images))[:, :3])


def _runs(monkeypatch) -> list[bool]:
    """Whether each real step the capture runs took its backward on fake tensors (in the order they ran)."""
    seen: list[bool] = []
    original = Step.run

    def run(self):
        try:
            return original(self)
        finally:
            if not self.fake:
                seen.append(self.fake_mode is not None)

    monkeypatch.setattr(Step, "run", run)
    return seen


@pytest.mark.parametrize("model_cls,steps", [(MasksItsPredictions, [True]),
                                             (ReadsForwardAndBackward, [True, False])])
def test_a_real_forward_then_a_fake_backward_gives_the_real_steps_numbers(monkeypatch, model_cls, steps):
    monkeypatch.setattr(step_module, "FAKE_BACKWARD_OP_BYTES", 0)  # (this model's ops are small: fake backward anyway)
    torch.manual_seed(0)
    model, images = model_cls(), torch.randn(2, 3, 12, 12)
    seen = _runs(monkeypatch)
    report = estimate(model, images, loss_fn=lambda out: out, device="cpu")
    d = report.to_dict()
    assert d["capture"] == "real" and "reads tensor values" in d["capture_fallback"]
    assert seen == steps  # (the second: the backward read a value, so all of the step ran on real tensors)
    truth = groundtruth.measure(copy.deepcopy(model), images, "adamw", loss_fn=lambda out: out)
    assert d["memory"]["activations"] == truth["activation_bytes"]
    assert d["memory"]["gradients"] == truth["grad_bytes"]
    assert d["memory"]["optimizer_state"] == truth["optimizer_state_bytes"]
    assert d["flops"]["matmul_forward"] == truth["matmul_forward"]
    assert d["flops"]["matmul_backward"] == truth["matmul_backward"]
    # lr=0: the second (steady) step meets the weights of the first, so its masks keep their sizes (with lr > 0
    # the updated weights order another count of boxes: 2 elements, 8 bytes, in this model's steady peak)
    first, steady = measure_peaks(copy.deepcopy(model), images, lambda p: torch.optim.AdamW(p, lr=0.0),
                                  lambda out: out)
    assert (report.memory.peak, report.memory.peak_first_step) == (steady, first)


def test_gradient_accumulation_traces_the_whole_step_on_real_tensors(monkeypatch):
    """Two micro-steps are traced: the second's forward must read real values, so no fake backward."""
    seen = _runs(monkeypatch)
    d = estimate(MasksItsPredictions(), torch.randn(2, 3, 12, 12), loss_fn=lambda out: out, device="cpu",
                 grad_accum=2).to_dict()
    assert d["capture"] == "real" and seen == [False]


def test_a_forward_of_fast_ops_keeps_its_backward_on_real_tensors(monkeypatch):
    """Small kernels run faster for real than fake ops dispatch (SLANeXt's table decoder: 4.4 s, 12.9 s with a fake
    backward): a forward whose ops allocated less than the threshold on average keeps its backward real, with the
    same numbers.  (This model's 12 x 12 maps: far under 256 KiB an op.)"""
    torch.manual_seed(0)
    model, images = MasksItsPredictions(), torch.randn(2, 3, 12, 12)
    seen = _runs(monkeypatch)
    d = estimate(model, images, loss_fn=lambda out: out, device="cpu").to_dict()
    assert d["capture"] == "real" and seen == [False]
    truth = groundtruth.measure(copy.deepcopy(model), images, "adamw", loss_fn=lambda out: out)
    assert d["memory"]["activations"] == truth["activation_bytes"]


class _Jagged(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        nt = torch.nested.nested_tensor([x[:3], x[3:]], layout=torch.jagged)
        return self.lin(nt).relu().values().sum()


class _SparseGraph(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        n = x.shape[0]
        idx = torch.stack([torch.arange(n), torch.arange(n).roll(1)])
        adjacency = torch.sparse_coo_tensor(idx, torch.ones(n), (n, n))
        return torch.sparse.mm(adjacency, self.lin(x)).sum()


class _FuncGrad(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 1)

    def forward(self, x):
        du = torch.func.vmap(torch.func.grad(lambda xi: self.lin(xi).sum()))(x)
        return du.square().mean()


@pytest.mark.parametrize("model,needle", [(_Jagged, "nested (jagged) tensor"), (_SparseGraph, "sparse tensor"),
                                          (_FuncGrad, "torch.autograd.grad")])
def test_constructs_the_capture_does_not_model_say_what_to_do(model, needle):
    """The real steps run; the estimate crashed inside a rule (a jagged nested tensor) or advised checking the
    inputs' shapes and dtypes (a sparse adjacency, torch.func.grad in forward): one line that names the construct
    and what to estimate instead."""
    from estimator import estimate
    from estimator.errors import UnsupportedModelError

    m, x = model(), torch.randn(6, 8)
    m(x).backward()  # the real step runs
    with pytest.raises(UnsupportedModelError, match=needle.replace("(", r"\(").replace(")", r"\)")) as info:
        estimate(m, x, device="cpu")
    assert "\n" not in str(info.value) and "input shapes" not in str(info.value)


class SelectsRowsByMask(torch.nn.Module):
    """Reads a weight's value (so the step is traced on real tensors), then runs its Linear on the rows an
    integer mask selects: the step's size depends on the mask's values."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)

    def forward(self, x, mask):
        scale = 2.0 if (self.lin.weight.abs().max() > 0).item() else 1.0
        return (self.lin(x[mask.bool()]) * scale).float().pow(2).sum()


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_cast_real_step_keeps_the_users_input_values(precision):
    """Under a cast precision (model.to(bf16)) the real fallback took zeros for integer inputs and random floats
    for the rest: the mask selected no row (matmul FLOPs 0, gradients unused)."""
    torch.manual_seed(0)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    model, x = SelectsRowsByMask(), torch.randn(32, 64)
    mask = (torch.arange(32) % 4 != 0).long()  # 24 of 32 rows
    d = estimate(model, (x, mask), loss_fn=lambda out: out, device="cpu", precision=precision).to_dict()
    assert d["capture"] == "real"
    # the same step as the user runs it: weights and floating inputs in the low dtype, the mask as given
    truth = groundtruth.measure(copy.deepcopy(model).to(dtype), (x.to(dtype), mask), "adamw", loss_fn=lambda out: out)
    assert d["flops"]["matmul_forward"] == truth["matmul_forward"] > 0  # 2 * 24 * 64 * 64
    assert d["flops"]["matmul_backward"] == truth["matmul_backward"]
    assert d["memory"]["activations"] == truth["activation_bytes"]
    assert d["memory"]["gradients"] == truth["grad_bytes"]


def test_meta_inputs_whose_values_are_read_are_taken_as_ones_and_said():
    """A mask given on the meta device has no values; the real step drew zeros for it, so a model that keeps the
    rows its mask selects ran on none (matmul FLOPs 0) and the report said nothing.  Now ones (every row kept),
    which is the real step on an all-ones mask, and a line in the report's assumptions."""
    torch.manual_seed(0)
    model, x = SelectsRowsByMask(), torch.randn(32, 64)
    d = estimate(model, (x, torch.ones(32, dtype=torch.long).to("meta")), loss_fn=lambda out: out,
                 device="cpu").to_dict()
    assert d["capture"] == "real"
    truth = groundtruth.measure(copy.deepcopy(model), (x, torch.ones(32, dtype=torch.long)), "adamw",
                                loss_fn=lambda out: out)
    assert d["flops"]["matmul_forward"] == truth["matmul_forward"] > 0  # 2 * 32 * 64 * 64
    assert d["memory"]["activations"] == truth["activation_bytes"]
    assert any("given as meta or fake tensors" in a for a in d["assumptions"])
    # real inputs: nothing drawn, nothing said
    mask = torch.ones(32, dtype=torch.long)
    assert not any("meta or fake" in a for a in estimate(model, (x, mask), loss_fn=lambda out: out,
                                                         device="cpu").to_dict()["assumptions"])


def _cached(fn):
    """transformers' compile_compatible_method_lru_cache: an lru_cache in the closure of the method."""
    import functools

    cached = functools.lru_cache(maxsize=4)(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return cached(*args, **kwargs)

    return wrapper


class CachedEmbedding(torch.nn.Module):
    """A sine position table kept in a process-wide cache (RT-DETR's, DETR's), and a branch on a value of the
    weights' output (so the capture falls back to real tensors after its fake trace)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    @_cached
    def table(self, n: int, d: int) -> torch.Tensor:
        return torch.sin(torch.arange(n * d, dtype=torch.float32).reshape(n, d) / 7)

    def forward(self, x):  # x: (n, 16)
        h = self.lin(x) + self.table(x.shape[0], 16)
        return h.pow(2).sum() * (2.0 if (h.max() > 0).item() else 1.0)


def test_a_cached_method_keeps_no_fake_tensor():
    """The fake trace left a fake tensor in the method's cache: the capture's own real fallback got it back and
    failed ("the step fails on real CPU tensors too": RT-DETR could not be estimated), and so did the user's next
    real forward.  The caches are emptied around the capture; the step equals the real one."""
    torch.manual_seed(0)
    model, x = CachedEmbedding(), torch.randn(8, 16)
    d = estimate(model, x, loss_fn=lambda out: out, device="cpu").to_dict()
    assert d["capture"] == "real"
    truth = groundtruth.measure(copy.deepcopy(model), x, "adamw", loss_fn=lambda out: out)
    assert d["memory"]["activations"] == truth["activation_bytes"]
    out = model(x)  # the user's model after the estimate: its cache holds no fake tensor
    assert type(model.table(8, 16)) is torch.Tensor and torch.isfinite(out)


@pytest.mark.parametrize("layout", [torch.jagged, torch.strided])
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_a_nested_tensor_input_is_refused_in_one_line(layout, precision):
    """A jagged input aborted the interpreter under fp32 (the refusal raised inside the nested tensor's own op,
    called from C++: pybind11's terminate, exit 134, nothing the caller could catch); a strided one raised torch's
    "NestedTensorImpl doesn't support sizes" reading its batch. Both are refused before the capture, with what to
    estimate instead; the model's own jagged tensor (above) is refused where its pass returns."""
    from estimator import estimate
    from estimator.errors import UnsupportedModelError
    from estimator.plan import plan

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    nt = torch.nested.nested_tensor([torch.randn(n, 16) for n in (5, 9, 3)], layout=layout)
    with pytest.raises(UnsupportedModelError, match="nested tensor.*pad the sequences") as info:
        estimate(model, nt, device="cpu", precision=precision, loss_fn=lambda o: o.values().pow(2).mean())
    assert "\n" not in str(info.value)
    with pytest.raises(UnsupportedModelError, match="nested tensor"):
        plan(model, nt, gpu="H100", device="cpu", solve=())


class _ConvertsInForward(torch.nn.Module):
    """Switch Transformers' router: ``self.classifier = self.classifier.to(self.dtype)`` at each forward."""

    def __init__(self):
        super().__init__()
        self.classifier, self.out = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)

    def forward(self, x):
        self.classifier = self.classifier.to(torch.float32)
        return self.out(self.classifier(x).relu()).pow(2).mean()


def test_a_module_converted_inside_forward_is_estimated_as_it_runs():
    """``nn.Module._apply`` swaps a FakeTensor parameter (``torch.utils.swap_tensors``), which refuses the capture's
    weakly referenced stand-ins: "_apply(): Couldn't swap Linear.weight" (Switch Transformers' MoE layers could
    not be estimated). A real parameter is updated in place, as the trace now does: peaks equal a real step's."""
    import os
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from livetracker import measure_peaks

    from estimator import estimate

    torch.manual_seed(0)
    model, x = _ConvertsInForward(), torch.randn(32, 64)
    report = estimate(model, x, device="cpu", optimizer="adamw", loss_fn=lambda o: o)
    first, steady = measure_peaks(model, x, lambda p: torch.optim.AdamW(list(p)), lambda o: o)
    assert (report.memory.peak_first_step, report.memory.peak) == (first, steady)
    estimate(model, x, device="cpu", mode="inference", loss_fn=lambda o: o)  # (it failed alike)


class _MixedMatmul(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(16, 16))

    def forward(self, x):
        return (x.to(torch.bfloat16) @ self.weight).float().pow(2).mean()


class _BackwardOutsideAutocast(torch.autograd.Function):
    """A custom matmul without custom_fwd/custom_bwd: its backward runs outside autocast, on mixed dtypes."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w.t(), x.t() @ g


class _CustomMatmul(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.weight = torch.nn.Parameter(torch.randn(16, 16))

    def forward(self, x):
        return _BackwardOutsideAutocast.apply(self.lin(x), self.weight).float().pow(2).mean()


@pytest.mark.parametrize("model,precision", [(_MixedMatmul, "fp32"), (_CustomMatmul, "bf16-mixed")])
def test_a_matmul_of_two_dtypes_fails_as_the_real_kernel_fails(model, precision):
    """The meta kernels of mm/addmm/bmm take matrices of two dtypes, which every real kernel refuses ("expected m1
    and m2 to have the same dtype"): a step that cannot run was estimated. The real step is run here and fails."""
    from estimator import estimate
    from estimator.errors import UserError

    m, x = model(), torch.randn(8, 16)
    with pytest.raises(RuntimeError, match="same dtype"):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
            loss = m(x)
        loss.backward()
    with pytest.raises(UserError, match=r"aten\.(mm|addmm)\.default: .*must have the same dtype") as info:
        estimate(m, x, device="cpu", precision=precision, loss_fn=lambda o: o)
    assert "\n" not in str(info.value)


class _ModifiesASavedTensor(torch.nn.Module):
    """ReLU(inplace=True) after a sigmoid: the sigmoid saved its output for backward, the ReLU writes it."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.act = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4), torch.nn.ReLU(inplace=True)

    def forward(self, x):
        return self.b(self.act(torch.sigmoid(self.a(x))))


def test_a_saved_tensor_modified_in_place_fails_as_the_real_backward_fails():
    """The capture's saved-tensor hooks turn off autograd's version check of what they pack: a step whose real
    backward fails ("modified by an inplace operation") was estimated. The hooks check it now."""
    from estimator import estimate
    from estimator.errors import UserError

    m, x = _ModifiesASavedTensor(), torch.randn(8, 16)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        m(x).mean().backward()
    with pytest.raises(UserError, match="modifies in place a tensor autograd saved.*ReLU\\(inplace=False\\)") as info:
        estimate(m, x, device="cpu")
    assert "\n" not in str(info.value)


@torch.library.custom_op("estimator_tests::cube_no_fake", mutates_args=())
def _cube(x: torch.Tensor) -> torch.Tensor:
    return x * x * x


class _Flex(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(32, 96)

    def forward(self, x):
        from torch.nn.attention.flex_attention import flex_attention

        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 2, 16).permute(2, 0, 3, 1, 4)
        return flex_attention(q, k, v).sum()


class _Cond(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)

    def forward(self, x):
        h = self.lin(x)
        return torch.cond(h.sum() > 0, lambda t: t.relu(), lambda t: t.tanh(), (h,)).sum()


class _NoFakeKernel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)

    def forward(self, x):
        return _cube(self.lin(x)).sum()


@pytest.mark.parametrize("model,mode,needle", [
    (_Flex, "train", "runs FlexAttention.*F.scaled_dot_product_attention"),
    (_Flex, "inference", "runs FlexAttention.*F.scaled_dot_product_attention"),
    (_Cond, "train", "higher-order operator cond"),
    (_NoFakeKernel, "inference", "cube_no_fake.* has no fake \\(meta\\) kernel.*register_fake.*trace='real'"),
])
def test_what_the_trace_cannot_run_says_what_to_do(model, mode, needle):
    """FlexAttention was told to "check the input shapes" (training) or to "use plain Python control flow"
    (inference); torch.cond's lower-case "higher order operator" message named an op before it; a custom op without
    a fake kernel said only "UnsupportedOperatorException" and to check the input shapes. The real forwards run."""
    from estimator import estimate
    from estimator.errors import UserError

    m, x = model(), torch.randn(2, 8, 32)
    with torch.no_grad():
        m(x)
    with pytest.raises(UserError, match=needle) as info:
        estimate(m, x, device="cpu", mode=mode)
    assert "\n" not in str(info.value) and "check the input shapes" not in str(info.value)


def test_multihead_attentions_inference_fast_path_is_traced_as_its_standard_path():
    """nn.TransformerEncoder in inference with a padding mask takes a fast path (a nested tensor made from the mask,
    fused kernels): the trace failed on the nested tensor ("Internal error: NestedTensorImpl doesn't support sizes",
    a false refusal: the real forward runs), and without a mask the fused op had no rule (matmul FLOPs -54 %).
    Truth: FlopCounterMode on the real forward's standard path (the same matmuls)."""
    import os
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from instruments import flop_counter

    from estimator import estimate

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2).eval()
    x, pad = torch.randn(2, 10, 32), torch.zeros(2, 10, dtype=torch.bool)
    pad[0, 7:] = True
    with torch.no_grad():
        model(x, src_key_padding_mask=pad)  # (the real fast path runs)
    report = estimate(model, {"src": x, "src_key_padding_mask": pad}, device="cpu", mode="inference")
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        counter = flop_counter()
        with torch.no_grad(), counter:
            model(x, src_key_padding_mask=pad)
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
    matmul = sum(v for k, v in counter.get_flop_counts()["Global"].items() if "mm" in str(k) or "attention" in str(k))
    assert report.to_dict()["flops"]["matmul_forward"] == matmul and not report.to_dict()["unsupported_ops"]
    assert any("fast path" in a for a in report.capture.assumptions)
    assert torch.backends.mha.get_fastpath_enabled()
    # without a mask the fast path's fused kernel is traced as it runs (its peak: the standard path's was +16-52 %
    # over a real fast-path forward), costed as the same matmuls
    fused = estimate(model, {"src": x}, device="cpu", mode="inference")
    assert any("_native_multi_head_attention" in str(n.target) or "_transformer_encoder_layer_fwd" in str(n.target)
               for n in fused.capture.nodes)
    assert fused.to_dict()["flops"]["matmul_forward"] == matmul and not fused.to_dict()["unsupported_ops"]
    assert not any("fast path" in a for a in fused.capture.assumptions)


class _MaskedRows(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 64), torch.nn.Linear(64, 4)

    def forward(self, x):
        h = self.a(x)
        return self.b(h[h[:, 0] > 0]).sum() + h.mean()


def test_a_data_dependent_op_under_ddp_is_named_not_the_engines_profiler_mark():
    """Under DDP the refusal named "profiler._record_function_exit._RecordFunction" (the engine's mark) as the op
    that reads values, where FSDP named aten.index.Tensor."""
    from estimator.errors import UserError
    from estimator.plan import plan

    for strategy in ("ddp", "fsdp"):
        with pytest.raises(UserError, match="reads tensor values in aten.index.Tensor"):
            plan(_MaskedRows(), torch.randn(16, 32), gpu="H100", gpus=2, strategy=strategy, device="cpu",
                 loss_fn=lambda o: o, solve=())


class _CastsAndBack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.head = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        h = self.a(x)
        self.head.to(torch.bfloat16)
        y = self.head(h.to(torch.bfloat16)).float()
        self.head.float()
        return y.mean()


def test_a_gradient_left_in_another_dtype_is_a_one_line_error():
    """A module cast to bf16 and back inside forward leaves bf16 gradients on fp32 parameters: the real step fails
    at opt.step(), the estimate raised a bare RuntimeError with a traceback."""
    from estimator import estimate
    from estimator.errors import UserError

    with pytest.raises(UserError, match="grad_dtype") as info:
        estimate(_CastsAndBack(), torch.randn(2, 8), device="cpu")
    assert "\n" not in str(info.value)


class _AddrOfTwoDtypes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        v = x.to(torch.bfloat16)
        return torch.addr(self.w, v[0], v[1]).sum()


class _ConvOfTwoDtypes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(8, 8, 3, bias=False)

    def forward(self, x):
        return self.conv(x.to(torch.bfloat16).unsqueeze(-1).expand(-1, -1, 5)).float().sum()


def test_the_same_dtype_check_is_the_real_kernels():
    """addr promotes its dtypes on a real kernel (the check refused a step that runs); a convolution without a bias
    refuses them (the meta kernel checks only with a bias: estimated where the real step fails). Each case's real
    step is run here."""
    from estimator import estimate
    from estimator.errors import UserError

    x = torch.randn(2, 8)
    _AddrOfTwoDtypes()(x).backward()
    estimate(_AddrOfTwoDtypes(), x, device="cpu", loss_fn=lambda o: o)
    with pytest.raises(RuntimeError, match="should be the same|expected scalar type"):  # (oneDNN or ATen, by ISA)
        _ConvOfTwoDtypes()(x)
    with pytest.raises(UserError, match="convolution.default: input, weight must have the same dtype"):
        estimate(_ConvOfTwoDtypes(), x, device="cpu", loss_fn=lambda o: o)


class _TwoDtypeOp(torch.nn.Module):
    """An fp32 layer whose output meets a bf16 tensor in ``how``'s op (the dtypes a bf16 model's loss, or a mixture
    of experts summing fp32 outputs into a bf16 buffer under autocast, brings together)."""

    def __init__(self, how):
        super().__init__()
        self.how, self.lin = how, torch.nn.Linear(4, 4)

    def forward(self, x, idx):
        h = self.lin(x)  # (6, 4) fp32
        b = h.detach().to(torch.bfloat16)
        F = torch.nn.functional
        out = {
            "index_add": lambda: torch.zeros_like(b).index_add(0, idx, h),
            "index_reduce": lambda: torch.zeros_like(b).index_reduce_(0, idx, h, "amax"),
            "put": lambda: torch.zeros_like(b).put_(idx, h[:, 0]),
            "binary_cross_entropy": lambda: F.binary_cross_entropy(torch.sigmoid(b), torch.sigmoid(h)),
            "nll_loss": lambda: F.cross_entropy(b, idx % 4, weight=h.detach()[0].abs()),
            "grid_sampler": lambda: F.grid_sample(b[None, None], h.tanh()[None, :, :2, None].expand(1, 6, 2, 2)
                                                  .contiguous(), align_corners=False),
            "linalg_cross": lambda: torch.linalg.cross(b[:, :3], h[:, :3]),
        }[self.how]()
        return out.float().sum() + h.sum()


@pytest.mark.parametrize("how", ["index_add", "index_reduce", "put", "binary_cross_entropy", "nll_loss",
                                 "grid_sampler", "linalg_cross"])
def test_ops_whose_real_kernels_refuse_two_dtypes_fail_as_they_do(how):
    """Structured kernels whose C++ meta checks the source's dtype (index_add, index_reduce, put) and kernels of
    TensorIterator's common dtype (binary cross-entropy's target, the class weights of nll_loss, grid_sample's grid,
    cross): the Python meta kernels take two dtypes, so a step that fails for real was estimated. Each real step is
    run here and fails; the estimate fails in one line naming the op."""
    from estimator import estimate
    from estimator.errors import UserError

    x, idx = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    with pytest.raises(RuntimeError):
        _TwoDtypeOp(how)(x, idx).backward()
    op = {"nll_loss": "nll_loss_forward", "grid_sampler": "grid_sampler_2d"}.get(how, how)
    with pytest.raises(UserError, match=rf"aten\.{op}_?\.default: .*same") as info:
        estimate(_TwoDtypeOp(how), (x, idx), device="cpu", loss_fn=lambda o: o)
    assert "\n" not in str(info.value)


class _Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 10)

    def forward(self, x, target):
        return torch.nn.functional.cross_entropy(self.lin(x), target)


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8])
def test_the_losss_target_dtype_is_the_kernels(dtype):
    """nll_loss takes Long or Byte targets: int32 ids as targets fail for real and were estimated; uint8 ones run for
    real and were refused (the fake kernel is a decomposition indexing with gather and scatter, which refuse uint8).
    Each real step is run here (its peaks by the live tracker)."""
    from livetracker import measure_peaks

    from estimator import estimate
    from estimator.errors import UserError

    torch.manual_seed(0)
    x, target = torch.randn(4, 8), torch.tensor([1, 5, 9, 0], dtype=dtype)
    if dtype == torch.int32:
        with pytest.raises(RuntimeError, match="expected target dtype to be Long or Byte"):
            _Classifier()(x, target).backward()
        with pytest.raises(UserError, match="nll_loss_forward.default: expected target dtype to be Long or Byte"):
            estimate(_Classifier(), (x, target), device="cpu", loss_fn=lambda o: o)
        return
    first, steady = measure_peaks(_Classifier(), (x, target), lambda p: torch.optim.AdamW(p, lr=1e-3), lambda o: o)
    report = estimate(_Classifier(), (x, target), device="cpu", loss_fn=lambda o: o)
    assert (report.memory.peak_first_step, report.memory.peak) == (first, steady)


def test_a_data_parallel_engine_inside_the_model_is_refused_in_one_line(tmp_path):
    """DDP around a submodule was estimated without its gradient buckets (peak -16.6 % of a real step's); only the
    root was checked. A 1-rank gloo group makes the wrapper."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from estimator import estimate
    from estimator.errors import UserError

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        outer = torch.nn.Sequential(torch.nn.Linear(8, 8), DistributedDataParallel(torch.nn.Linear(8, 8)))
        with pytest.raises(UserError, match="its module 1 is wrapped by DistributedDataParallel"):
            estimate(outer, torch.randn(2, 8), device="cpu")
    finally:
        dist.destroy_process_group()

"""Peak memory: the lifetime simulation against a live-tensor tracker on a real CPU step.

Ground truth is measured in the same run (``livetracker.measure_peaks``) on a real
training loop; the estimate comes from fake tensors. Targets (issue: memory
simulation): steady-state and first-step peaks within 1 %, fp32 and bf16-mixed.
"""

from __future__ import annotations

import copy

import pytest
import torch

import groundtruth
import zoo
from livetracker import measure_peaks

from estimator import estimate
from estimator.memory import CUDA_BLOCK, round_cuda

# lstm: nn.LSTM on CPU runs oneDNN's mkldnn_rnn_layer, whose workspace (86,016 B for the zoo's
# 10x4x24 layer) the meta kernel reports as 0 bytes; the capture measures it on the CPU kernel.
CASES = ["cruncher", "mlp", "vgg", "gpt", "lstm", "mobilenet", "tied", "frozen", "bags", "transposed_grads", "packed_lstm", "checkpoint_reentrant",
         "checkpoint_nonreentrant", "dict_inputs", "hf_gpt2", "hf_llama_sdpa", "hf_bert"]


def _case(name):
    if name in zoo.HF:
        pytest.importorskip("transformers")
    return zoo.ZOO[name]()


def _truth(name, precision="fp32", train=True):
    model, inputs, loss_fn = _case(name)
    dtype = torch.bfloat16 if precision == "bf16-mixed" else None
    if dtype is not None and any(isinstance(m, torch.nn.RNNBase) for m in model.modules()) \
            and not _cpu_runs_bf16_lstm():
        pytest.skip("this CPU's oneDNN has no bf16 LSTM kernel (no AVX-512 BF16): no ground truth to measure")
    return measure_peaks(copy.deepcopy(model), inputs, lambda p: torch.optim.AdamW(p, lr=1e-3),
                         lambda out: groundtruth._loss(out, loss_fn), autocast_dtype=dtype, train=train)


def _cpu_runs_bf16_lstm() -> bool:
    """Whether this CPU runs the bf16 oneDNN LSTM kernel that autocast picks (some CPUs cannot)."""
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.nn.LSTM(4, 4)(torch.randn(2, 1, 4))
        return True
    except RuntimeError:
        return False


def _peaks(model, inputs) -> tuple[tuple[int, int], tuple[int, int]]:
    """(steady-state, first-step) peaks of the CPU estimate and of a real step's live tracker (AdamW; the
    model returns its loss)."""
    first, steady = measure_peaks(copy.deepcopy(model), inputs, lambda p: torch.optim.AdamW(p, lr=1e-3), lambda o: o)
    mem = estimate(model, inputs, loss_fn=lambda o: o, device="cpu").memory
    return (mem.peak, mem.peak_first_step), (steady, first)


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
@pytest.mark.parametrize("name", CASES)
def test_peak_matches_live_tracker(name, precision):
    model, inputs, loss_fn = _case(name)
    first, steady = _truth(name, precision)
    report = estimate(model, inputs, optimizer="adamw", loss_fn=loss_fn, device="cpu", precision=precision)
    mem = report.to_dict()["memory"]
    assert mem["peak"] == pytest.approx(steady, rel=0.01), (mem["peak"], steady)
    assert mem["peak_first_step"] == pytest.approx(first, rel=0.01), (mem["peak_first_step"], first)


@pytest.mark.parametrize("name", ["mlp", "gpt", "vgg"])
def test_inference_peak(name):
    model, inputs, loss_fn = _case(name)
    truth = _truth(name, train=False)[-1]
    report = estimate(model, inputs, loss_fn=loss_fn, device="cpu", mode="inference")
    d = report.to_dict()
    assert d["memory"]["peak"] == pytest.approx(truth, rel=0.01)
    assert d["memory"]["activations"] == 0  # nothing saved under no_grad


def test_peak_is_more_than_any_component_and_breakdown_sums():
    model, inputs, loss_fn = _case("gpt")
    mem = estimate(model, inputs, device="cpu").to_dict()["memory"]
    assert sum(mem["peak_breakdown"].values()) == mem["peak"]
    assert mem["peak"] >= mem["parameters"] + mem["optimizer_state"]
    assert mem["peak_phase"] in ("forward", "loss", "backward", "optimizer")


def test_cuda_rounding_to_allocator_blocks():
    # Each allocation is rounded up to a multiple of 512 bytes (c10 CUDACachingAllocator kMinBlockSize).
    assert round_cuda(1) == CUDA_BLOCK and round_cuda(512) == 512 and round_cuda(513) == 1024 and round_cuda(0) == 0
    model, inputs, loss_fn = _case("cruncher")  # matmuls only: the CUDA kernels are the CPU's
    cpu = estimate(model, inputs, device="cpu").to_dict()["memory"]
    cuda = estimate(model, inputs, device="cuda").to_dict()["memory"]
    # rounding only adds, and the cuBLAS workspaces (forward thread, autograd's thread) are in the peak
    assert cuda["peak"] >= cpu["peak"] + sum(cuda["workspaces"].values())
    assert set(cuda["workspaces"]) == {"cuBLAS workspace (main thread)", "cuBLAS workspace (autograd thread)"}
    assert set(cuda["reserve"]) == {"cuda_context", "fragmentation"}


def test_checkpoint_what_if_saves_memory_and_adds_flops():
    model, inputs, loss_fn = _case("gpt")
    base = estimate(model, inputs, device="cpu", optimizer="sgd")
    what_if = estimate(model, inputs, device="cpu", optimizer="sgd", checkpoint=zoo.Block)
    c = what_if.to_dict()["checkpoint"]
    assert c["classes"] == ["Block"]
    # Backward recomputes each Block's forward, up to the last tensor backward needs (non-reentrant
    # checkpoint stops early), so it adds at most the Blocks' forward FLOPs; exact recompute FLOPs
    # are checked against FlopCounterMode in test_accuracy's checkpoint cases.
    block_fwd = sum(m.flops_forward for path, m in base.tally.modules.items() if path.startswith("blocks."))
    assert 0 < c["flops_added"] <= block_fwd
    assert c["peak_saved"] > 0


def test_timeline_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from estimator.render import plot

    model, inputs, loss_fn = _case("mlp")
    report = estimate(model, inputs, device="cpu")
    phases = {p.phase for p in report.memory.timeline}
    assert {"forward", "backward", "optimizer"} <= phases
    out = tmp_path / "mem.png"
    plot(report.memory, str(out))
    assert out.stat().st_size > 1000


def test_fp8_what_if_moves_linear_matmuls_and_halves_their_saved_inputs():
    model, inputs, loss_fn = _case("gpt")
    mixed = estimate(model, inputs, device="cpu", precision="bf16-mixed")
    fp8 = estimate(model, inputs, device="cpu", precision="fp8")
    fm, f8 = mixed.to_dict(), fp8.to_dict()
    # Same trace, same FLOPs: only their dtype changes.
    assert sum(f8["flops"]["by_dtype"].values()) == sum(fm["flops"]["by_dtype"].values())
    # The E4M3 forward FLOPs are the forward matmul FLOPs of the Linear modules (this run's tally).
    linear_fwd = sum(m.matmul_forward for m in mixed.tally.modules.values() if m.type == "Linear")
    linear_bwd = sum(m.matmul_backward for m in mixed.tally.modules.values() if m.type == "Linear")
    assert f8["flops"]["by_dtype"]["float8_e4m3fn"] == linear_fwd > 0
    assert f8["flops"]["by_dtype"]["float8_e5m2"] == linear_bwd > 0
    # Saved linear inputs are 1-byte copies: fewer activation bytes, and the per-dtype split adds up.
    assert f8["memory"]["activations"] < fm["memory"]["activations"]
    assert sum(f8["memory"]["by_dtype"]["activations"].values()) == f8["memory"]["activations"]
    assert f8["memory"]["peak"] <= fm["memory"]["peak"]


class _Outputs(torch.utils._python_dispatch.TorchDispatchMode):
    """The strides and dtypes of every op's tensor outputs in a real CPU step, by op (first call of each)."""

    def __init__(self):
        super().__init__()
        self.strides: dict[str, list] = {}
        self.dtypes: dict[str, list] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        self.strides.setdefault(str(func), [tuple(o.stride()) for o in outs])
        self.dtypes.setdefault(str(func), [o.dtype for o in outs])
        return out


@pytest.mark.parametrize("op", ["aten.native_layer_norm_backward.default", "aten.native_batch_norm_backward.default",
                                "aten._log_softmax_backward_data.default", "aten.mse_loss_backward.default"])
def test_gradient_layouts_match_the_cpu_kernels(op):
    """A transposed gradient into a norm's or loss's backward: the captured grad_input has the strides
    the CPU kernel gives it in a real step (contiguous; batch norm: the input's memory format), where
    the fake kernels follow the gradient's layout, so that a later view copies in the estimate only."""
    model, inputs, loss_fn = zoo.transposed_grads()
    real = _Outputs()
    m = copy.deepcopy(model)
    with real:
        loss = m(inputs)
        loss.backward()
    report = estimate(model, inputs, loss_fn=loss_fn, device="cpu")
    node = next(n for n in report.graph.nodes if str(n.target) == op)
    assert [tuple(s) for s in node.meta["stride"][:1]] == real.strides[op][:1]
    assert real.strides[op][0] == torch.empty(node.meta["spec"][0].shape).stride()  # they are contiguous here


def test_a_pooler_over_a_layer_norm_keeps_the_real_peak():
    """Swin's pooler: a residual block, a LayerNorm, then an average over tokens through a transpose.  The
    transposed gradient into the LayerNorm's backward made a transposed grad_input in the fake
    kernel, and the residual branch's Linear backward copied it (one (B, L, d) tensor more at the peak
    than the real step: 3.5 % here)."""
    class Pooled(torch.nn.Module):
        def __init__(self, d: int = 24):
            super().__init__()
            self.proj, self.ln1, self.ln = torch.nn.Linear(d, d), torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.fc, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

        def forward(self, x):  # (B, L, d)
            h0 = self.proj(x)
            h = self.ln(h0 + self.fc2(torch.nn.functional.gelu(self.fc(self.ln1(h0)))))
            return h.transpose(1, 2).mean(-1).pow(2).mean()  # AdaptiveAvgPool1d(1) over tokens

    torch.manual_seed(0)
    model, x = Pooled(), torch.randn(4, 16, 24)
    estimated, real = _peaks(model, (x,))
    assert estimated == real


@pytest.mark.parametrize("loss", ["mse_loss", "smooth_l1_loss", "soft_margin_loss", "binary_cross_entropy",
                                  "huber_loss", "l1_loss"])
def test_a_reduced_loss_holds_the_storage_its_kernel_keeps(loss):
    """mse, smooth L1, soft margin and binary cross-entropy reduce into their elementwise output and
    resize it to 0-d, keeping its storage (the size of the input) as long as the loss lives; Huber and
    L1 return a new 0-d tensor.  The peaks match a real step either way."""
    import torch.nn.functional as F

    class Regress(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(24, 24)

        def forward(self, x):
            h = self.proj(x)
            if loss == "binary_cross_entropy":
                return F.binary_cross_entropy(torch.sigmoid(h), torch.sigmoid(x * 2))
            return getattr(F, loss)(h, x * 2)  # a target computed in the step, saved for backward

    torch.manual_seed(0)
    model, x = Regress(), torch.randn(4, 16, 24)
    estimated, real = _peaks(model, (x,))
    assert estimated == real


def test_norm_statistics_keep_float32_under_autocast():
    """Layer, group and batch norm of a bf16 input with float32 weights (CPU autocast) save float32 means
    and inverse deviations (ATen's mixed-type norms), which the fake kernels made bf16: the captured
    dtypes are the real step's."""

    class Norms(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3)
            self.gn, self.bn, self.ln = torch.nn.GroupNorm(2, 8), torch.nn.BatchNorm2d(8), torch.nn.LayerNorm(8)

        def forward(self, x):
            h = self.bn(self.gn(self.conv(x)))  # the conv runs in bf16 under autocast
            return self.ln(h.permute(0, 2, 3, 1).to(torch.bfloat16)).float().pow(2).mean()

    torch.manual_seed(0)
    model, x = Norms(), torch.randn(2, 3, 10, 10)
    real = _Outputs()
    with real, torch.autocast("cpu", dtype=torch.bfloat16):
        copy.deepcopy(model)(x)
    report = estimate(model, (x,), loss_fn=lambda o: o, device="cpu", precision="bf16-mixed")
    checked = 0
    for node in report.graph.nodes:
        op = str(node.target)
        if node.op == "call_function" and op in real.dtypes and "norm" in op and node.meta.get("phase") == "forward":
            assert [s.dtype for s in node.meta["spec"]] == real.dtypes[op], op
            checked += 1
    assert checked >= 3  # group, batch and layer norm


def test_group_norm_gradient_of_a_bf16_input_is_bf16_under_autocast():
    """Group norm of a bf16 input with float32 weights (CPU autocast leaves it in bf16): ATen allocates the input's
    gradient like the input (``empty_like(X)``), bf16, where the fake kernel made it float32 (UniSpeech's feature
    encoder in bf16-mixed: +3,223,552 B at the steady peak).  Truth: every backward output's dtype in a real step,
    and the peaks of two real steps under the live tracker."""

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.gn = torch.nn.Conv1d(1, 64, 10, stride=5), torch.nn.GroupNorm(64, 64)
            self.lin = torch.nn.Linear(64, 8)

        def forward(self, x):  # x: (B, T)
            h = torch.nn.functional.gelu(self.gn(self.conv(x[:, None])))  # the conv in bf16 under autocast
            return self.lin(h.transpose(1, 2)).float().pow(2).mean()

    torch.manual_seed(0)
    model, x = Encoder(), torch.randn(4, 8000)
    real = _Outputs()
    with real:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = copy.deepcopy(model)(x)
        loss.backward()
    report = estimate(model, (x,), loss_fn=lambda o: o, device="cpu", precision="bf16-mixed")
    op = "aten.native_group_norm_backward.default"
    node = next(n for n in report.graph.nodes if str(n.target) == op)
    assert [s.dtype for s in node.meta["spec"] if s is not None] == [d for d in real.dtypes[op] if d is not None]
    first, steady = measure_peaks(copy.deepcopy(model), x, lambda p: torch.optim.AdamW(p, lr=1e-3), lambda o: o,
                                  autocast_dtype=torch.bfloat16)
    assert (report.memory.peak_first_step, report.memory.peak) == (first, steady)


def test_a_constant_made_in_forward_is_made_again_by_every_step_on_cuda():
    """``torch.tensor(...)`` in the model's code (Megatron-BERT's and BigBird's masks) is traced as a
    constant that exists before the step and that the step frees: the CUDA allocator's second step
    freed it again and stopped with "free of key ... that is not live".  It is the step's own now: the
    peak is that of the same model given the index as an input, up to the constant's one small block."""

    class Masked(torch.nn.Module):
        def __init__(self, given: bool):
            super().__init__()
            self.lin, self.given = torch.nn.Linear(8, 8), given

        def forward(self, x, mask, sel=None):
            sel = sel if self.given else torch.tensor([0, 2])  # a constant index made in forward
            scale = mask[:, sel].eq(1).float().sum()  # integer work on the real mask, then dropped
            return (self.lin(x) * scale).pow(2).mean()

    x, mask = torch.randn(4, 8), torch.ones(4, 3, dtype=torch.long)
    made = estimate(Masked(False), (x, mask), loss_fn=lambda o: o, device="cuda", gpu="H100").memory
    given = estimate(Masked(True), (x, mask, torch.tensor([0, 2])), loss_fn=lambda o: o, device="cuda",
                     gpu="H100").memory
    assert abs(made.peak - given.peak) <= CUDA_BLOCK and abs(made.peak_first_step - given.peak_first_step) <= CUDA_BLOCK


def test_a_packed_sequence_traces_on_fake_tensors_and_runs_cudnn_on_the_cuda_target():
    """pack_padded_sequence wrote its batch sizes through a data pointer, which a fake tensor has not: the
    capture fell back to a real CPU trace (the model materialised, CPU kernels on the CUDA target).  Now
    the fake trace gives the real step's numbers (test_accuracy, the peaks above), and on the CUDA target
    the LSTM over the packed rows is one cuDNN call, as ``_cudnn_impl`` runs a PackedSequence."""
    model, inputs, loss_fn = zoo.packed_lstm()
    assert estimate(model, inputs, loss_fn=loss_fn, device="cpu").capture.fallback_reason is None
    report = estimate(model, inputs, loss_fn=loss_fn, device="cuda")
    assert report.capture.fallback_reason is None
    assert report.to_dict()["kernels"] == {"_cudnn_rnn": 1, "_cudnn_rnn_backward": 1}
    rnn = next(n for n in report.capture.nodes if str(n.target) == "aten._cudnn_rnn.default")
    rows = int(inputs[1].sum())  # one output row per packed input row: 4 + 7 + 2
    assert rnn.meta["spec"][0].shape == (rows, 2 * model.rnn.hidden_size)


def test_a_leaf_made_in_forward_keeps_its_gradient_while_the_loss_lives():
    """wav2vec2's feature encoder sets requires_grad on a view of its input: that leaf's .grad lives as long
    as the graph the kept loss holds, so a steady-state step still has the previous step's one (the steady
    peak was one input short: -0.57 % on a 1-layer wav2vec2)."""

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.lin = torch.nn.Conv1d(1, 8, 5, stride=2), torch.nn.Linear(8, 4)

        def forward(self, x):  # x: (B, T)
            h = x[:, None]  # (B, 1, T): a view of the input, a leaf once it requires grad
            if self.training:
                h.requires_grad = True
            return self.lin(self.conv(h).mean(-1)).pow(2).mean()

    torch.manual_seed(0)
    model, x = Encoder(), torch.randn(4, 400)
    estimated, real = _peaks(model, x)
    assert estimated == real


def test_a_leaf_made_from_zeros_in_forward_lives_with_the_kept_loss_and_its_gradient():
    """A decoder's queries started from zeros with requires_grad (MaskFormer's DETR decoder): a new leaf, not a
    view of anything, that the kept loss's graph holds (AccumulateGrad keeps its variable) with its gradient
    into the next step.  The steady peak had the gradient but not the leaf (-51,200 B on the zoo's MaskFormer,
    its [2, 100, 64] queries, with the output kept and 2 micro-batches accumulated; here one [4, 64, 128] fp32
    leaf, 131,072 B)."""

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(128, 128)

        def forward(self, x):  # x: (B, 64, 128)
            q = torch.zeros_like(x).requires_grad_(self.training)  # a leaf made in forward
            return self.lin(q + x).pow(2).mean() + q.square().mean()

    torch.manual_seed(0)
    model, x = Decoder(), torch.randn(4, 64, 128)
    estimated, real = _peaks(model, x)
    assert estimated == real


def test_packed_lengths_computed_from_the_weights_outputs_fall_back_to_a_real_trace():
    """Lengths computed from what the weights compute are fake in the trace, so the packed rows cannot be
    sized: the fake kernel says it reads values and the capture traces the model on real CPU tensors, with
    the real step's numbers.  Lengths computed from the input's own values (a float input without grad keeps
    its values, see estimator.capture.fake) are known: traced on fake tensors, with the same numbers."""

    class Padded(torch.nn.Module):
        def __init__(self, from_input: bool):
            super().__init__()
            self.proj, self.rnn = torch.nn.Linear(4, 8), torch.nn.GRU(8, 8, batch_first=True)
            self.from_input = from_input

        def forward(self, x):  # x: (B, T, 4); all-zero rows are padding
            h = self.proj(x)
            lengths = (x.abs().sum(-1) > 0).sum(-1) if self.from_input else (h.abs().sum(-1) > 0.5).sum(-1)
            packed = torch.nn.utils.rnn.pack_padded_sequence(h, lengths, batch_first=True, enforce_sorted=False)
            return self.rnn(packed)[1].sum()

    torch.manual_seed(0)
    x = torch.randn(3, 5, 4)
    x[1, 3:], x[2, 2:] = 0, 0
    for from_input in (False, True):
        model = Padded(from_input)
        report = estimate(model, x, loss_fn=lambda o: o, device="cpu")
        if from_input:
            assert report.capture.fallback_reason is None
        else:
            assert "_pack_padded_sequence" in report.capture.fallback_reason
        first, steady = measure_peaks(copy.deepcopy(model), x, lambda p: torch.optim.AdamW(p, lr=1e-3), lambda o: o)
        assert (report.memory.peak, report.memory.peak_first_step) == (steady, first)


def test_a_tensor_saved_by_a_node_the_loss_does_not_reach_dies_with_the_forward():
    """Probabilities computed with grad enabled for a metric (softmax saves its output) are saved by a node
    the loss does not reach: the real step frees them when the forward returns; the capture's saved-tensor
    hook kept a reference cycle (node -> tensor -> node) that held them to the end of the step (+ the
    metric's size at the peak; RWKV's last recurrent state: +2.2 % first-step peak)."""

    class WithMetric(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(32, 32)

        def forward(self, x):
            logits = self.lin(x)
            confidence = logits.softmax(-1).amax(-1)  # (B, T): for a metric, not in the loss, then dropped
            return logits.pow(2).mean() + 0 * confidence.numel()

    torch.manual_seed(0)
    model, x = WithMetric(), torch.randn(8, 16, 32)
    estimated, real = _peaks(model, x)
    assert estimated == real


class _Queue(torch.nn.Module):
    """MoCo's queue: a buffer of past keys (32,768 x 64 fp32, 8 MiB; under the 2**24 elements whose values the
    capture keeps) written in place each step, ``bank[p:p+B] = z`` (and in columns, ``bank[:, p:p+B] = z.t()``)."""

    def __init__(self, columns: bool):
        super().__init__()
        self.enc = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
        self.columns, self.p = columns, 0
        self.register_buffer("bank", torch.zeros(64, 32768) if columns else torch.zeros(32768, 64))

    def forward(self, x):
        z = self.enc(x)
        with torch.no_grad():
            b = z.shape[0]
            if self.columns:
                self.bank[:, self.p:self.p + b] = z.t()
            else:
                self.bank[self.p:self.p + b] = z
        return z.pow(2).mean()


@pytest.mark.parametrize("columns", [False, True])
def test_a_computed_value_written_into_a_kept_buffer_is_not_a_copy_of_it(columns):
    """The write went to a fake copy of the buffer (FakeTensorMode converts the real tensor an in-place op mixes
    with fake ones): the peak held the 8 MiB buffer twice, +94 % on a 32 MiB queue.  The write is the buffer's
    storage now: the peaks within 1 % of the real loop's live bytes (the buffer counted as resident)."""
    torch.manual_seed(0)
    model, x = _Queue(columns), torch.randn(256, 32)
    real = measure_peaks(copy.deepcopy(model), x, lambda ps: torch.optim.SGD(ps, lr=0.1), lambda out: out,
                         resident=[])
    est = estimate(model, x, device="cpu", optimizer="sgd")
    assert est.memory.peak == pytest.approx(real[1], rel=0.01), (est.memory.peak, real)
    assert est.memory.peak_first_step == pytest.approx(real[0], rel=0.01), (est.memory.peak_first_step, real)


def test_a_parameter_that_is_a_strided_slice_counts_its_own_bytes():
    """nn.Parameter(torch.randn(32, 96)[:, ::2]): its stand-in kept the slice's strides, so its bytes were the
    strided extent (12,284 where it has 6,144: peak +16 %); a move to the GPU (and a deep copy) makes it compact.
    Truth: the live tracker's peaks on a deep copy, as every test here measures them."""

    class Strided(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(32, 96)[:, ::2])

        def forward(self, x):
            return (x @ self.w).pow(2).mean()

    torch.manual_seed(0)
    model, x = Strided(), torch.randn(16, 32)
    report = estimate(model, x, device="cpu", loss_fn=lambda o: o)
    assert report.tally.parameters_bytes == model.w.numel() * 4
    first, steady = measure_peaks(copy.deepcopy(model), x, lambda p: torch.optim.AdamW(p), lambda o: o)
    assert (report.memory.peak_first_step, report.memory.peak) == (first, steady)
    assert estimate(model, x, loss_fn=lambda o: o).tally.parameters_bytes == model.w.numel() * 4  # (CUDA target)


def test_a_bf16_embedding_bag_sum_takes_atens_fast_path():
    """ATen's CPU EmbeddingBag sums bfloat16 weights on its fast path (no offset2bag), where the meta kernel's test
    names float and half only: a bf16 bag's activations were +44.6 % to +72.7 % over a real step's, its peak
    +2.8 %. Truth: groundtruth's saved tensors and the live tracker's peaks of the real bf16 step."""

    class Bag(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bag, self.head = torch.nn.EmbeddingBag(1000, 16, mode="sum"), torch.nn.Linear(16, 2)

        def forward(self, ids, offsets, weights):
            return self.head(self.bag(ids, offsets, per_sample_weights=weights)).pow(2).mean()

    torch.manual_seed(0)
    ids, offsets = torch.randint(0, 1000, (4096,)), torch.tensor([0, 1000, 2000, 3000])
    model = Bag().to(torch.bfloat16)
    inputs = (ids, offsets, torch.rand(4096, dtype=torch.bfloat16))
    report = estimate(model, inputs, device="cpu", precision="bf16", loss_fn=lambda o: o)
    assert report.tally.activations_bytes == groundtruth.measure(model, inputs, loss_fn=lambda o: o)["activation_bytes"]
    first, steady = measure_peaks(copy.deepcopy(model), inputs, lambda p: torch.optim.AdamW(p), lambda o: o)
    assert (report.memory.peak_first_step, report.memory.peak) == (first, steady)

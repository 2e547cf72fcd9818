"""Target-device kernels on CPU fake tensors: the CUDA target's choices hold on every model shape.

Which kernel CUDA runs for each reference model is checked op by op against real H100 traces in
``tests/test_cuda_reference.py``; here: properties of the choice that follow from
``sdp_utils.cpp`` whatever the shapes, and the CUDA ops reaching the captured graph, forward,
backward and checkpoint recomputation alike.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from estimator import UserError, estimate
from estimator.target import CudaTarget

H100_TORCH_2_11 = CudaTarget(arch=(9, 0), torch=(2, 11))
A100_TORCH_2_11 = CudaTarget(arch=(8, 0), torch=(2, 11))


def _qkv(dtype, d=64, heads=4, kv_heads=4, q_len=32, k_len=32):
    return (torch.empty(2, heads, q_len, d, dtype=dtype, device="meta"),
            torch.empty(2, kv_heads, k_len, d, dtype=dtype, device="meta"),
            torch.empty(2, kv_heads, k_len, d, dtype=dtype, device="meta"))


CASES = list(itertools.product((torch.float32, torch.bfloat16, torch.float16), (6, 12, 64, 128, 320),
                               (False, True), (False, True), (16, 32), (4, 2)))


@pytest.mark.parametrize("target", [H100_TORCH_2_11, A100_TORCH_2_11], ids=["h100", "a100"])
def test_backend_choice_properties(target):
    """Over a grid of shapes: fused kernels never see what sdp_utils rules out for them."""
    for dtype, d, mask, causal, q_len, kv_heads in CASES:
        q, k, v = _qkv(dtype, d, kv_heads=kv_heads, q_len=q_len)
        m = torch.ones(q_len, 32, dtype=dtype, device="meta") if mask else None
        gqa = kv_heads != 4
        backend = target.sdpa_backend(q, k, v, m, 0.0, causal, enable_gqa=gqa)
        if backend in ("flash", "cudnn"):
            assert dtype != torch.float32, (backend, dtype)  # 16-bit only
        if backend == "flash":
            assert m is None and d <= 256 and (q_len == 32 or not causal)
        if backend == "cudnn":
            assert target.arch >= (9, 0) and d % 8 == 0 and d <= 256  # preferred on sm90 only
        if backend == "efficient":
            assert not gqa and d % (8 if dtype != torch.float32 else 4) == 0  # no grouped-query heads
        if gqa and dtype == torch.float32:
            assert backend == "math"  # only flash and cuDNN take grouped-query heads, both 16-bit


def test_a_mask_that_requires_grad_goes_to_the_math_path():
    q, k, v = _qkv(torch.bfloat16)
    bias = torch.zeros(1, 4, 32, 32, dtype=torch.bfloat16, device="meta", requires_grad=True)
    assert H100_TORCH_2_11.sdpa_backend(q, k, v, bias) == "math"
    assert H100_TORCH_2_11.sdpa_backend(q, k, v, bias.detach()) == "cudnn"


def test_backends_turned_off_are_skipped_as_torch_skips_them():
    """torch.nn.attention.sdpa_kernel (or torch.backends.cuda.enable_*_sdp) inside or around the step was ignored
    on the CUDA target: a math-only block was sized with cuDNN's saves. torch's select_sdp_backend skips a backend
    turned off, and with none left that takes the inputs fails ("No available kernel")."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = _qkv(torch.bfloat16)
    assert H100_TORCH_2_11.sdpa_backend(q, k, v) == "cudnn"
    for allowed, chosen in ((SDPBackend.MATH, "math"), (SDPBackend.FLASH_ATTENTION, "flash"),
                            (SDPBackend.EFFICIENT_ATTENTION, "efficient"), (SDPBackend.CUDNN_ATTENTION, "cudnn")):
        with sdpa_kernel(allowed):
            assert H100_TORCH_2_11.sdpa_backend(q, k, v) == chosen
    q32, k32, v32 = _qkv(torch.float32)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), pytest.raises(UserError, match="No available kernel.*flash"):
        H100_TORCH_2_11.sdpa_backend(q32, k32, v32)  # (flash takes 16-bit inputs only)
    assert H100_TORCH_2_11.sdpa_backend(q, k, v) == "cudnn"  # (the flags restored on exit)


class Attn(torch.nn.Module):
    def __init__(self, d=64, masked=False):
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.masked = masked

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 4, C // 4).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, hs)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril() if self.masked else None
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=not self.masked)  # (B, H, T, hs)
        return y.transpose(1, 2).reshape(B, T, C)


def _attention_ops(report):
    return {str(n.target.overloadpacket).removeprefix("aten.") for n in report.capture.nodes
            if "attention" in str(n.target)}


@pytest.mark.parametrize("gpu,precision,masked,forward_op", [
    ("H100", "bf16-mixed", False, "_scaled_dot_product_cudnn_attention"),
    ("A100-80GB", "bf16-mixed", False, "_scaled_dot_product_flash_attention"),
    ("H100", "fp32", False, "_scaled_dot_product_efficient_attention"),
    ("A100-80GB", "bf16-mixed", True, "_scaled_dot_product_efficient_attention"),  # flash takes no mask
])
def test_cuda_target_records_the_cuda_kernels(gpu, precision, masked, forward_op):
    x = torch.randn(2, 32, 64)
    report = estimate(Attn(masked=masked), x, device="cuda", precision=precision, gpu=gpu, cuda_torch="2.11")
    assert _attention_ops(report) == {forward_op, forward_op + "_backward"}
    cpu = estimate(Attn(masked=masked), x, device="cpu", precision=precision)
    assert _attention_ops(cpu) == {"_scaled_dot_product_flash_attention_for_cpu",
                                   "_scaled_dot_product_flash_attention_for_cpu_backward"}
    # The attention FLOPs do not depend on the kernel (torch's sdpa formulas).
    assert report.tally.flops["matmul_forward"] == cpu.tally.flops["matmul_forward"]


@pytest.mark.parametrize("release,forward_op", [("2.11", "_scaled_dot_product_cudnn_attention"),
                                                ("2.6", "_scaled_dot_product_flash_attention")])
def test_the_torch_release_that_runs_the_step_picks_the_attention_kernel(release, forward_op):
    """``cuda_torch`` (``--cuda-torch``) in estimate and in the planner: torch 2.11's wheel ships cuDNN 9.19, so
    an H100 runs cuDNN's attention (``check_prefer_cudnn_attention``: cuDNN > 9.15); 2.6's ships 9.1, so flash
    (timed at its own measured efficiency, estimator/timing/attention.py)."""
    from estimator.plan import Planner

    x = torch.randn(2, 32, 64)
    report = estimate(Attn(), x, device="cuda", precision="bf16-mixed", gpu="H100", cuda_torch=release)
    assert _attention_ops(report) == {forward_op, forward_op + "_backward"}
    assert f"(torch {release}'s choice; --cuda-torch for another release)" in " ".join(report.render().split())
    planner = Planner(Attn(), x, gpu="H100", precision="bf16-mixed", cuda_torch=release)
    assert planner.options.cuda.torch == tuple(int(v) for v in release.split("."))


def test_math_backend_saves_the_attention_matrix():
    # fp32 with head dim 6: CUDA falls back to math, which saves the (B, H, T, T) probabilities.
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(24, 72)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.proj(x).view(B, T, 3, 4, 6).permute(2, 0, 3, 1, 4)  # 3 x (B, 4, T, 6)
            return F.scaled_dot_product_attention(q, k, v)

    x = torch.randn(2, 64, 24)
    saved = lambda r: sorted(nbytes for nbytes, _ in r.capture.saved.values())  # noqa: E731
    cuda, cpu = estimate(Odd(), x, device="cuda"), estimate(Odd(), x, device="cpu")
    probs = 2 * 4 * 64 * 64 * 4  # B * H * T * T fp32 bytes
    assert probs in saved(cuda) and probs not in saved(cpu)
    assert "_safe_softmax" in {str(n.target.overloadpacket).removeprefix("aten.") for n in cuda.capture.nodes}


def test_checkpointed_regions_use_the_same_kernels_in_recomputation():
    # The CUDA kernels are installed at the dispatcher, so autograd's recomputation of a checkpointed
    # region (which runs without torch-function modes) takes them too: a model that checkpoints by
    # itself and the --checkpoint what-if both trace on fake tensors with the CUDA kernels.
    from torch.utils.checkpoint import checkpoint

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = Attn(), Attn()

        def forward(self, x):
            return checkpoint(self.b, checkpoint(self.a, x, use_reentrant=False), use_reentrant=False)

    x = torch.randn(2, 32, 64)
    what_if = estimate(torch.nn.Sequential(Attn(), Attn()), x, device="cuda", precision="bf16-mixed",
                       checkpoint=Attn, trace="fake")
    assert what_if.checkpoint.flops_added > 0
    own = estimate(Outer(), x, device="cuda", trace="fake")
    assert own.capture.mode == "fake" and own.capture.fallback_reason is None
    ops = [str(n.target.overloadpacket).removeprefix("aten.") for n in own.capture.nodes if "attention" in str(n.target)]
    # each region: forward, recomputation in backward, then its backward
    assert ops.count("_scaled_dot_product_efficient_attention") == 4
    assert ops.count("_scaled_dot_product_efficient_attention_backward") == 2


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_outputs_have_the_cuda_kernels_sizes(mode):
    """``_embedding_bag`` on the CUDA target makes what PyTorch's own meta kernel says the CUDA kernel
    makes (its non-CPU branch, taken for meta offsets): an index per input index in ``offset2bag``
    in every mode (the CPU kernel skips it for plain sums), where the capture's integer inputs are
    real CPU tensors and would take the CPU branch."""
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(30, 8, mode=mode)
    ids, offsets = torch.randint(0, 30, (11,)), torch.tensor([0, 4, 7])
    report = estimate(bag, (ids, offsets), loss_fn=lambda out: out.sum(), device="cuda")
    node = next(n for n in report.graph.nodes if n.target is torch.ops.aten._embedding_bag.default)
    expected = torch.ops.aten._embedding_bag(bag.weight.to("meta"), ids.to("meta"), offsets.to("meta"), False,
                                             {"sum": 0, "mean": 1, "max": 2}[mode])
    assert [(s.shape, s.dtype) for s in node.meta["spec"]] == [(tuple(t.shape), t.dtype) for t in expected]
    assert node.meta["spec"][1].shape == (11,)  # offset2bag: one per index, sums included


def _fp32_region(device_type):
    class KeepsOneLayerFp32(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(256, 256), torch.nn.Linear(256, 256)

        def forward(self, x):
            h = self.a(x)
            with torch.autocast(device_type, enabled=False):
                return self.b(h.float()).pow(2).mean()

    return KeepsOneLayerFp32()


class _Fp32Matmul(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w.t()

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w, g.t() @ x


def test_the_models_own_cuda_autocast_is_the_traces_on_the_cuda_target():
    """A CUDA-target trace runs CUDA's autocast on the CPU's keys: the model's autocast("cuda", enabled=False)
    region was counted in bf16 (60 % of the step's matmul FLOPs), and custom_fwd(device_type="cuda",
    cast_inputs=torch.float32) left its inputs in bf16 (the backward's matmul of two dtypes refused, where a GPU runs
    it). The CUDA target now splits the FLOPs as the CPU target does on the same model written for the CPU (a real
    CPU bf16-mixed step counted by operand dtype: 16,777,216 bf16 and 25,165,824 fp32 matmul FLOPs, the CPU
    target's matmuls exactly)."""
    torch.manual_seed(0)
    x = torch.randn(64, 256)
    cuda = estimate(_fp32_region("cuda"), x, precision="bf16-mixed", gpu="H100", loss_fn=lambda o: o).tally
    cpu = estimate(_fp32_region("cpu"), x, precision="bf16-mixed", device="cpu", loss_fn=lambda o: o).tally
    assert cuda.flops_by_dtype == cpu.flops_by_dtype and cuda.flops_by_dtype.get("float32", 0) > 0

    class WithFunction(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.w = torch.nn.Linear(64, 64), torch.nn.Parameter(torch.randn(32, 64))

        def forward(self, x):
            return _Fp32Matmul.apply(self.lin(x), self.w).float().pow(2).mean()

    report = estimate(WithFunction(), torch.randn(16, 64), precision="bf16-mixed", gpu="H100", loss_fn=lambda o: o)
    assert report.tally.flops_by_dtype.get("float32", 0) > 0
    assert not torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == torch.float16

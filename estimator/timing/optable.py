"""Which kind of kernel each aten op is: the op tables of the step-time model.

Kinds: ``matmul`` (cuBLAS GEMMs), ``conv`` (cuDNN convolutions), ``attention`` (fused SDPA
kernels by backend), ``rnn`` (cuDNN recurrent layers), ``memory`` (every other kernel:
bandwidth-bound, in four classes by how close it streams at the bandwidth), and the kinds with
no kernel: ``view`` (views, metadata, allocation without a fill), ``host`` (host-side work) and
``sync`` (a device -> host read that waits for the GPU).  Names are aten op names without the
``aten.`` prefix and the overload.
"""

from __future__ import annotations

from ..rules.zero import VIEWS

# -- kinds of work ---------------------------------------------------------------------

MATMUL = "matmul"  # cuBLAS GEMMs: mm, addmm, bmm, baddbmm, _grouped_mm
CONV = "conv"  # cuDNN convolutions, forward and backward
ATTENTION = "attention"  # fused SDPA kernels (cudnn, efficient, flash), forward and backward
RNN = "rnn"  # cuDNN recurrent layers
MEMORY = "memory"  # every other kernel: bandwidth-bound
VIEW = "view"  # views, metadata, allocation without a kernel: host time only
HOST = "host"  # host-side work with no kernel (the optimizer's scalar reads, profiler records)
SYNC = "sync"  # reads a GPU value on the host: waits for the GPU
KINDS = (MATMUL, CONV, ATTENTION, RNN, MEMORY, VIEW, HOST, SYNC)
COMPUTE_KINDS = (MATMUL, CONV, ATTENTION, RNN)
NO_KERNEL = (VIEW, HOST, SYNC)

PHASES = ("forward", "backward", "optimizer")

# -- op tables (names without the "aten." prefix and the overload) ---------------------------

MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "_grouped_mm", "_addmm_activation", "_scaled_mm",
                         "_int_mm", "addbmm"})
CONV_OPS = frozenset({"convolution", "_convolution", "cudnn_convolution", "cudnn_convolution_transpose",
                       "convolution_overrideable"})
CONV_BACKWARD_OPS = frozenset({"convolution_backward", "convolution_backward_overrideable"})
# SDPA kernels: op -> (backend, is_backward, layout of q/k/v: "bhsd" or "bshd")
ATTENTION_OPS = {
    "_scaled_dot_product_cudnn_attention": ("cudnn", False, "bhsd"),
    "_scaled_dot_product_cudnn_attention_backward": ("cudnn", True, "bhsd"),
    "_scaled_dot_product_efficient_attention": ("efficient", False, "bhsd"),
    "_scaled_dot_product_efficient_attention_backward": ("efficient", True, "bhsd"),
    "_efficient_attention_forward": ("efficient", False, "bshd"),
    "_efficient_attention_backward": ("efficient", True, "bshd"),
    "_scaled_dot_product_flash_attention": ("flash", False, "bhsd"),
    "_scaled_dot_product_flash_attention_backward": ("flash", True, "bhsd"),
    "_flash_attention_forward": ("flash", False, "bshd"),
    "_flash_attention_backward": ("flash", True, "bshd"),
    # what the capture records when SDPA runs the CPU kernel: timed as the flash kernel it stands for
    "_scaled_dot_product_flash_attention_for_cpu": ("flash", False, "bhsd"),
    "_scaled_dot_product_flash_attention_for_cpu_backward": ("flash", True, "bhsd"),
}
RNN_OPS = frozenset({"_cudnn_rnn", "_cudnn_rnn_backward", "mkldnn_rnn_layer", "mkldnn_rnn_layer_backward"})
# ops with no kernel: views and metadata (rules/zero.py's list), allocation without a fill,
# profiler records
VIEW_OPS = frozenset(VIEWS) | frozenset({
    "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
    "_record_function_enter", "_record_function_enter_new", "_record_function_exit", "_assert_async",
    "_assert_scalar", "_assert_tensor_metadata", "record_stream", "_version", "is_same_size",
})
# ops whose result the host reads (a device -> host copy and a wait)
SYNC_OPS = frozenset({"_local_scalar_dense", "item", "nonzero", "masked_select", "unique", "_unique",
                       "_unique2", "unique_consecutive", "unique_dim", "is_nonzero", "equal"})
# cuDNN calls besides the compute kinds (host: descriptor set-up and plan lookup)
LIBRARY_OPS = frozenset({"cudnn_batch_norm", "cudnn_batch_norm_backward"})
# kernels per call where more than one (launch floor); foreach ops: see foreach_launches
LAUNCHES = {
    "native_layer_norm_backward": 2, "native_batch_norm_backward": 2, "cudnn_batch_norm_backward": 2,
    "native_group_norm_backward": 2, "_fused_rms_norm_backward": 2, "embedding_dense_backward": 3,
    "nll_loss_backward": 2, "sort": 2, "topk": 2, "index_put": 2, "_index_put_impl_": 2,
}
# memory-bound kernels by how close they stream at the bandwidth: "elementwise" (one pass, the
# reference), "reduction" (reductions, softmax, losses, pooling, scatters and sorts: a reduction
# tree or atomics), "norm" (fused normalisations' forward: layer/RMS/group norm, cuDNN batch norm),
# "norm_backward" (their backward: two passes over the input and the gradient, and per-channel
# reductions for the affine weights), "batch_norm_native" (ATen's own batch norm kernels, what autocast runs for bf16
# inputs with fp32 weights: per-channel reductions over N*H*W), "loss_backward" (the cross-entropy's
# backward over [tokens, vocabulary]: nll_loss_backward fills the gradient with zeros and scatters one
# value per row, _log_softmax_backward_data one read-reduce-write pass), and two elementwise kinds
# that stream slower than a plain elementwise kernel: "cast_widen" (a cast to a wider float, bf16/fp16
# -> fp32: ATen vectorises by the wider type, so the narrow loads are half-width) and "foreach_new"
# (a foreach op that writes new tensors, e.g. AdamW's _foreach_sqrt, instead of updating in place).
# Measured on the H100 (tests/data/cuda_reference, benchmarks/README.md): with these in the plain
# classes the widening casts read 0.64x, out-of-place foreach 0.3-0.6x, layer norm forward 1.27x and
# backward 0.83x, the loss's backward 1.4-2.0x their measured times.  cuDNN's batch norm in a class of
# its own was tried and dropped: its only timed ops outside ResNet-50 are MobileNet's few (stalled)
# ones, and ResNet-50 held out went from 1.17x to 1.48x.
NORM_OPS = ("native_layer_norm", "cudnn_batch_norm", "native_group_norm", "_fused_rms_norm", "miopen_batch_norm")
MEMORY_CLASS = {
    **{op: "reduction" for op in (
        "sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "std", "std_mean", "norm",
        "linalg_vector_norm", "prod", "logsumexp", "argmax", "argmin", "all", "any", "_softmax", "_log_softmax",
        "_safe_softmax", "_softmax_backward_data", "nll_loss_forward", "nll_loss2d_forward",
        "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward",
        "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward", "adaptive_max_pool2d", "adaptive_max_pool2d_backward",
        "cumsum", "sort", "topk", "embedding_dense_backward", "index_put", "_index_put_impl_", "scatter_add",
        "index_add", "histc", "bincount", "_foreach_norm")},
    **{op: "norm" for op in NORM_OPS},
    **{op + "_backward": "norm_backward" for op in NORM_OPS},
    **{op: "loss_backward" for op in ("nll_loss_backward", "nll_loss2d_backward", "_log_softmax_backward_data")},
    **{op: "batch_norm_native" for op in (
        "native_batch_norm", "native_batch_norm_backward", "_native_batch_norm_legit",
        "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional")},
}
MEMORY_CLASSES = ("elementwise", "reduction", "norm", "batch_norm_native", "norm_backward", "loss_backward",
                  "cast_widen", "foreach_new")
CAST_OPS = frozenset({"_to_copy", "copy_", "to", "_copy_from", "_copy_from_and_resize"})
# gathers: they read the rows they return, not the whole table
GATHER_OPS = frozenset({"embedding", "index", "_unsafe_index", "index_select", "gather", "take",
                         "take_along_dim"})

# multi_tensor_apply (ATen/native/cuda/MultiTensorApply.cuh): tensors per launch by list depth,
# blocks per launch, elements per block
FOREACH_TENSORS = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}
FOREACH_BLOCKS = 320
FOREACH_CHUNK = 65536

TENSOR_CORE_BYTES = 16  # cuBLAS/cuDNN tensor-core kernels want 16-byte aligned leading dimensions

ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4, "int16": 2,
             "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "complex64": 8,
             "complex128": 16, "uint16": 2, "uint32": 4, "uint64": 8}


# tensor lists per foreach op (the scalar-list and scalar overloads have one list fewer than .List)
FOREACH_DEPTH = {
    "_foreach_add": 1, "_foreach_sub": 1, "_foreach_mul": 1, "_foreach_div": 1, "_foreach_sqrt": 1,
    "_foreach_lerp": 2, "_foreach_addcmul": 3, "_foreach_addcdiv": 3, "_foreach_maximum": 1,
    "_foreach_neg": 1, "_foreach_abs": 1, "_foreach_exp": 1, "_foreach_copy": 2, "_foreach_zero": 1,
    "_foreach_norm": 1, "_foreach_pow": 1, "_foreach_sign": 1, "_foreach_clamp_max": 1, "_foreach_clamp_min": 1,
}

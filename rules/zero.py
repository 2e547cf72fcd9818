"""Ops that do no arithmetic: ZERO FLOPs, an explicit list.

An op missing from every list is reported as unsupported, never counted as
zero silently; an op here is one that truly computes nothing:

* views and metadata: results alias their input (view, expand, permute, split...);
* allocation and constants: empty/zeros/ones/full/arange/eye... write no
  computed value (filling with a constant is a store, not a FLOP);
* random generation (rand, randn, normal_, uniform_, bernoulli_...): drawing
  numbers is not arithmetic on data; what a model computes with them is
  counted (dropout's ``x * mask * scale``);
* copies and gathers: clone/copy_/_to_copy (dtype casts included), cat/stack,
  index/gather/index_select, flip/roll/repeat, slice/select scatters, and the
  positional masks tril/triu: data movement, no arithmetic.  The bytes they move
  are memory traffic, accounted as such, not FLOPs;
* bookkeeping: profiler records, asserts, ``_local_scalar_dense`` (``.item()``).

Copies that accumulate (scatter-add, index_put with accumulate) are not here:
see embedding.py.
"""

from __future__ import annotations

import torch

from .registry import aten_ops, register_zero

VIEWS = (
    "view", "_unsafe_view", "reshape", "_reshape_alias", "view_as", "expand", "expand_as", "broadcast_to",
    "permute", "transpose", "transpose_", "t", "t_", "swapaxes", "swapaxes_", "swapdims", "swapdims_",
    "movedim", "moveaxis", "adjoint", "mT", "mH", "numpy_T", "matrix_H",
    "squeeze", "squeeze_", "unsqueeze", "unsqueeze_", "flatten", "unflatten", "ravel",
    "slice", "select", "narrow", "diagonal", "as_strided", "as_strided_", "alias", "detach", "detach_",
    "split", "split_with_sizes", "unsafe_split", "unsafe_split_with_sizes", "tensor_split", "hsplit",
    "vsplit", "dsplit", "unbind", "chunk", "unsafe_chunk", "unfold",
    "view_as_real", "view_as_complex", "real", "imag", "_neg_view", "_conj", "conj", "resolve_conj",
    "resolve_neg", "positive", "lift", "lift_fresh", "_indices", "_values", "indices", "values",
    "crow_indices", "col_indices", "ccol_indices", "row_indices", "_nested_view_from_buffer",
    "_nested_view_from_jagged", "_nested_get_values", "_nested_get_offsets", "_nested_get_lengths",
    "set_", "resize_", "resize_as_", "_resize_output_", "_reshape_from_tensor", "_shape_as_tensor",
    "atleast_1d", "atleast_2d", "atleast_3d", "contiguous", "_mkldnn_reshape", "_mkldnn_transpose",
)

COPY_VARIANTS = (  # the *_copy ops: a view materialized as a copy
    "view_copy", "expand_copy", "permute_copy", "transpose_copy", "t_copy", "squeeze_copy",
    "unsqueeze_copy", "slice_copy", "select_copy", "as_strided_copy", "alias_copy", "detach_copy",
    "split_copy", "split_with_sizes_copy", "unbind_copy", "diagonal_copy", "unfold_copy",
    "view_as_real_copy", "view_as_complex_copy", "_reshape_copy", "_reshape_alias_copy",
    "_neg_view_copy", "_conj_copy", "lift_fresh_copy", "narrow_copy", "_nested_view_from_buffer_copy",
    "_nested_view_from_jagged_copy", "_nested_get_values_copy", "_indices_copy", "_values_copy",
    "indices_copy", "values_copy", "crow_indices_copy", "col_indices_copy", "ccol_indices_copy",
    "row_indices_copy", "_fw_primal_copy", "_make_dual_copy",
)

ALLOCATION = (
    "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
    "zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full",
    "scalar_tensor", "arange", "range", "linspace", "logspace", "eye", "tril_indices", "triu_indices",
    "fill", "fill_", "zero", "zero_", "_efficientzerotensor", "_new_zeros_with_same_feature_meta",
    "hann_window", "hamming_window", "blackman_window", "bartlett_window", "kaiser_window",
)

RANDOM = (
    "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like",
    "normal", "normal_", "normal_functional", "uniform", "uniform_", "exponential", "exponential_",
    "geometric", "geometric_", "cauchy", "cauchy_", "log_normal", "log_normal_", "random", "random_",
    "bernoulli", "bernoulli_", "multinomial", "poisson", "binomial", "_standard_gamma", "_sample_dirichlet",
    "_philox_normal", "_philox_uniform", "_philox_normal_", "_philox_uniform_", "_philox_key_split",
    "_philox_key_fold_in", "_fill_mem_eff_dropout_mask_",
)

COPIES = (
    "clone", "copy", "copy_", "_to_copy", "to", "_copy_from", "_copy_from_and_resize", "_lazy_clone",
    "to_dense", "_to_dense", "to_mkldnn", "_to_cpu", "pin_memory", "_pin_memory",
    "complex",  # torch.complex(real, imag): the two interleaved
    "cat", "concat", "concatenate", "_cat", "stack", "_stack", "hstack", "vstack", "dstack",
    "column_stack", "row_stack", "_chunk_cat", "block_diag",
    "index", "_unsafe_index", "_unsafe_masked_index", "index_select", "gather", "take", "take_along_dim",
    "masked_select", "masked_select_backward", "masked_scatter", "masked_scatter_backward",
    "index_copy", "index_fill", "select_scatter", "slice_scatter", "diagonal_scatter", "as_strided_scatter",
    "select_backward", "slice_backward", "diagonal_backward", "_nested_select_backward",
    "flip", "fliplr", "flipud", "roll", "rot90", "repeat", "tile", "repeat_interleave",
    "tril", "tril_", "triu", "triu_", "diag", "diag_embed", "diagflat",
    "one_hot", "_pad_packed_sequence", "_pack_padded_sequence",
    "_jagged_to_padded_dense_forward", "_padded_dense_to_jagged_forward", "_nested_from_padded",
    "_nested_tensor_from_tensor_list", "nested_to_padded_tensor", "to_padded_tensor",
)

BOOKKEEPING = (
    "_local_scalar_dense", "item", "_assert_async", "_assert_scalar", "_functional_assert_async",
    "_functional_assert_scalar", "_assert_tensor_metadata", "sym_constrain_range",
    "sym_constrain_range_for_size", "_functional_sym_constrain_range",
    "_functional_sym_constrain_range_for_size", "_make_dep_token", "record_stream", "_unpack_dual",
    "_make_dual", "_fw_primal", "_has_same_storage_numel", "is_same_size", "_version",
    "_propagate_xla_data", "set_data", "_print", "_linalg_check_errors",
    "promote_types", "result_type", "can_cast",  # dtype queries (autocast-CUDA's promote list asks them)
)

for _names in (VIEWS, COPY_VARIANTS, ALLOCATION, RANDOM, COPIES, BOOKKEEPING):
    register_zero(*aten_ops(*_names))

# prims a torch.compile graph holds (Inductor's decompositions, estimator.capture.compiled): a dtype cast and
# the views the decompositions write as prims
for _name in ("convert_element_type", "iota", "view_of", "broadcast_in_dim", "squeeze", "transpose", "collapse_view",
              "split_dim", "expand_dims", "slice", "slice_in_dim", "as_strided"):
    _op = getattr(getattr(torch.ops.prims, _name, None), "default", None)
    if _op is not None:
        register_zero(_op)

for _name in ("_record_function_enter", "_record_function_enter_new", "_record_function_exit"):
    try:
        register_zero(getattr(torch.ops.profiler, _name))
    except (AttributeError, RuntimeError):  # pragma: no cover - profiler ops absent
        pass

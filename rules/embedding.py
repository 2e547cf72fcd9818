"""Embedding lookups and indexed accumulation (scatter-add family).

A lookup (``embedding``, ``index``, ``gather``...) copies rows: ZERO (here for
``embedding``; the other copies are in zero.py).  Its backward is a scatter-add
of the gradient rows into the table: 1 add per accumulated element.  The same
holds for ``index_add``, ``scatter_add``, ``index_put(accumulate=True)``...: the
accumulating (``reduce``/``accumulate``) forms cost 1 FLOP per source element,
the plain (overwriting) forms are copies and cost 0.
"""

from __future__ import annotations

from math import prod

import torch

from .registry import OTHER, aten_ops, register, register_zero

EMBEDDING_BAG_MAX = 2  # mode: 0 sum, 1 mean, 2 max

# -- math helpers (pure functions of shapes) ---------------------------------


def scatter_add_flops(n_source: int) -> int:
    """One add per source element accumulated into the destination."""
    return n_source


def broadcast_numel(shapes) -> int:
    """Elements of the broadcast of ``shapes``."""
    ndim = max((len(s) for s in shapes), default=0)
    dims = [1] * ndim
    for s in shapes:
        for i, size in enumerate(s, start=ndim - len(s)):
            dims[i] = max(dims[i], size)
    return prod(dims)


def indexed_numel(self_shape, indices, values_numel: int) -> int:
    """Elements addressed by ``self[indices]`` (advanced integer indexing), or ``values_numel``
    when a boolean mask is among the indices (its selection count depends on the data)."""
    tensors = [i for i in indices if i is not None]
    if not tensors or any(t.dtype == torch.bool for t in tensors):
        return values_numel
    # broadcast index shape x the dims left unindexed (None entries and trailing dims)
    free = [size for k, size in enumerate(self_shape) if k >= len(indices) or indices[k] is None]
    return broadcast_numel([t.shape for t in tensors]) * prod(free)


# -- embedding ---------------------------------------------------------------------

register_zero(*aten_ops("embedding"))  # a row gather: copies, no arithmetic


@register(*aten_ops("embedding_dense_backward", "embedding_backward"), kind=OTHER)
def embedding_dense_backward(call):
    """grad.numel (x2 with scale_grad_by_freq): scatter-add of each grad row into its table row."""
    grad = call.get("grad_output")
    grad = grad if grad is not None else call["grad"]
    return scatter_add_flops(grad.numel) * (2 if call["scale_grad_by_freq"] else 1)


@register(*aten_ops("embedding_sparse_backward"), kind=OTHER)
def embedding_sparse_backward(call):
    """grad.numel with scale_grad_by_freq (one scale per element), else 0: the sparse grad is a copy."""
    return call["grad"].numel if call["scale_grad_by_freq"] else 0


@register(*aten_ops("embedding_renorm_", "embedding_renorm"), kind=OTHER)
def embedding_renorm(call):
    """indices.numel * (3D + 2): per looked-up row a p-norm (2D + 1), a test (1), a rescale (D)."""
    d = call["self"].shape[-1]
    return call["indices"].numel * (3 * d + 2)


@register(*aten_ops("_embedding_bag", "_embedding_bag_forward_only"), kind=OTHER)
def embedding_bag(call):
    """indices.numel * D adds (compares for max) (+ as many multiplies with per_sample_weights) + mean: bags * D divides."""
    d = call["weight"].shape[-1]
    rows = call["indices"].numel * d
    flops = rows + (rows if call.get("per_sample_weights") is not None else 0)
    if call["mode"] == 1:  # mean: divide each bag's sum by its size
        flops += call.out.numel
    return flops


@register(*aten_ops("_embedding_bag_backward", "_embedding_bag_dense_backward"), kind=OTHER)
def embedding_bag_backward(call):
    """sum/mean: indices.numel * D adds (+ as many multiplies for mean / per_sample_weights); max: grad.numel adds."""
    grad = call["grad"]
    if call["mode"] == EMBEDDING_BAG_MAX:
        return scatter_add_flops(grad.numel)
    rows = call["indices"].numel * grad.shape[-1]
    scale = int(call["mode"] == 1) + int(call.get("per_sample_weights") is not None)
    return scatter_add_flops(rows) + scale * rows


@register(*aten_ops("_embedding_bag_per_sample_weights_backward"), kind=OTHER)
def embedding_bag_per_sample_weights_backward(call):
    """2 * indices.numel * D: a dot product of each grad row with its weight row."""
    return 2 * call["indices"].numel * call["grad"].shape[-1]


# -- indexed accumulation -----------------------------------------------------------


@register(*aten_ops("index_add"), kind=OTHER)
def index_add(call):
    """source.numel adds (x2 when alpha != 1: alpha * source)."""
    alpha = call.get("alpha", 1)
    scaled = not (alpha is None or (isinstance(alpha, (int, float)) and alpha == 1))
    return scatter_add_flops(call["source"].numel) * (2 if scaled else 1)


@register(*aten_ops("scatter_add", "gather_backward"), kind=OTHER)
def scatter_add(call):
    """index.numel adds: one per scattered element (gather_backward: grad.numel)."""
    index = call.get("index")
    n = call["grad"].numel if call.get("grad") is not None else index.numel
    return scatter_add_flops(n)


@register(*aten_ops("index_select_backward"), kind=OTHER)
def index_select_backward(call):
    """grad.numel adds: the grad rows accumulated into the selected rows."""
    return scatter_add_flops(call["grad"].numel)


@register(*aten_ops("scatter"), kind=OTHER)
def scatter(call):
    """index.numel with reduce='add'/'multiply'; 0 for a plain scatter (a copy)."""
    return call["index"].numel if call.get("reduce") is not None else 0


@register(*aten_ops("scatter_reduce"), kind=OTHER)
def scatter_reduce(call):
    """index.numel reduce ops (sum/prod/amax/amin/mean) (+ self.numel divides for mean)."""
    flops = call["index"].numel
    if call["reduce"] == "mean":
        flops += call["self"].numel
    return flops


@register(*aten_ops("index_reduce"), kind=OTHER)
def index_reduce(call):
    """source.numel reduce ops (prod/amax/amin/mean) (+ self.numel divides for mean)."""
    flops = call["source"].numel
    if call["reduce"] == "mean":
        flops += call["self"].numel
    return flops


@register(*aten_ops("index_put", "_index_put_impl", "_unsafe_index_put"), kind=OTHER)
def index_put(call):
    """accumulate=True: one add per indexed element; False: 0 (a copy)."""
    if not call.get("accumulate"):
        return 0
    values = call["values"]
    return scatter_add_flops(indexed_numel(call["self"].shape, call["indices"], values.numel))


@register(*aten_ops("_unsafe_masked_index_put_accumulate"), kind=OTHER)
def masked_index_put_accumulate(call):
    """values.numel adds: the values accumulated at their (masked) indices."""
    return scatter_add_flops(call["values"].numel)


@register(*aten_ops("put", "put_"), kind=OTHER)
def put(call):
    """accumulate=True: index.numel adds; False: 0 (a copy)."""
    return scatter_add_flops(call["index"].numel) if call.get("accumulate") else 0


@register(*aten_ops("unfold_backward"), kind=OTHER)
def unfold_backward(call):
    """grad_in.numel adds: overlapping windows' grads summed into the input."""
    return scatter_add_flops(call["grad_in"].numel)

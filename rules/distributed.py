"""Collectives and the data-parallel engines' copies: ZERO FLOPs.

Communication is not arithmetic: the bytes a collective moves over a link are timed by the
capacity planner (:mod:`estimator.plan.schedule`), not counted as FLOPs.  The ops here appear
when the planner traces the real engines on a fake process group (:mod:`estimator.plan.engine`):

* ``c10d`` (the process-group ops DDP and FSDP2 call: all-reduce, all-gather, reduce-scatter,
  broadcast ...) and ``_c10d_functional`` (the functional collectives DTensor and tensor
  parallelism use, and ``wait_tensor``);
* FSDP2's copies (``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``):
  ``all_gather_copy_in`` (shards into the flat all-gather buffer), ``split_with_sizes_copy``
  (the flat buffer out into the unsharded parameters) and ``chunk_cat`` (gradients into the
  reduce-scatter buffer): data movement.  A reduce-scatter or all-reduce sums what it receives;
  those additions run inside the communication kernel and are not counted either.

Each op is registered only where this torch build has it.  FSDP2 defines its ops when
``torch.distributed.fsdp`` is imported (a 3-second import that the estimate does not need), so
the planner calls :func:`register_distributed` again once it has imported FSDP2.
"""

from __future__ import annotations

import torch

from .registry import lookup, register_zero

_FAMILIES = {
    "c10d": ("allreduce_", "allreduce_coalesced_", "allgather_", "_allgather_base_", "allgather_coalesced_",
             "allgather_into_tensor_coalesced_", "reduce_scatter_", "_reduce_scatter_base_",
             "reduce_scatter_tensor_coalesced_", "broadcast_", "reduce_", "gather_", "scatter_", "alltoall_",
             "alltoall_base_", "barrier", "send", "recv_", "recv_any_source_", "monitored_barrier_"),
    "_c10d_functional": ("all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_",
                         "all_gather_into_tensor", "all_gather_into_tensor_out", "all_gather_into_tensor_coalesced",
                         "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced", "all_to_all_single",
                         "broadcast", "broadcast_", "wait_tensor"),
    "fsdp": ("all_gather_copy_in", "split_with_sizes_copy", "chunk_cat", "copy_"),
}



def register_distributed() -> None:
    """Register every op of :data:`_FAMILIES` that exists now and has no rule yet (idempotent)."""
    for namespace, names in _FAMILIES.items():
        ops = getattr(torch.ops, namespace)
        for name in names:
            try:
                op = getattr(ops, name)
            except (AttributeError, RuntimeError):  # not in this torch build, or not defined yet
                continue
            if lookup(op) is None:
                register_zero(op)


register_distributed()

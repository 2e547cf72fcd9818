"""PyTorch's own engines traced on fake tensors, one rank at a time, over a fake process group.

For a :class:`~estimator.plan.layout.Layout` the planner does what a training script does, in
one process and without a GPU:

1. a fake process group of ``gpus`` ranks (``torch.testing._internal.distributed.fake_pg.FakeStore``
   and ``init_process_group("fake")``: collectives return at once), this process being ``rank``;
   it is set up for one trace and torn down after it, never left initialised;
2. a ``DeviceMesh`` of the layout's shape (:attr:`Layout.mesh`);
3. a copy of the model on the ``meta`` device (its parameters are never copied), cast for the
   ``bf16``/``fp16`` policies, with tensor parallelism applied by ``parallelize_module``
   (:mod:`estimator.plan.tp`) and FSDP2's ``fully_shard`` on every wrap-class instance and on
   the root, with the ``MixedPrecisionPolicy`` and ``reshard_after_forward`` asked for;
4. inside the capture's fake mode (:attr:`estimator.capture.StepOptions.prepare`) the parameters
   made fake (ties kept), FSDP2's lazy initialisation run (it pads the shards), DDP constructed
   over them;
5. one training step captured on this rank: the engine's own hooks all-gather, copy out, free,
   reduce-scatter, bucket and all-reduce as they do on GPUs, so every buffer, dtype, padding and
   the moment each is allocated and freed are the engine's (``_fsdp_param_group.py``,
   ``_fsdp_collectives.py``, ``torch/csrc/distributed/c10d/reducer.cpp``).

Two things differ from a GPU run and are handled here: DDP's default all-reduce hook reads the
value of the fake process group's work, which has none, so an equivalent Python hook (in-place
division and all-reduce of the bucket, as the C++ default does) is registered; and DDP's
construction skips its cross-rank parameter check (``init_sync=False``), which reads tensor data.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import warnings
from dataclasses import replace
from typing import Any, Iterator

import torch

from ..capture import StepOptions, capture
from ..errors import UserError
from ..memory import simulate
from ..tally import tally
from .context import check_ring, cp_error, cp_notes, ring_attention
from .expert import (apply_ep, apply_expert_tp, dense_expert_placement, ep_notes, expert_meshes, expert_paths,
                     expert_tp_notes, find_experts, moe_block_tp, shard_experts)
from .foreach_sharding import fast_foreach_sharding
from .fsdp_chunks import lazy_fsdp_chunks
from .layout import Layout, PlanPrecision
from .tp import TPPlan, apply_tp, full_length_masks
from .traced import Step, find_collectives, storage_rows


def _fake_store():
    """torch's in-process fake store (a testing utility: looked up here only, with a clear error)."""
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError as exc:  # pragma: no cover - a torch build without distributed support
        raise UserError("this torch build has no fake process group (torch.distributed with the 'fake' "
                        "backend): the data-parallel engines cannot be traced") from exc
    return FakeStore()


@contextlib.contextmanager
def fake_world(world: int, rank: int) -> Iterator[None]:
    """A fake process group of ``world`` ranks in this process, as ``rank``; destroyed on exit."""
    import torch.distributed as dist

    if not dist.is_available():  # pragma: no cover
        raise UserError("this torch build has no torch.distributed: the data-parallel engines cannot be traced")
    if dist.is_initialized():
        raise UserError("a torch.distributed process group is already initialised in this process; plan in a "
                        "process of its own (the planner sets up a fake one per trace)")
    import sys

    hook = sys.excepthook  # (init_process_group wraps it to prefix "[rank0]: " to every traceback line, each call)
    dist.init_process_group("fake", store=_fake_store(), rank=rank, world_size=world)
    try:
        # (DTensor's sharding of foreach ops without its quadratic scan; FSDP2's chunks of each parameter
        # made when read, not one empty tensor per rank)
        with fast_foreach_sharding(), lazy_fsdp_chunks():
            yield
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook
        _clear_dtensor_caches()


def _clear_dtensor_caches() -> None:
    """Forget DTensor's cached sharding decisions: they hold the meshes (and through them the process
    groups) of the world just destroyed, and a new mesh of the same shape compares equal to the old."""
    import sys

    api = sys.modules.get("torch.distributed.tensor._api")
    propagator = getattr(getattr(getattr(api, "DTensor", None), "_op_dispatcher", None), "sharding_propagator", None)
    for name in ("propagate_op_sharding", "_propagate_tensor_meta_cached"):
        clear = getattr(getattr(propagator, name, None), "cache_clear", None)
        if clear is not None:
            clear()
    redistribute = sys.modules.get("torch.distributed.tensor._redistribute")
    for name in ("_gen_transform_infos", "clear_redistribute_planner_cache"):
        fn = getattr(redistribute, name, None)
        clear = getattr(fn, "cache_clear", None) or (fn if name.startswith("clear") else None)
        if clear is not None:
            clear()


@contextlib.contextmanager
def one_sequence_per_sample() -> Iterator[None]:
    """Tell transformers that the traced batch packs one sequence per sample, as the real one does.

    Without a KV cache (training with checkpointing, ``use_cache=False``) transformers looks at the
    position ids' values to detect packed sequences (``masking_utils.find_packed_sequence_indices``);
    a fake tensor has no values, so it assumes packing and builds a full attention mask (no fused
    causal attention, grouped-query attention expanded by copies), which a real run on the same
    inputs does not.  The planner's inputs are one sequence per sample (positions 0..T-1): during its
    traces the function answers "not packed" for fake tensors, as it does for real ones."""
    import sys

    from torch._subclasses.fake_tensor import FakeTensor

    module = sys.modules.get("transformers.masking_utils")
    original = getattr(module, "find_packed_sequence_indices", None)
    if original is None:
        yield
        return

    def find_packed_sequence_indices(position_ids):
        return None if isinstance(position_ids, FakeTensor) else original(position_ids)

    module.find_packed_sequence_indices = find_packed_sequence_indices
    try:
        yield
    finally:
        module.find_packed_sequence_indices = original


def meta_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose parameters and buffers are on the meta device (ties kept); the
    weights themselves are never copied."""
    from torch.utils._python_dispatch import _disable_current_modes

    memo: dict[int, Any] = {}
    with _disable_current_modes():
        for t in itertools.chain(model.parameters(), model.buffers()):
            if id(t) not in memo:
                # a tensor subclass (torchao's float8 weights that FSDP2 gathers in float8) keeps its class
                meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") \
                    if type(t) in (torch.Tensor, torch.nn.Parameter) else torch.empty_like(t, device="meta")
                memo[id(t)] = torch.nn.Parameter(meta, requires_grad=t.requires_grad) \
                    if isinstance(t, torch.nn.Parameter) else meta
    try:
        return copy.deepcopy(model, memo)
    except Exception as exc:  # a lock, a file or a library handle among the module's attributes
        raise UserError(f"the planner traces the engines on a copy of the model and copy.deepcopy failed "
                        f"({type(exc).__name__}: {exc}); give that attribute a __deepcopy__ or keep it outside "
                        f"the module") from exc


def to_fake(model: torch.nn.Module) -> None:
    """Replace every parameter and buffer by an empty one on the CPU (fake inside a fake mode), a
    tensor shared by several modules (tied weights) once."""
    made: dict[int, Any] = {}
    for mod in model.modules():
        for store, is_param in ((mod._parameters, True), (mod._buffers, False)):
            for name, t in list(store.items()):
                if t is None:
                    continue
                new = made.get(id(t))
                if new is None:
                    empty = torch.empty_like(t, device="cpu")
                    new = made[id(t)] = torch.nn.Parameter(empty, requires_grad=t.requires_grad) if is_param else empty
                store[name] = new


_WORLDS = itertools.count()  # one number per fake world: its meshes' dimension names carry it


def _mesh(layout: Layout):
    """The layout's mesh.  Its dimension names carry the number of this fake world: DTensor caches
    sharding decisions by mesh, and a mesh of a world already destroyed must not compare equal to
    this one (it would bring back process groups that no longer exist)."""
    from torch.distributed.device_mesh import init_device_mesh

    names, shape = zip(*layout.mesh)
    world = next(_WORLDS)
    return init_device_mesh("cpu", tuple(shape), mesh_dim_names=tuple(f"{n}.{world}" for n in names))


def _submesh(mesh, names: tuple[str, ...]):
    present = tuple(n for n in (mesh.mesh_dim_names or ()) if n.rpartition(".")[0] in names)
    if not present:
        return None
    return mesh[present] if len(present) > 1 else mesh[present[0]]


def data_parallel_mesh(mesh, layout: Layout):
    """The mesh FSDP2 shards over (2-D for HSDP: replicate x shard) or DDP averages over.  Under context
    parallelism the cp dimension is flattened into the sharded one, as torchtitan's ``dp_shard_cp``: the ranks
    that share a sequence share the parameters' shards and average their gradients."""
    outer, inner = (("replicate",), "shard") if layout.strategy == "hsdp" else ((), "dp")
    if layout.cp == 1:
        return _submesh(mesh, outer + (inner,))
    names = mesh.mesh_dim_names
    parts = tuple(n for n in names if n.rpartition(".")[0] in (inner, "cp"))
    flat = mesh[parts[0]] if len(parts) == 1 else _flattened(mesh, parts)
    rep = tuple(n for n in names if n.rpartition(".")[0] in outer)
    if not rep:
        return flat
    with warnings.catch_warnings():  # ("slicing a flattened dim from root mesh will be deprecated": torchtitan's
        warnings.simplefilter("ignore", UserWarning)  # HSDP mesh is sliced so, world_mesh["dp_replicate", ...])
        return mesh[rep + flat.mesh_dim_names]


def _flattened(mesh, parts: tuple[str, ...]):
    """``mesh[parts]`` flattened into one dimension, once per mesh (the engine may be built on it again)."""
    made = mesh.__dict__.setdefault("_estimator_flattened", {})
    if parts not in made:
        world = parts[0].rpartition(".")[2]
        made[parts] = mesh[parts]._flatten("_".join(p.rpartition(".")[0] for p in parts) + f".{world}")
    return made[parts]


def build(model: torch.nn.Module, layout: Layout, precision: PlanPrecision, unit_paths: list[str],
          tp_plan: TPPlan | None, mesh, notes: list[str] | None = None) -> torch.nn.Module:
    """The meta copy of ``model`` with the layout's engines applied (outside any fake mode); what the plan must say
    about them is appended to ``notes``."""
    m = meta_copy(model)
    if precision.step.cast is not None:
        m.to(precision.step.cast)
    if layout.tp > 1:
        if tp_plan is None or not (tp_plan.colwise or tp_plan.rowwise):
            # (a head or an embedding alone: every block's weights replicated on each of the tp ranks, so the
            # data-parallel degree falls and each rank holds more than without --tp)
            alone = " (only the output head or the embedding would be split)" if tp_plan is not None and \
                not tp_plan.empty else ""
            raise UserError(f"--tp {layout.tp}: no Linear layer pairs to split were found in the blocks{alone}; "
                            f"use --tp 1")
        apply_tp(m, tp_plan, _submesh(mesh, ("tp",)), layout.sequence_parallel,
                 layout.loss_parallel and tp_plan.head is not None)
    experts: list[str] = []
    tp_mesh = _submesh(mesh, ("tp",)) if layout.tp > 1 else None
    moe = expert_paths(m) if tp_mesh is not None else []
    if moe:  # the MoE blocks as torchtitan's apply_moe_ep_tp
        moe_block_tp(m, moe, tp_mesh, layout.sequence_parallel)
        if layout.ep == 1:
            apply_expert_tp(m, moe, tp_mesh)
    if layout.ep > 1:  # torchtitan's order: tp, ep, (cp, checkpointing,) fsdp
        experts = find_experts(m, layout.ep)
        expert_fsdp_mesh, ep_mesh, ep_etp_mesh = expert_meshes(layout.replicate if layout.strategy == "hsdp" else 1,
                                                               layout.efsdp, layout.ep, next(_WORLDS), layout.etp)
        apply_ep(m, experts, ep_mesh, tp_mesh if layout.etp == 1 else None, ep_etp_mesh)
    if layout.strategy in ("fsdp", "hsdp"):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        check_fsdp_takes(m, layout, precision)

        dp_mesh = data_parallel_mesh(mesh, layout)
        policy = MixedPrecisionPolicy(param_dtype=precision.param_dtype, reduce_dtype=precision.reduce_dtype)
        modules = dict(m.named_modules())
        raf = layout.reshards_after_forward  # (an int: resharded to groups of that many ranks; 1 is False, as FSDP2)
        keep = {} if raf is True else {"reshard_after_forward": False if raf in (False, 1) else raf}
        if not experts:
            placement, said = dense_expert_placement(m, layout.shard * layout.cp)
            if placement is not None:
                keep["shard_placement_fn"] = placement
                if notes is not None:
                    notes.extend(n for n in said if n not in notes)
        if experts:  # each experts module on its own mesh, before its block takes the rest of the block's
            shard_experts(m, experts, expert_fsdp_mesh, layout.ep, layout.grad_group, mp_policy=policy, **keep)
        for path in unit_paths:  # inner units first would not matter: FSDP2 groups each call's own params
            if path in modules:  # (a model traced with fewer of its repeated blocks has fewer units)
                fully_shard(modules[path], mesh=dp_mesh, mp_policy=policy, **keep)
        fully_shard(m, mesh=dp_mesh, mp_policy=policy, **keep)  # the root: not resharded after forward by default
    return m


def check_fsdp_takes(m: torch.nn.Module, layout: Layout, precision: PlanPrecision) -> None:
    """One-line errors for models FSDP2 refuses or whose real step fails under it: scalar parameters (fully_shard
    raises "doesn't support scalar parameters"), and batch norm under a low-precision ``param_dtype`` (its
    running statistics stay fp32 where its weight is cast: "expected scalar type BFloat16 but found Float", on the
    CPU and on CUDA alike, torchtitan issue 674), where the trace's meta kernels check neither."""
    scalar = next((n for n, p in m.named_parameters() if p.dim() == 0), None)
    if scalar is not None:
        raise UserError(f"--strategy {layout.strategy}: FSDP2's fully_shard refuses scalar parameters ({scalar}); make "
                        f"it a 1-element tensor, or plan ddp or zero1-3")
    low = precision.param_dtype not in (None, torch.float32)
    norms = [n for n, mod in m.named_modules() if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm)
             and mod.track_running_stats]
    if low and norms:
        raise UserError(f"--strategy {layout.strategy} with --precision {precision.name}: batch norm ({norms[0]}) keeps "
                        f"fp32 running statistics where FSDP2 casts its weight, and a real step fails in it "
                        f"(\"expected scalar type BFloat16 but found Float\"); plan --precision bf16-mixed (autocast "
                        f"runs batch norm in fp32)")


def fsdp_streams(state: Any) -> dict[int, str]:
    """FSDP2's side streams (``_fsdp_param_group.py``, ``FSDPCommContext``) by the id of their
    objects: the casts and copy into the all-gather buffer run on ``all_gather_copy_in``, the
    all-gather on ``all_gather``, the reduce-scatter and the ops after it (division, cast to the
    parameters' dtype, the new sharded gradients) on ``reduce_scatter`` (``_fsdp_collectives.py``)."""
    ctx = getattr(state, "_comm_ctx", None)
    names = ("all_gather_copy_in", "all_gather", "reduce_scatter", "all_reduce")
    streams = ((getattr(ctx, f"{name}_stream", None), name) for name in names)
    return {id(s): name for s, name in streams if s is not None}


def _ddp_allreduce_hook(world: int):
    """DDP's default all-reduce, in Python: divide the bucket by the world size and all-reduce it in
    place (``reducer.cpp`` does both in place; the fake work has no value to return)."""
    import torch.distributed as dist

    def hook(_state, bucket):
        buffer = bucket.buffer()
        buffer.div_(world)
        dist.all_reduce(buffer)
        future = torch.futures.Future()
        future.set_result(buffer)
        return future

    return hook


def accumulate_gradients(module: torch.nn.Module, micro_step: int, last: bool) -> Any:
    """Around one micro-step of gradient accumulation: the engine's gradient sync only on the last, as a
    training script writes it: DDP's ``no_sync()`` context (``torch/nn/parallel/distributed.py``) on the
    others; FSDP2's ``set_requires_gradient_sync(last)`` (``_fully_shard.py``: without sync the unsharded
    gradients accumulate on each rank and nothing is reduce-scattered until the last micro-step)."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(module, DistributedDataParallel):
        return contextlib.nullcontext() if last else module.no_sync()
    setter = getattr(module, "set_requires_gradient_sync", None)
    if setter is not None:
        setter(last)
    return contextlib.nullcontext()


def with_grad_sync(options: Any, grad_sync: str) -> Any:
    """``options`` for a loop that syncs the gradients on the last micro-step (``"last"``: DDP's ``no_sync``,
    FSDP2's ``set_requires_gradient_sync(False)`` on the others, :func:`accumulate_gradients`) or after every one
    (``"every"``: Composer's loop under FSDP, accelerate's ``sync_each_batch``; FSDP2 reduce-scatters each
    micro-step's gradients and accumulates them sharded, where the other keeps the stage's unsharded ones)."""
    if grad_sync not in ("last", "every"):
        raise UserError(f"--grad-sync must be last or every, not {grad_sync!r}")
    return replace(options, accumulate=_sync_every) if grad_sync == "every" else options


def _sync_every(module: torch.nn.Module, micro_step: int, last: bool) -> Any:
    return contextlib.nullcontext()


def under_loss_parallel(accumulate: Any) -> Any:
    """Around each micro-step's forward, loss and backward: ``loss_parallel()`` (its cross-entropy on the
    vocabulary-sharded logits; torch asks for the backward under it too, as torchtitan's ``train_context``
    runs both), inside ``accumulate``'s context when there is one."""
    from torch.distributed.tensor.parallel import loss_parallel

    @contextlib.contextmanager
    def around(module: torch.nn.Module, micro_step: int, last: bool) -> Iterator[None]:
        with (accumulate(module, micro_step, last) if accumulate is not None else contextlib.nullcontext()):
            with loss_parallel():
                yield

    return around


@contextlib.contextmanager
def engine_warnings_as_notes(notes: list[str]) -> Iterator[None]:
    """The warnings PyTorch's distributed engines raise while a layout is traced, each distinct one a note of the
    plan (``"torch.distributed warned during the trace: ..."``) rather than a line on stderr every time a plan or a
    comparison's row traces it again (FSDP2 warns, for instance, when a wrapped module returns a view: the user's
    real run would say so too).  Any other warning is raised again, once per place and message, as the default
    filter would have shown it."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    again = set()
    for w in caught:
        text = str(w.message)
        if "torch/distributed/" in w.filename.replace("\\", "/"):
            note = f"torch.distributed warned during the trace: {text.splitlines()[0] if text else w.category.__name__}"
            if note not in notes:
                notes.append(note)
        elif (key := (w.category, text, w.filename, w.lineno)) not in again:
            again.add(key)
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


def trace_engine(model: torch.nn.Module, inputs: Any, layout: Layout, precision: PlanPrecision,
                 options: StepOptions, unit_paths: list[str], tp_plan: TPPlan | None, device: str,
                 value: int | None = None, progress=None) -> Step:
    """One rank's training step of ``model`` under ``layout`` on PyTorch's engines (DDP, FSDP2, TP)."""
    notes: list[str] = []
    if layout.sequence_parallel:
        inputs, added = with_position_ids(model, inputs)
        if added:
            notes.append("sequence parallelism: position_ids (0..T-1) passed to the model, whose own would be "
                         "counted on the local sequence shard")
    with fake_world(layout.gpus, layout.rank):
        import torch.distributed.fsdp  # noqa: F401  (defines FSDP2's ops)
        from ..rules.distributed import register_distributed as register
        register()
        mesh = _mesh(layout)
        stream_names: dict[int, str] = {}  # id of an FSDP2 stream -> its name (see fsdp_streams)

        def prepare(_model: torch.nn.Module, fake) -> tuple[torch.nn.Module, torch.nn.Module]:
            m = build(model, layout, precision, unit_paths, tp_plan, mesh, notes)
            call = m
            ddp = layout.strategy == "ddp" and layout.grad_group > 1
            # (the mesh flattened outside the fake mode: its coordinates are computed on real tensors)
            ddp_mesh = data_parallel_mesh(mesh, layout) if ddp and (layout.tp > 1 or layout.cp > 1) else None
            with fake:
                to_fake(m)
                if layout.strategy in ("fsdp", "hsdp"):
                    state = getattr(m, "_get_fsdp_state", lambda: None)()
                    lazy_init = getattr(state, "_lazy_init", None)
                    if lazy_init is not None:  # pads the shards now rather than in the traced forward
                        lazy_init()
                    stream_names.update(fsdp_streams(state))
                elif ddp:
                    from torch.nn.parallel import DistributedDataParallel

                    kwargs = {"device_mesh": ddp_mesh} if ddp_mesh is not None else {}
                    call = DistributedDataParallel(m, init_sync=False, **kwargs,
                                                   gradient_as_bucket_view=layout.gradient_as_bucket_view)
                    call.register_comm_hook(None, _ddp_allreduce_hook(layout.grad_group))
            return m, call

        try:
            with one_sequence_per_sample():
                # (a pipeline stage brings its schedule's own: estimator.plan.pipeline.stage_backward)
                accumulate = (options.accumulate or accumulate_gradients) if options.grad_accum > 1 else None
                if layout.loss_parallel and tp_plan is not None and tp_plan.head is not None:
                    accumulate = under_loss_parallel(accumulate)
                # DDP buckets every gradient of the model (25 MiB each) once, at construction: its buffers and
                # all-reduces depend on how many blocks there are, so its blocks are all traced
                replicate = options.replicate and not (layout.strategy == "ddp" and layout.grad_group > 1)
                ring = ring_attention(_submesh(mesh, ("cp",)), device, layout.cp_rotate) if layout.cp > 1 \
                    else contextlib.nullcontext()
                masks = full_length_masks(model) if layout.sequence_parallel else contextlib.nullcontext()
                with ring as calls, engine_warnings_as_notes(notes), masks:
                    ring_calls = calls
                    cap = capture(model, inputs, replace(options, prepare=prepare, accumulate=accumulate,
                                                         replicate=replicate), progress=progress)
                if layout.cp > 1:
                    check_ring(calls)
        except UserError as exc:
            if layout.cp > 1:
                cp_error(exc, layout.cp, locals().get("ring_calls"))
            if layout.tp > 1 and not str(exc).startswith(("--", "the optimizer pass failed")):  # (says what to fix)
                lp = ("; under --loss-parallel the loss must be cross-entropy on the logits, the only loss torch's "
                      "loss_parallel supports") if layout.loss_parallel else ""
                raise UserError(f"{exc} (under tensor parallelism{' with sequence parallelism' if layout.sequence_parallel else ''}: "
                                f"the forward must run on local shards, e.g. views with -1 for the head count{lp})") from exc
            raise
        tp_mesh = _submesh(mesh, ("tp",)) if layout.tp > 1 else None
        tp_ranks = frozenset(torch.distributed.get_process_group_ranks(tp_mesh.get_group())) if tp_mesh else frozenset()
        collectives = find_collectives(cap, layout.gpus_per_node, tp_ranks)
    streams = {i: stream_names.get(n.meta["stream"], "side") for i, n in enumerate(cap.nodes) if "stream" in n.meta}
    # the allocator's need (the fragmentation reserve) only when a fit is asked (Step.fragmentation)
    step = Step(cap, tally(cap), simulate(cap, device, target=options.cuda, need=False), storage_rows(cap), value,
                collectives, notes, streams, lazy_need=device == "cuda", cuda_target=options.cuda)
    if cap.fallback_reason:
        step.notes.append(cap.fallback_reason)
    step.notes.extend(n for n in cap.assumptions if n not in step.notes)  # torch.compile's regions, LayerDrop
    if layout.cp > 1:
        step.notes.extend(cp_notes(layout.cp, layout.cp_rotate, device))
    if layout.ep > 1:
        step.notes.extend(ep_notes(layout.ep, layout.tp, layout.etp))
    elif layout.tp > 1 and expert_paths(model):
        step.notes.extend(expert_tp_notes(layout.tp))
    return step


def with_position_ids(model: torch.nn.Module, inputs: Any) -> tuple[Any, bool]:
    """``inputs`` with ``position_ids`` (0..T-1 for each sample) when the model takes them and they are
    not given: a model that derives them from its input's length would see the local sequence shard
    under sequence parallelism (Hugging Face models do)."""
    import inspect

    if not isinstance(inputs, dict) or "position_ids" in inputs:
        return inputs, False
    try:  # (a pipeline stage states the signature of the model it runs)
        signature = getattr(model, "forward_signature", None) or inspect.signature(model.forward)
        takes = "position_ids" in signature.parameters
    except (TypeError, ValueError):
        return inputs, False
    ids = inputs.get("input_ids")
    if not takes or not isinstance(ids, torch.Tensor) or ids.ndim != 2:
        return inputs, False
    batch, seq = ids.shape
    position_ids = torch.arange(seq, dtype=torch.long).expand(batch, seq)
    return {**inputs, "position_ids": position_ids}, True

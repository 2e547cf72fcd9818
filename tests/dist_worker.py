"""One rank of a real data-parallel training run on CPU (gloo), for tests/test_plan.py.

Run as ``python tests/dist_worker.py RANK WORLD_SIZE INIT_FILE OUT_JSON CONFIG_JSON``; the test
starts one process per rank.  ``CONFIG_JSON``: ``{"cases": [{"name", "model": "gpt" | "llama",
"config": {...}, "batch", "seq", "runs": [{"id", "strategy": "ddp" | "fsdp", "precision": "fp32" |
"bf16-mixed" | "fsdp-bf16", "checkpoint": bool, "tp": int, "sp": bool, "lp": bool, "reshard": bool | int,
"accum": int, "f8": "tensorwise" | "all-gather", "cp": int, "ep": int}]}]}``; ``"model": "mixtral"``:
transformers' Mixtral with balanced routing (tests/moe_worker.py), ``ep`` > 1: torchtitan's expert parallelism.
Independent of estimator's code: nothing from ``estimator`` is imported here; the tensor-parallel
plan is written out by hand (Megatron's pairs for a Llama block, torchtitan's sequence parallelism).

For each run the rank

1. builds the model with real weights: the example GPT (``examples/gpt.py``) or Llama
   (``examples/llama.py``);
2. starts a live-storage tracker, then applies the engines: ``parallelize_module`` (``tp`` > 1,
   on the inner mesh dimension), FSDP2 ``fully_shard`` on every block and the root (on the outer
   one; ``lp``: loss parallelism as torchtitan applies it, the head's logits left sharded by
   vocabulary and each forward, loss and backward under ``loss_parallel()``; ``precision="fsdp-bf16"``: ``MixedPrecisionPolicy(param_dtype=torch.bfloat16)``) with a
   reduce-scatter that does not copy its input (see :func:`in_place_reduce_scatter`), or
   ``DistributedDataParallel`` with its defaults; ``checkpoint``: every block runs
   ``torch.utils.checkpoint`` (non-reentrant) from its forward; ``precision="bf16-mixed"``: the forward
   and the loss under ``torch.autocast("cpu", torch.bfloat16)``; ``accum`` > 1: gradient accumulation
   over that many micro-steps (each loss divided by it), the gradient sync on the last only, as a
   training script writes it: DDP's ``no_sync()`` around the others' forward and backward, FSDP2's
   ``set_requires_gradient_sync(False)`` before them and ``(True)`` before the last; ``cp`` > 1:
   context parallelism as torchtitan applies it: a (dp, cp) mesh, FSDP2 over the flattened dp x cp
   ranks (``dp_shard_cp``), DDP over all of them, and each micro-step's forward and backward under
   ``context_parallel(mesh["cp"], buffers=[inputs, targets], buffer_seq_dims=[1, 1],
   no_restore_buffers=...)`` on a batch drawn for it (a data loader's), torch's ring attention
   with its default all-gather rotation; torch's ring attention handles only the CUDA attention
   kernels, so the flash kernel's op is given a CPU kernel here (:func:`flash_attention_on_cpu`);
3. builds ``torch.optim.AdamW``, runs iterations (forward + loss, ``backward()``, ``step()``,
   ``zero_grad(set_to_none=True)``) and records the peak of live bytes of each of the last two (steady
   state: optimizer state allocated, gradients ``None`` at the start: the second and third, the third and
   fourth for DDP, which rebuilds its gradient buckets in the second), reporting the smaller (gloo frees what it
   sent on its own thread, now and then late); a run with ``"zero": "before_backward"`` calls ``zero_grad``
   after the first micro-step's loss instead (Lightning's order: the previous step's gradients live through
   the forward);
4. measures the model states from the real tensors after the last ``step()``, before
   ``zero_grad``: the distinct storages (``untyped_storage().nbytes()``) of the parameters, the
   gradients and the optimizer state (DTensors by their local tensor).

What the peak includes: every storage that a dispatched aten op reads or produces while the
tracker is active, at its current size (FSDP2 frees and re-allocates its unsharded parameters
with ``untyped_storage().resize_()``, outside the dispatcher: the tracker follows that method and
re-reads the size of every storage an op reads or makes; see :class:`ResizeAwareTracker`).  An op
on DTensors is handed back to DTensor (``NotImplemented``), which runs it as ops on the local
tensors, which the tracker sees too.
What it cannot see: memory gloo allocates inside its kernels or on its worker threads (on a GPU,
NCCL's buffers are likewise outside ``torch.cuda.max_memory_allocated()``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if type(t) is not torch.Tensor and hasattr(t, "_local_tensor") else t


def _tensors(x, out: list) -> list:
    """The tensors in an op's arguments or results (lists, tuples and dicts of them; what pytree flattens for
    an aten op, without its generality, which cost a fifth of a pipeline rank's time)."""
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            _tensors(y, out)
    elif isinstance(x, dict):
        for y in x.values():
            _tensors(y, out)
    return out


class _Before:
    """The label of the sample taken before an op, made into a string only when it is the peak."""

    __slots__ = ("func",)

    def __init__(self, func):
        self.func = func

    def __str__(self) -> str:
        return f"before {self.func}"


class ResizeAwareTracker(TorchDispatchMode):
    """Live bytes of every storage seen by a dispatched op, each at its current size (storages may be resized).

    The total is kept as it changes: a storage adds its bytes when first seen and takes them back when it is
    freed (its weakref finalizer queues it, and the queue is emptied before each sample: a finalizer can run
    inside any allocation, between reading and writing the total).  Its size is re-read whenever an op reads or
    makes it (``aten.resize_``, ``set_``) and whenever ``torch.UntypedStorage.resize_`` runs (FSDP2 resizes
    outside the dispatcher: the method is wrapped while the tracker is active).  ``DIST_WORKER_CHECK=1``
    reads every storage's ``nbytes()`` at each op and asserts the kept sizes are current (how this tracker used
    to count, at every op: with pytree's flattening too, a 4-process pipeline run took 94 s of CPU; 60 s now)."""

    def __init__(self):
        super().__init__()
        self.storages: dict[int, weakref.ref] = {}
        self.sizes: dict[int, int] = {}  # the bytes each storage counts for in ``total``
        self.total = 0
        self.peak = 0
        self.peak_op = ""
        self.trace: list | None = None  # (op, live bytes) samples, when debugging (DIST_WORKER_TRACE=run id)
        self.check = os.environ.get("DIST_WORKER_CHECK") == "1"
        self._resize = None
        self._freed: list[tuple[int, weakref.ref]] = []  # (key, ref) of storages freed since the last sample

    def register(self, t: torch.Tensor) -> None:
        t = _local(t)
        if t.device.type == "meta" or type(t) not in (torch.Tensor, torch.nn.Parameter):
            return  # fake tensors (DTensor's sharding propagation) and wrappers (their inner tensors count)
        st = t.untyped_storage()
        key = st._cdata
        ref = self.storages.get(key)
        if ref is not None and ref() is st:
            self._refresh(key, st)
            return
        self._drop(key, ref)  # (a freed storage's address reused before its finalizer ran)
        ref = self.storages[key] = weakref.ref(st)
        n = self.sizes[key] = st.nbytes()
        self.total += n
        weakref.finalize(st, self._freed.append, (key, ref)).atexit = False

    def _refresh(self, key: int, st) -> None:
        n = st.nbytes()
        self.total += n - self.sizes[key]
        self.sizes[key] = n

    def _drop(self, key: int, ref) -> None:
        if ref is not None and self.storages.get(key) is ref:
            del self.storages[key]
            self.total -= self.sizes.pop(key)

    def live(self) -> int:
        while self._freed:
            self._drop(*self._freed.pop())
        return self.total

    def sample(self, where) -> None:
        now = self.live()
        if self.check:  # every live storage counted at its current size (one freed on another thread, gloo's after
            # a send, is dead before its finalizer queues it: not compared)
            assert now == sum(self.sizes.values()), (str(where), now, sum(self.sizes.values()))
            alive = ((k, self.sizes[k], r()) for k, r in list(self.storages.items()))
            stale = [(k, n, st.nbytes()) for k, n, st in alive if st is not None and st.nbytes() != n]
            assert not stale, (str(where), stale)
        if self.trace is not None:
            self.trace.append((str(where), now))
        if now > self.peak:
            self.peak, self.peak_op = now, str(where)

    def reset_peak(self) -> None:
        self.peak, self.peak_op = self.live(), "start"

    def __enter__(self):
        resize, tracker = torch.UntypedStorage.resize_, self

        def tracked_resize_(storage, size):
            out = resize(storage, size)
            ref = tracker.storages.get(storage._cdata)
            if ref is not None and ref() is storage:
                tracker._refresh(storage._cdata, storage)
            return out
        self._resize = resize
        torch.UntypedStorage.resize_ = tracked_resize_
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._resize
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch._subclasses.fake_tensor import FakeTensor

        if any(t not in (torch.Tensor, torch.nn.Parameter) and not issubclass(t, FakeTensor) for t in types):
            # a tensor subclass (DTensor, a functional collective's AsyncCollectiveTensor): it runs the op on
            # the tensors it wraps, which come back here
            return NotImplemented
        kwargs = kwargs or {}
        inputs = _tensors(kwargs, _tensors(args, []))
        for t in inputs:
            self.register(t)
        self.sample(_Before(func))
        out = func(*args, **kwargs)
        for t in _tensors(out, inputs):  # (the inputs again: an op may have resized them)
            self.register(t)
        self.sample(func)
        return out


def _distinct_bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        st = _local(t).untyped_storage()
        seen[st._cdata] = st.nbytes()
    return sum(seen.values())


def in_place_reduce_scatter():
    """FSDP2's reduce-scatter for gloo without gloo's copy of the input.

    ``ProcessGroupGloo::reduce_scatter_tensor_coalesced`` clones its input, all-reduces the clone and
    copies this rank's chunk; the clone is released from a gloo worker thread at a time that varies
    from run to run, so it lands in the measured peak or not.  NCCL reduce-scatters without a copy;
    this does the same in memory: it all-reduces FSDP's (temporary) reduce-scatter input in place
    and copies this rank's chunk into the output.
    """
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

    class InPlaceReduceScatter(ReduceScatter):
        def allocate(self, size, *, dtype, device):
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            average = op == dist.ReduceOp.AVG
            dist.all_reduce(input_tensor, op=dist.ReduceOp.SUM if average else op, group=group)
            if average:
                input_tensor.div_(group.size())
            output_tensor.copy_(input_tensor.view(group.size(), -1)[group.rank()])
            return None

    return InPlaceReduceScatter()


def flash_attention_on_cpu() -> None:
    """``aten::_scaled_dot_product_flash_attention`` (the CUDA flash kernel's op, which torch's ring attention
    dispatches) and its backward computed on the CPU by the CPU flash kernels, with the outputs the op's meta
    kernel gives (the random-state tensors empty); ``F.scaled_dot_product_attention`` calls it, as CUDA's
    dispatch does for causal attention in half precision.  Once per process."""
    import torch.nn.functional as F

    if getattr(flash_attention_on_cpu, "done", False):
        return
    aten = torch.ops.aten

    def forward(q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, scale=scale)
        # the random state: CPU tensors (a meta one, as the meta kernel makes, would send backward to Meta), the
        # second a scalar (DTensor asks it of an output without placement)
        seed, offset = torch.empty(0, dtype=torch.uint64), torch.empty((), dtype=torch.uint64)
        return out, lse, None, None, q.size(2), k.size(2), seed, offset, torch.empty(0, dtype=q.dtype)

    def backward(grad, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, dropout_p, is_causal, seed, offset, *,
                 scale=None):
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(grad.contiguous(), q, k, v, out, lse,
                                                                         dropout_p, is_causal, scale=scale)

    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_scaled_dot_product_flash_attention", forward, "CPU")
    lib.impl("_scaled_dot_product_flash_attention_backward", backward, "CPU")
    flash_attention_on_cpu.lib = lib  # (kept alive: the registration lasts as long as the library object)

    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                     scale=None, enable_gqa=False):
        assert attn_mask is None
        return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False,
                                                        scale=scale)[0]

    F.scaled_dot_product_attention = scaled_dot_product_attention
    flash_attention_on_cpu.done = True


def build(case: dict, run: dict):
    """(model, inputs, loss of the output, block class) with real weights."""
    torch.manual_seed(0)
    b, s = case["batch"], case["seq"]
    if case["model"] == "gpt":
        sys.path.insert(0, os.path.join(ROOT, "examples"))
        import gpt

        model = gpt.GPT(gpt.GPTConfig(**case["config"]))
        idx = torch.randint(0, case["config"]["vocab_size"], (b, s))
        return model, (idx, idx.clone()), {}, (lambda out: out), gpt.Block
    if case["model"] in ("mixtral", "gemma2", "deepseek", "qwen3_next", "olmo2"):
        import moe_worker

        model, block = getattr(moe_worker, f"build_{case['model']}")(case["config"])
        idx = torch.randint(0, case["config"]["vocab_size"], (b, s))
        kwargs = {"input_ids": idx, "labels": idx.clone()}
        if run.get("sp"):  # transformers derives them from the input's length: the local shard's under sp
            kwargs["position_ids"] = torch.arange(s).expand(b, s)
            if case["model"] == "gemma2":  # and its masks, built here for the whole sequence
                from moe_worker import gemma2_masks

                kwargs["attention_mask"] = gemma2_masks(model, b, s, kwargs["position_ids"])
        return model, (), kwargs, (lambda out: out.loss), block
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import llama

    model = llama.Llama(llama.LlamaConfig(**case["config"]))
    idx = torch.randint(0, case["config"]["vocab_size"], (b, s))
    return model, (idx, idx.clone()), {}, (lambda out: out), llama.Block


def tensor_parallel(model, mesh, sp: bool, lp: bool = False) -> None:
    """Megatron's pairs in each block of ``examples/llama.py``; torchtitan's sequence parallelism
    (``torchtitan/models/llama3/parallelize.py``) when ``sp``, its loss parallelism (the head's output a
    DTensor sharded by vocabulary) when ``lp``."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    seq = Shard(1)
    for layer in model.layers:
        styles = {
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=seq) if sp else RowwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=seq) if sp else RowwiseParallel(),
        }
        if sp:
            styles.update({
                "attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
                "attention": PrepareModuleInput(input_layouts=(seq, None, None),
                                                desired_input_layouts=(Replicate(), None, None)),
                "feed_forward": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
            })
        parallelize_module(layer, mesh, styles)
    top = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq if sp else Replicate()),
           "output": ColwiseParallel(input_layouts=seq if sp else Replicate(),
                                     output_layouts=Shard(-1) if lp else Replicate(), use_local_output=not lp)}
    if sp:
        top["norm"] = SequenceParallel()
    # (a pipeline stage holds some of these only: tests/pp_worker.py)
    parallelize_module(model, mesh, {k: v for k, v in top.items() if getattr(model, k, None) is not None})


@contextlib.contextmanager
def _both(first, second):
    with first, second:
        yield


def float8(model, how: str) -> None:
    """torchao's float8 training as torchtitan converts a model: tensorwise scaling on every Linear whose sizes
    are multiples of 16 but the output head; ``how="all-gather"``: with ``enable_fsdp_float8_all_gather`` (FSDP2
    gathers those weights in float8)."""
    import dataclasses

    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name("tensorwise")
    if how == "all-gather":
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    convert_to_float8_training(model, config=config, module_filter_fn=lambda m, fqn: (
        fqn.rpartition(".")[2] not in ("output", "lm_head") and m.in_features % 16 == 0 and m.out_features % 16 == 0))


def run_one(case: dict, run: dict, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    tp, cp = run.get("tp", 1), run.get("cp", 1)
    dp = world // tp
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp")) if tp > 1 else \
        init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    dp_mesh = mesh["dp"] if cp == 1 else None
    if cp > 1:  # torchtitan's mesh (dp, cp[, tp]): FSDP2 over dp x cp flattened ("dp_shard_cp")
        inner = ((tp,), ("tp",)) if tp > 1 else ((), ())
        mesh = init_device_mesh("cpu", (world // (cp * tp), cp, *inner[0]), mesh_dim_names=("dp", "cp", *inner[1]))
        dp_mesh = mesh["cp"] if world == cp * tp else mesh["dp", "cp"]._flatten("dp_cp")
        flash_attention_on_cpu()
    model, args, kwargs, loss_of, block_cls = build(case, run)
    ep = run.get("ep", 1)
    etp = run.get("etp", 1)
    if ep > 1:  # torchtitan's expert region (efsdp, ep[, etp]): the ep ranks innermost but the experts' tp ones
        from moe_worker import expert_parallel, shard_experts

        ep_region = init_device_mesh("cpu", (world // ep, ep), mesh_dim_names=("efsdp", "ep")) if etp == 1 else \
            init_device_mesh("cpu", (world // (ep * etp), ep, etp), mesh_dim_names=("efsdp", "ep", "etp"))
    if run.get("f8"):
        float8(model, run["f8"])
    if run.get("lora"):  # peft's own LoRA layers (r 8, alpha 16) on the attention's qkv and proj, the rest frozen
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=["qkv", "proj"]))
    tracker = ResizeAwareTracker()
    autocast = run["precision"] == "bf16-mixed"
    with tracker:
        if cp == 1:  # (under cp each micro-step draws its own batch, see below)
            for t in pytree.tree_leaves((args, kwargs)):
                if isinstance(t, torch.Tensor):  # (a mask dict may hold None: no mask needed)
                    tracker.register(t)
        if run["checkpoint"]:
            from torch.utils.checkpoint import checkpoint

            for blk in model.modules():
                if isinstance(blk, block_cls):
                    blk.forward = (lambda f: lambda *a, **k: checkpoint(f, *a, use_reentrant=False, **k))(blk.forward)
        if tp > 1 and case["model"] == "mixtral":
            from moe_worker import expert_tensor_parallel, mixtral_tensor_parallel

            mixtral_tensor_parallel(model, mesh["tp"], run.get("sp", False))
            if ep == 1:
                expert_tensor_parallel(model, mesh["tp"])
        elif tp > 1 and case["model"] == "gemma2":
            from moe_worker import gemma2_tensor_parallel

            gemma2_tensor_parallel(model, mesh["tp"], run.get("sp", False))
        elif tp > 1 and case["model"] in ("deepseek", "qwen3_next", "olmo2"):
            import moe_worker

            getattr(moe_worker, f"{case['model']}_tensor_parallel")(model, mesh["tp"], run.get("sp", False))
        elif tp > 1:
            tensor_parallel(model, mesh["tp"], run.get("sp", False), run.get("lp", False))
        if ep > 1:
            experts = expert_parallel(model, ep_region["ep"], mesh["tp"] if tp > 1 and etp == 1 else None,
                                      ep_region["ep", "etp"] if etp > 1 else None)
        if run["strategy"] == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            wrapped = DistributedDataParallel(model, gradient_as_bucket_view=run.get("bucket_view", False))
        else:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16) if run["precision"] == "fsdp-bf16" \
                else MixedPrecisionPolicy()
            reshard = run.get("reshard", True)  # (an int: resharded to groups of that many ranks)
            keep = {} if reshard is True else {"reshard_after_forward": reshard}
            if ep > 1:
                shard_experts(experts, ep_region["efsdp"], ep, policy, in_place_reduce_scatter)
            units = [m for m in model.modules() if isinstance(m, block_cls)] + [model]
            for m in units:
                fully_shard(m, mesh=dp_mesh, mp_policy=policy, **keep)
            for m in units:
                m.set_custom_reduce_scatter(in_place_reduce_scatter())
            wrapped = model
        opt = _optimizer(model, run.get("opt", "adamw"))
        for p in model.parameters():
            tracker.register(p)
        out: dict = {}
        last = 2 if run["strategy"] == "ddp" else 1  # DDP rebuilds its buckets in the second iteration
        # two steady-state steps, the smaller peak reported: gloo frees a tensor it sent, or a collective's work its
        # buffers, on its own thread, at a time that varies from run to run (once in many suite runs a step's peak
        # held 19 KB more of them)
        peaks: list[tuple[int, str]] = []
        for it in range(last + 2):
            if it >= last:
                if it == last:
                    for st in opt.state.values():
                        for v in st.values():
                            if isinstance(v, torch.Tensor):
                                tracker.register(v)
                    if os.environ.get("DIST_WORKER_TRACE") == run["id"]:
                        tracker.trace = []
                tracker.reset_peak()
            accum = run.get("accum", 1)
            for micro in range(accum):
                last_micro = micro == accum - 1
                sync = contextlib.nullcontext()
                if run.get("sync") == "every":  # (Composer's loop, accelerate's sync_each_batch: no no_sync)
                    pass
                elif accum > 1 and run["strategy"] == "ddp" and not last_micro:
                    sync = wrapped.no_sync()
                elif accum > 1 and run["strategy"] != "ddp":
                    model.set_requires_gradient_sync(last_micro)
                if run.get("lp"):
                    from torch.distributed.tensor.parallel import loss_parallel

                    sync = _both(sync, loss_parallel())
                batch, named, ring = args, kwargs, contextlib.nullcontext()
                if cp > 1:  # a fresh batch, sharded in place on its sequence dimension (torchtitan's train_context)
                    from torch.distributed.tensor.experimental import context_parallel

                    batch = tuple(torch.randint(0, 250, a.shape) for a in args)
                    named = {k: torch.randint(0, 250, v.shape) for k, v in kwargs.items()}
                    buffers = [*batch, *named.values()]
                    ring = context_parallel(mesh["cp"], buffers=buffers, buffer_seq_dims=[1] * len(buffers),
                                            no_restore_buffers=set(buffers))
                with sync, ring:
                    with torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
                        loss = loss_of(wrapped(*batch, **named))
                    if accum > 1:
                        loss = loss / accum
                    if run.get("zero") == "before_backward" and micro == 0:  # Lightning's order
                        opt.zero_grad(set_to_none=True)
                    loss.backward()
            if run.get("clip"):  # torch's own clip_grad_norm_ on the engine's gradients (DTensors under FSDP2)
                torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], run["clip"])
            opt.step()
            if it >= last:
                peaks.append((tracker.peak, tracker.peak_op))
            if it == last + 1:
                out["peak"], out["peak_op"] = min(peaks, key=lambda p: p[0])
                params = list(model.parameters())
                out["parameters"] = _distinct_bytes(params)
                out["gradients"] = _distinct_bytes([p.grad for p in params if p.grad is not None])
                out["optimizer_state"] = _distinct_bytes(
                    [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)])
                out["local_shapes"] = {n: list(_local(p).shape) for n, p in model.named_parameters()}
                if tracker.trace is not None:
                    out["trace"], tracker.trace = tracker.trace, None
            if run.get("zero") != "before_backward":  # ("in_place": set_to_none=False, the gradients kept)
                opt.zero_grad(set_to_none=run.get("zero") != "in_place")
            del loss
    return out


class _Stepped:
    """Optimizers the loop steps one after the other (Muon, then AdamW), with their state together."""

    def __init__(self, *optimizers):
        self.optimizers = optimizers
        self.state = {k: v for o in optimizers for k, v in o.state.items()}

    def step(self):
        for o in self.optimizers:
            o.step()
        self.state = {k: v for o in self.optimizers for k, v in o.state.items()}

    def zero_grad(self, set_to_none=True):
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)


def _optimizer(model, name: str):
    """``adamw``; ``muon``: torch.optim.Muon on the blocks' Linear weights (the example GPT's attention and MLP
    matrices, written out here), AdamW on the embeddings (the head is tied to one), norms and biases."""
    if name == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert name == "muon", name
    named = list(model.named_parameters())
    hidden = [p for n, p in named if n.startswith("blocks.") and n.endswith("weight") and p.ndim == 2]
    ids = {id(p) for p in hidden}
    return _Stepped(torch.optim.Muon(hidden, lr=2e-2),
                    torch.optim.AdamW([p for _, p in named if id(p) not in ids], lr=1e-3))


def main(argv: list[str]) -> int:
    rank, world_size, init_file, out_path, cfg_json = int(argv[0]), int(argv[1]), argv[2], argv[3], argv[4]
    cfg = json.loads(cfg_json)
    torch.set_num_threads(1)
    import torchvision_env  # (this script's folder): transformers beside PyPI's torchvision and the CPU torch

    torchvision_env.load()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=120))
    try:
        result = {"rank": rank, "world_size": world_size, "runs": {}}
        for case in cfg["cases"]:
            for run in case["runs"]:
                result["runs"][f"{case['name']}/{run['id']}"] = run_one(case, run, world_size)
                dist.barrier()
    finally:
        dist.destroy_process_group()
    tmp = out_path + ".part"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

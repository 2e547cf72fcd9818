"""One rank of a real data-parallel training run on CPU (gloo), for tests/test_plan.py.

Run as ``python tests/dist_worker.py RANK WORLD_SIZE INIT_FILE OUT_JSON CONFIG_JSON``; the
test starts one process per rank.  ``CONFIG_JSON``: ``{"cases": [{"name", "model": GPTConfig fields,
"batch", "seq", "strategies": ["ddp", "fsdp", "fsdp_keep"]}]}``.  Independent of estimator's code: nothing from
``estimator`` is imported here.

For each strategy (``ddp``: ``torch.nn.parallel.DistributedDataParallel`` with its defaults;
``fsdp``: FSDP2 ``fully_shard`` on every ``Block`` and on the root, its defaults, with a
reduce-scatter that does not copy its input (see :func:`in_place_reduce_scatter`); ``fsdp_keep``:
the same with ``reshard_after_forward=False``) the rank

1. builds the example GPT (``examples/gpt.py``) with the config given and real weights;
2. starts a live-storage tracker, then wraps the model and builds ``torch.optim.AdamW``;
3. runs three iterations (forward + loss, ``backward()``, ``step()``,
   ``zero_grad(set_to_none=True)``) and records the peak of live bytes over the third one
   (steady state: optimizer state allocated, gradients ``None`` at the start);
4. measures the model states from the real tensors after the third ``step()``, before
   ``zero_grad``: the distinct storages (``untyped_storage().nbytes()``) of the parameters,
   the gradients and the optimizer state (DTensors by their local shard, ``to_local()``),
   plus each parameter's local shape.

What the peak includes: every storage that a dispatched aten op reads or produces while
the tracker is active, at its current size (FSDP2 frees and re-allocates its unsharded
parameters with ``untyped_storage().resize_()``, outside the dispatcher, so the live total
is re-summed from the storages' current ``nbytes()`` at each op): parameters (the local
shards for FSDP2), optimizer state, inputs, activations, temporaries, gradients, DDP's
gradient buckets (allocated by its reducer through the dispatcher, inside the tracker),
FSDP2's all-gather and reduce-scatter buffers.  What it cannot see: memory gloo allocates
on its worker threads, outside the dispatch mode (on a GPU, NCCL's buffers are likewise
outside ``torch.cuda.max_memory_allocated()``), and temporaries inside a DTensor op (none for
the element-wise optimizer ops run here).
"""

from __future__ import annotations

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
    from torch.distributed.tensor import DTensor

    return t._local_tensor if isinstance(t, DTensor) else t


class ResizeAwareTracker(TorchDispatchMode):
    """Live bytes of every storage seen by a dispatched op, re-summed at each op (storages may be resized)."""

    def __init__(self):
        super().__init__()
        self.storages: dict[int, weakref.ref] = {}
        self.peak = 0
        self.peak_op = ""
        self.trace: list | None = None  # (op, live bytes) samples, when debugging

    def register(self, t: torch.Tensor) -> None:
        t = _local(t)
        if t.device.type == "meta":
            return
        st = t.untyped_storage()
        key = st._cdata
        ref = self.storages.get(key)
        if ref is not None and ref() is st:
            return
        self.storages[key] = weakref.ref(st)
        weakref.finalize(st, self.storages.pop, key, None).atexit = False

    def live(self) -> int:
        total = 0
        for ref in list(self.storages.values()):
            st = ref()
            if st is not None:
                total += st.nbytes()
        return total

    def sample(self, where: str) -> None:
        now = self.live()
        if self.trace is not None:
            self.trace.append((where, now))
        if now > self.peak:
            self.peak, self.peak_op = now, where

    def reset_peak(self) -> None:
        self.peak, self.peak_op = self.live(), "start"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in pytree.tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor):
                self.register(t)
        self.sample(f"before {func}")
        out = func(*args, **kwargs)
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.register(t)
        self.sample(str(func))
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


def build(cfg: dict):
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import gpt

    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(**cfg["model"]))
    idx = torch.randint(0, cfg["model"]["vocab_size"], (cfg["batch"], cfg["seq"]))
    return model, (idx, idx.clone()), gpt.Block


def run(strategy: str, cfg: dict, mesh) -> dict:
    """One strategy: ``ddp``, ``fsdp`` (FSDP2 defaults) or ``fsdp_keep`` (``reshard_after_forward=False``)."""
    model, inputs, block_cls = build(cfg)
    tracker = ResizeAwareTracker()
    with tracker:
        for t in inputs:
            tracker.register(t)
        if strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            wrapped = DistributedDataParallel(model)
        else:
            from torch.distributed.fsdp import fully_shard

            # fsdp: fully_shard's defaults (reshard_after_forward=None: the root keeps its parameters
            # from forward to backward, the others reshard); fsdp_keep: reshard_after_forward=False.
            kw = {"reshard_after_forward": False} if strategy == "fsdp_keep" else {}
            units = [m for m in model.modules() if isinstance(m, block_cls)] + [model]
            for m in units:
                fully_shard(m, mesh=mesh, **kw)
            for m in units:
                m.set_custom_reduce_scatter(in_place_reduce_scatter())
            wrapped = model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for p in model.parameters():
            tracker.register(p)
        out: dict = {}
        for it in range(3):
            if it == 2:
                for st in opt.state.values():
                    for v in st.values():
                        if isinstance(v, torch.Tensor):
                            tracker.register(v)
                tracker.reset_peak()
                out["live_at_start"] = tracker.live()
                if os.environ.get("DIST_WORKER_TRACE"):
                    tracker.trace = []
            loss = wrapped(*inputs)
            loss.backward()
            opt.step()
            if it == 2:
                out["peak"] = tracker.peak
                out["peak_op"] = tracker.peak_op
                params = list(model.parameters())
                out["parameters"] = _distinct_bytes(params)
                out["gradients"] = _distinct_bytes([p.grad for p in params if p.grad is not None])
                out["optimizer_state"] = _distinct_bytes(
                    [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)])
                out["local_shapes"] = {n: list(_local(p).shape) for n, p in model.named_parameters()}
                out["state_shapes"] = {n: {k: list(_local(v).shape) for k, v in opt.state[p].items()}
                                       for n, p in model.named_parameters()}
                out["loss"] = float(loss.detach())
                if tracker.trace is not None:
                    out["trace"] = tracker.trace
                    tracker.trace = None
            opt.zero_grad(set_to_none=True)
            del loss
        if strategy == "ddp":
            data = wrapped._get_ddp_logging_data()
            out["ddp_bucket_sizes"] = data.get("bucket_sizes")
            out["ddp_gradient_as_bucket_view"] = bool(wrapped.gradient_as_bucket_view)
    return out


def main(argv: list[str]) -> int:
    rank, world_size, init_file, out_path, cfg_json = int(argv[0]), int(argv[1]), argv[2], argv[3], argv[4]
    cfg = json.loads(cfg_json)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    try:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (world_size,))  # before any tracker: its rank tensor is not training memory
        result = {"rank": rank, "world_size": world_size, "cases": {}}
        for case in cfg["cases"]:
            out = result["cases"][case["name"]] = {}
            for strategy in case["strategies"]:
                out[strategy] = run(strategy, case, mesh)
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

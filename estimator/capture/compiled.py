"""The step as ``torch.compile`` (Inductor, default mode) runs it, on traced tensors.

What compiling changes in a training step, and where each piece comes from:

* **What forward saves for backward.**  AOTAutograd traces the compiled region's forward and backward
  as one joint graph and splits it with the min-cut partitioner Inductor uses
  (``min_cut_rematerialization_partition(compiler="inductor")``, Inductor's decomposition table):
  cheap pointwise results are recomputed in backward instead of saved.  Here that is PyTorch's own
  code on the traced tensors: each compiled region is an ``aot_function`` whose forward and backward
  graphs run op by op under the recorder, so the saved tensors, the recomputation and every op's
  shape are the compiled step's.
* **Which ops become one kernel.**  Inductor's scheduler fuses the pointwise, reduction and view ops
  of a graph into kernels and calls library kernels (matmuls, convolutions, attention, collectives)
  as they are ("extern kernels").  Its lowering needs a GPU code generator, so the fusion is
  approximated (:func:`fuse`): inside one compiled graph, every connected group of non-library ops
  is one kernel; a tensor made and used only inside a group is never written to memory (no buffer),
  one that a library kernel, the other graph or the caller reads is.  The approximation is stated in
  the report.
* **Regions**: ``"block"``, each block of the model's stack of identical blocks compiled on its own,
  as torchtitan applies ``torch.compile`` (and the rest eager); ``"model"``, the model's forward
  compiled whole (nanoGPT's ``torch.compile(model)``); the loss outside unless the model computes it.

Not modelled: Dynamo's graph breaks (a region AOTAutograd cannot trace runs eager, and the report
says so), CUDA graphs (``mode="reduce-overhead"``), autotuned matmul templates (``max-autotune``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import operator
import sys
import warnings
from typing import Any, Iterator

import torch
import torch.utils._pytree as pytree
from torch.nn.utils.stateless import _reparametrize_module

from ..errors import UserError, from_outside, switch_choice
from ..precision import graph_tracing
from ..timing.optable import (
    ATTENTION_OPS, CONV_BACKWARD_OPS, CONV_OPS, LIBRARY_OPS, MATMUL_OPS, MEMORY_CLASS, RNN_OPS, VIEW_OPS,
)

log = logging.getLogger(__name__)

COMPILE_MODES = ("block", "model")

# Library kernels Inductor calls as they are (extern kernels and fallbacks): their inputs and outputs are buffers
# in memory.  The time model's matmul, convolution, attention, recurrent and cuDNN ops, and these.  Every other
# op of a compiled graph is lowered and fused; views and metadata (the time model's VIEW_OPS) make no kernel.
_FALLBACKS = frozenset({
    "embedding_dense_backward", "_embedding_bag", "_embedding_bag_backward", "sort", "topk", "cumsum", "_unique2",
    "nonzero", "_fused_rms_norm", "_fused_rms_norm_backward", "_fused_adam", "_fused_adamw",
})
_EXTERN = MATMUL_OPS | CONV_OPS | CONV_BACKWARD_OPS | frozenset(ATTENTION_OPS) | RNN_OPS | LIBRARY_OPS | _FALLBACKS


def is_extern(target: Any) -> bool:
    """Whether Inductor runs this op as a library kernel of its own (not fused)."""
    packet = getattr(target, "overloadpacket", None)
    name = getattr(packet, "__name__", "") if packet is not None else ""
    return name in _EXTERN or getattr(target, "namespace", "") in ("c10d", "_c10d_functional")


def is_view(target: Any) -> bool:
    packet = getattr(target, "overloadpacket", None)
    return getattr(packet, "__name__", "") in VIEW_OPS


def check_mode(compile: Any) -> str | None:
    """``compile`` as given to estimate/plan: None/False/"eager" (eager), True or ``"block"``, ``"model"``."""
    return None if compile == "eager" else switch_choice(compile, "compile", COMPILE_MODES, "block")


def compiled_model(model: Any, compile: Any, mode: str = "train") -> tuple[Any, str | None, list[str]]:
    """(the module, its compile mode checked (:func:`check_mode`), what was assumed): a model wrapped by
    ``torch.compile`` (an ``OptimizedModule``, ``model = torch.compile(model)`` before the loop) is its original
    module compiled whole, as the wrapper runs it, unless ``compile`` names a mode (generation: eager, as the
    estimate sizes it)."""
    from torch._dynamo.eval_frame import OptimizedModule

    notes: list[str] = []
    if isinstance(model, OptimizedModule) and isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
        backend = _backend_name(model)
        model = model._orig_mod
        if mode == "generate":
            notes.append("the model is wrapped by torch.compile: its generation is sized eager")
        elif backend == "eager" and (compile is None or compile is False):  # (Dynamo's graphs run as eager ops)
            notes.append("the model is wrapped by torch.compile with backend='eager': its step is the eager one")
        elif compile is None or compile is False:
            compile = "model"
            notes.append("the model is wrapped by torch.compile (an OptimizedModule): its step is estimated as "
                         "the wrapper runs it, the forward compiled whole (compile='model')" + (
                             f"; its backend {backend!r} is modelled as Inductor's (its partition and fusions)"
                             if backend not in ("inductor", None) else ""))
    return model, check_mode(compile), notes


def _backend_name(wrapper: Any) -> str | None:
    """The backend an ``OptimizedModule`` was made with ("inductor", "eager", "aot_eager", ...), None if unknown."""
    convert = getattr(getattr(wrapper, "dynamo_ctx", None), "callback", None)
    for _ in range(4):  # (CatchErrorsWrapper -> ConvertFrame -> the backend's debug wrapper, named as the backend)
        name = getattr(convert, "__name__", None)
        if isinstance(name, str):
            return name
        convert = getattr(convert, "_torchdynamo_orig_backend", None)
    return None


@contextlib.contextmanager
def user_compiled_eager(model: torch.nn.Module, compile: str | None, notes: list[str]) -> Iterator[None]:
    """torch.compile inside the model (a compiled submodule, ``Module.compile()``, a compiled function called in
    forward) run eager during the capture (``torch.compiler.set_stance("force_eager")``): Dynamo and Inductor ran
    on the trace's fake tensors, and Inductor's generated kernels killed the process (SIGSEGV) or failed on a
    device mismatch.  ``notes`` says which submodules, unless ``compile`` models the step compiled (the capture's
    own compilation, AOTAutograd's on its regions, which the stance leaves alone)."""
    from torch._dynamo.eval_frame import OptimizedModule

    paths = [p for p, m in model.named_modules() if p and (isinstance(m, OptimizedModule) or
                                                           getattr(m, "_compiled_call_impl", None) is not None)]
    if paths and compile is None:
        notes.append(f"torch.compile in the model ran eager ({', '.join(paths[:3])}{', ...' if len(paths) > 3 else ''}"
                     f"): its compiled saves and fused kernels are not modelled; compile='block' or 'model' "
                     f"(--compile) models the step compiled")
    called: list[str] = []
    with torch.compiler.set_stance("force_eager"), _compiled_functions_called(called):
        try:
            yield
        finally:
            if called and compile is None:
                names = sorted(set(called))
                notes.append(f"torch.compile'd function{'s' if len(names) > 1 else ''} in forward ran eager "
                             f"({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}): their fused kernels are "
                             f"not modelled")


@contextlib.contextmanager
def _compiled_functions_called(called: list[str]) -> Iterator[None]:
    """Names of the ``torch.compile``'d functions (not torch's own wrappers of compiled modules) entered while
    inside: Dynamo asks ``_callback_from_stance`` for each call's callback (None or False when not compiling), from
    the wrapper whose ``fn`` is the user's function."""
    import torch._dynamo.eval_frame as eval_frame

    original = getattr(eval_frame, "_callback_from_stance", None)
    if original is None:  # another release: nothing is said
        yield
        return

    def spy(callback: Any) -> Any:
        if callback not in (False, None):
            fn = sys._getframe(1).f_locals.get("fn")
            module = getattr(fn, "__module__", None) or ""
            if fn is not None and module.split(".")[0] != "torch":  # (torchvision's own are named)
                called.append(getattr(fn, "__qualname__", None) or type(fn).__name__)
        return original(callback)

    eval_frame._callback_from_stance = spy
    try:
        yield
    finally:
        eval_frame._callback_from_stance = original


_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device)


@contextlib.contextmanager
def _dynamo_compiling() -> Iterator[None]:
    """``torch.compiler.is_compiling()`` true while a region is traced, as under Dynamo: code that asks
    (transformers' mask helpers skip their data-dependent checks) takes the path a compiled model takes."""
    import torch.compiler as compiler

    if not hasattr(compiler, "_is_compiling_flag"):
        yield
        return
    previous, compiler._is_compiling_flag = compiler._is_compiling_flag, True
    try:
        yield
    finally:
        compiler._is_compiling_flag = previous


class _Region:
    """One compiled module: its forward replaced by an AOTAutograd function of (parameters, buffers,
    tensor inputs), compiled at its first call with the recorder off (the non-tensor arguments baked in,
    as Dynamo specializes on them; a new graph for other ones or other shapes), then run under the
    recorder."""

    def __init__(self, module: torch.nn.Module, recorder: Any, pause: Any, path: str, split: Any) -> None:
        self.module, self.rec, self.pause, self.path, self.split = module, recorder, pause, path, split
        self.forward = module.forward  # the bound method the graph traces
        self.graphs: dict[tuple, Any] = {}
        self.failed: str | None = None

    def _aot(self, leaves: list, spec: Any, where: list[int], out: dict) -> Any:
        import torch._inductor.lowering  # noqa: F401  (the partitioner reads Inductor's fallback ops from it)
        from functorch.compile import aot_function, min_cut_rematerialization_partition
        from torch._inductor.decomposition import select_decomp_table

        forward, module = self.forward, self.module

        def f(state: dict, tensors: list) -> list:
            flat = list(leaves)
            for i, t in zip(where, tensors):
                flat[i] = t
            args, kwargs = pytree.tree_unflatten(flat, spec)
            with _reparametrize_module(module, state, tie_weights=True, strict=False):
                result = forward(*args, **kwargs)
            flat_out, out["spec"] = pytree.tree_flatten(result)
            bad = [type(x).__name__ for x in flat_out if not isinstance(x, (torch.Tensor, *_PLAIN))]
            if bad:
                raise TypeError(f"the output holds a {bad[0]}, which the graph cannot return")
            out["leaves"] = [_TENSOR if isinstance(x, torch.Tensor) else x for x in flat_out]
            return [x for x in flat_out if isinstance(x, torch.Tensor)]

        rec = self.rec

        def compiler(gm: torch.fx.GraphModule, _inputs: Any) -> Any:
            def run(args: list) -> Any:  # the forward graph, or the backward one when autograd calls it
                # boxed, as Inductor's compiled code runs: the argument list is emptied and each value freed
                # after its last use (the saved activations die one by one in backward, not at its end)
                previous, rec.compiled = rec.compiled, True
                try:
                    return torch.fx.Interpreter(gm, garbage_collect_values=True).boxed_run(args)
                finally:
                    rec.compiled = previous

            run._boxed_call = True  # type: ignore[attr-defined]
            return run

        # On the CPU target, Inductor's own partition: its joint-graph passes (pattern rewrites for the device the
        # graph is on) and then the min-cut, as a real CPU compile runs them (the min-cut alone saved +11 % on a
        # Swin, one tensor more on most transformers).  The graph is on the CPU whatever the target, so on the CUDA
        # target the CPU's passes would be the wrong device's (GPT-2 compiled whole: peak 1.50x an H100's): the
        # min-cut alone, which the H100's compiled steps check (tests/test_compile.py)
        if self.rec.target == "cpu":
            partition = _inductor_partition
        else:
            partition = functools.partial(min_cut_rematerialization_partition, compiler="inductor")
        # attention stays the fused kernel the target's dispatcher picks (Inductor calls it as an extern kernel):
        # the table's entry for it (added once Inductor's compile path is imported) would decompose it through
        # the CPU's math path
        table = {op: fn for op, fn in select_decomp_table().items()
                 if op is not torch.ops.aten.scaled_dot_product_attention.default}
        return aot_function(f, compiler, compiler, partition_fn=partition, decompositions=table)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.failed is not None:
            return self.forward(*args, **kwargs)
        state = {**dict(self.module.named_parameters()), **dict(self.module.named_buffers())}
        leaves, spec = pytree.tree_flatten((args, kwargs))
        where = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        tensors = [leaves[i] for i in where]
        key = (str(spec), tuple(repr(x) if i not in where else (tuple(x.shape), x.dtype, x.requires_grad)
                                for i, x in enumerate(leaves)))
        graph = self.graphs.get(key)
        if graph is None:
            out: dict = {}
            try:
                odd = [type(x).__name__ for x in leaves if not isinstance(x, (torch.Tensor, *_PLAIN))]
                if odd:  # state the graph would mutate (a KV cache): Dynamo traces it, AOTAutograd cannot
                    raise TypeError(f"an argument of type {odd[0]} (for a transformers model, use_cache=False)")
                _refuse_rnns(self.module)
                fn = self._aot([None if i in where else x for i, x in enumerate(leaves)], spec, where, out)
                # the compilation (and its first run) is not the step; AOTAutograd traces the backward under anomaly
                # mode, whose "Error detected in ..." warning precedes the failure caught below
                with self.pause(), graph_tracing(), _dynamo_compiling(), warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message="Error detected in ", category=UserWarning)
                    # on copies: the graph of this run holds its inputs in a reference cycle, which no collection
                    # frees during the step (a block's input kept to the end: +1 % to +6 % on the peak)
                    fn(state, [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors])
                graph = self.graphs[key] = (fn, out)
            except Exception as exc:  # a region AOTAutograd cannot trace runs eager (Dynamo's graph break)
                if from_outside(exc):
                    raise
                log.debug("compiling %s failed", type(self.module).__name__, exc_info=True)
                self.failed = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
                self.split(self)  # its submodules compiled instead, as Dynamo's graph breaks split a graph
                return self.forward(*args, **kwargs)
        fn, out = graph
        results = iter(fn(state, tensors))
        return pytree.tree_unflatten([next(results) if x is _TENSOR else x for x in out["leaves"]], out["spec"])


_TENSOR = object()  # where a region's flattened output holds a tensor (a None beside it is an output of its own)


def _refuse_rnns(module: torch.nn.Module) -> None:
    """Dynamo does not compile ``nn.RNN``/``LSTM``/``GRU`` (``torch._dynamo.config.allow_rnn`` is off by default:
    "Attempted to wrap RNN, GRU, or LSTM"): a graph break there, the recurrent module eager. AOTAutograd traces
    them, so a region holding one was modelled compiled (an LSTM model's saves 0.40x a real compiled step's)."""
    import torch._dynamo.config as dynamo_config

    rnn = next((type(m).__name__ for m in module.modules() if isinstance(m, torch.nn.RNNBase)), None)
    if rnn is not None and not getattr(dynamo_config, "allow_rnn", False):
        raise TypeError(f"Dynamo does not compile {rnn} (torch._dynamo.config.allow_rnn=False): it runs eager")


def _inductor_partition(joint: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
    """Inductor's ``partition_fn`` with the joint graph's fake mode as Inductor's virtualized one, which
    ``compile_fx`` sets around it (its pass fusing the seeds of random ops reads it: any dropout in a region failed,
    ran eager, and saved +29.5 % over a real compiled step on an MLP, +13-14 % on GPT-2)."""
    from torch._guards import detect_fake_mode
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.virtualized import V

    vals = [n.meta.get("val") for n in joint.graph.nodes if n.op == "placeholder"]
    mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    if mode is None:
        return partition_fn(joint, joint_inputs, **kwargs)
    with V.set_fake_mode(mode):
        return partition_fn(joint, joint_inputs, **kwargs)


def region_modules(model: torch.nn.Module, mode: str) -> list[tuple[str, torch.nn.Module]]:
    """The modules ``mode`` compiles: each block of the model's stack ("block"; the whole model without one) or
    the whole model ("model")."""
    from .blocks import find_repeats

    repeats = find_repeats(model, minimum=2) if mode == "block" else None
    if repeats is None:
        return [("", model)]
    return [(f"{repeats.path}.{i}", m) for i, m in enumerate(model.get_submodule(repeats.path))]


def check_checkpoint_regions(model: torch.nn.Module, mode: str | None, classes: tuple[type, ...]) -> None:
    """A checkpointed module inside a compiled region, refused in one line: the region is traced as one graph
    with the checkpoint's ops inline, so its recomputation is not modelled (the what-if read the compiled step
    without checkpointing: +26 % against a real compiled step of checkpointed blocks)."""
    if mode is None or not classes:
        return
    for path, region in region_modules(model, mode):
        inner = next((type(m).__name__ for m in region.modules() if m is not region and isinstance(m, classes)), None)
        if inner is not None:
            where = f"inside the compiled {type(region).__name__} blocks" if path else "inside the compiled model"
            raise UserError(f"checkpoint {inner} {where} is not modelled (its recomputation inside one compiled "
                            f"graph): checkpoint the compiled block's class with compile='block', or drop compile")


@contextlib.contextmanager
def compiled_regions(model: torch.nn.Module, mode: str, recorder: Any, pause: Any,
                     notes: list[str]) -> Iterator[None]:
    """``model`` with the regions of ``mode`` compiled (their ``forward`` replaced), put back on exit;
    ``notes`` gets what was compiled and what ran eager."""
    modules = region_modules(model, mode)
    if mode == "block" and modules[0][0]:
        notes.append(f"torch.compile per block (each {type(modules[0][1]).__name__} of "
                     f"{modules[0][0].rpartition('.')[0]}) as torchtitan applies it; the rest of the model eager")
    elif mode == "block":
        notes.append("torch.compile per block: the model has no stack of identical blocks, so it is compiled whole")
    else:
        notes.append("torch.compile of the whole model's forward (the loss eager unless the model computes it)")
    regions: list[_Region] = []
    own: list[Any] = []  # a forward set on the instance itself, put back on exit

    def install(path: str, module: torch.nn.Module) -> None:
        region = _Region(module, recorder, pause, path, split)
        own.append(module.__dict__.get("forward"))
        regions.append(region)
        module.forward = region

    def split(region: _Region) -> None:
        """Compile the submodules of a region that failed, each on its own (containers looked into)."""
        for name, child in region.module.named_children():
            split_one(f"{region.path}.{name}" if region.path else name, child)

    def split_one(path: str, child: torch.nn.Module) -> None:
        if isinstance(child.__dict__.get("forward"), _Region):
            return
        if isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            for name, sub in child.named_children():
                split_one(f"{path}.{name}", sub)
        else:
            install(path, child)

    for path, module in modules:
        install(path, module)
    try:
        yield
    finally:
        for region, previous in zip(reversed(regions), reversed(own)):
            if previous is None:
                del region.module.forward  # the class's forward again
            else:
                region.module.forward = previous
        failed = [r for r in regions if r.failed]
        if failed:
            leaves = [r for r in failed if not any(c.path.startswith(r.path) and c is not r for c in regions)
                      or not list(r.module.children())]
            first = failed[0]
            whole = [r.path or "the model" for r in failed if r not in leaves]
            notes.append(f"torch.compile: {first.path or 'the model'} could not be traced whole by AOTAutograd "
                         f"({first.failed}); its submodules compiled one by one instead, as Dynamo's graph breaks "
                         f"split it" + (f": the ops in the forward of {', '.join(whole)} (outside its submodules) "
                                        f"run eager" if whole else "")
                         + (f"; {len(leaves)} module(s) run eager, not compilable either" if leaves else ""))
        convs = sum(isinstance(m, torch.nn.modules.conv._ConvNd) and m.groups == 1 and max(m.kernel_size) > 1
                    for _, r in modules for m in r.modules())  # (a 1x1 kernel's weight has one layout: no copy)
        if convs:  # (docs/compile.md: a ResNet's compiled peak -17 %, a ConvNeXt's -10.5 % without them)
            notes.append(f"torch.compile: Inductor's copies of convolution weights in its preferred layout (saved for "
                         f"backward, up to one per convolution wider than 1x1: {convs} here) are not counted: the peak "
                         f"may be low by up to about twice their bytes (measured on CPU: ViT's stem 2.3x, "
                         f"MLP-Mixer's 2x)")
        notes.append("torch.compile: what forward saves is AOTAutograd's min-cut partition (Inductor's); "
                     "Inductor's fusion approximated: each connected group of non-library ops in a compiled "
                     "graph is one kernel whose inner tensors take no memory")


# -- Inductor's fusion, approximated ------------------------------------------------------------------

_KEPT = ("parameter", "buffer", "input", "gradient", "optimizer_state", "saved", "loss", "output", "engine")


def _graph_key(meta: dict) -> tuple:
    """Which compiled graph an op belongs to: forward or backward, of which module, in which micro-step."""
    return ("bw" if meta.get("phase") == "backward" else "fw", meta.get("module", ""), meta.get("micro_step", 0))


def fuse(cap: Any) -> int:
    """Inductor's fusion on a capture with compiled regions, approximated: in each compiled graph the
    ops that are neither library kernels (:func:`is_extern`) nor views form kernels, a producer and its
    consumer in one kernel when no library kernel lies between them (the consumer reads no result of a
    library kernel that ran after the producer: both are at the same *library depth*, the most library
    kernels on a path from the graph's inputs); a storage made by such a kernel and read only inside it is
    never written (its bytes set to 0: no block, no traffic), one read by a library kernel, another kernel
    or graph, eager code, or kept (saved for backward, an output, a gradient) is a buffer.  Each fused op
    gets ``meta["kernel"]`` (its kernel's first op index).  Returns the number of kernels."""
    nodes = cap.nodes
    index = {id(n): i for i, n in enumerate(nodes)}
    compiled = [bool(n.meta.get("compiled")) for n in nodes]
    extern = [is_extern(n.target) for n in nodes]
    view = [is_view(n.target) for n in nodes]
    fusible = [c and not e and not v for c, e, v in zip(compiled, extern, view)]
    keys = [_graph_key(n.meta) for n in nodes]

    def producer(record: Any) -> int | None:
        i = index.get(id(record))
        if i is None and getattr(record, "target", None) is operator.getitem:
            i = index.get(id(record.args[0]))
        return i

    inputs: list[list[int]] = []
    depth = [0] * len(nodes)  # library kernels on the longest path from the graph's inputs to the op
    for i, n in enumerate(nodes):
        ins = [q for a in pytree.tree_leaves((n.args, n.kwargs)) if isinstance(getattr(a, "meta", None), dict)
               for q in (producer(a),) if q is not None]
        inputs.append(ins)
        if compiled[i]:
            depth[i] = max((depth[q] + extern[q] for q in ins if compiled[q] and keys[q] == keys[i]), default=0)
    made_by: dict[int, int] = {}
    for i, sid, delta in cap.events:
        if delta > 0 and i >= 0:
            made_by.setdefault(sid, i)
    readers: dict[int, set[int]] = {}
    for i, n in enumerate(nodes):
        if view[i]:
            continue  # a view reads nothing: its readers read the storage
        for a in pytree.tree_leaves((n.args, n.kwargs)):
            meta = getattr(a, "meta", None)
            if isinstance(meta, dict):
                for sid in meta.get("storage", ()):
                    readers.setdefault(sid, set()).add(i)
    parent = list(range(len(nodes)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for sid, users in readers.items():
        p = made_by.get(sid)
        if p is None or not fusible[p] or _full_reduction(nodes[p]):
            continue  # (a reduction to one value, float8's amax: its readers wait for the whole grid)
        for u in users:
            if fusible[u] and keys[u] == keys[p] and depth[u] == depth[p]:
                a, b = find(u), find(p)
                parent[max(a, b)] = min(a, b)
    kept = set().union(*(cap.sids.get(k, set()) for k in _KEPT))
    for sid, p in made_by.items():
        if not fusible[p] or sid in kept:
            continue
        users = readers.get(sid)
        if users and all(fusible[u] and find(u) == find(p) for u in users):
            cap.storage_bytes[sid] = 0
    members: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        if fusible[i]:
            n.meta["kernel"] = find(i)
            members.setdefault(find(i), []).append(i)
    for group in members.values():
        nodes[group[-1]].meta["fused"] = _kernel_bytes(cap, nodes, group, made_by)
    return len(members)


def _full_reduction(node: Any) -> bool:
    """A reduction of a tensor to a single value (tensorwise float8's amax): a kernel of its own, since no
    element of a consumer can be computed before the whole input is read."""
    name = getattr(getattr(node.target, "overloadpacket", None), "__name__", "")
    spec = (node.meta.get("spec") or (None,))[0]
    return MEMORY_CLASS.get(name) == "reduction" and spec is not None and math.prod(spec.shape) == 1


def _kernel_bytes(cap: Any, nodes: list, group: list[int], made_by: dict[int, int]) -> dict:
    """One fused kernel's traffic: each storage it reads that it does not make (once, at the shape read),
    each buffer it writes (its bytes), and the dtype of its first output."""
    inside = set(group)
    read: dict[int, int] = {}
    written = 0
    for i in group:
        n = nodes[i]
        for a in pytree.tree_leaves((n.args, n.kwargs)):
            meta = getattr(a, "meta", None)
            if not isinstance(meta, dict) or not meta.get("spec"):
                continue
            spec = meta["spec"][0]
            for sid in meta.get("storage", ())[:1]:
                if made_by.get(sid) not in inside and spec is not None:
                    read[sid] = max(read.get(sid, 0), math.prod(spec.shape) * spec.dtype.itemsize)
        for sid in n.meta.get("storage", ()):
            if made_by.get(sid) == i:
                written += cap.storage_bytes[sid]
    spec = (nodes[group[0]].meta.get("spec") or (None,))[0]
    dtype = str(spec.dtype).removeprefix("torch.") if spec is not None else None
    return {"read": sum(read.values()), "written": written, "dtype": dtype}

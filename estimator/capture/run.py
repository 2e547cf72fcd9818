""":func:`capture`, the entry point: the step on fake tensors, and the fallback to small real CPU
tensors when the fake trace meets data-dependent control flow and the model fits in memory
(the report then says so).  A fake trace that fails otherwise is a user error (bad shapes or
dtypes) or an op whose fake kernel rejects these arguments: either way the error names the op;
never a silent trace on real tensors, which would allocate the model for real.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from typing import Any

import torch

from ..errors import DataDependentError, UnsupportedModelError, UserError
from ..loop import is_none
from ..optim import whole_model_notes
from .inputs import split_inputs
from .blocks import TRACED_BLOCKS, find_repeats, truncated
from .caches import clear_method_caches, method_caches_cleared
from .compiled import user_compiled_eager
from .eager_paths import eager_paths, fast_path_failed, mha_slow_path
from .options import Capture, Progress, ReadsValues, StepFailed, StepOptions
from .replicate import NotReplicable, expand
from .step import Step

log = logging.getLogger(__name__)


# -- the public entry point and its fallbacks -----------------------------------------------


def _refuse_engine_wrappers(model: torch.nn.Module) -> None:
    """A model the user wrapped in a data-parallel engine (DistributedDataParallel, FSDP1): its buffers (DDP's
    gradient buckets, a second copy of the gradients: -14.8 % of a real DDP step's peak) are what ``plan`` traces,
    not one device's step; refused in one line, with the two answers there are."""
    from torch.nn.parallel import DistributedDataParallel

    wrappers: tuple[type, ...] = (DistributedDataParallel,)
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

        wrappers += (FullyShardedDataParallel, FSDPModule)  # (FSDP1's wrapper; FSDP2's fully_shard-ed modules)
    except ImportError:  # (a torch built without distributed)
        pass
    path, engine = next(((p, m) for p, m in model.named_modules() if isinstance(m, wrappers)), (None, None))
    if engine is not None:
        where = "the model is" if not path else f"its module {path} is"
        kind = "FSDP2 (fully_shard)" if "FSDPModule" in [c.__name__ for c in type(engine).__mro__] \
            else type(engine).__name__
        raise UserError(f"{where} wrapped by {kind}, whose buffers (gradient buckets, shards) estimate does not "
                        f"trace: plan the engine's step with estimator.plan.plan(model, inputs, strategy='ddp' or "
                        f"'fsdp', gpus=N) on the unwrapped model, or estimate the unwrapped model for one device")


def _refuse_sparse_gradients(model: torch.nn.Module) -> None:
    """A one-line error for embeddings with sparse gradients (``nn.Embedding(sparse=True)``, ``EmbeddingBag``): a
    sparse COO gradient (indices and values aliasing the step's tensors) is not traced."""
    sparse = [path or type(mod).__name__ for path, mod in model.named_modules()
              if isinstance(mod, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and mod.sparse
              and mod.weight.requires_grad]
    if sparse:
        raise UserError(f"{sparse[0]}{f' and {len(sparse) - 1} more' if len(sparse) > 1 else ''}: sparse embedding "
                        "gradients (sparse=True) are not modelled; estimate with sparse=False, whose dense gradient "
                        "(the table's size) bounds the sparse one from above")


def capture(model: torch.nn.Module, inputs: Any, options: StepOptions | None = None, *, mode: str = "auto",
            progress: Progress | None = None, **kwargs: Any) -> Capture:
    """Capture one training step of ``model`` on ``inputs``.

    ``options`` (or the same fields as keyword arguments) say how the step runs.
    ``mode``: ``"fake"`` (never allocate), ``"real"`` (small real CPU tensors),
    or ``"auto"`` (fake, falling back to real only when the model fits in memory and
    the fake trace meets data-dependent control flow; the report then says so).
    ``progress(stage, detail)`` is called as the step advances (each module entered in forward,
    then each phase).
    """
    if not isinstance(model, torch.nn.Module):
        raise UserError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    opts = options or StepOptions(**kwargs)
    from torch.nn.parameter import is_lazy

    lazy = [n for n, p in itertools.chain(model.named_parameters(), model.named_buffers()) if is_lazy(p)]
    if lazy:
        raise UserError(f"the model's lazy modules are not initialised ({lazy[0]}"
                        f"{f' and {len(lazy) - 1} more' if len(lazy) > 1 else ''}): run one forward on a batch "
                        f"(model(x)) first, as torch needs before an optimizer is built over them")
    if opts.train:
        _refuse_sparse_gradients(model)
        if opts.prepare is None:
            _refuse_engine_wrappers(model)
    args, kw = split_inputs(inputs)
    if mode not in ("auto", "fake", "real"):
        raise ValueError(f"mode must be 'auto', 'fake' or 'real', not {mode!r}")
    if opts.prepare is not None:
        mode = "fake"  # a model traced as it is has no real weights to fall back on
    slow = False  # nn.MultiheadAttention's inference fast path traced as its standard path (see mha_slow_path)
    while True:
        try:
            with without_layer_drop(model) as assumed, same_random_draws(), eager_paths(), attributes_kept(model), \
                    method_caches_cleared(model), user_compiled_eager(model, opts.compile, assumed), \
                    mha_slow_path(slow, assumed):
                cap = _capture(model, args, kw, opts, mode, progress)
            break
        except UserError as exc:
            if slow or not fast_path_failed(model, opts.train, exc):
                raise
            slow = True
    cap.assumptions.extend(assumed)
    cap.assumptions.extend(_loop_notes(model, opts, cap))
    first = next(iter([*args, *kw.values()]), None)
    if isinstance(first, (list, tuple)) and first and all(isinstance(t, torch.Tensor) and t.ndim == 3 for t in first):
        cap.samples = len(first)  # a list of images (C x H x W), one per sample
    held_cache = sum(cap.storage_bytes[s] for s in cap.sids.get("output_cache", ()))
    if held_cache and not opts.train and opts.generation is None:
        cap.assumptions.append(f"inference: the output holds the model's cache (past_key_values, config.use_cache: "
                               f"{held_cache / 2**20:,.2f} MiB), alive with it until the next forward returns (a loop "
                               f"that keeps only the logits, or use_cache=False: --set use_cache=false, holds none)")
    cap.assumptions.extend(_reference_paths(cap))
    _tag_subclass_layers(cap)
    if opts.compile is not None:
        from .compiled import fuse

        fuse(cap)
    return cap


# Layers whose forward and backward run their ops on a Python tensor subclass (torchao's Float8Linear: its
# Float8TrainingTensor, autograd.Functions and scaling code in Python around every op; FSDP2 renames the class
# FSDPFloat8Linear): in eager each of their ops costs more host time (estimator.timing.host).
SUBCLASS_LAYERS = ("Float8Linear",)


def _loop_notes(model: torch.nn.Module, opts: StepOptions, cap: Capture) -> list[str]:
    """What the user's loop does that the estimate does not run: hooks registered on parameters (the capture
    runs the step on stand-ins for them), and an optimizer given as an instance over part of the trainable
    parameters (the loop's ``optimizer.zero_grad()`` never frees the other gradients: those the step gives one)."""
    notes = []
    params = [p for p in model.parameters() if p.requires_grad]
    hooked = [p for p in params
              if getattr(p, "_backward_hooks", None) or getattr(p, "_post_accumulate_grad_hooks", None)]
    if hooked:
        notes.append(f"hooks registered on {len(hooked)} parameters (register_hook, "
                     f"register_post_accumulate_grad_hook) are not run by the estimate: a hook that changes a "
                     f"gradient or steps an optimizer in backward (freeing each gradient as it is made) changes "
                     f"the real step's memory")
    spec = opts.optimizer
    if opts.train and not params and not is_none(spec):  # (torch.optim refuses an empty parameter list)
        if opts.ema is not None:
            raise UserError("ema averages the trained weights, and no parameter of the model requires grad: drop ema, "
                            "or set requires_grad on the parameters to train")
        notes.append("no parameter of the model requires grad: no optimizer step (torch.optim refuses an empty "
                     "parameter list); the step is the forward, the loss and the backward to the inputs")
    given = spec if isinstance(spec, (list, tuple)) else [spec]
    if opts.train and given and all(isinstance(o, torch.optim.Optimizer) for o in given):
        held = {id(p) for o in given for g in o.param_groups for p in g["params"]}
        outside = [p for n, p in model.named_parameters() if p.requires_grad and id(p) not in held and n in cap.grads]
        if outside:
            nbytes = sum(p.numel() * p.element_size() for p in outside)
            notes.append(f"{len(outside)} trainable parameters ({nbytes / 2**20:,.2f} MiB) are in no optimizer given: "
                         f"they get gradients, which optimizer.zero_grad() never frees (they stay allocated between "
                         f"steps in a real loop); freeze them (requires_grad_(False)) if they are not trained")
    return notes


def _reference_paths(cap: Capture) -> list[str]:
    """What the step ran as transformers' PyTorch reference code because optional CUDA kernels are not installed
    here: a state-space model's mixers (``mamba_ssm``, ``causal_conv1d``), which a GPU with them runs as fused
    kernels (faster, fewer intermediates)."""
    import importlib.util

    mixers = sorted({cls for cls in cap.module_types.values() if cls.endswith("Mixer")
                     and ("Mamba" in cls or cls in ("BambaMixer", "FalconH1Mixer"))})  # (transformers' SSM mixers)
    missing = [m for m in ("mamba_ssm", "causal_conv1d") if importlib.util.find_spec(m) is None]
    if not mixers or not missing:
        return []
    return [f"{', '.join(mixers)}: transformers' PyTorch reference path ({' and '.join(missing)} not installed "
            f"here), a sequential scan; with those CUDA kernels the step runs fused kernels, faster and with fewer "
            f"intermediates"]


def _tag_subclass_layers(cap: Capture) -> None:
    """``meta["subclass"] = True`` on the ops of :data:`SUBCLASS_LAYERS` (forward, and backward as credited to
    the module)."""
    paths = {p for p, cls in cap.module_types.items() if cls.endswith(SUBCLASS_LAYERS)}
    if paths:
        for n in cap.nodes:
            if n.meta.get("module") in paths:
                n.meta["subclass"] = True


def _capture(model: torch.nn.Module, args, kw, opts: StepOptions, mode: str, progress: Progress | None) -> Capture:
    if mode == "real":
        return _drawn(_real(model, args, kw, opts, progress), args, kw)
    try:
        replicated = _replicated(model, args, kw, opts, progress)
        if replicated is not None:
            return replicated
        return Step(model, args, kw, opts, fake=True, progress=progress).run()
    except ReadsValues as exc:
        if opts.prepare is not None:  # an engine (DDP, FSDP2, TP) traced on a fake process group
            raise DataDependentError(f"{exc}: data-dependent control flow cannot be traced on fake tensors, and "
                                     f"the data-parallel and tensor-parallel engines are traced on fake tensors "
                                     f"only; make the branch depend on shapes only, or plan a zero1/zero2/zero3 "
                                     f"layout (traced on one device)") from exc.__cause__
        if mode == "fake":
            raise DataDependentError(f"{exc}: data-dependent control flow cannot be traced on fake tensors; "
                                     f"allow a trace on real CPU tensors (trace='auto')") from exc.__cause__
        if not _fits_in_memory(model):
            raise UnsupportedModelError(
                f"{exc}: data-dependent control flow cannot be traced on fake tensors and the model "
                f"is too large to trace on real ones; make the branch shape-only or pass smaller shapes"
            ) from exc.__cause__
        reason = str(exc)
    # A fake trace that fails otherwise (StepFailed) is a user error (bad shapes or dtypes: a real trace
    # would fail the same way) or an op whose fake kernel rejects these arguments: either way the error
    # names the op.  Never a silent trace on real tensors, which would allocate the model for real.
    log.info("%s; capturing again on real CPU tensors", reason)
    cap = _drawn(_real(model, args, kw, opts, progress), args, kw)
    cap.fallback_reason = reason
    return cap


def _drawn(cap: Capture, args, kw) -> Capture:
    """``cap`` (traced on real CPU tensors) with the report's line on the inputs given without values (meta or
    fake), whose values the real step drew (:func:`.inputs.materialize`)."""
    import torch.utils._pytree as pytree

    from .inputs import is_real

    if any(isinstance(t, torch.Tensor) and not is_real(t) for t in pytree.tree_leaves((args, kw))):
        cap.assumptions.append("the model reads tensor values and some inputs were given as meta or fake tensors, "
                               "which have none: their integer and boolean elements were taken as ones (every mask "
                               "position kept, token id 1), floats drawn at random; pass real tensors for the values "
                               "of your data")
    return cap


@contextlib.contextmanager
def without_layer_drop(model: torch.nn.Module):
    """LayerDrop off for the capture (wav2vec2, HuBERT, WavLM, data2vec-audio, and any module with a
    ``layerdrop`` probability or a configuration's): a step skips each layer with that probability, drawn
    at random, so an estimate would change from run to run.  Every layer is counted, the most a step can
    cost, and the report says so.  Yields the list of what was assumed; the model is restored after."""
    restore: list[tuple[Any, float]] = []
    seen: set[int] = set()
    for module in model.modules():
        for holder in (module, getattr(module, "config", None)):
            if holder is None or id(holder) in seen:
                continue
            seen.add(id(holder))
            value = getattr(holder, "layerdrop", None) if not isinstance(holder, torch.nn.Module) else \
                holder.__dict__.get("layerdrop")
            if isinstance(value, float) and value > 0:
                restore.append((holder, value))
                setattr(holder, "layerdrop", 0.0)
    notes = [f"LayerDrop off (probability {max(v for _, v in restore):g}): every layer counted, the most a step "
             f"can cost"] if restore else []
    try:
        yield notes
    finally:
        for holder, value in restore:
            setattr(holder, "layerdrop", value)


_MODULE_STORES = frozenset({"_parameters", "_buffers", "_modules"})  # (put back by the capture itself)


def _holds_tensor(value: Any, depth: int = 2) -> bool:
    """A tensor, or a list, tuple or dict holding one (``depth`` levels down)."""
    if isinstance(value, torch.Tensor):
        return True
    if depth and isinstance(value, (list, tuple)):
        return any(_holds_tensor(v, depth - 1) for v in value)
    if depth and isinstance(value, dict):
        return any(_holds_tensor(v, depth - 1) for v in value.values())
    return False


def _same_items(now: Any, before: Any) -> bool:
    """Whether a list or dict holds the same objects as its copy (by identity: tensors are not compared)."""
    if isinstance(now, dict):
        return now.keys() == before.keys() and all(now[k] is before[k] for k in now)
    return len(now) == len(before) and all(a is b for a, b in zip(now, before))


@contextlib.contextmanager
def attributes_kept(model: torch.nn.Module):
    """The tensors the step assigns to the model's modules put back as they were after the capture: a forward
    that keeps state (``self.prev = h.detach()``, a cache built at the first call, a forward hook storing
    features, old ``weight_norm``'s recomputed ``weight``, a buffer registered in forward) left the capture's
    fake tensors on the user's module (its own forward then returned fake tensors, ``copy.deepcopy`` failed, and
    ``validate``, which copies the model, crashed) or real state that changed the next estimate."""
    saved = []
    for mod in model.modules():
        if not isinstance(mod.__dict__.get("_buffers"), dict):  # (a TorchScript module keeps its own state)
            continue
        attrs = {k: v for k, v in mod.__dict__.items() if k not in _MODULE_STORES}
        # (a list or dict the forward fills in place, a hook's ``self.feats.append(out)``: its items too)
        items = {k: list(v) if type(v) is list else dict(v) for k, v in attrs.items() if type(v) in (list, dict)}
        saved.append((mod, attrs, items, set(mod._buffers)))
    try:
        yield
    finally:
        for mod, attrs, items, buffers in saved:
            state = mod.__dict__
            for key in [k for k in state if k not in _MODULE_STORES and k not in attrs and _holds_tensor(state[k])]:
                del state[key]
            for key, value in attrs.items():
                now = state.get(key, value)
                if now is not value and (_holds_tensor(value) or _holds_tensor(now)):
                    state[key] = value
                elif key in items and _holds_tensor(value) and not _same_items(value, items[key]):
                    if type(value) is list:
                        value[:] = items[key]
                    else:
                        value.clear()
                        value.update(items[key])
            for name in [n for n in mod._buffers if n not in buffers]:
                del mod._buffers[name]


@contextlib.contextmanager
def same_random_draws(seed: int = 0):
    """Python's, NumPy's (if imported) and torch's CPU generators seeded for the capture and restored after:
    random control flow the model draws itself (SpecAugment's masks in wav2vec2 and HuBERT, stochastic depth
    written by hand) takes the same draw on every run, so the same model gives the same estimate."""
    import random
    import sys

    numpy = sys.modules.get("numpy")
    states = (random.getstate(), numpy.random.get_state() if numpy is not None else None, torch.get_rng_state())
    random.seed(seed)
    if numpy is not None:
        numpy.random.seed(seed)
    torch.manual_seed(seed)
    try:
        yield
    finally:
        random.setstate(states[0])
        if numpy is not None:
            numpy.random.set_state(states[1])
        torch.set_rng_state(states[2])


def _real(model: torch.nn.Module, args, kw, opts: StepOptions, progress: Progress | None) -> Capture:
    """The step traced on real CPU tensors; a failure that still reads as data-dependent (an op whose kernel
    refuses these values) is an :class:`UnsupportedModelError`, never the capture's internal signal.

    The forward (and loss) runs on real tensors, where the model reads values; where one micro-step is
    traced, eagerly, and the forward's ops were large (``step.FAKE_BACKWARD_OP_BYTES``), the backward and the
    optimizer step then run on fake tensors (what they compute is read by nothing); a fake backward that
    reads values after all is traced again on real tensors throughout."""
    hybrid = opts.train and opts.grad_accum == 1 and opts.generation is None and opts.compile is None
    clear_method_caches(model)  # (what a fake trace before it left in them: fake tensors)
    step = Step(model, args, kw, opts, fake=False, progress=progress, fake_backward=hybrid)
    try:
        return step.run()
    except ReadsValues as exc:
        if step.fake_mode is None:  # read on real tensors: the step cannot run on these values
            raise _fails_for_real(exc) from exc.__cause__
        log.info("%s; tracing backward on real CPU tensors too", exc)
    try:
        return Step(model, args, kw, opts, fake=False, progress=progress).run()
    except ReadsValues as exc:
        raise _fails_for_real(exc) from exc.__cause__


def _fails_for_real(exc: ReadsValues) -> UnsupportedModelError:
    return UnsupportedModelError(f"{exc}: the step fails on real CPU tensors too ({exc.__cause__!r:.200}); "
                                 f"check the inputs' values and shapes")


def _replicated(model: torch.nn.Module, args: tuple, kw: dict, opts: StepOptions,
                progress: Progress | None) -> Capture | None:
    """The step traced with four blocks of the model's stack of identical blocks and the rest replicated
    (:mod:`.replicate`); None where there is no such stack, or the blocks do not run alike (a full
    trace follows)."""
    # (not generate(): its cache holds a row per layer of the whole model, which four blocks would not fill)
    repeats = find_repeats(model) if opts.replicate and opts.generation is None else None
    if repeats is None or repeats.count <= TRACED_BLOCKS:
        return None
    try:
        with truncated(model, repeats):
            short = Step(model, args, kw, opts, fake=True, progress=progress).run()
        cap = expand(short, repeats, TRACED_BLOCKS)
        cap.assumptions = whole_model_notes(cap.assumptions, model, cap.params)
        return cap
    except NotReplicable as exc:
        log.info("the blocks of %s are not replicated (%s): tracing all %d", repeats.path, exc, repeats.count)
    except ReadsValues:  # a value read is not the truncation's doing: the full fake trace would read it too,
        raise  # so the real-tensor fallback (or its refusal) follows at once (Grounding DINO: 2.0 s less)
    except (StepFailed, UserError) as exc:  # the model needs all its blocks: trace them all
        log.info("tracing %d of the %d blocks of %s failed (%s): tracing all", TRACED_BLOCKS, repeats.count,
                 repeats.path, exc)
    return None


def _fits_in_memory(model: torch.nn.Module) -> bool:
    """Whether a real CPU trace (a copy of the weights plus the step's tensors) fits in free RAM."""
    return 3 * _model_bytes(model) <= _available_ram() // 2


def _model_bytes(model: torch.nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def _available_ram() -> int:
    """Memory a new allocation can have without swapping: the kernel's ``MemAvailable`` (free memory plus
    the page cache and reclaimable slabs it would drop), else the free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 4 << 30

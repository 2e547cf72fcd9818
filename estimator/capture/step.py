"""One training step on traced tensors: forward, loss, backward, optimizer step, one method each.

:class:`Step` runs the step on fake tensors (or, as a fallback, on small real CPU tensors) with
the :class:`~estimator.capture.recorder.Recorder` watching, and returns a
:class:`~.options.Capture`.  Everything the step changes on the user's model (train/eval mode,
forward hooks, parameters swapped for traced stand-ins, the checkpoint what-if) is entered on one
``ExitStack`` and undone on exit, whatever happens.

Why one class of this length: the step's phases (forward, loss, backward, optimizer), the
ExitStack that enters and leaves their context managers, and the storage bookkeeping they share
are one sequence; the fake mode, recorder, inputs, loss, checkpointing and engines (:mod:`.as_is`)
live beside it.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import sys
import weakref
from typing import Any, Callable, Iterator

import torch
import torch.utils._pytree as pytree
from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense
from torch.nn.utils._named_member_accessor import NamedMemberAccessor
from torch.nn.utils.stateless import _untie_named_tensors_map
from torch.utils._python_dispatch import _disable_current_modes

from ..errors import UserError
from ..ema import with_ema
from ..optim import (build_optimizer, clip_gradients, elementwise, flat_state, grads_outside, made_before_loop,
                     state_tensors, steady_scalars, wants_fused)
from ..precision import cuda_autocast_on_cpu
from ..target import FAKE_KERNELS, CudaTarget, installed
from ..caller import set_train_mode
from .as_is import AsIs, AsIsRecorder
from .checkpoint import KV_CACHE_OFF, kv_caches_off, wrap_checkpointed
from .failures import guard, input_hint, optimizer_hint, unpacked
from .held import (drop_unreached_saves, given_inputs_are_theirs as inputs_theirs, held_outside, kept_outside,
                   leaves_held_by, output_tensors, restore_outside_grads)
from .fake import GROUPED_MM, RecordingFakeMode, clear_shared_cache, fake_grouped_mm, output_kernels, real_output_bytes
from .fake_kernels import fake_ctc_loss, fake_pack_padded_sequence
from .inputs import convert_inputs, is_real, keeps_values, materialize, meta_twin, real_param_copy
from .loss import select_loss
from .options import Capture, Progress, StepOptions
from .recorder import FORWARD_PHASES, INPUT_MODULE, Phase, Recorder


# -- the step ---------------------------------------------------------------------------------

# A real step's backward runs on fake tensors where its forward allocated more than this per op (bytes)
FAKE_BACKWARD_OP_BYTES = 256 << 10


class _Entered:
    """A context manager entered now whose exit can come early (the fake mode leaves before the
    optimizer step, which runs on meta twins); the ExitStack's exit is then a no-op."""

    def __init__(self, cm: Any):
        self.cm = cm
        self.active = False

    def __enter__(self) -> "_Entered":
        self.cm.__enter__()
        self.active = True
        return self

    def exit(self) -> None:
        if self.active:
            self.active = False
            self.cm.__exit__(None, None, None)

    def __exit__(self, *exc: Any) -> None:
        self.exit()


class Step:
    """One capture: set-up (traced stand-ins, placeholders, hooks), then one method per phase."""

    def __init__(self, model: torch.nn.Module, args: tuple, kwargs: dict, opts: StepOptions, *, fake: bool,
                 progress: Progress | None, fake_backward: bool = False):
        self.model, self.opts, self.fake = model, opts, fake
        # a real step whose backward and optimizer step run on fake tensors (see _fake_from_here)
        self.fake_backward = fake_backward and not fake
        self.progress = progress or (lambda stage, detail="": None)
        if fake:
            clear_shared_cache()
        rec = self.rec = (AsIsRecorder if opts.prepare is not None else Recorder)(fake)
        rec.target = opts.target
        self.fake_mode = RecordingFakeMode(rec, allow_non_fake_inputs=True) if fake else None
        if fake:
            self._fake_kernels(opts.target)
        self.fake_entered: _Entered | None = None
        self._stack: contextlib.ExitStack | None = None
        self._forward_start = (0, 0)  # (ops recorded, storages seen) before the forward
        self.call: torch.nn.Module = model  # the module the step calls (a wrapper such as DDP: see AsIs)
        engine_state: list[torch.Tensor] = []
        if opts.prepare is not None:
            model, self.call, engine_state = AsIs.prepare(model, opts.prepare, self.fake_mode)
            self.model = model

        self.module_paths: dict[int, str] = {}
        self.module_types: dict[str, str] = {}
        for path, mod in model.named_modules(remove_duplicate=True):
            self.module_paths[id(mod)] = path
            self.module_types[path] = type(mod).__name__

        self.named_params = dict(model.named_parameters())  # tied weights appear once
        named_buffers = dict(model.named_buffers())
        self.param_owner = {n: n.rpartition(".")[0] for n in list(self.named_params) + list(named_buffers)}
        if opts.prepare is not None:
            self.params, self.buffers, self.t_args, self.t_kwargs, self.flat_inputs = AsIs.traced(
                self.named_params, named_buffers, args, kwargs, self.fake_mode, opts.precision.traced_dtype)
        else:
            self._make_traced(args, kwargs, named_buffers)

        for n, p in self.params.items():
            rec.placeholder(f"param_{n}", p, "parameter", self.param_owner[n])
        for n, b in self.buffers.items():
            rec.placeholder(f"buffer_{n}", b, "buffer", self.param_owner[n])
        for i, t in enumerate(self.flat_inputs):
            rec.placeholder(f"input_{i}", t, "input", INPUT_MODULE)
        inputs_theirs(rec, (args, kwargs), self.flat_inputs)
        for i, t in enumerate(engine_state):
            rec.placeholder(f"engine_{i}", t, "engine")

        self._standing: dict[str, torch.Tensor] = {}  # the stand-ins in the model's place (_stand_ins)
        # each buffer slot (module, local name) -> the buffer's name: a module that assigns a new tensor to its
        # buffer in forward (ConViT's relative indices, made for the sequence it meets) holds that one after
        self.buffer_slots = {(id(mod), local): f"{path}.{local}" if path else local
                             for path, mod in model.named_modules(remove_duplicate=False)
                             if not isinstance(mod, torch.jit.ScriptModule)  # (takes no hooks)
                             for local in mod._buffers} if opts.prepare is None else {}
        param_by_id = {id(p): n for n, p in self.params.items()}
        param_owner = self.param_owner

        def accumulate_owner(fn: Any) -> str:
            var = getattr(fn, "variable", None)  # AccumulateGrad holds its leaf
            name = param_by_id.get(id(var)) if var is not None else None
            return param_owner.get(name, "") if name is not None else ""

        rec.accumulate_owner = accumulate_owner
        self.module_outputs: dict[str, list[tuple[int, ...]]] = {}
        self.saved: dict[int, tuple[int, str]] = {}  # the first micro-step's (the activations of one micro-batch)
        self.saved_all: set[int] = set()  # every micro-step's (their category in the timeline)
        # sid -> the aliases autograd holds of it (first micro-step): a save lives as long as its node does
        self.saved_aliases: dict[int, list[Any]] = {}
        self.param_sids = {rec.sid(p) for p in self.params.values()}
        self.opt_state: dict[str, dict[str, torch.Tensor]] = {}
        self.optimizer_name: str | None = None
        self.loss: torch.Tensor | None = None
        self.output: Any = None
        self.output_sids: set[int] = set()
        self.scaler: Any = None
        self.loss_source = "none (inference)"
        self.generation: dict[str, Any] | None = None  # a step of generate() (see .generate)
        self.extra_sids: dict[str, set[int]] = {}  # storages of categories the step's own tensors do not give
        self.notes: list[str] = []  # what the capture assumed (the report's assumptions)

    # -- set-up ---------------------------------------------------------------------------------
    def _fake_kernels(self, target: str) -> None:
        """The recorder's hooks for ops run on fake tensors: kernels that make other outputs than their fake
        kernels, fake kernels FakeTensorMode lacks, and (CUDA target) the CUDA kernels' outputs."""
        rec = self.rec
        rec.substitute.update(output_kernels(cuda=target != "cpu"))
        rec.substitute[id(torch.ops.aten._pack_padded_sequence.default)] = fake_pack_padded_sequence
        rec.substitute[id(torch.ops.aten._ctc_loss.default)] = fake_ctc_loss
        if GROUPED_MM is not None:
            rec.substitute[id(GROUPED_MM)] = fake_grouped_mm
        if target == "cpu":
            rec.real_sizes = real_output_bytes
        else:
            rec.real_sizes = functools.partial(real_output_bytes, cpu=False)
            rec.substitute.update({id(op): fn for op, fn in FAKE_KERNELS.items()})

    def _fake_from_here(self) -> None:
        """The rest of a real step (backward, the optimizer step) on fake tensors: its values were read in the
        forward, where control flow reads them; backward's and the optimizer's are read by nothing the
        capture needs (a backward that does read one raises :class:`ReadsValues`, and the caller traces the
        whole step on real tensors).  The real tensors autograd saved enter each op as fake tensors that
        stand for them (same storage ids); kernels are the CPU's, as the forward ran them."""
        rec = self.rec
        self.fake_mode = RecordingFakeMode(rec, allow_non_fake_inputs=True)
        self.fake_mode.adopt_real = True
        self._fake_kernels("cpu")
        rec.fake_values = True
        logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)  # (_enter restores it)
        self.fake_entered = self._stack.enter_context(_Entered(self.fake_mode))

    def _make_traced(self, args: tuple, kwargs: dict, named_buffers: dict) -> None:
        """Traced stand-ins for the parameters, buffers and inputs (fake, or real CPU copies)."""
        dtype_of, of = self.opts.precision.traced_dtype, self.opts.precision.tensor_dtype
        fake_mode = self.fake_mode
        if self.fake:
            def to_traced(t: torch.Tensor, requires_grad: bool, compact: bool = True) -> torch.Tensor:
                # (a non-dense one, a strided slice, is copied compact by the move to the GPU, and a parameter by
                # a copy: its own bytes; a CPU buffer keeps its storage, as a deep copy keeps it)
                stride = t.stride() if is_non_overlapping_and_dense(t) or not compact else None
                with fake_mode:
                    out = torch.empty_strided(t.shape, stride, dtype=of(t), device="cpu") if stride is not None \
                        else torch.empty(t.shape, dtype=of(t), device="cpu")
                return out.requires_grad_(requires_grad)

            def fake_base(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
                with fake_mode:
                    return torch.empty(shape, dtype=dtype, device="cpu")

            self.params = {n: to_traced(p, p.requires_grad) for n, p in self.named_params.items()}
            # integer and boolean buffers and inputs keep their values (see .fake: known values); a small
            # floating buffer kept so is cast as model.to(dtype) casts it (a rotary table's inv_freq in bf16)
            self.buffers = {n: b.detach().to(of(b), copy=True) if keeps_values(b) else
                            to_traced(b, False, self.opts.target == "cuda") for n, b in named_buffers.items()}
            self.t_args, self.t_kwargs = convert_inputs((args, kwargs), fake_base, dtype_of, keep=keeps_values)
        else:
            self.params = {n: real_param_copy(p, True, of(p)) for n, p in self.named_params.items()}
            self.buffers = {n: real_param_copy(b, False, of(b)) for n, b in named_buffers.items()}

            def real_base(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
                return materialize(torch.empty(shape, dtype=dtype, device="meta"))

            real = all(is_real(t) for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
            if real and self.opts.precision.cast is None:  # the user's own tensors: aliasing is already right
                self.t_args, self.t_kwargs = pytree.tree_map_only(
                    torch.Tensor, lambda t: t.detach().requires_grad_(t.requires_grad), (args, kwargs))
            else:
                # (the user's values kept, cast as the precision casts them: a mask, token ids and labels
                # drive the real step's control flow; only meta or fake inputs are drawn)
                self.t_args, self.t_kwargs = convert_inputs((args, kwargs), real_base, dtype_of, keep=is_real)
        self.flat_inputs = [t for t in pytree.tree_leaves((self.t_args, self.t_kwargs)) if isinstance(t, torch.Tensor)]

    def _enter(self, stack: contextlib.ExitStack) -> None:
        """Everything the step changes, each undone by ``stack`` (in reverse order)."""
        model, opts = self.model, self.opts
        if self.fake_mode is not None:  # (run after the fake mode has left: registered before it is entered)
            stack.callback(self.fake_mode.restore_written)
        flags = [(m, m.training) for m in model.modules()]  # each module's own flag comes back, not the root's
        stack.callback(lambda: [setattr(m, "training", was) for m, was in flags])
        stack.callback(restore_outside_grads, self.rec)
        stack.enter_context(self._module_hooks())
        # FakeTensorMode logs a traceback when a meta kernel fails; the capture reports the failure itself.
        fake_log = logging.getLogger("torch._subclasses.fake_tensor")
        stack.callback(fake_log.setLevel, fake_log.level)
        set_train_mode(model, opts.train, self.notes)
        # no automatic garbage collection during the step (it frees cycles at moments that depend on how many
        # Python objects were made, which differs between runs): the timeline and the peak the same every time
        if gc.isenabled():
            gc.disable()
            stack.callback(gc.enable)
        if opts.compile is not None:  # compiled blocks, checkpointed around (recomputation reruns their graphs)
            from .compiled import compiled_regions

            stack.enter_context(compiled_regions(model, opts.compile, self.rec, self._paused, self.notes))
        stack.callback(wrap_checkpointed(model, opts.checkpoint, opts.checkpoint_policy))
        why = "checkpoint" if opts.checkpoint else "compile" if opts.compile is not None else None
        if why and opts.train and kv_caches_off(model, stack):
            self.notes.append(KV_CACHE_OFF[why])
        # the traced tensors stand in for the model's own for the whole step (recomputation in backward included)
        swap = self._stand_ins(model) if opts.prepare is None else AsIs.engine_hooks(self.rec)
        if opts.target == "cuda" and self.fake:  # CUDA kernels exist as meta implementations only
            stack.enter_context(installed(opts.cuda or CudaTarget()))
            stack.enter_context(cuda_autocast_on_cpu())  # (the model's own autocast("cuda"): the trace's)
        if self.fake:
            fake_log.setLevel(logging.CRITICAL)
            self.fake_entered = stack.enter_context(_Entered(self.fake_mode))
        stack.enter_context(swap)

    @contextlib.contextmanager
    def _module_hooks(self):
        """Forward hooks that keep the recorder's module stack (and report progress)."""
        rec, paths, outputs = self.rec, self.module_paths, self.module_outputs
        progress, total, calls = self.progress, max(len(paths), 1), [0]

        def pre_hook(mod, _args):
            path = paths.get(id(mod), type(mod).__name__)
            rec.module_stack.append(path)
            rec.raised_in = None
            if rec.phase == Phase.FORWARD:
                calls[0] += 1
                progress("tracing forward", f"{min(99, 100 * calls[0] // total)}% ({path or 'root'})")

        def post_hook(mod, _args, output):
            path = rec.module_stack.pop() if rec.module_stack else ""
            if output is None and rec.raised_in is None and sys.exc_info()[1] is not None:
                rec.raised_in = path  # its forward raised (torch calls an always_call hook with no output)
            if path not in outputs and rec.phase in FORWARD_PHASES:
                outputs[path] = [tuple(t.shape) for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]
            if rec.phase in FORWARD_PHASES and not rec.compiling:  # (a region compiling swaps in traced buffers)
                self._reassigned_buffers(mod)

        handles = []
        try:
            for mod in self.model.modules():
                if isinstance(mod, torch.jit.ScriptModule):
                    continue  # TorchScript takes no Python hooks: its ops count in the enclosing module
                handles.append(mod.register_forward_pre_hook(pre_hook))
                handles.append(mod.register_forward_hook(post_hook, always_call=True))
            yield
        finally:
            for h in handles:
                h.remove()

    @contextlib.contextmanager
    def _stand_ins(self, model: torch.nn.Module) -> Iterator[None]:
        """The traced parameters and buffers in the model's place for the whole step, as
        ``torch.func.functional_call`` puts them for one call (tied weights under each of their names), and the
        model's own back at the end.  The stand-ins are held in :attr:`_standing` alone, so that a buffer the
        model replaces in forward is dropped there too (:meth:`_reassigned_buffers`)."""
        self._standing = _untie_named_tensors_map(model, {**self.params, **self.buffers})
        accessor = NamedMemberAccessor(model)
        own, _ = accessor.swap_tensors_dict(self._standing, allow_missing=True)
        try:
            yield
        finally:
            accessor.swap_tensors_dict(own, allow_missing=True)
            self._standing = {}

    def _reassigned_buffers(self, mod: torch.nn.Module) -> None:
        """A buffer ``mod`` replaced with a new tensor in its forward is that tensor from then on (counted as a
        buffer, as the model holds it after the step).  The tensor it replaced is no longer held by the model:
        it is freed there, unless autograd saved it or an op's output still views it (as in the real step, where
        the module's reference was the last)."""
        for local, t in mod._buffers.items():
            name = self.buffer_slots.get((id(mod), local))
            old = self.buffers.get(name, t) if name is not None else t
            if name is not None and isinstance(t, torch.Tensor) and t is not old:
                self.buffers[name] = t
                for key in [k for k, v in self._standing.items() if v is old]:
                    self._standing[key] = t

    def _recording(self):
        """Record the ops run inside: the fake mode records itself; on real tensors, the recorder mode."""
        return self.fake_mode.recording_on() if self.fake_entered is not None and self.fake_entered.active \
            else self.rec

    # -- the phases -----------------------------------------------------------------------------
    def run(self) -> Capture:
        """The step as the loop runs it: ``for micro in range(N): loss = loss_fn(model(x)) / N; loss.backward()``,
        then ``opt.step()``.  With gradient accumulation (N > 1) two micro-steps are traced: the first makes the
        gradients, the second (standing for micro-steps 2..N, identical in memory and time) accumulates into
        them; the previous micro-step's loss (and output, when the loop keeps it) lives until the next one's."""
        opts = self.opts
        with contextlib.ExitStack() as stack:
            self._stack = stack
            self._enter(stack)
            if opts.generation is not None:
                from .generate import GenerationStep

                # what the loop holds after the step (the cache above all) stays referenced to the end
                self.held = GenerationStep(self, opts.generation).run()
            elif not opts.train:
                self.inference_forward()
            else:
                traced = min(opts.grad_accum, 2)
                for micro in range(traced):
                    self.rec.micro_step = micro
                    around = (opts.accumulate(self.call, micro, micro == traced - 1) if opts.accumulate is not None
                              else contextlib.nullcontext())
                    with around:
                        self.forward_and_loss()
                        self.backward()
                self.rec.micro_step = 0
                self.optimizer_step()
            self._outside = kept_outside(self.rec, self.extra_sids)  # (before their gradients are put back)
        return self._result()

    def inference_forward(self) -> None:
        with self._recording(), torch.no_grad(), self.opts.precision.autocast_context():
            # kept to the end of the capture: a serving loop holds the output it returns
            self.output = self._guard(lambda: self.call(*self.t_args, **self.t_kwargs))

    @contextlib.contextmanager
    def _paused(self):
        """Nothing run inside is the step's: not recorded, not saved, not seen by the modes on the stack (a
        checkpoint's selective policy counts the ops it sees); a torch.compile region compiling."""
        fake, rec = self.fake_mode, self.rec
        recording = fake.recording if fake is not None else None
        if fake is not None:
            fake.recording = False
        rec.compiling = True
        try:
            # (the tracer finds the fake mode from the fake inputs); identity saved-tensor hooks on top of a
            # checkpoint's, which would count what the compilation saves
            with _disable_current_modes(), torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
                yield
        finally:
            rec.compiling = False
            if fake is not None:
                fake.recording = recording

    def _unrecorded(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` with the recorder off: tensor bookkeeping of the capture itself, not the step's."""
        fake = self.fake_mode
        recording = fake.recording if fake is not None else None
        if fake is not None:
            fake.recording = False
        try:
            with _disable_current_modes():
                return fn()
        finally:
            if fake is not None:
                fake.recording = recording

    def forward_and_loss(self) -> None:
        rec, saved, param_sids = self.rec, self.saved, self.param_sids
        self._forward_start = (len(rec.order), len(rec.storage_bytes))
        storage_of = AsIs.local if self.opts.prepare is not None else (lambda t: t)  # a DTensor: its local tensor

        first_micro_step = rec.micro_step == 0
        saved_all = self.saved_all

        # parameters and buffers autograd saves (a norm's running statistics, registered position ids) are
        # counted as parameters and buffers, not as activations
        state_sids = param_sids | {rec.sid(storage_of(b)) for b in self.buffers.values()}

        def pack(t: torch.Tensor) -> torch.Tensor:
            if rec.compiling:
                return t
            sid = None
            if rec.phase in FORWARD_PHASES:
                sid = rec.sid(storage_of(t))
                if sid not in state_sids:
                    saved_all.add(sid)
                    if first_micro_step and sid not in saved:
                        saved[sid] = (rec.storage_bytes[sid], rec.where()[0])
            # An alias without the autograd history (made unrecorded): a node that saves its own output
            # (exp, tanh, softmax) would otherwise hold a tensor that holds the node, a reference cycle
            # that keeps both alive until a garbage collection (none runs during the capture) where the
            # real step, which saves outputs without their history, frees them as soon as nothing reaches
            # the node (a metric computed with grad enabled, a recurrence's last state).
            alias = self._unrecorded(t.detach)
            if sid in saved and first_micro_step:
                self.saved_aliases.setdefault(sid, []).append(weakref.ref(alias))
            return alias, alias._version  # (autograd checks no version of what a hook packed: see unpacked)

        with self._recording(), torch.autograd.graph.saved_tensors_hooks(pack, unpacked):
            with self.opts.precision.autocast_context():
                rec.phase = Phase.FORWARD
                # ``out = model(x)``: the previous micro-step's output (a loop that keeps it) is replaced only
                # once the new one is assigned
                self.output = self._guard(lambda: self.call(*self.t_args, **self.t_kwargs))
                rec.phase = Phase.LOSS
                self.progress("tracing the loss")
                loss, self.loss_source = self._guard(lambda: select_loss(self.output, self.opts.loss_fn))
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise UserError("the loss must be a scalar tensor; check loss_fn")
            if not loss.requires_grad:
                raise UserError("the loss does not require grad: no parameter is trainable or the "
                                "output is detached; check requires_grad and loss_fn")
            if self.opts.grad_accum > 1:
                loss = self._guard(lambda: loss / self.opts.grad_accum)  # each micro-batch's share of the mean
        # (a DTensor output, such as loss parallelism's vocabulary-sharded logits: its local tensor's storage)
        self.output_sids |= {rec.sid(storage_of(t)) for t in pytree.tree_leaves(self.output)
                             if isinstance(t, torch.Tensor)}
        if not self.opts.keep_output:
            # ``loss = model(x).loss``: nothing but the loss is held once it is computed (HF Trainer, Lightning,
            # torchtitan's ``del pred``); what autograd saved stays with the graph
            self.output = None
        self.loss = loss

    def backward(self) -> None:
        if self.fake_backward and self.fake_mode is None:
            ops, sids = self._forward_start
            # fake ops cost about 0.1 ms each (Python dispatch) whatever their size; real ones what their kernels
            # take, which grows with the bytes they write: a forward of large kernels gains (RetinaNet v2 at
            # 800 x 800: 4.8 MB an op, 3.8 ms), one of many small ones loses (SLANeXt's table decoder: 16 KB an
            # op, 0.05 ms; 4.4 s fully real, 12.9 s with a fake backward).  Bytes, not time: the same choice on
            # any machine and load
            made = sum(self.rec.storage_bytes[sids:]) / max(len(self.rec.order) - ops, 1)
            if made > FAKE_BACKWARD_OP_BYTES:
                self._fake_from_here()
        with self._recording():
            self.rec.phase = Phase.BACKWARD
            self.progress("tracing backward")
            if self.scaler is None and self.opts.precision.grad_scaler:
                self.scaler = torch.amp.GradScaler("cpu")
            loss = self.loss
            if self.rec.micro_step == 0:
                drop_unreached_saves(self.saved, self.saved_aliases, self.rec.sid_of)
            self._guard((self.scaler.scale(loss) if self.scaler else loss).backward)

    def optimizer_step(self) -> None:
        rec, opts, scaler = self.rec, self.opts, self.scaler
        rec.phase = Phase.OPTIMIZER
        self.progress("tracing the optimizer step")
        opt_params = self.params if opts.prepare is None else self.named_params
        twins = (self.fake_entered is not None and self.fake_entered.active and scaler is None
                 and not wants_fused(opts.optimizer, opts.optimizer_kwargs))
        if twins and opts.prepare is None:
            # on meta twins of the fake parameters and gradients (same storage ids): no FakeTensorMode per-op work
            self.fake_entered.exit()
            opt_params = self._guard(lambda: {n: meta_twin(rec, p) for n, p in self.params.items()},
                                     lambda: "a gradient in another dtype than its parameter fails the real step too")
        elif twins and elementwise(opts.optimizer) and all(map(AsIs.on_local_shard, self.named_params.values())):
            # An engine's DTensors: an element-wise step is the same on the local shards (DTensor runs each op there):
            # on their meta twins, without DTensor's sharding of every foreach op (0.3-0.4 s of a 7B FSDP trace)
            self.fake_entered.exit()
            opt_params = {n: meta_twin(rec, self.params[n], AsIs.local(p.grad) if p.grad is not None else None,
                                       p.requires_grad) for n, p in self.named_params.items()}
        opt, self.optimizer_name = build_optimizer(opts.optimizer, opt_params, self.named_params,
                                                   opts.optimizer_kwargs, opts.foreach, self.model, opts.param_names)
        if opt is not None and opts.ema is not None:  # the weights' moving average, after the optimizer
            opt = with_ema(opt, opt_params.values(), opts.ema, self.buffers.values())
        if opt is None:
            return
        self.extra_sids["gradient_kept"] = {rec.sid(AsIs.local(g)) for g in grads_outside(opt, opt_params.values())}
        early = state_tensors(opt)  # (made by its constructor: Adagrad's sums)
        self.notes.extend(n for n in [getattr(opt, "note", None)] if n and n not in self.notes)  # Chain's split
        rec.scalar_value = steady_scalars(opt)
        with self._recording():
            if scaler is not None:
                self._guard(lambda: scaler.unscale_(opt))
            if opts.clip_grad_norm is not None:  # the loop's torch.nn.utils.clip_grad_norm_, on unscaled gradients
                self._guard(lambda: clip_gradients(opt_params.values(), opts.clip_grad_norm, opts.foreach))
            self._guard(opt.step, lambda: optimizer_hint(self.named_params.values()))  # (scaler.step would skip it)
            if scaler is not None:
                self._guard(scaler.update)
        rec.scalar_value = None  # (it holds the optimizer: not kept with the recorder)
        for n, p in [*opt_params.items(), *self.buffers.items()]:  # (the EMA's copies of the buffers)
            st = opt.state.get(p)
            if st:
                self.opt_state[n] = {k: AsIs.local(v) for k, v in flat_state(st).items()}
        if made := made_before_loop(opt, early):  # live from the first step's start
            self.extra_sids["before_loop"] = {rec.sid(AsIs.local(t)) for t in made}

    # -- the result -----------------------------------------------------------------------------
    def _leaves_held_by(self, loss: torch.Tensor) -> list[torch.Tensor]:
        if self.opts.prepare is not None or loss.grad_fn is None:
            return []
        return leaves_held_by(loss, {id(t) for t in self.params.values()} | {id(t) for t in self.flat_inputs}
                              | self._outside)

    def _result(self) -> Capture:
        rec, loss = self.rec, self.loss
        grads = {n: AsIs.local(p.grad) for n, p in self.named_params.items() if p.grad is not None} \
            if self.opts.prepare is not None else {n: p.grad for n, p in self.params.items() if p.grad is not None}
        sid = lambda t: rec.sid(AsIs.local(t))  # noqa: E731  (an engine's DTensor: its local tensor's storage)
        # storages every iteration has anyway: what the loss holds of them (a leaf viewing the input) is not repeated
        state = self.param_sids | {sid(b) for b in self.buffers.values()} | {sid(t) for t in self.flat_inputs}
        output = {sid(t) for t in output_tensors(self.output)}
        sids = {
            "parameter": self.param_sids,
            "buffer": {sid(b) for b in self.buffers.values()},
            "input": {sid(t) for t in self.flat_inputs},
            "gradient": {sid(g) for g in grads.values()},
            "input_gradient": {sid(t.grad) for t in self.flat_inputs if t.is_leaf and t.grad is not None},  # (kept)
            "optimizer_state": {sid(t) for st in self.opt_state.values() for t in st.values()},
            "saved": set(self.saved) | self.saved_all,
            # the loss, and what its graph keeps alive with it (the loop holds the loss into the next step)
            "loss": ({sid(loss)} | {sid(t) for t in self._leaves_held_by(loss)}) - state if loss is not None
            else set(),
            # the model's output tensors (held to the end of the step when the loop keeps them; see estimator.memory)
            "output": self.output_sids | output,
            # (of which a transformers cache's: past_key_values; not a category of its own)
            "output_cache": output - {sid(t) for t in pytree.tree_leaves(self.output) if isinstance(t, torch.Tensor)},
        }
        sids.update({"engine": rec.engine_sids} if self.opts.prepare is not None else {})
        for name, extra in self.extra_sids.items():
            sids[name] = sids.get(name, set()) | extra
        sids["before_loop"] = sids.get("before_loop", set()) | held_outside(rec)  # (and outside tensors still held)
        rec.closed = True
        return Capture(
            records=rec.placeholders + rec.records,
            nodes=rec.order,
            outputs=(rec.node_of(loss),) if loss is not None and rec.node_of(loss) is not None else (),
            mode="fake" if self.fake else "real",
            loss_source=self.loss_source,
            module_types=self.module_types,
            linear_classes=frozenset(type(m).__name__ for m in self.model.modules()
                                     if isinstance(m, torch.nn.Linear) and type(m) is not torch.nn.Linear),
            module_outputs=self.module_outputs,
            params=self.params,
            param_owner=self.param_owner,
            buffers=self.buffers,
            inputs=self.flat_inputs,
            saved=self.saved,
            grads=grads,
            optimizer_state=self.opt_state,
            optimizer_name=self.optimizer_name,
            storage_bytes=rec.storage_bytes,
            storage_dtype=rec.storage_dtype,
            events=rec.events,
            sids=sids,
            keep_output=self.opts.keep_output,
            grad_accum=self.opts.grad_accum if self.opts.train else 1, clip_grad_norm=self.opts.clip_grad_norm,
            zero_grad=self.opts.zero_grad if self.opts.train else "after_step",
            generation=self.generation,
            assumptions=self.notes,  # the same list: notes made on leaving the step come too
        )

    # -- errors ---------------------------------------------------------------------------------
    def _guard(self, fn: Callable[[], Any], hint: Callable[[], str] | None = None) -> Any:
        """Run ``fn``; turn data-dependent failures into :class:`ReadsValues`, others into one-line user errors
        (:func:`.failures.guard`)."""
        return guard(self.rec, fn, hint or (lambda: input_hint(self.call, self.t_args, self.t_kwargs)))

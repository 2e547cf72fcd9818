"""One op's work (:class:`OpWork`): what an aten op asks of the GPU and of the host, read from a
node of this project's capture (:meth:`OpWork.from_node`: shapes from ``meta["spec"]``) or from a
record of the CUDA reference data (:meth:`OpWork.from_record`).

``flops`` follows the project's convention (a multiply-add is 2 FLOPs, as
``torch.utils.flop_counter``), equal to the rules' (``tests/test_timing.py``); bytes are distinct
bytes read and written (a broadcast operand once; a gather reads the rows it returns).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, replace
from typing import Any, Mapping

from ..graph import OpNode, target_text
from ..rules.attention import sdpa_backward_flops, sdpa_flops
from ..rules.conv import conv_flops
from ..rules.matmul import grouped_mm_flops
from ..rules.registry import bind
from . import float8
from .depthwise import classify as classify_depthwise
from .depthwise import is_channels_last
from .geometry import (
    alignment_bytes, conv_gemm_dims, footprint, foreach_launches, gemm_dims, grouped_gemm_dims, is_inplace, itemsize,
    numel, op_base,
)
from .optable import (
    ATTENTION, ATTENTION_OPS, CAST_OPS, CONV, CONV_BACKWARD_OPS, CONV_OPS, FOREACH_DEPTH, GATHER_OPS, HOST, LAUNCHES,
    LIBRARY_OPS, MATMUL, MATMUL_OPS, MEMORY, MEMORY_CLASS, RNN, RNN_OPS, SYNC, SYNC_OPS, TENSOR_CORE_BYTES, VIEW,
    VIEW_OPS,
)

# -- one op's work -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OpWork:
    """What one aten op asks of the GPU and of the host.

    ``flops`` follows the project's convention (a multiply-add is 2 FLOPs, as
    ``torch.utils.flop_counter``); ``bytes_read``/``bytes_written`` are distinct bytes (a
    broadcast operand once).  For compute kinds, ``batch, m, n, k`` is the GEMM the kernel runs
    (a convolution: its implicit GEMM per group; attention: batch x heads, s_q, s_kv, head dim;
    a recurrent layer: the per-step GEMM [batch, hidden] @ [hidden, gates * hidden]).
    """

    op: str
    phase: str
    kind: str
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    dtype: str | None = None
    batch: int = 1
    m: int = 0
    n: int = 0
    k: int = 0
    align: int = TENSOR_CORE_BYTES  # bytes; < 16 when a GEMM leading dimension is misaligned
    backend: str = ""  # attention kernel (cudnn, efficient, flash)
    backward: bool = False
    causal: bool = False
    launches: int = 1  # kernels launched (0 for views)
    tensors: int = 0  # tensors in a foreach op's lists (host cost per tensor)
    steps: int = 0  # dependent recurrent steps (RNN)
    library: str = ""  # "cublas" or "cudnn": a library call (host cost of descriptors, heuristics, plans)
    sync: bool = False  # the host reads a device value (waits for the GPU) before it goes on
    memory_class: str = "elementwise"  # how a memory-bound kernel streams (see MEMORY_CLASS)
    compiled: bool = False  # run by a torch.compile graph: the host only launches it (see host.cpu_seconds)
    depthwise: str = ""  # a depthwise convolution's backend, stride and kernel class (timing.depthwise.classify)
    streamed: int = 0  # of ``bytes``, those a composite op's elementwise kernels move (at the elementwise rate)
    subclass: bool = False  # run in eager by a layer whose tensors are a Python subclass (torchao's Float8Linear)

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    # -- constructors --------------------------------------------------------------------------

    @classmethod
    def from_record(cls, rec: Mapping[str, Any], mem: Mapping[str, Any] | None = None,
                    causal: bool = False) -> "OpWork":
        """One op of the CUDA reference data (``timing/*.timing.json.gz`` ``ops`` entries).

        ``rec`` has ``op``, ``phase`` and ``in`` (``[shape, dtype]`` per tensor input, flattened
        in schema order); ``mem`` is the same op's entry of ``memory/*.json.gz`` (inputs with
        strides, ``out`` with ``[shape, dtype, stride, storage_bytes]``); without it the outputs
        are inferred where the FLOPs need them.  The records keep no non-tensor arguments, so
        SDPA's ``is_causal`` comes from the caller (the model definition).
        """
        name = rec["op"]
        base = op_base(name)
        phase = _phase(rec.get("phase", "forward"))
        ins = [(tuple(t[0]), t[1], tuple(t[2]) if len(t) > 2 else None)
               for t in (mem["in"] if mem is not None else rec["in"])]
        outs = [(tuple(t[0]), t[1], tuple(t[2]) if len(t) > 2 else None) for t in (mem or {}).get("out", [])]
        return _work(name, base, phase, ins, outs, causal, _RecordShapes(ins, outs))

    @classmethod
    def from_node(cls, node: Any) -> "OpWork | None":
        """One op of this project's capture (an :class:`~estimator.graph.OpNode`); None for
        placeholders and ``getitem`` bookkeeping."""
        if getattr(node, "op", None) != "call_function" or node.target is operator.getitem:
            return None
        meta = node.meta
        if meta.get("wrapper"):  # a tensor subclass's op: its kernels are the ops recorded inside it; the host
            return cls(target_text(node.target), _phase(meta.get("phase", "forward")), VIEW, launches=0,
                       subclass=True)  # dispatches it through the subclass's Python (timing.host)
        if meta.get("compiled"):
            return _compiled_work(node)
        target = node.target
        name = target_text(target)
        base = op_base(name) if "." in name else getattr(target, "__name__", name)
        phase = _phase(node.meta.get("phase", "forward"))
        ins, producers = _node_inputs(node)
        outs = [(tuple(s.shape), _dtype_name(s.dtype), None) for s in (node.meta.get("spec") or ()) if s is not None]
        causal = _node_causal(node)
        work = _work(name, base, phase, ins, outs, causal, _NodeShapes(node, ins, outs, producers))
        return replace(work, subclass=True) if meta.get("subclass") else work


def _compiled_work(node: Any) -> "OpWork | None":
    """An op of a torch.compile graph (:mod:`estimator.capture.compiled`): a fused op is its kernel's (the
    kernel's work on its last op: one launch, the bytes it reads from outside and the buffers it writes,
    ``meta["fused"]``; None on the others); a view is no kernel and no host work (Inductor folds it into
    the indexing); a library kernel is the op's own work, launched by the graph."""
    meta = node.meta
    phase = _phase(meta.get("phase", "forward"))
    if "kernel" in meta:
        fused = meta.get("fused")
        if fused is None:
            return None
        # a generated (Triton) kernel streams at the elementwise rate whether or not it reduces: ATen's slower
        # reduction kernels (the "reduction" class) are not what Inductor emits
        return OpWork("inductor.fused", phase, MEMORY, bytes_read=fused["read"], bytes_written=fused["written"],
                      dtype=fused.get("dtype"), memory_class="elementwise", compiled=True)
    work = OpWork.from_node(_Eager(node))
    if work is None or work.kind == VIEW:
        return None
    if work.kind == MATMUL and work.align < TENSOR_CORE_BYTES and work.dtype:
        # Inductor's pad_mm pass pads a GEMM whose K or N is not a multiple of 16 bytes, so the library runs the
        # aligned kernel (the pad copies are small).  It decides by benchmarking on the GPU; on the H100, GPT-2's
        # 50,257-word head had its forward and input-gradient GEMMs padded and not the weight gradient, whose
        # only odd dimension is M: padded here when K or N is odd, as there
        per = TENSOR_CORE_BYTES // max(1, itemsize(work.dtype))
        if work.k % per or work.n % per:
            return replace(work, compiled=True, align=TENSOR_CORE_BYTES)
    return replace(work, compiled=True)


class _Eager:
    """A captured node seen without its ``compiled`` mark (its op's own work)."""

    op = "call_function"

    def __init__(self, node: Any):
        self.target, self.args, self.kwargs = node.target, node.args, node.kwargs
        self.meta = {k: v for k, v in node.meta.items() if k != "compiled"}


def _phase(phase: str) -> str:
    return "forward" if phase in ("loss", "") else phase


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


class _RecordShapes:
    """Shapes of a reference record's tensors, in flattened schema order."""

    def __init__(self, ins, outs):
        self.ins, self.outs = ins, outs

    def a_transposed(self, index: int) -> bool:
        """Whether matrix input ``index`` is a column-major (transposed) view."""
        shape, _, stride = self.ins[index]
        return stride is not None and len(shape) >= 2 and shape[-2] > 1 and stride[-2] == 1 and shape[-1] > 1

    def stride(self, index: int) -> tuple[int, ...] | None:
        return self.ins[index][2] if index < len(self.ins) else None

    def argument(self, name: str, default: Any = None) -> Any:
        """A non-tensor argument: the records keep none."""
        return default


class _NodeShapes:
    """Shapes of a captured node's tensors (transposition read off the producer; strides, where a convolution's
    layout needs them, from the producer's recorded output)."""

    _TRANSPOSES = frozenset({"t", "transpose", "permute", "mT", "adjoint"})

    def __init__(self, node, ins, outs, producers):
        self.node, self.ins, self.outs, self.producers = node, ins, outs, producers

    def a_transposed(self, index: int) -> bool:
        prod_node = self.producers[index] if index < len(self.producers) else None
        target = getattr(prod_node, "target", None)
        return target is not None and op_base(target_text(target)) in self._TRANSPOSES

    def stride(self, index: int) -> tuple[int, ...] | None:
        """The recorded strides of input ``index`` (its producer's single output), or None."""
        prod_node = self.producers[index] if index < len(self.producers) else None
        strides = getattr(prod_node, "meta", {}).get("stride") or ()
        return tuple(strides[0]) if len(strides) == 1 and strides[0] is not None else None

    def argument(self, name: str, default: Any = None) -> Any:
        """The node's argument ``name``, bound by the op's schema (keyword, position or the schema's default)."""
        return bind(self.node.target, self.node.args, self.node.kwargs).get(name, default)


def _node_inputs(node) -> tuple[list, list]:
    """Tensor inputs of a captured node in schema order, as (shape, dtype, None), and their
    producers; an input made by ``expand`` counts the expanded tensor's source elements."""
    ins, producers = [], []
    for a in node.args:
        _visit_input(a, ins, producers)
    for a in node.kwargs.values():
        _visit_input(a, ins, producers)
    return ins, producers


def _visit_input(v, ins: list, producers: list) -> None:
    """One argument of :func:`_node_inputs` (a module-level recursion: no reference cycle per call)."""
    if isinstance(v, OpNode):
        spec = (v.meta.get("spec") or (None,))
        spec = spec[0] if len(spec) == 1 else None
        if v.target is operator.getitem and v.op == "call_function":
            spec = (v.meta.get("spec") or (None,))[0]
        if spec is None:
            return
        shape = tuple(spec.shape)
        stride = None
        if v.op == "call_function" and op_base(target_text(v.target)) in ("expand", "expand_as", "broadcast_to"):
            src = v.args[0] if v.args else None
            src_spec = (src.meta.get("spec") or (None,))[0] if isinstance(src, OpNode) else None
            if src_spec is not None:
                # an expanded view addresses only its source's elements: stride 0 on broadcast dims
                pad = len(shape) - len(src_spec.shape)
                src_shape = (1,) * pad + tuple(src_spec.shape)
                stride = tuple(0 if (s == 1 and d != 1) else 1 for s, d in zip(src_shape, shape))
                stride = _dense_strides_masked(shape, stride)
        ins.append((shape, _dtype_name(spec.dtype), stride))
        producers.append(v)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _visit_input(x, ins, producers)
    elif isinstance(v, dict):
        for x in v.values():
            _visit_input(x, ins, producers)


def _dense_strides_masked(shape, mask) -> tuple[int, ...]:
    """Row-major strides of ``shape`` with the broadcast dims (mask 0) at stride 0."""
    strides, acc = [], 1
    for size, keep in zip(reversed(shape), reversed(mask)):
        strides.append(acc if keep else 0)
        if keep:
            acc *= size
    return tuple(reversed(strides))


def _node_causal(node) -> bool:
    return bool(bind(node.target, node.args, node.kwargs).get("is_causal"))


def _kind_of(base: str, phase: str, ins) -> str:
    if base in MATMUL_OPS:
        return MATMUL
    if base in CONV_OPS or base in CONV_BACKWARD_OPS:
        return CONV
    if base in ATTENTION_OPS:
        return ATTENTION
    if base in RNN_OPS:
        return RNN
    if base in ("_local_scalar_dense", "item") and phase == "optimizer":
        return HOST  # the optimizer's step counts live on the host (capturable=False): no device read
    if base in SYNC_OPS:
        return SYNC
    if base in VIEW_OPS:
        return VIEW
    if base.startswith("_foreach_") and ins and all(len(s) == 0 for s, _, _ in ins):
        return HOST  # foreach over the host-side step counts (AdamW's state_steps on the CPU)
    return MEMORY


def _bytes_of(t) -> int:
    shape, dtype, stride = t
    return footprint(shape, stride) * itemsize(dtype)


def _work(name, base, phase, ins, outs, causal, shapes) -> OpWork:
    """The work of one op from its tensor inputs and outputs ((shape, dtype, stride) triples)."""
    kind = _kind_of(base, phase, ins)
    if kind in (VIEW, HOST, SYNC):
        return OpWork(name, phase, kind, launches=0, sync=kind == SYNC)
    read = sum(_bytes_of(t) for t in ins)
    written = sum(_bytes_of(t) for t in outs)
    dtype = next((d for _, d, _ in ins if d.startswith(("float", "bfloat", "complex"))),
                 outs[0][1] if outs else None)
    if base in GATHER_OPS and ins and outs:
        # a gather reads the rows it returns (and the indices), not the whole table
        read = min(read, _bytes_of(outs[0]) + sum(_bytes_of(t) for t in ins[1:]))
    if base in ("nll_loss_forward", "nll_loss2d_forward") and len(ins) >= 2:
        # reads one log-probability per target (a gather), not the whole [N, C] input
        read = sum(_bytes_of(t) for t in ins[1:]) + numel(ins[1][0]) * itemsize(ins[0][1])
    if base in ("nll_loss_backward", "nll_loss2d_backward") and outs:
        # zero-fills grad_input [N, C] and scatters one value per target: writes it, reads the targets
        read = sum(_bytes_of(t) for i, t in enumerate(ins) if i != 1)
    if base.startswith("_foreach_"):
        return _foreach_work(name, base, phase, ins, outs, dtype)
    if is_inplace(base) and not outs and ins:
        written = _bytes_of(ins[0])
    launches = LAUNCHES.get(base, 1)
    if base == "_safe_softmax" and ins and outs:
        return _safe_softmax_work(name, phase, ins, outs, dtype)
    common = dict(bytes_read=read, bytes_written=written, dtype=dtype)
    if kind == MATMUL:
        return _matmul_work(name, base, phase, ins, outs, shapes, common)
    if kind == CONV:
        return _conv_work(name, base, phase, ins, outs, common, shapes)
    if kind == ATTENTION:
        return _attention_work(name, base, phase, ins, outs, causal, common)
    if kind == RNN:
        return _rnn_work(name, base, phase, ins, outs, common)
    return OpWork(name, phase, MEMORY, launches=launches, library="cudnn" if base in LIBRARY_OPS else "",
                  memory_class=_memory_class(base, ins, outs), **common)


def _safe_softmax_work(name, phase, ins, outs, dtype) -> OpWork:
    """SDPA's math path's ``_safe_softmax`` (ATen attention.cpp): ``softmax(x)``, then ``x.eq(-inf)``,
    ``all`` over the softmax dimension and ``where(rows, 0, out)``, with two scalar fills: six kernels.  The
    softmax and the ``all`` stream at the reduction rate; ``eq`` (x read, a 1-byte mask written) and ``where``
    (out read and written) at the elementwise rate (``streamed``)."""
    n = numel(ins[0][0])
    s_in, s_out = itemsize(ins[0][1]), itemsize(outs[0][1])
    streamed = (n * s_in + n) + 2 * n * s_out  # eq, where
    return OpWork(name, phase, MEMORY, bytes_read=2 * n * s_in + n + n * s_out, bytes_written=2 * n * s_out + n,
                  dtype=dtype, launches=6, memory_class="reduction", streamed=streamed)


def _memory_class(base, ins, outs) -> str:
    """MEMORY_CLASS of the op, or "cast_widen" for a cast to a wider float (bf16 -> fp32)."""
    if base in CAST_OPS and ins and outs:
        src, dst = ins[0][1], outs[0][1]
        if src.startswith(("float", "bfloat")) and dst.startswith("float") and itemsize(dst) > itemsize(src):
            return "cast_widen"
    return MEMORY_CLASS.get(base, "elementwise")


def _matmul_work(name, base, phase, ins, outs, shapes, common) -> OpWork:
    # operands in schema order: mm(self, mat2), bmm(self, mat2), addmm(self=bias, mat1, mat2),
    # baddbmm(self, batch1, batch2), _grouped_mm(self, mat2, offs?, bias?)
    ia = 1 if base in ("addmm", "baddbmm", "_addmm_activation", "addbmm") else 0
    a, b = ins[ia][0], ins[ia + 1][0]
    dtype = ins[ia][1]
    launches, sync = 1, False
    if base == "_grouped_mm":
        out_shape = outs[0][0] if outs else _grouped_out_shape(a, b)
        batch, m, n, k = grouped_gemm_dims(a, b, out_shape)
        # (T, K) @ (G, K, N): 2*T*K*N; (K, T) @ (T, N) per group: 2*K*T*N
        flops = grouped_mm_flops(a, b, out_shape)
        if dtype != "bfloat16":
            # only bf16 has a grouped kernel (CUTLASS, sm90+); other dtypes take ATen's fallback,
            # which copies the group offsets to the host (a sync) and runs one mm per group
            launches, sync = batch, True
    else:
        batch, m, n, k = gemm_dims(a, b)
        # [batch, m, k] @ [batch, k, n]: one multiply-add per (batch, m, n, k)
        flops = 2 * batch * m * n * k
    # leading dims: C's n, A's k (or m when A is a transposed view), B's n or k
    lead = [n, k] + ([m] if shapes.a_transposed(ia) else [])
    align = alignment_bytes(lead, itemsize(dtype))
    # a float8 GEMM's variant (timing.float8): tensorwise or rowwise scales (scale_a's size), fast accumulation
    backend = float8.variant(numel(ins[2][0]), bool(shapes.argument("use_fast_accum", False))) \
        if base == "_scaled_mm" and len(ins) > 2 else ""
    return OpWork(name, phase, MATMUL, flops=flops, batch=batch, m=m, n=n, k=k, align=align, backend=backend,
                  launches=launches, sync=sync, library="cublas", **{**common, "dtype": dtype})


def _grouped_out_shape(a, b):
    if len(a) == 2 and len(b) == 2:
        return (1, a[0], b[1])
    return (a[0], b[-1]) if len(a) == 2 else (a[0], a[1], b[-1])


def _conv_work(name, base, phase, ins, outs, common, shapes) -> OpWork:
    if base in CONV_BACKWARD_OPS:
        # convolution_backward(grad_output, input, weight, ...) -> (grad_input?, grad_weight?, grad_bias?)
        g, x, w = ins[0][0], ins[1][0], ins[2][0]
        dtype = ins[0][1]
        grads = [o[0] for o in outs]
        # one forward's FLOPs per requested gradient: grad_input has x's shape, grad_weight w's
        n_grads = int(x in grads) + int(w in grads) if grads else 2
        per = conv_flops(x, w, g)
        batch, m, n, k = conv_gemm_dims(x, w, g)
        launches = max(1, n_grads + int(len(grads) > n_grads))
        # channels per group are the contiguous (NHWC) GEMM dimensions cuDNN's kernels load
        align = alignment_bytes([x[1] // batch if len(x) > 1 else 1, n], itemsize(dtype))
        depthwise = classify_depthwise(x, w, g, is_channels_last(x, shapes.stride(1)))
        return OpWork(name, phase, CONV, flops=per * n_grads, batch=batch, m=m, n=n, k=k, align=align, backward=True,
                      launches=launches, library="cudnn", depthwise=depthwise, **{**common, "dtype": dtype})
    # convolution(input, weight, bias?, ...) -> out
    x, w = ins[0][0], ins[1][0]
    out = outs[0][0] if outs else None
    if out is None:
        raise ValueError(f"{name}: the output shape is needed for the FLOPs (pass the memory record)")
    batch, m, n, k = conv_gemm_dims(x, w, out)
    # channels per group (C_in/g, C_out/g) are the contiguous GEMM dimensions (NHWC kernels)
    align = alignment_bytes([w[1], n], itemsize(ins[0][1]))
    # 2 * N * prod(out spatial) * weight.numel (rules/conv.py)
    depthwise = classify_depthwise(x, w, out, is_channels_last(x, shapes.stride(0)))
    return OpWork(name, phase, CONV, flops=conv_flops(x, w, out), batch=batch, m=m, n=n, k=k, align=align,
                  library="cudnn", depthwise=depthwise, **{**common, "dtype": ins[0][1]})


def _attention_work(name, base, phase, ins, outs, causal, common) -> OpWork:
    backend, backward, layout = ATTENTION_OPS[base]
    # forward: (query, key, value, ...); backward: (grad_out, query, key, value, ...)
    q, k, v = (t[0] for t in ins[1:4]) if backward else (t[0] for t in ins[0:3])
    if layout == "bshd":
        # [b, s, h, d] -> [b, h, s, d]
        q, k, v = ((s[0], s[2], s[1], s[3]) for s in (q, k, v))
    # forward: Q @ K^T and P @ V (4*b*h*s_q*s_k*d); backward: five such products
    flops = sdpa_backward_flops(q, q, k, v) if backward else sdpa_flops(q, k, v)
    dtype = ins[1 if backward else 0][1]
    b, h, s_q, d = q
    s_k = k[2]
    launches = 2 if backward else 1
    return OpWork(name, phase, ATTENTION, flops=flops, batch=b * h, m=s_q, n=s_k, k=d, backend=backend,
                  backward=backward, causal=causal, launches=launches, library="cudnn" if backend == "cudnn" else "",
                  **{**common, "dtype": dtype})


def _rnn_work(name, base, phase, ins, outs, common) -> OpWork:
    backward = base.endswith("_backward")
    dtype = ins[0][1]
    x = ins[0][0]
    if base.startswith("mkldnn"):
        # mkldnn_rnn_layer(input, W_ih, W_hh, b_ih, b_hh, hx_, cx_, ...) and its backward
        # (input, W_ih, W_hh, b_ih, b_hh, hx_, cx_, ...): one layer in one direction per call
        w_ih, w_hh, hx = ins[1][0], ins[2][0], ins[5][0]
        batch, hidden = hx[-2], hx[-1]
        gates = numel(w_hh) // (hidden * hidden)
        # rows = T * B in either layout: the time steps are rows / B
        steps = numel(x[:-1]) // max(1, batch)
        layers = [(numel(w_ih) // (gates * hidden), hidden)]
    else:
        # _cudnn_rnn(input, weight[] (per layer and direction: W_ih, W_hh[, b_ih, b_hh]), weight_buf,
        # hx [L*D, B, H], cx?, ...); the backward has the same head.  Autocast passes the weights as
        # flat [n, 1] views, so sizes are read from element counts.
        i_hx = next(i for i in range(1, len(ins)) if len(ins[i][0]) == 3)
        ld, batch, hidden = ins[i_hx][0]
        weights = ins[1:i_hx]
        total = sum(numel(t[0]) for t in weights)
        weights = [t for t in weights if 2 * numel(t[0]) != total]  # drop the flat weight buffer
        per = len(weights) // max(1, ld)  # 4 with biases, 2 without
        gates = numel(weights[1][0]) // (hidden * hidden)
        layers = [(numel(weights[j * per][0]) // (gates * hidden), hidden) for j in range(ld)]
        # input [B, T, I] (batch_first) or [T, B, I]; a PackedSequence's rows [sum of lengths, I]
        steps = x[1] if x[0] == batch else x[0]
    gh = gates * hidden
    rows = steps * batch
    if len(x) == 2 and not base.startswith("mkldnn"):
        # packed rows: the steps are at least rows / B (the longest sequence; batch_sizes is not a tensor here)
        rows, steps = x[0], -(-x[0] // max(1, batch))
    # per step and batch row: x @ W_ih^T (2*I*G*H) and h @ W_hh^T (2*H*G*H); backward twice that
    flops = sum(2 * rows * gh * (i_l + h_l) for i_l, h_l in layers) * (2 if backward else 1)
    return OpWork(name, phase, RNN, flops=flops, batch=len(layers), m=batch, n=gh, k=hidden,
                  steps=steps * len(layers), backward=backward, launches=len(layers),
                  library="cudnn" if base.startswith("_cudnn") else "",
                  **{**common, "dtype": dtype})


def _foreach_work(name, base, phase, ins, outs, dtype) -> OpWork:
    # the lists are flattened in schema order; the .List overloads take one tensor list more
    overload = name.rsplit(".", 1)[-1]
    lists = FOREACH_DEPTH.get(base.rstrip("_"), 1) + (1 if overload == "List" else 0)
    n_list = max(1, len(ins) // lists)  # a single Tensor argument (``.Tensor``) rounds away
    first = ins[:n_list]
    read = sum(_bytes_of(t) for t in ins)
    # in place: the first list is written back; otherwise the outputs are new tensors
    written = sum(_bytes_of(t) for t in outs) if outs else (sum(_bytes_of(t) for t in first) if is_inplace(base) else 0)
    depth = lists + (0 if is_inplace(base) else 1)
    launches = foreach_launches([numel(t[0]) for t in first], depth)
    # an out-of-place foreach op writes new tensors (AdamW's _foreach_sqrt): it streams slower
    cls = MEMORY_CLASS.get(base, "elementwise" if is_inplace(base) or not outs else "foreach_new")
    return OpWork(name, phase, MEMORY, bytes_read=read, bytes_written=written, dtype=dtype, launches=launches,
                  tensors=n_list, memory_class=cls)

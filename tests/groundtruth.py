"""Ground truth for one training step, measured on a REAL CPU step.

Independent of the estimator: nothing of its capture, rules, tallies or validate
module is used; the measuring instruments are the tests' own (:mod:`instruments`).  :func:`measure` deep-copies the model (the caller's model, inputs and
optimizer are never changed), then

1. memory run: forward + loss under a ``saved_tensors_hooks`` pack hook (every
   tensor autograd saves is recorded; those it still holds when backward starts, distinct storages
   by ``data_ptr``, parameter and buffer storages excluded, bytes = ``untyped_storage().nbytes()``), the
   real ``backward()`` (gradient bytes from the real ``.grad`` tensors' distinct storages) and a
   real ``optimizer.step()`` (state bytes from the real ``optimizer.state``);
2. FLOP run, on a second copy and with no pack hook (so that neither run can
   perturb the other): ``FlopCounterMode`` around forward + loss, and a second
   one around backward, with the three defects of ``torch.utils.flop_counter``
   fixed by ``instruments.FIXES``.

The FLOP count is "matmul-class": the ops ``FlopCounterMode`` has formulas for
(mm, addmm, bmm, baddbmm, convolution and its backward, the SDPA kernels) plus
the ones this module adds (CPU SDPA, ``mkldnn_rnn_layer`` and its backward).
One multiply-add = 2 FLOPs, as in ``torch.utils.flop_counter``.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any, Callable, Mapping

import torch
import torch.utils._pytree as pytree
from torch.utils.flop_counter import FlopCounterMode

aten = torch.ops.aten


from instruments import FIXES as FLOP_FIXES, flop_counter  # noqa: E402  (the tests' own instrument)


def _by_op(counter: FlopCounterMode) -> dict[str, int]:
    return {str(k): v for k, v in counter.get_flop_counts().get("Global", {}).items()}


# ---------------------------------------------------------------------------
# Optimizers (own table and parser: the same spec forms as estimate())
# ---------------------------------------------------------------------------

_OPTIMIZERS = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "adagrad": torch.optim.Adagrad,
    "rmsprop": torch.optim.RMSprop,
}


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def build_real_optimizer(spec: Any, model: torch.nn.Module, memo: Mapping[int, Any] | None = None):
    """The real optimizer over ``model``'s trainable parameters (None for "none").

    ``spec``: "name[:k=v,...]", an Optimizer class, or an Optimizer instance built
    over the ORIGINAL model (``memo`` maps its parameters' ids to ``model``'s copies).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if spec is None or spec == "none":
        return None
    if isinstance(spec, str):
        name, _, rest = spec.partition(":")
        kwargs = {"lr": 1e-3}
        for item in filter(None, rest.split(",")):
            k, _, v = item.partition("=")
            kwargs[k.strip()] = _value(v.strip())
        return _OPTIMIZERS[name.strip().lower()](params, **kwargs)
    if isinstance(spec, type):
        return spec(params, lr=1e-3)
    if isinstance(spec, torch.optim.Optimizer):
        groups = []
        for g in spec.param_groups:
            groups.append({**{k: v for k, v in g.items() if k != "params"},
                           "params": [memo[id(p)] for p in g["params"] if memo[id(p)].requires_grad]})
        return type(spec)(groups)
    raise TypeError(f"unknown optimizer spec {spec!r}")


# ---------------------------------------------------------------------------
# The step
# ---------------------------------------------------------------------------


def default_loss(output: Any) -> torch.Tensor:
    """Same rule as documented for estimate(): loss_fn(output); the output if it is a
    scalar; output.loss (its mean if it has one per sample); else the sum of ``t.mean()`` over floating outputs
    requiring grad."""
    if isinstance(output, torch.Tensor) and output.numel() == 1:
        return output.reshape(())
    loss = getattr(output, "loss", None)
    if not isinstance(loss, torch.Tensor) and isinstance(output, Mapping):
        loss = output.get("loss")
    if isinstance(loss, torch.Tensor):
        return loss.mean() if loss.numel() != 1 and loss.is_floating_point() else loss  # per-sample: the mean
    terms = [t.mean() for t in pytree.tree_leaves(output)
             if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad]
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total


def _call(model, inputs):
    if isinstance(inputs, torch.Tensor):
        return model(inputs)
    if isinstance(inputs, Mapping):
        return model(**inputs)
    return model(*inputs)


def _copy(model, inputs):
    memo: dict[int, Any] = {}
    m = copy.deepcopy(model, memo)
    x = copy.deepcopy(inputs)
    if not m.training:  # (a model in training mode keeps the modules its user put in eval, as the estimate does)
        m.train()
    return m, x, memo


def _loss(output, loss_fn):
    return loss_fn(output) if loss_fn is not None else default_loss(output)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def measure(model: torch.nn.Module, inputs: Any, optimizer: Any = "adamw",
            loss_fn: Callable[[Any], torch.Tensor] | None = None, seed: int = 0) -> dict[str, Any]:
    """Measure one real training step of a deep copy of ``model`` on ``inputs``."""
    # -- memory run -------------------------------------------------------------
    m, x, memo = _copy(model, inputs)
    params = list(m.parameters())  # tied weights once
    state_ptrs = {t.untyped_storage().data_ptr() for t in params + list(m.buffers())}
    packed: list[tuple[weakref.ref, int, int]] = []  # (the alias autograd holds, storage address, bytes)

    def pack(t: torch.Tensor) -> torch.Tensor:
        alias = t.detach()  # without history: a node that saves its own output makes no reference cycle
        st = t.untyped_storage()
        if st.data_ptr() not in state_ptrs:
            packed.append((weakref.ref(alias), st.data_ptr(), st.nbytes()))
        return alias

    torch.manual_seed(seed)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = _call(m, x)
        loss = _loss(out, loss_fn)
    out = None  # the loop the estimate models by default: only the loss is held once computed
    # the activations: what autograd still holds when backward starts (a node the loss does not reach was
    # freed with what it saved), distinct storages; parameters and buffers are not activations
    saved = {ptr: nbytes for ref, ptr, nbytes in packed if ref() is not None}
    keep = [ref() for ref, _, _ in packed if ref() is not None]
    loss.backward()
    opt = build_real_optimizer(optimizer, m, memo)
    if opt is not None:
        opt.step()
    grads = [p.grad for p in params if p.grad is not None]
    state_storages: dict[int, int] = {}
    if opt is not None:
        for st in opt.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    state_storages.setdefault(v.untyped_storage().data_ptr(), v.untyped_storage().nbytes())
    buffers = list(m.buffers())
    result = {
        "params_total": sum(p.numel() for p in params),
        "params_trainable": sum(p.numel() for p in params if p.requires_grad),
        "param_bytes": sum(_nbytes(p) for p in params),
        "buffer_bytes": sum(_nbytes(b) for b in buffers),
        # distinct storages: a gradient AccumulateGrad took as a view of a larger one (the slice of a
        # concatenation's gradient, MobileBERT's output head) holds that whole storage
        "grad_bytes": sum({g.untyped_storage().data_ptr(): g.untyped_storage().nbytes() for g in grads}.values()),
        "grad_params": sum(1 for p in params if p.grad is not None),
        "trainable_params": sum(1 for p in params if p.requires_grad),
        "optimizer_state_bytes": sum(state_storages.values()),
        "activation_bytes": sum(saved.values()),
        "saved_tensors": len(keep),
    }
    del keep, out, loss, opt, m

    # -- FLOP run ---------------------------------------------------------------
    m, x, _ = _copy(model, inputs)
    torch.manual_seed(seed)
    fwd = flop_counter()
    with fwd:
        out = _call(m, x)
        loss = _loss(out, loss_fn)
    bwd = flop_counter()
    with bwd:
        loss.backward()
    result.update(
        matmul_forward=fwd.get_total_flops(),
        matmul_backward=bwd.get_total_flops(),
        flops_forward_by_op=_by_op(fwd),
        flops_backward_by_op=_by_op(bwd),
    )
    return result


def saved_tensor_log(model: torch.nn.Module, inputs: Any, loss_fn=None) -> list[tuple[tuple, str, int, int]]:
    """Diagnostics: (shape, dtype, storage nbytes, storage data_ptr) of every non-parameter
    tensor packed during forward + loss on a real copy (for chasing activation differences)."""
    m, x, _ = _copy(model, inputs)
    param_ptrs = {p.untyped_storage().data_ptr() for p in m.parameters()}
    rows, keep = [], []

    def pack(t):
        keep.append(t)
        st = t.untyped_storage()
        if st.data_ptr() not in param_ptrs:
            rows.append((tuple(t.shape), str(t.dtype), st.nbytes(), st.data_ptr()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _loss(_call(m, x), loss_fn)
    return rows


__all__ = ["measure", "FLOP_FIXES", "flop_counter", "build_real_optimizer", "saved_tensor_log"]

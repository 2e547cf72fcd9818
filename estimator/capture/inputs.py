"""The step's inputs, parameters and buffers as traced tensors (fake, or private real CPU copies).

The user's tensors are never touched: parameters and buffers are replaced for the duration of
the step by traced stand-ins of the same shape, stride and (policy) dtype; inputs are converted
keeping their aliasing (the same tensor passed twice stays one tensor; views of one storage
stay views of one storage).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from ..errors import UserError


def split_inputs(inputs: Any) -> tuple[tuple, dict]:
    """A tensor -> (t,); a tuple/list -> positional args; a dict -> keyword args."""
    if isinstance(inputs, torch.Tensor):
        return (inputs,), {}
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    raise UserError(
        f"inputs must be a tensor, a tuple of positional arguments or a dict of keyword "
        f"arguments, not {type(inputs).__name__}"
    )


def is_real(t: torch.Tensor) -> bool:
    """A tensor with data: neither on the meta device nor fake."""
    return t.device.type != "meta" and not isinstance(t, torch._subclasses.FakeTensor)


def materialize(t: torch.Tensor) -> torch.Tensor:
    """A real CPU tensor like ``t``: ``t`` itself if real, else random floats, integers and booleans of ones (a
    mask that keeps every position, a length of one, token id 1: zeros selected nothing, so a model that reads its
    mask's values ran on no rows)."""
    if is_real(t):
        return t
    with torch.no_grad():
        if t.is_floating_point() or t.is_complex():
            out = torch.randn(t.shape, dtype=t.dtype)
        else:
            out = torch.ones(t.shape, dtype=t.dtype)
    return out.requires_grad_(t.requires_grad)


def keeps_values(t: torch.Tensor) -> bool:
    """Whether a tensor of the user's is traced with its values: integer and boolean tensors with data
    (token ids, masks, positions: small, and read by the code that builds attention masks), and
    floating-point ones that need no gradient and hold at most ``KNOWN_VALUES_LIMIT`` elements (a float
    attention mask, which transformers skips when it is all ones; a detector's target boxes; images, which
    the first weight's op turns fake).  Values the real step's control flow can read without depending on
    the weights."""
    from .fake import KNOWN_VALUES_LIMIT
    if not is_real(t):
        return False
    if t.is_floating_point() or t.is_complex():
        return not t.requires_grad and t.numel() <= KNOWN_VALUES_LIMIT
    return True


def real_copy(shape: tuple[int, ...], dtype: torch.dtype, source: torch.Tensor) -> torch.Tensor:
    """A private real copy of ``source``'s whole storage as a flat tensor (``shape``: its element count)
    or, when ``shape`` is ``source``'s own shape, of ``source`` itself."""
    if tuple(source.shape) == tuple(shape):
        return source.detach().clone()
    flat = torch.empty(0, dtype=source.dtype).set_(source.untyped_storage(), 0, shape, (1,))
    return flat.clone()


def convert_inputs(inputs: Any, make_base: Callable[[tuple[int, ...], torch.dtype], torch.Tensor],
                   dtype_of: Callable[[torch.dtype], torch.dtype],
                   keep: Callable[[torch.Tensor], bool] = lambda t: False) -> Any:
    """Traced stand-ins for the input tensors that keep their aliasing: the same tensor twice
    (``mha(x, x, x)``) stays one tensor, and views of one storage stay views of one storage
    (a sliced input keeps its whole base alive, as autograd does on the real tensors).
    Tensors for which ``keep(t)`` is true are traced as private real copies (their values)."""
    by_id: dict[int, torch.Tensor] = {}
    bases: dict[int, torch.Tensor] = {}

    def convert(t: torch.Tensor) -> torch.Tensor:
        hit = by_id.get(id(t))
        if hit is not None:
            return hit
        storage = t.untyped_storage()
        dtype = dtype_of(t.dtype)
        base = bases.get(storage._cdata)
        whole = t.storage_offset() == 0 and t.is_contiguous() and t.numel() * t.element_size() == storage.nbytes()
        real = keep(t)
        if base is None and whole:  # the common case: a tensor that owns its storage
            out = bases[storage._cdata] = (real_copy(tuple(t.shape), t.dtype, t).to(dtype) if real
                                           else make_base(tuple(t.shape), dtype))
        else:
            if base is None:
                n = storage.nbytes() // t.element_size()
                base = bases[storage._cdata] = real_copy((n,), t.dtype, t).to(dtype) if real else make_base((n,), dtype)
            with torch.no_grad():
                out = base.as_strided(t.shape, t.stride(), t.storage_offset())
        if t.requires_grad:
            try:
                out.requires_grad_(True)
            except RuntimeError:  # a view that autograd will not make a leaf: a detached copy of the view
                out = out.detach().requires_grad_(True)
        by_id[id(t)] = out
        return out

    return pytree.tree_map_only(torch.Tensor, convert, inputs)


def real_param_copy(t: torch.Tensor, is_param: bool, dtype: torch.dtype) -> torch.Tensor:
    """A private real CPU copy of a parameter or buffer (the user's tensors are never touched)."""
    with torch.no_grad():
        if not is_real(t):
            if t.is_floating_point():
                out = torch.randn(t.shape, dtype=dtype) * 0.02 if is_param else torch.ones(t.shape, dtype=dtype)
            else:
                out = torch.zeros(t.shape, dtype=dtype)
        else:
            out = t.detach().to("cpu", dtype=dtype, copy=True)
    return out.requires_grad_(is_param and t.requires_grad)


def meta_twin(rec: Any, p: torch.Tensor, grad: torch.Tensor | None = None,
              requires_grad: bool | None = None) -> torch.Tensor:
    """A meta tensor standing for the fake parameter ``p`` (and its gradient: ``p.grad``, or ``grad`` for a
    shard whose gradient is held by the engine's parameter) in the recorder (same storage ids): the optimizer
    step runs on such twins, since meta kernels skip FakeTensorMode's per-op work and the state they make is
    the same."""

    def twin(t: torch.Tensor) -> torch.Tensor:
        with _disable_current_modes():  # making the twin is bookkeeping, not part of the step
            out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        rec.adopt(out, t)
        return out

    out = twin(p).requires_grad_(p.requires_grad if requires_grad is None else requires_grad)
    grad = p.grad if grad is None else grad
    if grad is not None:
        out.grad = twin(grad)
    return out

"""The live-tensor tracker: validate's peak on CPU (a ``TorchDispatchMode`` over real tensors)."""

from __future__ import annotations

import weakref

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


class LiveTracker(TorchDispatchMode):
    """Live bytes of real tensors: each output storage's bytes are added when it first appears
    and subtracted when a ``weakref.finalize`` sees it freed; :meth:`register` the tensors that
    exist before (parameters, buffers, inputs)."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self.known: dict[int, int] = {}  # storage _cdata -> bytes

    def register(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key = st._cdata
        if key in self.known:
            return
        n = st.nbytes()
        self.known[key] = n
        self.live += n
        self.peak = max(self.peak, self.live)
        weakref.finalize(st, self._free, key).atexit = False

    def _free(self, key: int) -> None:
        n = self.known.pop(key, None)
        if n is not None:
            self.live -= n

    def reset_peak(self) -> None:
        self.peak = self.live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for t in pytree.tree_leaves((args, kwargs or {})):
            if isinstance(t, torch.Tensor):
                self.register(t)
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.register(t)
        return out

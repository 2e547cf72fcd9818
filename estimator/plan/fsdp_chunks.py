"""FSDP2's parameter chunks without one empty tensor per rank, during the planner's traces.

``fully_shard`` splits each parameter into world-size chunks with ``_chunk_with_empty``
(``torch/distributed/fsdp/_fully_shard/_fsdp_common.py``): ``torch.chunk`` gives at most dim-0 chunks, and an
empty tensor is made for every rank beyond them, though ``FSDPParam`` only reads the chunk of its own rank and
chunk 0 (``_fsdp_param.py``: ``_init_sharded_param`` and ``_init_sharded_post_forward_param_metadata``).  At
thousands of ranks that is millions of ``new_empty`` calls: a 16,384-GPU FSDP trace of a 2-layer GPT took 10 s
(8.6 s in those calls) where 256 GPUs took 0.6 s.  Here the empty chunks are made when they are read; every
chunk read is the one torch makes.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any, Iterator

import torch

_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_param"
_NAME = "_chunk_with_empty"


class LazyChunks:
    """``torch.chunk``'s chunks, then empty ones up to ``n``: a sequence made on reading."""

    def __init__(self, chunks: list[torch.Tensor], n: int):
        self.chunks, self.n = chunks, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if not isinstance(i, int):
            raise TypeError(f"chunk indices are ints, not {type(i).__name__}")
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.chunks[i] if i < len(self.chunks) else self.chunks[0].new_empty(0)

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (self[i] for i in range(self.n))


def lazy_chunk_with_empty(tensor: torch.Tensor, num_chunks: int, dim: int) -> Any:
    return LazyChunks(list(torch.chunk(tensor, num_chunks, dim=dim)), num_chunks)


@contextlib.contextmanager
def lazy_fsdp_chunks() -> Iterator[None]:
    """Within the block, ``FSDPParam`` gets :class:`LazyChunks` (another torch: its own function)."""
    try:
        module = importlib.import_module(_MODULE)
    except ImportError:  # pragma: no cover - a torch without FSDP2
        module = None
    original = getattr(module, _NAME, None)
    if original is None:
        yield
        return
    setattr(module, _NAME, lazy_chunk_with_empty)
    try:
        yield
    finally:
        setattr(module, _NAME, original)

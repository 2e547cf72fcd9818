"""Memory the CUDA libraries take inside the caching allocator that no op returns.

``torch.cuda.max_memory_allocated()`` counts everything the caching allocator hands out, which
includes, besides the tensors of the step (what the capture records):

* **cuBLAS workspaces**, one per cuBLAS handle, i.e. per thread that runs a GEMM: the thread of
  the forward pass and optimizer step, and autograd's device thread for backward.  They are
  allocated at the first GEMM of each thread and kept (the reference H100 steps hold 64 MiB of
  them in training, 32 MiB in inference).  Size: ``CUBLAS_WORKSPACE_CONFIG`` when set, else
  ``:4096:8`` = 32 MiB on sm90 and newer, ``:4096:2:16:8`` = 8 MiB + 128 KiB before
  (``aten/src/ATen/cuda/CublasHandlePool.cpp``: ``getChosenWorkspaceSize``).  A thread that runs
  an ``addmm`` through cuBLASLt (a 1-D bias fused in the epilogue: ``Blas.cpp``,
  ``isInputCompliesAddmmCudaLt``) also gets a cuBLASLt workspace of 1 MiB
  (``CUBLASLT_WORKSPACE_SIZE``, in KiB); the reference steps show 65 MiB for models with biased
  linear layers, 66 MiB when checkpointing recomputes them in backward.
* **Kernel temporaries**: workspaces allocated inside one op and freed before it returns
  (cuDNN convolution, attention and RNN workspaces, the cross-block buffers of ATen's reductions,
  softmax backward's ``grad * output``, ``_safe_softmax``'s masks, CUB's sort and scan buffers in
  embedding backward, ``sort``, ``index_put`` and ``cumsum``): per-op rules, registered like the
  FLOP rules (:func:`transient`), pure functions of the op's arguments and of its tensors' strides
  (:class:`Layout`); each docstring names its source and the reference figures it reproduces
  (``tests/test_workspace.py`` checks them against every op of the reference H100 steps).
* **Outputs the CUDA kernel does not place on the GPU**: the memory-efficient attention
  kernel's RNG seed and offset are host tensors when there is no dropout (:func:`device_bytes`).

:func:`library_memory` applies them to a captured step; :func:`estimator.memory.simulate` adds
them to the timeline.

Where each library's rules live: :mod:`.cublas` (workspaces per handle), :mod:`.attention` (fused
SDPA kernels), :mod:`.cudnn` (convolutions, recurrent layers), :mod:`.reductions` (ATen's
reductions and softmax), :mod:`.cub` (sorts and scans: embedding backward, sort, index_put,
cumsum); :mod:`.layout` holds the strides rules read and the ``@transient`` registry, and
:mod:`.library` applies every rule to a step.
"""

from . import attention, cudnn  # noqa: F401  (register their rules with @transient; cub and reductions below)
from .cub import cub_num_bits, cub_radix_sort_pairs_bytes, cub_scan_bytes
from .cublas import cublas_workspace_bytes, cublaslt_workspace_bytes
from .layout import TRANSIENT, Layout, TransientRule, contiguous_strides, layout_of, transient
from .library import LibraryMemory, device_bytes, library_memory
from .reductions import reduce_buffer_bytes, reduction_bytes

__all__ = [
    "cub_num_bits", "cub_radix_sort_pairs_bytes", "cub_scan_bytes",
    "cublas_workspace_bytes", "cublaslt_workspace_bytes", "TRANSIENT", "Layout", "TransientRule",
    "contiguous_strides", "layout_of", "transient", "LibraryMemory", "device_bytes", "library_memory",
    "reduce_buffer_bytes", "reduction_bytes",
]

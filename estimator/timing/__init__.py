"""Step time of a training step on a GPU: a per-op time model calibrated on measured kernels.

API (for ``estimate --gpu``, ``plan`` and ``validate``)::

    from estimator.timing import step_time, load_model, OpWork

    st = step_time(report, gpu)                 # a Report, a Capture, OpNodes or OpWork records
    st.total, st.forward, st.backward, st.optimizer       # seconds
    st.calibrated, st.source                    # measured constants for this GPU, or extrapolated
    st.likely, st.band_note                     # the likely range (seconds) and what it rests on (band)
    st.achieved_flops, st.mfu                   # model FLOP/s and model FLOPs utilisation
    st.top(10)                                  # the ops that take the most GPU time
    model = load_model(gpu)                     # the constants (TimingModel) for a hardware.GPU

    step_time(obj, gpu="H100-SXM", model=None, *, matmul_tf32=False, steady_state=True) -> StepTime
    works_of(obj, steady_state=True) -> list[OpWork]   # a Report / Capture / OpNodes as OpWork records
    OpWork.from_node(node) -> OpWork | None     # one op of this project's capture
    OpWork.from_record(rec, mem=None, causal=False) -> OpWork   # one op of the CUDA reference data
    gpu_seconds(work, model) -> float           # the kernel time of one op (GPU busy)
    cpu_seconds(work, model) -> float           # the host time to issue one op (dispatch, launch)
    simulate(works, model) -> StepTime          # the two timelines

Where each part lives:

* ``optable``: which kind of kernel each aten op is (GEMM, convolution, attention, recurrent,
  memory-bound by class, or no kernel);
* ``geometry``: pure functions of shapes (GEMM dimensions, footprints, alignment, launches);
* ``records``: :class:`OpWork`, one op's FLOPs, bytes and GEMM shape, from a captured node or a
  reference record;
* ``kernels``: the GPU time of one op (compute-bound, memory-bound, recurrent);
* ``host``: the host time to issue one op;
* ``constants``: the constants of one GPU (:class:`TimingModel`);
* ``catalog``: which constants a GPU gets (:func:`load_model`: its own fit, a sibling's, or extrapolated);
* ``structure``: the constants of a GPU without measurements, from its structure;
* ``band``: the likely range of a predicted step time (held-out errors by GPU and op mix);
* ``simulate``: the two timelines of a step, :class:`StepTime`, MFU.

``OpWork.from_node`` reads shapes from the nodes (``meta["spec"]`` of the node and of its
inputs), not the tally, so it works on any capture; the FLOPs it finds equal the rules'
(``tests/test_timing.py``).  Check ``.calibrated`` before reporting a time as measured-quality:
the H100-SXM (its own training steps) and the GPUs of the public kernel measurements (fp32 kernels) are.
"""

from .catalog import DATA_FILES, SIBLINGS, load_model
from .constants import EFF_KEYS, TimingModel, datasheet_peaks
from .geometry import (
    alignment_bytes, causal_fraction, conv_gemm_dims, footprint, foreach_launches, gemm_dims, grouped_gemm_dims,
    is_inplace, itemsize, numel, op_base, soft_max,
)
from .host import cpu_seconds, host_class, inop_seconds
from .kernels import (
    align_factor, compute_seconds, efficiency_key, gemm_seconds, gpu_seconds, precision_of, rnn_seconds, size_factor,
    soft_max_p,
)
from .optable import (
    ATTENTION, COMPUTE_KINDS, CONV, HOST, KINDS, MATMUL, MEMORY, MEMORY_CLASSES, NO_KERNEL, PHASES, RNN, SYNC, VIEW,
)
from .records import OpWork
from .simulate import OpTime, StepTime, node_band, node_times, simulate, step_time, timeline, works_of

__all__ = [
    "DATA_FILES", "SIBLINGS", "EFF_KEYS", "TimingModel", "datasheet_peaks", "load_model", "alignment_bytes", "causal_fraction",
    "conv_gemm_dims", "footprint", "foreach_launches", "gemm_dims", "grouped_gemm_dims", "is_inplace", "itemsize",
    "numel", "op_base", "soft_max", "cpu_seconds", "host_class", "inop_seconds", "align_factor", "compute_seconds",
    "efficiency_key", "gemm_seconds", "gpu_seconds", "precision_of", "rnn_seconds", "size_factor", "soft_max_p",
    "ATTENTION", "COMPUTE_KINDS", "CONV", "HOST", "KINDS", "MATMUL", "MEMORY", "MEMORY_CLASSES", "NO_KERNEL",
    "PHASES", "RNN", "SYNC", "VIEW", "OpWork", "OpTime", "StepTime", "node_band", "node_times", "simulate", "step_time",
    "timeline", "works_of",
]

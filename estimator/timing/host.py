"""Host time to issue one op (:func:`cpu_seconds`).

Every op costs ``cpu_view[phase]`` (the dispatcher and autograd; in the forward the model's
Python around it as well); an op with kernels adds what it does on the host itself,
``cpu_inop[op name]`` (allocation, TensorIterator set-up, cuBLAS heuristics, cuDNN plans, the
launch: measured per op name on the H100's host, ``cpu_inop_class`` for names not measured); a
foreach op adds ``cpu_tensor`` per tensor of its lists (the optimizer's per-parameter Python).  An op run in
eager by a layer on a Python tensor subclass (torchao's Float8Linear: ``OpWork.subclass``) costs
:func:`subclass_factor` times as much: the subclass's ``__torch_dispatch__``, its autograd.Functions and
scaling code around every op.
"""

from __future__ import annotations

from typing import Mapping

from .constants import TimingModel
from .float8 import table as float8_table
from .optable import HOST, SYNC, VIEW
from .records import OpWork


def subclass_factor() -> float:
    """Host time of an op of an eager float8 layer over a plain op's (``estimator/data/float8.json``, fitted by
    ``benchmarks/fit_float8.py`` on single torchao float8 layers whose forward and backward are host-bound)."""
    return float8_table().get("eager_host_factor", 1.0)


def host_class(w: OpWork) -> str:
    """The host-cost class of an op with kernels: foreach, cudnn, cublas or kernel."""
    if w.tensors:
        return "foreach"
    return w.library or "kernel"


def inop_seconds(w: OpWork, table: Mapping[str, float], classes: Mapping[str, float]) -> float:
    """Host time inside one op beyond a view's: its op name's measured figure, else its class's."""
    t = table.get(w.op)
    return t if t is not None else classes.get(host_class(w), classes.get("kernel", 0.0))


def cpu_seconds(w: OpWork, model: TimingModel) -> float:
    """Host time to issue one op: the dispatcher, autograd and (forward) the model's Python around
    it, plus what the op does on the host itself (allocation, TensorIterator, library plans, the
    launch), plus the foreach optimizer's per-tensor Python."""
    if w.kind == HOST:
        return 0.0  # the optimizer's scalar reads: inside its per-tensor cost (cpu_tensor)
    if w.compiled:  # a compiled graph's wrapper launches it: no dispatcher, autograd or model Python per op
        return inop_seconds(w, model.cpu_inop, model.cpu_inop_class) if w.kind not in (VIEW, SYNC) else 0.0
    t = model.cpu_view[w.phase]
    if w.kind in (VIEW, SYNC):
        t += model.cpu_sync if w.kind == SYNC else 0.0
    else:
        t += inop_seconds(w, model.cpu_inop, model.cpu_inop_class) + model.cpu_tensor * w.tensors
    return t * subclass_factor() if w.subclass else t

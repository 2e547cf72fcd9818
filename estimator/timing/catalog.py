"""Which constants a GPU's step time uses (:func:`load_model`), from the most to the least measured:

1. **Fitted on its own measurements**: the H100 SXM on this project's measured training steps
   (``timing_h100.json``, ``benchmarks/fit_timing.py``); the A100 80GB / 40GB PCIe, L4, T4, V100 PCIe,
   P100 PCIe and P4 on public fp32 kernel measurements (``timing_<gpu>.json``,
   ``benchmarks/fit_kernels.py``: fp32 GEMMs, convolutions and memory-bound kernels measured; the
   tensor-core, attention, launch and host constants carried over from the H100).
2. **A sibling's measurements** (:data:`SIBLINGS`: the same chip in another board, e.g. the A100 SXM
   and its PCIe card; the H100's variants): the sibling's fractions of the peaks and bandwidth on this
   GPU's datasheet, the fp32 rate moved by the two boards' power factors (:mod:`.structure`).
3. **Extrapolated**: the structural model (:mod:`.structure`) on the GPU's table entry (or ``--gpu
   FILE.json``).

The model's ``calibrated`` is True only for (1); ``source`` says which case, and ``band`` holds the
figures of the step's error band (:mod:`.band`).
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from ..errors import UserError
from ..hardware import GPU
from ..hardware import lookup as lookup_gpu
from .constants import TimingModel
from .structure import Structure, apply, kernel_constants, power_factor, power_headroom

REFERENCE = "H100-SXM"
DATA_FILES = {
    "H100-SXM": "timing_h100.json", "A100-80GB-PCIe": "timing_a100_80gb_pcie.json",
    "A100-40GB-PCIe": "timing_a100_40gb_pcie.json", "L4": "timing_l4.json", "T4": "timing_t4.json",
    "V100-PCIe": "timing_v100_pcie.json", "P100-PCIe": "timing_p100_pcie.json", "P4": "timing_p4.json",
}
STRUCTURE_FILE = "timing_structure.json"
# the same chip (SMs, memory type) on another board: its measured fractions carry over
SIBLINGS = {
    "A100-80GB": "A100-80GB-PCIe", "A100-40GB": "A100-40GB-PCIe", "V100": "V100-PCIe", "V100-16GB": "V100-PCIe",
    "V100-PCIe-16GB": "V100-PCIe", "H100-PCIe": "H100-SXM", "H100-NVL": "H100-SXM", "H800": "H100-SXM",
    "H200": "H100-SXM", "GH200": "H100-SXM",
}


@lru_cache(maxsize=None)
def _read(file: str) -> dict[str, Any]:
    return json.loads(resources.files("estimator").joinpath("data", file).read_text())


def measured(name: str) -> TimingModel:
    """The fitted constants of a GPU with measurements (a key of :data:`DATA_FILES`)."""
    return TimingModel.from_json(_read(DATA_FILES[name]))


def structure() -> Structure:
    return Structure.from_json(_read(STRUCTURE_FILE))


def extrapolation_band() -> dict[str, float]:
    """The band figures of a GPU without measurements (leave-one-GPU-out errors, ``timing_structure.json``)."""
    return dict(_read(STRUCTURE_FILE)["band"])


def sibling_band() -> dict[str, float]:
    """The band figures of a GPU timed from a sibling's constants: the transfer's kernel errors as measured
    on a sibling GPU (``timing_structure.json``'s ``sibling_band``: the H100 SXM's constants on the H200's own
    kernels, ``benchmarks/fit_kernels.py``)."""
    return {k: v for k, v in _read(STRUCTURE_FILE).get("sibling_band", {}).items() if isinstance(v, float)}


def load_model(gpu: GPU | str = REFERENCE) -> TimingModel:
    """The constants for ``gpu`` (see the module docstring for the three cases)."""
    gpu = lookup_gpu(gpu) if isinstance(gpu, str) else gpu
    table_entry = _table_entry(gpu)
    if table_entry and gpu.name in DATA_FILES:
        return measured(gpu.name)
    if table_entry and gpu.name in SIBLINGS:
        return _from_sibling(gpu, SIBLINGS[gpu.name])
    return _extrapolated(gpu)


def _table_entry(gpu: GPU) -> bool:
    """Whether ``gpu`` is the hardware table's entry of its name (not a user's file that reuses it)."""
    try:
        return lookup_gpu(gpu.name) == gpu
    except UserError:  # a name the table lacks
        return False


def _from_sibling(gpu: GPU, sibling: str) -> TimingModel:
    base, base_gpu, s = measured(sibling), lookup_gpu(sibling), structure()
    # the sibling's fp32 rate, moved by the ratio of the two boards' power factors
    moved = (power_factor(power_headroom(gpu), s.headroom0, s.alpha)
             / power_factor(power_headroom(base_gpu), s.headroom0, s.alpha))
    constants = {"bandwidth_frac": base.bandwidth / base_gpu.bandwidth, "reduction": base.memory_eff["reduction"],
                 "norm": base.memory_eff["norm"], "matmul.fp32": base.eff["matmul.fp32"] * moved,
                 "conv.fp32": base.eff["conv.fp32"] * moved,
                 "fill_rows": base.fill_rows * (gpu.sms or base_gpu.sms) / base_gpu.sms, "n0": base.n0,
                 "k0": base.k0, "overlap_p": base.overlap_p}
    source = (f"not measured itself: the constants measured on the {sibling} (the same chip; {base.source}) "
              f"on the {gpu.name}'s datasheet")
    # the sibling's step figure, and the transfer's own kernel errors (measured once: the H100 -> the H200)
    band = {**base.band, **{k: max(v, base.band.get(k, 0.0)) for k, v in sibling_band().items()}}
    return apply(base, base_gpu, gpu, constants, s, calibrated=False, source=source, band=band,
                 provenance={"sibling": sibling, "of_sibling": dict(base.provenance)})


def _extrapolated(gpu: GPU) -> TimingModel:
    s = structure()
    source = ("extrapolated: no kernel measurements for this GPU (its constants from its datasheet and "
              "structure, the model fitted on 8 measured GPUs: estimator/timing/structure.py)")
    return apply(measured(REFERENCE), lookup_gpu(REFERENCE), gpu, kernel_constants(gpu, s), s, calibrated=False,
                 source=source, band=extrapolation_band(), provenance={"structure": dict(s.provenance)})

"""Accelerators: memory, bandwidth and dense peak FLOP/s per dtype.

All FLOP/s are *dense* (no 2:4 structured sparsity) tensor-core peaks from the
vendors' datasheets; ``fp32`` is the non-tensor-core peak.  ``None`` means the
chip has no such mode.  Sources (one per entry, the vendor's datasheet):

* V100: NVIDIA Tesla V100 datasheet (SXM2 32 GB): 15.7 fp32, 125 fp16 tensor, 900 GB/s.
* A100: NVIDIA A100 datasheet (SXM): 19.5 fp32, 156 tf32, 312 bf16/fp16; 40 GB at 1,555 GB/s,
  80 GB at 2,039 GB/s (the CS336 lecture's 19.5 / 312 figures).
* H100 SXM / PCIe: NVIDIA H100 datasheet: SXM 67 fp32, 494.7 tf32, 989.4 bf16/fp16 (1,979 is with
  sparsity), 1,978.9 fp8, 3.35 TB/s; PCIe 51 fp32, 378 tf32, 756 bf16/fp16, 1,513 fp8, 2.0 TB/s.
* H200: NVIDIA H200 datasheet (SXM): H100 SXM compute, 141 GB at 4.8 TB/s.
* B200: NVIDIA DGX/HGX B200 datasheet, per GPU: 80 fp32, 1,100 tf32, 2,250 bf16/fp16, 4,500 fp8
  (dense = half the sparse figures), 180 GB at 8 TB/s.
* L4: NVIDIA L4 datasheet: 30.3 fp32, 60 tf32, 121 bf16/fp16, 242.5 fp8, 24 GB at 300 GB/s.
* L40S: NVIDIA L40S datasheet: 91.6 fp32, 183 tf32, 362 bf16/fp16, 733 fp8, 48 GB at 864 GB/s.
* RTX 3090: NVIDIA Ampere GA102 whitepaper: 35.6 fp32, 35.6 tf32, 71 bf16/fp16 (fp32
  accumulate), 24 GB at 936 GB/s.
* RTX 4090: NVIDIA Ada Lovelace whitepaper: 82.6 fp32, 82.6 tf32, 165.2 bf16/fp16 (fp32
  accumulate), 330.3 fp8, 24 GB at 1,008 GB/s.
* MI300X: AMD Instinct MI300X datasheet: 163.4 fp32, 653.7 tf32, 1,307.4 bf16/fp16, 2,614.9 fp8,
  192 GB at 5.3 TB/s.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from .errors import UserError

GB = 10**9
GiB = 2**30
TERA = 10**12


@dataclass(frozen=True)
class GPU:
    name: str
    memory: int  # bytes, the datasheet's figure
    bandwidth: float  # bytes/s
    peak: dict[str, float | None]  # dtype -> dense FLOP/s
    aliases: tuple[str, ...] = ()
    arch: tuple[int, int] | None = None  # CUDA compute capability (None: not an NVIDIA GPU)
    total_memory: int | None = None  # bytes the driver gives CUDA (torch's total_memory), where measured

    @property
    def capacity(self) -> int:
        """Bytes a process can use on the GPU: the measured ``total_memory``, else the datasheet's figure."""
        return self.total_memory or self.memory

    def peak_flops(self, dtype: str) -> float | None:
        return self.peak.get(_DTYPE_KEYS.get(dtype, dtype))


_DTYPE_KEYS = {"float32": "fp32", "float": "fp32", "tf32": "tf32", "bfloat16": "bf16", "float16": "fp16",
               "half": "fp16", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}


def _gpu(name, memory_gb, bw_gbs, fp32, tf32, bf16, fp16, fp8, aliases=(), arch=None, total_memory=None):
    t = lambda x: None if x is None else x * TERA  # noqa: E731
    return GPU(name, int(memory_gb * GB), bw_gbs * GB,
               {"fp32": t(fp32), "tf32": t(tf32), "bf16": t(bf16), "fp16": t(fp16), "fp8": t(fp8)}, aliases,
               arch, total_memory)


MiB = 2**20

# Compute capabilities: NVIDIA CUDA GPUs list (developer.nvidia.com/cuda-gpus).  total_memory: what
# torch.cuda.get_device_properties(0).total_memory reads; H100 80GB HBM3: 81,079 MiB (79.18 GiB) on the
# reference machine of tests/data/cuda_reference (nvidia-smi: 81,559 MiB, 85,520,809,984 bytes).
GPUS: tuple[GPU, ...] = (
    _gpu("V100", 32, 900, 15.7, None, None, 125, None, ("v100-sxm2", "tesla v100", "v100-32gb"), (7, 0)),
    _gpu("A100-40GB", 40, 1555, 19.5, 156, 312, 312, None, ("a100", "a100-sxm4-40gb", "a100 40gb"), (8, 0)),
    _gpu("A100-80GB", 80, 2039, 19.5, 156, 312, 312, None, ("a100-sxm4-80gb", "a100 80gb", "a100-80g"), (8, 0)),
    _gpu("H100-SXM", 80, 3350, 67, 494.7, 989.4, 989.4, 1978.9, ("h100", "h100 80gb hbm3", "h100-sxm5"), (9, 0),
         81079 * MiB),
    _gpu("H100-PCIe", 80, 2000, 51, 378, 756, 756, 1513, ("h100 pcie", "h100-pcie-80gb"), (9, 0)),
    _gpu("H200", 141, 4800, 67, 494.7, 989.4, 989.4, 1978.9, ("h200-sxm", "h200 141gb"), (9, 0)),
    _gpu("B200", 180, 8000, 80, 1100, 2250, 2250, 4500, ("b200-sxm", "nvidia b200"), (10, 0)),
    _gpu("L4", 24, 300, 30.3, 60, 121, 121, 242.5, ("nvidia l4",), (8, 9)),
    _gpu("L40S", 48, 864, 91.6, 183, 362, 362, 733, ("nvidia l40s",), (8, 9)),
    _gpu("RTX3090", 24, 936, 35.6, 35.6, 71, 71, None, ("rtx 3090", "geforce rtx 3090", "3090"), (8, 6)),
    _gpu("RTX4090", 24, 1008, 82.6, 82.6, 165.2, 165.2, 330.3, ("rtx 4090", "geforce rtx 4090", "4090"), (8, 9)),
    _gpu("MI300X", 192, 5300, 163.4, 653.7, 1307.4, 1307.4, 2614.9, ("amd instinct mi300x", "mi300")),
)


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


_INDEX = {_norm(a): g for g in GPUS for a in (g.name, *g.aliases)}


def lookup(name: str) -> GPU:
    """The GPU called ``name`` (case-insensitive, aliases accepted); a UserError lists close names."""
    gpu = _INDEX.get(_norm(name))
    if gpu is not None:
        return gpu
    close = difflib.get_close_matches(_norm(name), list(_INDEX), n=3, cutoff=0.5)
    names = sorted({_INDEX[c].name for c in close}) or [g.name for g in GPUS]
    raise UserError(f"unknown GPU {name!r}; did you mean {', '.join(names)}? (estimator hardware lists all)")


def match_device_name(device_name: str) -> GPU | None:
    """Match ``torch.cuda.get_device_name()`` (e.g. 'NVIDIA H100 80GB HBM3') to the table, or None."""
    n = _norm(device_name)
    if n in _INDEX:
        return _INDEX[n]
    if "h100" in n:
        return _INDEX[_norm("H100-PCIe")] if "pcie" in n else _INDEX[_norm("H100-SXM")]
    if "a100" in n:
        return _INDEX[_norm("A100-80GB")] if "80" in n else _INDEX[_norm("A100-40GB")]
    for g in sorted(GPUS, key=lambda g: -len(g.name)):
        if _norm(g.name) in n:
            return g
    return None


def table_rows() -> list[list[str]]:
    fmt = lambda v: "-" if v is None else f"{v / TERA:g}"  # noqa: E731
    return [[g.name, f"{g.memory / GB:g} GB", f"{g.bandwidth / GB:g} GB/s",
             *(fmt(g.peak[k]) for k in ("fp32", "tf32", "bf16", "fp16", "fp8")), ", ".join(g.aliases)]
            for g in GPUS]


TABLE_HEADERS = ["GPU", "Memory", "Bandwidth", "fp32", "tf32", "bf16", "fp16", "fp8", "Aliases"]


# -- streaming multiprocessors: what CUDA kernels size their launches from ------------------------------
#
# ``cudaDeviceProp.multiProcessorCount`` and ``maxThreadsPerMultiProcessor``: kernels that pick their
# grid from the device (ATen's ``Reduce.cuh: setReduceConfig`` sizes its cross-block buffer from them).
# SM counts from the vendors' datasheets / architecture whitepapers (H100 SXM5 132, H100 PCIe 114,
# H200 132, A100 108, V100 SXM2 80, B200 148, L4 58, L40S 142, RTX 3090 82, RTX 4090 128); threads per
# SM from the CUDA C Programming Guide's compute-capability table (2,048 on 7.0/8.0/9.0/10.0, 1,536 on
# 8.6/8.9).  The reference H100 (tests/data/cuda_reference) reports 132 and 2,048.


@dataclass(frozen=True)
class Multiprocessors:
    count: int  # multiProcessorCount
    max_threads: int  # maxThreadsPerMultiProcessor


MULTIPROCESSORS: dict[str, Multiprocessors] = {
    "V100": Multiprocessors(80, 2048),
    "A100-40GB": Multiprocessors(108, 2048),
    "A100-80GB": Multiprocessors(108, 2048),
    "H100-SXM": Multiprocessors(132, 2048),
    "H100-PCIe": Multiprocessors(114, 2048),
    "H200": Multiprocessors(132, 2048),
    "B200": Multiprocessors(148, 2048),
    "L4": Multiprocessors(58, 1536),
    "L40S": Multiprocessors(142, 1536),
    "RTX3090": Multiprocessors(82, 1536),
    "RTX4090": Multiprocessors(128, 1536),
}


def multiprocessors(name: str) -> Multiprocessors:
    """The SM count and threads per SM of the GPU called ``name`` (an H100 SXM's for one not listed)."""
    try:
        gpu = lookup(name).name
    except UserError:
        gpu = name
    return MULTIPROCESSORS.get(gpu, MULTIPROCESSORS["H100-SXM"])


# -- interconnects ------------------------------------------------------------------------------
#
# Links between GPUs (inside a node, across nodes) and between a GPU and its host, as used by the
# capacity planner's communication times.  Bandwidths are per GPU and per direction, the rates of
# the datasheets (NCCL's achieved bus bandwidth is lower; see estimator.plan.schedule).


@dataclass(frozen=True)
class Link:
    name: str
    bandwidth: float  # bytes/s per GPU, one direction
    source: str


LINKS: dict[str, Link] = {link.name: link for link in (
    Link("nvlink2", 150e9, "V100 SXM2: 6 NVLink2 links, 300 GB/s both directions (NVIDIA V100 datasheet)"),
    Link("nvlink3", 300e9, "A100 SXM: 12 NVLink3 links, 600 GB/s both directions (NVIDIA A100 datasheet)"),
    Link("nvlink4", 450e9, "H100/H200 SXM: 18 NVLink4 links, 900 GB/s both directions (NVIDIA H100 datasheet)"),
    Link("nvlink5", 900e9, "B200: NVLink5, 1.8 TB/s both directions (NVIDIA DGX B200 datasheet)"),
    Link("xgmi", 448e9, "MI300X: 7 Infinity Fabric links x 64 GB/s per direction (AMD MI300X datasheet)"),
    Link("pcie3", 16e9, "PCIe 3.0 x16: ~16 GB/s per direction"),
    Link("pcie4", 32e9, "PCIe 4.0 x16: ~32 GB/s per direction"),
    Link("pcie5", 64e9, "PCIe 5.0 x16: ~64 GB/s per direction"),
    Link("ib-edr", 12.5e9, "InfiniBand EDR, 100 Gb/s per GPU (DGX-1/DGX-2 V100)"),
    Link("ib-hdr", 25e9, "InfiniBand HDR, 200 Gb/s per GPU (DGX A100: 8 x ConnectX-6 HDR)"),
    Link("ib-ndr", 50e9, "InfiniBand NDR, 400 Gb/s per GPU (DGX H100/B200: 8 x ConnectX-7)"),
    Link("ib-xdr", 100e9, "InfiniBand XDR, 800 Gb/s per GPU"),
    Link("eth-100g", 12.5e9, "100 Gb/s Ethernet per GPU"),
)}

# GPU -> (link between the GPUs of a node, host link used by offloading, link between nodes): the
# reference systems' (DGX-1 V100, DGX A100, DGX H100/H200, DGX B200; PCIe cards in PCIe servers
# with 100 Gb/s Ethernet; MI300X platforms with 400 Gb/s NICs).
GPU_LINKS: dict[str, tuple[str, str, str]] = {
    "V100": ("nvlink2", "pcie3", "ib-edr"), "A100-40GB": ("nvlink3", "pcie4", "ib-hdr"),
    "A100-80GB": ("nvlink3", "pcie4", "ib-hdr"), "H100-SXM": ("nvlink4", "pcie5", "ib-ndr"),
    "H100-PCIe": ("pcie5", "pcie5", "ib-ndr"), "H200": ("nvlink4", "pcie5", "ib-ndr"),
    "B200": ("nvlink5", "pcie5", "ib-ndr"), "L4": ("pcie4", "pcie4", "eth-100g"),
    "L40S": ("pcie4", "pcie4", "eth-100g"), "RTX3090": ("pcie4", "pcie4", "eth-100g"),
    "RTX4090": ("pcie4", "pcie4", "eth-100g"), "MI300X": ("xgmi", "pcie5", "ib-ndr"),
}
DEFAULT_LINKS = ("pcie4", "pcie4", "ib-ndr")  # a GPU not in GPU_LINKS


def link(name: str) -> Link:
    """The link called ``name`` (case-insensitive); a UserError lists the known ones."""
    found = LINKS.get(name.strip().lower())
    if found is None:
        raise UserError(f"unknown interconnect {name!r}; choose one of {', '.join(LINKS)}")
    return found


def gpu_links(gpu: GPU) -> tuple[Link, Link, Link]:
    """(intra-node, host, inter-node) links of ``gpu``'s reference system."""
    intra, host, inter = GPU_LINKS.get(gpu.name, DEFAULT_LINKS)
    return LINKS[intra], LINKS[host], LINKS[inter]

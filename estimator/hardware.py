"""Accelerators: memory, bandwidth, dense peak FLOP/s per dtype, and the structure the time model reads.

All FLOP/s are *dense* (no 2:4 structured sparsity: half the "with sparsity" figures) peaks from the
vendors' datasheets; ``fp32`` is the non-tensor-core peak (AMD: the packed / matrix fp32 rate that
rocBLAS reaches, see below).  ``None`` means the chip has no such mode.  Per entry, the datasheet
(figures in TFLOP/s and GB/s):

* V100 SXM2 (32 GB, 16 GB): NVIDIA Tesla V100 datasheet: 15.7 fp32, 125 fp16 tensor, 900 GB/s, 300 W;
  PCIe (32 GB, 16 GB): 14 fp32, 112 fp16, 250 W.  80 SMs (Volta whitepaper), boost 1,530 / 1,380 MHz,
  6 MB L2.
* T4: NVIDIA T4 datasheet: 8.1 fp32, 65 fp16 tensor, 16 GB GDDR6 at 320 GB/s, 70 W; 40 SMs, 1,590 MHz,
  4 MB L2 (Turing whitepaper).  No bf16 or tf32.
* P100 PCIe 16 GB: NVIDIA Tesla P100 datasheet: 9.3 fp32, 18.7 fp16 (no tensor cores), 732 GB/s, 250 W;
  56 SMs, 1,329 MHz, 4 MB L2.  P4: NVIDIA Tesla P4 datasheet: 5.5 fp32, 8 GB GDDR5 at 192 GB/s, 75 W;
  20 SMs, 1,114 MHz, 2 MB L2 (no fast fp16).
* A100: NVIDIA A100 datasheet: 19.5 fp32, 156 tf32, 312 bf16/fp16 (the CS336 lecture's 19.5 / 312);
  SXM 40 GB at 1,555 GB/s and 80 GB at 2,039 GB/s, 400 W; PCIe 40 GB at 1,555 GB/s, 250 W and 80 GB at
  1,935 GB/s, 300 W.  108 SMs, 1,410 MHz, 40 MB L2 (A100 whitepaper).
* A10G: no NVIDIA datasheet (AWS's variant of the A10): peaks are the A10 datasheet's (31.2 fp32,
  62.5 tf32, 125 bf16/fp16; 24 GB GDDR6 at 600 GB/s); 80 SMs and 6 MB L2 as torch reports them
  (``multi_processor_count=80, L2_cache_size=6MB``), 1,710 MHz and 300 W as nvidia-smi reports them
  (max clocks, power limit).  The peaks are the A10's (72 SMs): an A10G may differ.
* H100 SXM / PCIe: NVIDIA H100 datasheet: SXM 67 fp32, 494.7 tf32, 989.4 bf16/fp16 (1,979 is with
  sparsity), 1,978.9 fp8, 3.35 TB/s, 700 W; PCIe 51 fp32, 378 tf32, 756 bf16/fp16, 1,513 fp8, 2.0 TB/s,
  350 W.  SXM5 132 SMs at 1,980 MHz, PCIe 114 SMs at 1,755 MHz, 50 MB L2 (H100 whitepaper).
* H100 NVL: NVIDIA H100 NVL product brief, per GPU: 60 fp32, 417.5 tf32, 835.5 bf16/fp16, 1,670.5 fp8
  (half the sparse figures), 94 GB at 3.9 TB/s, 400 W; 132 SMs at 1,785 MHz.
* H800 (SXM): the H100 SXM's compute and memory (NVIDIA's export variant; its NVLink runs at 400 GB/s).
* H20: NVIDIA H20 specification as published by resellers (no public NVIDIA datasheet): 44 fp32, 74 tf32,
  148 bf16/fp16, 296 fp8, 96 GB HBM3 at 4.0 TB/s, 400 W, 60 MB L2; 78 SMs as torch reports them
  (``multi_processor_count=78``).  The fp32 figure is not consistent with 78 SMs at an H100's clock
  (39.5 TFLOP/s): treat it as uncertain.
* H200: NVIDIA H200 datasheet (SXM): the H100 SXM's compute, 141 GB at 4.8 TB/s, 700 W; torch reports
  132 SMs and a 60 MB L2.
* GH200: NVIDIA GH200 Grace Hopper datasheet, its H100: 67 fp32, 494.7 tf32, 989.4 bf16/fp16, 1,978.9
  fp8, 96 GB HBM3 at 4 TB/s; 132 SMs; the superchip's power is configurable 450-1,000 W (CPU, GPU and
  memory together: 1,000 W is listed).
* B200: NVIDIA DGX/HGX B200 datasheet, per GPU: 80 fp32, 1,100 tf32, 2,250 bf16/fp16, 4,500 fp8
  (dense = half the sparse figures), 180 GB at 8 TB/s, 1,000 W; torch reports 148 SMs and 126 MB L2.
* L4: NVIDIA L4 datasheet: 30.3 fp32, 60 tf32, 121 bf16/fp16, 242.5 fp8, 24 GB at 300 GB/s, 72 W;
  58 SMs at 2,040 MHz, 48 MB L2 (Ada whitepaper).
* L40: NVIDIA L40 datasheet: 90.5 fp32, 90.5 tf32, 181 bf16/fp16, 362 fp8, 48 GB at 864 GB/s, 300 W;
  L40S: NVIDIA L40S datasheet: 91.6 fp32, 183 tf32, 362 bf16/fp16, 733 fp8, 48 GB at 864 GB/s, 350 W.
  Both 142 SMs (L40 2,490 MHz, L40S 2,520 MHz), 96 MB L2.
* RTX A6000: NVIDIA RTX A6000 datasheet: 38.7 fp32, 77.4 tf32, 154.8 bf16/fp16 (half the 309.7
  sparse), 48 GB at 768 GB/s, 300 W; 84 SMs at 1,800 MHz, 6 MB L2.
* RTX 3090: NVIDIA Ampere GA102 whitepaper: 35.6 fp32, 35.6 tf32, 71 bf16/fp16 (fp32 accumulate), 24 GB
  at 936 GB/s, 350 W; 82 SMs at 1,695 MHz, 6 MB L2.
* RTX 4090: NVIDIA Ada Lovelace whitepaper: 82.6 fp32, 82.6 tf32, 165.2 bf16/fp16 (fp32 accumulate),
  330.3 fp8, 24 GB at 1,008 GB/s, 450 W; 128 SMs at 2,520 MHz, 72 MB L2.
* MI300X: AMD Instinct MI300X datasheet: 163.4 fp32, 653.7 tf32, 1,307.4 bf16/fp16, 2,614.9 fp8, 192 GB
  at 5.3 TB/s, 750 W; 304 CUs at 2,100 MHz.
* MI250X: AMD Instinct MI250X datasheet, **per GCD** (torch sees each of its two dies as one device,
  ``total_memory=65520MB, multi_processor_count=110``): 47.85 fp32 (packed / matrix; 23.95 vector),
  191.5 bf16/fp16, 64 GB at 1.64 TB/s, 280 W (half the 560 W module), 110 CUs at 1,700 MHz, 8 MB L2.

Compute capabilities: NVIDIA's CUDA GPUs list (developer.nvidia.com/cuda-gpus).

**What torch reports** (``total_memory``, :attr:`GPU.capacity`): the bytes of
``torch.cuda.get_device_properties(0).total_memory`` (CUDA's ``totalGlobalMem``, what deviceQuery prints
as "Total amount of global memory"), less than the datasheet's figure: the driver keeps some, ECC takes
1/16 of GDDR memory where it is on by default (T4, L4, L40S, A10G).  Each entry says where its figure
comes from (``total_memory_source``): a deviceQuery or torch printout of that card (the figure moves by
up to ~0.3 % between driver versions), or, where no printout was found, an assumption stated there.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass

from .errors import UserError
from .gpu_file import LINK_ROLES

GB = 10**9
GiB = 2**30
MiB = 2**20
TERA = 10**12

PEAK_KEYS = ("fp32", "tf32", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class GPU:
    """One accelerator: what the memory and time models read.

    ``memory`` is the datasheet's figure and ``total_memory`` what torch reports (:attr:`capacity` is
    the one to compare a step with); ``sms``, ``clock_mhz`` (boost), ``tdp_w`` and ``l2_mb`` are the
    structure the time model carries to GPUs it has no measurements of (``estimator.timing``).
    """

    name: str
    memory: int  # bytes, the datasheet's figure
    bandwidth: float  # bytes/s
    peak: dict[str, float | None]  # dtype -> dense FLOP/s
    aliases: tuple[str, ...] = ()
    arch: tuple[int, int] | None = None  # CUDA compute capability (None: not an NVIDIA GPU)
    total_memory: int | None = None  # bytes torch reports (total_memory)
    sms: int | None = None  # multiprocessors (AMD: compute units)
    clock_mhz: float | None = None  # boost clock
    tdp_w: float | None = None  # board power limit
    l2_mb: float | None = None
    max_threads_per_sm: int | None = None
    process_nm: float | None = None  # the chip's process node (see PROCESS_NM)
    total_memory_source: str = ""
    source: str = "estimator/hardware.py"  # where the entry comes from (a user's file: its path)
    links: tuple[str, str, str] | None = None  # (intra-node, host, inter-node) link names; None: GPU_LINKS's

    @property
    def capacity(self) -> int:
        """Bytes a process can use on the GPU: the reported ``total_memory``, else the datasheet's figure."""
        return self.total_memory or self.memory

    def peak_flops(self, dtype: str) -> float | None:
        return self.peak.get(_DTYPE_KEYS.get(dtype, dtype))

    def matmul_peak(self, dtype: str) -> float:
        """The FLOP/s a matmul in ``dtype`` is timed against: its datasheet peak, or for a mode the GPU lacks the
        next it has (tf32 -> fp32; bf16 -> fp16 -> fp32; fp16 -> bf16 -> fp32; fp8 -> bf16 -> fp16 -> fp32): the
        time model's peaks and the MFU's denominator."""
        key = _DTYPE_KEYS.get(dtype, dtype)
        chain = _PEAK_FALLBACK.get(key, (key, "fp32"))
        return next((self.peak[k] for k in chain if self.peak.get(k)), 0.0)

    def lacks(self, dtype: str) -> str | None:
        """A note when the GPU has no tensor-core mode for the 16-bit or 8-bit ``dtype`` a step computes in
        (bf16 on a V100 or a T4, fp8 on an A100), None when it has one or the dtype needs none."""
        key = _DTYPE_KEYS.get(dtype, dtype)
        if key not in ("bf16", "fp16", "fp8") or self.peak.get(key):
            return None
        rate = next(k for k in _PEAK_FALLBACK[key] if self.peak.get(k) or k == "fp32")
        return (f"{self.name} has no {key} tensor cores (none on its datasheet): the step's {key} matmuls are "
                f"timed at its {rate} rate, which a real run's emulated {key} need not reach"
                + ("; fp16-mixed runs on its fp16 tensor cores" if key == "bf16" and self.peak.get("fp16") else ""))

    def to_json(self) -> dict:
        """The fields of ``estimator hardware --format json`` (and of a ``--gpu file.json``)."""
        tf = lambda v: None if v is None else round(v / TERA, 4)  # noqa: E731
        return {"name": self.name, "memory_gb": round(self.memory / GB, 3), "total_memory_bytes": self.capacity,
                "bandwidth_gbs": round(self.bandwidth / GB, 3),
                "peak_tflops": {k: tf(self.peak.get(k)) for k in PEAK_KEYS},
                "arch": None if self.arch is None else f"{self.arch[0]}.{self.arch[1]}", "sms": self.sms,
                "clock_mhz": self.clock_mhz, "tdp_w": self.tdp_w, "l2_mb": self.l2_mb, "process_nm": self.process_nm,
                "aliases": list(self.aliases),
                "links": dict(zip(LINK_ROLES, (lk.name for lk in gpu_links(self)))),
                "total_memory_source": self.total_memory_source or "not measured: the datasheet's figure"}


_PEAK_FALLBACK = {"tf32": ("tf32", "fp32"), "bf16": ("bf16", "fp16", "fp32"), "fp16": ("fp16", "bf16", "fp32"),
                  "fp8": ("fp8", "bf16", "fp16", "fp32")}
_DTYPE_KEYS = {"float32": "fp32", "float": "fp32", "tf32": "tf32", "bfloat16": "bf16", "float16": "fp16",
               "half": "fp16", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}

# The H100 of tests/data/cuda_reference reports 81,079 MiB of its 80 GB (nvidia-smi: 81,559 MiB): for a
# card without a printout of its own, ``total_memory`` is its datasheet figure times this ratio.
H100_MEASURED_MIB = 81079
H100_RATIO = H100_MEASURED_MIB * MiB / (80 * GB)


# Process node by architecture (NVIDIA's architecture whitepapers): Pascal 16 nm, Volta and Turing 12 nm,
# GA100 7 nm, GA102 8 nm, Ada and Hopper TSMC 4N and Blackwell 4NP (5 nm-class processes: 5).  AMD: MI250X
# 6 nm, MI300X 5 nm (its compute dies).  The time model scales energy per FLOP with it (estimator.timing.structure).
PROCESS_NM = {(6, 0): 16, (6, 1): 16, (7, 0): 12, (7, 5): 12, (8, 0): 7, (8, 6): 8, (8, 7): 8, (8, 9): 5, (9, 0): 5,
              (10, 0): 5, (12, 0): 5}


def _threads(arch):
    # CUDA C Programming Guide, compute-capability table: max resident threads per SM
    if arch is None:
        return None
    return {(7, 5): 1024, (8, 6): 1536, (8, 9): 1536}.get(tuple(arch), 2048)


def _gpu(name, memory_gb, bw_gbs, peaks, arch, sms, clock, tdp, l2, total, aliases=(), node=None):
    """One table entry: ``peaks`` (fp32, tf32, bf16, fp16, fp8) in TFLOP/s; ``total`` is (MiB torch
    reports, where that figure comes from), or (None, why) to take the datasheet x H100_RATIO."""
    t = lambda x: None if x is None else x * TERA  # noqa: E731
    mib, why = total
    memory = int(memory_gb * GB)
    total_memory = int(mib * MiB) if mib else int(memory * H100_RATIO)
    if not mib:
        why = f"not measured: {memory_gb:g} GB x {H100_RATIO:.4f} (the H100's measured ratio; {why})"
    return GPU(name, memory, bw_gbs * GB, dict(zip(PEAK_KEYS, map(t, peaks))), aliases, arch, total_memory, sms,
               clock, tdp, l2, _threads(arch), node or PROCESS_NM.get(arch), why)


_DQ = "deviceQuery printout"
_TORCH = "torch printout (get_device_properties)"

GPUS: tuple[GPU, ...] = (
    _gpu("V100", 32, 900, (15.7, None, None, 125, None), (7, 0), 80, 1530, 300, 6,
         (32510, f"{_DQ}, Tesla V100-SXM2-32GB, driver 11.2/11.4 (32,494-32,511 on 10.0-12.9)"),
         ("v100-sxm2", "tesla v100", "v100-32gb", "v100-sxm2-32gb", "tesla v100-sxm2-32gb")),
    _gpu("V100-16GB", 16, 900, (15.7, None, None, 125, None), (7, 0), 80, 1530, 300, 6,
         (16160, f"{_DQ}, Tesla V100-SXM2-16GB, CUDA 9.0 (16,128-16,160 on 9.0-12.4)"),
         ("v100-sxm2-16gb", "tesla v100-sxm2-16gb")),
    _gpu("V100-PCIe", 32, 900, (14, None, None, 112, None), (7, 0), 80, 1380, 250, 6,
         (32510, f"{_DQ}, Tesla V100-PCIE-32GB, driver 10.2 (32,480 on 10.1)"),
         ("v100-pcie-32gb", "tesla v100-pcie-32gb", "v100 pcie")),
    _gpu("V100-PCIe-16GB", 16, 900, (14, None, None, 112, None), (7, 0), 80, 1380, 250, 6,
         (16160, "assumed equal to the V100-SXM2-16GB's printout (the same 16 GB HBM2); not measured"),
         ("tesla v100-pcie-16gb",)),
    _gpu("T4", 16, 320, (8.1, None, None, 65, None), (7, 5), 40, 1590, 70, 4,
         (15109, f"{_DQ}, Tesla T4, ECC on (14,918-15,110 across drivers)"), ("tesla t4", "nvidia t4")),
    _gpu("P100-PCIe", 16, 732, (9.3, None, None, 18.7, None), (6, 0), 56, 1329, 250, 4,
         (16281, f"{_DQ}, Tesla P100-PCIE-16GB, driver 11.2/11.4"), ("p100", "tesla p100-pcie-16gb")),
    _gpu("P4", 8, 192, (5.5, None, None, None, None), (6, 1), 20, 1114, 75, 2,
         (7612, f"{_DQ}, Tesla P4, driver 10.2"), ("tesla p4",)),
    _gpu("A100-40GB", 40, 1555, (19.5, 156, 312, 312, None), (8, 0), 108, 1410, 400, 40,
         (40339, "assumed equal to the A100-PCIE-40GB's printout (the same 40 GB HBM2); not measured"),
         ("a100", "a100-sxm4-40gb", "a100 40gb", "nvidia a100-sxm4-40gb")),
    _gpu("A100-80GB", 80, 2039, (19.5, 156, 312, 312, None), (8, 0), 108, 1410, 400, 40,
         (81051, f"{_DQ}, NVIDIA A100-SXM4-80GB, driver 12.2 (81,158 on 12.5)"),
         ("a100-sxm4-80gb", "a100 80gb", "a100-80g", "nvidia a100-sxm4-80gb")),
    _gpu("A100-40GB-PCIe", 40, 1555, (19.5, 156, 312, 312, None), (8, 0), 108, 1410, 250, 40,
         (40339, f"{_DQ}, NVIDIA A100-PCIE-40GB, driver 12.2 (40,338-40,441 on 12.0-13.0)"),
         ("a100-pcie-40gb", "nvidia a100-pcie-40gb", "a100 pcie 40gb")),
    _gpu("A100-80GB-PCIe", 80, 1935, (19.5, 156, 312, 312, None), (8, 0), 108, 1410, 300, 40,
         (81051, "assumed equal to the A100-SXM4-80GB's printout (the same 80 GB HBM2e); not measured"),
         ("a100 80gb pcie", "nvidia a100 80gb pcie", "a100-pcie-80gb")),
    _gpu("A10G", 24, 600, (31.2, 62.5, 125, 125, None), (8, 6), 80, 1710, 300, 6,
         (22587, f"{_TORCH}, NVIDIA A10G, ECC on"), ("nvidia a10g", "a10g")),
    _gpu("H100-SXM", 80, 3350, (67, 494.7, 989.4, 989.4, 1978.9), (9, 0), 132, 1980, 700, 50,
         (H100_MEASURED_MIB, "measured on the reference machine of tests/data/cuda_reference (nvidia-smi: "
                             "81,559 MiB)"), ("h100", "h100 80gb hbm3", "h100-sxm5", "nvidia h100 80gb hbm3")),
    _gpu("H100-PCIe", 80, 2000, (51, 378, 756, 756, 1513), (9, 0), 114, 1755, 350, 50,
         (81008, f"{_TORCH}, NVIDIA H100 PCIe"), ("h100 pcie", "h100-pcie-80gb", "nvidia h100 pcie")),
    _gpu("H100-NVL", 94, 3900, (60, 417.5, 835.5, 835.5, 1670.5), (9, 0), 132, 1785, 400, 50,
         (None, "no printout found"), ("h100 nvl", "nvidia h100 nvl")),
    _gpu("H800", 80, 3350, (67, 494.7, 989.4, 989.4, 1978.9), (9, 0), 132, 1980, 700, 50,
         (None, "the H100 SXM's memory"), ("h800-sxm", "nvidia h800")),
    _gpu("H20", 96, 4000, (44, 74, 148, 148, 296), (9, 0), 78, 1980, 400, 60,
         (97285, f"{_TORCH}, NVIDIA H20"), ("nvidia h20",)),
    _gpu("H200", 141, 4800, (67, 494.7, 989.4, 989.4, 1978.9), (9, 0), 132, 1980, 700, 60,
         (150_109_880_320 / MiB, f"{_TORCH} of this project's H200 (tests/data/h200, driver 580.159.04)"),
         ("h200-sxm", "h200 141gb", "nvidia h200")),
    _gpu("GH200", 96, 4000, (67, 494.7, 989.4, 989.4, 1978.9), (9, 0), 132, 1980, 1000, 60,
         (97280, f"{_DQ}, NVIDIA GH200 480GB (96 GB HBM3), driver 12.2"), ("gh200 480gb", "nvidia gh200 480gb")),
    _gpu("B200", 180, 8000, (80, 1100, 2250, 2250, 4500), (10, 0), 148, None, 1000, 126,
         (182642, f"{_TORCH}, NVIDIA B200 (182,631 on another machine)"), ("b200-sxm", "nvidia b200")),
    _gpu("L4", 24, 300, (30.3, 60, 121, 121, 242.5), (8, 9), 58, 2040, 72, 48,
         (22518, f"{_DQ}, NVIDIA L4, driver 12.0, ECC on"), ("nvidia l4",)),
    _gpu("L40", 48, 864, (90.5, 90.5, 181, 181, 362), (8, 9), 142, 2490, 300, 96,
         (45373, "assumed equal to the L40S's printout (the same 48 GB GDDR6, ECC on); not measured"),
         ("nvidia l40",)),
    _gpu("L40S", 48, 864, (91.6, 183, 362, 362, 733), (8, 9), 142, 2520, 350, 96,
         (45373, f"{_DQ}, NVIDIA L40S, driver 12.4, ECC on"), ("nvidia l40s",)),
    _gpu("RTX-A6000", 48, 768, (38.7, 77.4, 154.8, 154.8, None), (8, 6), 84, 1800, 300, 6,
         (48790, f"{_DQ}, NVIDIA RTX A6000, driver 12.7"), ("rtx a6000", "a6000", "nvidia rtx a6000")),
    _gpu("RTX3090", 24, 936, (35.6, 35.6, 71, 71, None), (8, 6), 82, 1695, 350, 6,
         (24268, f"{_DQ}, GeForce RTX 3090, driver 11.8 (24,238 on 12.1)"),
         ("rtx 3090", "geforce rtx 3090", "3090", "nvidia geforce rtx 3090")),
    _gpu("RTX4090", 24, 1008, (82.6, 82.6, 165.2, 165.2, 330.3), (8, 9), 128, 2520, 450, 72,
         (24564, f"{_DQ}, GeForce RTX 4090, driver 12.1 (less where a display uses the card)"),
         ("rtx 4090", "geforce rtx 4090", "4090", "nvidia geforce rtx 4090")),
    _gpu("MI250X", 64, 1638, (47.85, None, 191.5, 191.5, None), None, 110, 1700, 280, 8,
         (65520, f"{_TORCH}, AMD Instinct MI250X (one GCD)"), ("amd instinct mi250x", "mi250x/mi250", "mi250"), 6),
    _gpu("MI300X", 192, 5300, (163.4, 653.7, 1307.4, 1307.4, 2614.9), None, 304, 2100, 750, None,
         (196592, f"{_TORCH}, AMD Instinct MI300X"), ("amd instinct mi300x", "mi300"), 5),
)


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


_INDEX = {_norm(a): g for g in GPUS for a in (g.name, *g.aliases)}


_FILES: dict[tuple, GPU] = {}  # (path, mtime, size) -> the GPU it describes


def _from_file(name: str) -> GPU:
    """The GPU of the JSON file ``name``, read once while the file is unchanged (a plan asks for its card at every
    reduction kernel it sizes: 2,772 reads and parses in a 405B pipeline plan, 2 s)."""
    from .gpu_file import read_gpu_file

    try:
        st = os.stat(name)
        key = (os.path.abspath(name), st.st_mtime_ns, st.st_size)
    except OSError:  # missing or unreadable: read_gpu_file says so in one line
        key = None
    gpu = _FILES.get(key) if key is not None else None
    if gpu is None:
        data = read_gpu_file(name)
        known = _INDEX.get(_norm(str(data["name"])))
        # a card of the table written back unchanged (``estimator hardware --format json``): the table's entry, with
        # its measurements (a copy built from the fields alone would be extrapolated)
        gpu = known if known is not None and known.to_json() == {**known.to_json(), **data} else \
            gpu_from_json(data, source=name)
        if key is not None:
            _FILES[key] = gpu
    return gpu


def lookup(name: str) -> GPU:
    """The GPU called ``name`` (case-insensitive, aliases accepted), or described by the JSON file
    ``name`` (``*.json``: the fields of ``estimator hardware --format json``, see :func:`gpu_from_json`);
    a UserError lists close names."""
    if not isinstance(name, str):
        raise UserError(f"gpu must be a GPU name (e.g. 'H100'), a path to a GPU .json file or a GPU, not "
                        f"{type(name).__name__} {name!r}")
    if name.strip().lower().endswith(".json"):
        return _from_file(name)
    gpu = _INDEX.get(_norm(name))
    if gpu is not None:
        return gpu
    close = difflib.get_close_matches(_norm(name), list(_INDEX), n=3, cutoff=0.5)
    names = sorted({_INDEX[c].name for c in close}) or [g.name for g in GPUS]
    raise UserError(f"unknown GPU {name!r}; did you mean {', '.join(names)}? (estimator hardware lists all; "
                    f"--gpu FILE.json describes another card)")


def gpu_from_json(d: dict, source: str = "") -> GPU:
    """A :class:`GPU` from the (validated) fields of ``estimator hardware --format json``."""
    t = lambda x: None if x is None else float(x) * TERA  # noqa: E731
    arch = d.get("arch")
    arch = tuple(int(x) for x in (arch if isinstance(arch, list) else str(arch).split("."))) if arch else None
    memory = int(float(d["memory_gb"]) * GB)
    total = d.get("total_memory_bytes")
    why = f"{source}: total_memory_bytes" if total else \
        f"{source}: not given, {float(d['memory_gb']):g} GB x {H100_RATIO:.4f} (the H100's measured ratio)"
    return GPU(str(d["name"]), memory, float(d["bandwidth_gbs"]) * GB,
               {k: t(d["peak_tflops"].get(k)) for k in PEAK_KEYS}, tuple(d.get("aliases") or ()), arch,
               int(total) if total else int(memory * H100_RATIO), d.get("sms"), d.get("clock_mhz"), d.get("tdp_w"),
               d.get("l2_mb"), _threads(arch), d.get("process_nm") or PROCESS_NM.get(arch), why,
               source=source or "a user's file",
               links=_links_of(d.get("links"), source))


def _links_of(links: dict | None, source: str) -> tuple[str, str, str] | None:
    """A GPU file's ``links`` as (intra-node, host, inter-node) names, a missing one the default's."""
    if not links:
        return None
    for role, name in links.items():
        if name not in LINKS:
            raise UserError(f"--gpu {source}: links.{role} must be one of {', '.join(LINKS)}, not {name!r}")
    return tuple(links.get(role, default) for role, default in zip(LINK_ROLES, DEFAULT_LINKS))


def match_device_name(device_name: str) -> GPU | None:
    """Match ``torch.cuda.get_device_name()`` (e.g. 'NVIDIA H100 80GB HBM3') to the table, or None."""
    n = _norm(device_name)
    if n in _INDEX:
        return _INDEX[n]
    if "h100" in n:
        return _INDEX[_norm("H100-PCIe")] if "pcie" in n else _INDEX[_norm("H100-SXM")]
    if "a100" in n:
        size = "80GB" if "80" in n else "40GB"
        return _INDEX[_norm(f"A100-{size}-PCIe" if "pcie" in n else f"A100-{size}")]
    for g in sorted(GPUS, key=lambda g: -len(g.name)):
        if _norm(g.name) in n:
            return g
    return None


def table_rows() -> list[list[str]]:
    fmt = lambda v: "-" if v is None else f"{v / TERA:g}"  # noqa: E731
    return [[g.name, f"{g.memory / GB:g} GB", f"{g.capacity / GiB:.2f} GiB", f"{g.bandwidth / GB:g} GB/s",
             *(fmt(g.peak[k]) for k in PEAK_KEYS), "-" if g.sms is None else str(g.sms),
             "-" if g.tdp_w is None else f"{g.tdp_w:g} W", ", ".join(g.aliases)]
            for g in GPUS]


TABLE_HEADERS = ["GPU", "Memory", "torch sees", "Bandwidth", "fp32", "tf32", "bf16", "fp16", "fp8", "SMs", "Power",
                 "Aliases"]


# -- streaming multiprocessors: what CUDA kernels size their launches from ------------------------------
#
# ``cudaDeviceProp.multiProcessorCount`` and ``maxThreadsPerMultiProcessor``: kernels that pick their
# grid from the device (ATen's ``Reduce.cuh: setReduceConfig`` sizes its cross-block buffer from them).
# SM counts are the table's (``GPU.sms``); threads per SM from the CUDA C Programming Guide's
# compute-capability table (2,048 on 6.x/7.0/8.0/9.0/10.0, 1,024 on 7.5, 1,536 on 8.6/8.9).  The
# reference H100 (tests/data/cuda_reference) reports 132 and 2,048.


@dataclass(frozen=True)
class Multiprocessors:
    count: int  # multiProcessorCount
    max_threads: int  # maxThreadsPerMultiProcessor


MULTIPROCESSORS: dict[str, Multiprocessors] = {
    g.name: Multiprocessors(g.sms, g.max_threads_per_sm) for g in GPUS if g.sms and g.max_threads_per_sm}


def multiprocessors(name: str) -> Multiprocessors:
    """The SM count and threads per SM of the GPU called ``name`` (an H100 SXM's for one not listed)."""
    try:  # not lookup's UserError for an unknown name: its close-name suggestions cost 0.7 ms a call
        gpu = _from_file(name) if name.strip().lower().endswith(".json") else _INDEX.get(_norm(name))
    except UserError:
        gpu = None
    if gpu is None:
        return MULTIPROCESSORS["H100-SXM"]
    if gpu.sms and gpu.max_threads_per_sm:
        return Multiprocessors(gpu.sms, gpu.max_threads_per_sm)
    return MULTIPROCESSORS.get(gpu.name, MULTIPROCESSORS["H100-SXM"])


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
    Link("nvlink4-h800", 200e9, "H800 SXM: NVLink at 400 GB/s both directions (NVIDIA's export variant)"),
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
    "V100": ("nvlink2", "pcie3", "ib-edr"), "V100-16GB": ("nvlink2", "pcie3", "ib-edr"),
    "V100-PCIe": ("pcie3", "pcie3", "eth-100g"), "V100-PCIe-16GB": ("pcie3", "pcie3", "eth-100g"),
    "T4": ("pcie3", "pcie3", "eth-100g"), "P100-PCIe": ("pcie3", "pcie3", "eth-100g"),
    "P4": ("pcie3", "pcie3", "eth-100g"), "A100-40GB": ("nvlink3", "pcie4", "ib-hdr"),
    "A100-80GB": ("nvlink3", "pcie4", "ib-hdr"), "A100-40GB-PCIe": ("pcie4", "pcie4", "ib-hdr"),
    "A100-80GB-PCIe": ("pcie4", "pcie4", "ib-hdr"), "A10G": ("pcie4", "pcie4", "eth-100g"),
    "H100-SXM": ("nvlink4", "pcie5", "ib-ndr"), "H100-PCIe": ("pcie5", "pcie5", "ib-ndr"),
    "H100-NVL": ("pcie5", "pcie5", "ib-ndr"), "H800": ("nvlink4-h800", "pcie5", "ib-ndr"),
    "H20": ("nvlink4", "pcie5", "ib-ndr"), "H200": ("nvlink4", "pcie5", "ib-ndr"),
    "GH200": ("nvlink4", "pcie5", "ib-ndr"), "B200": ("nvlink5", "pcie5", "ib-ndr"),
    "L4": ("pcie4", "pcie4", "eth-100g"), "L40": ("pcie4", "pcie4", "eth-100g"),
    "L40S": ("pcie4", "pcie4", "eth-100g"), "RTX-A6000": ("pcie4", "pcie4", "eth-100g"),
    "RTX3090": ("pcie4", "pcie4", "eth-100g"), "RTX4090": ("pcie4", "pcie4", "eth-100g"),
    "MI250X": ("xgmi", "pcie4", "ib-hdr"), "MI300X": ("xgmi", "pcie5", "ib-ndr"),
}
DEFAULT_LINKS = ("pcie4", "pcie4", "ib-ndr")  # a GPU not in GPU_LINKS


def link(name: str) -> Link:
    """The link called ``name`` (case-insensitive); a UserError lists the known ones."""
    found = LINKS.get(name.strip().lower())
    if found is None:
        raise UserError(f"unknown interconnect {name!r}; choose one of {', '.join(LINKS)}")
    return found


def gpu_links(gpu: GPU) -> tuple[Link, Link, Link]:
    """(intra-node, host, inter-node) links of ``gpu``: its own (a GPU file's ``links``), else its reference
    system's."""
    intra, host, inter = gpu.links or GPU_LINKS.get(gpu.name, DEFAULT_LINKS)
    return LINKS[intra], LINKS[host], LINKS[inter]

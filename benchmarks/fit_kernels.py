"""Per-GPU kernel constants of the step-time model from public single-kernel measurements, and the
structural model that carries them to GPUs without measurements.

    python benchmarks/fit_kernels.py                  # fit, write estimator/data/timing_<gpu>.json + timing_structure.json
    python benchmarks/fit_kernels.py --logo           # leave-one-GPU-out table (markdown), no write
    python benchmarks/fit_kernels.py --sample         # the same on tests/data/public_kernels (what the tests run)

Every run also prints the GPUs this project measured itself that no fit has seen (``--unseen``, default the
H200's kernels of ``tests/data/h200``): the structure's prediction and the shipped model against them.

Data: ``benchmarks/public_kernels.py`` (NeuSight's dataset: fp32 single ops, TF32 off, torch 2.1, on
H100 SXM, A100 80GB / 40GB PCIe, L4, T4, V100 PCIe, P100 PCIe, P4).  Kernels only: no whole-model step
enters any fit (those are how the model is judged).

**Stage 1, per GPU** (:func:`fit_gpu`): the time model's kernel constants of that GPU, by robust least
squares (soft-L1 on the log ratio, scale 0.1) of the measured latency against

    measured = soft_max(floor, offset + kernel, 6)

``floor`` and ``offset`` describe the measurement, not the GPU: the harness times one op at a time
with the GPU idle in between, so a short op reads the host's dispatch time (a floor of 24-73 us on
these machines) and every op carries the idle GPU's launch latency (``offset``; one for
memory-bound kernels, one for cuBLAS / cuDNN).  They are fitted per GPU and dropped: the launch
floors of a busy GPU (``launch_s``, ``library_s``) cannot be told apart from them and stay the H100's.
``kernel`` is :func:`estimator.timing.gpu_seconds` without its launch floors:

* memory-bound ops: ``bytes / (bandwidth * memory_eff[class])`` (elementwise, softmax = reduction,
  layer norm = norm);
* GEMMs and convolutions: ``soft_max(FLOPs / (fp32 peak * eff * size), bytes / bandwidth, p)`` with
  the size factor of ``estimator.timing.size_factor`` (``fill_rows``, ``n0``, ``k0``) and
  ``eff = eff_sustained * throttle``: a power-limited GPU runs an isolated kernel at its boost
  clock at first and slows as it draws its power limit, ``throttle = 1 + (1/c - 1) * tau / (tau +
  t)`` (t: the kernel's time at the sustained rate; c: the sustained share of the boost rate;
  ``tau``: how long the boost lasts).  A training step keeps the GPU busy, so the time model uses
  ``eff_sustained`` (the T4 reaches 0.85 of its fp32 peak on 1 ms GEMMs and 0.37 on 30 ms ones;
  the P4 0.9 and 0.18).

**Stage 2, across GPUs** (:func:`fit_structure`): the per-GPU constants as functions of each GPU's
structure (estimator/hardware.py), fitted on the GPUs given; the formulas are
``estimator.timing.structure``'s.  **Leave one GPU out** (:func:`logo`): stage 2 without a GPU,
then that GPU's kernels predicted from its structure alone (its own stage-1 constants unused; its
measurement floor is its own latency floor, a property of the harness; the offsets are the other
GPUs' median).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import public_kernels as PK  # noqa: E402

from estimator import timing as T  # noqa: E402
from estimator.hardware import lookup as lookup_gpu  # noqa: E402
from estimator.timing import structure as S  # noqa: E402

DATA = os.path.join(ROOT, "estimator", "data")
FAMILIES = ("gemm", "conv", "elementwise", "reduction", "norm")
CLASS_INDEX = {"elementwise": 0, "reduction": 1, "norm": 2}
PER_FAMILY = 2500  # kernels per GPU and family in a fit (a deterministic subsample of the full data)
HARNESS_P = 6.0  # soft-max exponent between the harness floor and the op's time
SCALE = 0.1  # soft-L1 scale of the log ratio
PRIOR = 1e-3  # pull of each unconstrained parameter to the middle of its range
# A kernel's weight in the fit: (latency / median latency) ** WEIGHT_POWER.  0: every kernel alike.  0.5 (the
# long kernels count more, as in a step) was tried: the long kernels of the P100 and the P4 scatter by 3x
# (0.28-0.94 of the fp32 peak over 100 ms), their throttle terms went astray and the held-out GEMM errors
# doubled (root mean square of the median log error 0.20 -> 0.39).
WEIGHT_POWER = 0.0

# name: (low, high, log scale)
BOUNDS = {
    "floor": (5e-6, 200e-6, True), "offset_memory": (0.5e-6, 60e-6, True), "offset_library": (0.5e-6, 100e-6, True),
    "bandwidth_frac": (0.3, 1.0, False), "reduction": (0.05, 1.0, False), "norm": (0.05, 1.0, False),
    "gemm": (0.02, 1.0, False), "sustained": (0.05, 1.0, False), "tau": (1e-4, 1.0, True),
    "fill_rows": (1e2, 1e8, True), "n0": (0.1, 1024.0, True), "k0": (1.0, 1024.0, True),
    "overlap_p": (1.0, 16.0, True), "conv": (0.02, 3.0, True),
}
PARAMS = tuple(BOUNDS)


def subsample(kernels: list[PK.Kernel], per_family: int = PER_FAMILY) -> list[PK.Kernel]:
    """Up to ``per_family`` kernels per GPU and family, evenly spread over the latency-sorted list."""
    return PK.sample(kernels, per_family)


class Features:
    """One GPU's kernels as tensors (one row per kernel)."""

    def __init__(self, kernels: list[PK.Kernel], gpu_name: str):
        gpu = lookup_gpu(gpu_name)
        works = [k.work for k in kernels]
        f = lambda xs: torch.tensor(xs, dtype=torch.float64)  # noqa: E731
        self.kernels = kernels
        self.families = [k.family for k in kernels]
        self.measured = f([k.latency_s for k in kernels])
        self.compute = torch.tensor([k.family in ("gemm", "conv") for k in kernels])
        self.conv = torch.tensor([k.family == "conv" for k in kernels])
        self.cls = torch.tensor([CLASS_INDEX.get(k.family, 0) for k in kernels])
        self.bytes = f([w.bytes for w in works])
        self.flops = f([max(w.flops, 1) for w in works])
        self.batch = f([w.batch for w in works])
        self.m, self.n, self.k = (f([max(getattr(w, d), 1) for w in works]) for d in "mnk")
        self.peak = gpu.peak["fp32"]
        self.datasheet_bw = gpu.bandwidth

    def mask(self, family: str) -> torch.Tensor:
        return torch.tensor([fam == family for fam in self.families])

    def kernel(self, p: dict) -> torch.Tensor:
        """The time model's kernel time (no launch floor) with the sustained efficiencies."""
        return self._kernel(p, throttle=False)

    def _kernel(self, p: dict, throttle: bool) -> torch.Tensor:
        bandwidth = self.datasheet_bw * p["bandwidth_frac"]
        class_eff = torch.stack([torch.ones_like(p["norm"]), p["reduction"], p["norm"]])
        t_memory = self.bytes / (bandwidth * class_eff[self.cls])
        size = T.size_factor(self.batch * self.m * self.n, self.m, self.n, self.k, p["fill_rows"], p["n0"], p["k0"])
        eff = p["gemm"] * p["sustained"] * torch.where(self.conv, p["conv"], 1.0)
        t_compute = T.compute_seconds(self.flops, self.peak, eff, size, 1.0)
        if throttle:  # an isolated kernel starts at the boost clock (see the module docstring)
            t_compute = t_compute / (1.0 + (1.0 / p["sustained"] - 1.0) * p["tau"] / (p["tau"] + t_compute))
        t_gemm = T.soft_max_p(t_compute, self.bytes / bandwidth, p["overlap_p"])
        return torch.where(self.compute, t_gemm, t_memory)

    def measured_model(self, p: dict) -> torch.Tensor:
        """What the harness reads: the floor, the idle launch latency and the (isolated) kernel."""
        offset = torch.where(self.compute, p["offset_library"], p["offset_memory"])
        return T.soft_max_p(p["floor"], offset + self._kernel(p, throttle=True), HARNESS_P)


def _bounded(theta, name):
    lo, hi, log = BOUNDS[name]
    if log:
        return torch.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * torch.sigmoid(theta))
    return lo + (hi - lo) * torch.sigmoid(theta)


def _unpack(theta) -> dict:
    return {name: _bounded(theta[i], name) for i, name in enumerate(PARAMS)}


def soft_l1(r):
    return torch.sqrt(1 + (r / SCALE) ** 2) - 1


def fit_gpu(feats: Features) -> dict[str, float]:
    """Stage 1: one GPU's constants (see the module docstring)."""
    theta = torch.zeros(len(PARAMS), dtype=torch.float64, requires_grad=True)
    weight = (feats.measured / feats.measured.median()) ** WEIGHT_POWER
    weight = weight / weight.mean()
    opt = torch.optim.LBFGS([theta], lr=1.0, max_iter=400, tolerance_grad=1e-10, tolerance_change=1e-13,
                            history_size=30, line_search_fn="strong_wolfe")

    def loss_fn():
        opt.zero_grad()
        r = torch.log(feats.measured_model(_unpack(theta)) / feats.measured)
        loss = (weight * soft_l1(r)).mean() + PRIOR * (theta ** 2).sum()
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(loss_fn)
    with torch.no_grad():
        return {k: float(v) for k, v in _unpack(theta).items()}


def as_tensors(p: dict[str, float]) -> dict[str, torch.Tensor]:
    return {k: torch.tensor(v, dtype=torch.float64) for k, v in p.items()}


# -- errors -----------------------------------------------------------------------------------------


def family_errors(feats: Features, p: dict[str, float], above_floor: float = 3.0) -> dict[str, dict]:
    """Per family, over the kernels measured at least ``above_floor`` x the harness floor (the others
    read the host): count, median ratio predicted / measured (``bias``), the summed predicted over the
    summed measured time (``time_ratio``: what a step of these kernels would be off by), median |log
    ratio| (as a relative error), and the share within 20 %."""
    with torch.no_grad():
        predicted = feats.measured_model(as_tensors(p))
        r = torch.log(predicted / feats.measured)
    out = {}
    keep = feats.measured >= above_floor * p["floor"]
    for fam in FAMILIES:
        mask = feats.mask(fam) & keep
        sel = r[mask].tolist()
        if not sel:
            continue
        out[fam] = {"n": len(sel), "bias": math.exp(statistics.median(sel)),
                    "time_ratio": float(predicted[mask].sum() / feats.measured[mask].sum()),
                    "error": math.exp(statistics.median(abs(x) for x in sel)) - 1,
                    "within_20": sum(abs(x) <= math.log(1.2) for x in sel) / len(sel)}
    return out


# -- stage 2: across GPUs ----------------------------------------------------------------------------


def sustained_eff(p: dict[str, float]) -> float:
    """A GPU's sustained fp32 GEMM efficiency (what a busy GPU runs at: no boost transient)."""
    return p["gemm"] * p["sustained"]


def _geomean(xs):
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def fit_structure(per_gpu: dict[str, dict], measured: dict[str, set[str]]) -> S.Structure:
    """Stage 2 on the GPUs of ``per_gpu`` (their stage-1 constants; ``measured``: the families each
    GPU has data of): geometric means across GPUs for the shared fractions and shape constants, and
    ``(gemm_eff, headroom0, alpha)`` by least squares of the log sustained GEMM efficiency against
    ``log(gemm_eff * min(1, H / H0) ** alpha)`` (a grid over H0 and alpha, gemm_eff in closed form)."""
    def having(fam):
        return [g for g in per_gpu if fam in measured[g]]

    memory = having("elementwise")
    gemms = having("gemm")
    points = [(S.power_headroom(lookup_gpu(g)), math.log(sustained_eff(per_gpu[g]))) for g in gemms]
    best = None
    for h0 in [5 * 1.05 ** i for i in range(60)]:  # 5 .. ~90 W per TFLOP/s
        for alpha in [0.25 + 0.05 * i for i in range(36)]:  # 0.25 .. 2.0
            xs = [alpha * math.log(min(1.0, h / h0)) for h, _ in points]
            log_e0 = sum(y - x for (_, y), x in zip(points, xs)) / len(points)
            sse = sum((y - x - log_e0) ** 2 for (_, y), x in zip(points, xs))
            if best is None or sse < best[0] - 1e-12:
                best = (sse, math.exp(log_e0), h0, alpha)
    _, e0, h0, alpha = best
    convs = having("conv")
    prov = {"gpus": sorted(per_gpu), "memory_from": memory, "gemm_from": gemms, "conv_from": convs,
            "rms_log_error_of_gemm_eff": math.sqrt(best[0] / len(points))}
    return S.Structure(
        gemm_eff=e0, headroom0=h0, alpha=alpha,
        bandwidth_frac=_geomean(per_gpu[g]["bandwidth_frac"] for g in memory),
        reduction=_geomean(per_gpu[g]["reduction"] for g in having("reduction")),
        norm=_geomean(per_gpu[g]["norm"] for g in having("norm")),
        fill_per_sm=_geomean(per_gpu[g]["fill_rows"] / lookup_gpu(g).sms for g in gemms),
        n0=_geomean(per_gpu[g]["n0"] for g in gemms), k0=_geomean(per_gpu[g]["k0"] for g in gemms),
        overlap_p=_geomean(per_gpu[g]["overlap_p"] for g in gemms),
        conv_ratio=_geomean(per_gpu[g]["conv"] for g in convs) if convs else 1.0, provenance=prov)


def predicted_params(gpu: str, own: dict[str, float], others: dict[str, dict], s: S.Structure) -> dict[str, float]:
    """The held-out GPU's parameters for predicting its measured kernels: every constant the time
    model uses from the structure (fitted without it); the harness floor and the boost transient
    (``sustained``, ``tau``: how much faster than its sustained rate an isolated short kernel runs)
    its own, the launch offsets the other GPUs' median (see the module docstring)."""
    c = S.kernel_constants(lookup_gpu(gpu), s)
    offsets = {k: statistics.median(p[k] for p in others.values()) for k in ("offset_memory", "offset_library")}
    return {**own, **offsets, "bandwidth_frac": c["bandwidth_frac"], "reduction": c["reduction"], "norm": c["norm"],
            "gemm": c["matmul.fp32"] / own["sustained"], "conv": s.conv_ratio, "fill_rows": c["fill_rows"],
            "n0": c["n0"], "k0": c["k0"], "overlap_p": c["overlap_p"]}


def logo(feats: dict[str, Features], per_gpu: dict[str, dict], measured: dict[str, set[str]]) -> dict[str, dict]:
    """Leave one GPU out: per held-out GPU, its kernels' errors by family (:func:`family_errors`) under
    :func:`predicted_params`, and the structure fitted without it."""
    out = {}
    for gpu in sorted(per_gpu):
        others = {g: p for g, p in per_gpu.items() if g != gpu}
        s = fit_structure(others, measured)
        p = predicted_params(gpu, per_gpu[gpu], others, s)
        out[gpu] = {"errors": family_errors(feats[gpu], p), "structure": s,
                    "sustained_eff": {"own": sustained_eff(per_gpu[gpu]), "predicted": p["gemm"] * p["sustained"]}}
    return out


def band_figures(held_out: dict[str, dict]) -> dict[str, float]:
    """The error band's per-family figures of a GPU without measurements (estimator.timing.band): the
    root mean square over held-out GPUs of each family's median log error."""
    out = {}
    for fam, key in (("gemm", "gemm"), ("conv", "conv"), ("memory", "elementwise"), ("reduction", "reduction"),
                     ("norm", "norm")):
        logs = [math.log(r["errors"][key]["bias"]) for r in held_out.values() if key in r["errors"]]
        if logs:
            out[fam] = math.sqrt(sum(x * x for x in logs) / len(logs))
    # memory-bound steps mix elementwise, reduction and norm kernels: the largest of the three
    out["memory"] = max(out.pop("memory"), out.pop("reduction", 0.0), out.pop("norm", 0.0))
    out["tensor"] = out["gemm"]  # no GPU but the H100 measures tensor-core kernels: the fp32 GEMMs' as a stand-in
    return out


def shipped_errors(kernels: list[PK.Kernel], model: T.TimingModel, harness: dict[str, float],
                   above_floor: float = 3.0) -> dict[str, dict]:
    """The time model as shipped for a GPU against kernels measured on it (:func:`family_errors`' figures):
    each kernel's sustained time (``gpu_seconds`` less the busy GPU's launch floor) read through the
    harness (``harness``: the GPU's stage-1 floor and idle launch offsets, properties of the measurement)."""
    by_family: dict[str, list[tuple[float, float]]] = {}
    for k in kernels:
        w = k.work
        compute = w.kind in T.COMPUTE_KINDS
        floor = w.launches * (model.library_s if compute else model.launch_s)
        kernel = T.gpu_seconds(w, model, conv_tf32=False) - floor
        offset = harness["offset_library" if compute else "offset_memory"]
        read = float(T.soft_max_p(torch.tensor(harness["floor"]), torch.tensor(offset + kernel), HARNESS_P))
        if k.latency_s >= above_floor * harness["floor"]:
            by_family.setdefault(k.family, []).append((read, k.latency_s))
    out = {}
    for fam, pairs in by_family.items():
        logs = [math.log(p / m) for p, m in pairs]
        out[fam] = {"n": len(logs), "bias": math.exp(statistics.median(logs)),
                    "time_ratio": sum(p for p, _ in pairs) / sum(m for _, m in pairs),
                    "error": math.exp(statistics.median(abs(x) for x in logs)) - 1,
                    "within_20": sum(abs(x) <= math.log(1.2) for x in logs) / len(logs)}
    return out


def unseen(fit: dict, kernels: list[PK.Kernel]) -> dict[str, dict]:
    """GPUs this project measured (``benchmarks/record_kernels.py``) that no fit has seen, per GPU: its
    fp32 kernels predicted from the structure fitted on the public GPUs (as :func:`logo`: stage 1 on its own
    kernels only for the harness floor and boost transient), and the model this project ships for it (its
    catalog entry: a sibling's measurements or the structure) on its fp32 kernels and on its bf16 GEMMs."""
    from estimator.timing.catalog import load_model

    out = {}
    for gpu in sorted({k.gpu for k in kernels}):
        fp32 = [k for k in kernels if k.gpu == gpu and k.dtype == "float32"]
        feats = Features(fp32, gpu)
        own = fit_gpu(feats)
        p = predicted_params(gpu, own, fit["per_gpu"], fit["structure"])
        shipped = load_model(gpu)
        out[gpu] = {"held_out": family_errors(feats, p), "own": family_errors(feats, own), "harness": own,
                    "sustained_eff": {"own": sustained_eff(own), "predicted": p["gemm"] * p["sustained"]},
                    "shipped": shipped_errors(fp32, shipped, own), "shipped_source": shipped.source,
                    "shipped_half": shipped_errors([k for k in kernels if k.gpu == gpu and k.dtype != "float32"],
                                                   shipped, own)}
    return out


# -- the whole fit ----------------------------------------------------------------------------------

MIN_FAMILY = 20  # a family counts as measured on a GPU with at least this many kernels above the floor


def fit_all(kernels: list[PK.Kernel], per_family: int = PER_FAMILY) -> dict:
    """Stage 1 on every GPU, leave one GPU out, stage 2 on all GPUs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small tensors: one thread is faster
    try:
        picked = subsample(kernels, per_family)
        feats = {g: Features([k for k in picked if k.gpu == g], g) for g in sorted({k.gpu for k in picked})}
        per_gpu = {g: fit_gpu(f) for g, f in feats.items()}
    finally:
        torch.set_num_threads(threads)
    in_sample = {g: family_errors(feats[g], per_gpu[g]) for g in feats}
    measured = {g: {fam for fam, e in in_sample[g].items() if e["n"] >= MIN_FAMILY} for g in feats}
    held_out = logo(feats, per_gpu, measured)
    return {"features": feats, "per_gpu": per_gpu, "in_sample": in_sample, "measured": measured,
            "logo": held_out, "structure": fit_structure(per_gpu, measured), "band": band_figures(held_out),
            "kernels": {g: {fam: sum(1 for k in picked if k.gpu == g and k.family == fam) for fam in FAMILIES}
                        for g in feats}}


def gpu_model(gpu: str, fit: dict, h100: T.TimingModel, data: str) -> T.TimingModel:
    """The TimingModel of a GPU with kernel measurements (not the H100: its own steps set its model)."""
    p, s, measured = fit["per_gpu"][gpu], fit["structure"], fit["measured"][gpu]
    structural = S.kernel_constants(lookup_gpu(gpu), s)
    own = lambda fam, key: p[key] if fam in measured else structural[key]  # noqa: E731
    gemm = sustained_eff(p)
    constants = {"bandwidth_frac": own("elementwise", "bandwidth_frac"), "reduction": own("reduction", "reduction"),
                 "norm": own("norm", "norm"), "matmul.fp32": gemm,
                 "conv.fp32": gemm * (p["conv"] if "conv" in measured else s.conv_ratio),
                 "fill_rows": p["fill_rows"], "n0": p["n0"], "k0": p["k0"], "overlap_p": p["overlap_p"]}
    band = {"step": h100.band["step"], "gemm": 0.0, "tensor": fit["band"]["tensor"],
            "conv": 0.0 if "conv" in measured else fit["band"]["conv"],
            "memory": 0.0 if {"elementwise", "reduction", "norm"} <= measured else fit["band"]["memory"]}
    today = datetime.date.today().isoformat()
    provenance = {
        "measured": "fp32 kernels", "fitted_on": today, "script": "benchmarks/fit_kernels.py",
        "data": f"{data} (NeuSight's dataset, MIT licence: tests/data/public_kernels/LICENSE; torch 2.1.0, "
                "CUDA 12.1, fp32, TF32 off)",
        "kernels": fit["kernels"][gpu], "families_measured": sorted(measured),
        "stage1": {k: v for k, v in p.items()},
        "errors_in_sample": fit["in_sample"][gpu],
        "from_structure": [k for k, fam in (("bandwidth_frac", "elementwise"), ("reduction", "reduction"),
                                             ("norm", "norm"), ("conv.fp32", "conv")) if fam not in measured],
        "from_h100": "tensor-core (TF32/bf16/fp16) GEMM, convolution and attention efficiencies and depthwise "
                     "convolutions (x min(1, this GPU's sustained fp32 efficiency / the structural one)), launch "
                     "floors, host costs: not in the kernel data",
    }
    source = (f"fitted on {sum(fit['kernels'][gpu].values())} fp32 kernels measured on this GPU (NeuSight's public "
              f"data, {today}); tensor-core and host constants from the H100")
    return S.apply(h100, lookup_gpu("H100-SXM"), lookup_gpu(gpu), constants, s, calibrated=True, source=source,
                   band=band, provenance=provenance)


def sibling_band(rows: dict[str, dict]) -> dict:
    """The band figures of a GPU timed from its sibling's constants (``catalog.SIBLINGS``): per family, the
    largest |median log error| of the shipped model on a measured sibling GPU's kernels (:func:`unseen`: the
    H200, timed from the H100 SXM), as :func:`band_figures` defines them for a held-out GPU."""
    out: dict = {}
    for gpu, r in rows.items():
        e, half = r["shipped"], r["shipped_half"]
        figures = {"gemm": abs(math.log(e["gemm"]["bias"])), "conv": abs(math.log(e["conv"]["bias"])),
                   "memory": max(abs(math.log(e[f]["bias"])) for f in ("elementwise", "reduction", "norm")),
                   "tensor": abs(math.log(half["gemm"]["bias"]))}
        for fam, v in figures.items():
            out[fam] = max(out.get(fam, 0.0), v)
    out["measured_on"] = sorted(rows)
    return out


def write_models(fit: dict, data: str, out_dir: str = DATA) -> list[str]:
    """Write timing_<gpu>.json for every measured GPU but the H100, and timing_structure.json."""
    from estimator.timing.catalog import DATA_FILES, STRUCTURE_FILE, measured

    h100 = measured("H100-SXM")
    written = []
    for gpu in fit["per_gpu"]:
        if gpu == "H100-SXM":
            continue
        path = os.path.join(out_dir, DATA_FILES[gpu])
        _dump(gpu_model(gpu, fit, h100, data).to_json(), path)
        written.append(path)
    s = fit["structure"]
    doc = {**s.to_json(), "band": {"step": h100.band["step"], **fit["band"]},
           "sibling_band": sibling_band(unseen(fit, [k for path in UNSEEN for k in PK.load_sample(path)])),
           "logo": logo_rows(fit), "h100_check": h100_check(fit, h100)}
    doc["provenance"] = {**doc["provenance"], "fitted_on": datetime.date.today().isoformat(),
                         "script": "benchmarks/fit_kernels.py", "data": data}
    path = os.path.join(out_dir, STRUCTURE_FILE)
    _dump(doc, path)
    return written + [path]


def _dump(obj, path, sort_keys: bool = False):
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=1, sort_keys=sort_keys)
        fh.write("\n")


def logo_rows(fit: dict) -> dict[str, dict]:
    """Per held-out GPU: its sustained fp32 GEMM efficiency (own fit / predicted) and its errors by family."""
    return {g: {"sustained_eff": r["sustained_eff"], "errors": r["errors"]} for g, r in fit["logo"].items()}


def h100_check(fit: dict, h100: T.TimingModel) -> dict[str, float] | None:
    """The H100's sustained fp32 GEMM efficiency from the public kernels against the one fitted on this
    project's H100 training steps (two independent measurements of one constant)."""
    p = fit["per_gpu"].get("H100-SXM")
    if p is None:
        return None
    return {"public_kernels": sustained_eff(p), "training_steps": h100.eff["matmul.fp32"]}


# -- the tables -------------------------------------------------------------------------------------


def print_tables(fit: dict) -> None:
    """benchmarks/README.md's tables: per GPU, the errors in sample (its own fit) and held out."""
    print("| GPU | kernels | sustained fp32 GEMM eff (own / held out) | family | own fit: median error, within 20 %, "
          "time ratio | held out: median ratio, median error, within 20 %, time ratio |")
    print("|---|---:|---|---|---|---|")
    for gpu, r in fit["logo"].items():
        own = fit["in_sample"][gpu]
        first = True
        for fam in FAMILIES:
            if fam not in r["errors"]:
                continue
            e, o = r["errors"][fam], own[fam]
            head = (f"| {gpu} | {sum(fit['kernels'][gpu].values())} | {r['sustained_eff']['own']:.2f} / "
                    f"{r['sustained_eff']['predicted']:.2f} " if first else "| | | ")
            print(f"{head}| {fam} ({e['n']}) | {o['error']:.1%}, {o['within_20']:.0%}, {o['time_ratio']:.2f} | "
                  f"{e['bias']:.2f}, {e['error']:.1%}, {e['within_20']:.0%}, {e['time_ratio']:.2f} |")
            first = False
    s = fit["structure"]
    print(f"\nstructure (all GPUs): gemm_eff {s.gemm_eff:.3f}, H0 {s.headroom0:.1f} W per TFLOP/s at 12 nm, alpha "
          f"{s.alpha:.2f}, bandwidth {s.bandwidth_frac:.3f} of the datasheet, reduction {s.reduction:.3f}, norm "
          f"{s.norm:.3f}, fill {s.fill_per_sm:.0f} per SM, n0 {s.n0:.1f}, k0 {s.k0:.1f}, overlap p {s.overlap_p:.2f}, "
          f"conv / GEMM {s.conv_ratio:.2f}")
    print("band figures (log half-widths): " + ", ".join(f"{k} {v:.3f}" for k, v in fit["band"].items()))


def print_unseen(rows: dict[str, dict]) -> None:
    """benchmarks/README.md's table of the GPUs this project measured and no fit has seen."""
    print("\n| GPU | family | structure fitted on the public GPUs: median ratio, median error, within 20 %, time "
          "ratio | the shipped model: the same |")
    print("|---|---|---|---|")
    for gpu, r in rows.items():
        cells = [(f"{fam} ({e['n']})", r["held_out"].get(fam), e) for fam, e in r["shipped"].items()]
        cells += [(f"bf16 {fam} ({e['n']})", None, e) for fam, e in r["shipped_half"].items()]
        for i, (name, held, shipped) in enumerate(sorted(cells, key=lambda c: c[0])):
            fmt = lambda e: f"{e['bias']:.2f}, {e['error']:.1%}, {e['within_20']:.0%}, {e['time_ratio']:.2f}"  # noqa
            print(f"| {gpu if i == 0 else ''} | {name} | {fmt(held) if held else 'n/a'} | {fmt(shipped)} |")
        print(f"\n{gpu}: shipped model: {r['shipped_source']}; sustained fp32 GEMM efficiency own "
              f"{r['sustained_eff']['own']:.2f}, predicted by the structure {r['sustained_eff']['predicted']:.2f}")


UNSEEN = [os.path.join(ROOT, "tests", "data", "h200", f) for f in ("kernels.csv.gz", "kernels_bf16.csv.gz")]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--logo", action="store_true", help="print the leave-one-GPU-out table only")
    ap.add_argument("--unseen", nargs="*", default=UNSEEN,
                    help="kernel files of GPUs no fit has seen (record_kernels.py)")
    ap.add_argument("--sample", action="store_true", help="the project's sample instead of the shared folder")
    ap.add_argument("--per-family", type=int, default=PER_FAMILY)
    a = ap.parse_args(argv)
    kernels = PK.load_sample() if a.sample else PK.load()
    data = "tests/data/public_kernels (sample)" if a.sample else "../shared/public-kernels/neusight"
    fit = fit_all(kernels, a.per_family)
    print_tables(fit)
    if a.unseen:
        print_unseen(unseen(fit, [k for path in a.unseen for k in PK.load_sample(path)]))
    if not (a.logo or a.sample):
        for path in write_models(fit, data):
            print("wrote", os.path.relpath(path, ROOT))


if __name__ == "__main__":
    main()

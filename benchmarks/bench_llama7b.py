"""Benchmark: estimator vs. PyTorch's FlopCounterMode on a Llama-7B-shaped model (no weights).

Two measurements, each in a fresh subprocess, alternated and repeated:

* ``peer``: ``torch.utils.flop_counter.FlopCounterMode(display=False)`` under
  ``FakeTensorMode(allow_non_fake_inputs=True)``, running forward + loss + backward of the
  model through ``torch.func.functional_call`` on fake copies of its parameters and buffers.
  It gives FLOPs only.
* ``estimate``: ``estimate(model, inputs, optimizer="adamw")`` followed by ``str(report)``
  and ``report.to_dict()``: FLOPs, memory (with the optimizer step) and the report.

The model is ``AutoModelForCausalLM.from_config`` of a Llama config with the 7B shape
(hidden 4096, MLP 11008, 32 layers, 32 heads, vocabulary 32000), built on the ``meta``
device, attention ``sdpa``; the batch is 1 x 2048 token ids, used as labels too.

Each child sets ``torch.set_num_threads(2)``, imports everything and builds the meta model
*before* the clock starts; the timed section is only the measurement itself.  The child
reports wall time and CPU time of that section and its peak RSS
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``, the whole process: Python, torch,
transformers, the model's module objects and the measurement), plus its peak RSS just before
the timed section, so the growth caused by the measurement can be read off.

Usage::

    .venv/bin/python benchmarks/bench_llama7b.py                 # 3 repetitions, 32 layers
    .venv/bin/python benchmarks/bench_llama7b.py --reps 5 --json results.json
    .venv/bin/python benchmarks/bench_llama7b.py --layers 2      # quick smoke run
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

GOAL_RATIO = 1.0  # estimate time / peer time
GOAL_RSS_MIB = 512.0  # 0.5 GiB peak RSS of the estimate's process
SEQ = 2048
KINDS = ("peer", "estimate")


# -- child ----------------------------------------------------------------------------------


def _torchvision_beside_cpu_torch() -> None:
    """transformers imports torchvision where it is installed; PyPI's wheel beside the CPU torch needs the two
    schemas its C++ library would define (tests/torchvision_env.py, which imports nothing from estimator, so
    that the peer's process holds no more than the peer)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    import torchvision_env

    torchvision_env.load()


def _maxrss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _build(layers: int, seq: int):
    import torch

    _torchvision_beside_cpu_torch()
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(
        "llama",
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
    )
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    ids = torch.zeros(1, seq, dtype=torch.int64, device="meta")
    return model, {"input_ids": ids, "labels": ids}


def _cpu_attention_formulas() -> dict:
    """torch's own SDPA FLOP formulas, mapped onto the CPU flash-attention kernels.

    ``F.scaled_dot_product_attention`` on CPU tensors (fake ones included) dispatches to
    ``aten._scaled_dot_product_flash_attention_for_cpu`` and its ``_backward``, which
    ``FlopCounterMode``'s registry has no entry for (torch 2.13), so the plain peer counts no
    attention FLOPs at all.  This mapping applies the formulas torch registers for the CUDA
    flash/efficient/cuDNN kernels (forward 2 matmuls, backward 5 with the recompute) to them.
    """
    import torch
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    aten = torch.ops.aten

    def fwd(query, key, value, *args, out_shape=None, **kwargs):
        return sdpa_flop_count(query, key, value)

    def bwd(grad_out, query, key, value, *args, out_shape=None, **kwargs):
        return sdpa_backward_flop_count(grad_out, query, key, value)

    return {aten._scaled_dot_product_flash_attention_for_cpu: fwd,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: bwd}


def _peer(model, inputs, custom_mapping=None) -> dict:
    import torch
    import torch.utils._pytree as pytree
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)

    def fake_like(t, requires_grad):
        with fake_mode:
            out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
        return out.requires_grad_(requires_grad)

    params = {n: fake_like(p, p.requires_grad) for n, p in model.named_parameters()}
    buffers = {n: fake_like(b, False) for n, b in model.named_buffers()}
    kwargs = pytree.tree_map_only(torch.Tensor, lambda t: fake_like(t, False), inputs)
    if custom_mapping is None:
        counter = FlopCounterMode(display=False)  # the peer exactly as PyTorch ships it
    else:
        counter = FlopCounterMode(display=False, custom_mapping=custom_mapping)
    with fake_mode, counter:
        out = torch.func.functional_call(model, {**params, **buffers}, (), kwargs)
        out.loss.backward()
    by_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    return {"flops_total": int(counter.get_total_flops()), "flops_by_op": by_op}


def _estimate(model, inputs) -> dict:
    from estimator import estimate

    r = estimate(model, inputs, optimizer="adamw")
    text = str(r)
    d = r.to_dict()
    f = d["flops"]
    return {
        "params_counted": int(d["params"]["total"]),
        "flops_forward": int(f["forward"]),
        "flops_backward": int(f["backward"]),
        "flops_total": int(f["total"]),
        "flops_matmul_fwd_bwd": int(f["matmul_forward"] + f["matmul_backward"]),
        "flops_optimizer": int(f["optimizer"]),
        "memory_peak_bytes": d["memory"].get("peak"),
        "graph_nodes": len(r.capture.nodes),
        "unsupported_ops": d["unsupported_ops"],
        "report_chars": len(text),
        "capture": d["capture"],
    }


def child(kind: str, layers: int, seq: int) -> None:
    import logging
    import warnings

    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("estimator").setLevel(logging.ERROR)  # suppress the estimator's warnings
    warnings.filterwarnings("ignore")

    import torch

    torch.set_num_threads(2)
    _torchvision_beside_cpu_torch()
    import transformers

    transformers.logging.set_verbosity_error()
    if kind == "estimate":
        import estimator  # noqa: F401  (imported before the clock, like transformers)

    t_start = time.perf_counter()
    model, inputs = _build(layers, seq)
    setup_s = time.perf_counter() - t_start
    params = sum(p.numel() for p in model.parameters())
    rss_before = _maxrss_mib()

    w0, c0 = time.perf_counter(), time.process_time()
    result = _peer(model, inputs) if kind == "peer" else _estimate(model, inputs)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0

    result.update(
        kind=kind,
        seconds=wall,
        cpu_seconds=cpu,
        maxrss_mib=_maxrss_mib(),
        maxrss_before_mib=rss_before,
        model_build_seconds=setup_s,
        params_meta=int(params),
        threads=torch.get_num_threads(),
    )
    if kind == "peer":
        # Untimed, after the time and RSS readings: the same peer with torch's SDPA formulas
        # applied to the CPU attention kernels it has no entry for.
        fixed = _peer(model, inputs, _cpu_attention_formulas())
        result.update(flops_total_with_cpu_attention=fixed["flops_total"],
                      flops_by_op_with_cpu_attention=fixed["flops_by_op"])
    print("RESULT " + json.dumps(result), flush=True)


# -- parent ---------------------------------------------------------------------------------


def source_digest() -> str:
    """sha256 (12 hex digits) of the estimator package's .py files (rules/ included): the code timed."""
    import hashlib

    project = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for root in (os.path.join(project, "estimator"), os.path.join(project, "rules")):
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    h.update(os.path.relpath(path, project).encode() + b"\0")
                    with open(path, "rb") as fh:
                        h.update(fh.read())
    return h.hexdigest()[:12]


def run_child(kind: str, layers: int, seq: int, script: str = __file__) -> dict:
    """Run ``script --_child KIND`` in a fresh process and return the RESULT line it prints."""
    cmd = [sys.executable, os.path.abspath(script), "--_child", kind, "--layers", str(layers), "--seq", str(seq)]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"{kind} child failed (exit {proc.returncode})")
    return json.loads(lines[-1][len("RESULT "):])


def _compile_bytecode() -> None:
    """Write the project's bytecode (``__pycache__``) before any child runs, as ``pip install`` does for the
    peer's torch: an estimate imports some of its modules when first called, and under
    ``PYTHONDONTWRITEBYTECODE`` (or with stale caches) each child would compile them from source inside its
    timed section (about 50 ms of a 0.55 s estimate), which no installed copy does."""
    import compileall

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for package in ("estimator", "rules"):
        compileall.compile_dir(os.path.join(root, package), quiet=1)


def _fmt_int(n) -> str:
    return f"{n:,}" if isinstance(n, int) else str(n)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each measurement (default 3)")
    ap.add_argument("--layers", type=int, default=32, help="decoder layers (default 32: Llama-7B)")
    ap.add_argument("--seq", type=int, default=SEQ, help=argparse.SUPPRESS)
    ap.add_argument("--json", metavar="FILE", help="write all results to FILE as JSON")
    ap.add_argument("--_child", choices=KINDS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args._child:
        child(args._child, args.layers, args.seq)
        return 0
    if args.reps < 1:
        ap.error("--reps must be >= 1")

    _compile_bytecode()
    started = datetime.datetime.now().isoformat(timespec="seconds")
    load_before = os.getloadavg()
    print(f"Llama-7B-shaped model, {args.layers} layers, batch 1 x seq {args.seq}, meta weights; "
          f"{args.reps} repetition(s) each, alternating, fresh subprocess per measurement, "
          f"torch threads = 2; {os.cpu_count()} CPUs; load average before: "
          f"{', '.join(f'{x:.2f}' for x in load_before)}")
    runs: dict[str, list[dict]] = {k: [] for k in KINDS}
    for rep in range(args.reps):
        order = KINDS if rep % 2 == 0 else KINDS[::-1]  # ABBA...: neither side always goes first
        for kind in order:
            digest = source_digest()
            r = run_child(kind, args.layers, args.seq)
            r["source_digest"] = digest if digest == source_digest() else digest + "+changed-during-run"
            runs[kind].append(r)
            print(f"  rep {rep + 1} {kind:8s}: {r['seconds']:7.2f} s wall, {r['cpu_seconds']:7.2f} s CPU, "
                  f"peak RSS {r['maxrss_mib']:7.1f} MiB (before timed section {r['maxrss_before_mib']:.1f} MiB), "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)
    load_after = os.getloadavg()
    digests = sorted({r["source_digest"] for r in runs["estimate"]})

    med = {k: {f: statistics.median(r[f] for r in runs[k])
               for f in ("seconds", "cpu_seconds", "maxrss_mib", "maxrss_before_mib")} for k in KINDS}
    peer, est = runs["peer"][-1], runs["estimate"][-1]

    # Parameters: the estimate's count against sum(p.numel()) of the meta model, computed here.
    params_meta = est["params_meta"]
    assert all(r["params_meta"] == params_meta for k in KINDS for r in runs[k])
    assert all(r["params_counted"] == params_meta for r in runs["estimate"]), (
        f"estimate counted {est['params_counted']:,} parameters, the meta model has {params_meta:,}")
    # FLOPs are deterministic: every repetition must give the same numbers.
    assert len({(r["flops_total"], r["flops_total_with_cpu_attention"]) for r in runs["peer"]}) == 1
    assert len({(r["flops_total"], r["flops_matmul_fwd_bwd"]) for r in runs["estimate"]}) == 1
    mm = est["flops_matmul_fwd_bwd"]
    flops_equal = mm == peer["flops_total"]
    flops_equal_fixed = mm == peer["flops_total_with_cpu_attention"]

    def versus(n: int) -> str:
        return "estimate matmul-class: equal" if mm == n else f"estimate matmul-class: DIFFERENT by {mm - n:+,}"

    ratio = med["estimate"]["seconds"] / med["peer"]["seconds"]
    ratio_cpu = med["estimate"]["cpu_seconds"] / med["peer"]["cpu_seconds"]
    rss_est = med["estimate"]["maxrss_mib"]
    time_ok = ratio <= GOAL_RATIO
    rss_ok = rss_est <= GOAL_RSS_MIB

    rows = [
        ("time, wall (median)", f"{med['peer']['seconds']:.2f} s", f"{med['estimate']['seconds']:.2f} s",
         f"{ratio:.2f}x"),
        ("time, CPU (median)", f"{med['peer']['cpu_seconds']:.2f} s", f"{med['estimate']['cpu_seconds']:.2f} s",
         f"{ratio_cpu:.2f}x"),
        ("peak RSS (median)", f"{med['peer']['maxrss_mib']:.1f} MiB", f"{rss_est:.1f} MiB",
         f"{rss_est / med['peer']['maxrss_mib']:.2f}x"),
        ("  of which before timed section", f"{med['peer']['maxrss_before_mib']:.1f} MiB",
         f"{med['estimate']['maxrss_before_mib']:.1f} MiB", ""),
        ("params (meta model: sum numel)", _fmt_int(params_meta), _fmt_int(est["params_counted"]),
         "equal" if est["params_counted"] == params_meta else "DIFFERENT"),
        ("FLOPs, fwd+bwd total", _fmt_int(peer["flops_total"]), _fmt_int(est["flops_total"]),
         versus(peer["flops_total"])),
        ("FLOPs, fwd+bwd matmul-class", "-", _fmt_int(mm), ""),
        ("FLOPs, peer + CPU-attention formulas", _fmt_int(peer["flops_total_with_cpu_attention"]), "",
         versus(peer["flops_total_with_cpu_attention"])),
        ("FLOPs, optimizer step", "-", _fmt_int(est["flops_optimizer"]), ""),
        ("memory peak (estimated, bytes)", "-", _fmt_int(est["memory_peak_bytes"]), ""),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows + [("", "peer (FlopCounterMode)")])
    w2 = max(len(r[2]) for r in rows + [("", "", "estimate")])
    print()
    print(f"{'':{w0}}  {'peer (FlopCounterMode)':>{w1}}  {'estimate':>{w2}}  estimate/peer")
    for name, a, b, c in rows:
        print(f"{name:{w0}}  {a:>{w1}}  {b:>{w2}}  {c}")
    print()
    print(f"load average after: {', '.join(f'{x:.2f}' for x in load_after)}"
          + ("  (other processes were using the CPUs; wall times are inflated)"
             if max(load_before[0], load_after[0]) > 0.5 else ""))
    print(f"estimator source digest: {', '.join(digests)}"
          + ("  (WARNING: the estimator's code changed between measurements; timings mix versions)"
             if len(digests) > 1 or "+" in digests[0] else ""))
    if est["unsupported_ops"]:
        print(f"estimate: ops without a cost rule: {est['unsupported_ops']}")
    # Both clocks must meet the goal: on a loaded machine wall time mostly measures the other
    # processes, while CPU time (== wall time on an idle machine: neither side does real
    # compute) is the steadier of the two.
    if time_ok and ratio_cpu <= GOAL_RATIO:
        verdict = "PASS"
    elif time_ok:
        verdict = "MISS (wall time alone would pass; CPU time does not, so the wall-time pass is load noise)"
    elif ratio_cpu <= GOAL_RATIO:
        verdict = "MISS on wall time (CPU time would pass: check on an idle machine)"
    else:
        verdict = "MISS"
    time_ok = verdict == "PASS"
    print(f"Goal: estimate time <= {GOAL_RATIO:.1f}x peer time (ratio of medians): wall {ratio:.3f}x, "
          f"CPU {ratio_cpu:.3f}x -> {verdict}")
    print(f"Goal: estimate peak RSS <= 0.5 GiB ({GOAL_RSS_MIB:.0f} MiB): {rss_est:.1f} MiB -> "
          f"{'PASS' if rss_ok else 'MISS'}")
    print(f"peer counted: {', '.join(f'{k} {v:,}' for k, v in peer['flops_by_op'].items())}")
    missing = sorted(set(peer["flops_by_op_with_cpu_attention"]) - set(peer["flops_by_op"]))
    if missing:
        print(f"  (plain FlopCounterMode has no formula for {', '.join(missing)}: "
              f"{peer['flops_total_with_cpu_attention'] - peer['flops_total']:,} attention FLOPs uncounted)")
    print(f"Check: estimate matmul-class fwd+bwd == plain peer total: {'PASS' if flops_equal else 'MISS'}; "
          f"== peer with torch's SDPA formulas on the CPU attention kernels: "
          f"{'PASS' if flops_equal_fixed else 'MISS'}")

    if args.json:
        out = {
            "started": started,
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_before": load_before,
            "load_after": load_after,
            "estimator_source_digests": digests,
            "layers": args.layers,
            "seq": args.seq,
            "reps": args.reps,
            "median": med,
            "ratio_wall": ratio,
            "ratio_cpu": ratio_cpu,
            "params_meta": params_meta,
            "flops_equal_plain_peer": flops_equal,
            "flops_equal_peer_with_cpu_attention": flops_equal_fixed,
            "goals": {"time_ratio_le_1_wall_and_cpu": time_ok, "rss_le_512_mib": rss_ok},
            "runs": runs,
        }
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2, default=str)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

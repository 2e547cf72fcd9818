"""The zoo sweep: every model type transformers offers, shrunk, estimated and compared with a real CPU step.

    python benchmarks/zoo_sweep.py                      # every type: results.jsonl + a table by family
    python benchmarks/zoo_sweep.py --types gpt2,bert    # some
    python benchmarks/zoo_sweep.py --table-only         # the table from what results.jsonl holds
    python benchmarks/zoo_sweep.py --zoo torchvision    # every torchvision.models builder, as it is
    python benchmarks/zoo_sweep.py --zoo timm           # the smallest model of each of timm's modules

torchvision's models are built as they are (no configuration to shrink: ``torchvision:NAME`` at batch 2 and the
input size of the model's weights; video models 16 frames) and recorded with their family (the
``torchvision.models`` module that lists them) in ``zoo_sweep_torchvision.jsonl`` and ``.md``.  Where torchvision's
wheel links the CUDA torch (PyPI's do) its C++ operators cannot load beside a CPU torch: ``tests/sweep.py``'s
``import_torchvision`` defines the schemas its import needs, and the models that call those operators (detection)
fail in their real step, recorded as such.

Each type runs in its own process (``tests/sweep.py``'s :func:`sweep_one`: the estimator's loader builds
``hf:TYPE`` at 2 layers of width 64, batch 2 x 32 tokens or the model's own image/audio size; the
estimate on the CPU target, fp32, AdamW, against a real step of the same model with random weights).
Records are appended to ``--out`` (default ``benchmarks/zoo_sweep.jsonl``) as they finish, and a
type already there is not run again, so an interrupted sweep resumes.  The table (``--table``, default
``benchmarks/zoo_sweep.md``) counts outcomes by family (the class the loader picked) and lists every
type that is not exact, with its first difference or its message.  A type that takes longer than
``--timeout`` seconds is recorded as ``timeout``.

The test suite runs a fixed subset of this sweep (``tests/test_zoo_sweep.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")

FAMILIES = (  # (class-name suffix, family), first match wins
    ("ForCausalLM", "causal LM"), ("LMHeadModel", "causal LM"), ("ForMaskedLM", "masked LM"),
    ("ForConditionalGeneration", "conditional generation (seq2seq, vision/audio-language)"),
    ("ForSeq2SeqLM", "conditional generation (seq2seq, vision/audio-language)"),
    ("ForImageTextToText", "conditional generation (seq2seq, vision/audio-language)"),
    ("ForImageClassification", "image classification"), ("ForCTC", "speech (CTC)"),
)


def family(cls: str | None) -> str:
    if not cls:
        return "(not built)"
    for suffix, name in FAMILIES:
        if cls.endswith(suffix):
            return name
    return "base model (AutoModel)"


def all_types(zoo: str = "transformers") -> list[str]:
    """Every model type transformers offers, every ``torchvision:NAME``, or timm's architectures: the model with
    the fewest parameters of each of timm's model modules (``timm.list_modules()``, one per architecture
    family: resnet, vision_transformer, efficientnet, ...)."""
    if zoo in ("torchvision", "timm"):
        sys.path.insert(0, TESTS)
        from sweep import import_torchvision

        tv = import_torchvision()
        if zoo == "torchvision":
            return [f"torchvision:{name}" for name in tv.models.list_models()]
        return [f"timm:{name}" for name in timm_representatives()]
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return sorted(CONFIG_MAPPING_NAMES)


def timm_representatives() -> list[str]:
    """Of each of timm's model modules, the model with the fewest parameters (each built on the meta device)."""
    import timm
    import torch

    chosen = []
    for module in timm.list_modules():
        sizes = {}
        for name in timm.list_models(module=module):
            try:
                with torch.device("meta"):
                    sizes[name] = sum(p.numel() for p in timm.create_model(name, pretrained=False).parameters())
            except Exception:  # noqa: BLE001 - a model that does not build on meta: another of the module
                continue
        if sizes:
            chosen.append(min(sizes, key=lambda n: (sizes[n], n)))
    return chosen


MEMORY_CAP = 12 << 30  # address space of one type's process: a real step that runs away fails (no-truth)


def _memory_cap() -> None:  # (in the child) instead of the kernel's OOM killer taking the sweep's process
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def run_one(model_type: str, timeout: float) -> dict:
    prefix, _, name = model_type.partition(":")
    call = {"torchvision": "sweep_torchvision(%r)" % name, "timm": "sweep_timm(%r)" % name}.get(
        prefix if name else "", "sweep_one(%r)" % model_type)
    code = ("import json, sys; sys.path.insert(0, %r); from sweep import sweep_one, sweep_timm, sweep_torchvision; "
            "print('SWEEP ' + json.dumps(%s))" % (TESTS, call))
    t0 = time.perf_counter()
    env = dict(os.environ, OMP_NUM_THREADS="1", TRANSFORMERS_VERBOSITY="error")
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env,
                              preexec_fn=_memory_cap)
    except subprocess.TimeoutExpired:
        return {"type": model_type, "outcome": "timeout", "wall_s": timeout}
    wall = round(time.perf_counter() - t0, 1)
    for line in proc.stdout.splitlines():
        if line.startswith("SWEEP "):
            rec = json.loads(line[6:])
            rec["wall_s"] = wall
            return rec
    tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"type": model_type, "outcome": "crash", "where": "process", "message": tail[:300], "wall_s": wall}


SLOW_S = 10  # issue 25: no model's estimate slower than this on the 2-core machine


def time_alone(rec: dict, timeout: float) -> float | None:
    """The estimate of ``rec``'s model timed alone (:func:`sweep.estimate_alone`: nothing else running, the
    machine's threads), or None where it fails or runs past ``timeout``."""
    code = ("import json, sys; sys.path.insert(0, %r); from sweep import estimate_alone; "
            "print('ALONE %%s' %% estimate_alone(json.loads(sys.argv[1])))" % TESTS)
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error")
    try:
        proc = subprocess.run([sys.executable, "-c", code, json.dumps(rec)], capture_output=True, text=True,
                              timeout=timeout, env=env, preexec_fn=_memory_cap)
    except subprocess.TimeoutExpired:
        return None
    found = [line for line in proc.stdout.splitlines() if line.startswith("ALONE ")]
    return float(found[-1].split()[1]) if found else None


def _first_difference(rec: dict) -> str:
    if rec.get("errors"):
        name, e = next(iter(rec["errors"].items()))
        rel = f"{100 * e['rel']:+.2f}%" if e.get("rel") is not None else "n/a"
        more = f" (+{len(rec['errors']) - 1} more)" if len(rec["errors"]) > 1 else ""
        return f"{name} {rel}: {e['estimate']} vs {e['measured']}{more}"
    return (rec.get("message") or rec.get("truth_error") or "").replace("|", "/")[:160]


# Why a type got no estimate, first match wins: (reason, whether transformers itself can build and run the type
# in this environment, a test of the message)
NOT_ESTIMATED = (
    ("its library's C++ operators cannot load here (a CUDA build beside the CPU torch)", False,
     lambda m: "Couldn't load custom C++ ops" in m or "torchvision's C++ operators" in m),
    ("needs an optional library or the Hub", False,
     lambda m: ("requires the" in m and "library" in m) or "huggingface.co" in m or "pip install" in m),
    ("no model class", False, lambda m: "has no model class" in m),
    ("no forward of its own", False, lambda m: "has no forward of its own" in m),
    ("no training step (an inference session)", False, lambda m: "runs only inside an inference session" in m),
    ("the library cannot build its default configuration", False, lambda m: "building " in m or "has no default" in m),
)


def not_estimated(rec: dict) -> tuple[str, bool] | None:
    """Why ``rec``'s type has no estimate and whether transformers can build and run it here (None: estimated).
    A refusal whose real step fails too (transformers' own failure on these inputs) is not the loader's; every
    other refusal is: inputs the loader cannot make."""
    if rec.get("estimate_s") is not None:
        return None
    message = rec.get("message") or ""
    for reason, runs, says in NOT_ESTIMATED:
        if says(message):
            return reason, runs
    if rec.get("truth_error") and "too large" not in rec["truth_error"]:
        return "its real step fails too", False
    return "inputs the loader cannot make (refused in one line)", True


def coverage(records: list[dict], zoo: str = "transformers") -> str:
    """Issue 25's loader goal as a sentence: the share of types estimated, of all and of those transformers can
    build and run here, and the count of each reason for the others."""
    reasons = Counter(not_estimated(r) for r in records)
    estimated = reasons.pop(None, 0)
    runnable = estimated + sum(n for (_, runs), n in reasons.items() if runs)
    parts = ", ".join(f"{n} {reason}" for (reason, _), n in sorted(reasons.items(), key=lambda kv: -kv[1]))
    return (f"Estimated: {estimated} of {len(records)} types ({100 * estimated / max(len(records), 1):.1f} %), "
            f"{100 * estimated / max(runnable, 1):.1f} % of the {runnable} that {zoo} can build and run here. "
            f"The others: {parts or 'none'}.")


def _without_gradient(records: list[dict]) -> str:
    """The types whose estimated step leaves trainable parameters without a gradient (inputs that reach only
    part of the model, or parts unused by design), over the records that say (``no_gradient``, 2026-11-29 on)."""
    said = [r for r in records if "no_gradient" in r]
    some = sorted(r["type"] for r in said if r["no_gradient"])
    shown = ", ".join(some[:20]) + (f" and {len(some) - 20} more" if len(some) > 20 else "")
    return (f"Types whose step leaves trainable parameters without a gradient: {len(some)} of the {len(said)} "
            f"records that count them" + (f" ({shown})." if some else "."))


def table(records: list[dict], zoo: str = "transformers") -> str:
    outcomes = ("exact", "differs", "no-truth", "refused", "crash", "timeout", "unbuilt")
    by_family: dict[str, Counter] = defaultdict(Counter)
    for r in records:
        by_family[r.get("family") or family(r.get("cls"))][r["outcome"]] += 1
    total = Counter(r["outcome"] for r in records)
    lines = [f"# Zoo sweep: {len(records)} {zoo} model{' types' if zoo == 'transformers' else 's'}", "",
             "| family | " + " | ".join(outcomes) + " |", "|---|" + "---:|" * len(outcomes)]
    for fam in sorted(by_family):
        lines.append(f"| {fam} | " + " | ".join(str(by_family[fam][o]) for o in outcomes) + " |")
    lines.append("| **all** | " + " | ".join(f"**{total[o]}**" for o in outcomes) + " |")
    both = total["exact"] + total["differs"]
    over = [r for r in records if r["outcome"] == "differs"
            and any(e.get("rel") is None or abs(e["rel"]) > 0.01 for e in r["errors"].values())]
    slow = [r for r in records if r.get("estimate_s", 0) > SLOW_S]
    alone = [r for r in slow if (r.get("estimate_alone_s") or SLOW_S + 1) > SLOW_S]
    lines += ["", f"Of the {both} types where the estimate and the real step both ran: {total['exact']} exact "
              f"({100 * total['exact'] / max(both, 1):.1f} %), {len(over)} with a number over 1 % off. "
              f"Estimates over {SLOW_S} s on the sweep's one thread beside another job: {len(slow)}; timed again "
              f"alone (2 threads, nothing else running): {len(alone)} over {SLOW_S} s.", "", coverage(records, zoo),
              "", _without_gradient(records), "",
              "| type | outcome | class | first difference or message | estimate s | alone s |",
              "|---|---|---|---|---:|---:|"]
    for r in sorted(records, key=lambda r: (outcomes.index(r["outcome"]), r["type"])):
        if r["outcome"] != "exact" or r.get("estimate_s", 0) > SLOW_S:
            lines.append(f"| {r['type']} | {r['outcome']} | {r.get('cls', '')} | {_first_difference(r)} "
                         f"| {r.get('estimate_s', '')} | {r.get('estimate_alone_s') or ''} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zoo", choices=("transformers", "torchvision", "timm"), default="transformers")
    ap.add_argument("--types", help="comma-separated model types (default: every type)")
    ap.add_argument("--out", help="records (default: zoo_sweep.jsonl; zoo_sweep_ZOO.jsonl for another zoo)")
    ap.add_argument("--table", help="the table (default: zoo_sweep.md; zoo_sweep_ZOO.md)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--rerun", action="store_true", help="run types already in --out again")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args(argv)
    suffix = "" if args.zoo == "transformers" else f"_{args.zoo}"
    args.out = args.out or os.path.join(HERE, f"zoo_sweep{suffix}.jsonl")
    args.table = args.table or os.path.join(HERE, f"zoo_sweep{suffix}.md")
    done: dict[str, dict] = {}
    if os.path.exists(args.out):
        with open(args.out) as fh:
            for line in fh:
                if line.strip():
                    rec = json.loads(line)
                    done[rec["type"]] = rec
    if not args.table_only:
        types = args.types.split(",") if args.types else all_types(args.zoo)
        todo = [t for t in types if args.rerun or t not in done]
        start = time.perf_counter()
        with open(args.out, "a") as fh, ThreadPoolExecutor(args.jobs) as pool:
            for i, rec in enumerate(pool.map(lambda t: run_one(t, args.timeout), todo), 1):
                done[rec["type"]] = rec
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
                left = (time.perf_counter() - start) / i * (len(todo) - i)
                print(f"[{i}/{len(todo)}] {rec['type']}: {rec['outcome']} {_first_difference(rec)[:100]} "
                      f"(about {left / 60:.0f} min left)", flush=True)
        # the sweep's times ran on one thread beside another job: each over SLOW_S timed again alone
        for rec in [done[t] for t in todo if done[t].get("estimate_s", 0) > SLOW_S]:
            rec["estimate_alone_s"] = time_alone(rec, args.timeout)
            print(f"{rec['type']}: estimate alone {rec['estimate_alone_s']} s", flush=True)
    with open(args.out, "w") as fh:  # one record per type, the latest, without the tracebacks of crashes
        for name in sorted(done):
            fh.write(json.dumps({k: v for k, v in done[name].items() if k != "trace"}) + "\n")
    with open(args.table, "w") as fh:
        fh.write(table(list(done.values()), args.zoo))
    print(f"table: {args.table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

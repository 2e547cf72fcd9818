"""Tensor parallelism on every transformers causal LM whose configuration ships a tensor-parallel plan.

For each model type with a non-empty ``base_model_tp_plan`` that the zoo sweep (``zoo_sweep.jsonl``) built as a
causal LM, this builds the sweep's tiny configuration on ``meta`` (its level-2 overrides), derives the planner's
Megatron pairs from the traced dataflow (``Planner.tp_plan()``), compares its colwise and rowwise Linear layers with
the ones the shipped plan marks ``colwise`` and ``rowwise`` (a difference is not always a fault: several shipped plans
keep a shared expert or an MLA attention whole, which torchtitan splits), and plans FSDP over 4 ranks with ``--tp 2``,
without and with sequence parallelism (batch 2 x 16 tokens).  The trace runs each rank's split model on its local
shards, so a wrong pair, a norm on the wrong sequence shard or a tensor mixed with a DTensor fails the plan.

    .venv/bin/python benchmarks/tp_sweep.py                # ~2 minutes on 2 cores (two processes)
    .venv/bin/python benchmarks/tp_sweep.py --types llama,deepseek_v3

Writes ``benchmarks/tp_sweep.jsonl`` (one record per type) and prints the summary.  Printed, not asserted:
``tests/test_tp_plan.py`` asserts the architectures it names.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))


def _types() -> list[str]:
    from estimator.compat import import_torchvision

    import_torchvision()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    sweep = {json.loads(line)["type"]: json.loads(line) for line in open(HERE / "zoo_sweep.jsonl")}
    out = []
    for name, cls in CONFIG_MAPPING.items():
        try:
            shipped = getattr(cls, "base_model_tp_plan", None)
        except Exception:  # a lazy config class that fails to import here
            continue
        if shipped and name in sweep and "CausalLM" in (sweep[name].get("cls") or ""):
            out.append(name)
    return out


def _shipped(model, plan: dict, style: str) -> set[str]:
    patterns = [re.compile(r"(^|\.)" + re.escape(k).replace(r"\*", r"\d+") + "$")
                for k, v in plan.items() if v == style]
    return {p for p, _ in model.named_modules() if any(r.search(p) for r in patterns)}


def one(name: str, overrides: dict) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from estimator.plan import Planner

    rec: dict = {"type": name}
    start = time.perf_counter()
    try:
        fields = {"use_cache": False, **{k: v for k, v in overrides.items() if "." not in k}}  # no cache in training
        config = AutoConfig.for_model(name, **fields)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        shipped = type(model.config).base_model_tp_plan or {}
        ids = torch.zeros(2, 16, dtype=torch.long)
        planner = Planner(model, {"input_ids": ids, "labels": ids.clone()}, gpu="H100", device="cpu", precision="fp32")
        tp = planner.tp_plan()
        gathered = set(tp.gathered)  # groups whose outputs are gathered: transformers' *_gather_output, *_split_input
        for style, derived in (("colwise", set(tp.colwise) - gathered), ("rowwise", set(tp.rowwise) - gathered),
                               ("colwise_gather_output", set(tp.colwise) & gathered),
                               ("rowwise_split_input", set(tp.rowwise) & gathered)):
            truth = _shipped(model, shipped, style)
            rec[f"{style}_as_shipped"] = derived == truth
            rec[f"{style}_only_shipped"] = sorted(truth - derived)[:4]
            rec[f"{style}_only_derived"] = sorted(derived - truth)[:4]
        for sp in (False, True):
            try:
                planner.plan("fsdp", 4, tp=2, sequence_parallel=sp, solve=())
                rec[f"sp{int(sp)}"] = "ok"
            except Exception as exc:  # the planner's one-line errors included: a refusal is an outcome here
                rec[f"sp{int(sp)}"] = f"{type(exc).__name__}: {exc}"[:300]
    except Exception as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
    rec["seconds"] = round(time.perf_counter() - start, 1)
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", help="comma-separated model types (default: all with a shipped plan)")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    if args._child:  # one process per half: the fake process group and the models stay apart from the parent's
        import torch

        from estimator.compat import import_torchvision

        torch.set_num_threads(1)
        import_torchvision()  # transformers imports torchvision: PyPI's beside the CPU torch needs its schemas
        sweep = {json.loads(line)["type"]: json.loads(line) for line in open(HERE / "zoo_sweep.jsonl")}
        for name in args._child.split(","):
            print("RECORD " + json.dumps(one(name, sweep[name].get("overrides") or {})), flush=True)
        return 0
    names = args.types.split(",") if args.types else _types()
    halves = [names[0::2], names[1::2]]
    procs = [subprocess.Popen([sys.executable, __file__, "--_child", ",".join(h)], stdout=subprocess.PIPE, text=True,
                              stderr=subprocess.DEVNULL, cwd=ROOT) for h in halves if h]
    records = [json.loads(line[7:]) for p in procs for line in p.communicate()[0].splitlines()
               if line.startswith("RECORD ")]
    records.sort(key=lambda r: r["type"])
    if not args.types:
        with open(HERE / "tp_sweep.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    planned = [r for r in records if r.get("sp0") == "ok" and r.get("sp1") == "ok"]
    built = [r for r in records if "error" not in r]
    same = [r for r in built if all(r[f"{s}_as_shipped"] for s in ("colwise", "rowwise", "colwise_gather_output",
                                                                    "rowwise_split_input"))]
    print(f"{len(records)} types; built {len(built)}; pairs as shipped {len(same)}; planned under --tp 2 with and "
          f"without sequence parallelism {len(planned)}")
    for r in records:
        if r not in planned:
            why = r.get("error") or (r["sp0"] if r.get("sp0") != "ok" else r.get("sp1"))
            print(f"  {r['type']}: {why[:160]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a CUDA process holds on the GPU outside PyTorch's caching allocator (the context: driver, the loaded
kernels of CUDA, cuBLAS and cuDNN), and what the allocator reserves at the largest batch that runs.

For each case of ``tests/h100_cases.py``: three steps (as ``record_h100.py``), then ``total - free`` from
``cudaMemGetInfo`` less ``memory_reserved()``: the bytes outside the allocator.  ``--near`` runs the given
largest batches (``maxbatch.jsonl`` of the first recording) and records ``max_memory_allocated()`` and
``max_memory_reserved()`` over their steps.  One JSON line per case on stdout and in ``--out``.

    python benchmarks/record_context.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "tests")]

import h100_cases  # noqa: E402
import record_h100 as rec  # noqa: E402

CASES = [("small_cnn_b64", "fp32"), ("lstm_emb_b32", "fp32"), ("bert_base_b16", "fp32"), ("gpt2_124m", "bf16-mixed"),
         ("resnet18_b32", "bf16-mixed"), ("llama_small", "bf16-mixed")]
NEAR = [("gpt2_124m_wrapped", "bf16-mixed", 53), ("bert_base_wrapped", "fp32", 146), ("llama_small", "bf16-mixed", 90)]


def outside() -> dict:
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return {"total": total, "free": free, "reserved": torch.cuda.memory_reserved(),
            "allocated": torch.cuda.memory_allocated(), "outside": total - free - torch.cuda.memory_reserved()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.cuda.init()
    rows = [{"case": "init", **outside()}]
    torch.empty(1, device="cuda")
    rows.append({"case": "first tensor", **outside()})
    for name, precision in CASES:
        model, step, state = rec.prepare(name, h100_cases.MODELS[name], precision, {})
        rec.memory_steps(step, state)
        rows.append({"case": name, "precision": precision, **outside()})
        del model, step, state
        rec.clean()
    for name, precision, batch in NEAR:
        rec.clean()
        model, step, state = rec.prepare(name, h100_cases.SEARCHES[name](batch), precision, {})
        steps, keep = rec.memory_steps(step, state)
        rows.append({"case": name, "precision": precision, "batch": batch, "steps": steps, **outside()})
        del model, step, state, keep
        rec.clean()
    with open(os.path.join(a.out, "context.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
            print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()

"""GPU check of the memory simulation: estimated vs ``torch.cuda.max_memory_allocated()``.

For each model: ``estimator.validate.validate`` estimates the step for a CUDA target, then runs
real iterations on the GPU and measures the steady-state peak (``reset_peak_memory_stats()``
before the second iteration, ``max_memory_allocated()`` after it, less what was allocated
before), plus model states, saved activations, FLOPs and step time.  The table printed (and
written with ``--json``) is estimate / measured per model; goal: peak within 1 %.

    python benchmarks/bench_gpu_memory.py                  # every model, bf16-mixed
    python benchmarks/bench_gpu_memory.py --precision fp32 --models gpt2 resnet50

Needs a CUDA GPU, transformers (GPT-2 124M, a Llama-style model) and torchvision (ResNet-50).
Models are built from configs with random weights; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "tests")]
import torchvision_env  # noqa: E402  (transformers beside PyPI's torchvision and the CPU torch)

torchvision_env.load()


def _gpt2(batch=8, seq=1024):
    import transformers

    cfg = transformers.AutoConfig.for_model("gpt2")
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    return model, {"input_ids": ids, "labels": ids}, None


def _llama(batch=4, seq=1024):
    import transformers

    cfg = transformers.AutoConfig.for_model("llama", hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                            num_attention_heads=16, num_key_value_heads=4, vocab_size=32000)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    return model, {"input_ids": ids, "labels": ids}, None


def _resnet50(batch=64):
    import torch.nn.functional as F
    import torchvision

    model = torchvision.models.resnet50(weights=None)
    labels = torch.zeros(batch, dtype=torch.long)
    return model, torch.randn(batch, 3, 224, 224), lambda logits: F.cross_entropy(logits, labels.to(logits.device))


def _zoo(name):
    import zoo

    return lambda: zoo.ZOO[name]()


MODELS = {"gpt2": _gpt2, "llama": _llama, "resnet50": _resnet50,
          **{name: _zoo(name) for name in ("cruncher", "mlp", "vgg", "gpt", "mobilenet", "hf_gpt2", "hf_llama_sdpa")}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu_memory: no CUDA GPU here; run it on a GPU machine", file=sys.stderr)
        return 2
    from estimator.validate import validate

    rows = []
    for name in args.models:
        model, inputs, loss_fn = MODELS[name]()
        result = validate(model, inputs, loss_fn=loss_fn, device="cuda", precision=args.precision, steps=args.steps)
        r = result.rows
        rows.append({"model": name, "peak_estimated": r["peak"]["estimated"], "peak_measured": r["peak"]["measured"],
                     "peak_ratio": r["peak"]["estimated"] / max(r["peak"]["measured"], 1),
                     "activations_ratio": r["activations"]["estimated"] / max(r["activations"]["measured"], 1),
                     "step_time_s": result.step_time_s, "mfu": result.mfu, "device": result.device_name})
        print(f"{name:14s} peak est {rows[-1]['peak_estimated'] / 2**20:10.1f} MiB  measured "
              f"{rows[-1]['peak_measured'] / 2**20:10.1f} MiB  ratio {rows[-1]['peak_ratio']:.4f}  "
              f"activations ratio {rows[-1]['activations_ratio']:.4f}  step {result.step_time_s * 1e3:.1f} ms  "
              f"MFU {'-' if result.mfu is None else f'{100 * result.mfu:.1f}%'}", flush=True)
        del model, inputs
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"precision": args.precision, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

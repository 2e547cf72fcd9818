"""``estimator estimate``, ``estimator validate`` and ``estimator hardware``: their parsers' examples and
what each runs.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import UserError
from .options import generation_options, load_model, precision_of, training_options, zero_grad_of
from .output import pick_format, plot_format, text_width, write_atomic, write_text
from .progress import Progress


EPILOG_ESTIMATE = """examples:
  estimator estimate examples/cruncher.py:build
  estimator estimate examples/mlp.py:build --optimizer sgd:momentum=0.9 --format json
  estimator estimate examples/vgg.py:model --input 8x3x64x64 --depth 1
  estimator estimate examples/gpt.py:build --optimizer adam:amsgrad=true --format markdown
  estimator estimate mypkg.models:make_model --input 8x1024:int64 --output report.json --format json
  estimator estimate hf:gpt2 --batch 8 --seq 1024 --precision fp32
  estimator estimate hf:llama --set num_hidden_layers=2 --mode inference --quantize int4 --gpu L4
  estimator estimate hf:llama --mode generate --prompt-len 2048 --new-tokens 512 --batch 8 --gpu H100
  estimator estimate hf:llama --set num_hidden_layers=2 --set hidden_size=1024 --seq 4096
  estimator estimate hf:path/to/config.json --batch 4 --seq 2048 --output report.html
  estimator estimate torchvision:resnet50 --batch 32 --format csv --output modules.csv
  estimator estimate timm:vit_base_patch16_224 --batch 64 --image-size 224
"""


def run_estimate(args: argparse.Namespace) -> int:
    from ..api import estimate

    if args.depth < 0:
        raise UserError(f"--depth must be >= 0, not {args.depth}")
    fmt = pick_format(args.format, args.output)
    if fmt == "html" and not args.output and sys.stdout.isatty():
        raise UserError("--format html writes a page: add --output report.html (or redirect stdout to a file)")
    plot_fmt = plot_format(args.plot) if args.plot else None
    optimizer, grad_accum = training_options(args)
    if args.checkpoint_policy != "full" and not args.checkpoint:
        raise UserError("--checkpoint-policy picks which instances of --checkpoint CLASS are recomputed: add "
                        "--checkpoint CLASS")
    if args.mode != "train" and (args.checkpoint or args.checkpoint_policy != "full"):
        raise UserError(f"--checkpoint is a what-if of training steps (recomputation in backward); --mode "
                        f"{args.mode} has no backward: drop it")
    generation = generation_options(args)
    with Progress() as progress:
        progress.set("building the model")
        loaded = load_model(args)
        report = estimate(loaded.model, loaded.inputs, optimizer=optimizer, loss_fn=loaded.loss_fn,
                          device=args.device, depth=args.depth, precision=precision_of(args), mode=args.mode,
                          checkpoint=args.checkpoint or None, checkpoint_policy=args.checkpoint_policy,
                          keep_output=args.keep_output, grad_accum=grad_accum, model_name=loaded.title,
                          progress=progress, gpu=args.gpu, quantize=args.quantize, compile=args.compile, float8=args.float8,
                          cuda_torch=args.cuda_torch, lora=args.lora, clip_grad_norm=args.clip_grad_norm, ema=args.ema,
                          zero_grad=zero_grad_of(args),
                          **generation)
        progress.set("writing the report")
        if fmt == "json":
            text = json.dumps(report.to_dict(), indent=2)
        elif fmt == "markdown":
            text = report.to_markdown(operators=args.operators)
        elif fmt == "csv":
            text = report.operators_csv() if args.operators else report.to_csv()
        elif fmt == "html":
            text = report.to_html()
        else:
            text = report.render(width=text_width(args.output), operators=args.operators)
        if args.plot:
            from ..render import plot

            write_atomic(args.plot, lambda tmp: plot(report, tmp, fmt=plot_fmt), suffix="." + plot_fmt)
    write_text(text, args.output)
    return 0


def run_validate(args: argparse.Namespace) -> int:
    from ..validate import validate

    if args.checkpoint or args.checkpoint_policy != "full":
        flag = "--checkpoint" if args.checkpoint else "--checkpoint-policy"
        raise UserError(f"{flag} is a what-if of 'estimator estimate'; validate runs the model's step as its "
                        f"code is written: drop {flag} (or checkpoint inside the model's code)")
    optimizer, grad_accum = training_options(args)
    generation = generation_options(args)
    loaded = load_model(args, empty=False)  # it runs real steps: a factory's own weights, as before
    result = validate(loaded.model, loaded.inputs, optimizer=optimizer, loss_fn=loaded.loss_fn,
                      device=args.device, precision=precision_of(args), keep_output=args.keep_output,
                      grad_accum=grad_accum, steps=args.steps, tolerance=args.tolerance, force=args.force,
                      peak_tflops=args.peak_tflops, clip_grad_norm=args.clip_grad_norm, ema=args.ema,
                      zero_grad=zero_grad_of(args), quantize=args.quantize,
                      mode=args.mode, **generation)
    write_text(json.dumps(result.to_dict(), indent=2) if args.format == "json" else result.render(), None)
    return 0 if result.ok else 1


def run_hardware(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from ..hardware import GPUS, TABLE_HEADERS, table_rows

    if args.format == "json":
        text = json.dumps([g.to_json() for g in GPUS], indent=2)
    else:
        text = ("Dense peak TFLOP/s (no sparsity); memory: the datasheet's GB (10^9 bytes) and what torch reports "
                "(total_memory); --gpu FILE.json takes one entry of --format json for a card not listed\n" +
                tabulate(table_rows(), headers=TABLE_HEADERS, tablefmt="github" if args.format == "markdown"
                         else "simple", disable_numparse=True))
    write_text(text, None)
    return 0

"""Command line: ``estimator estimate SPEC ...``.

User errors (a bad spec, shape, optimizer; a forward that fails on the given
shapes; an untraceable model) print one line saying what to fix and exit 2,
with no traceback unless ``--debug``; nothing is written unless the whole
command succeeded.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from typing import Sequence

from .errors import UserError

EPILOG_ESTIMATE = """examples:
  estimator estimate examples/cruncher.py:build
  estimator estimate examples/mlp.py:build --optimizer sgd:momentum=0.9 --format json
  estimator estimate examples/vgg.py:model --input 8x3x64x64 --depth 1
  estimator estimate examples/gpt.py:build --optimizer adam:amsgrad=true --format markdown
  estimator estimate mypkg.models:make_model --input 8x1024:int64 --output report.json --format json
"""


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC",
                   help="path/to/file.py:callable or package.module:callable; the callable returns an "
                        "nn.Module or a (module, inputs) pair (e.g. examples/gpt.py:build)")
    p.add_argument("--input", action="append", metavar="SHAPE[:DTYPE]", default=[],
                   help="an input tensor's shape, repeatable for several positional inputs "
                        "(e.g. --input 8x3x224x224, --input 8x1024:int64); overrides inputs from SPEC")
    p.add_argument("--optimizer", default="adamw", metavar="NAME[:k=v,...]",
                   help="sgd, sgd-momentum, adam, adamw, adagrad, rmsprop, adamax, adadelta, nadam, radam or none, "
                        "with options, e.g. sgd:momentum=0.9 or adam:amsgrad=true (default: adamw)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="target device whose kernels and optimizer defaults are modelled (default: cuda)")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16", "bf16-mixed", "fp16-mixed"),
                   help="fp32; bf16/fp16 (model cast); bf16-mixed/fp16-mixed (torch.autocast, fp32 master "
                        "weights; fp16 with a GradScaler) (default: fp32), e.g. --precision bf16-mixed")
    p.add_argument("--mode", default="train", choices=("train", "inference"),
                   help="train: one training step; inference: forward only under torch.no_grad() "
                        "(default: train), e.g. --mode inference")
    p.add_argument("--checkpoint", action="append", metavar="CLASS", default=[],
                   help="what-if: run every instance of this module class under activation checkpointing "
                        "and show the memory saved and FLOPs added; repeatable, e.g. --checkpoint Block")
    p.add_argument("--debug", action="store_true", help="show the full traceback of errors")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="estimator",
        description="Estimate what one training step of a PyTorch model costs before you train: "
                    "parameters, gradients, optimizer state, saved activations, FLOPs, peak memory.",
        epilog="run 'estimator estimate --help' for the options, e.g. "
               "'estimator estimate examples/cruncher.py:build'",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    est = sub.add_parser("estimate", help="estimate one training step (e.g. estimator estimate examples/gpt.py:build)",
                         description="Capture one training step (forward, loss, backward, optimizer step) on fake "
                                     "tensors and report its costs.",
                         epilog=EPILOG_ESTIMATE, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(est)
    est.add_argument("--format", default="table", choices=("table", "json", "markdown"),
                     help="output format (default: table), e.g. --format json")
    est.add_argument("--depth", type=int, default=2, metavar="N",
                     help="module depth of the per-module table (default: 2), e.g. --depth 1")
    est.add_argument("--output", metavar="FILE", help="write the report to FILE instead of stdout, e.g. --output r.json")
    est.add_argument("--plot", metavar="FILE.png",
                     help="draw the live-memory timeline with the peak marked (needs matplotlib), e.g. --plot mem.png")
    est.set_defaults(run=_run_estimate)

    val = sub.add_parser("validate", help="check an estimate against a live run (e.g. estimator validate "
                                          "examples/mlp.py:build --device cpu)",
                         description="Estimate, then run real training iterations on the device and compare: "
                                     "model states, saved activations, peak memory, FLOPs, step time, MFU. "
                                     "Exit 0 when every line is within the tolerance, 1 otherwise.",
                         epilog="examples:\n  estimator validate examples/mlp.py:build --device cpu\n"
                                "  estimator validate examples/gpt.py:build --precision bf16-mixed --steps 20 "
                                "--format json",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(val)
    val.set_defaults(device=None)
    val.add_argument("--steps", type=int, default=5, metavar="N",
                     help="timed iterations after the warm-up (default: 5), e.g. --steps 20")
    val.add_argument("--tolerance", type=float, default=5.0, metavar="PCT",
                     help="largest relative error accepted, in percent (default: 5), e.g. --tolerance 1")
    val.add_argument("--peak-tflops", type=float, metavar="TFLOPS",
                     help="the device's peak for MFU when it is not in the hardware table, e.g. --peak-tflops 312")
    val.add_argument("--force", action="store_true", help="run even if the estimated peak exceeds free memory")
    val.add_argument("--format", default="table", choices=("table", "json"), help="output format, e.g. --format json")
    val.set_defaults(run=_run_validate)

    hw = sub.add_parser("hardware", help="list the GPUs known to the tool (e.g. estimator hardware --format json)",
                        description="GPUs with memory, bandwidth and dense peak TFLOP/s per dtype "
                                    "(sources in estimator/hardware.py).")
    hw.add_argument("--format", default="table", choices=("table", "json", "markdown"),
                    help="output format, e.g. --format markdown")
    hw.add_argument("--debug", action="store_true", help="show the full traceback of errors")
    hw.set_defaults(run=_run_hardware)
    return parser


def _atomic(path: str, write, suffix: str = ".tmp") -> None:
    """Call ``write(tmp)`` on a temp file beside ``path``, then rename it into place: never half-written."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise UserError(f"cannot write {path}: directory {directory} does not exist")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".estimator-", suffix=suffix)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _write(text: str, output: str | None) -> None:
    """Print, or write FILE atomically."""
    text = text if text.endswith("\n") else text + "\n"
    if not output:
        sys.stdout.write(text)
        return

    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)

    _atomic(output, write)


def _run_estimate(args: argparse.Namespace) -> int:
    from .estimate import estimate
    from .specs import load

    if args.depth < 0:
        raise UserError(f"--depth must be >= 0, not {args.depth}")
    model, inputs = load(args.spec, args.input)
    report = estimate(model, inputs, optimizer=args.optimizer, device=args.device, depth=args.depth,
                      precision=args.precision, mode=args.mode, checkpoint=args.checkpoint or None,
                      model_name=args.spec)
    if args.format == "json":
        text = json.dumps(report.to_dict(), indent=2)
    elif args.format == "markdown":
        text = report.to_markdown()
    else:
        text = report.render()
    if args.plot:
        from .memory import plot

        _atomic(args.plot, lambda tmp: plot(report.memory, tmp, title=f"{args.spec}: live memory"), suffix=".png")
    _write(text, args.output)
    return 0


def _run_validate(args: argparse.Namespace) -> int:
    from .specs import load
    from .validate import validate

    model, inputs = load(args.spec, args.input)
    result = validate(model, inputs, optimizer=args.optimizer, device=args.device, precision=args.precision,
                      steps=args.steps, tolerance=args.tolerance, force=args.force, peak_tflops=args.peak_tflops)
    _write(json.dumps(result.to_dict(), indent=2) if args.format == "json" else result.render(), None)
    return 0 if result.ok else 1


def _run_hardware(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from .hardware import GPUS, TABLE_HEADERS, table_rows

    if args.format == "json":
        text = json.dumps([{"name": g.name, "memory": g.memory, "bandwidth": g.bandwidth, "peak_flops": g.peak,
                            "aliases": list(g.aliases)} for g in GPUS], indent=2)
    else:
        text = ("Dense peak TFLOP/s (no sparsity); memory in GB (10^9 bytes)\n" +
                tabulate(table_rows(), headers=TABLE_HEADERS, tablefmt="github" if args.format == "markdown"
                         else "simple", disable_numparse=True))
    _write(text, None)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="estimator: %(levelname)s: %(message)s", stream=sys.stderr)
    try:
        return args.run(args)
    except UserError as exc:
        if args.debug:
            raise
        print(f"estimator: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("estimator: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""Command line: ``estimator estimate SPEC ...``, ``validate``, ``plan``, ``hardware``.

User errors (a bad spec, shape, optimizer; a forward that fails on the given shapes; an
untraceable model) print one line saying what to fix and exit 2, with no traceback unless
``--debug``; nothing is written unless the whole command succeeded.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from ..errors import UserError
from .estimate import EPILOG_ESTIMATE, run_estimate, run_hardware, run_validate
from .options import add_common
from .output import FORMATS
from .plan import add_plan_parser


class UsageError(UserError):
    """A command line argparse refuses (an unknown option, a value of the wrong type, a missing
    required option): one line, exit 2, like every other user error."""


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line (``estimator: error: ...``, exit 2) instead of the
    usage block (10-17 lines) followed by the message; the subcommands' parsers are of this class too
    (``add_subparsers`` makes parsers of its parser's class)."""

    def error(self, message: str):  # noqa: D401  (argparse's hook; it must not return)
        raise UsageError(f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
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
    add_common(est)
    est.add_argument("--format", choices=FORMATS,
                     help="output format: table, json (schema in docs/json.md), markdown, csv (one row per module) "
                          "or html (a self-contained page: headline, memory timeline, module tree, summary) "
                          "(default: from the --output suffix, else table), e.g. --format csv")
    est.add_argument("--depth", type=int, default=2, metavar="N",
                     help="module depth of the per-module table (default: 2), e.g. --depth 1")
    est.add_argument("--output", metavar="FILE",
                     help="write the report to FILE instead of stdout; the suffix picks the format when --format is "
                          "not given: .txt (table), .json, .md, .csv, .html or .htm (others are refused), "
                          "e.g. --output report.html")
    est.add_argument("--operators", action="store_true",
                     help="add the per-operator table (FLOPs and bytes saved for backward per aten op) to table, "
                          "markdown and html; with csv, write one row per operator instead of per module")
    est.add_argument("--gpu", metavar="NAME",
                     help="size the step for this GPU (a name or alias from 'estimator hardware', e.g. --gpu H100, "
                          "or a JSON file describing another card with the fields of 'estimator hardware --format "
                          "json', e.g. --gpu my_gpu.json): the report says whether the step fits in its memory and "
                          "how long it takes, with a likely range")
    est.add_argument("--plot", metavar="FILE",
                     help="draw the live-memory timeline with the peak marked (needs matplotlib); the suffix picks "
                          "the image type: .png, .svg or .pdf, e.g. --plot mem.png")
    est.set_defaults(run=run_estimate)

    val = sub.add_parser("validate", help="check an estimate against a live run (e.g. estimator validate "
                                          "examples/mlp.py:build --device cpu)",
                         description="Estimate, then run the same thing for real on the device and compare: "
                                     "real training iterations (model states, saved activations, peak memory, "
                                     "FLOPs, step time, MFU), or with --mode inference real forwards (peak, "
                                     "FLOPs, time), or with --mode generate a real generate() (KV cache, the "
                                     "prefill's and the last decode step's peaks, FLOPs and times). "
                                     "Exit 0 when every line is within the tolerance, 1 otherwise.",
                         epilog="examples:\n  estimator validate examples/mlp.py:build --device cpu\n"
                                "  estimator validate examples/gpt.py:build --precision bf16-mixed --steps 20 "
                                "--format json\n"
                                "  estimator validate hf:llama --set num_hidden_layers=2 --mode generate "
                                "--prompt-len 512 --new-tokens 64",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(val, mode=False, target_torch=False, serving=True)  # it runs on the installed torch
    val.set_defaults(device=None)
    val.add_argument("--steps", type=int, default=5, metavar="N",
                     help="timed iterations after the warm-up (default: 5), e.g. --steps 20")
    val.add_argument("--tolerance", type=float, default=5.0, metavar="PCT",
                     help="largest relative error accepted, in percent (default: 5), e.g. --tolerance 1")
    val.add_argument("--peak-tflops", type=float, metavar="TFLOPS",
                     help="the device's peak for MFU when it is not in the hardware table, e.g. --peak-tflops 312")
    val.add_argument("--quantize", choices=("int4", "int4-dq"),
                     help="--mode inference or generate: run the Linear layers as bitsandbytes' 4-bit layers (NF4; "
                          "int4-dq: double quantization), quantized for real, beside the estimate over them, e.g. "
                          "--quantize int4")
    val.add_argument("--force", action="store_true", help="run even if the estimated peak exceeds free memory")
    val.add_argument("--format", default="table", choices=("table", "json"), help="output format, e.g. --format json")
    val.set_defaults(run=run_validate)

    hw = sub.add_parser("hardware", help="list the GPUs known to the tool (e.g. estimator hardware --format json)",
                        description="GPUs with memory, bandwidth and dense peak TFLOP/s per dtype "
                                    "(sources in estimator/hardware.py).")
    hw.add_argument("--format", default="table", choices=("table", "json", "markdown"),
                    help="output format, e.g. --format markdown")
    hw.add_argument("--debug", action="store_true", help="show the full traceback of errors")
    hw.set_defaults(run=run_hardware)

    add_plan_parser(sub)
    return parser


QUIET_LOGGERS = ("torchao", "torch.utils._pytree")


class _HeldWarnings(logging.Handler):
    """The root logger's one handler during a command (no stream handler: ``--debug`` alone configures one): its
    warnings held back and printed once it answered, so that a command that fails prints its one error line."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def flush_to_stderr(self) -> None:
        for record in self.records:
            print(f"estimator: {record.levelname}: {record.getMessage()}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # (argparse's own message names the top-level parser: the subcommand's help lists the options)
            where = f"estimator {args.command}" if getattr(args, "command", None) else "estimator"
            raise UsageError(f"unrecognized arguments: {' '.join(extra)} (see '{where} --help')")
    except UsageError as exc:
        print(f"estimator: error: {exc}", file=sys.stderr)
        return 2
    held = _HeldWarnings()
    if args.debug:
        logging.basicConfig(level=logging.DEBUG, format="estimator: %(levelname)s: %(message)s", stream=sys.stderr)
    else:  # warnings held to the end of the command (see _HeldWarnings)
        logging.getLogger().setLevel(logging.WARNING)
        logging.getLogger().addHandler(held)
    if not args.debug:
        # torchao, imported by transformers when it is installed, warns about its optional CUDA kernels and
        # triton, and torch about the enums it registers: not the user's business
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
    try:
        code = args.run(args)
    except UserError as exc:
        if args.debug:
            raise
        # one line: the warnings of the inputs a failed run was built from join the error they explain
        said = "; ".join(r.getMessage() for r in held.records if r.name.startswith("estimator.specs"))
        print(f"estimator: error: {exc}{f' ({said})' if said else ''}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("estimator: interrupted", file=sys.stderr)
        return 130
    finally:
        logging.getLogger().removeHandler(held)
    held.flush_to_stderr()
    return code

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
from .specs import DEFAULT_SEQ, FALLBACK_SEQ

PRECISIONS = ("fp32", "bf16", "fp16", "bf16-mixed", "fp16-mixed", "fp8")

EPILOG_ESTIMATE = """examples:
  estimator estimate examples/cruncher.py:build
  estimator estimate examples/mlp.py:build --optimizer sgd:momentum=0.9 --format json
  estimator estimate examples/vgg.py:model --input 8x3x64x64 --depth 1
  estimator estimate examples/gpt.py:build --optimizer adam:amsgrad=true --format markdown
  estimator estimate mypkg.models:make_model --input 8x1024:int64 --output report.json --format json
  estimator estimate hf:gpt2 --batch 8 --seq 1024 --precision bf16-mixed
  estimator estimate hf:llama --set num_hidden_layers=2 --set hidden_size=1024 --seq 4096
  estimator estimate hf:path/to/config.json --batch 4 --seq 2048 --output report.html
  estimator estimate torchvision:resnet50 --batch 32 --format csv --output modules.csv
  estimator estimate timm:vit_base_patch16_224 --batch 64 --image-size 224
"""


def _add_common(p: argparse.ArgumentParser, *, precisions: Sequence[str] = PRECISIONS, default_precision: str = "fp32",
                precision_help: str | None = None, mode: bool = True) -> None:
    p.add_argument("spec", metavar="SPEC",
                   help="path/to/file.py:callable or package.module:callable (the callable returns an "
                        "nn.Module or a (module, inputs) pair, e.g. examples/gpt.py:build); hf:MODEL_TYPE or "
                        "hf:path/to/config.json (transformers, e.g. hf:gpt2); torchvision:NAME (e.g. "
                        "torchvision:resnet50); timm:NAME. Models are built without weights; nothing is downloaded")
    p.add_argument("--batch", type=int, metavar="B",
                   help="batch size of hf:, torchvision: and timm: models (default: 1), e.g. --batch 8")
    p.add_argument("--seq", type=int, metavar="S",
                   help=f"sequence length of hf: token models (default: the model's position limit, at most "
                        f"{DEFAULT_SEQ}; {FALLBACK_SEQ} without one), e.g. --seq 4096")
    p.add_argument("--image-size", type=int, metavar="PX",
                   help="image height and width of image models (default: the model's own), e.g. --image-size 384")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[], dest="overrides",
                   help="override a configuration field (hf:; dotted for sub-configurations, e.g. "
                        "text_config.num_hidden_layers=2), a builder argument (torchvision:, timm:) or a keyword "
                        "argument of the SPEC callable; values parse as int, float, true/false, none or text; "
                        "repeatable, e.g. --set num_hidden_layers=2")
    p.add_argument("--input", action="append", metavar="SHAPE[:DTYPE]", default=[],
                   help="an input tensor's shape, repeatable for several positional inputs "
                        "(e.g. --input 8x3x224x224, --input 8x1024:int64); overrides inputs from SPEC")
    p.add_argument("--optimizer", default="adamw", metavar="NAME[:k=v,...]",
                   help="sgd, sgd-momentum, adam, adamw, adagrad, rmsprop, adamax, adadelta, nadam, radam or none, "
                        "with options, e.g. sgd:momentum=0.9 or adam:amsgrad=true (default: adamw)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="target device whose kernels and optimizer defaults are modelled (default: cuda), e.g. --device cpu")
    p.add_argument("--precision", default=default_precision, choices=tuple(precisions),
                   help=precision_help or
                   "fp32; bf16/fp16 (model cast); bf16-mixed/fp16-mixed (torch.autocast, fp32 master "
                   "weights; fp16 with a GradScaler); fp8 (a model: bf16-mixed with linear layers in "
                   "E4M3/E5M2) (default: fp32), e.g. --precision bf16-mixed")
    if mode:
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
    est.add_argument("--format", choices=FORMATS,
                     help="output format: table, json (schema in the README), markdown, csv (one row per module) "
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

    add_plan_parser(sub)
    return parser


def _atomic(path: str, write, suffix: str = ".tmp") -> None:
    """Call ``write(tmp)`` on a temp file beside ``path``, then rename it into place: never half-written."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise UserError(f"cannot write {path}: directory {directory} does not exist")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".estimator-", suffix=suffix)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)  # like any file the user writes, not mkstemp's 0600
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


FORMATS = ("table", "json", "markdown", "csv", "html")
_SUFFIX_FORMATS = {".txt": "table", ".json": "json", ".md": "markdown", ".markdown": "markdown", ".csv": "csv",
                   ".html": "html", ".htm": "html"}


def _pick_format(fmt: str | None, output: str | None) -> str:
    """--format, else the --output suffix (an unknown suffix is refused), else table."""
    if fmt:
        return fmt
    if output:
        suffix = os.path.splitext(output)[1].lower()
        if suffix not in _SUFFIX_FORMATS:
            raise UserError(f"--output {output}: unknown suffix {suffix or '(none)'!r}; use one of "
                            f"{', '.join(_SUFFIX_FORMATS)} or give --format")
        return _SUFFIX_FORMATS[suffix]
    return "table"


def _plot_format(path: str) -> str:
    """The image type ``--plot`` writes, from the suffix; refused (one line) unless matplotlib can write it."""
    from .render import PLOT_SUFFIXES, plot_formats

    suffix = os.path.splitext(path)[1].lower()
    available = plot_formats()
    if not available:
        raise UserError("--plot needs matplotlib: pip install 'estimator[plot]'")
    if suffix not in available:
        raise UserError(f"--plot {path}: unknown image suffix {suffix or '(none)'!r}; use one of "
                        f"{', '.join(s for s in PLOT_SUFFIXES if s in available)}")
    return suffix[1:]


def _text_width(output: str | None) -> int:
    """Columns for the text report: the terminal's (COLUMNS first) on stdout, 120 in a file or a pipe."""
    import shutil

    if output:
        return 120
    return max(60, shutil.get_terminal_size((120, 24)).columns)


def _load(args: argparse.Namespace, empty: bool = True):
    """The SPEC's model and inputs, from the options every spec-taking command has.

    ``empty``: build user factories without weights (library models always are).
    """
    from .specs import load_spec

    return load_spec(args.spec, args.input, batch=args.batch, seq=args.seq, image_size=args.image_size,
                     overrides=args.overrides, empty=empty)


class _Progress:
    """One self-rewriting status line on stderr while a long estimate runs; silent unless stderr is a terminal.

    It shows the stage (building, tracing forward with the module being traced, loss/backward/optimizer,
    tallying, memory, report) and the elapsed time, from 0.5 s on; the line is erased when done.
    The object is the ``progress`` callback of :func:`estimator.estimate`.
    """

    # seconds before the first line (a quick run shows nothing); ESTIMATOR_PROGRESS_DELAY=0 draws at once
    DELAY = float(os.environ.get("ESTIMATOR_PROGRESS_DELAY", "0.5"))
    TICK = 0.2

    def __init__(self, enabled: bool | None = None, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.stage = "starting"
        self.detail = ""
        self._t0 = 0.0
        self._stop = None
        self._thread = None
        self._lock = None
        self._undo: list = []
        self._shown = False

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self):
        if not self.enabled:
            return self
        import threading
        import time

        self._t0 = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="estimator-progress", daemon=True)
        if self.DELAY <= 0:
            self._draw()
        self._thread.start()
        for handler in logging.getLogger().handlers:  # log lines start on a clean line
            handler.addFilter(self._clear_filter)
            self._undo.append(lambda h=handler: h.removeFilter(self._clear_filter))
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        self._stop.set()
        self._thread.join()
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        self._clear()
        return False

    def set(self, stage: str, detail: str = "") -> None:
        self.stage, self.detail = stage, detail

    # -- drawing --------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.TICK):
            self._draw()

    def _draw(self) -> None:
        import time

        elapsed = time.monotonic() - self._t0
        if elapsed < self.DELAY:
            return
        detail = f" {self.detail}" if self.detail else ""
        line = f"estimator: {self.stage}{detail} [{elapsed:.0f} s]"
        width = 0
        try:
            width = int(os.environ.get("COLUMNS", "0")) - 1  # as shutil.get_terminal_size: COLUMNS first
        except ValueError:
            pass
        if width < 20:
            try:
                width = os.get_terminal_size(self.stream.fileno()).columns - 1
            except (OSError, ValueError, AttributeError):
                pass
        width = width if width >= 20 else 119  # a terminal that reports no size
        with self._lock:
            self.stream.write("\r\x1b[K" + line[:width])
            self.stream.flush()
            self._shown = True

    def _clear(self) -> None:
        with self._lock:
            if self._shown:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
                self._shown = False

    def _clear_filter(self, record) -> bool:
        self._clear()
        return True

    def __call__(self, stage: str, detail: str = "") -> None:
        """The ``progress`` callback of :func:`estimator.estimate`."""
        self.set(stage, detail)


def _run_estimate(args: argparse.Namespace) -> int:
    from .api import estimate

    if args.depth < 0:
        raise UserError(f"--depth must be >= 0, not {args.depth}")
    fmt = _pick_format(args.format, args.output)
    if fmt == "html" and not args.output and sys.stdout.isatty():
        raise UserError("--format html writes a page: add --output report.html (or redirect stdout to a file)")
    plot_fmt = _plot_format(args.plot) if args.plot else None
    with _Progress() as progress:
        progress.set("building the model")
        loaded = _load(args)
        report = estimate(loaded.model, loaded.inputs, optimizer=args.optimizer, loss_fn=loaded.loss_fn,
                          device=args.device, depth=args.depth, precision=args.precision, mode=args.mode,
                          checkpoint=args.checkpoint or None, model_name=loaded.title, progress=progress,
                          gpu=args.gpu)
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
            text = report.render(width=_text_width(args.output), operators=args.operators)
        if args.plot:
            from .render import plot

            _atomic(args.plot, lambda tmp: plot(report, tmp, fmt=plot_fmt), suffix="." + plot_fmt)
    _write(text, args.output)
    return 0


def _run_validate(args: argparse.Namespace) -> int:
    from .validate import validate

    loaded = _load(args, empty=False)  # it runs real steps: a factory's own weights, as before
    result = validate(loaded.model, loaded.inputs, optimizer=args.optimizer, loss_fn=loaded.loss_fn,
                      device=args.device, precision=args.precision,
                      steps=args.steps, tolerance=args.tolerance, force=args.force, peak_tflops=args.peak_tflops)
    _write(json.dumps(result.to_dict(), indent=2) if args.format == "json" else result.render(), None)
    return 0 if result.ok else 1


def _run_hardware(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from .hardware import GPUS, TABLE_HEADERS, table_rows

    if args.format == "json":
        text = json.dumps([g.to_json() for g in GPUS], indent=2)
    else:
        text = ("Dense peak TFLOP/s (no sparsity); memory: the datasheet's GB (10^9 bytes) and what torch reports "
                "(total_memory); --gpu FILE.json takes one entry of --format json for a card not listed\n" +
                tabulate(table_rows(), headers=TABLE_HEADERS, tablefmt="github" if args.format == "markdown"
                         else "simple", disable_numparse=True))
    _write(text, None)
    return 0


# -- estimator plan -------------------------------------------------------------------------------------------

EPILOG_PLAN = """examples:
  estimator plan examples/gpt.py:build --gpu H100 --gpus 8 --strategy fsdp
  estimator plan hf:llama --set num_hidden_layers=4 --seq 4096 --gpu A100-80GB --gpus 64 --strategy fsdp --tokens 20B
  estimator plan examples/llama.py:build --gpu H100 --gpus 16 --tp 2 --sequence-parallel --strategy fsdp --steps 10000
  estimator plan examples/gpt.py:build --gpu H100 --gpus 8 --strategy fsdp --precision fsdp-bf16 --reduce-dtype fp32
  estimator plan examples/gpt.py:build --gpu L4,H100 --gpus 4,8 --compare --checkpoint Block --format json
  estimator plan examples/gpt.py:build --gpu A100-40GB --gpus 64 --strategy zero3 --zero-semantics paper
  estimator plan examples/gpt.py:build --gpu RTX4090 --gpus 2 --strategy zero2 --offload optimizer --solve seq
"""
PLAN_PRECISIONS = ("fp32", "bf16", "fp16", "bf16-mixed", "fp16-mixed", "fsdp-bf16", "fsdp-fp16")
PLAN_STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "hsdp")
_COUNT_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "p": 1e15}


def parse_count(text: str) -> float:
    """``300B``, ``1.5T``, ``2e12``, ``10M``, ``500k`` -> a number."""
    s = str(text).strip().lower().replace("_", "").replace(",", "")
    mult = 1.0
    if s and s[-1] in _COUNT_SUFFIX:
        mult, s = _COUNT_SUFFIX[s[-1]], s[:-1]
    try:
        value = float(s) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count; write e.g. 300B, 1.5T, 2e12 or 10000") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number or a comma-separated list, e.g. 8 or 8,16") from None
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r} names no number")
    return values


def add_plan_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``estimator plan`` on ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    p = subparsers.add_parser(
        "plan", help="plan a run on N GPUs: memory per GPU, fits or not, largest batch, time "
                     "(e.g. estimator plan examples/gpt.py:build --gpu H100 --gpus 8 --strategy fsdp)",
        description="Plan one training step on a cluster: per-GPU memory under a data-parallel strategy "
                    "(DDP, FSDP2 and HSDP traced on PyTorch's own engines over a fake process group; ZeRO 1-3 "
                    "laid out by hand) and tensor parallelism, fits or not, the largest micro-batch that fits, "
                    "step time and time to train. The SPEC's inputs are ONE GPU's micro-batch.",
        epilog=EPILOG_PLAN, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(p, precisions=PLAN_PRECISIONS, default_precision="bf16-mixed", mode=False, precision_help=(
        "bf16-mixed/fp16-mixed (torch.autocast, fp32 master weights; the default: bf16-mixed, what most "
        "training runs use); fp32; bf16/fp16 (model cast); fsdp-bf16/fsdp-fp16 (FSDP2's MixedPrecisionPolicy: "
        "parameters gathered and activations computed in that dtype); with zero1-3 a *-mixed precision is "
        "DeepSpeed's bf16/fp16 mode (model cast, fp32 master weights), e.g. --precision fsdp-bf16"))
    p.add_argument("--gpu", required=True, metavar="NAME[,NAME]",
                   help="the GPU (see 'estimator hardware', or a JSON file with the fields of 'estimator hardware "
                        "--format json' for another card); several, comma-separated, plan each in one table, "
                        "e.g. --gpu H100 or --gpu A100-80GB,H100")
    p.add_argument("--gpus", type=_ints, default=[1], metavar="N[,N]",
                   help="number of GPUs (default: 1); several, comma-separated, plan each in one table, "
                        "e.g. --gpus 64 or --gpus 8,16,32")
    p.add_argument("--strategy", default="ddp", choices=PLAN_STRATEGIES,
                   help="data parallelism: ddp, fsdp (FSDP2 fully_shard), hsdp (sharded in a node, replicated "
                        "across nodes): traced on PyTorch's engines; zero1, zero2, zero3: laid out by hand "
                        "(default: ddp), e.g. --strategy fsdp")
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor-parallel degree inside a node (parallelize_module, Megatron's colwise/rowwise "
                        "pairs) (default: 1), e.g. --tp 2")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="with --tp: sequence parallelism (norms and the residual stream on sequence shards), "
                        "e.g. --tp 4 --sequence-parallel")
    p.add_argument("--reduce-dtype", choices=("fp32", "bf16", "fp16"),
                   help="with --precision fsdp-*: MixedPrecisionPolicy's reduce_dtype (default: the param dtype), "
                        "e.g. --reduce-dtype fp32")
    p.add_argument("--wrap", action="append", metavar="CLASS", default=[],
                   help="FSDP unit class (fully_shard on each instance and on the root); default: the class "
                        "of the largest list of repeated blocks, e.g. --wrap Block")
    p.add_argument("--offload", choices=("optimizer", "params"),
                   help="host memory: zero*: DeepSpeed's ZeRO-Offload (optimizer) or also the parameters "
                        "(params, zero3); fsdp/hsdp: FSDP2's CPUOffloadPolicy, e.g. --offload optimizer")
    p.add_argument("--zero-semantics", default="deepspeed", choices=("deepspeed", "paper"),
                   help="ZeRO accounting: deepspeed (its estimators: fp32 gradient partition, reduce bucket, "
                        "largest-layer buffer) or paper (Rajbhandari et al. 2020) (default: deepspeed), "
                        "e.g. --zero-semantics paper")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--tokens", type=parse_count, metavar="N",
                        help="training budget in tokens (suffixes K M B T), e.g. --tokens 300B")
    budget.add_argument("--samples", type=parse_count, metavar="N",
                        help="training budget in samples, e.g. --samples 1.2M")
    budget.add_argument("--steps", type=parse_count, metavar="N", help="training budget in steps, e.g. --steps 10000")
    p.add_argument("--mfu", type=float, metavar="F",
                   help="model FLOPs utilisation to assume for the time to train instead of the traced "
                        "schedule's step time, e.g. --mfu 0.4")
    p.add_argument("--solve", action="append", choices=("batch", "seq"), default=[],
                   help="also solve the longest sequence (seq) that fits; the largest micro-batch (batch) is "
                        "always solved, e.g. --solve seq")
    p.add_argument("--compare", action="store_true",
                   help="one row per strategy, without and with activation checkpointing (of --checkpoint or "
                        "the wrap class), with the recommended row (the fastest that fits), e.g. --compare")
    p.add_argument("--gpus-per-node", type=int, default=8, metavar="N",
                   help="GPUs per node: groups larger than this use the inter-node link (default: 8), "
                        "e.g. --gpus-per-node 4")
    p.add_argument("--interconnect", metavar="LINK",
                   help="link between the GPUs of a node (see estimator/hardware.py LINKS); default from the GPU, "
                        "e.g. --interconnect nvlink4")
    p.add_argument("--inter-node", metavar="LINK",
                   help="link between nodes, per GPU (each GPU's share of its node's NICs); default from the "
                        "GPU (A100: ib-hdr, H100: ib-ndr), e.g. --inter-node ib-ndr")
    p.add_argument("--reshard-after-forward", type=_bool, default=True, metavar="BOOL",
                   help="FSDP: free gathered parameters after forward (true, ZeRO-3-like) or keep them for "
                        "backward (false, ZeRO-2-like) (default: true), e.g. --reshard-after-forward false")
    p.add_argument("--rank", type=int, default=0, metavar="R",
                   help="the rank whose memory is planned (default: 0, which holds the most rows of unevenly "
                        "split tensors), e.g. --rank 7")
    p.add_argument("--format", default="table", choices=("table", "json", "markdown"),
                   help="output format, e.g. --format json")
    p.add_argument("--output", metavar="FILE", help="write to FILE instead of stdout, e.g. --output plan.json")
    p.set_defaults(run=_run_plan)
    return p


def _run_plan(args: argparse.Namespace) -> int:
    """The ``plan`` subcommand: a plan (or a table of plans) whatever the verdict, exit 0; user errors
    raise :class:`UserError` (one line, exit 2)."""
    from .plan import Planner

    if args.output and not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
        raise UserError(f"cannot write {args.output}: directory {os.path.dirname(os.path.abspath(args.output))} "
                        f"does not exist")
    gpus_names = [g.strip() for g in args.gpu.split(",") if g.strip()]
    if not gpus_names:
        raise UserError("--gpu names no GPU, e.g. --gpu H100")
    steps = int(args.steps) if args.steps is not None else None
    with _Progress() as progress:
        progress.set("building the model")
        loaded = _load(args)
        planner = Planner(loaded.model, loaded.inputs, gpu=gpus_names[0], optimizer=args.optimizer,
                          loss_fn=loaded.loss_fn, precision=args.precision, reduce_dtype=args.reduce_dtype,
                          wrap=args.wrap or None, device=args.device, gpus_per_node=args.gpus_per_node,
                          interconnect=args.interconnect, inter_node=args.inter_node,
                          zero_semantics=args.zero_semantics, model_name=loaded.title, progress=progress)
        budget = dict(tokens=args.tokens, samples=args.samples, steps=steps, mfu=args.mfu)
        if args.compare or len(gpus_names) > 1 or len(args.gpus) > 1:
            result = planner.compare(args.gpus, strategies=None if args.compare else [args.strategy], tp=args.tp,
                                     sequence_parallel=args.sequence_parallel, checkpoint=args.checkpoint or None,
                                     offload=args.offload, gpu=gpus_names, with_checkpointing=args.compare,
                                     **budget)
        else:
            result = planner.plan(args.strategy, args.gpus[0], tp=args.tp, sequence_parallel=args.sequence_parallel,
                                  checkpoint=args.checkpoint or None, offload=args.offload,
                                  solve=("batch", *args.solve), reshard_after_forward=args.reshard_after_forward,
                                  rank=args.rank, **budget)
        progress.set("writing the plan")
        if args.format == "json":
            text = json.dumps(result.to_dict(), indent=2)
        else:
            text = result.render("github" if args.format == "markdown" else "simple")
    _write(text, args.output)
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

"""``estimator plan``: its options (layouts, budget, links, searches) and what it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..errors import UserError
from .options import (add_common, add_compile_options, add_lora_option, load_model, precision_of, training_options,
                      zero_grad_of)
from .output import pick_format, plot_format, write_atomic, write_text
from .progress import Progress


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
PLAN_FORMATS = ("table", "json", "markdown", "html")
PLAN_STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "hsdp")
PLAN_PP_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zbv")  # estimator.plan.layout.PP_SCHEDULES
PLAN_CP_ROTATE = ("allgather", "alltoall")  # estimator.plan.layout.CP_ROTATES (imported lazily there)
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


def _reshard(text: str) -> bool | int:
    """true/false, or a number of ranks >= 2 (FSDP2's int: resharded to groups of that many after forward)."""
    return int(text) if text.strip().isdigit() and int(text) >= 2 else _bool(text)


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def _ints(text: str) -> list[int]:
    """``8``, ``8,16,32``, or a range ``1-64``: the powers of two from its first to its last number (each
    end included), the counts a "how many GPUs do I need?" question compares (and the parallel degrees a
    layout search compares: ``--tp 1-8``)."""
    values: list[int] = []
    try:
        for part in (v.strip() for v in text.split(",")):
            if not part:
                continue
            low, dash, high = part.partition("-")
            if not dash:
                values.append(int(part))
                continue
            lo, hi = int(low), int(high)
            if not 1 <= lo <= hi:
                raise argparse.ArgumentTypeError(f"{part!r} is not a range: write LOW-HIGH with 1 <= LOW <= HIGH, "
                                                 "e.g. 1-64")
            counts = {lo, hi} | {1 << k for k in range(hi.bit_length()) if lo <= 1 << k <= hi}
            values += sorted(counts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number, a comma-separated list or a range, "
                                         "e.g. 8, 8,16 or 1-64") from None
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r} names no number")
    return sorted(set(values), key=values.index)


def _add_model_parallel_options(p: argparse.ArgumentParser) -> None:
    """--tp, --sequence-parallel, --loss-parallel, --async-tp, --cp, --cp-rotate, --ep, --pp, --pp-schedule, --microbatches: how the model itself
    is split."""
    p.add_argument("--tp", type=_ints, default=[1], metavar="N[,N|LOW-HIGH]",
                   help="tensor-parallel degree inside a node (parallelize_module, Megatron's colwise/rowwise "
                        "pairs) (default: 1); several (a list, or a range: its ends and the powers of two between) compare layouts, "
                        "e.g. --tp 2, --tp 1,2,4 or --tp 1-8")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="with --tp: sequence parallelism (norms and the residual stream on sequence shards), "
                        "e.g. --tp 4 --sequence-parallel")
    p.add_argument("--loss-parallel", action="store_true",
                   help="with --tp: the head's logits stay sharded by vocabulary and the cross-entropy runs under "
                        "torch's loss_parallel() (torchtitan's default), e.g. --tp 8 --loss-parallel")
    p.add_argument("--async-tp", action="store_true",
                   help="with --tp, --sequence-parallel and --compile: asynchronous TP, sequence parallelism's "
                        "all-gathers and reduce-scatters pipelined with their matmuls (torch.compile's "
                        "micro-pipeline pass, torchtitan's enable_async_tensor_parallel), e.g. --tp 8 "
                        "--sequence-parallel --compile --async-tp")
    p.add_argument("--cp", type=_ints, default=[1], metavar="N[,N|LOW-HIGH]",
                   help="context-parallel degree: each sequence split over N ranks, attention as torch's ring "
                        "attention (context_parallel, load-balanced causal); FSDP2 shards over dp x cp "
                        "(default: 1); several compare layouts, e.g. --cp 4 or --cp 1,2,4")
    p.add_argument("--cp-rotate", default=None, choices=PLAN_CP_ROTATE,
                   help="with --cp: the ring's key/value exchange, torchtitan's context_parallel_rotate_method "
                        "(default: allgather), e.g. --cp-rotate alltoall")
    p.add_argument("--ep", type=_ints, default=[1], metavar="N[,N|LOW-HIGH]",
                   help="expert-parallel degree of mixture-of-experts layers: each layer's experts split over N "
                        "ranks borrowed from the sharded data-parallel, cp and tp ones, tokens dispatched by "
                        "all-to-all (torchtitan's ExpertParallel, etp 1; balanced routing assumed; fsdp or hsdp) "
                        "(default: 1); several compare layouts, e.g. --ep 8 or --ep 1,8")
    p.add_argument("--etp", type=int, default=1, metavar="N",
                   help="with --ep and --tp: the experts' tensor-parallel degree, torchtitan's "
                        "expert_tensor_parallel_degree: 1 (default: ep borrows the tp ranks, each routing its share "
                        "of the tokens) or the --tp degree (each expert split over the tp ranks, ep borrowing the "
                        "data-parallel ranks only), e.g. --etp 2")
    p.add_argument("--pp", type=_ints, default=[1], metavar="N[,N|LOW-HIGH]",
                   help="pipeline-parallel stages (torch.distributed.pipelining; the stack of blocks split by layer "
                        "as torchtitan splits it; ddp, fsdp or hsdp inside each stage) (default: 1); several "
                        "compare layouts, e.g. --pp 4 or --pp 1,2,4")
    p.add_argument("--pp-schedule", default=None, choices=PLAN_PP_SCHEDULES,
                   help="with --pp: the schedule; interleaved-1f1b and zbv hold two stages per rank, as torchtitan's "
                        "default (default: 1f1b), e.g. --pp-schedule interleaved-1f1b")
    p.add_argument("--microbatches", type=int, default=0, metavar="M",
                   help="with --pp: micro-batches the local batch is split into (default: one sample each, as "
                        "torchtitan), e.g. --microbatches 8")


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
    add_common(p, precisions=PLAN_PRECISIONS, mode=False, precision_help=(
        "bf16-mixed/fp16-mixed (torch.autocast, fp32 master weights); fp32; bf16/fp16 (model cast); "
        "fsdp-bf16/fsdp-fp16 (FSDP2's MixedPrecisionPolicy: parameters gathered and activations computed in that "
        "dtype); with zero1-3 a *-mixed precision is DeepSpeed's bf16/fp16 mode (model cast, fp32 master weights)"))
    p.add_argument("--gpu", required=True, metavar="NAME[,NAME]",
                   help="the GPU (see 'estimator hardware', or a JSON file with the fields of 'estimator hardware "
                        "--format json' for another card); several, comma-separated, plan each in one table, "
                        "e.g. --gpu H100 or --gpu A100-80GB,H100")
    p.add_argument("--gpus", type=_ints, default=[1], metavar="N[,N|LOW-HIGH]",
                   help="number of GPUs (default: 1); several, comma-separated, or a range LOW-HIGH (its ends and the "
                        "powers of two between), plan each in one table with the fewest that fit, the fastest and the cheapest in GPU-hours, "
                        "e.g. --gpus 64, --gpus 8,16,32 or --gpus 1-64")
    p.add_argument("--strategy", default=None, choices=PLAN_STRATEGIES,
                   help="data parallelism: ddp, fsdp (FSDP2 fully_shard), hsdp (sharded in a node, replicated "
                        "across nodes): traced on PyTorch's engines; zero1, zero2, zero3: laid out by hand "
                        "(default: ddp; under --compare every strategy unless one is given), e.g. --strategy fsdp")
    _add_model_parallel_options(p)
    _add_engine_options(p)
    p.add_argument("--wrap", action="append", metavar="CLASS", default=[],
                   help="FSDP unit class (fully_shard on each instance and on the root); default: the class "
                        "of the largest list of repeated blocks, e.g. --wrap Block")
    p.add_argument("--offload", choices=("optimizer", "params"),
                   help="host memory: zero*: DeepSpeed's ZeRO-Offload (optimizer) or also the parameters "
                        "(params, zero3); fsdp/hsdp: FSDP2's CPUOffloadPolicy, e.g. --offload optimizer")
    p.add_argument("--zero-semantics", default=None, choices=("deepspeed", "paper"),
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
    add_compile_options(p)
    add_lora_option(p)
    p.add_argument("--quantize", choices=("int4", "int4-dq"),
                   help="with --lora: QLoRA's frozen 4-bit base (bitsandbytes NF4; int4-dq: double quantization), "
                        "planned under --strategy ddp, e.g. --lora r=16 --quantize int4-dq")
    p.add_argument("--compare", action="store_true",
                   help="one row per strategy (or per --gpus count of --strategy), without and with activation "
                        "checkpointing (of --checkpoint or the wrap class), the fastest marked, e.g. --compare")
    p.add_argument("--gpus-per-node", type=int, default=8, metavar="N",
                   help="GPUs per node: groups larger than this use the inter-node link (default: 8), "
                        "e.g. --gpus-per-node 4")
    p.add_argument("--interconnect", metavar="LINK",
                   help="link between the GPUs of a node (see estimator/hardware.py LINKS); default from the GPU, "
                        "e.g. --interconnect nvlink4")
    p.add_argument("--inter-node", metavar="LINK",
                   help="link between nodes, per GPU (each GPU's share of its node's NICs); default from the "
                        "GPU (A100: ib-hdr, H100: ib-ndr), e.g. --inter-node ib-ndr")
    p.add_argument("--reshard-after-forward", type=_reshard, default=None, metavar="BOOL|N",
                   help="FSDP: free gathered parameters after forward (true, ZeRO-3-like), keep them for backward "
                        "(false, ZeRO-2-like) or reshard them to groups of N ranks (default: true, false with --pp "
                        "as torchtitan's default policy), e.g. --reshard-after-forward false")
    p.add_argument("--rank", type=int, default=0, metavar="R",
                   help="the rank whose memory is planned (default: 0, which holds the most rows of unevenly "
                        "split tensors), e.g. --rank 7")
    _add_outputs(p)
    p.set_defaults(run=run_plan)
    return p


def _add_outputs(p: argparse.ArgumentParser) -> None:
    """--format, --output and --plot of ``estimator plan``."""
    p.add_argument("--format", choices=PLAN_FORMATS,
                   help="output format: table, json, markdown or html (a page: the verdict, per-GPU memory by "
                        "layout, the step time with its exposed communication) (default: from the --output "
                        "suffix, else table), e.g. --format json")
    p.add_argument("--output", metavar="FILE",
                   help="write to FILE instead of stdout; the suffix picks the format when --format is not given: "
                        ".txt, .json, .md or .html, e.g. --output plan.html")
    p.add_argument("--plot", metavar="FILE",
                   help="draw the plan (needs matplotlib): per-GPU memory by layout against the GPU's capacity and "
                        "the step time with its exposed communication; .png, .svg or .pdf, e.g. --plot plan.png")


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    """What the data-parallel engines are given: float8 gathers, FSDP2's reduce dtype, the gradient sync of an
    accumulating loop."""
    p.add_argument("--float8-all-gather", action="store_true",
                   help="with --float8 tensorwise and fsdp/hsdp: FSDP2 gathers the float8 Linears' weights in float8 "
                        "(torchao's enable_fsdp_float8_all_gather), e.g. --float8 tensorwise --float8-all-gather")
    p.add_argument("--reduce-dtype", choices=("fp32", "bf16", "fp16"),
                   help="with --precision fsdp-*: MixedPrecisionPolicy's reduce_dtype (default: the param dtype), "
                        "e.g. --reduce-dtype fp32")
    p.add_argument("--gradient-as-bucket-view", action="store_true",
                   help="ddp: DistributedDataParallel(gradient_as_bucket_view=True), the gradients views into its "
                        "all-reduce buckets (no copy of their own), e.g. --strategy ddp --gradient-as-bucket-view")
    p.add_argument("--grad-sync", choices=("last", "every"),
                   help="with --grad-accum: the data-parallel engine syncs the gradients on the last micro-batch "
                        "(default: DDP's no_sync, FSDP2's set_requires_gradient_sync) or after every one (Composer's "
                        "loop, accelerate's sync_each_batch: FSDP2 keeps no unsharded gradients), e.g. --grad-sync every")


def _refuse_unused(args: argparse.Namespace) -> None:
    """Options that act only beside another are refused without it (one line, as --sequence-parallel without
    --tp), then given their defaults: --pp-schedule and --microbatches without --pp, --cp-rotate without --cp,
    --zero-semantics without a ZeRO layout, --wrap under DDP alone, --reshard-after-forward but for one FSDP plan."""
    # --compare: every strategy, or the one given (--gpus 1-8 --compare --strategy fsdp: how many GPUs under FSDP)
    strategies = ({args.strategy} if args.strategy else None) if args.compare else {args.strategy or "ddp"}
    given = [flag for flag, value in (("--pp-schedule", args.pp_schedule), ("--microbatches", args.microbatches or None))
             if value is not None]
    if given and max(args.pp) == 1:
        raise UserError(f"{' and '.join(given)} shape pipeline parallelism: add --pp 2 (or more)")
    if args.cp_rotate is not None and max(args.cp) == 1:
        raise UserError("--cp-rotate is context parallelism's key/value exchange: add --cp 2 (or more)")
    if args.zero_semantics is not None and strategies is not None and not strategies & {"zero1", "zero2", "zero3"}:
        raise UserError("--zero-semantics accounts for ZeRO's layouts: use --strategy zero1, zero2 or zero3 (or "
                        "--compare)")
    if args.wrap and strategies == {"ddp"}:
        raise UserError("--wrap picks FSDP2's (and ZeRO-3's) units, which DDP has none of: use --strategy fsdp, hsdp "
                        "or zero3, or drop --wrap")
    if args.reshard_after_forward is not None and (args.compare or not strategies & {"fsdp", "hsdp"}):
        raise UserError("--reshard-after-forward is FSDP2's choice for one plan: use --strategy fsdp or hsdp without "
                        "--compare")
    if args.gradient_as_bucket_view and (args.compare or strategies != {"ddp"}):
        raise UserError("--gradient-as-bucket-view is DistributedDataParallel's option for one plan: use --strategy "
                        "ddp without --compare")
    if args.grad_sync is not None and (args.grad_accum or 1) == 1:
        raise UserError("--grad-sync says when gradient accumulation syncs the gradients: add --grad-accum N (N > 1)")
    if args.checkpoint_policy != "full" and not args.checkpoint and not args.compare:  # (--compare: its rows')
        raise UserError("--checkpoint-policy picks which instances of --checkpoint CLASS are recomputed: add "
                        "--checkpoint CLASS")
    args.pp_schedule, args.cp_rotate = args.pp_schedule or "1f1b", args.cp_rotate or "allgather"
    args.zero_semantics = args.zero_semantics or "deepspeed"
    args.strategies = sorted(strategies) if strategies is not None else None
    args.strategy = args.strategy or "ddp"


def run_plan(args: argparse.Namespace) -> int:
    """The ``plan`` subcommand: a plan (or a table of plans) whatever the verdict, exit 0; user errors
    raise :class:`UserError` (one line, exit 2)."""
    from ..plan import Planner

    fmt = pick_format(args.format, args.output, PLAN_FORMATS)
    if fmt == "html" and not args.output and sys.stdout.isatty():
        raise UserError("--format html writes a page: add --output plan.html (or redirect stdout to a file)")
    plot_fmt = plot_format(args.plot) if args.plot else None
    if args.output and not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
        raise UserError(f"cannot write {args.output}: directory {os.path.dirname(os.path.abspath(args.output))} "
                        f"does not exist")
    gpus_names = [g.strip() for g in args.gpu.split(",") if g.strip()]
    if not gpus_names:
        raise UserError("--gpu names no GPU, e.g. --gpu H100")
    if args.steps is not None and args.steps != int(args.steps):
        raise UserError(f"--steps must be a whole number of optimizer steps, not {args.steps:g}")
    steps = int(args.steps) if args.steps is not None else None
    _refuse_unused(args)
    with Progress() as progress:
        progress.set("building the model")
        loaded = load_model(args)
        optimizer, grad_accum = training_options(args)
        planner = Planner(loaded.model, loaded.inputs, gpu=gpus_names[0], optimizer=optimizer,
                          loss_fn=loaded.loss_fn, precision=precision_of(args), reduce_dtype=args.reduce_dtype,
                          wrap=args.wrap or None, device=args.device, gpus_per_node=args.gpus_per_node,
                          interconnect=args.interconnect, inter_node=args.inter_node,
                          zero_semantics=args.zero_semantics, model_name=loaded.title, progress=progress,
                          keep_output=args.keep_output, grad_accum=grad_accum,
                          checkpoint_policy=args.checkpoint_policy, compile=args.compile,
                          float8=args.float8, float8_all_gather=args.float8_all_gather, cuda_torch=args.cuda_torch,
                          lora=args.lora, quantize=args.quantize, clip_grad_norm=args.clip_grad_norm, ema=args.ema,
                          zero_grad=zero_grad_of(args), grad_sync=args.grad_sync or "last")
        budget = dict(tokens=args.tokens, samples=args.samples, steps=steps, mfu=args.mfu)
        degrees = dict(tp=args.tp, pp=args.pp, cp=args.cp, ep=args.ep)
        if args.compare or len(gpus_names) > 1 or len(args.gpus) > 1 or any(len(v) > 1 for v in degrees.values()):
            if "seq" in args.solve:  # (its rows searched none: silently dropped)
                raise UserError("--solve seq answers for one layout, not a comparison's rows: drop --solve seq, or "
                                "plan the layout alone")
            result = planner.compare(args.gpus, strategies=args.strategies,
                                     sequence_parallel=args.sequence_parallel, loss_parallel=args.loss_parallel,
                                     async_tp=args.async_tp, pp_schedule=args.pp_schedule,
                                     microbatches=args.microbatches, cp_rotate=args.cp_rotate,
                                     checkpoint=args.checkpoint or None, etp=args.etp,
                                     offload=args.offload, gpu=gpus_names, with_checkpointing=args.compare,
                                     **degrees, **budget)
        else:
            one = {k: v[0] for k, v in degrees.items()}
            result = planner.plan(args.strategy, args.gpus[0], sequence_parallel=args.sequence_parallel,
                                  loss_parallel=args.loss_parallel, async_tp=args.async_tp,
                                  pp_schedule=args.pp_schedule, microbatches=args.microbatches,
                                  cp_rotate=args.cp_rotate, checkpoint=args.checkpoint or None, offload=args.offload,
                                  solve=("batch", *args.solve), reshard_after_forward=args.reshard_after_forward,
                                  rank=args.rank, etp=args.etp, **one, **budget,
                                  gradient_as_bucket_view=args.gradient_as_bucket_view)
        progress.set("writing the plan")
        if fmt == "json":
            text = json.dumps(result.to_dict(), indent=2)
        elif fmt == "html":
            text = result.to_html()
        else:
            text = result.render("github" if fmt == "markdown" else "simple")
        if args.plot:
            write_atomic(args.plot, lambda tmp: result.plot(tmp, fmt=plot_fmt), suffix="." + plot_fmt)
    write_text(text, args.output)
    return 0

"""The options every command shares (the SPEC, sizes, ``--set``, ``--input``, optimizer, device,
precision, mode, checkpointing, the training loop) and the model they load.
"""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from ..errors import UserError
from ..specs import DEFAULT_SEQ, FALLBACK_SEQ


PRECISIONS = ("fp32", "bf16", "fp16", "bf16-mixed", "fp16-mixed", "fp8")
# The one default of every command that trains (estimate, validate, plan): how models are trained today; models
# are served with their weights cast (from_pretrained(..., dtype=torch.bfloat16)), so inference and generation
# default to bf16
DEFAULT_PRECISION = "bf16-mixed"
SERVING_PRECISION = "bf16"
DEFAULT_OPTIMIZER = "adamw"
MODES = ("train", "inference", "generate")


def add_common(p: argparse.ArgumentParser, *, precisions: Sequence[str] = PRECISIONS,
                precision_help: str | None = None, mode: bool = True, target_torch: bool = True,
                serving: bool = False) -> None:
    """The options of every spec-taking command; ``mode``: estimate's modes and what-ifs (compile, quantize,
    LoRA); ``serving``: the modes alone (--mode, --prompt-len, --new-tokens, --kv-cache: validate's)."""
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
    p.add_argument("--optimizer", metavar="NAME[:k=v,...]",
                   help="sgd, sgd-momentum, adam, adamw, adagrad, rmsprop, adamax, adadelta, nadam, radam, adafactor, "
                        "adamw8bit (bitsandbytes' 8-bit AdamW), muon (torch.optim.Muon on the hidden matrices, "
                        "AdamW on the rest) or none, "
                        f"with options, e.g. sgd:momentum=0.9 or adam:amsgrad=true (default: {DEFAULT_OPTIMIZER}; "
                        "training only)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="target device whose kernels and optimizer defaults are modelled (default: cuda), e.g. --device cpu")
    if target_torch:  # (validate runs the installed torch)
        p.add_argument("--cuda-torch", metavar="MAJOR.MINOR", dest="cuda_torch",
                       help="the torch release that will run the step on the GPU, which decides its kernels (cuDNN "
                            "or flash attention, ...), e.g. --cuda-torch 2.7 (default: the one installed here)")
    p.add_argument("--precision", choices=tuple(precisions),
                   help=(precision_help or
                         "fp32; bf16/fp16 (model cast); bf16-mixed/fp16-mixed (torch.autocast, fp32 master "
                         "weights; fp16 with a GradScaler); fp8 (a model: bf16-mixed with linear layers in "
                         "E4M3/E5M2)") + f" (default: {DEFAULT_PRECISION}, the same in estimate, validate and "
                   "plan: how models are trained" + (f"; {SERVING_PRECISION} for --mode inference and generate, as "
                                                     "models are served" if mode or serving else "")
                   + "), e.g. --precision fp32")
    if mode or serving:
        add_mode_options(p)
    if mode:
        add_compile_options(p)
        p.add_argument("--quantize", choices=("int8", "int4", "int4-dq"),
                       help="--mode inference or generate: the weights of the Linear layers quantized as "
                            "bitsandbytes lays them out (int8: LLM.int8(); int4: NF4), the headline sized with "
                            "them; training with --lora: QLoRA's frozen 4-bit base (int4-dq: double "
                            "quantization), e.g. --quantize int4")
        add_lora_option(p)
    p.add_argument("--checkpoint", action="append", metavar="CLASS", default=[],
                   help="what-if: run every instance of this module class under activation checkpointing "
                        "and show the memory saved and FLOPs added; repeatable, e.g. --checkpoint Block")
    p.add_argument("--checkpoint-policy", default="full", metavar="POLICY",
                   help="which --checkpoint instances and ops are recomputed: full (every instance, everything), "
                        "layer:N (every N-th instance), op (torchtitan's per-op policy: the attention and every "
                        "other matmul output saved) (default: full), e.g. --checkpoint-policy layer:2")
    add_loop_options(p)
    p.add_argument("--debug", action="store_true", help="show the full traceback of errors")


def add_mode_options(p: argparse.ArgumentParser) -> None:
    """What runs: a training step, a forward, or generate() with its prompt, new tokens and cache."""
    p.add_argument("--mode", default="train", choices=MODES,
                   help="train: one training step; inference: forward only under torch.no_grad() (no labels "
                        "fed: the model computes no loss); generate: transformers' generate() with its KV "
                        "cache, the prefill and one decode step (with --prompt-len and --new-tokens) "
                        "(default: train), e.g. --mode generate")
    p.add_argument("--prompt-len", type=int, metavar="P",
                   help="--mode generate: tokens in the prompt (the prefill's length; hf: specs only, in place "
                        "of --seq), e.g. --prompt-len 2048")
    p.add_argument("--new-tokens", type=int, metavar="N",
                   help="--mode generate: tokens generated after the prompt (the cache holds P + N - 1 at the "
                        "last decode step), e.g. --new-tokens 512")
    p.add_argument("--kv-cache", choices=("dynamic", "static"), default=None,
                   help="--mode generate: transformers' DynamicCache (grown token by token, generate()'s "
                        "default) or StaticCache (allocated for P + N - 1 tokens at the first step, "
                        "cache_implementation='static') (default: dynamic), e.g. --kv-cache static")


def add_loop_options(p: argparse.ArgumentParser) -> None:
    """The training loop as it is written: the output's lifetime, gradient accumulation, gradient clipping."""
    p.add_argument("--keep-output", action="store_true",
                   help="the training loop holds the model's output through backward and the optimizer step "
                        "(out = model(x)); by default it is dropped once the loss is computed "
                        "(loss = model(x).loss: HF Trainer, Lightning, torchtitan); training only, e.g. --keep-output")
    p.add_argument("--grad-accum", type=int, metavar="N",
                   help="micro-batches per optimizer step, gradients accumulated (the inputs are one micro-batch; "
                        "default: 1; training only), e.g. --grad-accum 8")
    p.add_argument("--clip-grad-norm", type=float, metavar="MAX",
                   help="the loop clips the gradients' norm to MAX before the optimizer step "
                        "(torch.nn.utils.clip_grad_norm_; HF Trainer's max_grad_norm, torchtitan's max_norm; "
                        "default: no clipping; training only), e.g. --clip-grad-norm 1.0")
    p.add_argument("--ema", type=float, metavar="DECAY",
                   help="the loop keeps a moving average of the weights (torch.optim.swa_utils.AveragedModel; "
                        "timm's and diffusers' EMA), updated after each step, counted with the optimizer state "
                        "(default: none; training only), e.g. --ema 0.9999")
    p.add_argument("--zero-grad", choices=("after-step", "before-backward", "in-place"), default=None,
                   help="where the loop calls optimizer.zero_grad(): after-step (after optimizer.step(), or at the "
                        "top of the loop before the forward: HF Trainer, torchtitan, nanoGPT), before-backward "
                        "(after the loss, before loss.backward(): Lightning's automatic optimization), which keeps "
                        "the previous step's gradients through the forward, or in-place (set_to_none=False: the "
                        "gradients kept allocated, zeroed) (default: after-step; training only), "
                        "e.g. --zero-grad before-backward")


def add_lora_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lora", metavar="r=R,alpha=A,...",
                   help="LoRA fine-tuning as peft runs it: adapters of rank R on the targets (module names "
                        "joined by +, default all-linear: every Linear but the output head), the rest frozen; "
                        "keys r, alpha, dropout, targets, e.g. --lora r=16,alpha=32,targets=q_proj+v_proj")


def add_compile_options(p: argparse.ArgumentParser) -> None:
    """--compile and --float8 (estimate and plan): the kernels the step runs (see docs/compile.md)."""
    p.add_argument("--compile", nargs="?", const="block", choices=("block", "model"), default=None,
                   help="the step as torch.compile (Inductor, default mode) runs it, beside the eager step: block "
                        "(each block of the stack of identical blocks, as torchtitan compiles; the default when no "
                        "value is given) or model (the whole forward, as nanoGPT), e.g. --compile")
    p.add_argument("--float8", choices=("tensorwise", "rowwise"),
                   help="float8 training as torchao's convert_to_float8_training runs it (the Linear layers "
                        "torchtitan converts; needs torchao), e.g. --float8 tensorwise")


def precision_of(args: argparse.Namespace) -> str:
    """--precision, else the default of the command's mode (see DEFAULT_PRECISION)."""
    if args.precision:
        return args.precision
    return DEFAULT_PRECISION if getattr(args, "mode", "train") == "train" else SERVING_PRECISION


def training_options(args: argparse.Namespace) -> tuple[str, int]:
    """(optimizer, grad_accum) of a training command, their defaults filled in; a command that does not train
    (``--mode inference`` or ``generate``) refuses the options of the training loop in one line, rather than
    ignoring them."""
    mode = getattr(args, "mode", "train")
    if mode != "train":
        given = [flag for flag, value in (("--optimizer", args.optimizer), ("--keep-output", args.keep_output or None),
                                          ("--grad-accum", args.grad_accum),
                                          ("--clip-grad-norm", args.clip_grad_norm), ("--ema", args.ema),
                                          ("--zero-grad", getattr(args, "zero_grad", None)))
                 if value is not None]
        if given:
            raise UserError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to training steps; "
                            f"--mode {mode} has no optimizer and no training loop: drop {' and '.join(given)}")
    if args.grad_accum is not None and args.grad_accum < 1:
        raise UserError(f"--grad-accum must be >= 1, not {args.grad_accum}")
    return args.optimizer or DEFAULT_OPTIMIZER, args.grad_accum or 1


def zero_grad_of(args: argparse.Namespace) -> str:
    """--zero-grad as the API spells it (after_step, before_backward, in_place)."""
    return (getattr(args, "zero_grad", None) or "after-step").replace("-", "_")


def generation_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--mode generate``'s keyword arguments (new_tokens, kv_cache), --new-tokens required; {} in other modes."""
    if args.mode != "generate":
        return {}
    if args.new_tokens is None:
        raise UserError("--mode generate needs --new-tokens N (the tokens generated after the prompt), "
                        "e.g. --new-tokens 256")
    return dict(new_tokens=args.new_tokens, kv_cache=args.kv_cache or "dynamic")


def load_model(args: argparse.Namespace, empty: bool = True):
    """The SPEC's model and inputs, from the options every spec-taking command has.

    ``empty``: build user factories without weights (library models always are).  ``--mode inference`` and
    ``generate`` load the inputs without labels (the model computes no loss); ``generate`` takes the prompt's
    length from ``--prompt-len``.
    """
    from ..specs import load_spec

    mode = getattr(args, "mode", "train")
    if args.input:
        sized = [flag for flag, value in (("--batch", args.batch), ("--seq", args.seq),
                                          ("--image-size", args.image_size)) if value is not None]
        if sized:
            raise UserError(f"--input gives the input shapes whole: drop {' and '.join(sized)} (or size them in "
                            f"--input, e.g. --input 8x1024:int64)")
    seq = args.seq
    if mode == "generate":
        if args.prompt_len is not None and args.seq is not None:
            raise UserError("--mode generate takes the prompt's length from --prompt-len: drop --seq")
        if args.prompt_len is not None:
            if args.prompt_len < 1:
                raise UserError(f"--prompt-len must be >= 1, not {args.prompt_len}")
            if not args.spec.startswith("hf:"):  # (load_spec sizes hf: prompts; a callable returns its own)
                raise UserError(f"--prompt-len sizes hf: prompts; {args.spec} returns its own: drop --prompt-len "
                                "and size the prompt in the callable (--set)")
        seq = args.prompt_len if args.prompt_len is not None else seq
    else:
        given = [flag for flag, value in (("--prompt-len", getattr(args, "prompt_len", None)),
                                          ("--new-tokens", getattr(args, "new_tokens", None)),
                                          ("--kv-cache", getattr(args, "kv_cache", None))) if value is not None]
        if given:
            raise UserError(f"{' and '.join(given)} size generation: add --mode generate")
    return load_spec(args.spec, args.input, batch=args.batch, seq=seq, image_size=args.image_size,
                     overrides=args.overrides, empty=empty, labels=mode == "train",
                     new_tokens=getattr(args, "new_tokens", None) if mode == "generate" else None)

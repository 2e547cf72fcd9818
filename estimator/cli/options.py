"""The options every command shares (the SPEC, sizes, ``--set``, ``--input``, optimizer, device,
precision, mode, checkpointing, the training loop) and the model they load.
"""

from __future__ import annotations

import argparse
from typing import Sequence

from ..specs import DEFAULT_SEQ, FALLBACK_SEQ


PRECISIONS = ("fp32", "bf16", "fp16", "bf16-mixed", "fp16-mixed", "fp8")


def add_common(p: argparse.ArgumentParser, *, precisions: Sequence[str] = PRECISIONS, default_precision: str = "fp32",
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
    p.add_argument("--checkpoint-policy", default="full", metavar="POLICY",
                   help="which --checkpoint instances and ops are recomputed: full (every instance, everything), "
                        "layer:N (every N-th instance), op (torchtitan's per-op policy: the attention and every "
                        "other matmul output saved) (default: full), e.g. --checkpoint-policy layer:2")
    p.add_argument("--keep-output", action="store_true",
                   help="the training loop holds the model's output through backward and the optimizer step "
                        "(out = model(x)); by default it is dropped once the loss is computed "
                        "(loss = model(x).loss: HF Trainer, Lightning, torchtitan), e.g. --keep-output")
    p.add_argument("--grad-accum", type=int, default=1, metavar="N",
                   help="micro-batches per optimizer step, gradients accumulated (the inputs are one micro-batch; "
                        "default: 1), e.g. --grad-accum 8")
    p.add_argument("--debug", action="store_true", help="show the full traceback of errors")


def load_model(args: argparse.Namespace, empty: bool = True):
    """The SPEC's model and inputs, from the options every spec-taking command has.

    ``empty``: build user factories without weights (library models always are).
    """
    from ..specs import load_spec

    return load_spec(args.spec, args.input, batch=args.batch, seq=args.seq, image_size=args.image_size,
                     overrides=args.overrides, empty=empty)

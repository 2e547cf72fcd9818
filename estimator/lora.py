"""LoRA fine-tuning as peft runs it, and QLoRA (LoRA over bitsandbytes' 4-bit base weights, :mod:`.qlora`).

``--lora r=16,alpha=32,dropout=0.05,targets=q_proj+v_proj`` (API ``lora=``): each target Linear layer gets
peft's adapters (peft 0.21, ``tuners/lora/layer.py`` ``Linear`` and, over a 4-bit base, ``tuners/lora/bnb.py``
``Linear4bit``): ``lora_A`` (``in -> r``) and ``lora_B`` (``r -> out``), no bias, in float32 (peft's
``autocast_adapter_dtype=True`` upcasts them whatever the model's dtype), dropout when ``dropout > 0``, scaling
``alpha / r``.  Every other parameter is frozen (peft's ``bias="none"``).  The forward, as peft writes it::

    result = base_layer(x)                       # (4-bit base: result = result.clone())
    x = x.to(lora_A.weight.dtype)                # when the dtypes differ (4-bit base: not under autocast)
    result = result + lora_B(lora_A(dropout(x))) * scaling
    result = result.to(result's dtype before)    # (4-bit base: the LoRA output cast first, then added)

``targets``: module names (a path's last part or a dotted suffix of it, as peft's ``target_modules`` list matches
them) joined by ``+``, or ``all-linear`` (the default, peft's ``"all-linear"`` and the QLoRA paper's choice: every
Linear but a transformers model's output embeddings; a model of any other kind has every Linear adapted, as peft
does).  The model given is not changed: :func:`prepare_finetune` returns a copy of its module tree with
the replaced layers (parameters shared, not copied).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .errors import UserError
from .layers import linear_dims, linear_layers
from .precision import keep_dtype


@dataclass(frozen=True)
class LoraSpec:
    r: int = 8
    alpha: float = 8.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("all-linear",)

    def describe(self) -> str:
        return (f"LoRA r={self.r}, alpha={self.alpha:g}, dropout={self.dropout:g} on "
                f"{'all-linear' if self.targets == ('all-linear',) else '+'.join(self.targets)}")


def parse_lora(spec: Any) -> LoraSpec | None:
    """``"r=16,alpha=32,dropout=0.05,targets=q_proj+v_proj"``, a mapping of the same keys, a :class:`LoraSpec`,
    or None."""
    if spec is None or isinstance(spec, LoraSpec):
        return spec
    if isinstance(spec, str):
        items = {}
        for item in filter(None, (s.strip() for s in spec.split(","))):
            key, eq, value = item.partition("=")
            if not eq:
                raise UserError(f"--lora option {item!r} is not key=value "
                                f"(e.g. --lora r=16,alpha=32,targets=q_proj+v_proj)")
            items[key.strip()] = value.strip()
        spec = items
    if not isinstance(spec, dict):
        raise UserError(f"lora must be a string like 'r=16,alpha=32' or a dict, not {type(spec).__name__}")
    unknown = sorted(set(spec) - {"r", "alpha", "dropout", "targets"})
    if unknown:
        raise UserError(f"--lora takes r, alpha, dropout and targets, not {', '.join(unknown)}")
    try:
        r = int(spec.get("r", 8))
        alpha = float(spec.get("alpha", r))
        dropout = float(spec.get("dropout", 0.0))
    except ValueError as exc:
        raise UserError(f"--lora: {exc}; r is an integer, alpha and dropout numbers") from exc
    targets = spec.get("targets", "all-linear")
    targets = tuple(t for t in (targets.split("+") if isinstance(targets, str) else targets) if t)
    if r < 1 or not 0 <= dropout < 1 or not targets:
        raise UserError("--lora needs r >= 1, 0 <= dropout < 1 and at least one target")
    return LoraSpec(r, alpha, dropout, targets)


class LoraLinear(nn.Module):
    """peft's LoRA layer around ``base_layer`` (see the module docstring); ``quantized``: peft's bitsandbytes
    4-bit variant of its forward."""

    def __init__(self, base_layer: nn.Module, in_features: int, out_features: int, spec: LoraSpec, quantized: bool):
        super().__init__()
        self.base_layer, self.quantized = base_layer, quantized
        device = next(base_layer.parameters()).device
        self.lora_dropout = nn.Dropout(spec.dropout) if spec.dropout > 0 else nn.Identity()
        self.lora_A = nn.Linear(in_features, spec.r, bias=False, device=device, dtype=torch.float32)
        self.lora_B = nn.Linear(spec.r, out_features, bias=False, device=device, dtype=torch.float32)
        for p in (self.lora_A.weight, self.lora_B.weight):
            keep_dtype(p)
        self.scaling = spec.alpha / spec.r

    @property
    def weight(self) -> torch.Tensor:
        """The base layer's, as peft's ``BaseTunerLayer.weight`` gives it (T5 and Mamba read their layers' weights)."""
        return self.base_layer.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return getattr(self.base_layer, "bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.base_layer(x)
        dtype = self.lora_A.weight.dtype
        if self.quantized:  # peft/tuners/lora/bnb.py Linear4bit.forward
            result = result.clone()
            convert = not torch.is_autocast_enabled()
            if convert:
                expected, x = result.dtype, x.to(dtype) if x.dtype != dtype else x
            output = self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling
            if convert:
                output = output.to(expected)
            return result + output
        before = result.dtype  # peft/tuners/lora/layer.py Linear.forward
        x = x.to(dtype) if x.dtype != dtype else x
        result = result + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling
        return result.to(before)


def peft_head(model: nn.Module) -> nn.Module | None:
    """The layer peft's ``"all-linear"`` leaves out (``_maybe_include_all_linear_layers``): a transformers model's
    ``get_output_embeddings()``; None for any other model (a user's module, a sequence classifier: peft adapts every
    Linear then, the head too)."""
    if not any(c.__name__ == "PreTrainedModel" for c in type(model).__mro__):
        return None
    try:
        return model.get_output_embeddings()
    except Exception:  # noqa: BLE001 (a model whose getter raises: no head left out)
        return None


def _named(path: str, target: str) -> bool:
    """peft's ``target_modules`` match: the module's name or a dotted suffix of its path (``self_attn.qkv_proj``)."""
    return path == target or path.endswith("." + target)


# peft refuses LoRA on these modules of state-space models (``_check_lora_target_modules_mamba``)
MAMBA_TYPES, MAMBA_REFUSED = {"falcon_h1", "mamba", "mamba2", "falcon_mamba", "nemotron_h"}, {"out_proj", "conv1d"}


def _peft_refuses(model: nn.Module, chosen: list[tuple[str, nn.Module]]) -> None:
    """peft's refusal of ``out_proj`` and ``conv1d`` on Mamba-based models, in one line (all-linear included)."""
    kind = getattr(getattr(model, "config", None), "model_type", None)
    names = sorted({p.rsplit(".", 1)[-1] for p, _ in chosen} & MAMBA_REFUSED) if kind in MAMBA_TYPES else []
    if names:
        raise UserError(f"--lora: peft refuses {', '.join(names)} on Mamba-based models (model_type {kind!r}); name "
                        f"the targets without them, e.g. targets=in_proj+x_proj")


def _targets(model: nn.Module, spec: LoraSpec) -> list[tuple[str, nn.Linear]]:
    linears = [(n, m) for n, m in linear_layers(model, head=True)]
    if spec.targets == ("all-linear",):
        head = peft_head(model)
        linears = [(n, m) for n, m in linears if m is not head]
        if not linears:
            raise UserError("--lora adapts the Linear layers but the output head (peft's all-linear), and this model "
                            "has none besides its head: name the layers with targets=NAME+NAME")
        _peft_refuses(model, linears)
        return linears
    chosen = [(p, m) for p, m in linears if any(_named(p, t) for t in spec.targets)]
    missing = sorted(t for t in spec.targets if not any(_named(p, t) for p, _ in chosen))
    if missing:
        names = sorted({p.rsplit(".", 1)[-1] for p, _ in linears})
        raise UserError(f"--lora targets {', '.join(missing)} name no Linear layer of the model; its Linear layers "
                        f"are named {', '.join(names[:12])}{' ...' if len(names) > 12 else ''}")
    _peft_refuses(model, chosen)
    return chosen


def _replaced(root: nn.Module, replacements: dict[str, nn.Module]) -> nn.Module:
    """A copy of ``root``'s module tree with the modules at ``replacements``' paths swapped (a path and paths
    below it: the deeper ones are swapped in the replacement): the modules on those paths are shallow copies with
    their own child dicts; everything else (parameters included) is shared."""
    base = replacements.get("", root)
    below: dict[str, dict[str, nn.Module]] = {}
    for path, module in replacements.items():
        if path:
            head, _, rest = path.partition(".")
            below.setdefault(head, {})[rest] = module
    if not below:
        return base
    top = copy.copy(base) if base is root else base
    top._modules = dict(base._modules)
    for name, swaps in below.items():
        top._modules[name] = _replaced(base._modules[name], swaps)
    return top


def prepare_finetune(model: nn.Module, lora: LoraSpec | None, quantize: dict | None) -> tuple[nn.Module, list[str]]:
    """The model as the fine-tuning run trains it: ``quantize`` (``compute_dtype``, ``quant_dtype``,
    ``double_quant``: :func:`.qlora.quantize_linears`) swaps the Linear layers for 4-bit ones, ``lora`` wraps its
    targets with adapters and freezes the rest; and the notes that say so."""
    if lora is None:
        raise UserError("a 4-bit base is frozen: add --lora (QLoRA) to train adapters over it")
    adapted = next((path for path, m in model.named_modules() if _has_adapters(m)), None)
    if adapted is not None:  # (they were adapted again, peft's layers and all: 11,584 trainable where peft has 10,496)
        raise UserError(f"--lora: the model already carries adapters ({adapted or '(root)'} is "
                        f"{type(model.get_submodule(adapted)).__name__}): estimate it as it is, without --lora")
    swaps: dict[str, nn.Module] = {}
    notes = [lora.describe() + " (peft's layers, float32 adapters)"]
    if quantize is not None:
        from .qlora import quantize_linears

        swaps = dict(quantize_linears(model, **quantize))
        notes.append(f"4-bit base (bitsandbytes NF4, {'double' if quantize['double_quant'] else 'single'} "
                     f"quantization, compute in {str(quantize['compute_dtype']).removeprefix('torch.')}) in "
                     f"{len(swaps)} Linear layers (two weights per stored byte); "
                     f"the output head and the other parameters as they are, frozen")
    targets = _targets(model, lora)
    if lora.targets == ("all-linear",) and peft_head(model) is None:
        notes.append("peft's all-linear leaves out only a transformers model's output embeddings: every Linear of "
                     "this model adapted, its last (a classifier head) too")
    for path, m in targets:
        swaps[path] = LoraLinear(swaps.get(path, m), *linear_dims(m), lora, path in swaps)
    trained = {id(p) for path, _ in targets for p in (swaps[path].lora_A.weight, swaps[path].lora_B.weight)}
    out = _replaced(model, swaps)
    frozen = [p for p in out.parameters() if id(p) not in trained and p.requires_grad]
    if frozen:  # the base's own parameters are the user's: frozen in the copy only
        out = _frozen(out, {id(p) for p in frozen})
    return out, notes


def _has_adapters(m: nn.Module) -> bool:
    """A module peft made (its tuner layers: LoRA, DoRA, LoHa, IA3, ...; a PeftModel), or one of this module's."""
    if isinstance(m, LoraLinear):
        return True
    return any(c.__module__.startswith("peft.") and c.__name__ in ("BaseTunerLayer", "PeftModel")
               for c in type(m).__mro__)


def _frozen(model: nn.Module, ids: set[int]) -> nn.Module:
    """``model``'s tree with each parameter in ``ids`` replaced by a frozen copy (same tensor data, no gradient;
    a parameter tied across modules stays one parameter)."""
    copies: dict[int, nn.Parameter] = {}
    swaps = {}
    for path, m in model.named_modules(remove_duplicate=False):
        own = {n: p for n, p in m._parameters.items() if p is not None and id(p) in ids}
        if own and path not in swaps:
            copy_m = copy.copy(m)
            copy_m._parameters = dict(m._parameters)
            for n, p in own.items():
                if id(p) not in copies:
                    copies[id(p)] = nn.Parameter(p.detach(), requires_grad=False)
                copy_m._parameters[n] = copies[id(p)]
            swaps[path] = copy_m
    return _replaced(model, swaps)


def finetuned(model: nn.Module, lora: Any, quantize: str | None, precision: Any,
              mode: str = "train", device: str = "cuda",
              optimizer: Any = None) -> tuple[nn.Module, list[str], str | None]:
    """(the model as a LoRA or QLoRA run trains it (:func:`prepare_finetune`), what that assumed, the
    ``quantize`` left for inference's what-ifs); ``precision``: the step's :class:`~.precision.Precision` (QLoRA
    computes in its low dtype; the statistics keep the dtype the weights had, the cast one or float32)."""
    from .quantize import TRACED_4BIT, check_scheme

    spec = parse_lora(lora)
    instances = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
    if spec is not None and any(isinstance(o, torch.optim.Optimizer) for o in instances):
        # (its parameters are the base's, which the run freezes; it was refused as "built over other tensors")
        raise UserError("--lora adds the adapters the optimizer trains, so an optimizer instance built before "
                        "cannot hold them: give the optimizer by name or class (optimizer='adamw', or "
                        "torch.optim.AdamW with optimizer_kwargs)")
    if mode != "train" and quantize in TRACED_4BIT:  # served over bitsandbytes' 4-bit weights: traced with them
        from .qlora import CUDA_FUSED_ROWS, quantize_linears

        double = quantize == "int4-dq"
        # bitsandbytes on CUDA: its fused kernel for at most 4 rows (a decode step of batch <= 4), else the weight
        # dequantized for F.linear; on the CPU its inference kernel (weights repacked at the first call) for any
        fused = CUDA_FUSED_ROWS if device == "cuda" else math.inf
        swaps = quantize_linears(model, compute_dtype=precision.cast or precision.autocast or torch.float32,
                                 quant_dtype=precision.cast or torch.float32, double_quant=double, fused_rows=fused)
        return _replaced(model, swaps), [
            f"4-bit weights (bitsandbytes NF4, {'double' if double else 'single'} quantization) in {len(swaps)} "
            f"Linear layers, traced as they run: " + (
                "bitsandbytes' fused kernel (the 4-bit weight read as it is) for at most 4 rows of input, e.g. a "
                "decode step of batch <= 4, else the weight dequantized to the compute dtype for F.linear (its "
                "choice between 5 and 1,536 rows depends on the GPU)" if device == "cuda" else
                "bitsandbytes' CPU inference kernel (the 4-bit weight read as it is; its repacking at the first "
                "call not counted)") + "; the output head and the other parameters as they are"], quantize
    if mode != "train" or (spec is None and quantize is None):
        return model, [], quantize
    check_scheme(quantize, mode, spec is not None)
    base = None
    if quantize is not None:
        base = {"compute_dtype": precision.cast or precision.autocast or torch.float32,
                "quant_dtype": precision.cast or torch.float32, "double_quant": quantize == "int4-dq"}
    model, notes = prepare_finetune(model, spec, base)
    return model, notes, None

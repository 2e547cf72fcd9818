"""float8 training as torchao runs it (``--float8 tensorwise|rowwise``, ``float8=``).

torchao's ``convert_to_float8_training`` swaps ``nn.Linear`` modules for ``Float8Linear``: each forward casts
its input and weight to float8 (e4m3) with a scale from their absolute maximum (one per tensor, or one per row
for ``rowwise``), multiplies them with ``torch._scaled_mm``, and in backward casts the output's gradient
(e5m2 for tensorwise) for the two gradient GEMMs.  The estimate runs exactly that code on a copy of the model
whose floating-point weights are on the ``meta`` device (the user's model is never touched), so the casts, the
amax reductions, the float8 copies saved for backward and the float8 GEMMs are in the capture like any other
op; the FLOPs are counted per dtype (``float8_e4m3fn`` apart from ``bfloat16``) and the GEMMs timed at the
GPU's float8 tensor-core rate.

Which layers convert: torchtitan's filter, the default of its float8 converter: every ``nn.Linear`` whose
input and output sizes are multiples of 16 (what ``_scaled_mm`` accepts), except the output head
(``lm_head`` / ``output``: its logits stay in high precision).  Under FSDP2 the plan may gather those weights
in float8 (``--float8-all-gather``: torchao's ``enable_fsdp_float8_all_gather``, traced as FSDP2 runs torchao's
``fsdp_pre_all_gather`` / ``fsdp_post_all_gather`` hooks).  Not modelled: delayed scaling.
torchao is an optional extra (``pip install 'estimator[float8]'``).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from typing import Any

import torch

from .errors import UserError, switch_choice

RECIPES = ("tensorwise", "rowwise")
HEADS = ("lm_head", "output")  # torchtitan's float8 filter_fqns default: the output projection


def check_recipe(float8: Any) -> str | None:
    """``float8`` as given: None/False (off), True or ``"tensorwise"``, ``"rowwise"``."""
    return switch_choice(float8, "float8", RECIPES, "tensorwise")


def check_float8_gpu(recipe: str | None, gpu: Any) -> None:
    """A one-line error for float8 training on a GPU without float8 tensor cores (``torch._scaled_mm`` runs on
    compute capability 8.9 and later: an A100, V100 or T4 has none, and the real step fails there)."""
    if recipe is not None and gpu is not None and not gpu.peak.get("fp8"):
        raise UserError(f"--float8 needs float8 tensor cores (compute capability 8.9+: L4, L40S, H100, H200, B200) "
                        f"and {gpu.name} has none, so torch._scaled_mm fails there: drop --float8 or pick such a GPU")


def _meta_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``model`` whose floating-point parameters and buffers are on the meta device (no memory);
    integer and boolean buffers (position ids, masks) are copied with their values."""
    memo: dict[int, Any] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in memo:
            continue
        if t.is_floating_point() or t.is_complex():
            twin = torch.empty_like(t, device="meta")
            memo[id(t)] = torch.nn.Parameter(twin, requires_grad=t.requires_grad) \
                if isinstance(t, torch.nn.Parameter) else twin
    return copy.deepcopy(model, memo)


def converted(model: torch.nn.Module, recipe: str, fsdp_all_gather: bool = False) -> tuple[torch.nn.Module, list[str]]:
    """A meta copy of ``model`` with torchao's Float8Linear in place of the Linear layers torchtitan converts,
    and what to say about it.  ``fsdp_all_gather``: torchao's ``enable_fsdp_float8_all_gather`` (tensorwise only):
    FSDP2 casts each converted weight to float8 before its all-gather (torchao's ``fsdp_pre_all_gather``), so
    the gathered weights and their all-gather are one byte per element."""
    try:
        with _quiet("torchao", "torch.utils._pytree"):  # its import warns about optional CUDA kernels and triton
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as exc:
        raise UserError(f"--float8 needs torchao: pip install torchao (or pip install 'estimator[float8]') "
                        f"({type(exc).__name__}: {exc})") from None
    twin = _meta_copy(model)
    kept: list[str] = []

    def convert(module: torch.nn.Module, fqn: str) -> bool:
        if not isinstance(module, torch.nn.Linear):
            return False
        if fqn.rpartition(".")[2] in HEADS or module.in_features % 16 or module.out_features % 16:
            kept.append(fqn)
            return False
        return True

    if fsdp_all_gather and recipe != "tensorwise":
        raise UserError(f"--float8-all-gather needs --float8 tensorwise (torchao gathers float8 weights with one "
                        f"scale per tensor), not {recipe}")
    config = Float8LinearConfig.from_recipe_name(recipe)
    if fsdp_all_gather:
        import dataclasses

        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    convert_to_float8_training(twin, config=config, module_filter_fn=convert)
    done = sum(1 for m in twin.modules() if type(m).__name__ == "Float8Linear")
    if not done:
        raise UserError("--float8 converts no layer: no nn.Linear with input and output sizes that are multiples "
                        "of 16 (other than the output head); drop --float8")
    notes = [f"float8 {recipe} (torchao {_version()} convert_to_float8_training): {done} Linear layers in float8, "
             f"{len(kept)} kept in high precision ({', '.join(kept[:3])}{', ...' if len(kept) > 3 else ''}: "
             f"the output head, or sizes not multiples of 16)"]
    if fsdp_all_gather:
        notes.append("float8 all-gather: FSDP2 gathers the float8 Linears' weights in float8 "
                     "(torchao's enable_fsdp_float8_all_gather), their scales computed per step from the shards")
    return twin, notes


@contextlib.contextmanager
def _quiet(*names: str):
    """These loggers at ERROR inside (library import-time warnings that are not the user's business)."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _version() -> str:
    try:
        import torchao

        return torchao.__version__
    except (ImportError, AttributeError):  # pragma: no cover
        return "?"

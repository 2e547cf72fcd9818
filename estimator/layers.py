"""Layers that training recipes treat apart from the others: the output head (Muon leaves it to AdamW, peft's
``all-linear`` LoRA target and bitsandbytes' quantization leave it as it is)."""

from __future__ import annotations

import torch


def output_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The model's output layer: the Linear its ``get_output_embeddings()`` (transformers) or ``get_classifier()``
    (timm) returns, else the last Linear registered when no Linear reads its width (nanoGPT's ``lm_head``,
    torchvision's ``fc`` and ``classifier[-1]``); None when neither finds one."""
    for getter in ("get_output_embeddings", "get_classifier"):
        fn = getattr(model, getter, None)
        if callable(fn):
            try:
                head = fn()
            except Exception:  # noqa: BLE001 (a model whose getter needs arguments or raises: not this route)
                head = None
            if isinstance(head, torch.nn.Linear):
                return head
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if linears and all(m.in_features != linears[-1].out_features for m in linears):
        return linears[-1]
    return None


def linear_dims(m: torch.nn.Module) -> tuple[int, int] | None:
    """(in, out) features of a Linear layer: ``nn.Linear``, or transformers' ``Conv1D`` (GPT-2, GPT, ...: a Linear
    whose weight is stored ``in x out``, which peft's LoRA and transformers' bitsandbytes integration take as one);
    None for any other module."""
    if isinstance(m, torch.nn.Linear):
        return m.in_features, m.out_features
    weight = getattr(m, "weight", None)
    if type(m).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) and weight.ndim == 2 and hasattr(m, "nf"):
        return int(weight.shape[0]), int(weight.shape[1])
    return None


def linear_layers(model: torch.nn.Module, head: bool = False) -> list[tuple[str, torch.nn.Module]]:
    """(path, module) of the model's Linear layers (:func:`linear_dims`) in registration order; the output head
    (:func:`output_head`) only with ``head``."""
    found = output_head(model)
    return [(n, m) for n, m in model.named_modules() if linear_dims(m) is not None and (head or m is not found)]

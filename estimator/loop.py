"""The training loop's options as a caller gives them (:func:`estimator.estimate`, :func:`estimator.plan.plan`):
refused in one line where the estimate would otherwise ignore them or read them as something else, as the
command line refuses them."""

from __future__ import annotations

from typing import Any


def is_none(optimizer: Any) -> bool:
    """Whether ``optimizer`` asks for no optimizer (None, or the name ``"none"``)."""
    return optimizer is None or (isinstance(optimizer, str) and optimizer.split(":")[0].strip().lower() == "none")


def check_policy(checkpoint: Any, checkpoint_policy: Any) -> None:
    """A checkpointing policy given without classes to checkpoint (it would be ignored): a one-line error."""
    from .errors import UserError

    if checkpoint_policy != "full" and not checkpoint:
        raise UserError("checkpoint_policy chooses what the checkpointed classes recompute: give checkpoint= (the "
                        "classes, e.g. checkpoint='LlamaDecoderLayer'), or drop checkpoint_policy")


def check_loop(mode: str, optimizer: Any, optimizer_kwargs: Any, keep_output: Any, ema: Any,
               clip_grad_norm: Any) -> None:
    """Training-loop options that would be ignored, refused in one line: an optimizer, its options or the
    output's lifetime outside training (``--mode train``; the command line refuses them alike), an EMA, gradient
    clipping or optimizer options without an optimizer (the first two run around ``optimizer.step()``), and
    ``keep_output`` that is not a bool (``"no"`` was read as True)."""
    from .errors import UserError

    if not isinstance(keep_output, bool):
        raise UserError(f"keep_output is True (the loop holds the output through backward) or False, not "
                        f"{keep_output!r}")
    if mode != "train":
        named = isinstance(optimizer, str) and optimizer.strip().lower() in ("adamw", "none")  # (the default)
        given = [name for name, on in (("optimizer", optimizer is not None and not named),
                                        ("optimizer_kwargs", optimizer_kwargs is not None),
                                        ("keep_output", keep_output)) if on]
        if given:
            raise UserError(f"{', '.join(given)} shape{'s' if len(given) == 1 else ''} a training step; drop "
                            f"{'it' if len(given) == 1 else 'them'} for mode={mode!r}")
        return
    if is_none(optimizer):
        for name, value, what in (("ema", ema, "ema averages the weights after optimizer.step()"),
                                  ("clip_grad_norm", clip_grad_norm,
                                   "clip_grad_norm clips the gradients before optimizer.step()"),
                                  ("optimizer_kwargs", optimizer_kwargs, "optimizer_kwargs are the optimizer's options")):
            if value is not None:
                raise UserError(f"{what}, and optimizer is none: give an optimizer, or drop {name}")

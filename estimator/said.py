"""Warnings said once per call: one estimate or plan tallies several traces of the same step (a checkpoint
what-if, a plan's engine traces at several sizes), each of which would log the same warning again (an op without
a rule, parameters without a gradient: the CLI printed them twice under ``--checkpoint``).  Inside
:func:`once_per_call` (entered by every public entry point, :func:`estimator.caller.apart_from_caller`) a
message already logged is not logged again; outside it, every call logs."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator

_SAID: ContextVar[set[str] | None] = ContextVar("estimator_said", default=None)


@contextmanager
def once_per_call() -> Iterator[None]:
    """Inside the block (the outermost one counts), :func:`warn` logs each distinct message once."""
    if _SAID.get() is not None:
        yield
        return
    token = _SAID.set(set())
    try:
        yield
    finally:
        _SAID.reset(token)


def warn(log: logging.Logger, message: str, *args: Any) -> None:
    """``log.warning(message, *args)``, unless the same text was logged already inside :func:`once_per_call`."""
    said = _SAID.get()
    if said is not None:
        text = message % args if args else message
        if text in said:
            return
        said.add(text)
    log.warning(message, *args)

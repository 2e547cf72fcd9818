"""User-facing errors.

A :class:`UserError` is a mistake the user can fix (a bad spec, a shape that
does not fit the model, an unknown GPU name).  Its message is one line that
says what to fix; the CLI prints it without a traceback and exits with 2.
"""


class UserError(Exception):
    """An input problem the user can fix; the message says how."""


class UnsupportedModelError(UserError):
    """The model cannot be captured (e.g. data-dependent control flow on a model too large to run)."""


class DataDependentError(UnsupportedModelError):
    """The model reads tensor values in its forward and could be traced on real tensors only where
    that was not allowed (a fake-only trace, such as the planner's engines)."""

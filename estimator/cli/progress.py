"""The status line on stderr while a long command runs (a terminal only; nothing for pipes and files).
"""

from __future__ import annotations

import logging
import os
import sys



class Progress:
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

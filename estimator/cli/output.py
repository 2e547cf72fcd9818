"""Writing what a command made: atomically, only when the whole command succeeded; the format from
``--format`` or the ``--output`` suffix.
"""

from __future__ import annotations

import os
import sys
import tempfile

from ..errors import UserError


def write_atomic(path: str, write, suffix: str = ".tmp") -> None:
    """Call ``write(tmp)`` on a temp file beside ``path``, then rename it into place: never half-written."""
    directory = check_writable(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".estimator-", suffix=suffix)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}; choose another --output") from exc
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)  # like any file the user writes, not mkstemp's 0600
        write(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise UserError(f"cannot write {path}: {exc.strerror or exc}; choose another --output") from exc
        raise


def check_writable(path: str) -> str:
    """The directory ``path`` is written into, after the checks a write would fail (a directory of that name,
    a missing or unwritable directory), so that a command refuses its --output before it works; else a one-line
    error."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise UserError(f"cannot write {path}: directory {directory} does not exist")
    if os.path.isdir(path):
        raise UserError(f"cannot write {path}: it is a directory; give a file name")
    if not os.access(directory, os.W_OK):
        raise UserError(f"cannot write {path}: directory {directory} is not writable; choose another --output")
    return directory


def write_text(text: str, output: str | None) -> None:
    """Print, or write FILE atomically."""
    text = text if text.endswith("\n") else text + "\n"
    if not output:
        sys.stdout.write(text)
        return

    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)

    write_atomic(output, write)


FORMATS = ("table", "json", "markdown", "csv", "html")
_SUFFIX_FORMATS = {".txt": "table", ".json": "json", ".md": "markdown", ".markdown": "markdown", ".csv": "csv",
                   ".html": "html", ".htm": "html"}


def pick_format(fmt: str | None, output: str | None, formats: tuple[str, ...] = FORMATS) -> str:
    """--format, else the --output suffix (an unknown suffix is refused), else table; a --format that another
    format's suffix contradicts (``--format csv --output r.json``) is refused rather than written into a file
    whose name says otherwise.  ``formats``: the command's own (a suffix of another is refused)."""
    if output:
        check_writable(output)
    suffix = os.path.splitext(output)[1].lower() if output else ""
    named = _SUFFIX_FORMATS.get(suffix)
    if fmt:
        if named is not None and named != fmt:
            ours = [s for s, f in _SUFFIX_FORMATS.items() if f == fmt]
            stem = os.path.splitext(output)[0]
            raise UserError(f"--format {fmt} but --output {output} names a {named} file: drop --format (the suffix "
                            f"picks {named}) or write to {stem}{ours[0] if ours else '.' + fmt}")
        return fmt
    if output:
        suffixes = [s for s, f in _SUFFIX_FORMATS.items() if f in formats]
        if named is None or named not in formats:
            raise UserError(f"--output {output}: unknown suffix {suffix or '(none)'!r}; use one of "
                            f"{', '.join(suffixes)} or give --format")
        return named
    return "table"


def plot_format(path: str) -> str:
    """The image type ``--plot`` writes, from the suffix; refused (one line) unless matplotlib can write it."""
    from ..render import PLOT_SUFFIXES, plot_formats

    check_writable(path)
    suffix = os.path.splitext(path)[1].lower()
    available = plot_formats()
    if not available and suffix not in PLOT_SUFFIXES:  # (a suffix matplotlib would not write either: say that first)
        raise UserError(f"--plot {path}: unknown image suffix {suffix or '(none)'!r}; use one of "
                        f"{', '.join(PLOT_SUFFIXES)}")
    if not available:
        raise UserError("--plot needs matplotlib: pip install 'estimator[plot]'")
    if suffix not in available:
        raise UserError(f"--plot {path}: unknown image suffix {suffix or '(none)'!r}; use one of "
                        f"{', '.join(s for s in PLOT_SUFFIXES if s in available)}")
    return suffix[1:]


def text_width(output: str | None) -> int:
    """Columns for the text report: the terminal's (COLUMNS first) on stdout, 120 in a file or a pipe."""
    import shutil

    if output:
        return 120
    return max(60, shutil.get_terminal_size((120, 24)).columns)

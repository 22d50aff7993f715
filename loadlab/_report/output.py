"""Writing a report file (``--html``, ``--csv``, ``--junit``, ``--markdown``, ``--out``): one
place where a path that cannot be written becomes ``OutputError`` (exit 2, naming the flag, the
file and why) instead of a traceback and exit 1, which ``loadlab slo`` would read as FAIL.
Commands that run for long first check where they will write (``check_output``,
``check_folder``), so a bad path fails before the work, not after it.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> write_output(d, "--csv", lambda p: p.write_text("x"))
Traceback (most recent call last):
...
loadlab.errors.OutputError: --csv ...: is a directory; name a file, e.g. .../report.out
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadlab.errors import OutputError

__all__ = ["check_folder", "check_output", "write_output"]


def write_output(path: str | os.PathLike[str], flag: str, writer: Callable[[Path], Any]) -> Path:
    """Call ``writer(path)``; an ``OSError`` becomes ``OutputError`` naming ``flag`` and path."""
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{flag} {p}: is a directory; name a file, e.g. {p / 'report.out'}")
    try:
        writer(p)
    except OSError as exc:
        raise _cannot_write(flag, p, "", exc, "path") from exc
    return p


def check_folder(path: str | os.PathLike[str], flag: str) -> Path:
    """Create folder ``path`` and prove a file can be made in it, or raise ``OutputError``."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=p, prefix=".loadlab-probe-"):
            pass
    except OSError as exc:
        raise _cannot_write(flag, p, " there", exc, "folder") from exc
    return p


def check_output(path: str | os.PathLike[str], flag: str) -> Path:
    """Before a long command: ``path`` is not a folder and its folder is writable."""
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{flag} {p}: is a directory; name a file, e.g. {p / 'report.out'}")
    check_folder(p.parent, flag)
    return p


def _cannot_write(flag: str, p: Path, where: str, exc: OSError, other: str) -> OutputError:
    return OutputError(
        f"{flag} {p}: cannot write{where}: {exc.strerror or exc}; choose another {other}"
    )

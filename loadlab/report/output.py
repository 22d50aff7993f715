"""Writing a report file (``--html``, ``--csv``, ``--junit``, ``--markdown``, ``--out``): one
place where a path that cannot be written becomes ``OutputError`` (exit 2, naming the flag, the
file and why) instead of a traceback and exit 1, which ``loadlab slo`` would read as FAIL.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> write_output(d, "--csv", lambda p: p.write_text("x"))
Traceback (most recent call last):
...
loadlab.errors.OutputError: --csv ...: is a directory; name a file, e.g. .../report.out
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadlab.errors import OutputError

__all__ = ["write_output"]


def write_output(path: str | os.PathLike[str], flag: str, writer: Callable[[Path], Any]) -> Path:
    """Call ``writer(path)``; an ``OSError`` becomes ``OutputError`` naming ``flag`` and path."""
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{flag} {p}: is a directory; name a file, e.g. {p / 'report.out'}")
    try:
        writer(p)
    except OSError as exc:
        raise OutputError(
            f"{flag} {p}: cannot write: {exc.strerror or exc}; choose another path"
        ) from exc
    return p

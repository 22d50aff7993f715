"""Optional extras: a command that needs the reference server (torch, FastAPI, uvicorn) or
Locust checks for them before it does anything, and says which extra to install (exit 2),
instead of failing later with a server that "did not start" or a traceback (issue 17, item 12).

The harness alone (``pip install -e .``) runs every offline command and ``loadlab run
--endpoint URL``; these need more:

* ``server``: ``loadlab run`` and ``loadlab sweep`` without ``--endpoint`` (the embedded
  reference server), ``loadlab lab``, ``loadlab capacity --vs-measured``, ``loadlab-server``;
* ``locust``: locustfiles (``scenarios/chat.py``) and ``loadlab.locust``.

>>> EXTRAS["server"]
('torch', 'fastapi', 'uvicorn')
"""

from __future__ import annotations

import importlib.util

from loadlab.errors import MissingExtraError

__all__ = ["EXTRAS", "INSTALL", "missing", "require"]

EXTRAS: dict[str, tuple[str, ...]] = {
    "server": ("torch", "fastapi", "uvicorn"),
    "locust": ("locust",),
}
# torch==2.13.0 takes the CPU build from PyPI; on a GPU machine install your torch first
INSTALL = {
    "server": 'pip install torch==2.13.0 "loadlab[server]"  (CPU torch; on a GPU machine '
    "install the torch you want first and drop the pin)",
    "locust": 'pip install "loadlab[locust]"',
}


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` this environment cannot import."""
    return [m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]


def require(extra: str, what: str) -> None:
    """Raise ``MissingExtraError`` (exit 2) naming what needs ``extra`` and how to install it."""
    gone = missing(extra)
    if gone:
        raise MissingExtraError(
            f"{what} needs the {extra!r} extra, and {', '.join(gone)} "
            f"{'is' if len(gone) == 1 else 'are'} not installed; install it with: {INSTALL[extra]}"
        )

"""Every exception loadlab raises on purpose, in one tree.

The hierarchy::

    LoadlabError                      anything below; ``loadlab`` exits with code 2
    ├── UsageError (ValueError)       input that cannot be used; the message says the fix
    │   ├── ConfigError               a run setting or a command-line flag
    │   ├── WorkloadError             a workload parameter
    │   ├── TraceError                a trace file (file, line, what is wrong)
    │   ├── ScenarioError             a scenario file (file, key, value, fix)
    │   ├── ResultsError              a results file (or a journal) that cannot be read
    │   ├── OutputError               a file a command cannot write (flag, path, why)
    │   └── SLOError                  an SLO file (file, entry, fix)
    ├── MissingExtraError             an optional extra a command needs is not installed
    └── CalibrationError (RuntimeError)
                                      the endpoint's prompt tokens could not be measured

``UsageError`` stays a ``ValueError`` so code that validates with ``except ValueError`` (and
the dataclasses' ``__post_init__`` convention) keeps working. Anything that is *not* in this
tree and escapes a command is a bug: ``loadlab`` lets it print its traceback and exit 1,
never a usage message.

Failures on the request path are not exceptions at all: a timeout or a refused connection
becomes a failed ``RequestRecord`` with its outcome class (docs/harness.md).

>>> issubclass(SLOError, UsageError) and issubclass(SLOError, ValueError)
True
>>> str(ConfigError("--rate must be > 0; for closed-loop use --concurrency"))
'--rate must be > 0; for closed-loop use --concurrency'
"""

from __future__ import annotations

import importlib.util
import json
import tomllib
from pathlib import Path
from typing import Any

__all__ = [
    "EXTRAS",
    "INSTALL",
    "TOO_DEEP",
    "CalibrationError",
    "ConfigError",
    "LoadlabError",
    "MissingExtraError",
    "OutputError",
    "ResultsError",
    "SLOError",
    "ScenarioError",
    "TraceError",
    "UsageError",
    "WorkloadError",
    "at_least",
    "missing",
    "parse_json",
    "read_toml",
    "require",
]


class LoadlabError(Exception):
    """The root: every error loadlab raises on purpose (the CLI maps it to exit code 2)."""


class UsageError(LoadlabError, ValueError):
    """Input that cannot be used; the message names it and says how to fix it."""


class ConfigError(UsageError):
    """A run setting or a command-line flag (``RunConfig``, ``EndpointConfig``, a command)."""


class WorkloadError(UsageError):
    """A workload parameter that cannot be used; the message says which and how to fix it."""


class TraceError(UsageError):
    """A trace that cannot be read: names the file, the line and what is wrong."""


class ScenarioError(UsageError):
    """A scenario file that cannot be used; the message names the file, key, value and fix."""


class ResultsError(UsageError):
    """A results file that cannot be read: names the file and what is wrong."""


class OutputError(UsageError):
    """A file a command was asked to write and cannot: names the flag, the path and why."""


class SLOError(UsageError):
    """An SLO file that cannot be used: names the file, the entry and the fix."""


class MissingExtraError(LoadlabError):
    """A command needs an optional extra (torch and the server, Locust) that is missing; the
    message says which and the ``pip install`` line (``loadlab.errors``)."""


class CalibrationError(LoadlabError, RuntimeError):
    """The endpoint's token count could not be measured; the message says what to do."""


# A file nested thousands of levels deep (``[[[[...`` in JSON or TOML): the parsers recurse
# and raise RecursionError; every reader of a user's file says this instead (exit 2).
TOO_DEEP = (
    "nested too deeply to read (arrays or tables thousands of levels deep; no loadlab input "
    "nests more than a few)"
)


def parse_json(text: str, error: type[UsageError], where: str) -> Any:
    """``json.loads(text)``; text that is not JSON, or nests too deeply, raises ``error``
    naming ``where`` (a flag or a file) and the place of the fault.

    >>> parse_json('{"a": [1]}', ConfigError, "--extra-body")
    {'a': [1]}
    >>> parse_json('{"a": }', ConfigError, "--extra-body")
    Traceback (most recent call last):
    ...
    loadlab.errors.ConfigError: --extra-body: not valid JSON (Expecting value, line 1, column 7)
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(
            f"{where}: not valid JSON ({exc.msg}, line {exc.lineno}, column {exc.colno})"
        ) from None
    except RecursionError:
        raise error(f"{where}: {TOO_DEEP}") from None


def read_toml(path: Path, error: type[UsageError], what: str, where: str = "") -> dict[str, Any]:
    """The TOML file at ``path`` (``what`` it is, e.g. "SLO file"); a file that cannot be read,
    is not UTF-8, is not TOML or nests too deeply raises ``error``, its message starting with
    ``where`` (default: the path) and saying why."""
    where = where or str(path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise error(f"{where}: cannot read {what}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{where}: not valid TOML: {exc}") from None
    except RecursionError:
        raise error(f"{where}: {TOO_DEEP}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{where}: not UTF-8 text ({exc.reason}); save it as UTF-8") from None


# The harness's lower-bound checks on settings and records, worded once.


def at_least(
    name: str, value: float, lo: int, fix: str = "", *, error: type[ValueError] = ValueError
) -> None:
    """Raises ``error`` naming ``name``, ``lo`` and ``value`` (then ``fix``) when
    ``value < lo``.

    >>> from loadlab.errors import ConfigError
    >>> at_least("--batch", 8, 1, error=ConfigError)
    >>> at_least("turn", -1, 0)
    Traceback (most recent call last):
    ...
    ValueError: turn must be >= 0, got -1
    """
    if value < lo:
        raise error(f"{name} must be >= {lo}, got {value}{fix}")


# Optional extras: a command that needs the reference server (torch, FastAPI, uvicorn) or
# Locust checks for them before it does anything, and says which extra to install (exit 2),
# instead of failing later with a server that "did not start" or a traceback.


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

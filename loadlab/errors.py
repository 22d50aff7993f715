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

__all__ = [
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
    message says which and the ``pip install`` line (``loadlab.extras``)."""


class CalibrationError(LoadlabError, RuntimeError):
    """The endpoint's token count could not be measured; the message says what to do."""

"""loadlab: load testing and SLO evaluation for LLM inference endpoints.

The command line is ``loadlab`` (``loadlab --help``); the Python API is below, imported on
first use so that ``import loadlab`` stays light (docs/python-api.md)::

    import loadlab

    results = loadlab.read_results("reports/run.json")
    results.to_dataframe()                         # pandas, one row per request
    loadlab.evaluate(results, "examples/slo.toml").passed
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from loadlab._version import __version__

if TYPE_CHECKING:
    from loadlab.api import (
        EndpointConfig,
        Results,
        RunConfig,
        evaluate,
        read_results,
        run,
        run_sync,
        summarize,
        write_results,
    )

__all__ = [
    "EndpointConfig",
    "Results",
    "RunConfig",
    "__version__",
    "evaluate",
    "read_results",
    "run",
    "run_sync",
    "summarize",
    "write_results",
]

_LAZY = frozenset(__all__) - {"__version__"}


def __getattr__(name: str) -> Any:
    """The public API, imported from ``loadlab.api`` when first used."""
    if name in _LAZY:
        value = getattr(importlib.import_module("loadlab.api"), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'loadlab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY)

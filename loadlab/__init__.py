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

if TYPE_CHECKING:  # "X as X": re-exported, for type checkers and editors
    from loadlab._analysis.compare import compare as compare
    from loadlab._report.text import render_summary as render_summary
    from loadlab._report.text import render_verdict as render_verdict
    from loadlab.api import evaluate as evaluate
    from loadlab.api import run as run
    from loadlab.api import run_sync as run_sync
    from loadlab.api import summarize as summarize
    from loadlab.config import EndpointConfig as EndpointConfig
    from loadlab.config import RunConfig as RunConfig
    from loadlab.results import Results as Results
    from loadlab.results import read_results as read_results
    from loadlab.results import write_results as write_results

# public name -> the module that defines it (imported when the name is first used)
_HOMES = {
    "EndpointConfig": "loadlab.config",
    "RunConfig": "loadlab.config",
    "Results": "loadlab.results",
    "read_results": "loadlab.results",
    "write_results": "loadlab.results",
    "evaluate": "loadlab.api",
    "run": "loadlab.api",
    "run_sync": "loadlab.api",
    "summarize": "loadlab.api",
    "compare": "loadlab._analysis.compare",
    "render_summary": "loadlab._report.text",
    "render_verdict": "loadlab._report.text",
}
__all__ = ["__version__", *_HOMES]


def __getattr__(name: str) -> Any:
    """The public API, imported from its home module when first used."""
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'loadlab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))

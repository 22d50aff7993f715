"""The Python API for notebooks and scripts: run a load, read a run, summarise it, judge it.

These functions, ``read_results``/``write_results``/``Results`` (``loadlab.results``) and
``RunConfig``/``EndpointConfig`` (``loadlab.config``) make ``loadlab.__all__``, imported on
first use so that ``import loadlab`` loads nothing heavy::

    import loadlab

    results = loadlab.read_results("reports/run.json")
    df = results.to_dataframe()                       # pandas, one row per request
    summary = loadlab.summarize(results)              # what `loadlab report` prints, as data
    verdict = loadlab.evaluate(results, "examples/slo.toml")
    verdict.passed, verdict.exit_code

    cfg = loadlab.RunConfig(
        endpoints=(loadlab.EndpointConfig(url="http://127.0.0.1:8000", model="m"),),
        rate_rps=4, duration_s=60,
    )
    results = await loadlab.run(cfg)                  # in a notebook's event loop
    results = loadlab.run_sync(cfg)                   # in a script (workers > 1 too)

docs/python-api.md walks through it with an example that the test suite runs.

>>> from tests.helpers.synth import make_results
>>> evaluate(make_results(200, seed=0), {"objectives": ["error_rate <= 0.05"]}).passed
True
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadlab._analysis.metrics import DEFAULT_PERCENTILES
from loadlab.config import RunConfig
from loadlab.errors import ConfigError
from loadlab.results import Results

if TYPE_CHECKING:
    from loadlab._analysis.summary import RunSummary
    from loadlab._slo import SLOSpec, Verdict
    from loadlab._slo.spec import Policy

__all__ = ["evaluate", "run", "run_sync", "summarize"]


def summarize(results: Results, percentiles: Iterable[float] = DEFAULT_PERCENTILES) -> RunSummary:
    """The run's summary (counts, latency percentiles in ms, throughput) as frozen dataclasses:
    the figures of ``loadlab report``; ``.to_dict()`` is the results file's ``summary``."""
    from loadlab._analysis.summary import summarize as _summarize

    return _summarize(results, percentiles)


def evaluate(
    results: Results,
    slo: SLOSpec | Mapping[str, Any] | str | os.PathLike[str],
    *,
    inconclusive: Policy = "fail",
) -> Verdict:
    """Judge ``results`` against an SLO: an ``SLOSpec``, the path of an SLO file (TOML), or
    the file's content as a mapping (``{"objectives": ["ttft_ms.p95 <= 500"]}``).

    ``verdict.passed`` and ``verdict.exit_code`` (0 pass, 1 fail, 2 not valid evidence) are
    what ``loadlab slo`` reports; docs/slo-and-reports.md explains the verdicts."""
    from loadlab._slo import SLOSpec, load_slo, parse_slo
    from loadlab._slo import evaluate as _evaluate

    if isinstance(slo, SLOSpec):
        spec = slo
    elif isinstance(slo, Mapping):
        spec = parse_slo(slo)
    else:
        spec = load_slo(Path(slo))
    return _evaluate(results, spec, inconclusive=inconclusive)


def _one_endpoint(config: RunConfig, endpoint: str | None) -> RunConfig:
    """``config`` with the endpoint to load: the one named, else its only one (none: the
    embedded reference server)."""
    if endpoint is not None:
        for ep in config.endpoints:
            if ep.name == endpoint:
                return config.replace(endpoints=(ep,))
        names = ", ".join(ep.name for ep in config.endpoints) or "none"
        raise ConfigError(f"no endpoint named {endpoint!r} in the config; endpoints: {names}")
    if len(config.endpoints) > 1:
        raise ConfigError(
            f"the config has {len(config.endpoints)} endpoints; pick one with endpoint=NAME "
            "(loadlab run loads several)"
        )
    return config


async def run(config: RunConfig, *, endpoint: str | None = None) -> Results:
    """Run ``config``'s load against one endpoint in the running event loop and return the
    results; written to ``config.out`` when it is set. One process: ``workers`` must be 1.

    The same run as ``loadlab run`` with the same settings (``loadlab._runner.run``): prompts
    sized for the endpoint, a fresh seed unless ``config.seed`` is set (``results.config``
    records the one used)."""
    from loadlab._runner.run import run_here

    cfg = _one_endpoint(config, endpoint)
    return (await run_here(cfg, write=cfg.out is not None)).runs[0].results


def run_sync(config: RunConfig, *, endpoint: str | None = None) -> Results:
    """``run`` for code without an event loop (a script); it also spreads the load over
    ``config.workers`` processes. Not from inside a running loop: there, ``await run()``."""
    from loadlab._runner.run import run as run_config

    cfg = _one_endpoint(config, endpoint)
    return run_config(cfg, write=cfg.out is not None).runs[0].results

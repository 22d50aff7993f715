"""One run path: a ``RunConfig`` from start to results, for every caller.

``loadlab run`` parses its flags into a ``RunConfig`` and calls ``run``; ``loadlab.run_sync``
calls ``run`` and ``await loadlab.run(...)`` calls ``run_here`` (the same steps in a running
event loop); ``loadlab sweep`` prepares its endpoint once and runs each level with
``run_prepared``; the lab runs its parts with ``run_endpoint`` on one schedule. A run:

1. checks its input (workload, tokenizer, SLO file, scrape) before anything starts (``check``);
2. settles what all its endpoints and processes share (``settle``): the seed, drawn when none
   is given (so no run finds an earlier run's prompts in a server's prefix cache), and the
   cache-busting salt;
3. starts the embedded reference server when the config names no endpoint, and asks each
   endpoint about itself (``loadlab._runner.preflight``: its model when none is given, a
   request that cannot fit its context refused with the numbers);
4. checks every results path and starts its journal, before any request (``Outputs``);
5. sizes each endpoint's prompts once (``prepare``: ``loadlab._runner.prompt_sizing``); the
   sizing goes with the endpoint to whatever builds its requests, ``--workers`` processes too;
6. runs the endpoints one after another, or all at once on one schedule (``interleave``),
   each in this process or over ``workers`` processes (``loadlab._runner.fanout``);
7. writes the results files, judges each against the SLO file, compares several endpoints,
   and decides the exit code (``RunOutcome.exit_code``).

Example::

    outcome = run(cfg, log=print)          # the lines loadlab run prints on stderr go to log
    outcome.runs[0].results, outcome.exit_code
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from loadlab._runner import signals
from loadlab._runner.endpoint import LOCAL_START_DELAY_NS, ClientFactory, TokenEnds, run_endpoint
from loadlab._runner.fanout import BuildRequests, run_processes
from loadlab._runner.outputs import Outputs
from loadlab._runner.preflight import preflight
from loadlab._runner.prompt_sizing import size_prompts
from loadlab._runner.runner import run_async
from loadlab._runner.shard import shard_extra, shard_specs, wait_for_start
from loadlab.config import EndpointConfig, RunConfig
from loadlab.errors import ConfigError, UsageError, require
from loadlab.records import RequestSpec
from loadlab.results import Results
from loadlab.workloads import build_requests, validate_workload
from loadlab.workloads._base import with_run_salt
from loadlab.workloads._exact import Sizing

if TYPE_CHECKING:
    from loadlab._analysis.compare import Comparison
    from loadlab._slo import Verdict
    from loadlab.clients._server_info import ServerInfo

__all__ = [
    "EndpointRun",
    "Prepared",
    "RunOutcome",
    "check",
    "prepare",
    "run",
    "run_here",
    "run_prepared",
    "run_specs",
    "settle",
]

Log = Callable[[str], None]


def _silent(line: str) -> None:
    """The log of a caller that prints nothing (the Python API)."""


@dataclass(frozen=True)
class Prepared:
    """One endpoint, ready to be loaded: its prompt sizing, made once (``prepare``)."""

    endpoint: EndpointConfig
    sizing: Sizing | None

    def build(self, cfg: RunConfig) -> Iterable[RequestSpec]:
        """``cfg``'s requests as this endpoint is sent them (its sizing, its prompt text);
        with ``--shard K/N``, this shard's part of them."""
        return shard_specs(
            cfg, build_requests(cfg.replace(endpoints=(self.endpoint,)), self.sizing)
        )

    @property
    def token_ends(self) -> TokenEnds | None:
        """The target model's tokenizer when loadlab holds it: tokens per streamed chunk."""
        tokens = self.sizing.tokens if self.sizing is not None else None
        return tokens.token_ends if tokens is not None else None


@dataclass
class EndpointRun:
    """One endpoint's part of a run: its results, where they were written, its verdict."""

    endpoint: str
    results: Results
    path: Path | None = None  # its results file; None when the run wrote none
    misplaced: bool = False  # written elsewhere (a full disk), or nowhere: not the file asked for
    verdict: Verdict | None = None  # against the config's SLO file
    notes: list[str] = field(default_factory=list)  # what went wrong around it, to be said
    exit_code: int = 0


@dataclass
class RunOutcome:
    """What a run did, and the exit code ``loadlab run`` ends with: the worst of each
    endpoint's (0; the SLO verdict's 1 or 2; 2 when a results file could not be written; 3
    when no request succeeded), or 128 + the signal's number when a stop signal ended it."""

    config: RunConfig  # as run: the seed it drew, the embedded server it started
    runs: list[EndpointRun]
    comparison: Comparison | None = None
    comparison_files: tuple[Path, Path] | None = None
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False
    exit_code: int = 0


def check(cfg: RunConfig) -> None:
    """Bad workload, tokenizer, SLO or scrape input fails here, before any server starts."""
    validate_workload(cfg)
    if not cfg.endpoints:
        require("server", "the embedded reference server (no --endpoint)")
    if cfg.interleave and cfg.workers > 1:
        raise ConfigError("--interleave runs in one process; drop --workers")
    if cfg.scrape and importlib.util.find_spec("loadlab._runner.scrape") is None:
        raise ConfigError("--scrape needs loadlab._runner.scrape, which this build does not have")
    if cfg.slo:
        from loadlab._slo import load_slo

        load_slo(cfg.slo)


def settle(cfg: RunConfig, log: Log = _silent) -> RunConfig:
    """``cfg`` with what every endpoint and process of the run shares decided once: its seed
    (drawn now when none is given) and a cache-busting salt (``loadlab.workloads._prefix``)."""
    if cfg.seed is None:
        cfg = cfg.seeded()
        log(f"seed {cfg.seed} (drawn for this run; --seed {cfg.seed} repeats it)")
    return with_run_salt(cfg)


def prepare(cfg: RunConfig, endpoint: EndpointConfig, log: Log = _silent) -> Prepared:
    """``endpoint`` with its prompt sizing (which may ask it: never while a load runs)."""
    sizing = size_prompts(cfg, endpoint)
    if sizing is not None and sizing.warning:
        log(sizing.warning)
    return Prepared(endpoint, sizing)


def run_specs(
    cfg: RunConfig,
    endpoint: EndpointConfig,
    build: BuildRequests,
    *,
    client_factory: ClientFactory | None = None,
    progress: bool = False,
    kind: str = "run",
    journal: str | os.PathLike[str] | None = None,
    token_ends: TokenEnds | None = None,
) -> Results:
    """The load ``build(cfg)`` describes against ``endpoint``, in this process or over
    ``cfg.workers`` processes (each rebuilds it: ``build`` must give the same requests in every
    process); every process appends its finished records to ``journal`` when given. GPU
    telemetry (``--gpu-metrics``) is sampled beside it, its idle baseline taken first."""
    from loadlab._runner.telemetry import for_run

    ready_ms = wait_for_start(cfg)
    with for_run(cfg, endpoint.name) as gpu:
        if cfg.workers > 1:
            results = run_processes(
                cfg, endpoint, build, client_factory=client_factory, kind=kind, journal=journal,
                token_ends=token_ends,
            )  # fmt: skip
        else:
            coro = run_endpoint(
                cfg, endpoint, build(cfg), client_factory=client_factory, progress=progress,
                kind=kind, journal=journal, token_ends=token_ends,
            )  # fmt: skip
            results = run_async(coro)
    gpu.attach(results)
    if cfg.shard is not None or cfg.start_at is not None:
        results.extra["shard"] = shard_extra(cfg, ready_ms)
    return results


def run_prepared(
    cfg: RunConfig,
    prepared: Prepared,
    *,
    progress: bool = False,
    journal: str | os.PathLike[str] | None = None,
) -> Results:
    """``cfg``'s load against a prepared endpoint (``cfg`` settled: ``settle``)."""
    return run_specs(
        cfg, prepared.endpoint, prepared.build, progress=progress, journal=journal,
        token_ends=prepared.token_ends,
    )  # fmt: skip


def run(cfg: RunConfig, *, write: bool = True, log: Log = _silent) -> RunOutcome:
    """Run ``cfg`` from start to results (module docstring). ``write``: a results file per
    endpoint (``cfg.out``, else ``reports/run-<UTC time>.json``), journaled as the run goes."""
    check(cfg)
    cfg = settle(cfg, log)
    with _endpoints(cfg, log) as cfg:
        cfg, infos = _preflight(cfg, log)
        outputs = Outputs.start(cfg) if write else None
        done: list[Results] = []
        notes: list[str] = []
        try:
            preps = [prepare(cfg, ep, log) for ep in cfg.endpoints]
            journals = outputs.journals if outputs is not None else [None] * len(preps)
            if cfg.interleave and len(preps) > 1:
                done = run_async(_interleaved(cfg, preps, journals))
            else:
                for prep, journal in zip(preps, journals, strict=True):
                    if len(preps) > 1:
                        log(f"endpoint {prep.endpoint.name} ...")
                    done.append(run_prepared(cfg, prep, progress=cfg.progress, journal=journal))
                    if done[-1].extra.get("interrupted"):
                        break
        except UsageError as exc:  # a setting only the client, the workers or the endpoint checks
            if not done:
                if outputs is not None:
                    outputs.discard()
                raise
            notes.append(f"{exc}; the results of the endpoints before it are written")
        return _finish(cfg, done, outputs, notes, infos)


async def run_here(cfg: RunConfig, *, write: bool = True, log: Log = _silent) -> RunOutcome:
    """``run`` in the running event loop (a notebook's): one endpoint, in this process. What
    blocks (starting the embedded server, asking the endpoint how to size prompts) runs in a
    thread, so a server on this same loop keeps answering."""
    if cfg.workers != 1:
        raise ConfigError("a run in this event loop is one process: for workers > 1 use run_sync()")
    if len(cfg.endpoints) > 1:
        raise ConfigError("a run in this event loop loads one endpoint; for several use run()")
    check(cfg)
    cfg = settle(cfg, log)
    with contextlib.ExitStack() as stack:
        if not cfg.endpoints:
            ep = await asyncio.to_thread(stack.enter_context, _embedded_server(log))
            cfg = cfg.replace(endpoints=(ep,))
        cfg, infos = await asyncio.to_thread(_preflight, cfg, log)
        outputs = Outputs.start(cfg) if write else None
        try:
            prep = await asyncio.to_thread(prepare, cfg, cfg.endpoints[0], log)
            results = await run_endpoint(
                cfg, prep.endpoint, prep.build(cfg), progress=cfg.progress,
                journal=outputs.journals[0] if outputs is not None else None,
                token_ends=prep.token_ends,
            )  # fmt: skip
        except BaseException:
            if outputs is not None:
                outputs.discard()
            raise
        return _finish(cfg, [results], outputs, [], infos)


async def _interleaved(
    cfg: RunConfig, preps: Sequence[Prepared], journals: Sequence[Path | None]
) -> list[Results]:
    """All endpoints at once, each with the same seeded requests on the same schedule."""
    t0 = time.perf_counter_ns() + LOCAL_START_DELAY_NS
    runs = [
        run_endpoint(
            cfg,
            p.endpoint,
            p.build(cfg),
            t0_ns=t0,
            scrape=i == 0,
            journal=journal,
            token_ends=p.token_ends,
        )
        for i, (p, journal) in enumerate(zip(preps, journals, strict=True))
    ]
    return list(await asyncio.gather(*runs))


def _preflight(cfg: RunConfig, log: Log) -> tuple[RunConfig, dict[str, ServerInfo]]:
    """``cfg`` with each endpoint's served model, and what each server said about itself."""
    cfg, infos, notes = preflight(cfg)
    for note in notes:
        log(note)
    return cfg, infos


def _finish(
    cfg: RunConfig,
    done: list[Results],
    outputs: Outputs | None,
    notes: list[str],
    infos: dict[str, ServerInfo],
) -> RunOutcome:
    """Write each endpoint's results, judge them, compare several, decide the exit code."""
    outcome = RunOutcome(cfg, [], notes=notes)
    for i, results in enumerate(done):
        results.extra["server_info"] = infos[cfg.endpoints[i].name].to_dict()
        outcome.runs.append(_judged(cfg, results, i, outputs))
    if outputs is not None:
        outputs.discard(first=len(done))
    outcome.exit_code = max((r.exit_code for r in outcome.runs), default=0)
    if len(done) > 1:
        names = [ep.name for ep in cfg.endpoints]
        outcome.comparison = _compare(done, names)
        if outcome.comparison is not None and outputs is not None:
            outcome.comparison_files = outputs.write_comparison(outcome.comparison, names)
    if any(r.extra.get("interrupted") for r in done):
        outcome.interrupted = True
        written = outputs is not None and not any(r.misplaced for r in outcome.runs)
        outcome.notes.append(
            "interrupted" + ("; the results so far were written" if written else "")
        )
        outcome.exit_code = signals.exit_code()
    return outcome


def _judged(cfg: RunConfig, results: Results, i: int, outputs: Outputs | None) -> EndpointRun:
    run = EndpointRun(cfg.endpoints[i].name, results)
    if outputs is not None:
        run.path, note = outputs.write(i, results)
        if note is not None:
            run.notes.append(note)
        if run.path != outputs.paths[i]:  # elsewhere, or nowhere: not the file asked for
            run.exit_code, run.misplaced = 2, True
    if "journal_error" in results.extra:
        run.notes.append(f"the journal stopped: {results.extra['journal_error']}")
    if cfg.slo:
        from loadlab._slo import evaluate, load_slo

        run.verdict = evaluate(results, load_slo(cfg.slo))
        run.exit_code = max(run.exit_code, int(run.verdict.exit_code))
    if not any(r.ok for r in results.records):
        # a load test in which nothing succeeded must not look green in CI
        where = f" ({run.path})" if run.path is not None else ""
        run.notes.append(f"no request succeeded{where}: exit code 3")
        run.exit_code = max(run.exit_code, 3)
    return run


def _compare(done: list[Results], names: list[str]) -> Comparison | None:
    """Side by side against the first endpoint (``loadlab._analysis.compare``)."""
    try:
        from loadlab._analysis.compare import compare  # type: ignore[import-not-found,unused-ignore]
    except ImportError:  # the analysis extra is not installed: compare the files later
        return None
    return compare(done, names[: len(done)])


@contextlib.contextmanager
def _endpoints(cfg: RunConfig, log: Log) -> Iterator[RunConfig]:
    """``cfg``, with the embedded reference server started for it when it names no endpoint."""
    if cfg.endpoints:
        yield cfg
        return
    with _embedded_server(log) as ep:
        yield cfg.replace(endpoints=(ep,))


@contextlib.contextmanager
def _embedded_server(log: Log) -> Iterator[EndpointConfig]:
    from reference_server.launch import start_server

    log("starting the embedded reference server (CPU preset) ...")
    # leave a core to loadlab: a server whose torch threads take every core would delay
    # loadlab's own timestamps (the run would be flagged saturated)
    threads = str(max(1, (os.cpu_count() or 2) - 1))
    try:
        server_cm = start_server(
            mode="continuous", preset="cpu", port=None, env={"OMP_NUM_THREADS": threads}
        )
        server = server_cm.__enter__()
    except RuntimeError as exc:
        raise ConfigError(
            f"the embedded reference server did not start ({exc}); give --endpoint URL to "
            "test another server"
        ) from exc
    try:
        yield EndpointConfig(url=str(server.url), name="reference")
    finally:
        server_cm.__exit__(None, None, None)

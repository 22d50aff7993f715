"""``--workers N``: one endpoint's load spread over N processes of this machine, ending in one
``Results``.

Each worker process rebuilds the same seeded request stream (``build``, with the sizing and
the seed the parent settled: nothing is asked of the endpoint again), keeps its share of it
(units, i.e. requests or whole chat sessions, dealt round-robin after the ``cfg.requests``
cut) and runs it against the same ``t0``: ``time.perf_counter_ns()`` is CLOCK_MONOTONIC on
Linux, one clock for every process of the machine, so intended times and records line up
across workers. Each worker gets its share of ``--concurrency`` and of ``--max-in-flight``;
records carry their ``worker`` index; the parts are merged with
``loadlab.results.merge_results``.

Ctrl-C: a worker stops sending and cancels its in-flight requests (recorded ``cancelled``);
the parent forwards SIGINT to workers that did not get it from the terminal, then merges what
they return, so the results file is still written.

Example::

    build = functools.partial(build_requests, sizing=how)
    results = run_processes(cfg.replace(workers=2), endpoint, build)
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import traceback
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection
from typing import Any

from loadlab._runner import signals
from loadlab._runner.endpoint import ClientFactory, TokenEnds, run_endpoint
from loadlab._runner.runner import run_async
from loadlab._runner.shard import partition, start_ns
from loadlab.config import EndpointConfig, RunConfig
from loadlab.errors import ConfigError
from loadlab.records import RequestSpec
from loadlab.results import Results, merge_results

__all__ = ["BuildRequests", "partition", "run_processes", "share"]

BuildRequests = Callable[[RunConfig], Iterable[RequestSpec]]
START_DELAY_NS = 100_000_000  # t0 this far after every worker said ready: all are waiting


def share(total: int | None, n: int, index: int) -> int | None:
    """Worker ``index``'s share of ``total`` split over ``n`` (the first ones take the rest).

    >>> [share(10, 3, i) for i in range(3)]
    [4, 3, 3]
    """
    if total is None:
        return None
    return total // n + (1 if index < total % n else 0)


def run_processes(
    cfg: RunConfig,
    endpoint: EndpointConfig,
    build: BuildRequests,
    *,
    client_factory: ClientFactory | None = None,
    kind: str = "run",
    journal: str | os.PathLike[str] | None = None,
    token_ends: TokenEnds | None = None,
) -> Results:
    """Run ``cfg``'s load against ``endpoint`` over ``cfg.workers`` processes; every process
    appends its finished records to ``journal`` when given."""
    if cfg.concurrency is not None and cfg.concurrency < cfg.workers:
        raise ConfigError(
            f"--workers {cfg.workers} needs --concurrency >= {cfg.workers} "
            f"(each worker runs at least one stream), got {cfg.concurrency}"
        )
    if cfg.max_in_flight is not None and cfg.max_in_flight < cfg.workers:
        raise ConfigError(f"--max-in-flight must be >= --workers ({cfg.workers})")
    # fork: the children inherit the imported modules and these arguments without pickling,
    # and ``python -m loadlab``'s __main__ is not re-run as it would be under spawn.
    ctx = multiprocessing.get_context("fork")
    n = cfg.workers
    pipes: list[Connection] = []
    procs = []
    for w in range(n):
        parent_end, child_end = ctx.Pipe()
        args = (cfg, endpoint, build, client_factory, kind, w, child_end, journal, token_ends)
        proc = ctx.Process(target=_worker_main, args=args, name=f"loadlab-worker-{w}")
        proc.start()
        child_end.close()
        pipes.append(parent_end)
        procs.append(proc)

    interrupted = False

    def forward(signum: int, frame: Any) -> None:
        """A stop signal to the parent stops every worker (SIGINT: each stops like on Ctrl-C),
        then the parent merges what they return."""
        nonlocal interrupted
        interrupted = True
        signals.note(signum)
        for p in procs:
            if p.pid is not None and p.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGINT)

    signals.begin_run()
    previous = {s: signal.signal(s, forward) for s in signals.STOP_SIGNALS}
    try:
        errors = []
        for w, conn in enumerate(pipes):
            msg = _receive(conn, w)
            if msg[0] != "ready":
                errors.append(msg[1])
        if errors or interrupted:
            for conn in pipes:
                with contextlib.suppress(OSError):
                    conn.send(None)
            if not errors:  # Ctrl-C before anything was sent: nothing to write
                raise KeyboardInterrupt
            raise RuntimeError("a worker failed to start:\n" + "\n".join(errors))
        t0_ns = start_ns(cfg, START_DELAY_NS)
        for conn in pipes:
            conn.send(t0_ns)
        parts: list[Results] = []
        for w, conn in enumerate(pipes):
            msg = _receive(conn, w)
            if msg[0] != "done":
                errors.append(f"worker {w}: {msg[1]}")
            else:
                parts.append(msg[1])
        if errors:
            raise RuntimeError("worker failed:\n" + "\n".join(errors))
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        for conn in pipes:
            conn.close()
    merged = merge_results(parts)
    merged.config = cfg.to_dict()
    if interrupted or any(p.extra.get("interrupted") for p in parts):
        merged.extra = {**merged.extra, "interrupted": True}
    return merged


def _receive(conn: Connection, index: int) -> tuple[Any, ...]:
    """A worker's next message; one that died without a word (killed) is an error message."""
    try:
        return tuple(conn.recv())
    except (EOFError, OSError):
        return ("error", f"worker {index} exited without its results (killed?)")


def _worker_main(
    cfg: RunConfig,
    endpoint: EndpointConfig,
    build: BuildRequests,
    client_factory: ClientFactory | None,
    kind: str,
    index: int,
    conn: Connection,
    journal: str | os.PathLike[str] | None,
    token_ends: TokenEnds | None,
) -> None:
    # until the runner's own handler is installed, Ctrl-C must not kill the worker silently;
    # SIGTERM and SIGHUP end it (the parent stops its workers with SIGINT), and so does the
    # parent's death, whatever killed it: a worker never sends on as an orphan
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
    signals.stop_parent_death()
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)
    n = cfg.workers
    try:
        stream = build(cfg)
        specs = partition(stream, n, index, cfg.requests)
    except Exception as exc:
        conn.send(("error", f"worker {index}: {exc!r}"))
        conn.close()
        return
    conn.send(("ready",))
    try:
        t0_ns = conn.recv()
    except (EOFError, OSError):  # the parent is gone
        t0_ns = None
    if t0_ns is None:
        conn.close()
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        results = run_async(
            run_endpoint(
                cfg,
                endpoint,
                specs,
                client_factory=client_factory,
                worker=index,
                t0_ns=t0_ns,
                concurrency=share(cfg.concurrency, n, index),
                max_in_flight=share(cfg.max_in_flight, n, index),
                progress=False,
                scrape=index == 0,
                kind=kind,
                source=stream,
                journal=journal,
                token_ends=token_ends,
            )
        )
        with contextlib.suppress(OSError):  # a dead parent: the journal has the records
            conn.send(("done", results))
    except BaseException as exc:  # report every failure to the parent, then exit
        with contextlib.suppress(OSError):
            conn.send(("error", f"{exc!r}\n{traceback.format_exc(limit=5)}"))
    finally:
        conn.close()

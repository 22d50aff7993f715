"""Run one load over this process or ``cfg.workers`` processes, and end in one ``Results``.

``run_load(cfg, endpoint, build_requests)`` is what ``loadlab run`` calls. With
``cfg.workers == 1`` the run happens in this process. With N > 1, N worker processes each
rebuild the same seeded request stream, keep their share of it (units, i.e. requests or whole
chat sessions, dealt round-robin after the ``cfg.requests`` cut) and run it against the same
``t0``: ``time.perf_counter_ns()`` is CLOCK_MONOTONIC on Linux, one clock for every process of
the machine, so intended times and records line up across workers. Each worker gets its share
of ``--concurrency`` and of ``--max-in-flight``; records carry their ``worker`` index; the parts
are merged with ``loadlab.results.merge_results``.

Ctrl-C: a worker stops sending and cancels its in-flight requests (recorded ``cancelled``);
the parent forwards SIGINT to workers that did not get it from the terminal, then merges what
they return, so the results file is still written.

Example::

    results = run_load(cfg.replace(workers=2), cfg.endpoints[0], build_requests)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import os
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any

from loadlab.clients.base import Client
from loadlab.config import EndpointConfig, RunConfig
from loadlab.errors import ConfigError
from loadlab.journal import JournalWriter
from loadlab.records import RequestSpec
from loadlab.results import Results, merge_results
from loadlab.runner import signals
from loadlab.runner.progress import Progress
from loadlab.runner.prompt_sizing import prepared_sizing
from loadlab.runner.runner import Runner, group_units, run_async
from loadlab.workloads import workload_extra
from loadlab.workloads.prefix import with_run_salt

__all__ = ["partition", "run_endpoint", "run_load", "share"]

BuildRequests = Callable[[RunConfig], Iterable[RequestSpec]]
ClientFactory = Callable[[EndpointConfig, RunConfig], Client]
START_DELAY_NS = 100_000_000  # t0 this far after every worker said ready: all are waiting
LOCAL_START_DELAY_NS = 50_000_000  # one process: t0 this far after its set-up began


def share(total: int | None, n: int, index: int) -> int | None:
    """Worker ``index``'s share of ``total`` split over ``n`` (the first ones take the rest).

    >>> [share(10, 3, i) for i in range(3)]
    [4, 3, 3]
    """
    if total is None:
        return None
    return total // n + (1 if index < total % n else 0)


def partition(
    specs: Iterable[RequestSpec], n: int, index: int, requests: int | None = None
) -> Iterator[RequestSpec]:
    """Worker ``index``'s units of the stream (round-robin; chat sessions stay whole)."""
    if requests is not None:
        specs = itertools.islice(specs, requests)
    for i, unit in enumerate(group_units(specs)):
        if i % n == index:
            yield from unit


def _default_client(endpoint: EndpointConfig, cfg: RunConfig) -> Client:
    from loadlab.clients import make_client  # type: ignore[attr-defined]  # imported when used

    client: Client = make_client(endpoint, cfg)
    return client


async def run_endpoint(
    cfg: RunConfig,
    endpoint: EndpointConfig,
    specs: Iterable[RequestSpec],
    *,
    client_factory: ClientFactory | None = None,
    worker: int = 0,
    t0_ns: int | None = None,
    concurrency: int | None = None,
    max_in_flight: int | None = None,
    progress: bool = False,
    scrape: bool = True,
    kind: str = "run",
    source: Iterable[RequestSpec] | None = None,
    journal: str | os.PathLike[str] | None = None,
) -> Results:
    """One process's run: client, runner, stop-signal handlers, progress line, scraper and
    journal (records appended to ``journal`` as they finish, ``loadlab.journal``)."""
    factory = client_factory or _default_client
    loop = asyncio.get_running_loop()
    writer = JournalWriter(journal) if journal is not None else None
    async with factory(endpoint, cfg) as client:
        runner = Runner(
            cfg,
            specs,
            client,
            endpoint=endpoint.name,
            worker=worker,
            t0_ns=t0_ns,
            concurrency=concurrency,
            max_in_flight=max_in_flight,
            kind=kind,
            journal=writer,
        )
        runner.prepare()
        if runner.t0_ns is None:
            # A little ahead: the scraper, progress line and loop monitor start before the
            # first request is due, not on its time (that cost the first send ~19 ms).
            runner.t0_ns = time.perf_counter_ns() + LOCAL_START_DELAY_NS
        scraper = None
        if scrape and cfg.scrape:
            from loadlab.runner.scrape import PrometheusScraper

            scraper = PrometheusScraper(cfg.scrape, cfg.scrape_interval_s, runner.t0_ns)
            await scraper.start()
        handled = _STOP_SIGNALS.add(loop, runner)
        try:
            async with Progress(
                runner.stats,
                total_s=cfg.duration_s,
                total_requests=cfg.requests,
                enabled=progress and cfg.progress,
            ):
                results = await runner.run()
        finally:
            if handled:
                _STOP_SIGNALS.remove(loop, runner)
            samples = await scraper.stop() if scraper is not None else []
        results.server_samples = list(samples)
        if writer is not None and writer.error is not None:
            results.extra["journal_error"] = writer.error
        if scraper is not None and scraper.failures:
            results.extra["scrape"] = {
                "failures": scraper.failures,
                "last_error": scraper.last_error,
            }
        extra = workload_extra(source if source is not None else specs)  # type: ignore[arg-type]
        if extra:
            results.extra["workload"] = extra
        return results


class _StopSignals:
    """SIGINT, SIGTERM and SIGHUP stop every run of this process (noted for the exit code)
    while one lasts; when the last ends, the handlers they had are put back. Runs can overlap
    in one process (the lab runs several parts at once), so the handlers are installed by the
    first run and restored by the last.

    Plain Python handlers, not ``loop.add_signal_handler``: taking that one back
    (``remove_signal_handler``) puts Python's default in place before the previous handler
    returns, and a signal in between ended the command before it wrote the file (a burst of
    Ctrl-C in CI; blocking the signals in this thread did not close the window, as the kernel
    gives a process's signal to any thread that does not block it). ``signal.signal`` swaps
    handlers in one step. Python runs the handler in the main thread; the wakeup socket gets
    the loop out of ``epoll_wait`` for it when the signal lands on another thread."""

    def __init__(self) -> None:
        self.active: list[tuple[asyncio.AbstractEventLoop, Runner]] = []
        self.previous: dict[int, Any] = {}
        self.wakeup: tuple[asyncio.AbstractEventLoop, socket.socket, socket.socket] | None = None
        self.old_wakeup_fd = -1

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        signals.note(signum)
        for loop, runner in list(self.active):
            with contextlib.suppress(RuntimeError):  # its loop has closed: nothing to stop
                loop.call_soon_threadsafe(runner.stop)

    @staticmethod
    def _drain(read: socket.socket) -> None:
        with contextlib.suppress(OSError):
            read.recv(4096)  # the signal numbers; the Python handler has the signal itself

    def add(self, loop: asyncio.AbstractEventLoop, runner: Runner) -> bool:
        """Stop ``runner`` on a stop signal; False off the main thread (where Python cannot
        set handlers, and the caller handles its signals)."""
        signals.begin_run()
        if threading.current_thread() is not threading.main_thread():
            return False
        if not self.active:
            for s in signals.STOP_SIGNALS:
                self.previous[s] = signal.signal(s, self._stop)
            read, write = socket.socketpair()
            read.setblocking(False)
            write.setblocking(False)
            self.old_wakeup_fd = signal.set_wakeup_fd(write.fileno())
            self.wakeup = (loop, read, write)
            loop.add_reader(read.fileno(), self._drain, read)
        self.active.append((loop, runner))
        if signals.stop_requested():  # a signal came while the run was being set up
            runner.stop()
        return True

    def remove(self, loop: asyncio.AbstractEventLoop, runner: Runner) -> None:
        self.active.remove((loop, runner))
        if self.active:
            return
        for s, handler in self.previous.items():
            if handler is not None:
                signal.signal(s, handler)
        self.previous.clear()
        if self.wakeup is not None:
            reader_loop, read, write = self.wakeup
            self.wakeup = None
            reader_loop.remove_reader(read.fileno())
            signal.set_wakeup_fd(self.old_wakeup_fd)
            read.close()
            write.close()


_STOP_SIGNALS = _StopSignals()


def run_load(
    cfg: RunConfig,
    endpoint: EndpointConfig,
    build_requests: BuildRequests,
    *,
    client_factory: ClientFactory | None = None,
    progress: bool = True,
    kind: str = "run",
    journal: str | os.PathLike[str] | None = None,
) -> Results:
    """Run ``cfg`` against ``endpoint`` in this process or over ``cfg.workers`` processes;
    every process appends its finished records to ``journal`` when given.

    A workload tokenizer that asks the endpoint (``server``, ``calibrate``, ``auto``) is
    resolved here first, once (``loadlab.runner.prompt_sizing``; a caller that resolved it already, as
    ``loadlab run`` does to print its warnings, is reused)."""
    from loadlab.runner.telemetry import for_run

    cfg = with_run_salt(cfg)  # before the workers fork: one cache-busting salt for all
    with prepared_sizing(cfg.replace(endpoints=(endpoint,))):
        # GPU telemetry beside the load (--gpu-metrics), its idle baseline taken first
        with for_run(cfg, endpoint.name) as gpu:
            results = _run_load(
                cfg, endpoint, build_requests, client_factory, progress, kind, journal
            )
        gpu.attach(results)
        return results


def _run_load(
    cfg: RunConfig,
    endpoint: EndpointConfig,
    build_requests: BuildRequests,
    client_factory: ClientFactory | None,
    progress: bool,
    kind: str,
    journal: str | os.PathLike[str] | None,
) -> Results:
    if cfg.workers == 1:
        return run_async(
            run_endpoint(
                cfg,
                endpoint,
                build_requests(cfg),
                client_factory=client_factory,
                progress=progress,
                kind=kind,
                journal=journal,
            )
        )
    if cfg.concurrency is not None and cfg.concurrency < cfg.workers:
        raise ConfigError(
            f"--workers {cfg.workers} needs --concurrency >= {cfg.workers} "
            f"(each worker runs at least one stream), got {cfg.concurrency}"
        )
    if cfg.max_in_flight is not None and cfg.max_in_flight < cfg.workers:
        raise ConfigError(f"--max-in-flight must be >= --workers ({cfg.workers})")
    return _run_processes(cfg, endpoint, build_requests, client_factory, kind, journal)


def _run_processes(
    cfg: RunConfig,
    endpoint: EndpointConfig,
    build_requests: BuildRequests,
    client_factory: ClientFactory | None,
    kind: str,
    journal: str | os.PathLike[str] | None = None,
) -> Results:
    # fork: the children inherit the imported modules and these arguments without pickling,
    # and ``python -m loadlab``'s __main__ is not re-run as it would be under spawn.
    ctx = multiprocessing.get_context("fork")
    n = cfg.workers
    pipes: list[Connection] = []
    procs = []
    for w in range(n):
        parent_end, child_end = ctx.Pipe()
        args = (cfg, endpoint, build_requests, client_factory, kind, w, child_end, journal)
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
        t0_ns = time.perf_counter_ns() + START_DELAY_NS
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
    build_requests: BuildRequests,
    client_factory: ClientFactory | None,
    kind: str,
    index: int,
    conn: Connection,
    journal: str | os.PathLike[str] | None = None,
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
        stream = build_requests(cfg)
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
            )
        )
        with contextlib.suppress(OSError):  # a dead parent: the journal has the records
            conn.send(("done", results))
    except BaseException as exc:  # report every failure to the parent, then exit
        with contextlib.suppress(OSError):
            conn.send(("error", f"{exc!r}\n{traceback.format_exc(limit=5)}"))
    finally:
        conn.close()

"""One endpoint's load in this process: client, runner, stop signals, progress line, scraper
and journal, ending in a ``Results``.

``run_endpoint`` is what every run comes down to, in each process of a ``--workers`` run
(``loadlab._runner.fanout``) and for each endpoint of an interleaved run or each part of a lab
experiment (several at once on one event loop, sharing ``t0_ns``).

Example::

    results = await run_endpoint(cfg, endpoint, build_requests(cfg, sizing))
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from types import FrameType
from typing import Any

from loadlab._runner import signals
from loadlab._runner.progress import Progress
from loadlab._runner.runner import Runner
from loadlab._runner.shard import start_ns
from loadlab.clients._base import Client
from loadlab.config import EndpointConfig, RunConfig
from loadlab.journal import JournalWriter
from loadlab.records import RequestSpec
from loadlab.results import Results
from loadlab.workloads import workload_extra

__all__ = ["LOCAL_START_DELAY_NS", "ClientFactory", "run_endpoint"]

ClientFactory = Callable[[EndpointConfig, RunConfig], Client]
LOCAL_START_DELAY_NS = 50_000_000  # one process: t0 this far after its set-up began
TokenEnds = Callable[[str], Sequence[int]]


def _client_factory(token_ends: TokenEnds | None) -> ClientFactory:
    def make(endpoint: EndpointConfig, cfg: RunConfig) -> Client:
        from loadlab.clients import make_client  # type: ignore[attr-defined]  # when used

        client: Client = make_client(endpoint, cfg, token_ends)
        return client

    return make


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
    token_ends: TokenEnds | None = None,
) -> Results:
    """One process's run: client, runner, stop-signal handlers, progress line, scraper and
    journal (records appended to ``journal`` as they finish, ``loadlab.journal``).
    ``token_ends``: the target model's tokenizer, when loadlab holds it (the run's sizing)."""
    factory = client_factory or _client_factory(token_ends)
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
            # first request is due, not on its time (that cost the first send ~19 ms); or
            # the shards' common start (--start-at)
            runner.t0_ns = start_ns(cfg, LOCAL_START_DELAY_NS)
        scraper = None
        if scrape and cfg.scrape:
            from loadlab._runner.scrape import PrometheusScraper

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

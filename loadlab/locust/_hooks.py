"""Locust event listeners: ship records to the master, end runs cleanly, write the results file.

Roles (one per process)::

    local   one process runs users and writes the file
    worker  runs users; ships a batch every second (an empty "hello" at test_start) and a
            final batch at test_stop, which Locust fires after the users have stopped and
            before the worker sends "client_stopped" (same socket, so the master gets it first)
    master  collects batches; its ``quit`` is wrapped: stop the workers → wait (bounded by
            --loadlab-final-wait) until every worker that reported has sent its final batch →
            Locust's own quit. Locust's headless ``--run-time`` (and a LoadTestShape's end)
            call ``quit`` directly, which would fire test_stop without stopping the workers
            and kill the listener 0.5 s later, losing their last reports (locust issue #1426).

The file is written in the ``quitting`` event (Locust fires it before deciding the exit code,
so ``--slo`` can set ``environment.process_exit_code``). On Ctrl-C the master also stops and
drains its workers there first.

Nothing is lost to a dead master: at ``init``, before any user starts, the master (or single
process) checks loadlab's options and starts the journal of ``--loadlab-out``
(``loadlab.journal``): a bad option is exit 2 there. Every batch it takes in (every second) is
appended to the journal from a thread, so a master killed with ``kill -9`` leaves every record
that reached it for ``loadlab report --from-journal``. Workers that ``--processes`` forked ask
Linux for SIGTERM when the master dies, and stop with it.
"""

from __future__ import annotations

import datetime as dt
import gc
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import gevent
from locust.runners import STATE_INIT, STATE_MISSING, STATE_STOPPED, MasterRunner, WorkerRunner

from loadlab._analysis.metrics import LogHistogram
from loadlab._runner import signals
from loadlab.errors import UsageError
from loadlab.journal import JournalWriter, default_out_path, prepare_output, save_results
from loadlab.locust._collect import RecordCollector, RecordShipper
from loadlab.locust._options import check_options, config_from_options
from loadlab.records import RequestRecord
from loadlab.results import Results, environment_info

__all__ = ["JournalFeed", "install", "next_user_seed", "record_done", "request_started", "t0_ns"]

log = logging.getLogger("loadlab.locust")

MESSAGE = "loadlab_records"
FLUSH_INTERVAL_S = 1.0
LAG_PERIOD_S = 0.05


class _State:
    def __init__(self) -> None:
        self.role = "local"
        self.host = socket.gethostname()
        self.shipper: RecordShipper | None = None
        self.collector: RecordCollector | None = None
        self.started_at = ""
        self.stop_ns: int | None = None
        self.users = 0
        self.finalised = False
        self.drained = False  # the master waited for its workers' final batches this test
        self.lag = LogHistogram()
        self.lag_max_ms = 0.0
        self.measuring_lag = False
        self.cpu = (0.0, 0.0)  # (process CPU s, monotonic s) at test_start
        self.cpu_percent = 0.0  # CPU used while users ran, % of one core
        self.out: Path | None = None  # the results file (master or local)
        self.journal: JournalFeed | None = None


_S = _State()


# ------------------------------------------------------------------ used by LLMUser


def _shipper() -> RecordShipper:
    if _S.shipper is None:  # a user running outside a test (e.g. locust's run_single_user)
        _S.shipper = RecordShipper.start_now(0, _S.host)
    return _S.shipper


def t0_ns() -> int:
    """This process's time origin (``perf_counter_ns`` at its test_start)."""
    return _shipper().t0_perf_ns


def next_user_seed(environment: Any) -> int:
    """A distinct, reproducible seed per user: (--loadlab-seed, worker index, user number)."""
    _S.users += 1
    base = int(getattr(environment.parsed_options, "loadlab_seed", 0) or 0)
    worker = _worker_index(environment)
    return (base << 40) + (worker << 20) + _S.users


def user_tag(environment: Any) -> str:
    return f"w{_worker_index(environment)}u{_S.users}"


def request_started() -> None:
    _shipper().note_started()


def record_done(record: RequestRecord) -> None:
    _shipper().add(record)


# ------------------------------------------------------------------ listeners


def install(events: Any) -> None:
    events.init.add_listener(_on_init)
    events.test_start.add_listener(_on_test_start)
    events.test_stopping.add_listener(_on_test_stopping)
    events.test_stop.add_listener(_on_test_stop)
    events.quitting.add_listener(_on_quitting)


def _worker_index(environment: Any) -> int:
    runner = environment.runner
    return int(getattr(runner, "worker_index", 0) or 0) if isinstance(runner, WorkerRunner) else 0


def _on_init(environment: Any, **_: Any) -> None:
    runner = environment.runner
    if isinstance(runner, MasterRunner):
        _S.role = "master"
        _start_journal(environment.parsed_options)
        runner.register_message(MESSAGE, _on_records)
        _wrap_master_quit(environment)
    elif isinstance(runner, WorkerRunner):
        _S.role = "worker"
        if getattr(environment.parsed_options, "processes", None):
            _die_with_master()
        gevent.spawn(_flusher, environment)
    else:
        _S.role = "local"
        _start_journal(environment.parsed_options)
        gevent.spawn(_local_flusher)
    if _S.role != "master":
        # Build the prompt corpus now: done by the first user, it would block the gevent loop
        # (and every other user's timestamps) for a few hundred ms mid-run.
        from loadlab.workloads._prompts import corpus

        corpus()
    # libev caches "now" per loop iteration; importing the locustfile (numpy, loadlab) and the
    # warm-up above take seconds before the loop runs again, and Locust's --run-time timer,
    # armed next, would otherwise count from that stale "now" and fire seconds early.
    gevent.get_hub().loop.update_now()


def _on_test_start(environment: Any, **_: Any) -> None:
    if _S.role in ("local", "master"):
        _S.collector = RecordCollector.start_now(_S.host)
        _S.started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        _S.stop_ns = None
        _S.finalised = False
        _S.drained = False
    if _S.role in ("local", "worker"):
        # Everything alive now (Locust, gevent, numpy, the locustfile) lives for the whole run:
        # out of the collector's sight, a full collection no longer walks it mid-run (tens of
        # ms during which no user reads a token).
        gc.freeze()
        _S.shipper = RecordShipper.start_now(_worker_index(environment), _S.host)
        _S.lag, _S.lag_max_ms, _S.measuring_lag = LogHistogram(), 0.0, True
        _S.cpu, _S.cpu_percent = (time.process_time(), time.monotonic()), 0.0
        gevent.spawn(_lag_monitor, _S.shipper)
    if _S.role == "worker":  # hello: the master now expects a final batch from this worker
        _send(environment, final=False)


def _on_test_stopping(environment: Any, **_: Any) -> None:
    if _S.role in ("local", "master") and _S.stop_ns is None:
        # The load ends when stopping starts; the window still reaches the last token of a
        # stream that finishes during --stop-timeout (Results.measurement_window_ns).
        _S.stop_ns = time.perf_counter_ns()
    _S.measuring_lag = False  # shutdown work (killing users, printing stats) is not load
    cpu0, t0 = _S.cpu
    _S.cpu_percent = 100 * (time.process_time() - cpu0) / max(time.monotonic() - t0, 1e-9)


def _on_test_stop(environment: Any, **_: Any) -> None:
    if _S.role == "worker" and _S.shipper is not None and not _S.shipper.final_sent:
        _send(environment, final=True)
    elif _S.role == "local" and _S.shipper is not None and _S.collector is not None:
        if not _S.shipper.final_sent:
            _journal(_S.collector.add_batch("local", _batch(final=True)))
    if _S.role in ("local", "master") and _S.stop_ns is None:
        _S.stop_ns = time.perf_counter_ns()


def _on_quitting(environment: Any, **_: Any) -> None:
    if _S.role == "worker":
        if _S.shipper is not None and not _S.shipper.final_sent:
            _send(environment, final=True)
        return
    if _S.role == "master":
        _drain_workers(environment)
    else:
        _on_test_stop(environment)
    if _S.collector is None:  # no test ever started (web UI opened and closed): no file
        return
    if not _S.finalised:
        _S.finalised = True
        _finish(environment, _results(environment))


# ------------------------------------------------------------------ worker side


def _batch(*, final: bool) -> dict[str, Any]:
    batch = _shipper().take_batch(final=final)
    batch["generator"] = {
        "loop_lag_ms_max": _S.lag_max_ms,
        "loop_lag_ms_p99": _S.lag.quantile(0.99) or 0.0,
        "samples": _S.lag.total,
        "cpu_percent_mean": _S.cpu_percent,
    }
    return batch


def _send(environment: Any, *, final: bool) -> None:
    try:
        environment.runner.send_message(MESSAGE, _batch(final=final))
    except Exception as exc:  # a lost master: keep running, say so
        log.error("could not send records to the master: %s", exc)


def _flusher(environment: Any) -> None:
    while True:
        gevent.sleep(FLUSH_INTERVAL_S)
        ship = _S.shipper
        if ship is not None and ship.has_news and not ship.final_sent:
            _send(environment, final=False)


def _die_with_master() -> None:
    """A worker ``--processes`` forked gets SIGTERM when its master dies, even by ``kill -9``
    (Locust's own heartbeat would let it load the endpoint for another minute)."""
    signals.stop_parent_death()
    if os.getppid() == 1:  # the master died before the request took effect
        os._exit(1)


def _lag_monitor(ship: RecordShipper) -> None:
    # How late the gevent loop wakes a sleeper: the delay every chunk timestamp may carry.
    while _S.shipper is ship and _S.measuring_lag:
        t = time.perf_counter()
        gevent.sleep(LAG_PERIOD_S)
        if not _S.measuring_lag:
            break
        lag_ms = max(0.0, (time.perf_counter() - t - LAG_PERIOD_S) * 1000)
        _S.lag.add(lag_ms)
        _S.lag_max_ms = max(_S.lag_max_ms, lag_ms)


# ------------------------------------------------------------------ master side


def _on_records(environment: Any, msg: Any, **_: Any) -> None:
    if _S.collector is None:
        _S.collector = RecordCollector.start_now(_S.host)
    _journal(_S.collector.add_batch(str(msg.node_id), msg.data))


def _local_flusher() -> None:
    """One process: its records reach the collector, and the journal, every second too."""
    while True:
        gevent.sleep(FLUSH_INTERVAL_S)
        ship, col = _S.shipper, _S.collector
        if ship is not None and col is not None and ship.pending and not ship.final_sent:
            _journal(col.add_batch("local", _batch(final=False)))


# ------------------------------------------------------------------ the journal


def _start_journal(opts: Any) -> None:
    """Check loadlab's options and start the journal before any user runs; exit 2 if bad."""
    out = Path(getattr(opts, "loadlab_out", "") or default_out_path("locust"))
    try:
        check_options(opts)
        journal = prepare_output(
            out,
            {
                "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "kind": "locust",
                "endpoint": "locust",
                "config": config_from_options(opts),
            },
            flag="--loadlab-out",
        )
    except UsageError as exc:
        print(f"locust: loadlab: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    _S.out, _S.journal = out, JournalFeed(JournalWriter(journal))


class JournalFeed:
    """Records handed to a journal from the gevent loop: one greenlet writes them, in order,
    from a thread (the encoding and the fsync never hold up the loop that stamps tokens)."""

    def __init__(self, writer: JournalWriter) -> None:
        self.writer = writer
        self.pending: list[RequestRecord] = []  # taken in, not yet handed to the journal
        self.greenlet: gevent.Greenlet | None = None

    def add(self, records: list[RequestRecord]) -> None:
        self.pending += records
        if records and (self.greenlet is None or self.greenlet.dead):
            self.greenlet = gevent.spawn(self._write)

    def join(self) -> None:
        """Wait until every record handed over is in the journal."""
        if self.greenlet is not None:
            self.greenlet.join()

    def _write(self) -> None:
        while self.pending:
            batch, self.pending = self.pending, []
            gevent.get_hub().threadpool.apply(self.writer.write, (batch,))


def _journal(records: list[RequestRecord]) -> None:
    if _S.journal is not None:
        _S.journal.add(records)


def _wrap_master_quit(environment: Any) -> None:
    runner = environment.runner
    locust_quit = runner.quit

    def quit() -> None:
        _drain_workers(environment)
        # Workers that reported "stopped" are no longer in runner.clients, so Locust's quit
        # would not reach them (with --stop-timeout they only re-register after that many
        # seconds): tell them directly.
        known = {c.id for c in runner.clients.all}
        for node in sorted((_S.collector.seen_nodes if _S.collector else set()) - known):
            runner.send_message("quit", None, client_id=node)
        locust_quit()

    runner.quit = quit


def _drain_workers(environment: Any) -> None:
    """Stop the workers (their users finish or are cancelled) and await their final batches."""
    runner = environment.runner
    if runner.state not in (STATE_INIT, STATE_STOPPED):
        runner.stop()  # sends "stop" to every worker and waits until they report stopped
    col = _S.collector
    if col is None or _S.drained:  # quit, stop and quitting all drain: wait once, not thrice
        return
    _S.drained = True
    wait_s = float(getattr(environment.parsed_options, "loadlab_final_wait", 15.0))
    deadline = time.monotonic() + wait_s
    # A worker Locust marks missing (no heartbeat for ~3 s: killed, or its host gone) will not
    # send anything more: waiting for it would only delay the file.
    while (col.missing() - _gone(runner)) and time.monotonic() < deadline:
        gevent.sleep(0.05)
    if col.missing():
        lost = col.lost_by_node()
        log.error(
            "no final records from %d worker(s) (%s): %d request(s) they started are lost",
            len(col.missing()),
            ", ".join(sorted(col.missing())),
            sum(lost.values()),
        )


def _gone(runner: Any) -> set[str]:
    """Workers Locust has marked missing (their heartbeats stopped)."""
    return {c.id for c in runner.clients.all if c.state == STATE_MISSING}


def _results(environment: Any) -> Results:
    col = _S.collector or RecordCollector.start_now(_S.host)
    end = _S.stop_ns or time.perf_counter_ns()
    opts = environment.parsed_options
    env = {**environment_info(), "locust": _locust_version()}
    results = col.results(
        duration_ns=max(0, end - col.t0_perf_ns),
        config=config_from_options(opts),
        environment=env,
        started_at=_S.started_at,
    )
    threshold = float(getattr(opts, "saturation_lag_ms", 20.0))
    results.generator = col.generator_summary(threshold)
    out = _S.out or Path(getattr(opts, "loadlab_out", "") or default_out_path("locust"))
    results.extra["locust"]["out"] = str(out)
    return results


def _locust_version() -> str:
    from locust import __version__

    return str(__version__)


def _finish(environment: Any, results: Results) -> None:
    """Write the file, print loadlab's summary, and turn an SLO verdict into the exit code."""
    if _S.journal is not None:
        _S.journal.join()  # every record in the journal before it is dropped
    info = results.extra["locust"]
    out = Path(info["out"])
    path, note = save_results(results, out, _S.journal.writer.journal if _S.journal else None)
    if note:
        log.error("loadlab: %s", note)
    if path is not None:
        log.info(
            "loadlab: %d records from %d worker(s) written to %s",
            len(results.records),
            results.workers,
            path,
        )
    from loadlab._report.text import render_summary

    print(render_summary(results), flush=True)
    slo_path = getattr(environment.parsed_options, "slo", "")
    if slo_path:
        environment.process_exit_code = _slo_exit_code(results, slo_path)
    if info["workers_missing_final"] and not environment.process_exit_code:
        environment.process_exit_code = 3  # incomplete records never pass silently
    if path != out:  # elsewhere, or nowhere: not the file asked for
        environment.process_exit_code = max(environment.process_exit_code or 0, 2)


def _slo_exit_code(results: Results, slo_path: str) -> int:
    from loadlab._slo import evaluate, load_slo

    try:
        spec = load_slo(slo_path)
    except (OSError, ValueError) as exc:
        log.error("--slo %s: %s", slo_path, exc)
        return 2
    from loadlab._report.text import render_verdict

    verdict = evaluate(results, spec)
    print(render_verdict(verdict), flush=True)
    return int(verdict.exit_code)

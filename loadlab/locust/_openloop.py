"""Open-loop load over Locust's master and workers, loadlab's own runner sending in every worker.

A locustfile that imports ``OpenLoopUser`` (``examples/locust_openloop.py``) turns Locust into
the engine that places and supervises loadlab's senders::

    locust -f examples/locust_openloop.py --master --headless --expect-workers 3 -u 3 \\
        --loadlab-run "--endpoint http://10.0.0.5:8000 --rate 400 --requests 24000 --seed 7" \\
        --loadlab-out run.json
    locust -f examples/locust_openloop.py --worker --master-host 10.0.0.2    # each machine

The run (one schedule: rate or trace, seed, request count) is ``--loadlab-run``, the flags of
``loadlab run``, checked on the master before any worker is asked anything (exit 2). When the
test starts, the master:

1. measures each worker host's clock offset from its own (``loadlab.locust._fleet``);
2. gives worker K of N its shard and a common start a few seconds ahead (``--loadlab-lead``),
   in that worker's clock; the worker runs ``loadlab run ARGS --shard K/N --start-at T`` in a
   child process: the asyncio runner sends, not a greenlet per user (the users Locust spawns
   only idle);
3. takes the records the workers stream as they finish (each worker reads its shard's journal
   every half second: ``loadlab.locust._sender``) into one journal, each record with its ``worker`` and ``host``;
4. once every shard ended or its worker vanished (Locust marks a worker missing after three
   seconds without a heartbeat), measures the offsets again and writes one results file:
   a vanished worker's unreported requests counted lost, the run saturated if any shard was,
   a clock too uncertain for ``--loadlab-clock-ms`` said (``extra.distributed``).

Exit code (headless): 0; 3 when a worker was lost or no request succeeded; 2 when the results
file could not be written where asked.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import math
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gevent
from gevent.event import AsyncResult
from locust import User, constant, events, task
from locust.runners import STATE_MISSING, MasterRunner, WorkerRunner

from loadlab.errors import UsageError
from loadlab.journal import JournalWriter, default_out_path, prepare_output
from loadlab.locust import _sender as sender
from loadlab.locust._fleet import ShardRun, assemble, clock_offset, worker_start
from loadlab.locust._hooks import JournalFeed
from loadlab.locust._sender import DONE, PING, PONG, RECORDS, SHARD, step_back

__all__ = ["OpenLoopUser"]

log = logging.getLogger("loadlab.locust._openloop")

PINGS = 8
PING_TIMEOUT_S = 2.0
_OWN_FLAGS = ("--shard", "--start-at", "--out", "--workers", "--no-progress")


class OpenLoopUser(User):
    """Present only because Locust runs users: loadlab's runner does the sending."""

    wait_time = constant(3600)

    @task
    def idle(self) -> None:
        """Nothing: the shard's ``loadlab run`` child process sends the load."""


@events.init_command_line_parser.add_listener
def _options(parser: Any, **_: Any) -> None:
    g = parser.add_argument_group("loadlab open loop", "loadlab's runner on every worker")
    g.add_argument("--loadlab-run", default="", help="the run: `loadlab run` flags, quoted")
    g.add_argument("--loadlab-out", default="", help="the results file (master)")
    g.add_argument("--loadlab-lead", type=float, default=5.0,
                   help="seconds from the test's start to the load's common start")  # fmt: skip
    g.add_argument("--loadlab-clock-ms", type=float, default=1.0,
                   help="clock uncertainty (ms) a run's timing figures can bear")  # fmt: skip


class _Master:
    def __init__(self) -> None:
        self.args: list[str] = []
        self.config: dict[str, Any] = {}
        self.out = Path()
        self.journal: JournalFeed | None = None
        self.shards: dict[str, ShardRun] = {}
        self.pongs: dict[int, AsyncResult] = {}
        self.seq = itertools.count()
        self.started = False
        self.coordinator: gevent.Greenlet | None = None


_M = _Master()


@events.init.add_listener
def _on_init(environment: Any, **_: Any) -> None:
    runner = environment.runner
    if isinstance(runner, MasterRunner):
        _check_run(environment.parsed_options)
        for name, handler in ((PONG, _on_pong), (RECORDS, _on_records), (DONE, _on_done)):
            runner.register_message(name, handler)
        _wrap_quit(runner)
    elif isinstance(runner, WorkerRunner):
        sender.register(runner)
    else:
        print("loadlab open loop: run Locust as --master with --worker processes", file=sys.stderr)
        raise SystemExit(2)


@events.test_stop.add_listener
def _on_test_stop(environment: Any, **_: Any) -> None:
    if isinstance(environment.runner, WorkerRunner):
        sender.stop_shards()


@events.test_start.add_listener
def _on_test_start(environment: Any, **_: Any) -> None:
    if isinstance(environment.runner, MasterRunner) and not _M.started:
        _M.started = True
        _M.coordinator = gevent.spawn(_coordinate, environment)
        _M.coordinator.link_exception(_crashed(environment))


# ------------------------------------------------------------------ master


def _check_run(opts: Any) -> None:
    """``--loadlab-run`` as ``loadlab run`` reads it, and the journal started; else exit 2."""
    from loadlab._commands.flags import add_run_arguments, config_from_args
    from loadlab._runner.run import check

    try:
        for flag, value, most in (("--loadlab-lead", opts.loadlab_lead, 3600.0),
                                  ("--loadlab-clock-ms", opts.loadlab_clock_ms, 60_000.0)):  # fmt: skip
            if not (math.isfinite(value) and 0 < value <= most):
                raise UsageError(f"{flag} must be > 0 and <= {most:g}, got {value}")
        args = shlex.split(opts.loadlab_run or "")
        if not args:
            raise UsageError('give the run: --loadlab-run "--endpoint URL --rate R --requests N"')
        for flag in _OWN_FLAGS:
            if any(a == flag or a.startswith(flag + "=") for a in args):
                raise UsageError(f"--loadlab-run: leave out {flag}; the master sets it per worker")
        cfg = config_from_args(_run_parser(add_run_arguments).parse_args(args))
        if len(cfg.endpoints) != 1:
            raise UsageError(
                "--loadlab-run: give one --endpoint URL (or a scenario naming one): every "
                f"worker loads the same server, got {len(cfg.endpoints)}"
            )
        if cfg.seed is None:  # every shard must draw the same requests
            cfg = cfg.seeded()
            args += ["--seed", str(cfg.seed)]
        check(cfg)
        out = Path(opts.loadlab_out or default_out_path("distributed"))
        header = {"started_at": _now(), "kind": "run", "endpoint": "distributed",
                  "config": cfg.to_dict()}  # fmt: skip
        _M.journal = JournalFeed(JournalWriter(prepare_output(out, header, flag="--loadlab-out")))
    except (UsageError, ValueError) as exc:
        print(f"locust: loadlab: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    _M.args, _M.config, _M.out = args, cfg.to_dict(), out


def _run_parser(add: Any) -> Any:
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> Any:
            raise UsageError(f"--loadlab-run: {message}")

    p = Parser(prog="--loadlab-run", add_help=False)
    add(p)
    return p


def _coordinate(environment: Any) -> None:
    runner, opts = environment.runner, environment.parsed_options
    nodes = sorted(_alive(runner), key=runner.get_worker_index)
    if not nodes:
        log.error("loadlab: no worker has connected; start workers first (--expect-workers N)")
        environment.process_exit_code = 2
        runner.quit()
        return
    _M.shards = {node: ShardRun(k, node) for k, node in enumerate(nodes)}
    for s in _M.shards.values():
        s.clock_start = _measure(runner, s)
    start_at = time.time() + float(opts.loadlab_lead)
    for node, s in _M.shards.items():
        job = {
            "index": s.index,
            "count": len(nodes),
            "args": _M.args,
            "start_at": worker_start(start_at, s.clock_start),
        }
        runner.send_message(SHARD, job, client_id=node)
    log.info("loadlab: %d shards start at %.3f (Unix s)", len(nodes), start_at)
    step_back()  # taking records in gives way to senders on this machine
    while not all(s.finished or s.node not in _alive(runner) for s in _M.shards.values()):
        gevent.sleep(0.2)
    for s in _M.shards.values():
        if s.finished and s.node in _alive(runner):
            s.clock_end = _measure(runner, s)
    _finish(environment, start_at)


def _alive(runner: Any) -> set[str]:
    return {c.id for c in runner.clients.all if c.state != STATE_MISSING}


def _measure(runner: Any, shard: ShardRun) -> dict[str, Any] | None:
    """Ping the worker ``PINGS`` times; the offset of the fastest round trip."""
    pings = []
    for _ in range(PINGS):
        seq = next(_M.seq)
        _M.pongs[seq] = answer = AsyncResult()
        t_send = time.time_ns()
        runner.send_message(PING, {"seq": seq}, client_id=shard.node)
        try:
            data, t_recv = answer.get(timeout=PING_TIMEOUT_S)
        except gevent.Timeout:
            continue
        finally:
            _M.pongs.pop(seq, None)
        shard.host, shard.address = data["host"], data["address"]
        pings.append((t_send, int(data["wall_ns"]), t_recv))
    return clock_offset(pings) if pings else None


def _on_pong(environment: Any, msg: Any, **_: Any) -> None:
    answer = _M.pongs.get(msg.data["seq"])
    if answer is not None:
        answer.set((msg.data, time.time_ns()))


def _on_records(environment: Any, msg: Any, **_: Any) -> None:
    shard = _M.shards.get(msg.node_id)
    if shard is not None:
        _journal(shard.add(msg.data["records"]))


def _on_done(environment: Any, msg: Any, **_: Any) -> None:
    shard = _M.shards.get(msg.node_id)
    if shard is None:
        return
    _journal(shard.add(msg.data.get("records", [])))
    shard.result, shard.error = msg.data.get("result"), msg.data.get("error")
    if shard.error:
        log.error("loadlab: shard %d failed: %s", shard.index, shard.error)


def _journal(records: list[Any]) -> None:
    if _M.journal is not None:
        _M.journal.add(records)


def _schedule(k: int, n: int) -> Iterator[tuple[str, float | None]]:
    """Shard ``k`` of ``n``'s requests, rebuilt here to count a lost worker's."""
    from loadlab._commands.flags import add_run_arguments, config_from_args
    from loadlab._runner.shard import partition
    from loadlab.workloads import build_requests

    cfg = config_from_args(_run_parser(add_run_arguments).parse_args(_M.args))
    for spec in partition(build_requests(cfg, read_ahead=0), n, k, cfg.requests):
        yield spec.request_id, spec.intended_at_s


def _finish(environment: Any, start_at: float) -> None:
    from loadlab._report.text import render_summary
    from loadlab.journal import save_results

    opts = environment.parsed_options
    engine = {"engine": "locust", "start_at": start_at, "master_host": socket.gethostname()}
    results = assemble(list(_M.shards.values()), _M.config, _schedule, engine=engine,
                       clock_bound_ms=float(opts.loadlab_clock_ms))  # fmt: skip
    results.started_at = dt.datetime.fromtimestamp(start_at, dt.UTC).isoformat(timespec="seconds")
    if _M.journal is not None:
        _M.journal.join()
    path, note = save_results(results, _M.out, _M.journal.writer.journal if _M.journal else None)
    if note:
        log.error("loadlab: %s", note)
    print(render_summary(results), flush=True)
    info = results.extra["distributed"]
    for k, w in info["workers"].items():
        if w["clock_warning"]:
            log.warning("loadlab: shard %s: %s", k, w["clock_warning"])
    code = 0
    if info["workers_lost"] or not any(r.ok for r in results.records):
        log.error("loadlab: shards %s lost: %d requests counted lost", info["workers_lost"],
                  info["records_lost"])  # fmt: skip
        code = 3
    if path != _M.out:
        code = max(code, 2)
    log.info("loadlab: %d records from %d shards in %s", len(results.records), info["count"], path)
    environment.process_exit_code = code
    if opts.headless:
        environment.runner.quit()


def _wrap_quit(runner: Any) -> None:
    """Locust's own quit (``--run-time``, Ctrl-C) first stops the shards (each writes and
    ships what it has), then waits for the file: the run ends with its results, never without."""
    locust_quit = runner.quit

    def quit() -> None:
        running = _M.coordinator
        if running is not None and not running.dead and gevent.getcurrent() is not running:
            runner.stop()  # the workers' test_stop interrupts their shards
            running.join()  # it quits when the file is written
            return
        locust_quit()

    runner.quit = quit


def _crashed(environment: Any) -> Any:
    def on_error(greenlet: gevent.Greenlet) -> None:
        log.error("loadlab: the coordinator failed: %r", greenlet.exception)
        environment.process_exit_code = 2
        environment.runner.quit()

    return on_error


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")

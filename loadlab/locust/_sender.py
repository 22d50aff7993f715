"""The worker side of an open-loop run on Locust (``loadlab.locust._openloop``): it answers the
master's clock pings, runs its shard with ``loadlab run --shard K/N --start-at T`` in a child
process, ships the records that run journals as they finish, then the shard's results file.

A stop (the web UI's, Locust's ``--run-time``, the master quitting) interrupts a running shard
as Ctrl-C does, so what it has is still written and shipped; a worker that dies takes its shard
with it (the child asks Linux for SIGTERM when its parent dies).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gevent
import orjson

from loadlab._runner.signals import stop_parent_death
from loadlab.journal import journal_path
from loadlab.locust._fleet import JournalTail

__all__ = ["DONE", "PING", "PONG", "RECORDS", "SHARD", "register", "step_back", "stop_shards"]

PING, PONG = "loadlab_ping", "loadlab_pong"
SHARD, RECORDS, DONE = "loadlab_shard", "loadlab_shard_records", "loadlab_shard_done"
STREAM_INTERVAL_S = 0.5
BACKGROUND_NICE = 10  # the nice value of a worker's and the master's own work during a run


def register(runner: Any) -> None:
    """Answer the master's messages on this worker's ``runner``."""
    runner.register_message(PING, _on_ping)
    runner.register_message(SHARD, _on_shard)


def _on_ping(environment: Any, msg: Any, **_: Any) -> None:
    reply = {"seq": msg.data["seq"], "wall_ns": time.time_ns(), "host": socket.gethostname(),
             "address": _address(environment.parsed_options)}  # fmt: skip
    environment.runner.send_message(PONG, reply)


def _address(opts: Any) -> str:
    """This worker's address toward the master (the source address a packet would have)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((opts.master_host, int(opts.master_port)))
            return str(s.getsockname()[0])
    except OSError:
        return ""


_CHILDREN: list[subprocess.Popen[bytes]] = []


def _on_shard(environment: Any, msg: Any, **_: Any) -> None:
    gevent.spawn(_run_shard, environment, msg.data)


def stop_shards() -> None:
    """Stop pressed in the web UI (or the master quitting): a running shard stops as on
    Ctrl-C, its results so far written and shipped."""
    for proc in _CHILDREN:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)


def step_back() -> None:
    """Let this process's work during a run (a worker shipping records, the master writing
    them) give way to the sending processes on the same machine: nice 10 from now on. Its
    bursts, every half second, would otherwise delay sends that fall due during them."""
    with contextlib.suppress(OSError):
        if os.getpriority(os.PRIO_PROCESS, 0) < BACKGROUND_NICE:
            os.setpriority(os.PRIO_PROCESS, 0, BACKGROUND_NICE)


def _sender_process() -> None:
    """In the shard's child before it runs: stop with the worker, and take back the normal
    priority where a worker that stepped back for an earlier shard may grant it. Runs between
    fork and exec: it imports nothing."""
    stop_parent_death()
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, 0)


def _run_shard(environment: Any, job: dict[str, Any]) -> None:
    """``loadlab run`` on this worker's shard in a child process; its records shipped as its
    journal gains them, then what they were not, with the shard's results file."""
    k, folder = int(job["index"]), Path(tempfile.mkdtemp(prefix="loadlab-shard-"))
    out = folder / f"shard-{k}.json"
    cmd = [sys.executable, "-m", "loadlab", "run", *job["args"], "--no-progress",
           "--shard", f"{k}/{job['count']}", "--start-at", repr(job["start_at"]), "--out", str(out)]  # fmt: skip
    with (folder / "stderr.txt").open("wb") as err:
        # _sender_process: the shard stops with this worker, whatever kills it
        proc = subprocess.Popen(  # noqa: S603 (this interpreter, loadlab's own flags)
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            preexec_fn=_sender_process,
        )
    _CHILDREN.append(proc)  # a stop interrupts it (_on_test_stop)
    step_back()
    tail, shipped = JournalTail(journal_path(out)), set[str]()
    while proc.poll() is None:
        gevent.sleep(STREAM_INTERVAL_S)
        _ship(environment, RECORDS, {"records": tail.read()}, shipped)
    done: dict[str, Any] = {"records": tail.read(), "rc": proc.returncode}
    try:
        result = orjson.loads(out.read_bytes())
        done["records"] += result.pop("records")
        done["result"] = result
    except (OSError, ValueError):
        why = (folder / "stderr.txt").read_text(errors="replace").strip().splitlines()
        done["error"] = f"loadlab run exited {proc.returncode}: {' / '.join(why[-3:])}"
    _ship(environment, DONE, done, shipped)
    _CHILDREN.remove(proc)
    shutil.rmtree(folder, ignore_errors=True)


def _ship(environment: Any, kind: str, body: dict[str, Any], shipped: set[str]) -> None:
    """Send ``body`` with the records not sent before (a record reaches the master once)."""
    body["records"] = [r for r in body["records"] if r["request_id"] not in shipped]
    shipped.update(r["request_id"] for r in body["records"])
    if body["records"] or kind == DONE:
        environment.runner.send_message(kind, body)

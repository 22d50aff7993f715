"""The journal: every finished request appended to a JSON-lines file next to the results file
while the run goes on, so a crash, a ``kill -9`` or a full disk loses at most the last
``INTERVAL_S`` of records (issue 17, item 2).

Layout of ``<results stem>.journal.jsonl`` (``journal_path``)::

    {"schema": "loadlab.journal", "version": 1, "started_at": ..., "kind": "run",
     "endpoint": NAME, "config": {... redacted ...}}          the header, written before the run
    {"record": RequestRecord.to_dict()}                          one line per finished request
    ...

The header is written (and fsync'd) by ``loadlab run`` before any request is sent: that write
is also the check that the results folder is writable and has room (``prepare_output``). Each
process of a run (``--workers N``) appends its own records with ``O_APPEND``, one ``write`` per
flush, so lines of different processes never interleave. A flush writes the records finished
since the last one and fsyncs, every ``INTERVAL_S``, off the event loop (a thread), so neither
serialising nor the disk delays a timestamp. When the results file has been written the
journal is deleted; when that write fails the journal stays and ``loadlab run`` says where.

``loadlab report --from-journal J --out R.json`` rebuilds a results file (``read_journal``): the
records, the config, the start label; a torn last line (the process killed mid-write) is
skipped; the rebuilt file says ``extra["from_journal"]`` so nobody mistakes it for a whole run.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from loadlab.errors import ConfigError, ResultsError
from loadlab.records import RequestRecord
from loadlab.results import Results, redact

__all__ = [
    "FIRST_WRITE_BYTES",
    "INTERVAL_S",
    "JOURNAL_SCHEMA",
    "JournalWriter",
    "journal_path",
    "prepare_output",
    "read_journal",
]

JOURNAL_SCHEMA = "loadlab.journal"
JOURNAL_VERSION = 1
INTERVAL_S = 1.0  # records are fsync'd this often: a kill -9 loses at most this much
FIRST_WRITE_BYTES = 64 * 1024  # the free space ``loadlab run`` needs before it sends anything


def journal_path(results_path: str | os.PathLike[str]) -> Path:
    """``reports/run.json`` -> ``reports/run.journal.jsonl`` (not matched by ``*.json``)."""
    p = Path(results_path)
    return p.with_name(f"{p.stem}.journal.jsonl")


def prepare_output(
    results_path: str | os.PathLike[str], header: Mapping[str, Any], flag: str = "--out"
) -> Path:
    """Check, before any request is sent, that ``results_path`` can be written, and start its
    journal with ``header``. Raises ``ConfigError`` (exit 2) naming the path and the fix."""
    p = Path(results_path)
    if p.is_dir():
        raise ConfigError(f"{flag} {p} is a directory; name a file in it, e.g. {p / 'run.json'}")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"{flag} {p}: cannot create the folder {p.parent}: {exc.strerror or exc}; "
            f"choose another {flag}"
        ) from exc
    if p.exists() and not os.access(p, os.W_OK):
        raise ConfigError(f"{flag} {p} exists and is not writable; choose another {flag}")
    free = shutil.disk_usage(p.parent).free
    if free < FIRST_WRITE_BYTES:
        raise ConfigError(
            f"{flag} {p}: only {free} bytes free in {p.parent} (at least {FIRST_WRITE_BYTES} "
            f"needed); free some space or choose another {flag}"
        )
    journal = journal_path(p)
    line = json.dumps(
        {
            "schema": JOURNAL_SCHEMA,
            "version": JOURNAL_VERSION,
            **{k: v for k, v in header.items() if k != "config"},
            "config": redact(header.get("config", {})),
        },
        separators=(",", ":"),
    )
    try:
        fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise ConfigError(
            f"{flag} {p}: cannot write in {p.parent}: {exc.strerror or exc}; choose another {flag}"
        ) from exc
    return journal


class JournalWriter:
    """Appends finished records to a journal every ``interval_s`` (``Runner`` calls ``add``).

    A write that fails (a full disk) does not stop the run: the writer keeps the error in
    ``error``, stops writing and the run's records still go to the results file."""

    def __init__(self, path: str | os.PathLike[str], interval_s: float = INTERVAL_S) -> None:
        self.path = Path(path)
        self.interval_s = interval_s
        self.error: str | None = None
        self.written = 0
        self._pending: list[RequestRecord] = []
        self._lock = threading.Lock()  # one flush at a time (the periodic one, the last one)
        self._inflight: asyncio.Future[None] | None = None

    def add(self, rec: RequestRecord) -> None:
        self._pending.append(rec)  # the hot path: a list append

    async def run(self) -> None:
        """Flush every ``interval_s`` until cancelled (then ``close``)."""
        while True:
            await asyncio.sleep(self.interval_s)
            await self.flush()

    async def flush(self) -> None:
        batch, self._pending = self._pending, []
        if batch and self.error is None:
            self._inflight = asyncio.get_running_loop().run_in_executor(None, self._write, batch)
            # shielded: cancelling the periodic task must not leave a write behind unawaited
            await asyncio.shield(self._inflight)

    async def close(self) -> None:
        """Wait for a write in progress, then write what is left."""
        if self._inflight is not None:
            await self._inflight
        await self.flush()

    def _write(self, batch: list[RequestRecord]) -> None:
        data = b"".join(map(_line, batch))
        with self._lock:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fsync(fd)
                finally:
                    os.close(fd)
                self.written += len(batch)
            except OSError as exc:
                self.error = f"{self.path}: {exc.strerror or exc}"


def _line(rec: RequestRecord) -> bytes:
    """One record's journal line. orjson takes a tenth of json's time over a record's
    timestamps, and this runs for every request while the run goes on (in the flush thread,
    which holds the GIL while it serialises); json writes what orjson refuses."""
    entry = {"record": rec.to_dict()}
    try:
        return orjson.dumps(entry, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:  # an integer past 64 bits in ``server``
        return (json.dumps(entry, separators=(",", ":")) + "\n").encode()


def read_journal(path: str | os.PathLike[str]) -> Results:
    """A results file rebuilt from a journal; raises ``ResultsError`` naming file and line."""
    p = Path(path)
    try:
        lines = p.read_bytes().split(b"\n")
    except OSError as exc:
        raise ResultsError(f"{p}: cannot read journal: {exc.strerror or exc}") from exc
    try:
        header = json.loads(lines[0])
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{p}: line 1 is not a loadlab journal header") from exc
    if not isinstance(header, dict) or header.get("schema") != JOURNAL_SCHEMA:
        raise ResultsError(f'{p}: not a loadlab journal (no "schema": "{JOURNAL_SCHEMA}")')
    if header.get("version") != JOURNAL_VERSION:
        raise ResultsError(f"{p}: journal version {header.get('version')!r}, this loadlab reads 1")
    records: list[RequestRecord] = []
    body = [(n, line) for n, line in enumerate(lines[1:], start=2) if line.strip()]
    for i, (n, line) in enumerate(body):
        try:
            entry = json.loads(line)
            records.append(RequestRecord.from_dict(entry["record"]))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
            if i == len(body) - 1 and lines[-1].strip():
                continue  # a torn last line: the process was killed in the middle of a write
            raise ResultsError(f"{p}: line {n}: not a journal record ({exc})") from exc
        except ValueError as exc:
            raise ResultsError(f"{p}: line {n}: {exc}") from exc
    end_ns = max((t for r in records for t in (r.end_ns, r.sent_ns) if t is not None), default=0)
    return Results(
        records=records,
        config=dict(header.get("config") or {}),
        started_at=str(header.get("started_at", "")),
        duration_ns=end_ns,
        scheduled=len(records),
        workers=max(1, len({r.worker for r in records})),
        kind=str(header.get("kind", "run")),
        extra={"from_journal": str(p), "interrupted": True},
    )

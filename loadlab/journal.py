"""The journal: every finished request appended to a JSON-lines file next to the results file
while the run goes on, so a crash, a ``kill -9`` or a full disk loses at most the last
``INTERVAL_S`` of records.

Layout of ``<results stem>.journal.jsonl`` (``journal_path``)::

    {"schema": "loadlab.journal", "version": 1, "started_at": ..., "kind": "run", "pid": ...,
     "endpoint": NAME, "config": {... redacted ...}}          the header, written before the run
    {"record": RequestRecord.to_dict()}                          one line per finished request
    ...

One journal, one run. ``prepare_output`` (before any request is sent) writes the header to a
temporary file and links it to the journal's name, which fails if the name is taken: a journal
never exists without its header, and a second run with the same ``--out`` stops at once,
told whether the first is still running (its journal is locked, ``flock``, until it ends) or
left a journal to rebuild. That write is also the check that the folder is writable and has
room. Each process of a run (``--workers N``) appends its own records with ``O_APPEND``, one
``write`` per flush, so lines of different processes never interleave; a flush writes the
records finished since the last one and fsyncs, every ``INTERVAL_S``, off the event loop.

A full disk: the first write it refuses moves the journal to another disk (``relocated``: the
temporary, home or working folder, the first on another filesystem) with the lines
written so far, says so on stderr, and every process of the run continues there. At the end
``save_results`` writes the results file, or the same file on another disk, and says where it
is; only when neither can be written does it point at the journal, with how many records the
journal holds. The journals are deleted once a results file holds every record.

``loadlab report --from-journal J --out R.json`` rebuilds a results file (``read_journal``): the
records, the config, the start label. A line that cannot be read (torn by a kill or a full
disk) is skipped and counted, a record given twice is read once, and the rebuilt file says
``extra["from_journal"]`` so nobody mistakes it for a whole run.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import orjson

from loadlab.errors import ConfigError, ResultsError
from loadlab.records import RequestRecord
from loadlab.results import Results, redact, write_results

__all__ = [
    "FIRST_WRITE_BYTES",
    "INTERVAL_S",
    "JOURNAL_SCHEMA",
    "JournalWriter",
    "default_out_path",
    "discard_journal",
    "journal_note",
    "journal_path",
    "prepare_output",
    "read_journal",
    "relocated",
    "save_results",
]

JOURNAL_SCHEMA = "loadlab.journal"
JOURNAL_VERSION = 1
INTERVAL_S = 1.0  # records are fsync'd this often: a kill -9 loses at most this much
FIRST_WRITE_BYTES = 64 * 1024  # the free space ``loadlab run`` needs before it sends anything

_LOCKS: dict[Path, int] = {}  # journal -> the descriptor holding its lock while the run lasts


def journal_path(results_path: str | os.PathLike[str]) -> Path:
    """``reports/run.json`` -> ``reports/run.journal.jsonl`` (not matched by ``*.json``)."""
    p = Path(results_path)
    return p.with_name(f"{p.stem}.journal.jsonl")


def default_out_path(prefix: str, folder: str = "reports") -> Path:
    """``reports/<prefix>-<UTC time to the microsecond>Z-<pid>.json``, a name no file or
    journal has: two runs started in the same second (CI jobs) never share it."""
    while True:
        now = datetime.now(UTC)
        p = Path(folder) / f"{prefix}-{now:%Y%m%dT%H%M%S.%f}Z-{os.getpid()}.json"
        if not p.exists() and not journal_path(p).exists():
            return p


def relocated(path: str | os.PathLike[str]) -> Path | None:
    """Where ``path`` goes when its disk refuses it: the same name, tagged with a hash of the
    whole path, in the temporary folder (``TMPDIR``), the home folder or the working folder,
    the first that is on another filesystem; None when there is none."""
    p = Path(path).absolute()
    try:
        device = os.stat(p.parent).st_dev
    except OSError:
        return None
    tag = hashlib.sha1(str(p).encode(), usedforsecurity=False).hexdigest()[:8]
    for where in (tempfile.gettempdir, Path.home, Path.cwd):
        with contextlib.suppress(OSError, RuntimeError):  # no home, a working folder gone
            folder = Path(where())
            if os.stat(folder).st_dev != device and os.access(folder, os.W_OK):
                return folder / f"loadlab-{tag}-{p.name}"
    return None


# ------------------------------------------------------------------ before the run


def prepare_output(
    results_path: str | os.PathLike[str], header: Mapping[str, Any], flag: str = "--out"
) -> Path:
    """Check, before any request is sent, that ``results_path`` can be written, and start its
    journal with ``header`` (locked until ``discard_journal`` or the process's end). Raises
    ``ConfigError`` (exit 2) naming the path and the fix."""
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
    if _latest(journal).exists():  # its own, or moved to another disk
        raise ConfigError(_taken(journal, p, flag))
    line = json.dumps(
        {
            "schema": JOURNAL_SCHEMA,
            "version": JOURNAL_VERSION,
            "pid": os.getpid(),
            **{k: v for k, v in header.items() if k != "config"},
            "config": redact(header.get("config", {})),
        },
        separators=(",", ":"),
    )
    tmp = journal.with_name(f".{journal.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as exc:
        raise ConfigError(
            f"{flag} {p}: cannot write in {p.parent}: {exc.strerror or exc}; choose another {flag}"
        ) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # on the file, so held under its journal name too
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
        if not _publish(tmp, journal):
            raise ConfigError(_taken(journal, p, flag))
    except OSError as exc:
        os.close(fd)
        raise ConfigError(
            f"{flag} {p}: cannot write in {p.parent}: {exc.strerror or exc}; choose another {flag}"
        ) from exc
    except BaseException:
        os.close(fd)
        raise
    finally:
        tmp.unlink(missing_ok=True)
    if not _LOCKS:
        atexit.register(_drop_empty, os.getpid())
    _LOCKS[journal] = fd
    return journal


def _drop_empty(pid: int) -> None:
    """At exit: a journal whose run ended before any record (an error, a Ctrl-C while the
    endpoint was probed) is deleted, so it does not stop the next run with the same name."""
    if os.getpid() == pid:  # not in a forked child
        for journal in list(_LOCKS):
            if not _holds_records(journal):
                discard_journal(journal)


def _holds_records(journal: Path) -> bool:
    try:
        with journal.open("rb") as fh:
            fh.readline()
            return bool(fh.readline().strip())
    except OSError:
        return False


def _publish(tmp: Path, path: Path) -> bool:
    """Give the complete file ``tmp`` the name ``path`` unless that name is taken (a link is
    atomic: of two processes racing, one wins); False when it was."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError:  # a filesystem without links (FAT, some network mounts)
        if path.exists():
            return False
        os.replace(tmp, path)
    return True


def _latest(journal: Path) -> Path:
    """The journal of a run, or its copy on another disk when the run moved it there."""
    moved = relocated(journal)
    return moved if moved is not None and moved.exists() else journal


def _taken(journal: Path, results: Path, flag: str) -> str:
    """Why a run cannot start on ``results``: another run is writing it, or left a journal."""
    with contextlib.suppress(OSError):
        fd = os.open(journal, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return (
                f"{flag} {results}: another loadlab run is writing it now (its journal "
                f"{journal} is in use); give this run another {flag}"
            )
        finally:
            os.close(fd)
    left = _latest(journal)
    if not _holds_records(left):
        return (
            f"{flag} {results}: {journal} is left by a run that stopped before any request "
            f"finished; delete it, or give this run another {flag}"
        )
    files = " and ".join(str(j) for j in dict.fromkeys((journal, left)) if j.exists())
    return (
        f"{flag} {results}: {left} holds the records of a run that did not finish; rebuild "
        f"its results with: loadlab report --from-journal {left} --out NEW.json, then delete "
        f"{files}; or give this run another {flag}"
    )


# ------------------------------------------------------------------ during the run


class JournalWriter:
    """Appends finished records to a journal every ``interval_s`` (``Runner`` calls ``add``).

    A write that the disk refuses moves the journal to another disk (said on stderr); a write
    that fails there too stops the journal (``error``) and the run goes on, its records in
    memory for the results file. ``write`` is the synchronous form (for callers that run their
    own thread: the Locust master)."""

    def __init__(self, path: str | os.PathLike[str], interval_s: float = INTERVAL_S) -> None:
        self.path = Path(path)  # where the next write goes
        self.journal = self.path  # where the run started it
        self.interval_s = interval_s
        self.error: str | None = None
        self.written = 0
        self._elsewhere = relocated(self.journal)
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

    def write(self, batch: list[RequestRecord]) -> None:
        if batch and self.error is None:
            self._write(batch)

    def _write(self, batch: list[RequestRecord]) -> None:
        data = b"".join(map(_line, batch))
        with self._lock:
            if self._append(data):
                self.written += len(batch)

    def _append(self, data: bytes) -> bool:
        """``data`` at the journal's end, or at the end of the journal moved to another disk."""
        moved = self._elsewhere
        if self.path == self.journal and moved is not None and moved.exists():
            self.path = moved  # another process of this run moved it
        try:
            _append(self.path, data)
            return True
        except OSError as exc:
            why = f"{self.path}: {exc.strerror or exc}"
            if self.path != self.journal or isinstance(exc, FileNotFoundError):
                self.error = why  # already moved, or the journal is gone: nothing more to try
                return False
            if moved is None:
                self.error = f"{why}; no other disk to write to"
                return False
        try:
            _move(self.journal, moved)
            _append(moved, data)
        except OSError as exc2:
            self.error = f"{why}; and {moved}: {exc2.strerror or exc2}"
            return False
        self.path = moved
        print(
            f"loadlab: cannot write the journal {why}; it continues in {moved}",
            file=sys.stderr,
            flush=True,
        )
        return True


def _append(path: Path, data: bytes) -> None:
    # no O_CREAT: a journal that is gone (the run ended, or someone deleted it) is never
    # recreated without its header
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _move(journal: Path, moved: Path) -> None:
    """Copy the journal's complete lines to ``moved``; the first process of a run to get there
    wins, the others append to its copy."""
    if moved.exists():
        return
    tmp = moved.with_name(f".{moved.name}.{os.getpid()}.tmp")
    try:
        with journal.open("rb") as src, tmp.open("w+b") as dst:
            shutil.copyfileobj(src, dst)
            dst.truncate(_complete_length(dst))  # drop the line the full disk tore
            dst.flush()
            os.fsync(dst.fileno())
        _publish(tmp, moved)
    finally:
        tmp.unlink(missing_ok=True)


def _complete_length(fh: IO[bytes]) -> int:
    """Bytes of ``fh`` up to and including its last newline."""
    pos = fh.seek(0, os.SEEK_END)
    while pos > 0:
        start = max(0, pos - 65536)
        fh.seek(start)
        i = fh.read(pos - start).rfind(b"\n")
        if i >= 0:
            return start + i + 1
        pos = start
    return 0


# ------------------------------------------------------------------ after the run


def save_results(
    results: Results, path: str | os.PathLike[str], journal: Path | None
) -> tuple[Path | None, str | None]:
    """Write the results file, else the same file on another disk (``relocated``), and delete
    the journal once a file holds every record. Returns where the file is (None: nowhere) and,
    when that is not ``path``, what to tell the user: exactly where the records are."""
    p = Path(path)
    try:
        write_results(results, p)
        discard_journal(journal)
        return p, None
    except OSError as exc:
        why = f"could not write {p}: {exc.strerror or exc}"
    other = relocated(p)
    if other is not None:
        try:
            write_results(results, other)
            discard_journal(journal)
            return other, f"{why}; the results (every record) are in {other} instead"
        except OSError as exc:
            why += f", nor {other}: {exc.strerror or exc}"
    return None, f"{why}; {_journal_holds(journal, len(results.records))}"


def _journal_holds(journal: Path | None, n: int) -> str:
    j = _latest(journal) if journal is not None else None
    try:
        held = len(read_journal(j).records) if j is not None else 0
    except ResultsError:
        held = 0
    rebuild = f"rebuild the results with: loadlab report --from-journal {j} --out NEW.json"
    if held >= n:
        return f"every record is in the journal {j}: {rebuild}"
    if held:
        return f"the journal {j} holds {held} of the {n} records ({rebuild}); {n - held} are lost"
    return f"no file holds the records: all {n} are lost"


def discard_journal(journal: Path | None) -> None:
    """Delete a journal (and its copy on another disk) whose records a results file holds, and
    release its lock."""
    if journal is None:
        return
    moved = relocated(journal)
    for p in (journal, moved):
        if p is not None:
            with contextlib.suppress(OSError):
                p.unlink()
    fd = _LOCKS.pop(journal, None)
    if fd is not None:
        os.close(fd)


# ------------------------------------------------------------------ reading it back


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
    """A results file rebuilt from a journal; raises ``ResultsError`` naming file and line.

    Lines that cannot be read are skipped and counted, and a record that appears twice (the
    same endpoint, worker and request id) is read once: ``extra["journal"]`` says how many."""
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
    seen: set[tuple[str, int, str]] = set()
    skipped: list[int] = []
    first_error = ""
    duplicates = 0
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            rec = RequestRecord.from_dict(json.loads(line)["record"])
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
            skipped.append(n)
            first_error = first_error or f"line {n}: not a journal record ({exc})"
            continue
        except ValueError as exc:
            skipped.append(n)
            first_error = first_error or f"line {n}: {exc}"
            continue
        key = (rec.endpoint, rec.worker, rec.request_id)
        if key in seen:
            duplicates += 1
            continue
        seen.add(key)
        records.append(rec)
    if skipped and not records:
        raise ResultsError(f"{p}: {first_error}")
    end_ns = max((t for r in records for t in (r.end_ns, r.sent_ns) if t is not None), default=0)
    extra: dict[str, Any] = {"from_journal": str(p), "interrupted": True}
    if skipped or duplicates:
        extra["journal"] = {
            "lines_skipped": len(skipped),
            "first_skipped": skipped[:5],
            "duplicates": duplicates,
        }
    return Results(
        records=records,
        config=dict(header.get("config") or {}),
        started_at=str(header.get("started_at", "")),
        duration_ns=end_ns,
        scheduled=len(records),
        workers=max(1, len({r.worker for r in records})),
        kind=str(header.get("kind", "run")),
        extra=extra,
    )


def journal_note(results: Results) -> str | None:
    """What ``read_journal`` skipped or read once, in a sentence (None: nothing)."""
    j = results.extra.get("journal")
    if not j:
        return None
    parts = []
    if j["lines_skipped"]:
        lines = ", ".join(map(str, j["first_skipped"]))
        more = ", ..." if j["lines_skipped"] > len(j["first_skipped"]) else ""
        parts.append(
            f"skipped {j['lines_skipped']} line(s) that could not be read (line {lines}{more}: "
            "torn by a kill or a full disk)"
        )
    if j["duplicates"]:
        parts.append(f"read {j['duplicates']} record(s) that appeared twice once")
    return f"{'; '.join(parts)}; {len(results.records)} records rebuilt"

"""The results file: one JSON document per run, read by every offline command.

Layout (schema ``loadlab.results``, version ``SCHEMA_VERSION``)::

    {
      "schema": "loadlab.results", "version": 1,
      "run":        {"started_at": ISO-8601 label, "duration_ns", "window_ns": [start, end],
                     "scheduled": int, "workers": int, "kind": "run" | "selftest" | "locust" | ...},
      "config":     what was asked (secrets redacted),
      "environment":{"loadlab", "python", "platform", "host", "cpu_count", ...},
      "generator":  {"saturated": bool, "loop_lag_ms_max", "loop_lag_ms_p99", "cpu_percent_mean",
                     "parse_backlog_ms_p50", "parse_backlog_ms_p99", "parse_backlog_ms_max",
                     "threshold_ms", "samples": [[t_ns, lag_ms, cpu_percent], ...]},
      "records":    [RequestRecord.to_dict(), ...],
      "server_samples": [{"t_ns": int, "metrics": {"name{labels}": value}}, ...],
      "extra":      free-form sections (selftest truth, lab modes, capacity, ...),
      "summary":    loadlab._analysis.summary.summarize() at write time (informative; recomputed on read)
    }

Example::

    res = read_results("reports/run.json")
    df = to_dataframe(res)          # one row per request
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import math
import multiprocessing
import os
import platform
import re
import socket
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import orjson

from loadlab._analysis import metrics
from loadlab._analysis.columns import RecordColumns, RecordView, Unparsed, columns_of
from loadlab._analysis.generator import merge_parts
from loadlab._analysis.summary import has_reasoning_or_tools, summarize
from loadlab._headers import REDACTED, public_url, redact_headers
from loadlab._version import __version__
from loadlab.errors import ResultsError, parse_json
from loadlab.records import RequestRecord

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "Results",
    "ResultsError",
    "environment_info",
    "merge_results",
    "read_results",
    "redact",
    "to_dataframe",
    "write_results",
]

SCHEMA = "loadlab.results"
SCHEMA_VERSION = 1
MAX_RUN_NS = 31 * 86_400 * 10**9  # a run lasts at most 30 days (loadlab._limits), and a day more
RUN_SLACK_NS = 3_600 * 10**9  # records' times may lie this far outside their run

# Config keys whose values are secrets. Values are replaced, keys kept (so a reader sees that
# a key was set). API keys are read from the environment by *name*; the name is not secret.
_SECRET_KEY = re.compile(r"(api[_-]?key|token|secret|password|authorization)$", re.IGNORECASE)
_SECRET_ALLOWED = re.compile(r"(_env|_var|max_tokens|tokens)$", re.IGNORECASE)


@dataclass
class Results:
    """An in-memory results file. ``records`` hold times relative to the run start."""

    # a list, or for a file read from disk a RecordView of its columns (read-only)
    records: Sequence[RequestRecord]
    config: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    started_at: str = ""
    duration_ns: int = 0
    window_ns: tuple[int, int] | None = None  # measurement window; None = whole run
    scheduled: int | None = None  # None = len(records)
    workers: int = 1
    kind: str = "run"
    generator: dict[str, Any] = field(default_factory=dict)
    server_samples: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def saturated(self) -> bool:
        return bool(self.generator.get("saturated", False))

    @property
    def scheduled_count(self) -> int:
        return len(self.records) if self.scheduled is None else self.scheduled

    def measurement_window_ns(self) -> tuple[int, int]:
        """The window metrics use: the declared one, else [0, duration] (or last event)."""
        if self.window_ns is not None:
            return self.window_ns
        cols = columns_of(self.records)
        ends = np.concatenate([cols.end, cols.last_chunk, [self.duration_ns]])
        return (0, int(ends.max()))  # NONE (no time) is the smallest int64: never the max

    def to_dataframe(self) -> pd.DataFrame:
        """One row per request (pandas), derived metrics in ms beside the raw fields."""
        return to_dataframe(self)

    def to_dict(self) -> dict[str, Any]:
        return self._document([r.to_dict() for r in self.records])

    def _document(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """The file's sections, in the file's order, with ``records`` as its records."""
        return {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "run": {
                "started_at": self.started_at,
                "duration_ns": self.duration_ns,
                "window_ns": list(self.window_ns) if self.window_ns else None,
                "scheduled": self.scheduled_count,
                "workers": self.workers,
                "kind": self.kind,
            },
            "config": redact(self.config),
            "environment": self.environment,
            "generator": self.generator,
            "records": records,
            "server_samples": self.server_samples,
            "extra": self.extra,
            "summary": summarize(self).to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<dict>") -> Results:
        """A results document parsed from JSON, checked: ``ResultsError`` names ``source``,
        the record and what is wrong (a wrong type, an impossible value, a time outside the
        run). Its records are kept as columns (``RecordView``)."""
        run = _check_head(data, source)
        return cls._assemble(data, run, [_section(data, "records", list, source)], source)

    @classmethod
    def _assemble(
        cls,
        data: Mapping[str, Any],
        run: dict[str, Any],
        batches: Iterable[Sequence[Any] | bytes | Callable[[], bytes]],
        source: str,
        map_parts: Callable[..., Iterable[Any]] = map,
        total_bytes: int | None = None,
    ) -> Results:
        """A Results from the checked ``run`` section, the record batches and ``data``'s other
        sections (read only after the batches: a file streams its records first)."""
        try:
            span = run_span_ns(run["duration_ns"])
            cols = RecordColumns.from_dicts(batches, span, map_parts, total_bytes)
        except (TypeError, ValueError) as exc:
            raise ResultsError(f"{source}: bad record: {exc}") from exc
        return cls(
            records=RecordView(cols),
            config=dict(_section(data, "config", dict, source)),
            environment=dict(_section(data, "environment", dict, source)),
            generator=dict(_section(data, "generator", dict, source)),
            server_samples=list(_section(data, "server_samples", list, source)),
            extra=dict(_section(data, "extra", dict, source)),
            **run,
        )


def run_span_ns(duration_ns: int) -> tuple[int, int]:
    """Where a record's times may lie, in ns from the run's start: from an hour before it (the
    clocks of several hosts mapped onto one start) to an hour after its end (a stream that
    ended after the run stopped sending); a run of unknown duration (0), up to 31 days."""
    return -RUN_SLACK_NS, (duration_ns or MAX_RUN_NS) + RUN_SLACK_NS


def _check_head(data: Any, source: str) -> dict[str, Any]:
    """The schema, version and ``run`` section checked: the Results fields of ``run``."""
    if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
        raise ResultsError(f'{source}: not a loadlab results file (no "schema": "{SCHEMA}")')
    version = data.get("version")
    if version != SCHEMA_VERSION:
        raise ResultsError(
            f"{source}: results schema version {version!r}, this loadlab reads {SCHEMA_VERSION}"
        )
    run = _section(data, "run", dict, source)
    window = run.get("window_ns")
    if window is not None and not (
        isinstance(window, list) and len(window) == 2 and all(type(w) is int for w in window)
    ):
        raise ResultsError(f"{source}: run.window_ns must be [start_ns, end_ns] (integers) or null")
    for key in ("duration_ns", "workers", "scheduled"):
        value = run.get(key)
        if value is not None and type(value) is not int:
            raise ResultsError(f"{source}: run.{key} must be an integer, got {value!r:.40}")
    duration = run.get("duration_ns") or 0
    if not 0 <= duration <= MAX_RUN_NS:
        raise ResultsError(f"{source}: run.duration_ns {duration:,} is not 0 to 31 days")
    lo, hi = run_span_ns(duration)
    if window is not None and not lo <= window[0] <= window[1] <= hi:
        raise ResultsError(
            f"{source}: run.window_ns {window} is not a span inside the run "
            f"({lo / 1e9:g} to {hi / 1e9:g} s)"
        )
    return {
        "started_at": str(run.get("started_at", "")),
        "duration_ns": duration,
        "window_ns": (window[0], window[1]) if window else None,
        "scheduled": run.get("scheduled"),
        "workers": 1 if run.get("workers") is None else run["workers"],
        "kind": str(run.get("kind", "run")),
    }


def _section(data: Mapping[str, Any], key: str, kind: type, source: str) -> Any:
    """``data[key]`` when it is a ``kind`` (empty when absent or null); else ``ResultsError``."""
    value = data.get(key)
    if value is None:
        return kind()
    if not isinstance(value, kind):
        expected = "an object" if kind is dict else "a list"
        raise ResultsError(
            f"{source}: field {key!r} must be {expected}, got {type(value).__name__}"
        )
    return value


def redact(config: Any) -> Any:
    """Copy of ``config`` with every secret-looking value replaced by ``***``: keys named like
    a secret, credential-like ``headers`` (``loadlab._headers``), and URL user-info anywhere.

    >>> redact({"api_key": "sk-1", "api_key_env": "OPENAI_API_KEY", "max_tokens": 5})
    {'api_key': '***', 'api_key_env': 'OPENAI_API_KEY', 'max_tokens': 5}
    """
    if isinstance(config, Mapping):
        out: dict[str, Any] = {}
        for key, value in config.items():
            k = str(key)
            secret = _SECRET_KEY.search(k) and not _SECRET_ALLOWED.search(k)
            if secret and value not in (None, ""):
                out[k] = REDACTED
            elif k == "headers" and isinstance(value, Mapping):
                out[k] = redact_headers(value)
            else:
                out[k] = redact(value)
        return out
    if isinstance(config, list | tuple):
        return [redact(v) for v in config]
    if isinstance(config, str) and "@" in config:  # a URL's user-info, wherever it stands
        return public_url(config)
    return config


def environment_info() -> dict[str, Any]:
    """Where the run happened: versions, host, CPUs. Contains no environment variables."""
    return {
        "loadlab": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "host": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "pid": os.getpid(),
    }


def write_results(results: Results, path: str | os.PathLike[str]) -> Path:
    """Write atomically (temp file, fsync, rename), creating parent folders; returns the path.
    On failure (``OSError``: a full disk, a read-only folder) the temp file is removed."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    try:
        with tmp.open("wb") as fh:
            _write_document(results, fh)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(p)
    except BaseException:
        tmp.unlink(missing_ok=True)  # never leave a half-written .tmp behind (a full disk)
        raise
    return p


_WRITE_BATCH = 10_000  # records serialised at a time (a million never held as dicts at once)


def _write_document(results: Results, fh: IO[bytes]) -> None:
    """The results document, compact, its records serialised a batch at a time between the
    sections before them and those after (the layout ``read_results`` streams)."""
    doc = results._document([])
    keys = list(doc)
    at = keys.index("records")
    head = _dumps({k: doc[k] for k in keys[:at]})
    fh.write(head[:-1] + b',"records":[')
    records = results.records
    for start in range(0, len(records), _WRITE_BATCH):
        if start:
            fh.write(b",")
        batch = records[start : start + _WRITE_BATCH]
        fh.write(b",".join(_dumps(r.to_dict(), floats_in=_SERVER) for r in batch))
    fh.write(b"]," + _dumps({k: doc[k] for k in keys[at + 1 :]})[1:])


_SERVER = ("server",)  # where a record holds floats (its other fields are ints and text)


def _dumps(value: dict[str, Any], floats_in: tuple[str, ...] | None = None) -> bytes:
    """Compact JSON: orjson (a tenth of json's time), or json for what orjson refuses (an
    integer past 64 bits). A NaN or an infinity, which JSON cannot hold, is refused
    (``ValueError``) as ``json.dump(allow_nan=False)`` refused it: orjson writes it as null,
    so where a null was written the floats are looked at (``floats_in``: only those keys')."""
    try:
        out = orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    if b"null" in out:
        inside = value if floats_in is None else [value[k] for k in floats_in if value.get(k)]
        if _has_nonfinite(inside):
            raise ValueError("Out of range float values are not JSON compliant")
    return out


def _has_nonfinite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(map(_has_nonfinite, value.values()))
    if isinstance(value, (list, tuple)):
        return any(map(_has_nonfinite, value))
    return False


def read_results(
    path: str | os.PathLike[str],
    progress: Callable[[int, int], None] | None = None,
    workers: int = 1,
) -> Results:
    """Read a results file; raises ``ResultsError`` naming the file and the problem.

    A file as loadlab writes it (compact JSON, records from ``"records":[``) is read a piece
    at a time straight into columns, so a file of a million records needs a few hundred MB,
    not gigabytes; any other valid JSON is read whole. ``progress(bytes_read, total)`` is
    called as the records are read. ``workers`` > 1: the pieces of a file over 32 MB are
    parsed in that many forked processes (the commands use the machine's cores)."""
    p = Path(path)
    tell = progress or (lambda done, total: None)
    try:
        with p.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            with _parsers(workers if size >= PARALLEL_BYTES else 1) as map_parts:
                results = _stream(fh, size, str(p), tell, map_parts)
            _give_back()
            return results
    except OSError as exc:
        raise ResultsError(f"{p}: cannot read results file: {exc.strerror or exc}") from exc
    except (_NotStreamable, Unparsed):
        pass
    return _read_whole(p)


def _give_back() -> None:
    """Return the memory the parser freed to the system (glibc keeps freed heap otherwise:
    a million records leave a few hundred MB behind). Elsewhere, nothing to do."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def _keep_heap() -> None:
    """In a parser process: keep freed memory for the next piece (glibc gives back a freed
    block over a few MB, and the next piece's pages then fault in again: a sixth of a
    parser's time). It holds one piece's worth; the process ends with the file."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, 64 << 20)
        libc.mallopt(_M_TRIM_THRESHOLD, 256 << 20)
    except (OSError, AttributeError):
        pass


class _NotStreamable(Exception):
    """The file is not laid out as loadlab writes it: read it whole instead."""


_RECORDS_KEY = b'"records":['
_NEXT_RECORD = b'},{"request_id":'  # between two records of the array, nowhere else unnested
_PIECE = 8 << 20  # bytes read at a time
PARALLEL_BYTES = 32 << 20  # a file from this size up is parsed by several processes


@contextlib.contextmanager
def _parsers(workers: int) -> Iterator[Callable[..., Iterable[Any]]]:
    """``map``, or with ``workers`` > 1 an ordered map over a pool of forked processes that
    keeps at most two pieces a process in flight (the file is never all in memory)."""
    if workers <= 1:
        yield map
        return
    pool = ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("fork"), initializer=_keep_heap
    )

    def bounded(fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        pending: collections.deque[Any] = collections.deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()

    try:
        yield bounded
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _stream(
    fh: Any,
    size: int,
    source: str,
    progress: Callable[[int, int], None],
    map_parts: Callable[..., Iterable[Any]] = map,
) -> Results:
    """Read a file loadlab wrote: the head up to ``"records":[`` parsed alone, then batches of
    whole records cut at ``_NEXT_RECORD``, then what follows the array.

    Each cut is checked by the parse itself: a batch that is not a list of objects (a cut
    inside a record's nested data, or past the array) fails, and the file is read whole."""
    buf = b""
    while (at := buf.find(_RECORDS_KEY)) < 0:
        more = fh.read(_PIECE)
        if not more:
            raise _NotStreamable
        buf += more
    head_text = buf[:at].rstrip()
    try:
        head = orjson.loads(head_text[:-1] + b"}") if head_text.endswith(b",") else None
    except orjson.JSONDecodeError:
        head = None
    if not isinstance(head, dict):
        raise _NotStreamable  # "records" inside another value, or not at the top
    run = _check_head(head, source)
    reading = _Records(fh, at + len(_RECORDS_KEY), size, progress)
    records_bytes = size - at  # about: what follows the array is small beside it
    results = Results._assemble(
        _Later(head, reading), run, reading.batches(), source, map_parts, records_bytes
    )
    progress(size, size)
    return results


class _Records:
    """The records array of an open file, a batch at a time (``_stream``); what follows the
    array is kept in ``tail`` as a JSON object."""

    def __init__(
        self, fh: Any, start: int, size: int, progress: Callable[[int, int], None]
    ) -> None:
        self.fh, self.start, self.size, self.progress = fh, start, size, progress
        self.tail = b""

    def batches(self) -> Iterator[bytes | list[Any] | _Span]:
        """Spans of whole records (``{...},{...}``, about ``_PIECE`` bytes each: the process
        that parses one reads it itself, so this one only finds where records meet), then the
        last records parsed with what follows them set apart."""
        fd = self.fh.fileno()
        pos = self.start  # the first byte of the next record
        while (cut := _find(fd, _NEXT_RECORD, pos + _PIECE)) >= 0:
            yield _Span(fd, pos, cut + 1 - pos)
            pos = cut + 2
            self.progress(pos, self.size)
        self.fh.seek(pos)
        rest = self.fh.read()
        cut = rest.rfind(_NEXT_RECORD)
        if cut >= 0:
            yield rest[: cut + 1]
            rest = rest[cut + 2 :]
        last, self.tail = _last_records(rest)
        if last:
            yield last


class _Span:
    """``length`` bytes of an open file from ``offset``: called, it reads them (a forked
    parser shares the descriptor, so only these few numbers cross to it)."""

    def __init__(self, fd: int, offset: int, length: int) -> None:
        self.fd, self.offset, self.length = fd, offset, length

    def __call__(self) -> bytes:
        data = os.pread(self.fd, self.length, self.offset)
        if len(data) != self.length:  # the file shrank under us: read it whole, which says so
            raise Unparsed
        return data


_WINDOW = 1 << 16  # bytes looked through at a time for where two records meet


def _find(fd: int, pattern: bytes, at: int) -> int:
    """The offset of ``pattern`` in the file from ``at`` on, or -1 (none before its end)."""
    while True:
        window = os.pread(fd, _WINDOW + len(pattern) - 1, at)
        if (i := window.find(pattern)) >= 0:
            return at + i
        if len(window) < _WINDOW + len(pattern) - 1:
            return -1
        at += _WINDOW


def _last_records(rest: bytes) -> tuple[list[Any], bytes]:
    """The records left at the end of the array, and the sections after it (``{...}``)."""
    try:
        text = rest.decode("utf-8", "strict")
    except UnicodeDecodeError:
        raise _NotStreamable from None
    stripped = text.lstrip()
    decoder = json.JSONDecoder()
    records: list[Any] = []
    pos = len(text) - len(stripped)
    while True:
        if text.startswith("]", pos):
            after = text[pos + 1 :].lstrip()
            if after.startswith(","):
                return records, ("{" + after[1:]).encode()
            if after.rstrip() == "}":
                return records, b"{}"
            raise _NotStreamable
        try:
            record, end = decoder.raw_decode(text, pos)
        except ValueError:
            raise _NotStreamable from None
        records.append(record)
        pos = end
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        if text.startswith(",", pos):
            pos += 1
            while pos < len(text) and text[pos] in " \t\r\n":
                pos += 1


class _Later(Mapping[str, Any]):
    """The sections after the records: the head's, then those parsed once the records are
    read (``Results._assemble`` reads them last)."""

    def __init__(self, head: dict[str, Any], records: _Records) -> None:
        self.head, self.records = head, records
        self._all: dict[str, Any] | None = None

    def _sections(self) -> dict[str, Any]:
        if self._all is None:
            try:
                tail = orjson.loads(self.records.tail or b"{}")
            except orjson.JSONDecodeError:
                raise _NotStreamable from None
            if not isinstance(tail, dict):
                raise _NotStreamable
            self._all = {**self.head, **tail}
        return self._all

    def __getitem__(self, key: str) -> Any:
        return self._sections()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sections())

    def __len__(self) -> int:
        return len(self._sections())


def _read_whole(p: Path) -> Results:
    """Any valid JSON results document, parsed at once."""
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ResultsError(f"{p}: cannot read results file: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ResultsError(
            f"{p}: not UTF-8 text (byte {exc.start}: {exc.reason}); is it a results file?"
        ) from exc
    return Results.from_dict(parse_json(text, ResultsError, str(p)), source=str(p))


def merge_results(parts: Iterable[Results]) -> Results:
    """One results file from the parts of one run (``--workers N`` processes, Locust workers).

    Records are concatenated (their ``worker`` field tells them apart); counts add up; the
    window is the union; the generator is saturated if any part was.
    """
    parts = list(parts)
    if not parts:
        raise ValueError("merge_results needs at least one part")
    first = parts[0]
    windows = [p.window_ns for p in parts if p.window_ns is not None]
    return Results(
        records=[r for p in parts for r in p.records],
        config=first.config,
        environment=first.environment,
        started_at=min(p.started_at for p in parts),
        duration_ns=max(p.duration_ns for p in parts),
        window_ns=(min(w[0] for w in windows), max(w[1] for w in windows)) if windows else None,
        scheduled=sum(p.scheduled_count for p in parts),
        workers=sum(p.workers for p in parts),
        kind=first.kind,
        generator=merge_parts(p.generator for p in parts),
        server_samples=sorted(
            (s for p in parts for s in p.server_samples), key=lambda s: s.get("t_ns", 0)
        ),
        extra=first.extra,
    )


def to_dataframe(results: Results) -> pd.DataFrame:
    """One row per request with the derived metrics (ms) beside the raw fields."""
    import pandas as pd

    rows = []
    # a reasoning model's or an agent's figures, when some request reasoned or called a tool
    answers = has_reasoning_or_tools(results.records)
    for r in results.records:
        row = r.to_dict()
        row.pop("chunk_ns")
        row.pop("chunk_tokens")
        row.pop("server")
        row["ttft_ms"] = metrics.ttft_ms(r)
        row["ttft_from_intended_ms"] = metrics.ttft_from_intended_ms(r)
        row["e2e_ms"] = metrics.e2e_ms(r)
        row["tpot_ms"] = metrics.tpot_ms(r)
        row["max_gap_ms"] = metrics.max_gap_ms(r)
        if answers:
            row["ttfat_ms"] = metrics.ttfat_ms(r)
            row["reasoning_ms"] = metrics.reasoning_ms(r)
            row["reasoning_tokens"] = metrics.reasoning_token_count(r)
            row["answer_tokens"] = metrics.answer_token_count(r)
            row["tool_call_tokens"] = metrics.tool_call_token_count(r)
        row.update({f"server_{k}": v for k, v in r.server.items()})
        rows.append(row)
    return pd.DataFrame(rows)

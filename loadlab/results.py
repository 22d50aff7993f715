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
      "summary":    loadlab.analysis.summary.summarize() at write time (informative; recomputed on read)
    }

Example::

    res = read_results("reports/run.json")
    df = to_dataframe(res)          # one row per request
"""

from __future__ import annotations

import json
import os
import platform
import re
import socket
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadlab._version import __version__
from loadlab.analysis import metrics
from loadlab.analysis.generator import merge_parts
from loadlab.analysis.summary import has_reasoning_or_tools, summarize
from loadlab.errors import ResultsError, parse_json
from loadlab.headers import REDACTED, public_url, redact_headers
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

# Config keys whose values are secrets. Values are replaced, keys kept (so a reader sees that
# a key was set). API keys are read from the environment by *name*; the name is not secret.
_SECRET_KEY = re.compile(r"(api[_-]?key|token|secret|password|authorization)$", re.IGNORECASE)
_SECRET_ALLOWED = re.compile(r"(_env|_var|max_tokens|tokens)$", re.IGNORECASE)


@dataclass
class Results:
    """An in-memory results file. ``records`` hold times relative to the run start."""

    records: list[RequestRecord]
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
        end = self.duration_ns
        for r in self.records:
            for t in (r.end_ns, r.chunk_ns[-1] if r.chunk_ns else None):
                if t is not None and t > end:
                    end = t
        return (0, end)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per request (pandas), derived metrics in ms beside the raw fields."""
        return to_dataframe(self)

    def to_dict(self) -> dict[str, Any]:
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
            "records": [r.to_dict() for r in self.records],
            "server_samples": self.server_samples,
            "extra": self.extra,
            "summary": summarize(self).to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<dict>") -> Results:
        if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
            raise ResultsError(f'{source}: not a loadlab results file (no "schema": "{SCHEMA}")')
        version = data.get("version")
        if version != SCHEMA_VERSION:
            raise ResultsError(
                f"{source}: results schema version {version!r}, this loadlab reads {SCHEMA_VERSION}"
            )
        run = _section(data, "run", dict, source)
        records_data = _section(data, "records", list, source)
        try:
            records = [RequestRecord.from_dict(r) for r in records_data]
        except (TypeError, ValueError) as exc:
            raise ResultsError(f"{source}: bad record: {exc}") from exc
        window = run.get("window_ns")
        try:
            if window is not None and not (
                isinstance(window, list)
                and len(window) == 2
                and all(type(w) is int for w in window)
            ):
                raise TypeError("run.window_ns must be [start_ns, end_ns] (integers) or null")
            for key in ("duration_ns", "workers", "scheduled"):
                value = run.get(key)
                if value is not None and type(value) is not int:
                    raise TypeError(f"run.{key} must be an integer, got {value!r:.40}")
            return cls(
                records=records,
                config=dict(_section(data, "config", dict, source)),
                environment=dict(_section(data, "environment", dict, source)),
                started_at=str(run.get("started_at", "")),
                duration_ns=int(run.get("duration_ns", 0)),
                window_ns=(window[0], window[1]) if window else None,
                scheduled=run.get("scheduled"),
                workers=int(run.get("workers", 1)),
                kind=str(run.get("kind", "run")),
                generator=dict(_section(data, "generator", dict, source)),
                server_samples=list(_section(data, "server_samples", list, source)),
                extra=dict(_section(data, "extra", dict, source)),
            )
        except TypeError as exc:
            raise ResultsError(f"{source}: {exc}") from exc


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
    a secret, credential-like ``headers`` (``loadlab.headers``), and URL user-info anywhere.

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
        with tmp.open("w", encoding="utf-8") as fh:
            json.dump(results.to_dict(), fh, separators=(",", ":"), allow_nan=False)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(p)
    except BaseException:
        tmp.unlink(missing_ok=True)  # never leave a half-written .tmp behind (a full disk)
        raise
    return p


def read_results(path: str | os.PathLike[str]) -> Results:
    """Read a results file; raises ``ResultsError`` naming the file and the problem."""
    p = Path(path)
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

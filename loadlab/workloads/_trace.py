"""Production trace replay: Azure LLM inference (2023, 2024), Mooncake JSONL, BurstGPT CSV.

The format is detected from the first line (or forced with ``format``)::

    azure     TIMESTAMP,ContextTokens,GeneratedTokens       2023: "2023-11-16 18:15:46.6805900"
                                                            (7 fractional digits, CRLF, no final
                                                            newline); 2024: "...+00:00", with or
                                                            without fractional seconds
    mooncake  {"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}
    burstgpt  Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
              (seconds; rows with Response tokens = 0 are failed requests: skipped, counted)

Files are streamed line by line (a 16 M-row 2024 trace is never held in memory); times are
seconds from the trace's first row. Rows are assumed in time order (all published traces are);
a row earlier than its predecessor is sent at its predecessor's time and counted.

Options (``[workload]`` keys for kind = "trace")::

    path            the trace file (relative to the scenario file or the repository root)
    format          force "azure" | "mooncake" | "burstgpt" (default: detect)
    time_scale      speed-up: trace time t is sent at t / time_scale (60 = an hour in a minute)
    rate_scale      < 1 thins (each row kept with probability rate_scale), > 1 duplicates (each
                    row sent floor(r) times, plus once more with probability frac(r)); copies
                    go at the row's own time, each with its own prompt; seeded by the run seed
    start_s, duration_s   the window of trace time replayed (before time_scale)
    limit           at most this many requests
    model           BurstGPT only: keep rows of this Model
    log_type        BurstGPT only: keep rows of this Log Type
    max_total_tokens  skip (and count) rows whose prompt + output exceed it (a server's context)
    skip_bad_lines  false: a malformed line is an error naming file:line; true: skip and count
    prefixes        Mooncake hash_ids become shared prompt prefixes (default true)

Example::

    stats = TraceStats()
    for row in iter_trace(TRACES["azure-2023-conv"], stats=stats):  # loadlab.workloads._params
        print(row.t_s, row.prompt_tokens, row.output_tokens)
"""

from __future__ import annotations

import calendar
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from loadlab.errors import TOO_DEEP, TraceError
from loadlab.workloads._fidelity import replay_fidelity, send_lag_ms

__all__ = [
    "FORMATS",
    "TraceError",
    "TraceRow",
    "TraceStats",
    "detect_format",
    "iter_trace",
    "parse_timestamp",
    "recorded_header",
    "replay_fidelity",
    "send_lag_ms",
    "timestamp_ns",
]

FORMATS = ("azure", "mooncake", "burstgpt", "loadlab")
AZURE_HEADER = "timestamp,contexttokens,generatedtokens"
BURSTGPT_COLUMNS = (
    "Timestamp",
    "Model",
    "Request tokens",
    "Response tokens",
    "Total tokens",
    "Log Type",
)
_TS = re.compile(
    r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(Z|[+-]\d{2}:?\d{2})?$"
)


@dataclass(frozen=True)
class TraceRow:
    t_s: float  # seconds from the trace's first row
    prompt_tokens: int
    output_tokens: int
    line: int  # 1-based line number in the file
    hash_ids: tuple[int, ...] = ()
    model: str | None = None
    recorded: dict[str, Any] | None = None  # a loadlab record line's sessions and lengths


@dataclass
class TraceStats:
    """What a replay read and left out; goes to ``results.extra["workload"]["trace"]``."""

    path: str = ""
    format: str = ""  # azure-2023 | azure-2024 | mooncake | burstgpt
    rows_read: int = 0  # data rows parsed (in the window or before it)
    rows_used: int = 0  # rows that became at least one request
    requests: int = 0  # requests emitted (after rate_scale)
    bad_lines: int = 0  # malformed lines skipped (skip_bad_lines = true)
    bad_line_numbers: list[int] = field(default_factory=list)  # the first 20
    failed_rows: int = 0  # BurstGPT rows with Response tokens = 0
    filtered_out: int = 0  # rows of another model / log type
    too_long: int = 0  # prompt + output over max_total_tokens
    thinned: int = 0  # rows dropped by rate_scale < 1
    duplicated: int = 0  # extra copies made by rate_scale > 1
    zero_length: int = 0  # rows whose prompt or output was 0 tokens (sent as 1)
    out_of_order: int = 0  # rows earlier than the previous row (sent at its time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@lru_cache(maxsize=64)
def _day_epoch(day: str) -> int:
    y, m, d = (int(x) for x in day.split("-"))
    return calendar.timegm((y, m, d, 0, 0, 0, 0, 0, 0))


def parse_timestamp(text: str) -> float:
    """Seconds since the Unix epoch (UTC) of an Azure timestamp, any number of fractional
    digits, with or without a UTC offset: ``parse_timestamp("1970-01-01 00:00:01.5000000")``
    is 1.5. (``datetime.strptime``'s ``%f`` takes at most 6 digits; the 2023 traces have 7.)"""
    return timestamp_ns(text) / 1e9


def timestamp_ns(text: str) -> int:
    """``parse_timestamp`` in integer nanoseconds (exact: a float of epoch seconds would lose
    the 7th fractional digit)."""
    m = _TS.match(text.strip())
    if m is None:
        raise ValueError(f"not a timestamp: {text!r} (expected YYYY-MM-DD HH:MM:SS[.fff][+00:00])")
    day, hh, mm, ss, frac, tz = m.groups()
    t = _day_epoch(day) + int(hh) * 3600 + int(mm) * 60 + int(ss)
    if tz and tz != "Z":
        sign = 1 if tz[0] == "+" else -1
        digits = tz[1:].replace(":", "")
        t -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    ns = t * 1_000_000_000
    if frac:
        ns += int(frac[:9].ljust(9, "0"))
    return ns


def _first_line(path: Path) -> str:
    with path.open("r", encoding="utf-8-sig", errors="replace", newline="") as f:
        for line in f:
            if line.strip():
                return line.strip()
    return ""


def _arrival_order(lines: Iterable[tuple[int, str]]) -> list[tuple[int, str]]:
    """A recording's lines in arrival order: the proxy writes each when its answer ends."""
    out = []
    for lineno, raw in lines:
        m = _RECORDED_TIME.search(raw)
        out.append((float(m.group(1)) if m else math.inf, lineno, raw))
    out.sort(key=lambda x: (x[0], x[1]))
    return [(lineno, raw) for _, lineno, raw in out]


_RECORDED_TIME = re.compile(r'"timestamp":\s*(-?[0-9.eE+-]+)')


def recorded_header(path: str | Path) -> dict[str, Any]:
    """The header line of a ``loadlab record`` trace (unit and block of its ``hash_ids``)."""
    try:
        header = json.loads(_first_line(Path(path)))
    except json.JSONDecodeError:
        header = None
    if not isinstance(header, dict) or "loadlab_trace" not in header:
        raise TraceError(f"{path}: not a loadlab record trace (its first line has no header)")
    return header


def detect_format(path: str | Path) -> str:
    """``azure``, ``mooncake`` or ``burstgpt`` from the first line; else a ``TraceError``."""
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"{p}: trace file not found")
    first = _first_line(p)
    low = first.replace(" ", "").lower()
    if low == AZURE_HEADER:
        return "azure"
    if [c.strip() for c in first.split(",")] == list(BURSTGPT_COLUMNS):
        return "burstgpt"
    if first.startswith("{") and '"loadlab_trace"' in first:
        return "loadlab"
    if first.startswith("{") and '"timestamp"' in first:
        return "mooncake"
    shown = first if len(first) <= 80 else first[:77] + "..."
    raise TraceError(
        f"{p}: unknown trace format: first line {shown!r} is none of: Azure LLM inference CSV "
        f"(header TIMESTAMP,ContextTokens,GeneratedTokens), BurstGPT CSV (header "
        f'{",".join(BURSTGPT_COLUMNS)}), Mooncake JSONL ({{"timestamp": ms, "input_length", '
        f'"output_length", "hash_ids"}}); set format = "azure" | "mooncake" | "burstgpt" if '
        f"the file is one of these without its header"
    )


def _tokens(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} is not a whole number: {value!r}")
    try:
        n = int(value) if isinstance(value, int) else int(str(value).strip())
    except ValueError:
        raise ValueError(f"{name} is not a whole number: {value!r}") from None
    if n < 0:
        raise ValueError(f"{name} is negative: {n}")
    return n


_Parsed = tuple[int, int, int, tuple[int, ...], str | None]  # time ns, in, out, ids, tag


def _parse_azure(line: str) -> _Parsed:
    parts = line.split(",")
    if len(parts) != 3:
        raise ValueError(
            f"expected 3 fields (TIMESTAMP,ContextTokens,GeneratedTokens), got {len(parts)}"
        )
    return (
        timestamp_ns(parts[0]),
        _tokens(parts[1], "ContextTokens"),
        _tokens(parts[2], "GeneratedTokens"),
        (),
        None,
    )


def _json_object(line: str) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise ValueError(TOO_DEEP) from None
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object")
    return obj


def _parse_mooncake(line: str) -> _Parsed:
    return _mooncake_fields(_json_object(line))


def _mooncake_fields(obj: dict[str, Any]) -> _Parsed:
    missing = [k for k in ("timestamp", "input_length", "output_length") if k not in obj]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise ValueError(f"timestamp is not a number: {ts!r}")
    ids = obj.get("hash_ids", [])
    if not isinstance(ids, list) or not all(isinstance(h, int) for h in ids):
        raise ValueError("hash_ids must be a list of integers")
    return (
        round(ts * 1_000_000),  # ms -> ns
        _tokens(obj["input_length"], "input_length"),
        _tokens(obj["output_length"], "output_length"),
        tuple(ids),
        None,
    )


def _parse_burstgpt(line: str) -> _Parsed:
    parts = line.split(",")
    if len(parts) != len(BURSTGPT_COLUMNS):
        raise ValueError(f"expected {len(BURSTGPT_COLUMNS)} fields, got {len(parts)}")
    try:
        ts = float(parts[0])
    except ValueError:
        raise ValueError(f"Timestamp is not a number: {parts[0]!r}") from None
    model = parts[1].strip()
    log_type = parts[5].strip()
    return (
        round(ts * 1e9),
        _tokens(parts[2], "Request tokens"),
        _tokens(parts[3], "Response tokens"),
        (),
        f"{model}\t{log_type}",
    )


# What a ``loadlab record`` line adds to Mooncake's keys, kept on the row for the replay.
RECORDED_KEYS = ("session", "turn", "think_ms", "new_length", "new_kind", "prompt_length",
                 "max_tokens", "api", "outcome", "params", "tools", "tools_length", "images",
                 "answer_tool_call", "tool_choice")  # fmt: skip


def _parse_loadlab(line: str) -> tuple[int, int, int, tuple[int, ...], None, dict[str, Any]]:
    obj = _json_object(line)
    if obj.get("input_length") is None:  # no usage from the upstream: the recorded length
        obj = {**obj, "input_length": obj.get("prompt_length", 1)}
    if obj.get("output_length") is None:  # a failed request: what it asked for
        obj = {**obj, "output_length": obj.get("max_tokens") or 1}
    t, n_in, n_out, ids, _ = _mooncake_fields(obj)
    return t, n_in, n_out, ids, None, {k: obj[k] for k in RECORDED_KEYS if k in obj}


_PARSERS: dict[str, Any] = {
    "azure": _parse_azure,
    "mooncake": _parse_mooncake,
    "burstgpt": _parse_burstgpt,
    "loadlab": _parse_loadlab,
}


def iter_trace(
    path: str | Path,
    *,
    format: str | None = None,
    stats: TraceStats | None = None,
    skip_bad_lines: bool = False,
    start_s: float = 0.0,
    duration_s: float | None = None,
    model: str | None = None,
    log_type: str | None = None,
) -> Iterator[TraceRow]:
    """Stream a trace's rows inside the window [start_s, start_s + duration_s) of trace time.

    A malformed line raises ``TraceError("FILE:LINE: ...")`` unless ``skip_bad_lines``, which
    skips it and counts it in ``stats``. BurstGPT failed rows (Response tokens = 0) are skipped
    and counted; ``model`` / ``log_type`` keep only matching BurstGPT rows."""
    p = Path(path)
    fmt = format or detect_format(p)
    if fmt not in FORMATS:
        raise TraceError(f"{p}: format = {fmt!r}: choose one of {', '.join(FORMATS)}")
    if (model is not None or log_type is not None) and fmt != "burstgpt":
        raise TraceError(f"{p}: model / log_type filters apply to BurstGPT traces only ({fmt})")
    st = stats if stats is not None else TraceStats()
    st.path, st.format = str(p), fmt
    parse = _PARSERS[fmt]
    has_header = fmt == "loadlab" or (
        fmt != "mooncake" and _first_line(p).lower().startswith("timestamp")
    )
    end_s = None if duration_s is None else start_s + duration_s
    first: int | None = None
    prev = 0.0
    with p.open("r", encoding="utf-8-sig", errors="replace", newline="") as f:
        lines: Iterable[tuple[int, str]] = enumerate(f, start=1)
        if fmt == "loadlab":
            lines = _arrival_order(lines)
        for lineno, raw in lines:
            line = raw.rstrip("\r\n")
            if not line.strip() or (has_header and lineno == 1):
                continue
            try:
                parsed = parse(line)
                t_abs, n_in, n_out, ids, tag = parsed[:5]
            except ValueError as exc:
                if not skip_bad_lines:
                    raise TraceError(
                        f"{p}:{lineno}: malformed {fmt} line ({exc}): {line[:120]!r}; fix the "
                        f"line or set skip_bad_lines = true to skip and count such lines"
                    ) from None
                st.bad_lines += 1
                if len(st.bad_line_numbers) < 20:
                    st.bad_line_numbers.append(lineno)
                continue
            if first is None:
                first = t_abs
                if fmt == "azure":
                    st.format = (
                        "azure-2024"
                        if re.search(r"(Z|[+-]\d\d:?\d\d)$", line.split(",")[0])
                        else "azure-2023"
                    )
            st.rows_read += 1
            t = (t_abs - first) / 1e9
            if t < prev:
                st.out_of_order += 1
                t = prev
            prev = t
            if t < start_s:
                continue
            if end_s is not None and t >= end_s:
                break  # rows are in time order: nothing later is inside the window
            model_name = None
            if tag is not None:
                model_name, kind = tag.split("\t")
                if (model is not None and model_name != model) or (
                    log_type is not None and kind != log_type
                ):
                    st.filtered_out += 1
                    continue
                if n_out == 0:
                    st.failed_rows += 1
                    continue
            yield TraceRow(t, n_in, n_out, lineno, ids, model_name, *parsed[5:])

"""Trace replay: trace rows (``loadlab.workloads._trace``) become request specs.

Open loop: a row at trace time t (inside the window [start_s, start_s + duration_s)) is due at
``(t - start_s) / time_scale`` seconds after the run start, whatever ``rate_rps`` says (the trace
brings its own times). Closed loop: the trace's lengths in its order, no times. Prompt and
output lengths are the row's (``max_tokens`` = the output length; 0-token rows are sent as 1 and
counted); Mooncake ``hash_ids`` become shared prompt prefixes (``prompts.prefix_prompt``).

``RequestStream.extra()`` gives ``{"kind": "trace", "trace": TraceStats.to_dict(), ...}``: the
run command stores it as ``results.extra["workload"]``.

Example::

    cfg = RunConfig(rate_rps=1, duration_s=60, workload={"kind": "trace",
                    "trace": "azure-2023-conv", "time_scale": 60, "duration_s": 60})
    specs = list(trace_requests(cfg))      # ~190 requests over ~1 s
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from loadlab.config import RunConfig
from loadlab.records import RequestSpec
from loadlab.workloads._agent import tool_definitions
from loadlab.workloads._base import (
    COMMON_KEYS,
    RequestStream,
    caps,
    check_common,
    common_extra_body,
    rng_for,
    text_seed,
)
from loadlab.workloads._exact import Sizing, draft_chars_per_token
from loadlab.workloads._params import (
    TRACES,
    WorkloadError,
    check_keys,
    closest,
    get_bool,
    get_float,
    get_int,
    trace_file,
)
from loadlab.workloads._prompts import prefix_prompt, prompt_text
from loadlab.workloads._trace import (
    FORMATS,
    TraceError,
    TraceRow,
    TraceStats,
    detect_format,
    iter_trace,
    recorded_header,
)

__all__ = ["KEYS", "trace_requests", "trace_source", "validate"]

KEYS = COMMON_KEYS | {
    "trace",
    "path",
    "format",
    "time_scale",
    "rate_scale",
    "start_s",
    "duration_s",
    "limit",
    "model",
    "log_type",
    "max_total_tokens",
    "skip_bad_lines",
    "prefixes",
}


# Lines read ahead of a run to catch a malformed or unknown trace before any load is sent:
# the whole window when one is given (bounded), else the head of the file.
PRESCAN_LINES_WINDOW = 2_000_000
PRESCAN_LINES_OPEN = 100_000


def validate(
    cfg: RunConfig, params: Mapping[str, Any], bases: Sequence[Path] = (), *, scan: bool = True
) -> Path:
    """Check the keys and (``scan``) read ahead in the trace; return the resolved path."""
    check_keys("trace", params, KEYS)
    path = trace_source(params, bases)
    fmt = params.get("format")
    if fmt is not None and fmt not in FORMATS:
        raise WorkloadError(f"workload.format = {fmt!r}: choose one of {', '.join(FORMATS)}")
    get_float(params, "time_scale", 1.0)
    get_float(params, "rate_scale", 1.0)
    get_float(params, "start_s", 0.0, positive=False)
    get_float(params, "duration_s", None)
    get_int(params, "limit", None)
    get_int(params, "max_total_tokens", None)
    get_bool(params, "skip_bad_lines", False)
    get_bool(params, "prefixes", True)
    check_common(params, bases)
    for key in ("model", "log_type"):
        if key in params and not isinstance(params[key], str):
            raise WorkloadError(f"workload.{key} = {params[key]!r}: must be a string")
    if scan:
        _prescan(cfg, params, path)
    return path


def trace_source(params: Mapping[str, Any], bases: Sequence[Path] = ()) -> Path:
    """The file a replay reads: ``trace = NAME`` (shipped with loadlab) or ``path = FILE``."""
    names = ", ".join(TRACES)
    if ("trace" in params) == ("path" in params):
        raise WorkloadError(
            f'workload: a trace replay needs trace = "NAME" (shipped: {names}) or path = "FILE" '
            "(Azure CSV, Mooncake JSONL or BurstGPT CSV), not both"
        )
    if "trace" in params:
        name = str(params["trace"])
        if name not in TRACES:
            hint = closest(name, TRACES)
            fix = f"did you mean {hint!r}?" if hint else f"shipped: {names}"
            raise WorkloadError(
                f"workload.trace = {name!r}: no trace of that name; {fix} (a file: path = ...)"
            )
        return TRACES[name]
    return trace_file(str(params["path"]), "workload.path", bases)


def _prescan(cfg: RunConfig, params: Mapping[str, Any], path: Path) -> None:
    """Read the rows the replay will use (bounded) so a bad line or format fails the run
    before it starts, with the trace's FILE:LINE message."""
    bounded = params.get("duration_s") is not None
    max_lines = PRESCAN_LINES_WINDOW if bounded else PRESCAN_LINES_OPEN
    limit = params.get("limit") or cfg.requests
    try:
        rows = _rows(params, path, TraceStats())
        for i, row in enumerate(rows):
            if row.line > max_lines or (limit is not None and i + 1 >= limit):
                break
    except TraceError as exc:
        raise WorkloadError(str(exc)) from None


def _rows(params: Mapping[str, Any], path: Path, stats: TraceStats) -> Iterator[TraceRow]:
    return iter_trace(
        path,
        format=params.get("format"),
        stats=stats,
        skip_bad_lines=get_bool(params, "skip_bad_lines", False),
        start_s=float(get_float(params, "start_s", 0.0, positive=False)),
        duration_s=get_float(params, "duration_s", None),
        model=params.get("model"),
        log_type=params.get("log_type"),
    )


def trace_requests(cfg: RunConfig, sizing: Sizing | None = None) -> RequestStream:
    params = cfg.workload
    chars_per_token = draft_chars_per_token(params, sizing)
    path = validate(cfg, params, scan=False)  # build_requests' priming reads the first row
    time_scale = float(get_float(params, "time_scale", 1.0))
    rate_scale = float(get_float(params, "rate_scale", 1.0))
    start_s = float(get_float(params, "start_s", 0.0, positive=False))
    limit = get_int(params, "limit", None)
    if cfg.requests is not None:
        limit = min(limit, cfg.requests) if limit is not None else cfg.requests
    max_total = get_int(params, "max_total_tokens", None)
    max_prompt, max_output = caps(params)
    prefixes = get_bool(params, "prefixes", True)
    cls = str(params.get("request_class", "trace"))
    stats = TraceStats()
    rows = _rows(params, path, stats)
    recorded = (params.get("format") or detect_format(path)) == "loadlab"
    if recorded and rate_scale != 1.0:
        raise WorkloadError(
            "workload.rate_scale: a loadlab record trace keeps its sessions whole and cannot be "
            "thinned or copied; use time_scale to replay it faster"
        )
    block_tokens = _recorded_block(path, chars_per_token) if recorded else None
    unit_chars = 1.0  # characters per unit of a recording's lengths
    laid_out: dict[Any, int] | None = None  # each recorded session's last prompt, in its unit
    if recorded:
        rows = _whole_sessions(rows)
        header = recorded_header(path)
        if header.get("unit") != "chars":
            unit_chars = chars_per_token
        if int(header.get("loadlab_trace", 1)) >= 2:  # its layout has no role markers
            laid_out = {}

    def specs() -> Iterator[RequestSpec]:
        thin_rng, text_rng = rng_for(cfg.request_seed, "thin"), rng_for(text_seed(cfg), "text")
        whole, frac = int(rate_scale), rate_scale - int(rate_scale)
        for row in rows:
            if max_total is not None and row.prompt_tokens + row.output_tokens > max_total:
                stats.too_long += 1
                continue
            # rate_scale: floor(r) copies, plus one more with probability frac(r) (seeded)
            copies = whole + (1 if frac > 0 and thin_rng.random() < frac else 0)
            if copies == 0:
                stats.thinned += 1
                continue
            stats.rows_used += 1
            stats.duplicated += copies - 1
            if row.prompt_tokens == 0 or row.output_tokens == 0:
                stats.zero_length += 1
            p_tok = max(
                1, row.prompt_tokens if max_prompt is None else min(row.prompt_tokens, max_prompt)
            )
            out = max(
                1, row.output_tokens if max_output is None else min(row.output_tokens, max_output)
            )
            at = (row.t_s - start_s) / time_scale if cfg.rate_rps is not None else None
            if row.recorded is not None and block_tokens is not None:
                stats.requests += 1
                spec = _recorded_spec(
                    row, p_tok, out, at, time_scale, text_seed(cfg), chars_per_token, block_tokens,
                    text_rng, cls, common_extra_body(params, out), unit_chars,
                )  # fmt: skip
                if laid_out is not None:
                    spec = _with_answer(spec, row.recorded, laid_out, unit_chars)
                yield spec
                continue
            for c in range(copies):
                rid = f"trace-{row.line}" + (f"-{c}" if c else "")
                if prefixes and row.hash_ids:
                    text = prefix_prompt(
                        row.hash_ids,
                        p_tok,
                        seed=text_seed(cfg),
                        chars_per_token=chars_per_token,
                        rng=text_rng,
                        tag=rid,
                    )
                else:
                    text = prompt_text(p_tok, text_rng, tag=rid, chars_per_token=chars_per_token)
                stats.requests += 1
                yield RequestSpec(
                    request_id=rid,
                    prompt=text,
                    max_tokens=out,
                    intended_at_s=at,
                    prompt_tokens=p_tok,
                    request_class=cls,
                    extra_body=common_extra_body(params, out),
                )

    it: Iterator[RequestSpec] = specs()
    if limit is not None:
        it = itertools.islice(it, limit)
    return RequestStream(
        it,
        lambda: {
            "kind": "trace",
            "time_scale": time_scale,
            "rate_scale": rate_scale,
            "trace": stats.to_dict(),
        },
    )


def _whole_sessions(rows: Iterator[TraceRow]) -> Iterator[TraceRow]:
    """A recording's rows with each session's turns together, sessions in the order they
    started (the runner sends a session as one unit, each turn after the previous answer)."""
    sessions: dict[Any, list[TraceRow]] = {}
    for row in rows:
        key = (row.recorded or {}).get("session", ("row", row.line))
        sessions.setdefault(key, []).append(row)
    for turns in sessions.values():
        yield from turns


def _recorded_block(path: Path, chars_per_token: float) -> int:
    """The hash block of a ``loadlab record`` trace, in prompt tokens."""
    header = recorded_header(path)
    block = int(header.get("block", 16))
    if header.get("unit") == "chars":
        block = max(1, round(block / chars_per_token))
    return block


def _recorded_spec(
    row: TraceRow,
    prompt_tokens: int,
    out: int,
    at: float | None,
    time_scale: float,
    seed: int,
    chars_per_token: float,
    block_tokens: int,
    rng: Any,
    cls: str,
    extra_body: dict[str, Any],
    unit_chars: float,
) -> RequestSpec:
    """One recorded request: a session's first turn at its time, built from its prefix blocks;
    a later turn after its recorded think time, its new message at its recorded length (the
    runner sends the session's real history before it). ``unit_chars``: characters per unit
    of the trace's lengths."""
    rec = row.recorded or {}
    rid = f"rec-{row.line}"
    tools = _tools_like(int(rec.get("tools") or 0), int(rec.get("tools_length") or 0))
    if tools:  # the recorded answer's choice, made again whatever the server would draw
        extra_body = {
            **extra_body,
            "tool_choice": "required" if rec.get("answer_tool_call") else "none",
        }
    turn = int(rec.get("turn", 0))
    if turn > 0:  # the runner sends the session's history before this new message
        n = max(1, round(int(rec.get("new_length") or 1) * unit_chars / chars_per_token))
        text = prompt_text(n, rng, tag=rid, chars_per_token=chars_per_token)
        at, think_s = None, max(0.0, float(rec.get("think_ms") or 0.0) / 1000.0 / time_scale)
    else:
        n, think_s = prompt_tokens, 0.0
        text = prefix_prompt(row.hash_ids, n, seed=seed, chars_per_token=chars_per_token,
                             rng=rng, tag=rid, block_tokens=block_tokens)  # fmt: skip
    return RequestSpec(
        request_id=rid,
        prompt=text,
        max_tokens=out,
        intended_at_s=at,
        prompt_tokens=n,
        session_id=f"rec{rec.get('session', row.line)}",
        turn=turn,
        think_time_s=think_s,
        request_class=cls,
        extra_body=extra_body,
        tools=tools,
        tool_turn=turn > 0 and rec.get("new_kind") == "tool",
    )


def _with_answer(
    spec: RequestSpec, rec: Mapping[str, Any], laid_out: dict[Any, int], unit_chars: float
) -> RequestSpec:
    """A later turn with what the previous answer added to the recorded prompt (the trace's
    layout: this prompt less the previous one and less this turn's new messages), so the
    runner can keep the prompt at its recorded length whatever this run's answer was."""
    session, length = rec.get("session"), rec.get("prompt_length")
    before = laid_out.get(session)
    if isinstance(length, int):
        laid_out[session] = length
    new = rec.get("new_length")
    if spec.turn == 0 or before is None or not isinstance(length, int) or not isinstance(new, int):
        return spec
    return dataclasses.replace(spec, answer_chars=round((length - before - new) * unit_chars))


def _tools_like(count: int, length: int) -> tuple[dict[str, Any], ...]:
    """``count`` tool definitions whose JSON is about ``length`` characters long (the recorded
    tools' size; their names and descriptions were never kept)."""
    if count <= 0:
        return ()
    tools = tool_definitions(count)
    pad = max(0, (length - len(str(list(tools)))) // count)
    for t in tools:
        t["function"]["description"] += " " + "x" * pad if pad else ""
    return tools

"""What a ``loadlab record`` trace holds: its rates, lengths, sessions and the prefix-hit rate a
cache would get. ``loadlab report TRACE.jsonl`` prints it.

The hit rate is that of an unbounded prefix cache over the trace's block hashes in arrival
order: a block counts as a hit when the same id (so the same prefix, up to and including that
block) came earlier. A real cache is bounded and evicts, so this is the most a cache could get.

Example::

    print(render_trace_summary(trace_summary("trace.jsonl")))
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["is_recorded_trace", "render_trace_summary", "trace_summary"]


def is_recorded_trace(path: str | Path) -> bool:
    try:
        with open(path, "rb") as f:
            return b'"loadlab_trace"' in f.readline(4096)
    except OSError:
        return False


def _pcts(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    a = np.asarray(values, dtype=float)
    return {f"p{q}": float(np.percentile(a, q)) for q in (50, 90, 99)} | {"max": float(a.max())}


def trace_summary(path: str | Path) -> dict[str, Any]:
    """The figures of one recorded trace (plain data; see the module docstring)."""
    rows: list[dict[str, Any]] = []
    bad = 0
    with open(path, encoding="utf-8") as f:
        header = json.loads(f.readline())
        for line in f:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(obj, dict) and isinstance(obj.get("timestamp"), int | float):
                rows.append(obj)
            else:
                bad += 1
    rows.sort(key=lambda r: r["timestamp"])
    seen: set[int] = set()
    hits = blocks = 0
    for r in rows:
        for h in r.get("hash_ids") or ():
            blocks += 1
            hits += h in seen
            seen.add(h)
    span_s = (rows[-1]["timestamp"] - rows[0]["timestamp"]) / 1000 if len(rows) > 1 else 0.0
    sessions = Counter(r.get("session") for r in rows)

    def col(key: str) -> list[float]:
        return [float(r[key]) for r in rows if isinstance(r.get(key), int | float)]

    cached, prompt = sum(col("cached_tokens")), sum(col("input_length"))
    return {
        "header": {k: header.get(k) for k in ("unit", "block", "asked_usage", "started")},
        "requests": len(rows),
        "bad_lines": bad,
        "span_s": span_s,
        "rate_rps": (len(rows) - 1) / span_s if span_s > 0 else None,
        "sessions": len(sessions),
        "turns_per_session": _pcts([float(n) for n in sessions.values()]),
        "apis": dict(Counter(r.get("api") for r in rows)),
        "outcomes": dict(Counter(r.get("outcome") for r in rows)),
        "streamed": sum(bool(r.get("stream")) for r in rows),
        "prompt_tokens": _pcts(col("input_length")),
        "output_tokens": _pcts(col("output_length")),
        "think_ms": _pcts(col("think_ms")),
        "ttft_ms": _pcts(col("ttft_ms")),
        "e2e_ms": _pcts(col("e2e_ms")),
        "cached_share": cached / prompt if prompt else None,
        "prefix_hit_rate": hits / blocks if blocks else None,
        "tools": sum(1 for r in rows if r.get("tools")),
        "tool_calls": sum(int(r.get("tool_calls") or 0) for r in rows),
        "images": sum(len(r.get("images") or ()) + int(r.get("images_unsized") or 0) for r in rows),
        "no_usage": sum(1 for r in rows if r.get("input_length") is None),
    }


def _row(label: str, p: dict[str, float] | None, unit: str = "") -> str:
    if p is None:
        return f"  {label:<22} -"
    return f"  {label:<22} " + "  ".join(f"{k} {v:,.1f}{unit}" for k, v in p.items())


def render_trace_summary(s: dict[str, Any]) -> str:
    pct = lambda x: "-" if x is None else f"{100 * x:.1f} %"  # noqa: E731
    rate = "-" if s["rate_rps"] is None else f"{s['rate_rps']:.2f} req/s"
    h = s["header"]
    lines = [
        f"recorded trace: {s['requests']} requests over {s['span_s']:.1f} s ({rate}); "
        f"{s['sessions']} sessions; hashes in {h['unit']}, blocks of {h['block']}",
        "  apis                   " + ", ".join(f"{k} {v}" for k, v in s["apis"].items()),
        "  outcomes               " + ", ".join(f"{k} {v}" for k, v in s["outcomes"].items()),
        f"  streamed               {s['streamed']} of {s['requests']}",
        _row("turns per session", s["turns_per_session"]),
        _row("prompt tokens", s["prompt_tokens"]),
        _row("output tokens", s["output_tokens"]),
        _row("think time", s["think_ms"], " ms"),
        _row("TTFT at the proxy", s["ttft_ms"], " ms"),
        _row("E2E at the proxy", s["e2e_ms"], " ms"),
        f"  prefix hit rate        {pct(s['prefix_hit_rate'])} (an unbounded cache over the "
        f"block hashes); server-cached share {pct(s['cached_share'])}",
        f"  tools                  {s['tools']} requests offered tools; {s['tool_calls']} calls "
        f"in histories; {s['images']} images",
    ]
    if s["no_usage"]:
        lines.append(
            f"  no usage               {s['no_usage']} requests (prompt length in "
            f"{h['unit']} from the proxy instead)"
        )
    if s["bad_lines"]:
        lines.append(f"  unreadable lines       {s['bad_lines']} (skipped)")
    return "\n".join(lines)

"""Synthetic results built directly from seeded distributions (no server needed).

For tests, benchmarks of the offline commands (``benchmarks/offline_speed.py``) and the
examples of docs/python-api.md: the same seed gives the same records.

>>> results = make_results(50, seed=1, failures=2)
>>> len(results.records), sum(r.ok for r in results.records)
(50, 48)
"""

from __future__ import annotations

import numpy as np

from loadlab.records import OUTCOME_OK, RequestRecord
from loadlab.results import Results

__all__ = ["MS", "make_results", "varied_records"]

MS = 1_000_000  # nanoseconds per millisecond


def make_results(
    n: int = 200,
    *,
    seed: int = 0,
    ttft_scale: float = 1.0,
    ttft_ms_mean: float = 100.0,
    itl_ms_mean: float = 20.0,
    tokens: int = 16,
    rate_rps: float = 20.0,
    failures: int = 0,
    request_class: str = "default",
    open_loop: bool = False,
) -> Results:
    """``n`` requests, Poisson arrivals, gamma TTFT, exponential-ish ITL, ``failures`` 500s."""
    rng = np.random.default_rng(seed)
    sent = np.cumsum(rng.exponential(1 / rate_rps, size=n)) * 1e9
    ttft = rng.gamma(4.0, ttft_ms_mean / 4.0, size=n) * ttft_scale
    records = []
    for i in range(n):
        s = int(sent[i])
        if i < failures:
            records.append(
                RequestRecord(
                    request_id=f"r{i}",
                    outcome="http_500",
                    sent_ns=s,
                    end_ns=s + 5 * MS,
                    http_status=500,
                    error="HTTP 500",
                    request_class=request_class,
                )
            )
            continue
        gaps = rng.gamma(8.0, itl_ms_mean / 8.0, size=tokens - 1)
        first = s + int(ttft[i] * MS)
        chunks = [first] + [first + int(g * MS) for g in np.cumsum(gaps)]
        records.append(
            RequestRecord(
                request_id=f"r{i}",
                outcome=OUTCOME_OK,
                sent_ns=s,
                intended_ns=s - int(rng.uniform(0, 2) * MS) if open_loop else None,
                headers_ns=s + MS,
                chunk_ns=chunks,
                chunk_tokens=[1] * tokens,
                end_ns=chunks[-1] + MS,
                http_status=200,
                prompt_tokens=int(rng.integers(32, 512)),
                prompt_tokens_requested=128,
                max_tokens=tokens,
                output_tokens=tokens,
                output_tokens_source="usage",
                output_tokens_chunks=tokens,
                finish_reason="length",
                request_class=request_class,
            )
        )
    end = max((r.end_ns or 0) for r in records)
    return Results(
        records=records,
        config={"rate_rps": rate_rps, "max_tokens": tokens, "seed": seed},
        environment={"python": "3.11", "host": "test"},
        started_at="2026-11-30T09:00:00Z",
        duration_ns=end,
        window_ns=(0, end),
    )


_OUTCOMES = ("ok", "ok", "ok", "http_500", "timeout", "dropped", "incomplete")


def _varied(i: int, rng: np.random.Generator) -> RequestRecord:
    outcome = str(rng.choice(_OUTCOMES))
    sent = None if outcome == "dropped" else int(rng.integers(0, 30_000)) * MS
    n = 0 if sent is None or outcome == "http_500" else int(rng.choice([0, 1, 2, 3, 5, 8, 11, 20]))
    chunks = sorted(int(x) for x in rng.integers(1, 5_000, n) * 997 + (sent or 0))
    shape = int(rng.integers(0, 4))  # how the tokens per chunk are known
    tokens = [int(x) for x in rng.integers(1, 5, n)]
    chunk_tokens = tokens if shape == 1 else (tokens[:-1] if shape == 2 and n > 1 else [])
    usage = None if shape == 3 else sum(tokens) + int(rng.integers(-2, 3)) * (shape == 0)
    reasoning = n > 4 and rng.random() < 0.3
    kind = rng.random()  # most streamed; some asked whole (one chunk), some embeddings
    if kind < 0.08 and sent is not None:
        chunks, chunk_tokens, n = ([sent + 5 * MS] if outcome == "ok" else []), [], 1
    elif kind < 0.14 and sent is not None:
        chunks, chunk_tokens, n = [], [], 0
    reasoning = reasoning and kind >= 0.14
    return RequestRecord(
        request_id=f"r{i}",
        outcome=outcome,
        request_class=str(rng.choice(["chat", "batch"])),
        turn=int(rng.integers(0, 2)),
        intended_ns=None if sent is None or rng.random() < 0.5 else sent - int(rng.integers(0, 9)),
        sent_ns=sent,
        chunk_ns=chunks,
        chunk_tokens=chunk_tokens,
        end_ns=(chunks[-1] if chunks else (sent or 0)) + MS,
        prompt_tokens_requested=None if rng.random() < 0.2 else 128,
        prompt_tokens=None if rng.random() < 0.3 else int(rng.integers(0, 140)),
        max_tokens=None if rng.random() < 0.2 else 40,
        output_tokens=max(0, usage) if usage is not None else None,
        finish_reason=str(rng.choice(["stop", "length"])) if n else None,
        late=bool(rng.random() < 0.1),
        output_tokens_disagree=bool(rng.random() < 0.1),
        answer_ns=chunks[len(chunks) // 2] if reasoning else None,
        reasoning_chunks=len(chunks) // 2 if reasoning else 0,
        reasoning_start_ns=chunks[0] if reasoning else None,
        reasoning_end_ns=chunks[len(chunks) // 2 - 1] if reasoning else None,
        reasoning_tokens=None if not reasoning or rng.random() < 0.5 else int(rng.integers(0, 9)),
        tool_calls=int(rng.random() < 0.05),
        tool_call_chunks=int(rng.integers(0, 3)) if rng.random() < 0.1 else 0,
        streamed=not kind < 0.14,
        inputs=int(rng.integers(1, 9)) if 0.08 <= kind < 0.14 else None,
    )


def varied_records(n: int, seed: int = 0) -> list[RequestRecord]:
    """``n`` records of every shape a run makes: no chunk, one, chunks of several tokens with
    and without their counts, usage that disagrees, reasoning, tool calls, failures and drops,
    open and closed loop (seeded)."""
    rng = np.random.default_rng(seed)
    return [_varied(i, rng) for i in range(n)]

"""A tool's timing figures held against the wire's, request by request.

Both sides are ``Timings``: per request (keyed by its ``X-Request-Id``), TTFT, every ITL gap
and E2E in ms. ``record_timings`` takes loadlab's from its records; ``wire_timings`` the
wire's from the captured exchanges, with the same definitions (``../shared/ARCHITECTURE.md``):
TTFT from the request's last byte on the wire to the first token-carrying event, ITL the
gaps between token events, E2E to the last token event. Another tool's figures (``vllm bench
serve``'s saved per-request lists, say) go in the same shape.

``judge`` compares the two over the requests both have. A request whose token events the
tool and the wire count differently was read differently: it is counted (``mismatched``),
left out of the per-gap ITL errors, and the verdict is not within the claim.

- *tool minus wire* at p50, p90 and p99: the tool's percentile minus the wire's over the
  same requests, the error of the figure a report prints. The claim (``CLAIM_MS``): within
  1 ms at p50 and p90, 2 ms at p99, for TTFT, ITL and E2E;
- *per-request error* at p50, p90 and p99: the distribution of (tool - wire) request by
  request (gap by gap for ITL), and the largest in size.

Example::

    fig = judge(record_timings(results.records), wire_timings(exchanges))
    print(render(fig)); fig["within_claim"]
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from loadlab._analysis.metrics import distribution, e2e_ms, itl_ms, ttft_ms
from loadlab._wire.http import TOKEN, Exchange
from loadlab.records import RequestRecord

__all__ = [
    "CLAIM_MS",
    "METRICS",
    "Timings",
    "judge",
    "record_timings",
    "render",
    "wire_timings",
]

CLAIM_MS: dict[int, float] = {50: 1.0, 90: 1.0, 99: 2.0}  # |tool - wire| at each percentile
METRICS = ("ttft", "itl", "e2e")
NS_PER_MS = 1e6


@dataclass(frozen=True)
class Timings:
    """Per-request figures in ms, keyed by request id: one tool's, or the wire's."""

    ttft_ms: dict[str, float]
    itl_ms: dict[str, list[float]]
    e2e_ms: dict[str, float]

    @classmethod
    def from_times(cls, sent_and_tokens: Mapping[str, tuple[int, list[int]]]) -> Timings:
        """From each request's sent time and its token times (ns, one clock)."""
        ttft, itl, e2e = {}, {}, {}
        for rid, (sent, toks) in sent_and_tokens.items():
            if not toks:
                continue
            ttft[rid] = (toks[0] - sent) / NS_PER_MS
            itl[rid] = [(b - a) / NS_PER_MS for a, b in itertools.pairwise(toks)]
            e2e[rid] = (toks[-1] - sent) / NS_PER_MS
        return cls(ttft, itl, e2e)


def record_timings(records: Iterable[RequestRecord]) -> Timings:
    """loadlab's figures: every ok record with a token (``loadlab._analysis.metrics``)."""
    ttft, itl, e2e = {}, {}, {}
    for r in records:
        first, last = ttft_ms(r), e2e_ms(r)
        if r.ok and first is not None and last is not None:
            ttft[r.request_id], itl[r.request_id], e2e[r.request_id] = first, itl_ms(r), last
    return Timings(ttft, itl, e2e)


def answered(exchanges: Iterable[Exchange]) -> dict[str, Exchange]:
    """The complete 2xx exchange of each request id (a request retried on a fresh connection
    shows twice on the wire: the answered one counts); exchanges without an id are keyed
    ``<client port>#<place on the connection>``."""
    out: dict[str, Exchange] = {}
    for ex in exchanges:
        if ex.complete and ex.status is not None and 200 <= ex.status < 300:
            out[ex.request_id or f"{ex.client[1]}#{ex.index}"] = ex
    return out


def wire_timings(exchanges: Iterable[Exchange], kinds: tuple[str, ...] = (TOKEN,)) -> Timings:
    """The wire's figures: from each request's last byte to its events of ``kinds`` (the
    token-carrying ones by default; ``vllm bench serve`` counts every chunk with choices)."""
    return Timings.from_times(
        {rid: (ex.request_last_ns, ex.times(kinds)) for rid, ex in answered(exchanges).items()}
    )


def _pcts(values: list[float]) -> dict[str, float | None]:
    d = distribution(values, tuple(float(p) for p in CLAIM_MS))
    return {f"p{p}": d.at(p) for p in CLAIM_MS}


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _metric(
    name: str, tool: Timings, wire: Timings, joined: list[str], matched: list[str]
) -> tuple[list[float], list[float], list[float]]:
    """(tool's values, wire's values, per-request errors) of one metric over ``joined``
    (ITL's errors gap by gap, over the ``matched`` requests: the same number of gaps)."""
    if name == "itl":
        ours = [v for k in joined for v in tool.itl_ms[k]]
        theirs = [v for k in joined for v in wire.itl_ms[k]]
        errors = [
            a - b for k in matched for a, b in zip(tool.itl_ms[k], wire.itl_ms[k], strict=True)
        ]
        return ours, theirs, errors
    t, w = (tool.ttft_ms, wire.ttft_ms) if name == "ttft" else (tool.e2e_ms, wire.e2e_ms)
    ours, theirs = [t[k] for k in joined], [w[k] for k in joined]
    return ours, theirs, [a - b for a, b in zip(ours, theirs, strict=True)]


def judge(tool: Timings, wire: Timings, claims: Mapping[int, float] = CLAIM_MS) -> dict[str, Any]:
    """The tool's figures against the wire's over the requests both have (see the module)."""
    joined = sorted(set(tool.ttft_ms) & set(wire.ttft_ms))
    matched = [k for k in joined if len(tool.itl_ms[k]) == len(wire.itl_ms[k])]
    metrics: dict[str, Any] = {}
    within = bool(joined) and len(matched) == len(joined)
    for name in METRICS:
        ours, theirs, errors = _metric(name, tool, wire, joined, matched)
        mine, truth = _pcts(ours), _pcts(theirs)
        diff = {p: _minus(mine[p], truth[p]) for p in mine}
        ok = all(d is not None and abs(d) <= claims[int(p[1:])] for p, d in diff.items())
        if name == "itl" and not ours and not theirs:
            ok = True  # one-token answers: no gap to judge
        within &= ok
        metrics[name] = {
            "tool_ms": mine,
            "wire_ms": truth,
            "diff_ms": diff,
            "error_ms": {**_pcts(errors), "max_abs": max(map(abs, errors), default=None)},
            "within_claim": ok,
        }
    return {
        "requests": len(tool.ttft_ms),
        "wire_requests": len(wire.ttft_ms),
        "joined": len(joined),
        "mismatched": len(joined) - len(matched),
        "metrics": metrics,
        "claims_ms": {f"p{p}": v for p, v in claims.items()},
        "within_claim": within,
    }


def _f(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _trio(d: Mapping[str, float | None], fmt: str = "{:.2f}") -> str:
    return " / ".join(_f(d[f"p{p}"], fmt) for p in CLAIM_MS)


def render(fig: Mapping[str, Any], label: str = "loadlab") -> str:
    """The comparison as a table, one line per metric (ms; p50 / p90 / p99 in each cell)."""
    rows = [["ms", label, "wire", f"{label} - wire", "per-request error", "within?"]]
    for name in METRICS:
        m = fig["metrics"][name]
        rows.append(
            [
                name.upper(),
                _trio(m["tool_ms"]),
                _trio(m["wire_ms"]),
                _trio(m["diff_ms"], "{:+.3f}"),
                _trio(m["error_ms"], "{:+.3f}"),
                "yes" if m["within_claim"] else "NO",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    bound = ", ".join(f"{v:g} ms at {p}" for p, v in fig["claims_ms"].items())
    lines.append(
        f"p50 / p90 / p99 in each cell; {fig['joined']} requests joined of {fig['requests']} "
        f"({label}) and {fig['wire_requests']} (wire), {fig['mismatched']} with a different "
        f"token count; judged: |{label} - wire| within {bound}"
    )
    return "\n".join(lines)

"""How much a long prompt stalls the streams in flight: figures that do not depend on how
many gaps a stream happens to have, nor on how fast this machine decodes.

The pooled p99 ITL sees a long prompt's stall only when stalls are more than 1 % of all gaps,
which changes with the decode speed (on a quiet machine the stalls are under 1 % and the
p99 misses them). So the lab judges interference per stream instead:

- a long prompt's **prefill window** is its TTFT interval: from its send to its first token
  (queued or prefilled; in ``continuous`` mode every decode waits for it);
- a chat request is **in flight** during a window when its token span (first to last token)
  overlaps it;
- **longest stall per stream**: the median, over the chat requests in flight during any
  window, of each one's longest gap. Every chat request asks for the same number of tokens,
  so each maximum is over the same number of gaps; the baseline (no long prompts) takes the
  same median over all its chat requests;
- **stall share**: of the stream time inside the windows, the share spent in gaps longer than
  ``threshold_ms`` (the lab uses k x the mode's baseline median gap): ~1 when a prefill stops
  everyone, ~0 when the streams keep ticking.

All pure functions of records (times in ns, results in ms or a fraction).

Example::

    windows = prefill_windows_ns(res.records)
    hit = in_flight(chat_records, windows)
    longest_stall_ms(hit), stall_share(hit, windows, threshold_ms=165.0)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import numpy as np

from loadlab._analysis import metrics
from loadlab.records import RequestRecord

__all__ = ["in_flight", "longest_stall_ms", "merge_windows", "prefill_windows_ns", "stall_share"]

Window = tuple[int, int]


def prefill_windows_ns(
    records: Iterable[RequestRecord], request_class: str = "long_prompt"
) -> list[Window]:
    """(sent, first token) of each ok ``request_class`` request, merged where they overlap."""
    out = [
        (r.sent_ns, r.chunk_ns[0])
        for r in records
        if r.request_class == request_class and r.ok and r.sent_ns is not None and r.chunk_ns
    ]
    return merge_windows(out)


def merge_windows(windows: Iterable[Window]) -> list[Window]:
    """Sorted, non-overlapping windows covering the same time.

    >>> merge_windows([(5, 9), (0, 2), (1, 3), (8, 12)])
    [(0, 3), (5, 12)]
    """
    out: list[Window] = []
    for lo, hi in sorted(windows):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _overlap(lo: int, hi: int, windows: Sequence[Window]) -> int:
    return sum(max(0, min(hi, w_hi) - max(lo, w_lo)) for w_lo, w_hi in windows)


def in_flight(records: Iterable[RequestRecord], windows: Sequence[Window]) -> list[RequestRecord]:
    """The ok requests with two or more tokens whose token span overlaps a window."""
    return [
        r
        for r in records
        if r.ok and len(r.chunk_ns) >= 2 and _overlap(r.chunk_ns[0], r.chunk_ns[-1], windows) > 0
    ]


def longest_stall_ms(records: Iterable[RequestRecord]) -> float | None:
    """Median over requests of each one's longest gap between token chunks (ms)."""
    gaps = [g for g in map(metrics.max_gap_ms, records) if g is not None]
    return float(np.median(gaps)) if gaps else None


def stall_share(
    records: Iterable[RequestRecord], windows: Sequence[Window], threshold_ms: float
) -> float | None:
    """Of the requests' stream time inside ``windows``, the share spent in gaps longer than
    ``threshold_ms`` (``None`` when no stream was in flight during a window)."""
    limit_ns = threshold_ms * 1e6
    stalled = inside = 0
    for r in records:
        c = r.chunk_ns
        inside += _overlap(c[0], c[-1], windows) if len(c) >= 2 else 0
        for a, b in itertools.pairwise(c):
            if b - a > limit_ns:
                stalled += _overlap(a, b, windows)
    return stalled / inside if inside else None

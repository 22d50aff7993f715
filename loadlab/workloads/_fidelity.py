"""Replay fidelity: how far actual sends lag behind the schedule, and the arrival rate over time.

Pure functions of records (``sent_ns`` and ``intended_ns`` are relative to the run start)::

    send lag (ms)   (sent_ns - intended_ns) / 1e6, for every record with both times
    rate series     requests per bin of ``bin_s`` seconds, by intended and by actual send time

Example::

    >>> from loadlab.records import RequestRecord
    >>> recs = [RequestRecord("a", intended_ns=0, sent_ns=2_000_000),
    ...         RequestRecord("b", intended_ns=10**9, sent_ns=10**9 + 4_000_000)]
    >>> send_lag_ms(recs)["max"]
    4.0
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from loadlab._analysis.metrics import distribution
from loadlab.records import RequestRecord

__all__ = ["rate_series", "replay_fidelity", "send_lag_ms"]

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


def send_lag_ms(records: Sequence[RequestRecord]) -> dict[str, float | int | None]:
    """Lag of actual sends behind the schedule, ms: count, mean, min, p50, p90, p99, max.

    Only records with both ``intended_ns`` and ``sent_ns`` count (dropped requests were never
    sent: they are counted separately as ``dropped`` in the outcome classes). A negative lag
    (sent early) is kept as is, so an early-firing runner shows up too."""
    lags = [
        (r.sent_ns - r.intended_ns) / NS_PER_MS
        for r in records
        if r.sent_ns is not None and r.intended_ns is not None
    ]
    return distribution(lags, (50.0, 90.0, 99.0)).to_dict()


def rate_series(times_ns: Sequence[int], bin_s: float, n_bins: int | None = None) -> list[int]:
    """Counts of events per ``bin_s``-second bin from t = 0 (bin i covers [i, i+1) x bin_s)."""
    if not bin_s > 0:
        raise ValueError(f"bin_s must be > 0, got {bin_s}")
    arr = np.asarray(times_ns, dtype=np.int64)
    arr = arr[arr >= 0]
    if n_bins is None:
        n_bins = math.floor(arr.max() / (bin_s * NS_PER_S)) + 1 if arr.size else 0
    bins = (arr // int(bin_s * NS_PER_S)).astype(np.int64)
    bins = bins[bins < n_bins]
    return np.bincount(bins, minlength=n_bins).astype(int).tolist()


def replay_fidelity(records: Sequence[RequestRecord], bin_s: float = 1.0) -> dict[str, Any]:
    """Send lag percentiles plus the arrival rate over time, scheduled vs actually sent.

    ``rate_rps`` lists are requests per second in each bin; ``max_rate_diff_rps`` is the largest
    bin difference (0 when every request went out in the bin it was scheduled for)."""
    scheduled = [r.intended_ns for r in records if r.intended_ns is not None]
    sent = [r.sent_ns for r in records if r.sent_ns is not None and r.intended_ns is not None]
    n_bins = int(max(scheduled) // int(bin_s * NS_PER_S)) + 1 if scheduled else 0
    want = rate_series(scheduled, bin_s, n_bins)
    got = rate_series(sent, bin_s, n_bins)
    return {
        "send_lag_ms": send_lag_ms(records),
        "bin_s": bin_s,
        "scheduled_rate_rps": [c / bin_s for c in want],
        "sent_rate_rps": [c / bin_s for c in got],
        "max_rate_diff_rps": max(
            (abs(a - b) / bin_s for a, b in zip(want, got, strict=True)), default=0.0
        ),
        "scheduled": len(scheduled),
        "sent": len(sent),
    }

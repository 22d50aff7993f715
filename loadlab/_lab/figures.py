"""Figures over rounds: each number of the lab is measured once per round, and reported as the
median over rounds with its spread (min-max), every round's value, and the rounds whose
measurement was busy; plus the two helpers that read such nested data.

Example::

    figure([3.0, 1.0, 2.0], busy_rounds=[2])
    # {'median': 2.0, 'lo': 1.0, 'hi': 3.0, 'n': 3, 'rounds': [3.0, 1.0, 2.0], 'busy_rounds': [2]}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["SOURCES", "aggregate", "dig", "figure", "ratio"]

# Which experiments each section's figures come from (a busy one marks the figure).
SOURCES = {
    "chat": ("interference",),
    "long": ("interference",),
    "kv": ("interference",),
    "server": ("interference",),
    "stalls": ("interference", "baseline"),
    "baseline": ("baseline",),
    "batch": ("batch",),
}


def figure(values: Sequence[Any], busy_rounds: Sequence[int] = ()) -> dict[str, Any]:
    """A figure over rounds: the median, its spread (min-max), every round's value, and the
    rounds whose measurement was busy.

    >>> figure([3.0, None, 1.0, 2.0], [2])["median"], figure([3.0, 1.0])["lo"]
    (2.0, 1.0)
    """
    vals = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return {
        "median": float(np.median(vals)) if vals else None,
        "lo": min(vals) if vals else None,
        "hi": max(vals) if vals else None,
        "n": len(vals),
        "rounds": list(values),
        "busy_rounds": list(busy_rounds),
    }


def aggregate(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each section's numbers over rounds as figures (``figure``)."""
    out: dict[str, Any] = {}
    for section, sources in SOURCES.items():
        present = [r for r in rows if section in r]
        if not present:
            continue
        busy = [i + 1 for i, r in enumerate(rows) if any(e in r.get("busy", {}) for e in sources)]
        keys = {k for r in present for k, v in r[section].items() if isinstance(v, int | float)}
        out[section] = {
            k: figure([r.get(section, {}).get(k) for r in rows], busy) for k in sorted(keys)
        }
    return out


def dig(d: Mapping[str, Any], *keys: str) -> Any:
    """``d[k1][k2]...``, or ``None`` where a key is missing (a mode or experiment not run).

    >>> dig({"chunked": {"chat": {"itl_ms_p99": 12.5}}}, "chunked", "chat", "itl_ms_p99")
    12.5
    >>> dig({}, "static", "batch") is None
    True
    """
    for k in keys:
        if not isinstance(d, Mapping) or k not in d:
            return None
        d = d[k]
    return d


def ratio(a: Any, b: Any) -> float | None:
    """``a / b`` when both are numbers and ``b`` is not 0, else ``None``.

    >>> ratio(3, 4), ratio(None, 4), ratio(3, 0)
    (0.75, None, None)
    """
    return a / b if isinstance(a, int | float) and isinstance(b, int | float) and b else None

"""A recording replayed: the chat-session and agent runs of tests/record, with the figures.

Records each run through ``loadlab record`` against the reference server (``tiny`` preset),
replays the trace against a fresh server, and prints: requests, whether every prompt and output
length is equal in the server's count (each session's turns), how many requests had the same
count of cached prompt tokens as their recorded counterpart, the prefix-cache hit rates, and
how far the replay's session starts are from the recording's at p50 / p99 (inter-arrival gaps,
loadlab's send times). Timing figures: run it alone on the machine (about 40 s).

    python3 benchmarks/record_replay.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout: tests/ too

from tests.record.test_record import (
    AGENT,
    CHAT,
    _by_session,
    _first_turn_gaps_ms,
    _hit_rate,
    _record_and_replay,
)


def main() -> int:
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    for name, scenario in (("chat", CHAT), ("agent", AGENT)):
        with tempfile.TemporaryDirectory() as tmp:
            a, b, _trace = _record_and_replay(Path(tmp), scenario)
        ra, rb = a["records"], b["records"]
        ca, cb = (
            [x for s in _by_session(rs, "cached_prompt_tokens") for x in s] for rs in (ra, rb)
        )
        same = sum(x == y for x, y in zip(ca, cb, strict=False))
        gaps = np.abs(_first_turn_gaps_ms(ra) - _first_turn_gaps_ms(rb))
        print(
            f"{name}: {len(ra)} recorded, {len(rb)} replayed; lengths equal: "
            f"{_by_session(ra) == _by_session(rb)}; cached tokens equal in {same} of {len(ra)}; "
            f"hit rate {100 * _hit_rate(ra):.1f} % -> {100 * _hit_rate(rb):.1f} %; session "
            f"start gaps off by p50 {np.percentile(gaps, 50):.2f} ms, p99 "
            f"{np.percentile(gaps, 99):.2f} ms"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

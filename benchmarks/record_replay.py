"""A recording replayed: the chat-session and agent runs of tests/record, with the figures.

Records each run through ``loadlab record`` against the reference server (``tiny`` preset),
replays the trace against a fresh server, and prints: requests, whether every prompt and output
length is equal in the server's count, the prefix-cache hit rates, and how far the replay's
session starts are from the recording's at p50 / p99 (inter-arrival gaps, loadlab's send
times). Timing figures: run it alone on the machine.

    python3 benchmarks/record_replay.py
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from tests.record.test_record import AGENT, CHAT, _first_turn_gaps_ms, _hit_rate, _record_and_replay


def main() -> int:
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    for name, scenario in (("chat", CHAT), ("agent", AGENT)):
        with tempfile.TemporaryDirectory() as tmp:
            a, b, _trace = _record_and_replay(Path(tmp), scenario)
        ra, rb = a["records"], b["records"]
        key = lambda rs: sorted((r["turn"], r["prompt_tokens"], r["output_tokens"]) for r in rs)  # noqa: E731
        gaps = np.abs(_first_turn_gaps_ms(ra) - _first_turn_gaps_ms(rb))
        print(
            f"{name}: {len(ra)} recorded, {len(rb)} replayed; lengths equal: {key(ra) == key(rb)}; "
            f"hit rate {100 * _hit_rate(ra):.1f} % -> {100 * _hit_rate(rb):.1f} %; session "
            f"start gaps off by p50 {np.percentile(gaps, 50):.2f} ms, p99 "
            f"{np.percentile(gaps, 99):.2f} ms"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Stall figures on hand-made records: windows, streams in flight, longest stall, share."""

from __future__ import annotations

import pytest

from loadlab._lab.stalls import (
    in_flight,
    longest_stall_ms,
    merge_windows,
    prefill_windows_ns,
    stall_share,
)
from loadlab.records import RequestRecord
from tests.helpers.lab import MS, rec


def test_prefill_windows_are_long_prompts_ttft_merged() -> None:
    a = rec("l1", [100], cls="long_prompt")  # sent at 0
    b = rec("l2", [180], cls="long_prompt")
    b.sent_ns = 150 * MS
    c = rec("l3", [90], cls="long_prompt")
    c.sent_ns = 50 * MS  # overlaps l1's window
    failed = RequestRecord("l4", outcome="timeout", request_class="long_prompt", sent_ns=0)
    chat = rec("chat", [10, 20])
    windows = prefill_windows_ns([a, b, c, failed, chat])
    assert windows == [(0, 100 * MS), (150 * MS, 180 * MS)]
    assert merge_windows([]) == []


def test_longest_stall_counts_only_streams_in_flight() -> None:
    windows = [(100 * MS, 200 * MS)]
    hit = rec("hit", [50, 60, 250, 260])  # one 190 ms gap across the window
    before = rec("before", [0, 10, 20])  # ended before the window
    one = rec("one", [150])  # a single token: no gap to judge
    flying = in_flight([hit, before, one], windows)
    assert [r.request_id for r in flying] == ["hit"]
    assert longest_stall_ms(flying) == pytest.approx(190.0)
    assert longest_stall_ms([before, rec("x", [0, 30, 40])]) == pytest.approx(20.0)  # 10, 30
    assert longest_stall_ms([]) is None


def test_stall_share_is_time_in_long_gaps_inside_the_windows() -> None:
    windows = [(100 * MS, 200 * MS)]
    # span inside the window: 100..200 (100 ms); gaps over 50 ms: 60..250 -> 100 ms inside
    stopped = rec("stopped", [50, 60, 250, 260])
    assert stall_share([stopped], windows, threshold_ms=50.0) == pytest.approx(1.0)
    # ticking every 20 ms through the window: no gap over 50 ms
    ticking = rec("ticking", [float(t) for t in range(80, 241, 20)])
    assert stall_share([ticking], windows, threshold_ms=50.0) == 0.0
    assert stall_share([stopped, ticking], windows, threshold_ms=50.0) == pytest.approx(0.5)
    assert stall_share([], windows, threshold_ms=50.0) is None

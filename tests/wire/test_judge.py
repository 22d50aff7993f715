"""Tool figures against the wire's, by hand."""

from __future__ import annotations

import pytest

from loadlab._wire.http import CHOICE, OTHER, TOKEN, Exchange
from loadlab._wire.judge import Timings, judge, record_timings, render, wire_timings
from loadlab.records import RequestRecord

MS = 1_000_000


def _ex(rid: str | None, sent: int, events: list[tuple[int, str]], status: int = 200) -> Exchange:
    ex = Exchange(("127.0.0.1", 40000), 0, rid, sent - 5, sent, status, sent + 1)
    ex.event_ns, ex.kinds = [t for t, _ in events], [k for _, k in events]
    ex.end_ns, ex.complete = events[-1][0] if events else sent, True
    return ex


def test_wire_timings_by_kind() -> None:
    ex = _ex("a", 0, [(2 * MS, CHOICE), (10 * MS, TOKEN), (13 * MS, TOKEN), (14 * MS, OTHER)])
    tokens = wire_timings([ex])
    assert (tokens.ttft_ms, tokens.itl_ms, tokens.e2e_ms) == (
        {"a": 10.0},
        {"a": [3.0]},
        {"a": 13.0},
    )
    theirs = wire_timings([ex], (TOKEN, CHOICE))  # vllm bench's reading
    assert (theirs.ttft_ms["a"], theirs.itl_ms["a"]) == (2.0, [8.0, 3.0])


def test_only_answered_exchanges_count_and_the_last_copy_of_an_id_wins() -> None:
    stale = _ex("a", 0, [])
    stale.status, stale.complete = None, False
    failed = _ex("b", 0, [], status=500)
    retried = _ex("a", 50 * MS, [(60 * MS, TOKEN)])
    anon = _ex(None, 0, [(1 * MS, TOKEN)])
    assert wire_timings([stale, failed, retried, anon]).ttft_ms == {"a": 10.0, "40000#0": 1.0}


def test_record_timings_take_ok_records_with_tokens() -> None:
    ok = RequestRecord("a", sent_ns=0, chunk_ns=[5 * MS, 7 * MS, 12 * MS])
    failed = RequestRecord("b", outcome="timeout", sent_ns=0, chunk_ns=[MS])
    empty = RequestRecord("c", sent_ns=0)
    t = record_timings([ok, failed, empty])
    assert (t.ttft_ms, t.itl_ms, t.e2e_ms) == ({"a": 5.0}, {"a": [2.0, 5.0]}, {"a": 12.0})


def test_judge_by_hand() -> None:
    # three requests: the tool reads every token 0.1 ms late, and request c's first 3 ms late
    wire = Timings({"a": 10.0, "b": 20.0, "c": 30.0}, {k: [1.0, 2.0] for k in "abc"},
                   {"a": 13.0, "b": 23.0, "c": 33.0})  # fmt: skip
    tool = Timings({"a": 10.1, "b": 20.1, "c": 33.0}, {"a": [1.0, 2.0], "b": [1.0, 2.0], "c": [0.0, 0.0]},
                   {"a": 13.1, "b": 23.1, "c": 33.1})  # fmt: skip
    fig = judge(tool, wire)
    ttft = fig["metrics"]["ttft"]
    assert ttft["tool_ms"]["p50"] == pytest.approx(20.1) and ttft["wire_ms"]["p50"] == 20.0
    assert ttft["diff_ms"]["p50"] == pytest.approx(0.1)
    # numpy's linear p99 of three sorted values: v1 + 0.98 (v2 - v1)
    p99 = (20.1 + 0.98 * 12.9) - (20.0 + 0.98 * 10.0)
    assert ttft["diff_ms"]["p99"] == pytest.approx(p99)  # 2.94 ms: over the 2 ms claim
    assert not ttft["within_claim"]
    assert ttft["error_ms"]["p50"] == pytest.approx(0.1)
    assert ttft["error_ms"]["max_abs"] == pytest.approx(3.0)
    itl = fig["metrics"]["itl"]  # tool 0,0,1,1,2,2 vs wire 1,1,1,2,2,2
    assert itl["diff_ms"]["p50"] == pytest.approx(-0.5) and itl["within_claim"]
    assert fig["metrics"]["e2e"]["within_claim"]
    assert (fig["joined"], fig["mismatched"], fig["within_claim"]) == (3, 0, False)


def test_judge_counts_requests_read_differently_and_fails_them() -> None:
    wire = Timings({"a": 1.0, "b": 1.0}, {"a": [1.0], "b": [1.0]}, {"a": 2.0, "b": 2.0})
    tool = Timings({"a": 1.0, "b": 1.0, "z": 1.0}, {"a": [1.0], "b": [], "z": []},
                   {"a": 2.0, "b": 1.0, "z": 1.0})  # fmt: skip
    fig = judge(tool, wire)
    assert (fig["requests"], fig["joined"], fig["mismatched"]) == (3, 2, 1)
    assert fig["metrics"]["itl"]["error_ms"]["p50"] == 0.0  # a's gap only
    assert not fig["within_claim"]
    assert not judge(tool, Timings({}, {}, {}))["within_claim"]  # nothing joined
    assert "1 with a different token count" in render(fig)


def test_judge_with_other_bounds() -> None:
    wire = Timings({"a": 10.0}, {"a": []}, {"a": 10.0})
    tool = Timings({"a": 11.5}, {"a": []}, {"a": 11.5})
    assert not judge(tool, wire)["within_claim"]
    assert judge(tool, wire, {50: 2.0, 90: 2.0, 99: 2.0})["within_claim"]  # no gaps: ITL passes

"""GuideLLM's and AIPerf's own per-request output, read and joined to wire exchanges.

The data files are each tool's real output (GuideLLM 0.8.1's ``benchmarks.json``, AIPerf
0.13.0's ``profile_export.jsonl``) from a run against vLLM's CPU build, cut to three
requests (GuideLLM's prompt and answer text removed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadlab._wire.http import OTHER, TOKEN, Exchange
from loadlab._wire.judge import judge
from tests.helpers.peers_wire import (
    Sent,
    aiperf_requests,
    guidellm_requests,
    join_by_time,
    peer_timings,
    wire_mean_timings,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "peers"


def test_guidellm_requests_are_its_own_figures() -> None:
    sent = guidellm_requests(DATA / "guidellm_benchmarks.json")
    assert len(sent) == 3
    for s in sent.values():
        assert s.ttft_ms == pytest.approx((s.first_s - s.start_s) * 1e3)
        assert s.itl_ms == pytest.approx((s.last_s - s.first_s) * 1e3 / (s.output_tokens - 1))
        assert s.output_tokens == 64  # ignore_eos: as asked, from the server's usage
        assert s.input_tokens > 256  # the chat template's tokens beside the prompt's
        assert 1.7e9 < s.start_s < s.first_s < s.last_s  # wall clock, as the capture's


def test_aiperf_requests_are_keyed_by_the_ids_it_sends() -> None:
    lines = (DATA / "aiperf_profile_export.jsonl").read_text().splitlines()
    sent = aiperf_requests(DATA / "aiperf_profile_export.jsonl")
    assert len(sent) == 3
    assert all(f'"x_request_id":"{rid}"' in "".join(lines) for rid in sent)
    for s in sent.values():
        assert s.first_s == pytest.approx(s.start_s + s.ttft_ms / 1e3)
        assert s.last_s >= s.first_s
        assert s.output_tokens == 64  # the server's usage, not AIPerf's re-count
        assert s.itl_ms is not None and s.itl_ms >= 0


def _exchange(port: int, sent_ns: int, tokens_ns: list[int], rid: str | None = None) -> Exchange:
    kinds = [TOKEN] * len(tokens_ns) + [OTHER]
    events = [*tokens_ns, (tokens_ns[-1] if tokens_ns else sent_ns) + 1000]
    return Exchange(("127.0.0.1", port), 0, rid, sent_ns - 50_000, sent_ns, status=200,
                    headers_ns=sent_ns + 1000, event_ns=events, kinds=kinds,
                    end_ns=events[-1], complete=True)  # fmt: skip


def _request(start_s: float, ttft_ms: float, gaps: int, gap_ms: float) -> Sent:
    first = start_s + ttft_ms / 1e3
    last = first + gaps * gap_ms / 1e3
    return Sent(start_s, first, last, ttft_ms, gap_ms, gaps + 1, 10)


def _on_wire(s: Sent, port: int, lag_ns: int, delay_ns: int = 20_000) -> Exchange:
    """``s`` as the wire saw it: sent ``delay_ns`` after the tool's stamp, each token
    ``lag_ns`` before the tool read it."""
    start = round(s.start_s * 1e9) + delay_ns - 20_000
    first, last = round(s.first_s * 1e9) - lag_ns, round(s.last_s * 1e9) - lag_ns
    n = s.output_tokens
    toks = [first + (last - first) * i // (n - 1) for i in range(n)]
    return _exchange(port, start + 20_000, toks)  # first packet 50 µs before the last


def test_join_by_time_takes_the_nearest_exchange_once() -> None:
    t0 = 1_796_000_000.0
    sent = {
        # two sent 30 µs apart: the later one's tokens come 40 ms sooner
        "a": _request(t0, 50.0, 9, 5.0),
        "b": _request(t0 + 30e-6, 10.0, 9, 5.0),
        "c": _request(t0 + 1.0, 20.0, 4, 3.0),
    }
    wire = [_on_wire(s, 40_000 + i, 300_000) for i, s in enumerate(sent.values())]
    # a's packets go out after b's: nearest by start alone would swap them
    wire[0] = _on_wire(sent["a"], 40_000, 300_000, delay_ns=60_000)
    decoys = [
        _exchange(41_000, round(t0 * 1e9) + 10_000, []),  # a models request: no token
        _exchange(41_001, round((t0 + 0.5) * 1e9), [round((t0 + 0.51) * 1e9)]),  # no request
    ]
    joined = join_by_time(sent, [decoys[0], wire[1], decoys[1], wire[2], wire[0]])
    assert {rid: ex.client[1] for rid, ex in joined.items()} == {
        "a": 40_000,
        "b": 40_001,
        "c": 40_002,
    }
    fig = judge(peer_timings(sent), wire_mean_timings(joined))
    assert fig["joined"] == 3 and fig["mismatched"] == 0
    ttft = fig["metrics"]["ttft"]["error_ms"]
    # the tool's TTFT is 0.3 ms late and starts 0.02 ms early (a: 0.06 ms): +0.32 ms
    assert ttft["p50"] == pytest.approx(0.32, abs=1e-3)
    assert ttft["max_abs"] == pytest.approx(0.36, abs=1e-3)
    assert fig["metrics"]["itl"]["error_ms"]["max_abs"] == pytest.approx(0.0, abs=1e-3)


def test_join_by_time_leaves_a_request_the_wire_lacks() -> None:
    t0 = 1_796_000_000.0
    sent = {"a": _request(t0, 50.0, 3, 5.0), "b": _request(t0 + 2.0, 50.0, 3, 5.0)}
    joined = join_by_time(sent, [_on_wire(sent["a"], 40_000, 0)])
    assert list(joined) == ["a"]

from __future__ import annotations

import numpy as np
import pytest

from loadlab._analysis import metrics
from loadlab._analysis.summary import summarize
from loadlab.records import RequestRecord
from loadlab.results import Results

MS = 1_000_000


def rec(sent_ms: float, chunks_ms: list[float], **kw) -> RequestRecord:
    return RequestRecord(
        request_id=kw.pop("request_id", "r"),
        sent_ns=int(sent_ms * MS),
        chunk_ns=[int(c * MS) for c in chunks_ms],
        **kw,
    )


def test_per_request_metrics_hand_computed() -> None:
    r = rec(10, [110, 130, 150, 190], intended_ns=5 * MS, output_tokens=4)
    assert metrics.ttft_ms(r) == 100
    assert metrics.ttft_from_intended_ms(r) == 105
    assert metrics.e2e_ms(r) == 180
    assert metrics.itl_ms(r) == [20, 20, 40]
    assert metrics.tpot_ms(r) == pytest.approx(80 / 3)
    assert metrics.max_gap_ms(r) == 40
    assert metrics.stall_count(r, k=1.5) == 1


def test_tpot_uses_usage_count_and_needs_two_tokens() -> None:
    # 2 chunks but the server says 5 tokens: (t_last - t_first) / (5 - 1)
    assert metrics.tpot_ms(rec(0, [100, 180], output_tokens=5)) == 20
    assert metrics.tpot_ms(rec(0, [100], output_tokens=1)) is None
    assert metrics.ttft_ms(RequestRecord(request_id="x")) is None


def test_percentiles_equal_numpy() -> None:
    vals = [float(i) for i in range(1, 101)]
    d = metrics.distribution(vals)
    assert d.at(50) == metrics.percentile(vals, 50) == 50.5
    assert d.at(99) == pytest.approx(np.percentile(vals, 99))
    assert d.count == 100 and d.max == 100 and d.min == 1 and d.mean == 50.5
    assert metrics.distribution([]).at(50) is None and metrics.distribution([]).count == 0
    with pytest.raises(ValueError, match="p97 was not computed"):
        d.at(97)


def test_percentile_interpolates_where_nearest_rank_would_not() -> None:
    """Linear (type 7): with 10 values the p99 lies between the two largest, not on the max."""
    vals = [float(i) for i in range(1, 11)]
    assert metrics.percentile(vals, 99) == pytest.approx(9.91)
    assert metrics.percentile([7.0], 99) == 7.0


def test_a_distribution_writes_the_results_files_keys() -> None:
    d = metrics.distribution([1.0, 2.0, 3.0], (50.0, 99.9))
    assert list(d.to_dict()) == ["count", "p50", "p99.9", "mean", "min", "max"]
    assert d.to_dict()["p50"] == 2.0


def test_counts_invariants() -> None:
    recs = [
        RequestRecord("a"),
        RequestRecord("b", outcome="http_429"),
        RequestRecord("c", outcome="dropped"),
        RequestRecord("d", outcome="incomplete"),
    ]
    c = metrics.count_outcomes(recs)
    assert c.scheduled == c.sent + c.dropped == 4
    assert c.sent == c.ok + c.failed == 3
    assert c.error_rate == pytest.approx(2 / 3) == c.to_dict()["error_rate"]
    assert c.by_outcome == {"dropped": 1, "http_429": 1, "incomplete": 1, "ok": 1}


def test_throughput_and_goodput_in_window() -> None:
    recs = [
        rec(0, [100, 200, 300], output_tokens=3, request_id="a"),
        rec(0, [900, 1500, 2100], output_tokens=3, request_id="b"),  # ends outside the window
        rec(0, [], outcome="timeout", request_id="c"),
    ]
    t = metrics.throughput(recs, (0, 1000 * MS))
    assert t.output_tokens == 4  # a's three, b's first
    assert t.output_tokens_per_s == pytest.approx(4.0)
    assert t.requests_per_s == pytest.approx(1.0)
    assert "output_tokens_per_s_series" not in t.to_dict()  # the summary keeps no series
    assert metrics.goodput_rps(recs, (0, 1000 * MS), {"ttft_ms": 150}) == pytest.approx(1.0)
    assert metrics.goodput_rps(recs, (0, 1000 * MS), {"ttft_ms": 50}) == 0.0
    with pytest.raises(ValueError, match="unknown per-request objective"):
        metrics.good_requests(recs, {"ttft": 1})


def test_log_histogram_merge_within_one_percent() -> None:
    rng = np.random.default_rng(1)
    values = rng.lognormal(3, 1, 20_000)
    parts = [metrics.LogHistogram() for _ in range(4)]
    for i, v in enumerate(values):
        parts[i % 4].add(float(v))
    merged = parts[0]
    for p in parts[1:]:
        merged.merge(metrics.LogHistogram.from_dict(p.to_dict()))
    for q in (0.5, 0.9, 0.99):
        exact = float(np.quantile(values, q, method="lower"))
        assert merged.quantile(q) == pytest.approx(exact, rel=0.01)


def test_summary_roundtrip(tmp_path) -> None:
    from loadlab.results import read_results, write_results

    res = Results(records=[rec(0, [100, 120], output_tokens=2)], config={"api_key": "sk-x"})
    path = write_results(res, tmp_path / "r.json")
    assert "sk-x" not in path.read_text()
    back = read_results(path)
    assert summarize(back).ttft_ms.at(50) == 100
    assert read_results(path).to_dict()["summary"] == summarize(res).to_dict()

"""The lab summary's numbers on hand-made records (no server)."""

from __future__ import annotations

import pytest

from loadlab.lab.experiments import counter_deltas
from loadlab.lab.summary import (
    acceptance,
    batch_stats,
    class_stats,
    kv_transfer_stats,
    server_counter,
)
from tests.helpers.lab import rec, results, summary_of, two_streams


def test_class_stats_by_hand() -> None:
    s = class_stats(two_streams(), "chat", {"max_gap_ms": 20.0})
    assert s["requests"] == 2 and s["failed"] == 1
    assert s["ttft_ms_p50"] == pytest.approx(7.5)  # TTFTs 5 and 10
    # ITL pooled: 5 5 5 10 10 40 -> p50 7.5; p99 at rank 4.95: 10 + 0.95 x 30
    assert s["itl_ms_p50"] == pytest.approx(7.5)
    assert s["itl_ms_p99"] == pytest.approx(38.5)
    # longest stall per stream: 40 and 10
    assert s["stall_ms_p50"] == pytest.approx(25.0)
    assert s["stall_ms_max"] == pytest.approx(40.0)
    assert s["stalls_per_stream"] == pytest.approx(0.5)  # (1 + 0) / 2
    # only b meets max_gap <= 20; span from 0 to the last end (60 ms)
    assert s["good_requests"] == 1
    assert s["goodput_rps"] == pytest.approx(1 / 0.060)


def test_class_stats_other_class_and_k() -> None:
    r = two_streams()
    assert class_stats(r, "long_prompt")["ttft_ms_p50"] == pytest.approx(200.0)
    # with k = 10 the 40 ms gap is not over 10 x 5 ms
    assert class_stats(r, "chat", k=10.0)["stalls_per_stream"] == 0.0
    assert class_stats(r, "nothing")["itl_ms_p99"] is None


def test_server_counters() -> None:
    before = {"x_total": 1.0, 'y_total{phase="a"}': 2.0, "g": 9.0}
    after = {"x_total": 4.0, 'y_total{phase="a"}': 2.5, "g": 1.0, "new_total": 3.0}
    assert counter_deltas(before, after) == {"x_total": 3.0, 'y_total{phase="a"}': 0.5}
    assert server_counter(two_streams(), r"preemptions_total$") == 2.0
    assert server_counter(two_streams(), r"nothing_total$") is None


def test_acceptance_ratios() -> None:
    slow = results([rec("a", [0, 10, 20, 320])])  # gaps 10 10 300
    fast = results([rec("a", [0, 10, 20, 60])])  # gaps 10 10 40
    summary = summary_of(
        {
            "continuous": {"interference": slow},
            "chunked": {"interference": fast},
            "disaggregated": {"interference": fast, "baseline": fast},
        }
    )
    acc = summary["acceptance"]
    assert isinstance(acc, list)
    # p99 of [10, 10, 40] at rank 1.98: 10 + 0.98 x 30 = 39.4; of [10, 10, 300]: 294.2
    assert acc[0]["value"] == pytest.approx(39.4 / 294.2) and acc[0]["met"] is True
    assert acc[1]["value"] == pytest.approx(1.0) and acc[1]["met"] is True
    assert acc[2]["value"] is None  # no long prompt in chunked mode's hand-made run
    assert acceptance({"modes": {}})[0]["met"] is None


def test_run_summary_shows_stalls_beside_itl() -> None:
    from loadlab.report.html import render_html as run_html
    from loadlab.report.text import render_summary

    text = render_summary(two_streams())
    lines = text.splitlines()
    itl = next(i for i, ln in enumerate(lines) if ln.startswith("ITL (ms)"))
    stall = lines[itl + 1].split()
    # longest gap per ok stream: a 40, b 10 (the long prompt has one chunk, no gap)
    assert stall[:5] == ["Longest", "stall", "per", "stream", "(ms)"]
    assert stall[5:7] == ["2", "25.0"] and stall[10] == "40.0"
    assert "Longest stall per stream" in run_html(two_streams())


def test_mean_decode_batch_from_server_counters() -> None:
    deltas = {
        'loadlab_server_tokens_total{phase="decode"}': 30.0,
        'loadlab_server_tokens_total{phase="prefill"}': 500.0,
        'loadlab_server_steps_total{phase="decode"}': 8.0,
        'loadlab_server_steps_total{phase="mixed"}': 2.0,
        'loadlab_server_steps_total{phase="prefill"}': 1.0,
    }
    b = batch_stats(results([rec("a", [5, 10]), rec("b", [10, 40])], deltas))
    assert b["mean_decode_batch"] == pytest.approx(3.0)  # 30 tokens / (8 + 2) steps
    assert b["job_s"] == pytest.approx(0.040) and b["output_tokens"] == 4


def test_kv_transfer_per_request_and_from_counters() -> None:
    a, b = rec("a", [5, 10], prompt_tokens=100), rec("b", [10, 40], prompt_tokens=60)
    a.server.update(kv_transfer_s=0.010, kv_transfer_bytes=800)
    b.server.update(kv_transfer_s=0.030, kv_transfer_bytes=480)
    kv = kv_transfer_stats(results([a, b]))  # no counters: the records' own fields
    assert kv["bytes_total"] == 1280 and kv["seconds_total"] == pytest.approx(0.040)
    assert kv["per_request_ms_mean"] == pytest.approx(20.0)
    deltas = {"s_kv_transfer_bytes_total": 1600.0, "s_kv_transfer_seconds_total": 0.5}
    c, d = rec("c", [5], prompt_tokens=100), rec("d", [5], prompt_tokens=100)
    kv = kv_transfer_stats(results([c, d], deltas))  # counters only: 0.5 s over 2 requests
    assert kv["per_request_ms_mean"] == pytest.approx(250.0)
    assert kv["bytes_per_prompt_token"] == pytest.approx(8.0)  # 1600 / 200

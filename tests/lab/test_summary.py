"""The lab summary's numbers on hand-made records (no server)."""

from __future__ import annotations

import numpy as np
import pytest

from loadlab._lab import settings_for
from loadlab._lab.batchjob import batch_job_summary, expected_max, job_lengths, schedule_rows
from loadlab._lab.claims import judge, judge_claims
from loadlab._lab.experiments import counter_deltas
from loadlab._lab.summary import (
    batch_stats,
    class_stats,
    interference_stats,
    kv_transfer_stats,
    server_counter,
)
from loadlab.results import Results
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


def _stalled(stall_ms: float) -> Results:
    """A long prompt prefilled from 0 to 100 ms; chat a in flight (one gap of ``stall_ms``);
    chat b after it."""
    return results(
        [
            rec("long", [100], cls="long_prompt"),
            rec("a", [20, 30, 30 + stall_ms, 40 + stall_ms]),
            rec("b", [250, 260, 270]),
        ]
    )


def _baseline() -> Results:
    # gaps 10 10 10 | 10 20: pooled median 10; longest per stream 10 and 20 (median 15)
    return results([rec("c", [0, 10, 20, 30]), rec("d", [0, 10, 30])], experiment="baseline")


def test_interference_stats_by_hand() -> None:
    st = interference_stats(_stalled(100.0), _baseline(), k=3.0)
    assert st["streams_in_flight"] == 1  # b starts after the window
    assert st["longest_stall_ms"] == pytest.approx(100.0)
    assert st["baseline_longest_stall_ms"] == pytest.approx(15.0)
    assert st["baseline_gap_ms"] == pytest.approx(10.0)
    # a's time inside the window: 20..100 ms = 80; in gaps over 3 x 10 ms: 30..100 = 70
    assert st["stall_share"] == pytest.approx(70 / 80)


def test_claims_per_round_with_spread_and_busy_rounds() -> None:
    busy = {"others_cores": 1.2, "own_cores": 0.8, "steal_share": 0.0}
    summary = summary_of(
        {
            "continuous": {"interference": [_stalled(300.0), _stalled(300.0)]},
            # round 1: 60 / 300 = 0.2 (shown side); round 2: 150 / 300 = 0.5, measured busy
            "chunked": {
                "interference": [
                    _stalled(60.0),
                    results(_stalled(150.0).records, machine=busy),
                ]
            },
            "disaggregated": {
                "interference": [_stalled(20.0), _stalled(25.0)],
                "baseline": [_baseline(), _baseline()],
            },
        }
    )
    claims = {c["claim"]: c for c in summary["claims"]}
    chunked = claims["chunked"]
    assert chunked["rounds"] == pytest.approx([0.2, 0.5])
    assert chunked["status"] == "not shown on this machine"
    assert (
        "straddles" in chunked["reason"]
        and "2 (other processes took up to 1.20 cores)" in chunked["reason"]
    )
    disagg = claims["disagg"]  # 20 / 15 = 1.33, 25 / 15 = 1.67 against its baseline
    assert disagg["rounds"] == pytest.approx([20 / 15, 25 / 15])
    assert disagg["status"] == "not shown on this machine"  # 1.67 > 1.5 in round 2
    assert claims["static"]["status"] == "not measured"  # no batch job ran
    assert "share one GPU" not in disagg["reason"]
    # Both pools on one GPU: the reason says the lab cannot separate them there.
    workers = [{"role": "prefill", "device": "cuda:0"}, {"role": "decode", "device": "cuda:0"}]
    summary["modes"]["disaggregated"]["server_info"] = {"workers": workers}
    shared = {c["claim"]: c for c in judge_claims(summary)}["disagg"]
    assert shared["status"] == "not shown on this machine"
    assert shared["reason"].startswith("its prefill and decode workers share one GPU (cuda:0)")
    assert shared["reason"].endswith(disagg["reason"])
    # every figure from a busy round says so
    fig = summary["modes"]["chunked"]["stalls"]["longest_stall_ms"]
    assert fig["median"] == pytest.approx(105.0) and fig["busy_rounds"] == [2]
    assert summary["modes"]["continuous"]["stalls"]["longest_stall_ms"]["busy_rounds"] == []


def test_judge_statuses() -> None:
    assert judge([0.1, 0.2], "<=", 1 / 3)["status"] == "shown"
    quiet = judge([0.5, 0.6], "<=", 1 / 3)
    assert quiet["status"] == "not shown on this machine" and "quiet machine" in quiet["reason"]
    assert judge([None, None], "<=", 1.5)["status"] == "not measured"


def test_batch_job_summary_bound_replay_and_curve() -> None:
    s = settings_for("tiny")
    lengths = job_lengths(s)
    per_round = {
        "static": [{"batch": {"job_s": 2.0}}, {"batch": {"job_s": 3.0}}],
        "continuous": [{"batch": {"job_s": 1.0}}, {"batch": {"job_s": 2.0}}],
    }
    flat = {"decode": {"1": {"step_ms": {"median": 10.0}}, "4": {"step_ms": {"median": 10.0}}}}
    job = batch_job_summary(s, per_round, flat)
    assert job["documents"] == len(lengths) == s.batch_documents
    assert job["bound"] == pytest.approx(expected_max(lengths, s.max_num_seqs) / np.mean(lengths))
    # a flat step-cost curve: the gain is the ratio of the two schedules' decode steps
    steps = {p: len(schedule_rows(lengths, s.max_num_seqs, p)) for p in ("static", "continuous")}
    assert job["curve_gain"] == pytest.approx(steps["static"] / steps["continuous"])
    assert job["measured_gain"]["rounds"] == [2.0, 1.5]


def test_run_summary_shows_stalls_beside_itl() -> None:
    from loadlab._report.html import render_html as run_html
    from loadlab._report.text import render_summary

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
        "loadlab_server_steps_while_waiting_total": 4.0,
        "loadlab_server_decode_tokens_while_waiting_total": 14.0,
    }
    b = batch_stats(results([rec("a", [5, 10]), rec("b", [10, 40])], deltas))
    assert b["mean_decode_batch"] == pytest.approx(3.0)  # 30 tokens / (8 + 2) steps
    assert b["useful_rows_waiting"] == pytest.approx(3.5)  # 14 / 4
    assert b["requests_per_s"] == pytest.approx(2 / 0.040)
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
    assert kv["cached_bytes_total"] is None  # a server without the split
    kv = kv_transfer_stats(results([c, d], {**deltas, "s_kv_transfer_cached_bytes_total": 1200.0}))
    assert kv["cached_bytes_total"] == 1200

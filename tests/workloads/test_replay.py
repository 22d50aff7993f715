"""Trace replay into request specs (time scale, window, rate scale, limit) and fidelity."""

from __future__ import annotations

import json

from loadlab.config import RunConfig
from loadlab.records import RequestRecord
from loadlab.workloads import build_requests, workload_extra
from loadlab.workloads._params import TRACES
from loadlab.workloads._prompts import BLOCK_TOKENS
from loadlab.workloads._trace import TraceStats, iter_trace, replay_fidelity, send_lag_ms


def replay_cfg(path, seed=0, **workload):
    return RunConfig(
        rate_rps=1,
        requests=100_000,
        seed=seed,
        workload={"kind": "trace", "path": str(path), **workload},
    )


def test_azure_conv_60x_for_60s_keeps_times_and_lengths():
    path = TRACES["azure-2023-conv"]
    stream = build_requests(replay_cfg(path, time_scale=60, duration_s=60))
    specs = list(stream)
    rows = [r for r in iter_trace(path, duration_s=60)]
    assert len(specs) == len(rows) == 191
    for spec, row in zip(specs, rows, strict=True):
        assert spec.intended_at_s == row.t_s / 60
        assert (spec.prompt_tokens, len(spec.prompt), spec.max_tokens) == (
            row.prompt_tokens,
            row.prompt_tokens,
            row.output_tokens,
        )
        assert spec.request_class == "trace" and spec.request_id == f"trace-{row.line}"
    assert specs[-1].intended_at_s < 1.0
    extra = workload_extra(stream)
    assert extra["trace"]["requests"] == 191 and extra["trace"]["format"] == "azure-2023"


def test_window_start_shifts_times_to_zero():
    path = TRACES["azure-2023-conv"]
    specs = list(build_requests(replay_cfg(path, start_s=600, duration_s=30, time_scale=2)))
    rows = list(iter_trace(path, start_s=600, duration_s=30))
    assert [s.intended_at_s for s in specs] == [(r.t_s - 600) / 2 for r in rows]
    assert 0 <= specs[0].intended_at_s and specs[-1].intended_at_s < 15


def test_limit_and_run_requests_cap():
    path = TRACES["azure-2023-code"]
    assert len(list(build_requests(replay_cfg(path, limit=7)))) == 7
    cfg = RunConfig(rate_rps=1, requests=5, workload={"kind": "trace", "path": str(path)})
    assert len(list(build_requests(cfg))) == 5


def test_rate_scale_thins_and_duplicates_reproducibly():
    path = TRACES["azure-2023-conv"]
    base = len(list(build_requests(replay_cfg(path, duration_s=300))))
    half = build_requests(replay_cfg(path, duration_s=300, rate_scale=0.5, seed=4))
    half_specs = list(half)
    # binomial(base, 0.5): sd = sqrt(base) / 2 ~ 12 for base ~ 550; 60 is ~5 sd
    assert base > 400 and abs(len(half_specs) - base / 2) < 60
    assert workload_extra(half)["trace"]["thinned"] == base - len(half_specs)
    again = list(build_requests(replay_cfg(path, duration_s=300, rate_scale=0.5, seed=4)))
    assert [s.request_id for s in again] == [s.request_id for s in half_specs]
    double = list(build_requests(replay_cfg(path, duration_s=300, rate_scale=2.0)))
    assert len(double) == 2 * base
    assert (
        double[0].intended_at_s == double[1].intended_at_s and double[0].prompt != double[1].prompt
    )


def test_too_long_rows_are_skipped_and_counted():
    path = TRACES["azure-2023-conv"]
    stream = build_requests(replay_cfg(path, duration_s=60, max_total_tokens=4096))
    specs = list(stream)
    assert all(s.prompt_tokens + s.max_tokens <= 4096 for s in specs)
    assert workload_extra(stream)["trace"]["too_long"] == 191 - len(specs) == 10


def test_mooncake_replay_shares_prefixes_for_equal_hash_ids(shared_data):
    path = shared_data / "traces" / "mooncake_conversation_trace.jsonl"
    specs = list(build_requests(replay_cfg(path, limit=40)))
    with path.open() as f:
        rows = [json.loads(next(f)) for _ in range(40)]
    assert [s.prompt_tokens for s in specs] == [r["input_length"] for r in rows]
    for spec, row in zip(specs, rows, strict=True):
        for other, orow in zip(specs, rows, strict=True):
            if row["hash_ids"][0] == orow["hash_ids"][0]:
                assert spec.prompt[:BLOCK_TOKENS] == other.prompt[:BLOCK_TOKENS]
            else:
                assert spec.prompt[:BLOCK_TOKENS] != other.prompt[:BLOCK_TOKENS]


def test_closed_loop_replay_has_no_times():
    path = TRACES["azure-2023-code"]
    cfg = RunConfig(concurrency=2, requests=10, workload={"kind": "trace", "path": str(path)})
    assert {s.intended_at_s for s in build_requests(cfg)} == {None}


def test_skip_bad_lines_reaches_the_extra(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 00:00:00+00:00,5,5\n"
        "nonsense\n2024-01-01 00:00:01+00:00,6,0\n"
    )
    stream = build_requests(replay_cfg(p, skip_bad_lines=True))
    specs = list(stream)
    assert [(s.prompt_tokens, s.max_tokens) for s in specs] == [(5, 5), (6, 1)]
    trace = workload_extra(stream)["trace"]
    assert (
        trace["bad_lines"] == 1 and trace["bad_line_numbers"] == [3] and trace["zero_length"] == 1
    )
    assert TraceStats().bad_lines == 0


def rec(rid, intended_ms, sent_ms):
    ms = 1_000_000
    return RequestRecord(
        rid,
        intended_ns=None if intended_ms is None else intended_ms * ms,
        sent_ns=None if sent_ms is None else sent_ms * ms,
    )


def test_send_lag_hand_computed():
    records = [rec(str(i), 100 * i, 100 * i + lag) for i, lag in enumerate([1, 2, 3, 4, 10])]
    records += [rec("dropped", 900, None), rec("closed", None, 5)]
    lag = send_lag_ms(records)
    assert lag["count"] == 5 and lag["p50"] == 3.0 and lag["max"] == 10.0 and lag["min"] == 1.0
    assert lag["p99"] == 4 + 0.96 * 6  # numpy linear: rank 0.99 * 4 = 3.96
    assert lag["mean"] == 4.0


def test_replay_fidelity_rate_series():
    # scheduled: 3 in second 0, 1 in second 1; one send slips into second 1
    records = [rec("a", 0, 1), rec("b", 500, 502), rec("c", 990, 1003), rec("d", 1500, 1501)]
    fid = replay_fidelity(records, bin_s=1.0)
    assert fid["scheduled_rate_rps"] == [3.0, 1.0] and fid["sent_rate_rps"] == [2.0, 2.0]
    assert fid["max_rate_diff_rps"] == 1.0 and fid["send_lag_ms"]["max"] == 13.0


def test_shipped_traces_by_name_equal_the_published_files(tmp_path):
    from tests.conftest import SHARED_DATA

    cfg = replay_cfg("x", requests=5)
    by_name = cfg.replace(workload={"kind": "trace", "trace": "azure-2023-code", "limit": 5})
    by_path = replay_cfg(TRACES["azure-2023-code"], limit=5)
    assert list(build_requests(by_name)) == list(build_requests(by_path))
    for name, path in TRACES.items():
        shared = SHARED_DATA / "traces" / path.name
        if shared.is_file():  # byte for byte the published file (CRLF, no final newline)
            assert path.read_bytes() == shared.read_bytes(), name


def test_a_trace_name_or_a_path_not_both_and_typos_are_named():
    import pytest

    from loadlab.workloads import validate_workload
    from loadlab.workloads._params import WorkloadError

    def check(**workload):
        validate_workload(RunConfig(rate_rps=1, requests=3, workload={"kind": "trace", **workload}))

    with pytest.raises(WorkloadError, match="did you mean 'azure-2023-conv'"):
        check(trace="azure-2023-cnv")
    with pytest.raises(WorkloadError, match="not both"):
        check(trace="azure-2023-conv", path=str(TRACES["azure-2023-conv"]))
    with pytest.raises(WorkloadError, match=r'trace = "NAME" \(shipped: azure-2023-conv'):
        check()

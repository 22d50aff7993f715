"""The self-test's error arithmetic against hand-computed records and truth."""

from __future__ import annotations

import pytest

from loadlab.records import RequestRecord
from loadlab.results import Results
from loadlab.selftest._accuracy import PRESETS, SelftestConfig, compare_level, judge, render_levels

MS = 1_000_000
T0 = 5_000 * MS  # absolute perf_counter_ns of the run start


def _rec(rid: str, sent: int, chunks: list[int]) -> RequestRecord:
    return RequestRecord(
        request_id=rid,
        sent_ns=sent * MS,
        chunk_ns=[c * MS for c in chunks],
        end_ns=chunks[-1] * MS,
        output_tokens=len(chunks),
        output_tokens_source="usage",
    )


def test_compare_level_by_hand() -> None:
    # a: sent 0, server got it at 1, wrote at 100/120/140, loadlab read at 101/121/142
    # b: sent 10, got 11, wrote 110/130/150, read 113/133/151
    recs = [_rec("a", 0, [101, 121, 142]), _rec("b", 10, [113, 133, 151])]
    truth = {
        "a": {"recv_ns": T0 + 1 * MS, "chunk_ns": [T0 + x * MS for x in (100, 120, 140)]},
        "b": {"recv_ns": T0 + 11 * MS, "chunk_ns": [T0 + x * MS for x in (110, 130, 150)]},
    }
    res = Results(records=recs, window_ns=(0, 151 * MS))
    lv = compare_level(res, truth, T0)
    assert lv["ttft_err_ms"]["p50"] == pytest.approx(2.0)  # errors 1 and 3
    assert lv["ttft_err_ms"]["max"] == pytest.approx(3.0)
    assert lv["ttft_pct_diff_ms"]["p50"] == pytest.approx(2.0)  # reported 101,103 vs true 100,100
    assert lv["send_delay_ms"]["p50"] == pytest.approx(1.0)
    # gaps: reported 20,21,20,18 vs true 20 each: gap errors 0,1,0,2
    assert lv["itl_gap_err_ms"]["max"] == pytest.approx(2.0)
    assert lv["itl_p99_err_ms"] == pytest.approx(21 - 0.03 * 1 - 20, abs=0.05)
    # 6 tokens: measured over [0, 151] ms, truth over [0, 150] ms
    assert lv["tps_measured"] == pytest.approx(6 / 0.151)
    assert lv["tps_truth"] == pytest.approx(6 / 0.150)
    assert lv["server_tps"] == pytest.approx(6 / 0.149)  # first receive 1 .. last write 150
    assert lv["mismatched"] == 0 and lv["ok"] == 2


def test_mismatched_chunk_counts_are_counted_not_compared() -> None:
    res = Results(records=[_rec("a", 0, [101, 121])], window_ns=(0, 121 * MS))
    truth = {"a": {"recv_ns": T0, "chunk_ns": [T0 + 100 * MS]}}
    lv = compare_level(res, truth, T0)
    assert lv["mismatched"] == 1 and lv["ttft_err_ms"]["p50"] is None
    lv["streams"] = 1
    assert judge(lv, SelftestConfig()) is False
    assert "NO" in render_levels([{**lv, "within_tolerance": False}])
    # a level measured while something else took the CPU says so on its line
    assert "busy" not in render_levels([{**lv, "within_tolerance": False, "busy": []}])
    busy = render_levels([{**lv, "within_tolerance": False, "busy": ["steal 12%"]}])
    assert busy.endswith("NO (busy: steal 12%)")


def test_presets_are_the_documented_loads() -> None:
    def load(p: SelftestConfig) -> tuple[object, ...]:  # streams, requests, server timing
        return (p.levels, p.levels[0] * p.requests_per_stream, p.ttft_ms, p.itl_ms, p.tokens)

    assert load(PRESETS["streams64"]) == ((64,), 640, 100.0, 20.0, 64)
    assert load(PRESETS["streams256"]) == ((256,), 2560, 50.0, 5.0, 128)
    with pytest.raises(ValueError, match="workers"):
        SelftestConfig(levels=(1,), workers=2)


def test_earlier_preset_names_still_run_but_are_not_offered() -> None:
    import argparse

    from loadlab._commands import selftest

    parser = argparse.ArgumentParser(prog="loadlab selftest")
    selftest.add_arguments(parser)
    for old, new in (("issue64", "streams64"), ("issue256", "streams256")):
        assert parser.parse_args(["--preset", old]).preset == new
    assert parser.parse_args(["--preset", "streams64"]).preset == "streams64"
    assert "streams256" in parser.format_help() and "issue" not in parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["--preset", "issue65"])

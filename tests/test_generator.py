"""Reading a results file's generator section: the worst process of a merged run."""

from __future__ import annotations

from loadlab._analysis.generator import generator_parts, merge_parts, saturation_warning


def test_a_merged_runs_warning_reads_its_worst_process() -> None:
    """A --workers run keeps each process's section under "parts": the warning quotes the
    worst one's lag or backlog, not the merged section's missing fields."""
    lagging = {"threshold_ms": 20.0, "loop_lag_ms_p99": 31.5, "parse_backlog_ms_p50": 0.0}
    calm = {"threshold_ms": 20.0, "loop_lag_ms_p99": 4.0, "parse_backlog_ms_p50": 0.0}
    merged = {"saturated": True, "loop_lag_ms_max": 60.0, "parts": [calm, lagging]}
    assert "lagged p99 31.5 ms (threshold 20 ms)" in (saturation_warning(merged) or "")
    behind = {"threshold_ms": 20.0, "loop_lag_ms_p99": 6.0, "parse_backlog_ms_p50": 44.0}
    merged["parts"] = [calm, behind]
    assert "median parse backlog 44.0 ms" in (saturation_warning(merged) or "")


def test_merging_keeps_each_process_and_flags_the_run_if_one_was_saturated() -> None:
    calm = {"saturated": False, "loop_lag_ms_max": 8.0}
    busy = {"saturated": True, "loop_lag_ms_max": 60.0}
    section = merge_parts([calm, busy])
    assert section["saturated"] is True and section["loop_lag_ms_max"] == 60.0
    assert generator_parts(section) == [calm, busy]
    assert generator_parts(calm) == [calm]
    assert merge_parts([calm, calm])["saturated"] is False

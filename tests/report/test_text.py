"""The text summary on a hand-made results file, every figure computed by hand."""

from __future__ import annotations

from pathlib import Path

from loadlab._report.text import fmt_num, render_summary
from loadlab.cli import main
from loadlab.records import RequestRecord
from loadlab.results import Results, write_results

MS = 1_000_000
S = 1_000_000_000


def hand_made(intended: bool = False) -> Results:
    """4 ok requests sent at 0, 1, 2, 3 s with TTFT 10/20/30/40 ms and 3 tokens 5 ms apart,
    one HTTP 500. Window [0, 4 s]."""
    records = []
    for i, ttft in enumerate((10, 20, 30, 40)):
        sent = i * S
        first = sent + ttft * MS
        records.append(
            RequestRecord(
                request_id=f"r{i}",
                sent_ns=sent,
                intended_ns=sent - 2 * MS if intended else None,
                chunk_ns=[first, first + 5 * MS, first + 10 * MS + (i == 3) * 20 * MS],
                end_ns=first + 40 * MS,
                output_tokens=3,
                prompt_tokens=100,
            )
        )
    records.append(
        RequestRecord(request_id="bad", outcome="http_500", sent_ns=S // 2, end_ns=S // 2 + MS)
    )
    return Results(records=records, window_ns=(0, 4 * S), started_at="2026-11-30T09:00:00Z")


def _row(text: str, label: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if ln.startswith(label + " "))
    return line[len(label) :].split()


def test_summary_figures_by_hand() -> None:
    text = render_summary(hand_made())
    # TTFT 10, 20, 30, 40 (numpy linear): p50 25, p90 37, p95 38.5, p99 39.7, max 40.
    assert _row(text, "TTFT (ms)") == ["4", "25.0", "37.0", "38.5", "39.7", "40.0", "1", "of", "5"]
    # ITL: gaps 5,5 | 5,5 | 5,5 | 5,25 -> p50 5, max 25.
    assert _row(text, "ITL (ms)")[:2] == ["8", "5.0"] and _row(text, "ITL (ms)")[5] == "25.0"
    # TPOT: (last - first) / 2 = 5, 5, 5, 15 ms.
    assert _row(text, "TPOT (ms)")[1] == "5.0" and _row(text, "TPOT (ms)")[5] == "15.0"
    # E2E: 20, 30, 40, 70 -> p50 35.
    assert _row(text, "E2E (ms)")[1] == "35.0"
    assert "from intended" not in text  # closed loop: no from-intended rows
    # 12 output tokens / 4 s; (12 + 400 prompt tokens) / 4 s; 4 completions / 4 s.
    assert "output 3.0 tok/s" in text and "total 103.0 tok/s" in text and "1.00 req/s" in text
    assert "FAILED 1 (20.0 %)" in text and "http_500 1" in text
    assert "longest 25.0 ms (request r3)" in text
    assert "window 4.00 s" in text
    assert "SATURATED" not in text


def test_open_loop_and_saturation_are_shown() -> None:
    res = hand_made(intended=True)
    res.generator = {"saturated": True, "loop_lag_ms_max": 45.25, "threshold_ms": 20.0}
    text = render_summary(res)
    # From the intended send time, 2 ms earlier: TTFT 12, 22, 32, 42 -> p50 27.
    assert _row(text, "TTFT from intended (ms)")[1] == "27.0"
    assert "GENERATOR SATURATED: event-loop lag up to 45.2 ms (threshold 20.0 ms)" in text
    assert text.count("SATURATED") >= 2  # a banner on top and a reminder at the end


def test_a_parse_backlog_saturation_says_what_it_cost() -> None:
    """Two worker processes, one whose parser fell behind while its loop kept time."""
    res = hand_made()
    part = {"threshold_ms": 20.0, "loop_lag_ms_p99": 6.0, "parse_backlog_ms_p50": 41.5}
    calm = {"threshold_ms": 20.0, "loop_lag_ms_p99": 5.0, "parse_backlog_ms_p50": 0.0}
    res.generator = {"saturated": True, "loop_lag_ms_max": 9.0, "parts": [calm, part]}
    text = render_summary(res)
    assert "lag up to 9.0 ms, median parse backlog 41.5 ms (threshold 20.0 ms)" in text
    assert "timestamps are exact, but it sent less load than asked" in text


def test_tokens_read_after_a_stall_are_counted_in_the_banner() -> None:
    """A run the ticker's p99 passed, saturated by the first and later tokens its stalls met."""
    res = hand_made()
    res.generator = {
        "saturated": True, "loop_lag_ms_max": 31.0, "threshold_ms": 20.0, "loop_lag_ms_p99": 4.0,
        "first_tokens": 2560, "stalled_first_tokens": 46, "stalled_first_token_ms_max": 24.7,
        "later_tokens_checked": 325120, "stalled_later_tokens": 4100,
    }  # fmt: skip
    text = render_summary(res)
    assert "46 of 2560 first tokens read just after such a lag" in text
    assert "4100 of 325120 later tokens read just after such a lag" in text
    # under 1 % of each (saturated by the ticker here): counted in the file, not in the banner
    res.generator = {**res.generator, "loop_lag_ms_p99": 25.0, "stalled_first_tokens": 25,
                     "stalled_later_tokens": 3000}  # fmt: skip
    text = render_summary(res)
    assert "GENERATOR SATURATED" in text and "read just after such a lag" not in text


def test_empty_run_and_number_format() -> None:
    text = render_summary(Results(records=[]))
    assert _row(text, "TTFT (ms)")[:2] == ["0", "-"]
    assert fmt_num(None) == "-" and fmt_num(1234.5) == "1,234.5" and fmt_num(0.01234) == "0.0123"
    assert fmt_num(float("inf")) == "inf" and fmt_num(7) == "7"


def test_report_command(tmp_path: Path, capsys: object) -> None:
    path = write_results(hand_made(), tmp_path / "run.json")
    assert main(["report", str(path), "--csv", str(tmp_path / "run.csv")]) == 0
    lines = (tmp_path / "run.csv").read_text().splitlines()
    assert len(lines) == 6 and lines[0].startswith("request_id,")
    assert main(["report", str(tmp_path / "missing.json")]) == 2


def test_first_error_and_trace_skips_are_shown() -> None:
    res = hand_made()
    res.records[-1].error = 'HTTP 500: {"error": "boom"}'
    res.extra["workload"] = {
        "kind": "trace",
        "trace": {"format": "azure-2023", "path": "t.csv", "rows_read": 10, "requests": 6,
                  "too_long": 3, "bad_lines": 1, "filtered_out": 0},
    }  # fmt: skip
    text = render_summary(res)
    assert 'first error: HTTP 500: {"error": "boom"}' in text
    assert (
        "trace       azure-2023 t.csv: 10 rows read, 6 requests; "
        "skipped: 3 longer than max_total_tokens, 1 malformed lines"
    ) in text
    assert "first error" not in render_summary(Results(records=res.records[:4]))


def test_prompt_match_and_short_answers_are_shown() -> None:
    res = hand_made()
    res.records[0].prompt_tokens_requested = 100  # exact
    res.records[1].prompt_tokens_requested = 101  # off by one
    res.records[2].prompt_tokens_requested = 90  # off by 10
    for r in res.records[:4]:
        r.max_tokens, r.finish_reason = 3, "length"
    res.records[3].max_tokens, res.records[3].finish_reason = 8, "stop"
    text = render_summary(res)
    assert (
        "prompts     1 of 3 exactly the requested length (1 off by one, 1 off by more; worst +10 tokens)"
        in text
    )
    assert "short       1 of 4 answers stopped before max_tokens" in text
    assert "prompts " not in render_summary(hand_made())  # nothing requested: no line


def test_per_token_itl_row_only_where_a_chunk_carried_several_tokens() -> None:
    assert "ITL per token" not in render_summary(hand_made())  # one token per chunk
    res = hand_made()
    for r in res.records[:4]:  # the last chunk of each stream carried 3 tokens: 5 in all
        r.chunk_tokens, r.output_tokens = [1, 1, 3], 5
    text = render_summary(res)
    # per chunk: 8 gaps of 5 ms and 15 (one 25); per token: the second gaps split in three
    assert _row(text, "ITL (ms)")[0] == "8"
    per_token = _row(text, "ITL per token (ms)")
    assert per_token[0] == "16" and per_token[5] == "8.3"  # n, max: 25 ms / 3

"""A reasoning model's and an agent's metrics: TTFAT, reasoning duration, tokens by kind, in
the summary, the report and the SLO verdict (hand-computed values)."""

from __future__ import annotations

from loadlab._analysis import metrics
from loadlab._analysis.compare import compare
from loadlab._analysis.summary import summarize
from loadlab._report.text import render_summary
from loadlab._slo import evaluate, parse_slo
from loadlab.records import RequestRecord
from loadlab.results import Results, to_dataframe

MS = 1_000_000


def _reasoner(i: int) -> RequestRecord:
    """Sent at 0; 4 reasoning chunks at 10..40 ms, then 2 answer chunks at (50 + i), 60 + i."""
    r = RequestRecord(f"r{i}", sent_ns=0, end_ns=100 * MS, response_id=f"srv-{i}")
    r.chunk_ns = [10 * MS, 20 * MS, 30 * MS, 40 * MS, (50 + i) * MS, (60 + i) * MS]
    r.answer_ns = (50 + i) * MS
    r.reasoning_chunks, r.reasoning_start_ns, r.reasoning_end_ns = 4, 10 * MS, 40 * MS
    r.output_tokens, r.output_tokens_source, r.reasoning_tokens = 6, "usage", 4
    return r


def test_per_request_values() -> None:
    r = _reasoner(0)
    assert (metrics.ttft_ms(r), metrics.ttfat_ms(r), metrics.reasoning_ms(r)) == (10, 50, 30)
    assert metrics.reasoning_token_count(r) == 4 and metrics.answer_token_count(r) == 2
    plain = RequestRecord("p", sent_ns=0, chunk_ns=[5 * MS, 6 * MS], answer_ns=5 * MS)
    assert metrics.ttfat_ms(plain) == metrics.ttft_ms(plain) == 5
    assert metrics.reasoning_ms(plain) is None and metrics.reasoning_token_count(plain) == 0


def test_summary_report_and_slo_name_them() -> None:
    res = Results(records=[_reasoner(i) for i in range(11)], duration_ns=200 * MS)
    s = summarize(res)
    assert s.ttfat_ms.at(50) == 55 and s.reasoning_ms.at(99) == 30
    assert s.reasoning_tokens.at(50) == 4 and s.answer_tokens.at(50) == 2
    assert {"ttfat_ms", "reasoning_ms", "reasoning_tokens"} <= set(s.to_dict())
    text = render_summary(res)
    assert "TTFAT (first answer token) (ms)" in text and "reasoning p50 4" in text
    assert "slowest requests" in text and "r10" in text and "srv-10" in text
    df = to_dataframe(res)  # the CSV's columns
    assert list(df["ttfat_ms"])[:2] == [50.0, 51.0] and set(df["answer_tokens"]) == {2}
    spec = parse_slo({"objectives": ["ttfat_ms.p50 <= 100", "reasoning_tokens.p50 <= 3"]})
    rows = {r.objective.metric: r for r in evaluate(res, spec).rows}
    assert rows["ttfat_ms"].measured == 55 and rows["reasoning_tokens"].status == "fail"


def test_a_run_without_reasoning_writes_no_answer_metrics() -> None:
    r = RequestRecord("p", sent_ns=0, chunk_ns=[5 * MS, 6 * MS], answer_ns=5 * MS)
    s = summarize(Results(records=[r], duration_ns=10 * MS))
    assert "ttfat_ms" not in s.to_dict() and "reasoning_tokens" not in s.to_dict()
    assert "TTFAT" not in render_summary(Results(records=[r], duration_ns=10 * MS))


def test_compare_adds_ttfat_rows_when_every_run_reasons() -> None:
    runs = [Results(records=[_reasoner(i) for i in range(11)], duration_ns=200 * MS) for _ in "ab"]
    rows = {r.metric: r for r in compare(runs, ["a", "b"], n_boot=200).rows}
    assert rows["ttfat_ms.p50"].values == (55.0, 55.0)
    plain = Results(records=[RequestRecord("p", sent_ns=0, chunk_ns=[MS])], duration_ns=MS)
    assert "ttfat_ms.p50" not in {r.metric for r in compare([runs[0], plain], ["a", "p"]).rows}

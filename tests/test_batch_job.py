"""A batch job, as ``scenarios/batch.toml`` runs it (not streamed), against a real server on
loopback: the summary has the job section the docs promise (job completion time, documents/s,
tokens/s), TTFT, ITL and TPOT are left out instead of printed as 0.0, and an SLO on TPOT is
not evaluable (not valid evidence) instead of passing on that 0.0."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loadlab._analysis import metrics
from loadlab._analysis.batch_job import batch_classes, batch_jobs
from loadlab._report.html import render_html
from loadlab.cli import main
from loadlab.records import RequestRecord
from loadlab.results import read_results
from loadlab.selftest._fixed_server import FixedServerProcess

SCENARIO = """
concurrency = 4
requests = 12
stream = false
[workload]
kind = "batch"
documents = 12
prompt_tokens = 32
output_tokens = 8
"""


@pytest.fixture(scope="module")
def batch_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """``scenarios/batch.toml``'s shape, small, run once through the CLI: (results, stdout)."""
    import contextlib
    import io

    folder = tmp_path_factory.mktemp("batch")
    scenario = folder / "batch.toml"
    scenario.write_text(SCENARIO)
    out, text = folder / "b.json", io.StringIO()
    with FixedServerProcess(ttft_ms=20, itl_ms=10, tokens=8) as url:
        with contextlib.redirect_stdout(text):
            code = main(["run", "--endpoint", url, "--scenario", str(scenario), "--tokenizer",
                         "none", "--no-progress", "--out", str(out)])  # fmt: skip
    assert code == 0
    yield out, text.getvalue()


def test_a_non_streamed_answer_has_no_ttft_itl_or_tpot() -> None:
    whole = RequestRecord("a", sent_ns=0, chunk_ns=[90_000_000], output_tokens=8, streamed=False)
    assert metrics.e2e_ms(whole) == 90.0
    assert metrics.ttft_ms(whole) is None and metrics.tpot_ms(whole) is None
    assert metrics.itl_ms(whole) == [] and metrics.ttfat_ms(whole) is None
    assert RequestRecord.from_dict(whole.to_dict()).streamed is False
    assert "streamed" not in RequestRecord("b").to_dict()  # a streamed record's file: as before


def test_the_job_classes_of_a_batch_and_of_a_mix() -> None:
    assert batch_classes({"kind": "batch", "request_class": "docs"}) == ["docs"]
    mix = {"kind": "mix", "parts": [{"kind": "chat"}, {"kind": "batch", "request_class": "b"}]}
    assert batch_classes(mix) == ["b"] and batch_classes({"kind": "chat"}) == []


def test_a_batch_run_reports_its_job_and_leaves_stream_metrics_out(
    batch_run: tuple[Path, str],
) -> None:
    out, text = batch_run
    results = read_results(out)
    (job,) = batch_jobs(results)
    assert (job.request_class, job.documents, job.ok, job.failed) == ("batch", 12, 12, 0)
    sent = min(r.sent_ns for r in results.records if r.sent_ns is not None)
    last = max(r.chunk_ns[-1] for r in results.records)
    assert job.completion_s == pytest.approx((last - sent) / 1e9)
    assert job.documents_per_s == pytest.approx(12 / job.completion_s)
    assert job.output_tokens_per_s == pytest.approx(12 * 8 / job.completion_s)
    # 12 documents, 4 at a time, each about 90 ms: three rounds
    assert 0.2 < job.completion_s < 10
    assert "batch job   class batch: 12 documents (12 ok, 0 failed); job completion time" in text
    assert "documents/s" in text
    assert "TPOT (ms)" not in text and "TTFT (ms)" not in text and "ITL (ms)" not in text
    assert "not streamed: each answer came whole" in text
    summary = results.to_dict()["summary"]
    assert "tpot_ms" not in summary and summary["streamed"] is False
    page = render_html(results)
    assert "<h2>Batch job</h2>" in page and "job completion time" in page
    assert "<td>TPOT</td>" not in page


def test_an_slo_on_tpot_is_not_evaluable_on_a_run_that_did_not_stream(
    batch_run: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = batch_run
    tpot = tmp_path / "tpot.toml"
    tpot.write_text('objectives = ["tpot_ms.p90 <= 40"]\nmin_requests = 1\n')
    e2e = tmp_path / "e2e.toml"
    e2e.write_text('objectives = ["e2e_ms.p90 <= 60000"]\nmin_requests = 1\n')
    assert main(["slo", str(out), "--slo", str(tpot), "--inconclusive", "pass"]) == 2
    text = capsys.readouterr().out
    assert "tpot_ms cannot be judged: the requests were not streamed" in text
    assert "not measured: the requests were not streamed" in text
    assert main(["slo", str(out), "--slo", str(e2e), "--inconclusive", "pass"]) == 0

"""The column forms of the metrics (``loadlab._analysis.vectors``) give the per-request
functions' values bit for bit, over records of every shape: no chunk, one chunk, chunks of
several tokens with and without their counts, usage that disagrees, reasoning, tool calls,
failures, open and closed loop."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadlab._analysis import metrics, vectors
from loadlab._analysis.columns import RecordColumns, RecordView
from loadlab._analysis.summary import has_reasoning_or_tools
from loadlab._analysis.token_checks import prompt_match, short_outputs
from loadlab.records import RequestRecord
from tests.helpers.synth import MS, varied_records


@pytest.fixture(scope="module", params=[1, 2, 3])
def records(request: pytest.FixtureRequest) -> list[RequestRecord]:
    return varied_records(400, seed=request.param)


def _same(a: float | None, b: float) -> bool:
    return (a is None and math.isnan(b)) or a == b


def test_per_request_metrics_are_the_same(records: list[RequestRecord]) -> None:
    cols = RecordColumns.from_records(records)
    for name, fn in metrics.PER_REQUEST_METRICS.items():
        got = vectors.per_request(cols, name)
        bad = [(r.request_id, fn(r), g) for r, g in zip(records, got, strict=True)
               if not _same(fn(r), g)]  # fmt: skip
        assert not bad, (name, bad[:3])
    assert cols.output_tokens.tolist() == [metrics.output_token_count(r) for r in records]


def test_pooled_and_run_figures_are_the_same(records: list[RequestRecord]) -> None:
    cols = RecordColumns.from_records(records)
    window = (2_000 * MS, 25_000 * MS)
    lat = metrics.latency_records(records, window)
    mask = vectors.latency_mask(cols, window)
    assert [r.request_id for r in lat] == [cols.text["request_id"][i] for i in np.flatnonzero(mask)]
    assert vectors.itl_ms(cols, mask).tolist() == [g for r in lat for g in metrics.itl_ms(r)]
    assert vectors.itl_per_token_ms(cols, mask).tolist() == [
        g for r in lat for g in metrics.itl_per_token_ms(r)
    ]
    assert vectors.stall_counts(cols, mask).tolist() == [metrics.stall_count(r) for r in lat]
    assert vectors.count_outcomes(cols, 999) == metrics.count_outcomes(records, 999)
    assert vectors.throughput(cols, window) == metrics.throughput(records, window)
    assert vectors.prompt_match(cols) == prompt_match(records)
    assert vectors.short_outputs(cols, mask) == short_outputs(lat)
    assert vectors.has_reasoning_or_tools(cols) == has_reasoning_or_tools(records)
    limits = {None: {"ttft_ms": 3.0}, "batch": {"e2e_ms": 4.0, "tpot_ms": 0.5}}
    good = {r.request_id for cls in ("chat", "batch")
            for r in metrics.good_requests([r for r in records if r.request_class == cls],
                                           limits.get(cls, limits[None]))}  # fmt: skip
    got = vectors.good_mask(cols, limits)
    assert {cols.text["request_id"][i] for i in np.flatnonzero(got)} == good


def test_records_come_back_as_written(records: list[RequestRecord]) -> None:
    cols = RecordColumns.from_records(records)
    view = RecordView(cols)
    assert len(view) == len(records) and list(view) == records
    assert view[-1] == records[-1] and view[3:5] == records[3:5]
    again = RecordColumns.from_dicts([[r.to_dict() for r in records]])
    assert list(RecordView(again)) == records


def test_no_records() -> None:
    cols = RecordColumns.from_records([])
    assert cols.n == 0 and list(RecordView(cols)) == []
    assert vectors.throughput(cols, (0, 1)) == metrics.throughput([], (0, 1))
    assert vectors.count_outcomes(cols) == metrics.count_outcomes([])

"""Running the lab without a server: a mode the reference server lacks starts nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadlab._lab import experiments, settings_for
from loadlab._lab.batchjob import job_lengths
from loadlab._runner.run import Prepared


def test_unavailable_mode_starts_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(experiments, "available_modes", lambda: {"disaggregated": "not yet"})
    monkeypatch.setattr(experiments, "_batching", lambda *_: {"error": "skipped"})
    outcome = experiments.run_lab(
        settings_for("tiny"), ["disaggregated"], tmp_path, log=lambda _: None
    )
    assert outcome.results == {} and outcome.unavailable == {"disaggregated": "not yet"}


def test_rounds_rotate_and_the_batch_job_runs_in_its_modes() -> None:
    orders = experiments.round_orders(["static", "continuous", "chunked"], 3)
    assert orders == [
        ["static", "continuous", "chunked"],
        ["continuous", "chunked", "static"],
        ["chunked", "static", "continuous"],
    ]
    s = settings_for("cpu")
    assert experiments.experiments_of(s, "static")[0] == "batch"
    assert experiments.experiments_of(s, "chunked") == ["interference", "baseline"]


def test_batch_specs_ask_for_each_documents_own_length() -> None:
    s = settings_for("tiny")
    cfg = experiments.experiment_configs(s, "http://127.0.0.1:1", "batch")[0]
    specs = experiments.batch_specs(cfg, job_lengths(s), Prepared(cfg.endpoints[0], None))
    assert [sp.max_tokens for sp in specs] == job_lengths(s)
    assert all(sp.extra_body["min_tokens"] == sp.max_tokens for sp in specs)
    assert all(sp.intended_at_s == 0.0 for sp in specs)  # submitted at once

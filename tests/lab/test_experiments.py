"""Running the lab without a server: a mode the reference server lacks starts nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadlab.lab import experiments, settings_for


def test_unavailable_mode_starts_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(experiments, "available_modes", lambda: {"disaggregated": "not yet"})
    monkeypatch.setattr(experiments, "_batching", lambda s, out, log: {"error": "skipped"})
    outcome = experiments.run_lab(
        settings_for("tiny"), ["disaggregated"], tmp_path, log=lambda _: None
    )
    assert outcome.results == {} and outcome.unavailable == {"disaggregated": "not yet"}

"""A results file written before reads the same today.

``tests/data/results_v1_*.json`` were written by loadlab before the run summary became
dataclasses: ``run`` against the reference server (fake preset, with a /metrics scrape) and a
merged two-process run with failures and a saturated process (built from seeded synthetic
records). Their ``.report.txt`` is what ``loadlab report FILE --slo tests/data/slo_v1.toml``
printed then. Regenerate neither: they are the old format.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadlab.cli import main
from loadlab.results import Results

DATA = Path(__file__).resolve().parent / "data"
FILES = ("results_v1_run", "results_v1_merged")


@pytest.mark.parametrize("name", FILES)
def test_an_old_file_reports_as_it_did(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = DATA / f"{name}.json"
    expected = (DATA / f"{name}.report.txt").read_text(encoding="utf-8")
    code = main(["report", str(path), "--slo", str(DATA / "slo_v1.toml")])
    assert capsys.readouterr().out == expected
    assert code == 0


@pytest.mark.parametrize("name", FILES)
def test_an_old_file_writes_back_unchanged(name: str) -> None:
    """Reading and writing again gives the same document: the summary recomputed today
    (every figure, key and type) equals the one written then."""
    data = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    again = json.loads(json.dumps(Results.from_dict(data).to_dict()))
    assert again == data

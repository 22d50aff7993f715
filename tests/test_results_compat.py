"""A results file written before reads the same today.

``tests/data/results_v1_*.json`` were written by loadlab before the run summary became
dataclasses: ``run`` against the reference server (fake preset, with a /metrics scrape) and a
merged two-process run with failures and a saturated process (built from seeded synthetic
records). Their ``.report.txt`` is what ``loadlab report FILE --slo tests/data/slo_v1.toml``
printed then. Regenerate neither: they are the old format.

The results schema grows by adding keys, so a file written before reads back with the keys
added since (``ADDED_SUMMARY_KEYS``) and its report with the lines added since
(``ADDED_REPORT_LINES``); everything it had stays as it was.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadlab.cli import main
from loadlab.results import Results

DATA = Path(__file__).resolve().parent / "data"
FILES = ("results_v1_run", "results_v1_merged")
# Newer than these files: requested against server-counted prompt lengths, answers that stopped early, and
# the per-token view of ITL (its report row shows only where a chunk carried several tokens)
ADDED_SUMMARY_KEYS = {"prompt_tokens_match", "short_outputs", "itl_per_token_ms"}
ADDED_REPORT_LINES = {
    "results_v1_run": ["prompts     24 of 24 exactly the requested length"],
    "results_v1_merged": [
        "prompts     0 of 74 exactly the requested length "
        "(1 off by one, 73 off by more; worst +382 tokens)"
    ],
}


@pytest.mark.parametrize("name", FILES)
def test_an_old_file_reports_as_it_did(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = DATA / f"{name}.json"
    expected = (DATA / f"{name}.report.txt").read_text(encoding="utf-8")
    code = main(["report", str(path), "--slo", str(DATA / "slo_v1.toml")])
    parts = capsys.readouterr().out.split("\n\n")  # the report's parts
    added = ADDED_REPORT_LINES[name]
    assert [p for p in parts if p in added] == added
    assert "\n\n".join(p for p in parts if p not in added) == expected
    assert code == 0


@pytest.mark.parametrize("name", FILES)
def test_an_old_file_writes_back_unchanged(name: str) -> None:
    """Reading and writing again gives the same document: the summary recomputed today
    (every figure, key and type) equals the one written then."""
    data = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    again = json.loads(json.dumps(Results.from_dict(data).to_dict()))
    assert set(again["summary"]) - set(data["summary"]) == ADDED_SUMMARY_KEYS
    for key in ADDED_SUMMARY_KEYS:
        del again["summary"][key]
    assert again == data

"""``loadlab lab --quick`` end to end: real reference servers (tiny preset) in two modes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadlab.cli import main
from loadlab.lab import EXPERIMENTS
from loadlab.results import read_results

MODES = ("continuous", "chunked")


@pytest.fixture(scope="module")
def lab_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lab")
    code = main(["lab", "--quick", "--modes", ",".join(MODES), "--out", str(out)])
    assert code == 0
    return out


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_results_file_per_mode_and_experiment(lab_dir: Path) -> None:
    for mode in MODES:
        for exp in EXPERIMENTS:
            res = read_results(lab_dir / f"{mode}-{exp}.json")
            assert res.extra["lab"]["mode"] == mode
            assert res.records and all(r.ok for r in res.records), (mode, exp)
            assert res.extra["lab"]["server_info"]["mode"] == mode
            deltas = res.extra["lab"]["server_deltas"]
            assert (
                sum(v for k, v in deltas.items() if k.startswith("loadlab_server_tokens_total")) > 0
            )
        classes = {
            r.request_class for r in read_results(lab_dir / f"{mode}-interference.json").records
        }
        assert classes == {"chat", "long_prompt"}
    batching = json.loads((lab_dir / "batching.json").read_text())
    assert set(batching["decode_tokens_per_s"]) == {"1", "4", "16"}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_report_sections(lab_dir: Path) -> None:
    md = (lab_dir / "lab.md").read_text()
    for title in (
        "Batching",
        "Static against continuous",
        "Interference",
        "Baseline",
        "The long prompt's own TTFT",
        "What disaggregation costs",
        "Acceptance",
    ):
        assert f"## {title}" in md
    for mode in MODES:
        assert f"| {mode} |" in md
    html = (lab_dir / "lab.html").read_text()
    assert "<h2>Acceptance (issue 7)</h2>" in html
    summary = json.loads((lab_dir / "lab.json").read_text())
    chunked = summary["modes"]["chunked"]
    assert chunked["long"]["requests"] >= 1 and chunked["long"]["ttft_ms_p50"] > 0
    assert summary["modes"]["continuous"]["chat"]["itl_ms_p99"] > 0
    assert summary["acceptance"][0]["value"] is not None

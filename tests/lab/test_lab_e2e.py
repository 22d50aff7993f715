"""``loadlab lab --quick`` end to end: real reference servers (tiny preset), two rounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadlab.cli import main
from loadlab.results import read_results

MODES = ("static", "continuous", "chunked")


@pytest.fixture(scope="module")
def lab_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lab")
    code = main(["lab", "--quick", "--modes", ",".join(MODES), "--out", str(out)])
    assert code == 0
    return out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_results_file_per_mode_experiment_and_round(lab_dir: Path) -> None:
    for mode in MODES:
        exps = (
            ("batch", "interference", "baseline")
            if mode != "chunked"
            else ("interference", "baseline")
        )
        for exp in exps:
            for r in (1, 2):
                res = read_results(lab_dir / f"{mode}-{exp}-r{r}.json")
                lab = res.extra["lab"]
                assert (lab["mode"], lab["experiment"], lab["round"]) == (mode, exp, r)
                bad = [(x.request_id, x.outcome) for x in res.records if not x.ok]
                assert res.records and not bad, (mode, exp, r, bad)
                assert lab["server_info"]["mode"] == mode, (mode, exp, r, lab["server_info"])
                assert lab["machine"]["wall_s"] > 0 and "others_cores" in lab["machine"]
                deltas = lab["server_deltas"]
                made = sum(v for k, v in deltas.items() if "tokens_total" in k)
                assert made > 0, (mode, exp, r, deltas)
        classes = {
            r.request_class for r in read_results(lab_dir / f"{mode}-interference-r1.json").records
        }
        assert classes == {"chat", "long_prompt"}
    assert not (lab_dir / "chunked-batch-r1.json").exists()  # static and continuous only
    batching = json.loads((lab_dir / "batching.json").read_text())
    assert len(batching["rounds"]) == 2
    assert set(batching["rounds"][0]["decode_step_s"]) == {"1", "4", "16"}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_report_claims_and_machine(lab_dir: Path) -> None:
    md = (lab_dir / "lab.md").read_text()
    for title in (
        "The lesson's claims on this machine",
        "The machine during each measurement",
        "Batching",
        "Static against continuous",
        "Interference",
        "The long prompt's own TTFT",
        "What disaggregation costs",
    ):
        assert f"## {title}" in md
    for mode in MODES:
        assert f"| {mode} |" in md
    assert "Placement (CPUs each process may run on" in md
    html = (lab_dir / "lab.html").read_text()
    assert "<h2>The lesson&#39;s claims on this machine</h2>" in html
    summary = json.loads((lab_dir / "lab.json").read_text())
    chunked = summary["modes"]["chunked"]
    assert (
        chunked["long"]["requests"]["median"] >= 1 and chunked["long"]["ttft_ms_p50"]["median"] > 0
    )
    assert chunked["stalls"]["longest_stall_ms"]["n"] == 2
    assert len(summary["measurements"]) == 2 * (3 + 3 + 2)
    claims = {c["claim"]: c for c in summary["claims"]}
    # the batch job's useful rows are counts, not timings: shown even on a busy machine
    assert claims["static"]["status"] == "shown", claims["static"]
    assert claims["chunked"]["median"] is not None
    assert claims["disagg"]["status"] == "not measured"
    for c in claims.values():  # never a pass or a fail
        assert c["status"] in ("shown", "not shown on this machine", "not measured")

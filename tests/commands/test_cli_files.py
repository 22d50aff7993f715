"""Unreadable, mistyped or unwritable files are exit 2 with a line naming the file and the
field, for every command that reads or writes them: for ``loadlab slo`` an
exit 1 would read as FAIL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadlab import cli
from loadlab.records import RequestRecord
from loadlab.results import Results, write_results

SLO = 'objectives = ["ttft_ms.p90 <= 500"]\n'


@pytest.fixture
def good(tmp_path: Path) -> Path:
    rec = RequestRecord("r1", sent_ns=0, chunk_ns=[1_000_000, 2_000_000], end_ns=2_000_000)
    return write_results(Results(records=[rec], duration_ns=2_000_000), tmp_path / "good.json")


@pytest.fixture
def slo(tmp_path: Path) -> Path:
    p = tmp_path / "slo.toml"
    p.write_text(SLO)
    return p


def _broken(tmp_path: Path, good: Path, change: str) -> Path:
    data = json.loads(good.read_text())
    if change == "run-list":
        data["run"] = [1, 2]
    elif change == "window-string":
        data["run"]["window_ns"] = "0-5"
    elif change == "only-request-id":
        data["records"] = [{"request_id": "r9"}]
    elif change == "records-object":
        data["records"] = {"r1": {}}
    elif change == "chunk-strings":
        data["records"][0]["chunk_ns"] = ["1", "2"]
    p = tmp_path / f"{change}.json"
    p.write_text(json.dumps(data))
    return p


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ("run-list", "field 'run' must be an object"),
        ("window-string", "run.window_ns must be"),
        ("only-request-id", "record 'r9' has no outcome"),
        ("records-object", "field 'records' must be a list"),
        ("chunk-strings", "field 'chunk_ns' must be list[int]"),
    ],
)
@pytest.mark.parametrize("command", ["report", "slo", "compare"])
def test_a_mistyped_results_file_is_exit_2_naming_file_and_field(
    tmp_path: Path, good: Path, slo: Path, change: str, field: str, command: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    bad = _broken(tmp_path, good, change)
    argv = {
        "report": ["report", str(bad)],
        "slo": ["slo", str(bad), "--slo", str(slo)],
        "compare": ["compare", str(good), str(bad)],
    }[command]
    assert cli.main(argv) == 2
    out = capsys.readouterr()
    text = out.err + out.out
    assert str(bad) in text and field in text, text
    assert "Traceback" not in text


def test_non_utf8_results_and_slo_files_are_exit_2(
    tmp_path: Path, good: Path, slo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "latin1.json"
    bad.write_bytes(b'{"schema": "loadlab.results", "x": "\xe9"}')
    assert cli.main(["report", str(bad)]) == 2
    assert f"{bad}: not UTF-8" in capsys.readouterr().err
    assert cli.main(["slo", str(bad), "--slo", str(slo)]) == 2
    bad_slo = tmp_path / "latin1.toml"
    bad_slo.write_bytes(b"# caf\xe9\n" + SLO.encode())
    assert cli.main(["slo", str(good), "--slo", str(bad_slo)]) == 2
    assert f"{bad_slo}: not UTF-8" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        pytest.param(["report", "{good}", "--html", "{dir}"], "--html", id="report-html"),
        pytest.param(["report", "{good}", "--csv", "{dir}"], "--csv", id="report-csv"),
        pytest.param(["report", "{good}", "--csv", "/proc/loadlab-nope/x.csv"], "--csv",
                     id="report-csv-proc"),
        pytest.param(["slo", "{good}", "--slo", "{slo}", "--junit", "{dir}"], "--junit",
                     id="slo-junit"),
        pytest.param(["slo", "{good}", "--slo", "{slo}", "--markdown", "/proc/x.md"],
                     "--markdown", id="slo-markdown"),
        pytest.param(["compare", "{good}", "{good}", "--markdown", "{dir}"], "--markdown",
                     id="compare-markdown"),
        pytest.param(["compare", "{good}", "{good}", "--html", "/proc/nope/c.html"], "--html",
                     id="compare-html"),
        pytest.param(["sweep", "--endpoint", "http://127.0.0.1:9", "--slo", "{slo}",
                      "--concurrencies", "1", "--duration", "1", "--out-dir", "/proc/nope"],
                     "--out-dir", id="sweep-out-dir"),
        pytest.param(["lab", "--quick", "--out", "/proc/nope"], "--out", id="lab-out"),
        pytest.param(["selftest", "--out", "{dir}"], "--out", id="selftest-out"),
        pytest.param(["capacity", "--decode-tokens-per-s", "2000", "--completion-tokens", "250",
                      "--peak-rps", "4", "--json", "{dir}"], "--json", id="capacity-json"),
    ],
)  # fmt: skip
def test_every_command_checks_where_it_writes(
    tmp_path: Path, good: Path, slo: Path, argv: list[str], flag: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """An unwritable output (a folder, or a path under /proc) is exit 2 naming the flag; long
    commands (sweep, lab, selftest) check before their work."""
    d = tmp_path / "a-folder"
    d.mkdir()
    args = [a.format(good=good, slo=slo, dir=d) for a in argv]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert f"{flag} " in err and "Traceback" not in err, err
    assert "starting" not in err  # nothing was started before the check

"""Reading a results file: the piece-at-a-time reader gives what a whole parse gives, on any
layout, cut anywhere; and a file whose records cannot be true is refused, naming the record
(exit 2), before any figure is made of it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import loadlab.results as results_module
from loadlab._analysis.summary import summarize
from loadlab.cli import main
from loadlab.errors import ResultsError
from loadlab.records import RequestRecord
from loadlab.results import Results, read_results, write_results
from tests.helpers.synth import make_results, varied_records


def _varied_run(n: int = 300, seed: int = 4) -> Results:
    records = varied_records(n, seed=seed)
    end = max(t for r in records for t in (r.end_ns, *r.chunk_ns) if t is not None)
    return Results(records=records, duration_ns=end + 1, window_ns=(1_000_000, end // 2))


@pytest.mark.parametrize("piece", [1 << 23, 4096, 700])
@pytest.mark.parametrize("workers", [1, 2])
def test_reading_in_pieces_gives_the_whole_parse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, piece: int, workers: int
) -> None:
    """Cut every few records (700 bytes: about one), parsed here or in two processes."""
    monkeypatch.setattr(results_module, "_PIECE", piece)
    monkeypatch.setattr(results_module, "PARALLEL_BYTES", 0)
    run = _varied_run()
    run.records[3].server["kv_transfer_bytes"] = 4096
    path = write_results(run, tmp_path / "r.json")
    whole = Results.from_dict(json.loads(path.read_text()))
    read = read_results(path, workers=workers)
    assert list(read.records) == list(whole.records) == run.records
    assert summarize(read) == summarize(whole) == summarize(run)
    assert read.to_dict() == whole.to_dict()


def test_a_file_in_another_layout_reads_the_same(tmp_path: Path) -> None:
    """Pretty-printed, keys in another order, a record's server data holding what looks like
    the cut between two records: read whole, or cut only where records really meet."""
    run = _varied_run(60)
    run.records[5].server["echo"] = [{"x": 1}, {"request_id": "not a record"}]
    data = run.to_dict()
    compact = tmp_path / "compact.json"
    compact.write_text(json.dumps(data, separators=(",", ":")))
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(dict(reversed(data.items())), indent=2))
    for path in (compact, pretty):
        assert list(read_results(path).records) == run.records, path


def _file_with(tmp_path: Path, change: dict[str, object], name: str = "r.json") -> Path:
    run = make_results(50, seed=1, tokens=4)
    path = write_results(run, tmp_path / name)
    data = json.loads(path.read_text())
    data["records"][7].update(change)
    path.write_text(json.dumps(data, separators=(",", ":")))
    return path


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"chunk_ns": [10**17, 10**17 + 5]}, "lies outside its run"),
        ({"end_ns": 10**17}, "lies outside its run"),
        ({"outcome": "teleported"}, "unknown outcome 'teleported'"),
        ({"output_tokens": -5}, "output_tokens is -5; a count is never negative"),
        ({"chunk_tokens": [1, -2, 1, 1]}, "chunk_tokens holds -2"),
        ({"end_ns": 1}, "is before sent_ns"),
        ({"chunk_ns": [9 * 10**9, 8 * 10**9, 10**10, 10**10]}, "chunk_ns goes back in time"),
        ({"sent_ns": 10**30}, "sent_ns holds 1e+30, past any time or count"),
        ({"chunk_ns": [10**19, 10**19 + 1, 10**19 + 2, 10**19 + 3]}, "chunk_ns holds 1e+19"),
        ({"turn": True}, "field 'turn' must be int"),
    ],
)
def test_impossible_records_are_refused_naming_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, object], why: str
) -> None:
    """One chunk at 1e17 ns once made report, slo and compare bin a series up to it (past
    4 GB, for ever); an unknown outcome, a negative count or an end before the send were
    taken as they were."""
    path = _file_with(tmp_path, change)
    with pytest.raises(ResultsError, match="record 'r7'") as caught:
        read_results(path)
    assert why in str(caught.value)
    slo = tmp_path / "slo.toml"
    slo.write_text('objectives = ["ttft_ms.p50 <= 1000"]\n')
    good = write_results(make_results(50, seed=2, tokens=4), tmp_path / "good.json")
    start = time.monotonic()
    for argv in (["report", str(path)], ["slo", str(path), "--slo", str(slo)],
                 ["compare", str(good), str(path), "--bootstrap", "100"]):  # fmt: skip
        assert main(argv) == 2, argv
        captured = capsys.readouterr()
        assert "record 'r7'" in captured.out + captured.err
    assert time.monotonic() - start < 60  # refused, not binned


def test_a_window_outside_the_run_is_refused(tmp_path: Path) -> None:
    path = write_results(make_results(20, seed=1, tokens=4), tmp_path / "r.json")
    data = json.loads(path.read_text())
    data["run"]["window_ns"] = [0, 10**17]
    path.write_text(json.dumps(data))
    with pytest.raises(ResultsError, match=r"run\.window_ns .* is not a span inside the run"):
        read_results(path)


def test_records_of_a_file_are_read_only_views(tmp_path: Path) -> None:
    """A file's records come back one at a time from its columns; a list of them is a list."""
    run = make_results(30, seed=1, tokens=4)
    read = read_results(write_results(run, tmp_path / "r.json"))
    assert len(read.records) == 30 and read.records[-1] == run.records[-1]
    assert read.records[2:4] == run.records[2:4]
    assert isinstance(RequestRecord.from_dict(read.records[0].to_dict()), RequestRecord)

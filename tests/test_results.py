"""Reading a results file: the piece-at-a-time reader gives what a whole parse gives, on any
layout, cut anywhere; and a file whose records cannot be true is refused, naming the record
(exit 2), before any figure is made of it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

import loadlab.results as results_module
from loadlab._analysis import columns
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


def _every_field_set(i: int) -> RequestRecord:
    """A record whose every field holds something other than its default."""
    return RequestRecord(
        request_id=f"r{i}", outcome="stream_error", session_id=f"s{i}", turn=2, request_class="chat",
        worker=3, endpoint="vendorA", intended_ns=90, sent_ns=100, headers_ns=150,
        chunk_ns=[200, 260, 330], chunk_tokens=[1, 3, 2], end_ns=400, http_status=500,
        error='broke: "quoted" \\ \u00e9\u4e2d', prompt_tokens_requested=12, prompt_tokens=11,
        cached_prompt_tokens=4, shared_prefix_tokens=8, max_tokens=64, output_tokens=6,
        output_tokens_source="usage", output_tokens_chunks=3, output_tokens_disagree=True,
        finish_reason="length", late=True, response_id=f"chatcmpl-{i}", answer_ns=260,
        reasoning_chunks=1, reasoning_start_ns=200, reasoning_end_ns=200, reasoning_tokens=2,
        tool_call_chunks=1, tool_calls=1, inputs=2, images=1, image_pixels=4096,
        audio_clips=1, audio_ms=1500, streamed=False, host="node-b",
        server={"kv_transfer_bytes": 4096, "echo": [{"x": 1.5}, None, "\u00e9"], "ok": True},
    )  # fmt: skip


def _parts(raw: bytes) -> tuple[columns.Part, columns.Part]:
    """``raw``'s records decoded into their types, and read as JSON then checked."""
    typed = columns._typed_part(raw)
    assert typed is not None
    return typed, columns.Part(*columns._parse(*columns._cut(raw)))


def test_typed_and_json_reads_of_records_give_the_same_columns() -> None:
    """Every field at a value of its own (text, None-able numbers, server data, the answer's
    and reasoning's fields) and at its default: decoded straight into the record's types,
    the columns equal those of the JSON read, and the records come back as written."""
    records = [_every_field_set(i) if i % 3 else r for i, r in enumerate(varied_records(60))]
    assert {f for f in columns._FIELDS if getattr(records[1], f) == columns._DEFAULTS[f]} == set()
    raw = b",".join(json.dumps(r.to_dict(), separators=(",", ":")).encode() for r in records)
    typed, read = _parts(raw)
    assert typed.n == read.n == len(records)
    for name in ("ints", "codes", "text", "lists"):
        mine, theirs = getattr(typed, name), getattr(read, name)
        assert mine.keys() == theirs.keys(), name
        for f in mine:
            for a, b in zip(mine[f], theirs[f], strict=True):
                assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b, (name, f)
    assert typed.server == read.server and typed.server[1]["echo"] == [{"x": 1.5}, None, "é"]
    back = columns.RecordColumns.from_dicts([raw])
    assert list(columns.RecordView(back)) == records


@pytest.mark.parametrize(
    "change",
    [
        {"turn": True},  # a bool is not an int
        {"late": 1},  # nor an int a bool
        {"sent_ns": 1.0},
        {"shiny": 1},  # a field no record has
        {"sent_ns": 2**63},  # past int64
        {"sent_ns": 10**30},
        {"server": None},
        {"chunk_ns": [[1], [2]], "chunk_tokens": 7},  # as many brackets as lists, one nested
        {"chunk_ns": [1.5, 2]},
        {"chunk_ns": ["1", "2"]},
        {"chunk_ns": [2**63, 2**63 + 1]},
        {"chunk_tokens": None},
    ],
)
def test_what_the_typed_read_refuses_goes_the_way_of_json(change: dict[str, object]) -> None:
    """A record the typed decode refuses is left to the JSON read, which names it."""
    records = [r.to_dict() for r in varied_records(5)]
    records[2].update(change)
    raw = b",".join(json.dumps(r, separators=(",", ":")).encode() for r in records)
    assert columns._typed_part(raw) is None
    with pytest.raises((ValueError, columns.Unparsed)) as caught:
        columns.part_of(raw)
    said = str(caught.value)
    assert caught.type is columns.Unparsed or said.startswith(("record 'r2'", "unknown record"))


def test_a_negative_chunk_time_is_read_by_json_and_refused_by_the_check() -> None:
    """The typed read takes only digits in a chunk list; a minus sign goes the way of JSON,
    whose columns hold it, and the check of the whole names the record."""
    records = [r.to_dict() for r in varied_records(5)]
    records[2]["chunk_ns"] = [-1, *records[2]["chunk_ns"][1:]]
    raw = b",".join(json.dumps(r, separators=(",", ":")).encode() for r in records)
    assert columns._typed_part(raw) is None
    with pytest.raises(ValueError, match="record 'r2'"):
        columns.RecordColumns.from_dicts([raw], (0, 10**12))


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"turn": True}, "record 'r7': field 'turn' must be int, got True"),
        ({"late": 1}, "record 'r7': field 'late' must be bool, got 1"),
        ({"shiny": 1}, "unknown record fields ['shiny']"),
    ],
)
def test_a_bad_record_read_in_pieces_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: dict[str, object], why: str
) -> None:
    """A record of the wrong type among records read a piece at a time is named, with its
    field (not its neighbour's chunk lists, read apart from the rest)."""
    monkeypatch.setattr(results_module, "_PIECE", 4096)
    path = _file_with(tmp_path, change)
    with pytest.raises(ResultsError) as caught:
        read_results(path)
    assert f"bad record: {why}" in str(caught.value)


def test_a_file_is_written_a_batch_of_records_at_a_time_as_one_document(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records serialised in batches (7 here) between the sections before and after them:
    the document is the one ``to_dict`` gives, text outside ASCII and an integer past 64 bits
    (orjson refuses it; json writes it) included, and it reads back record for record."""
    monkeypatch.setattr(results_module, "_WRITE_BATCH", 7)
    run = _varied_run(50)
    run.records[3].error = "caf\u00e9 \u4e2d \x1b[2J"
    run.records[9].server["huge"] = 2**70
    run.extra["note"] = "\u00e9"
    path = write_results(run, tmp_path / "r.json")
    assert json.loads(path.read_text(encoding="utf-8")) == json.loads(json.dumps(run.to_dict()))
    back = read_results(path)
    assert list(back.records) == list(run.records)
    assert back.records[9].server["huge"] == 2**70


@pytest.mark.parametrize("where", ["record", "extra"])
def test_a_nan_is_refused_and_leaves_no_file(tmp_path: Path, where: str) -> None:
    """JSON holds no NaN: the write refuses it (orjson would write null) and leaves neither
    the file nor its temporary copy."""
    run = _varied_run(20)
    if where == "record":
        run.records[4].server["ratio"] = float("nan")
    else:
        run.extra["ratio"] = float("inf")
    with pytest.raises(ValueError, match="not JSON compliant"):
        write_results(run, tmp_path / "r.json")
    assert list(tmp_path.iterdir()) == []

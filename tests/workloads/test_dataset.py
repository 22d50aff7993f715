"""Real-text datasets: every format's shipped sample, turns, lengths, filters and cuts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from loadlab.config import RunConfig
from loadlab.workloads import build_requests, validate_workload
from loadlab.workloads._dataset import conversation
from loadlab.workloads._exact import tokenizer_sizing
from loadlab.workloads._params import PACKAGE_DATA, WorkloadError
from loadlab.workloads._tokenizers import load_tokenizer

SAMPLES = PACKAGE_DATA / "samples"
HF_FILES = ("hf.json", "hf.parquet", "hf.arrow")


def specs_of(path: Path | str, requests: int = 100, tokenizer: str = "none", **workload):
    """The dataset's requests, sized as a chat endpoint counts them under ``tokenizer``."""
    cfg = RunConfig(concurrency=1, requests=requests, max_tokens=77,
                    workload={"kind": "dataset", "path": str(path), **workload})  # fmt: skip
    stream = build_requests(cfg, tokenizer_sizing(tokenizer, "chat"))
    return list(stream), stream.extra()["dataset"]  # type: ignore[attr-defined]


def test_sharegpt_conversations_are_replayed_turn_by_turn() -> None:
    specs, stats = specs_of(SAMPLES / "sharegpt.json", tokenizer="byte")
    rows = json.loads((SAMPLES / "sharegpt.json").read_text())
    assert (stats["rows_read"], stats["conversations"], stats["bad_rows"]) == (7, 6, 1)
    assert len(specs) == stats["requests"] == 3 * 3 + 3  # three of six have two follow-ups
    first = [s for s in specs if s.session_id == "ds000000"]
    conv = rows[0]["conversations"]
    assert [s.turn for s in first] == [0, 1, 2]
    assert [s.prompt for s in first] == [conv[0]["value"], conv[2]["value"], conv[4]["value"]]
    # the answer lengths are the dataset's own answers, counted by the run's tokenizer (bytes)
    assert [s.max_tokens for s in first] == [len(conv[i]["value"].encode()) for i in (1, 3, 5)]
    assert first[0].intended_at_s is None and all(s.prompt_tokens is None for s in specs)
    # a system message goes before the first user message; a one-turn conversation: no session
    sys_row = next(s for s in specs if s.request_id == "ds-000001-0")
    system, question = rows[1]["conversations"][0]["value"], rows[1]["conversations"][1]["value"]
    assert sys_row.session_id is None and sys_row.prompt == f"{system}\n{question}"
    only_first, _ = specs_of(SAMPLES / "sharegpt.json", turns="first")
    assert len(only_first) == 6 and all(s.turn == 0 and s.session_id is None for s in only_first)


def test_custom_jsonl_prompt_messages_and_output_lengths() -> None:
    specs, stats = specs_of(SAMPLES / "custom.jsonl", tokenizer="byte", max_output_tokens=200)
    rows = [json.loads(x) for x in (SAMPLES / "custom.jsonl").read_text().splitlines()]
    assert (stats["conversations"], stats["bad_rows"], len(specs)) == (6, 1, 8)
    by_id = {s.request_id: s for s in specs}
    assert by_id["ds-000000-0"].max_tokens == rows[0]["output_tokens"]  # the row's length
    assert by_id["ds-000001-1"].max_tokens == 32  # the last turn of a messages row
    assert by_id["ds-000002-0"].max_tokens == 200  # its completion's length, capped
    assert by_id["ds-000005-0"].prompt == rows[5]["prompt"]


@pytest.mark.parametrize("name", HF_FILES)
def test_hf_formats_read_the_same_rows(name: str) -> None:
    if name != "hf.json":
        pytest.importorskip("pyarrow")
    specs, stats = specs_of(SAMPLES / name, output_tokens=12)
    reference, _ = specs_of(SAMPLES / "hf.json", output_tokens=12)
    assert specs == reference and len(specs) == 6 and stats["bad_rows"] == 0
    assert all(s.max_tokens == 12 for s in specs)


def test_a_save_to_disk_folder_is_read(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    folder = tmp_path / "ds"
    folder.mkdir()
    shutil.copy(SAMPLES / "hf.arrow", folder / "data-00000-of-00001.arrow")
    (folder / "dataset_info.json").write_text("{}")
    specs, stats = specs_of(folder)
    assert len(specs) == 6 and stats["format"] == "arrow"


def test_prompts_cut_to_exact_lengths_and_filtered_with_the_tokenizer(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    from tests.helpers.bpe import make_tokenizer_dir

    tok_dir = make_tokenizer_dir(tmp_path / "bpe")
    tok = load_tokenizer(str(tok_dir))
    originals = {s.request_id: s.prompt for s in specs_of(SAMPLES / "sharegpt.json")[0]}
    specs, stats = specs_of(SAMPLES / "sharegpt.json", tokenizer=str(tok_dir), prompt_tokens=20,
                            turns="first")  # fmt: skip
    assert stats["cut"] == len(specs) > 0
    for s in specs:  # exactly 20 as a chat server counts it, template included; real text
        assert tok.count_prompt(s.prompt, "chat") == 20 == s.prompt_tokens
        assert originals[s.request_id].startswith(s.prompt)
    long_only, stats = specs_of(SAMPLES / "sharegpt.json", tokenizer=str(tok_dir),
                                min_prompt_tokens=30, turns="first")  # fmt: skip
    counts = [len(tok.encode(p)) for p in originals.values()]
    assert stats["too_short"] == sum(
        1 for rid, c in zip(originals, counts, strict=True) if rid.endswith("-0") and c < 30
    )
    assert all(len(tok.encode(s.prompt)) >= 30 for s in long_only)


def test_without_a_tokenizer_prompts_are_cut_by_the_estimate() -> None:
    specs, stats = specs_of(SAMPLES / "hf.json", max_prompt_tokens=40)
    assert stats["cut"] == 6 and all(len(s.prompt) <= 40 for s in specs)


def test_rows_and_errors() -> None:
    assert conversation({"messages": [{"role": "user", "content": [{"type": "image"}]}]}) is None
    assert conversation({"prompt": "  "}) is None
    turns = conversation({"prompt": "q", "max_tokens": 9})
    assert turns is not None and turns[0].output_tokens == 9

    def check(**workload):
        validate_workload(RunConfig(concurrency=1, requests=1,
                                    workload={"kind": "dataset", **workload}))  # fmt: skip

    with pytest.raises(WorkloadError, match="needs path"):
        check()
    with pytest.raises(WorkloadError, match="cannot tell the format"):
        check(path=str(SAMPLES.parent / "LICENSES.md"))
    with pytest.raises(WorkloadError, match='"all" or "first"'):
        check(path=str(SAMPLES / "hf.json"), turns="some")


def test_a_bad_json_line_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"prompt": \n')
    with pytest.raises(WorkloadError, match=r"bad.jsonl:2: not a JSON line"):
        specs_of(bad)


def test_shuffle_and_repeat_are_seeded() -> None:
    a, _ = specs_of(SAMPLES / "hf.json", requests=15, shuffle=True, repeat=True)
    b, _ = specs_of(SAMPLES / "hf.json", requests=15, shuffle=True, repeat=True)
    plain, _ = specs_of(SAMPLES / "hf.json")
    assert a == b and len(a) == 15 and len({s.request_id for s in a}) == 15
    assert [s.prompt for s in a[:6]] != [s.prompt for s in plain]
    assert sorted(s.prompt for s in a[:6]) == sorted(s.prompt for s in plain)

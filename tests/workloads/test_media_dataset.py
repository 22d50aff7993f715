"""Datasets whose rows carry images or audio: files read and sent as data, URLs passed on,
HF image columns read from a saved dataset; bad media refused before the run (exit 2), a bad
row met during the run recorded as ``bad_input`` while the run goes on."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from loadlab.cli import main
from loadlab.clients._bodies import build_body
from loadlab.config import EndpointConfig, RunConfig
from loadlab.results import read_results
from loadlab.selftest._fixed_server import FixedServerProcess
from loadlab.workloads import build_requests, validate_workload
from loadlab.workloads._audio import wav_bytes
from loadlab.workloads._images import image_tokens
from loadlab.workloads._params import WorkloadError


def _picture(path: Path, w: int, h: int, fmt: str = "PNG") -> bytes:
    Image.new("RGB", (w, h), (w % 256, h % 256, 7)).save(path, fmt)
    return path.read_bytes()


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cfg(path: Path, api: str = "chat", **keys: object) -> RunConfig:
    return RunConfig(concurrency=1, requests=50, endpoints=(EndpointConfig("http://h", api=api),),
                     workload={"kind": "dataset", "path": str(path), **keys})  # fmt: skip


def test_jsonl_rows_send_files_as_data_and_urls_as_urls(tmp_path: Path) -> None:
    png = _picture(tmp_path / "a.png", 100, 50)
    _picture(tmp_path / "b.jpg", 30, 30, "JPEG")
    (tmp_path / "c.wav").write_bytes(wav_bytes(np.zeros(12000), 8000))
    path = _jsonl(tmp_path / "rows.jsonl", [
        {"prompt": "one", "image": "a.png"},
        {"prompt": "two", "images": ["b.jpg", "https://example.com/x.png"]},
        {"prompt": "three", "audio": "c.wav", "image": str(tmp_path / "a.png")},
        {"prompt": "four"},
    ])  # fmt: skip
    specs = list(build_requests(_cfg(path, max_prompt_tokens=2)))
    assert specs[0].images == ("data:image/png;base64," + base64.b64encode(png).decode(),)
    assert specs[0].image_sizes == ((100, 50),)
    assert specs[0].image_tokens == image_tokens(100, 50)
    assert specs[0].prompt_tokens == 2  # cut: text and image tokens both known
    assert specs[1].images[0].startswith("data:image/jpeg;base64,")
    assert specs[1].images[1] == "https://example.com/x.png"  # passed on, never fetched
    assert specs[1].image_sizes == () and specs[1].prompt_tokens is None  # tokens unknown
    assert specs[2].audio[0][0] == "wav" and specs[2].audio_s == (1.5,)
    assert specs[2].audio_tokens == 38 and len(specs[2].images) == 1
    assert not specs[3].images and not specs[3].audio
    body = build_body(specs[2], EndpointConfig("http://h", api="chat"), stream=False)
    kinds = [p["type"] for p in body["messages"][0]["content"]]
    assert kinds == ["image_url", "input_audio", "text"]


def _mp3(frames: int) -> bytes:
    """An MP3 file made by hand: an ID3v2 tag of 20 bytes, then MPEG-1 Layer III frames of
    128 kbit/s at 44.1 kHz (417 bytes each; the payload is silence to the frame walker)."""
    tag = b"ID3\x04\x00\x00" + bytes([0, 0, 0, 20]) + bytes(20)
    return tag + (b"\xff\xfb\x90\x00" + bytes(413)) * frames


def test_an_mp3_clip_goes_as_mp3_with_its_length_and_no_requested_prompt(tmp_path: Path) -> None:
    (tmp_path / "q.mp3").write_bytes(_mp3(38))
    path = _jsonl(tmp_path / "rows.jsonl", [{"prompt": "what is asked", "audio": "q.mp3"}])
    (spec,) = build_requests(_cfg(path, max_prompt_tokens=2))
    assert spec.audio[0][0] == "mp3" and base64.b64decode(spec.audio[0][1]) == _mp3(38)
    assert spec.audio_s == (38 * 1152 / 44100,)
    assert spec.prompt_tokens is None  # a server counts what it decodes: not known here


def _hf_saved(folder: Path, rows: list[dict]) -> Path:
    """A folder as HF ``Dataset.save_to_disk`` writes one with an ``Image`` column: an arrow
    IPC stream whose image column is a struct of the file's bytes and its path."""
    pa = pytest.importorskip("pyarrow")
    folder.mkdir()
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"prompt": [r["prompt"] for r in rows],
                      "picture": pa.array([r["picture"] for r in rows], type=image)})  # fmt: skip
    with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    return folder


def test_a_saved_hf_dataset_with_an_image_column(tmp_path: Path) -> None:
    png = _picture(tmp_path / "p.png", 64, 32)
    folder = _hf_saved(tmp_path / "saved", [
        {"prompt": "what is it", "picture": {"bytes": png, "path": "p.png"}},
        {"prompt": "and this", "picture": None},
    ])  # fmt: skip
    specs = list(build_requests(_cfg(folder, image_column="picture")))
    assert specs[0].image_sizes == ((64, 32),) and specs[0].images[0].startswith("data:image/png")
    assert specs[1].images == ()
    with pytest.raises(WorkloadError, match=r"image_column = 'image'.*has prompt, picture"):
        validate_workload(_cfg(folder, image_column="image"))


@pytest.mark.parametrize(
    ("row", "message"),
    [({"prompt": "x", "image": "missing.png"}, "image file '.*missing.png' cannot be read"),
     ({"prompt": "x", "image": "pic.bmp"}, "image 'pic.bmp' is BMP: servers take PNG, JPEG"),
     ({"prompt": "x", "image": "notes.txt"}, "'notes.txt' is not an image"),
     ({"prompt": "x", "audio": "notes.txt"}, "neither WAV nor MP3; convert"),
     ({"prompt": "x", "audio": "https://h/a.wav"}, "download it and give its path")],
)  # fmt: skip
def test_bad_media_in_the_first_row_exit_2_before_the_run(
    tmp_path: Path, row: dict, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _picture(tmp_path / "pic.bmp", 8, 8, "BMP")
    (tmp_path / "notes.txt").write_text("not media")
    path = _jsonl(tmp_path / "rows.jsonl", [row])
    scenario = tmp_path / "s.toml"
    scenario.write_text(f'[workload]\nkind = "dataset"\npath = "{path}"\n')
    code = main(["run", "--scenario", str(scenario), "--endpoint", "http://127.0.0.1:9",
                 "--requests", "1", "--concurrency", "1", "--no-progress",
                 "--out", str(tmp_path / "r.json")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "workload.path: the first row:" in err, err
    assert re.search(message, err), err
    assert not (tmp_path / "r.json").exists()


def test_media_the_api_cannot_carry_are_refused(tmp_path: Path) -> None:
    (tmp_path / "c.wav").write_bytes(wav_bytes(np.zeros(800), 8000))
    path = _jsonl(tmp_path / "rows.jsonl", [{"prompt": "x", "audio": "c.wav"}])
    with pytest.raises(WorkloadError, match="a dataset with audio needs api = 'chat'"):
        validate_workload(_cfg(path, api="anthropic"))
    _picture(tmp_path / "a.png", 8, 8)
    path = _jsonl(tmp_path / "img.jsonl", [{"prompt": "x", "image": "a.png"}])
    with pytest.raises(WorkloadError, match="a dataset with images needs api"):
        validate_workload(_cfg(path, api="completions"))
    path = _jsonl(tmp_path / "later.jsonl", [{"prompt": "x"}, {"prompt": "y", "audio": "c.wav"}])
    first, later = build_requests(_cfg(path, api="responses"))  # met during the run
    assert first.error is None and later.error is not None
    assert "later.jsonl row 2: a dataset with audio needs api = 'chat'" in later.error


@pytest.fixture(scope="module")
def fast_url() -> Iterator[str]:
    with FixedServerProcess(ttft_ms=2, itl_ms=1, tokens=2) as url:
        yield url


def test_a_bad_row_during_the_run_is_a_bad_input_failure(
    tmp_path: Path, fast_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _picture(tmp_path / "a.png", 16, 16)
    rows = [{"prompt": f"q{i}", "image": "a.png"} for i in range(4)]
    rows[2]["image"] = "gone.png"
    path = _jsonl(tmp_path / "rows.jsonl", rows)
    scenario = tmp_path / "s.toml"
    scenario.write_text(f'[workload]\nkind = "dataset"\npath = "{path}"\noutput_tokens = 2\n')
    out = tmp_path / "r.json"
    main(["run", "--scenario", str(scenario), "--endpoint", fast_url, "--concurrency", "1",
          "--requests", "10", "--no-progress", "--tokenizer", "none", "--out", str(out)])  # fmt: skip
    res = read_results(out)
    outcomes = [r.outcome for r in sorted(res.records, key=lambda r: r.request_id)]
    assert outcomes == ["ok", "ok", "bad_input", "ok"]
    bad = next(r for r in res.records if r.outcome == "bad_input")
    assert bad.error and "rows.jsonl row 3" in bad.error and "gone.png" in bad.error
    assert bad.sent_ns is None and bad.images is None  # nothing was sent
    assert res.extra["workload"]["dataset"]["bad_media"] == 1
    assert "1 rows with unreadable media (bad_input)" in capsys.readouterr().out
    assert all(r.images == 1 and r.image_pixels == 256 for r in res.records if r.ok)

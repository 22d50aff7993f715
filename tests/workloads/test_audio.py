"""Synthetic audio: WAV clips made by code, lengths drawn from distributions, sent as OpenAI
chat ``input_audio`` parts; every other dialect refused before the run."""

from __future__ import annotations

import base64
import io
import wave
from pathlib import Path

import numpy as np
import pytest

from loadlab.cli import main
from loadlab.clients._bodies import build_body
from loadlab.config import EndpointConfig, RunConfig
from loadlab.records import RequestRecord, RequestSpec
from loadlab.workloads import build_requests, validate_workload
from loadlab.workloads._audio import AudioMaker, audio_tokens
from loadlab.workloads._params import WorkloadError


def _wav(data: str) -> wave.Wave_read:
    return wave.open(io.BytesIO(base64.b64decode(data)))


def test_clips_are_wav_files_of_the_drawn_lengths() -> None:
    maker = AudioMaker.of({"count": 3, "seconds": 1.5, "sample_rate": 8000}, seed=1)
    clips, seconds, tokens = maker.draw(np.random.default_rng(0))
    assert seconds == (1.5,) * 3 and all(fmt == "wav" for fmt, _ in clips)
    for _, data in clips:
        with _wav(data) as w:
            assert (w.getnframes(), w.getframerate(), w.getnchannels()) == (12000, 8000, 1)
    assert len({data for _, data in clips}) == 3  # never two alike without repeat
    assert tokens == 3 * audio_tokens(12000, 8000) == 3 * 38


def test_repeat_draws_from_a_pool_and_lengths_vary() -> None:
    maker = AudioMaker.of({"count": 4, "seconds": 0.1, "repeat": 1.0, "pool": 1}, seed=1)
    clips, _, _ = maker.draw(np.random.default_rng(0))
    assert len(set(clips)) == 1
    drawn = AudioMaker.of({"seconds": {"dist": "uniform", "low": 0.1, "high": 3}}, seed=1)
    lengths = {drawn.draw(np.random.default_rng(i))[1][0] for i in range(5)}
    assert len(lengths) == 5 and all(0.1 <= s <= 3 for s in lengths)


@pytest.mark.parametrize(
    ("audio", "message"),
    [({"repeat": 2}, "share from 0 to 1"), ({"pool": 0}, ">= 1"),
     ({"sample_rate": 100}, ">= 1000"), ({"second": 1}, "did you mean 'seconds'"),
     (3, "give a table")],
)  # fmt: skip
def test_bad_audio_settings_are_refused_before_the_run(audio: object, message: str) -> None:
    cfg = RunConfig(concurrency=1, requests=1, workload={"kind": "synthetic", "audio": audio})
    with pytest.raises(WorkloadError, match=message):
        validate_workload(cfg)


@pytest.mark.parametrize("api", ["anthropic", "completions", "responses"])
def test_dialects_without_audio_are_refused_with_exit_2(
    api: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "a.toml"
    scenario.write_text('[workload]\nkind = "synthetic"\naudio = { seconds = 1 }\n')
    code = main(["run", "--scenario", str(scenario), "--endpoint", "http://127.0.0.1:9",
                 "--api", api, "--requests", "1", "--concurrency", "1", "--no-progress",
                 "--out", str(tmp_path / "r.json")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and not (tmp_path / "r.json").exists()
    assert "workload.audio needs api = 'chat'" in err and f"({api}) cannot carry audio" in err
    assert "use --api chat" in err


def test_specs_records_and_the_chat_body_carry_the_clips() -> None:
    cfg = RunConfig(concurrency=1, requests=2, prompt_tokens=10,
                    workload={"kind": "synthetic",
                              "audio": {"count": 2, "seconds": 0.5, "tokens_per_s": 10}})  # fmt: skip
    specs = list(build_requests(cfg))
    assert all(len(s.audio) == 2 and s.audio_tokens == 2 * 5 for s in specs)
    rec = RequestRecord.for_spec(specs[0])
    assert rec.audio_clips == 2 and rec.audio_ms == 1000 and rec.images is None
    assert rec.prompt_tokens_requested == specs[0].prompt_tokens + 10
    body = build_body(specs[0], EndpointConfig("http://h", api="chat"), stream=False)
    fmt, data = specs[0].audio[0]
    assert body["messages"][0]["content"][0] == {
        "type": "input_audio", "input_audio": {"data": data, "format": fmt}}  # fmt: skip
    assert body["messages"][0]["content"][-1]["type"] == "text"


def test_records_without_audio_write_and_read_as_before() -> None:
    plain = RequestRecord.for_spec(RequestSpec("r", "hi", 4)).to_dict()
    assert "audio_clips" not in plain and "audio_ms" not in plain
    assert RequestRecord.from_dict(plain).audio_ms is None
    spec = RequestSpec("r", "hi", 4, audio=(("wav", "AAAA"),), audio_s=(0.25,), audio_tokens=7)
    back = RequestRecord.from_dict(RequestRecord.for_spec(spec).to_dict())
    assert (back.audio_clips, back.audio_ms) == (1, 250)
    with pytest.raises(ValueError, match="'audio_ms' must be int"):
        RequestRecord.from_dict({**plain, "audio_ms": 0.5})

"""Audio on the reference server: clips counted as tokens by duration, prefilled like text,
cached by content; unreadable clips are 400; a loadlab run expects exactly its count."""

from __future__ import annotations

import base64
import json
import urllib.error
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loadlab.cli import main
from loadlab.clients._counting import post_json
from loadlab.records import RequestRecord
from loadlab.results import read_results
from loadlab.workloads._audio import wav_bytes
from reference_server.audio import audio_tokens
from tests.helpers.server import AUTH

HEADERS = {"Content-Type": "application/json", **AUTH}


def _wav(frames: int, rate: int = 16000, shade: float = 0.1) -> str:
    tone = shade * np.sin(np.arange(frames) * 0.05)
    return base64.b64encode(wav_bytes(tone, rate)).decode()


def _chat(server: Any, clips: list[str], text: str = "hi", fmt: str = "wav") -> dict[str, Any]:
    parts = [{"type": "input_audio", "input_audio": {"data": c, "format": fmt}} for c in clips]
    body = {
        "model": "loadlab-ref",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}],
    }
    return post_json(server.url + "/v1/chat/completions", body, HEADERS)


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize(("frames", "rate"), [(16000, 16000), (8001, 8000), (4410, 44100)])
def test_usage_counts_every_audio_token(
    reasoning_server: Any, n: int, frames: int, rate: int
) -> None:
    clips = [_wav(frames, rate, shade=0.01 * (i + n)) for i in range(n)]
    out = _chat(reasoning_server, clips)
    assert out["usage"]["prompt_tokens"] == len("hi") + n * audio_tokens(frames, rate)
    assert audio_tokens(frames, rate) == {16000: 25, 8000: 26, 44100: 3}[rate]


def test_bodies_of_a_few_megabytes_of_audio_are_served(reasoning_server: Any) -> None:
    """Bodies over a megabyte are served: two 10 s clips at 44.1 kHz are 2.4 MB of base64
    (scenarios/audio.toml sends up to two 20 s clips at 16 kHz, 1.7 MB)."""
    clips = [_wav(10 * 44100, 44100, shade=0.01 * (i + 1)) for i in range(2)]
    assert sum(map(len, clips)) > 2 << 20
    out = _chat(reasoning_server, clips)
    assert out["usage"]["prompt_tokens"] == len("hi") + 2 * audio_tokens(10 * 44100, 44100)


def test_a_repeated_clip_is_a_prefix_cache_hit(reasoning_server: Any) -> None:
    clip = _wav(16000, shade=0.33)  # 25 audio tokens: one whole block of 16
    first = _chat(reasoning_server, [clip], "first question")
    second = _chat(reasoning_server, [clip], "another one")
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16


@pytest.mark.parametrize(
    ("data", "fmt", "message"),
    [("!!!!", "wav", "not valid base64"),
     (base64.b64encode(b"RIFF not a wav").decode(), "wav", "could not be decoded"),
     (base64.b64encode(b"ID3 an mp3").decode(), "mp3", "WAV only")],
)  # fmt: skip
def test_unreadable_clips_are_400(reasoning_server: Any, data: str, fmt: str, message: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as err:
        _chat(reasoning_server, [data], fmt=fmt)
    assert err.value.code == 400 and message in err.value.read().decode()


def _run(server: Any, folder: Path, scenario: str, requests: int) -> list[RequestRecord]:
    """``loadlab run`` of ``scenario`` with the run's byte tokenizer (the server's): every
    request ok, and the prompt it asked for is the prompt the server counted."""
    (folder / "s.toml").write_text(f"requests = {requests}\nmax_tokens = 2\n{scenario}")
    out = folder / "r.json"
    code = main(["run", "--scenario", str(folder / "s.toml"), "--endpoint", server.url,
                 "--api-key-env", "LOADLAB_TEST_KEY", "--tokenizer", "byte", "--no-progress",
                 "--out", str(out)])  # fmt: skip
    assert code == 0
    recs = read_results(out).records
    assert len(recs) == requests and all(r.ok for r in recs)
    assert all(r.prompt_tokens == r.prompt_tokens_requested for r in recs)
    return recs


def test_a_run_with_audio_expects_exactly_the_servers_count(
    reasoning_server: Any, tmp_path: Path
) -> None:
    recs = _run(reasoning_server, tmp_path, (
        'concurrency = 2\nprompt_tokens = 24\n[workload]\nkind = "synthetic"\n[workload.audio]\n'
        'count = { dist = "uniform", low = 1, high = 3 }\n'
        'seconds = { dist = "uniform", low = 0.2, high = 2.5 }\nsample_rate = 8000\n'
    ), 6)  # fmt: skip
    assert all(r.audio_clips and 1 <= r.audio_clips <= 3 for r in recs)
    assert all(
        r.audio_ms and 200 * r.audio_clips <= r.audio_ms <= 2500 * r.audio_clips for r in recs
    )
    assert len({r.prompt_tokens for r in recs}) > 1  # the clips' lengths were drawn


def test_a_dataset_run_with_images_and_audio_expects_exactly_the_servers_count(
    reasoning_server: Any, tmp_path: Path
) -> None:
    from PIL import Image

    Image.new("RGB", (56, 112), (1, 2, 3)).save(tmp_path / "a.png")  # 2 x 4 patches: 8 tokens
    (tmp_path / "a.wav").write_bytes(wav_bytes(np.zeros(8000), 8000))  # 1 s: 25 tokens
    text = "describe what you see and hear in as many words as you can, " * 4
    rows = [{"prompt": f"{i} {text}", "image": "a.png", "audio": "a.wav"} for i in range(3)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recs = _run(reasoning_server, tmp_path, (
        'concurrency = 1\n[workload]\nkind = "dataset"\npath = "rows.jsonl"\n'
        'max_prompt_tokens = 40\noutput_tokens = 2\n'
    ), 3)  # fmt: skip
    assert all(r.prompt_tokens == 40 + 8 + 25 for r in recs)
    assert all((r.images, r.image_pixels, r.audio_clips, r.audio_ms) == (1, 56 * 112, 1, 1000)
               for r in recs)  # fmt: skip

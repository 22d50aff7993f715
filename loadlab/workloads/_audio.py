"""Audio in prompts: synthetic clips made here (WAV), their lengths drawn from distributions.

``[workload.audio]`` (kind = "synthetic")::

    count        clips per request: a number or a distribution (default 1)
    seconds      each clip's length: a number or a distribution (default 5)
    sample_rate  Hz, mono 16-bit PCM (default 16000)
    repeat       share of clips drawn from a pool of ``pool`` clips (a server's cache may hit
                 them); the rest are new every time (default 0)
    pool         distinct clips in that pool (default 4)
    tokens_per_s how the target counts a clip's tokens (``audio_tokens``): the reference
                 server's 25 per second by default (a Whisper-style encoder's 50 frames per
                 second pooled by two); set it to your model's

Clips travel as OpenAI chat ``input_audio`` parts (``{"data": base64, "format": "wav"}``), the
only dialect that carries audio; an endpoint of another API is refused before the run. Each
clip is a stretch, from a seeded offset, of a minute of sound made once (two tones with
vibratos and noise: a sound, not silence), made unique by its first samples. New clips are
made and encoded by a thread ahead of the requests that take them (a 60 s clip takes about
10 ms), as images are. A request's ``prompt_tokens`` counts its text and its clips' tokens; records keep
``audio_clips`` and ``audio_ms``.

Example::

    maker = AudioMaker.of({"count": 2, "seconds": {"dist": "uniform", "low": 1, "high": 30}})
    clips, seconds = maker.draw(rng)
"""

from __future__ import annotations

import base64
import functools
import io
import math
import queue
import wave
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loadlab.workloads._images import draw_items, made_ahead
from loadlab.workloads._lengths import Dist, parse_dist
from loadlab.workloads._params import WorkloadError, check_keys, get_float, get_int

__all__ = [
    "AUDIO_KEYS",
    "AudioMaker",
    "audio_tokens",
    "check_audio_apis",
    "mp3_seconds",
    "wav_bytes",
    "wav_frames",
]

AUDIO_KEYS = {"count", "seconds", "sample_rate", "repeat", "pool", "tokens_per_s"}
TOKENS_PER_S = 25  # the reference server's rate
MAX_SECONDS = 600.0
Clip = tuple[str, str]  # (format, base64 data): an ``input_audio`` part's two fields


def check_audio_apis(cfg: Any, key: str = "workload.audio") -> None:
    """Audio travels in OpenAI chat messages only (``input_audio``): Anthropic's Messages,
    Responses and completions have no audio input."""
    wrong = [f"{ep.name} ({ep.api})" for ep in cfg.endpoints if ep.api != "chat"]
    if wrong:
        raise WorkloadError(
            f"{key} needs api = 'chat' on every endpoint (audio goes as OpenAI chat input_audio "
            f"parts); {', '.join(wrong)} cannot carry audio: use --api chat, or remove {key}"
        )


def audio_tokens(frames: int, sample_rate: int, tokens_per_s: int = TOKENS_PER_S) -> int:
    """Tokens of one clip: ``ceil(seconds x tokens_per_s)``, computed on whole frames so the
    client and the server agree exactly.

    >>> audio_tokens(16000, 16000), audio_tokens(16001, 16000), audio_tokens(8000, 16000, 3)
    (25, 26, 2)
    """
    return -(-frames * tokens_per_s // sample_rate)


def wav_bytes(samples: np.ndarray, sample_rate: int) -> bytes:
    """A mono 16-bit PCM WAV file of ``samples`` (floats in [-1, 1])."""
    return _pcm_wav((np.clip(samples, -1.0, 1.0) * 32767).astype("<i2"), sample_rate)


def wav_frames(raw: bytes) -> tuple[int, int]:
    """A WAV file's (frames, sample rate); ``ValueError`` when it is not one."""
    try:
        with wave.open(io.BytesIO(raw)) as w:
            return w.getnframes(), w.getframerate()
    except (wave.Error, EOFError) as exc:
        raise ValueError(f"not a PCM WAV file ({exc})") from None


# MPEG audio Layer III (ISO 11172-3, 13818-3): kbit/s by bitrate index and Hz by sample-rate
# index, for MPEG-1 and for MPEG-2 / 2.5 (whose sample rates are MPEG-1's / 2 and / 4)
_KBPS = {1: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
         2: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)}  # fmt: skip
_HZ = (44100, 48000, 32000)


def mp3_seconds(raw: bytes) -> float:
    """An MP3 file's length from its frame headers (no decoding): frames x samples per frame
    / sample rate, after an ID3v2 tag; ``ValueError`` when no Layer III frame starts it."""
    at = 0
    if raw[:3] == b"ID3" and len(raw) >= 10:  # the tag's size: four 7-bit bytes, then a footer
        at = 10 + int.from_bytes(bytes(b & 0x7F for b in raw[6:10])) + (10 if raw[5] & 0x10 else 0)
    samples, rate = 0, 0
    while at + 4 <= len(raw):
        b1, b2 = raw[at + 1], raw[at + 2]
        version, layer, kbps_i, hz_i = (b1 >> 3) & 3, (b1 >> 1) & 3, b2 >> 4, (b2 >> 2) & 3
        if raw[at] != 0xFF or b1 & 0xE0 != 0xE0 or version == 1 or layer != 1:
            break
        if kbps_i in (0, 15) or hz_i == 3:
            break
        mpeg1 = version == 3
        rate = _HZ[hz_i] // (1 if mpeg1 else 2 if version == 2 else 4)
        per_frame = 1152 if mpeg1 else 576
        samples += per_frame
        at += per_frame // 8 * _KBPS[1 if mpeg1 else 2][kbps_i] * 1000 // rate + (b2 >> 1 & 1)
    if not samples:
        raise ValueError("no MPEG Layer III frame found")
    return samples / rate


@dataclass
class AudioMaker:
    count: Dist
    seconds: Dist
    sample_rate: int = 16000
    repeat: float = 0.0
    pool_size: int = 4
    tokens_per_s: int = TOKENS_PER_S
    seed: int = 0
    _pool: list[tuple[Clip, int]] = field(default_factory=list)
    _queue: queue.Queue[tuple[Clip, int]] | None = None

    @classmethod
    def of(cls, params: Any, seed: int = 0, bases: Sequence[Path] = ()) -> AudioMaker:
        if not isinstance(params, Mapping):
            raise WorkloadError(
                "workload.audio: give a table, e.g. audio = {count = 1, seconds = 5}"
            )
        check_keys("audio", params, AUDIO_KEYS, "workload.audio.")
        b, prefix = tuple(bases), "workload.audio."
        repeat = get_float(params, "repeat", 0.0, positive=False, prefix=prefix)
        if repeat > 1:
            raise WorkloadError(f"workload.audio.repeat = {repeat:g}: a share from 0 to 1")
        return cls(
            count=parse_dist(params.get("count", 1), "audio.count", bases=b),
            seconds=parse_dist(params.get("seconds", 5), "audio.seconds", integer=False, bases=b),
            sample_rate=get_int(params, "sample_rate", 16000, minimum=1000, prefix=prefix),
            repeat=repeat,
            pool_size=get_int(params, "pool", 4, prefix=prefix),
            tokens_per_s=get_int(params, "tokens_per_s", TOKENS_PER_S, prefix=prefix),
            seed=seed,
        )

    def draw(self, rng: np.random.Generator) -> tuple[tuple[Clip, ...], tuple[float, ...], int]:
        """One request's clips, each one's length in seconds, and their tokens in all."""
        drawn = draw_items(rng, self.count, self.repeat, self.pool_size, self._pooled, self._ahead)
        rate = self.sample_rate
        tokens = sum(audio_tokens(frames, rate, self.tokens_per_s) for _, frames in drawn)
        return tuple(c for c, _ in drawn), tuple(f / rate for _, f in drawn), tokens

    def _ahead(self) -> queue.Queue[tuple[Clip, int]]:
        if self._queue is None:
            rng = np.random.default_rng([self.seed, 80])
            self._queue = made_ahead(lambda tag: self._new(rng, tag), "audio")
        return self._queue

    def _pooled(self, i: int) -> tuple[Clip, int]:
        while len(self._pool) <= i:
            k = len(self._pool)
            self._pool.append(self._new(np.random.default_rng([self.seed, 79, k]), 1 << 23 | k))
        return self._pool[i]

    def _new(self, rng: np.random.Generator, tag: int) -> tuple[Clip, int]:
        s = min(MAX_SECONDS, float(self.seconds.sample(rng, 1)[0]))
        frames = max(1, round(s * self.sample_rate))
        raw = _pcm_wav(_clip_pcm(frames, self.sample_rate, rng, tag), self.sample_rate)
        return ("wav", base64.b64encode(raw).decode()), frames


@functools.lru_cache(maxsize=4)
def _sound(rate: int) -> np.ndarray:
    """A minute of sound at ``rate`` made once: two tones with slow vibratos and noise, as
    16-bit PCM (a clip is a stretch of it: making each anew took 47 ms for 20 s)."""
    rng = np.random.default_rng(rate)
    t = np.arange(60 * rate, dtype=np.float64) / rate
    out = rng.normal(0, 0.05, t.size)
    for f0, wobble in ((220.0, 0.7), (540.0, 3.1)):
        out += 0.3 * np.sin(2 * math.pi * f0 * t + 3 * np.sin(2 * math.pi * wobble * t))
    return (np.clip(out, -1, 1) * 32767).astype("<i2")


def _clip_pcm(frames: int, rate: int, rng: np.random.Generator, tag: int) -> np.ndarray:
    """``frames`` samples of the sound from a seeded offset (wrapping round); ``tag`` in the
    first samples makes every clip unique."""
    base = _sound(rate)
    start = int(rng.integers(base.size))
    if start + frames <= base.size:
        pcm = base[start : start + frames].copy()
    else:
        pcm = np.tile(base, -(-(start + frames) // base.size))[start : start + frames]
    k = min(3, frames)
    pcm[:k] = [(tag >> (8 * i)) & 255 for i in range(k)]
    return pcm


def _pcm_wav(pcm: np.ndarray, rate: int) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()

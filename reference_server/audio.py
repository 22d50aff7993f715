"""Audio in prompts: each clip becomes audio tokens by its duration, prefilled like text.

An OpenAI chat ``input_audio`` part (``{"data": base64, "format": "wav"}``) is decoded as a PCM
WAV file and counted at ``TOKENS_PER_S`` tokens per second, rounded up on whole frames:
``ceil(frames x TOKENS_PER_S / sample_rate)`` (``audio_tokens``). 25 per second is a
Whisper-style encoder's 50 frames per second pooled by two. The tokens take the clip's place
in the prompt as characters drawn from a hash of its bytes, so the model prefills them like
any text (a clip's cost shows in TTFT and in the step log), the same clip gives the same
tokens (a prefix-cache hit), and ``usage.prompt_tokens`` counts them.

What this does not model: an audio encoder; the prefill cost per audio token is that of a text
token. MP3 is not decoded here: a clip must be WAV.

>>> audio_tokens(16000, 16000), audio_tokens(16001, 16000), audio_tokens(1, 8000)
(25, 26, 1)
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import wave
from collections.abc import Mapping
from typing import Any

__all__ = ["TOKENS_PER_S", "AudioError", "audio_part_text", "audio_tokens"]

TOKENS_PER_S = 25


class AudioError(ValueError):
    """A clip the server cannot read; the API answers 400 with this message."""


def audio_tokens(frames: int, sample_rate: int) -> int:
    return -(-frames * TOKENS_PER_S // sample_rate)


def _wav(part: Mapping[str, Any]) -> bytes:
    audio = part.get("input_audio")
    if not isinstance(audio, Mapping) or not isinstance(audio.get("data"), str):
        raise AudioError("an input_audio part needs input_audio = {data: base64, format: 'wav'}")
    if audio.get("format") != "wav":
        raise AudioError(
            f"input_audio format {str(audio.get('format'))[:16]!r}: the reference server reads "
            "WAV only; send format 'wav'"
        )
    try:
        return base64.b64decode(audio["data"], validate=True)
    except (binascii.Error, ValueError):
        raise AudioError("input_audio data is not valid base64") from None


def audio_part_text(part: Mapping[str, Any]) -> str | None:
    """The audio tokens of one content part as prompt text, or None for a part that is not
    audio. Raises ``AudioError`` for a clip that cannot be read."""
    if part.get("type") != "input_audio":
        return None
    raw = _wav(part)
    try:
        with wave.open(io.BytesIO(raw)) as w:
            n = audio_tokens(w.getnframes(), w.getframerate())
    except (wave.Error, EOFError, ZeroDivisionError) as exc:
        raise AudioError(
            f"input_audio could not be decoded as WAV ({type(exc).__name__})"
        ) from None
    key = hashlib.sha256(raw).digest()
    stream = b"".join(hashlib.sha256(key + b"a%d" % i).digest() for i in range(n // 32 + 1))
    return "".join(chr(0x21 + b % 94) for b in stream[:n])  # printable ASCII: one byte, one token

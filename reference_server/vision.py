"""Images in prompts: each image becomes image tokens, prefilled like text.

An image part (OpenAI chat ``image_url``, Anthropic ``image``, Responses ``input_image``) must
carry its pixels (a ``data:`` URL or base64 source; the server fetches nothing). It is decoded,
scaled (never up) to fit ``MAX_SIDE`` x ``MAX_SIDE`` and cut into ``PATCH`` x ``PATCH`` tiles,
partial tiles counted: one image token per tile (``image_tokens``). The tokens take the image's
place in the prompt as characters drawn from a hash of its bytes, so the model prefills them
like any text (an image's cost shows in TTFT and in the step log), the same image gives the
same tokens (a prefix-cache hit), and ``usage.prompt_tokens`` counts them.

What this does not model: the token vectors come from the model's token embeddings, not from a
vision encoder's patch embeddings; the prefill cost per image token is that of a text token.

>>> image_tokens(448, 448), image_tokens(1024, 512), image_tokens(10, 10)
(256, 128, 1)
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import math
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_SIDE", "PATCH", "ImageError", "image_part_text", "image_tokens"]

PATCH = 28
MAX_SIDE = 448
_KEPT = 256  # decoded images remembered by content hash (a repeated image is not decoded again)
_seen: OrderedDict[bytes, str] = OrderedDict()


class ImageError(ValueError):
    """An image the server cannot read; the API answers 400 with this message."""


def image_tokens(width: int, height: int) -> int:
    scale = min(1.0, MAX_SIDE / max(width, height))
    w, h = max(1, round(width * scale)), max(1, round(height * scale))
    return math.ceil(w / PATCH) * math.ceil(h / PATCH)


def _bytes_of(part: Mapping[str, Any]) -> bytes:
    src = part.get("image_url", part.get("source"))
    url = src.get("url") if isinstance(src, Mapping) else src
    if isinstance(src, Mapping) and src.get("type") == "base64":
        data = src.get("data")
        url = f"data:;base64,{data}" if isinstance(data, str) else None
    if not isinstance(url, str) or not url:
        raise ImageError("an image part has no url or source")
    if not url.startswith("data:"):
        raise ImageError(
            "the reference server fetches no image URLs; send the image as a data: URL"
        )
    head, _, payload = url.partition(",")
    if ";base64" not in head:
        raise ImageError("an image data: URL must be base64")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("an image data: URL is not valid base64") from None


def image_part_text(part: Mapping[str, Any]) -> str | None:
    """The image tokens of one content part as prompt text, or None for a part that is not
    an image. Raises ``ImageError`` for an image that cannot be read."""
    if part.get("type") not in ("image_url", "image", "input_image"):
        return None
    raw = _bytes_of(part)
    key = hashlib.sha256(raw).digest()
    if key in _seen:
        _seen.move_to_end(key)
        return _seen[key]
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(raw)) as img:
            width, height = img.size
            img.verify()
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise ImageError(f"an image could not be decoded ({type(exc).__name__})") from None
    n = image_tokens(width, height)
    stream = b"".join(
        hashlib.sha256(key + i.to_bytes(4, "little")).digest() for i in range(n // 32 + 1)
    )
    text = "".join(chr(0x21 + b % 94) for b in stream[:n])  # printable ASCII: one byte, one token
    _seen[key] = text
    if len(_seen) > _KEPT:
        _seen.popitem(last=False)
    return text

"""Images in prompts: each image is decoded, resized by a stated policy, cut into patches, and
its image tokens are spliced into the prompt and prefilled like text.

An image part (OpenAI chat ``image_url``, Anthropic ``image``, Responses ``input_image``) must
carry its pixels (a ``data:`` URL or base64 source; the server fetches nothing) and hold at
most ``MAX_PIXELS`` pixels. The policy:
the image is converted to RGB and scaled (never up, bicubic) to fit ``MAX_SIDE`` x ``MAX_SIDE``,
then cut into ``PATCH`` x ``PATCH`` tiles, row by row, partial tiles padded with black: one
image token per tile (``image_tokens``). The model runner's patch embedding
(``model.PatchEmbed``) projects each tile to the model's width, and those vectors take the
image tokens' places in the prompt's embeddings, so the image is prefilled through the same
layers and paged KV cache as text and its cost shows in TTFT and in the step log.

In the prompt's token ids an image stands as placeholder ids drawn from the SHA-256 of its
encoded bytes (printable ASCII, one token each): ``usage.prompt_tokens`` counts them, and the
prefix cache, which hashes token ids, is keyed by the image's content (the same image is a
hit, another image of the same size is not).

Usage (in the API: build the prompt once, keeping its images apart)::

    pieces = prompt_pieces(lambda: chat_prompt(messages))   # text and Image, in prompt order
    ids, images = encode_pieces(pieces, tokenizer.encode)   # images: (first position, Image)

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
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_PIXELS",
    "MAX_SIDE",
    "PATCH",
    "Image",
    "ImageError",
    "encode_pieces",
    "image_part_text",
    "image_tokens",
    "pieces_text",
    "prompt_pieces",
    "read_image",
    "resized_size",
]

PATCH = 28
MAX_SIDE = 448
MAX_PIXELS = 40_000_000  # larger images are refused before their pixels are decoded
_KEPT = 64  # decoded images remembered by content hash (~600 kB each at 448 x 448)
_seen: OrderedDict[bytes, Image] = OrderedDict()
# While ``prompt_pieces`` builds a prompt, image parts become this mark and their Image is
# collected. A lone surrogate: a prompt that holds one is refused anyway (not encodable UTF-8).
_MARK = "\udfff"
_collected: ContextVar[list[Image] | None] = ContextVar("_collected", default=None)


class ImageError(ValueError):
    """An image the server cannot read; the API answers 400 with this message."""


@dataclass(frozen=True, eq=False)
class Image:
    """One decoded image after the resize policy: ``rgb`` holds ``height`` x ``width`` x 3
    bytes, row-major. ``text`` is its image tokens as prompt text (the placeholder ids)."""

    key: bytes  # SHA-256 of the encoded bytes: the image's identity
    width: int
    height: int
    rgb: bytes
    text: str

    @property
    def num_tokens(self) -> int:
        return math.ceil(self.width / PATCH) * math.ceil(self.height / PATCH)


def resized_size(width: int, height: int) -> tuple[int, int]:
    """(width, height) after scaling, never up, to fit ``MAX_SIDE`` x ``MAX_SIDE``."""
    scale = min(1.0, MAX_SIDE / max(width, height))
    return max(1, round(width * scale)), max(1, round(height * scale))


def image_tokens(width: int, height: int) -> int:
    """Image tokens of a ``width`` x ``height`` image: its ``PATCH`` tiles after the resize."""
    w, h = resized_size(width, height)
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


def _decode(raw: bytes, key: bytes) -> Image:
    from PIL import Image as PILImage
    from PIL import UnidentifiedImageError

    try:
        with PILImage.open(io.BytesIO(raw)) as img:
            if img.width * img.height > MAX_PIXELS:
                raise ImageError(
                    f"an image of {img.width} x {img.height} pixels is over the server's limit "
                    f"of {MAX_PIXELS:,} pixels; send a smaller image"
                )
            w, h = resized_size(*img.size)
            img.draft("RGB", (w, h))  # JPEG: decode at a reduced scale when that suffices
            rgb = img.convert("RGB")
            if rgb.size != (w, h):
                rgb = rgb.resize((w, h), PILImage.Resampling.BICUBIC)
            pixels = rgb.tobytes()
    except ImageError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError,
            PILImage.DecompressionBombError) as exc:  # fmt: skip
        raise ImageError(f"an image could not be decoded ({type(exc).__name__})") from None
    n = math.ceil(w / PATCH) * math.ceil(h / PATCH)
    stream = b"".join(
        hashlib.sha256(key + i.to_bytes(4, "little")).digest() for i in range(n // 32 + 1)
    )
    text = "".join(chr(0x21 + b % 94) for b in stream[:n])  # printable ASCII: one byte, one token
    return Image(key, w, h, pixels, text)


def read_image(part: Mapping[str, Any]) -> Image | None:
    """The decoded image of one content part, or None for a part that is not an image. Raises
    ``ImageError`` for an image that cannot be read. A repeated image is not decoded again."""
    if part.get("type") not in ("image_url", "image", "input_image"):
        return None
    raw = _bytes_of(part)
    key = hashlib.sha256(raw).digest()
    if key in _seen:
        _seen.move_to_end(key)
        return _seen[key]
    image = _decode(raw, key)
    _seen[key] = image
    if len(_seen) > _KEPT:
        _seen.popitem(last=False)
    return image


def image_part_text(part: Mapping[str, Any]) -> str | None:
    """The image tokens of one content part as prompt text, or None for a part that is not
    an image. Raises ``ImageError`` for an image that cannot be read."""
    image = read_image(part)
    if image is None:
        return None
    collected = _collected.get()
    if collected is None:
        return image.text
    collected.append(image)
    return _MARK


def prompt_pieces(build: Callable[[], str]) -> list[str | Image]:
    """The prompt ``build`` makes, as its text runs and its images in order. A prompt whose own
    text holds the mark (a lone surrogate) comes back as one piece, which the encoder refuses."""
    images: list[Image] = []
    token = _collected.set(images)
    try:
        marked = build()
    finally:
        _collected.reset(token)
    texts = marked.split(_MARK)
    if len(texts) != len(images) + 1:
        return [marked]
    pieces: list[str | Image] = [texts[0]] if texts[0] else []
    for image, text in zip(images, texts[1:], strict=True):
        pieces += [image, text] if text else [image]
    return pieces


def pieces_text(pieces: list[str | Image]) -> str:
    """The prompt as text, each image as its image tokens' text."""
    return "".join(p if isinstance(p, str) else p.text for p in pieces)


def encode_pieces(
    pieces: list[str | Image], encode: Callable[[str], list[int]]
) -> tuple[list[int], list[tuple[int, Image]]]:
    """Token ids of the prompt (the same as ``encode(pieces_text(pieces))`` for the byte
    tokenizer) and each image with the position of its first image token."""
    ids: list[int] = []
    images: list[tuple[int, Image]] = []
    for p in pieces:
        if isinstance(p, str):
            ids += encode(p)
            continue
        placeholder = encode(p.text)
        if len(placeholder) != p.num_tokens:  # the runner embeds exactly num_tokens rows
            raise ValueError("the tokenizer must encode an image's placeholder one id a char")
        images.append((len(ids), p))
        ids += placeholder
    return ids, images

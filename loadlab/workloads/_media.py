"""Images and audio carried by dataset rows: read from files, sent as data; URLs passed on.

A row's images are in its ``image_column`` (default: ``images`` or ``image``, whichever the row
has) and its audio clips in its ``audio_column`` (default ``audio``): one value or a list,
each

- a path to a file, relative to the dataset's folder (or absolute): read and sent as a
  ``data:`` URL (images: PNG, JPEG, WebP or GIF) or an ``input_audio`` clip (WAV or MP3);
- an ``http(s)://`` URL (images only): passed on as the URL, never fetched by loadlab;
- a ``data:`` URL;
- a HF ``Image`` or ``Audio`` value as ``save_to_disk`` stores it: ``{"bytes", "path"}``.

An image's tokens are counted from its size by the target's policy (``image_patch``,
``image_max_side``: ``loadlab.workloads._images.image_tokens``), a WAV clip's from its length
(``audio_tokens_per_s``: ``loadlab.workloads._audio.audio_tokens``). A request whose media's
tokens are not all known (an image URL; an MP3 clip, whose length is read from its frame
headers but whose tokens are what the server decodes) has no requested prompt length: the
prompt-length match leaves it out.

Example::

    reader = MediaReader.of({"image_column": "picture"}, Path("rows.jsonl"))
    media = reader.read({"prompt": "what is it?", "picture": "cat.png"})
"""

from __future__ import annotations

import base64
import functools
import io
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadlab.workloads._audio import (
    TOKENS_PER_S,
    audio_tokens,
    check_audio_apis,
    mp3_seconds,
    wav_frames,
)
from loadlab.workloads._images import check_image_apis, image_tokens
from loadlab.workloads._params import WorkloadError, get_int

__all__ = ["MEDIA_KEYS", "Media", "MediaError", "MediaReader", "carried"]

MEDIA_KEYS = {"image_column", "audio_column", "image_patch", "image_max_side", "audio_tokens_per_s"}
IMAGE_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
_CACHED_FILES = 64  # files read once while the run goes on (a repeated dataset, a shared image)


class MediaError(ValueError):
    """A row's image or clip that cannot be sent; the message names it and the fix."""


@dataclass(frozen=True)
class Media:
    """What one row sends besides its text (``RequestSpec``'s fields of the same names);
    ``*_tokens`` is None when some item's tokens are not known."""

    images: tuple[str, ...] = ()
    image_sizes: tuple[tuple[int, int], ...] = ()
    image_tokens: int | None = 0
    audio: tuple[tuple[str, str], ...] = ()
    audio_s: tuple[float, ...] = ()
    audio_tokens: int | None = 0

    @property
    def tokens(self) -> int | None:
        if self.image_tokens is None or self.audio_tokens is None:
            return None
        return self.image_tokens + self.audio_tokens


@dataclass(frozen=True)
class MediaReader:
    folder: Path
    image_column: str | None = None  # None: "images" or "image", whichever a row has
    audio_column: str | None = None  # None: "audio"
    patch: int = 28
    max_side: int = 448
    tokens_per_s: int = TOKENS_PER_S

    @classmethod
    def of(cls, params: Mapping[str, Any], path: Path) -> MediaReader:
        for key in ("image_column", "audio_column"):
            if key in params and not isinstance(params[key], str):
                raise WorkloadError(f"workload.{key} = {params[key]!r}: give a column name")
        return cls(
            folder=path if path.is_dir() else path.parent,
            image_column=params.get("image_column"),
            audio_column=params.get("audio_column"),
            patch=get_int(params, "image_patch", 28),
            max_side=get_int(params, "image_max_side", 448),
            tokens_per_s=get_int(params, "audio_tokens_per_s", TOKENS_PER_S),
        )

    def check(self, row: Any, cfg: Any) -> None:
        """Before the run: the given columns are in the first row, its media can be read,
        and every endpoint's API can carry them."""
        if isinstance(row, Mapping):
            for key in ("image_column", "audio_column"):
                column = getattr(self, key)
                if column is not None and column not in row:
                    raise WorkloadError(
                        f"workload.{key} = {column!r}: the dataset's first row has no such "
                        f"column (it has {', '.join(map(str, row)) or 'none'}); set {key} to "
                        "the column holding them"
                    )
        try:
            media = self.read(row)
        except MediaError as exc:
            raise WorkloadError(f"workload.path: the first row: {exc}") from None
        carried(media, cfg)

    def read(self, row: Any) -> Media:
        """A row's media (``Media()`` for a row without any); ``MediaError`` for an item that
        cannot be sent."""
        if not isinstance(row, Mapping):
            return Media()
        images = [self._image(v) for v in _items(row, self._column(row, "image"))]
        clips = [self._clip(v) for v in _items(row, self._column(row, "audio"))]
        sizes = [s for _, s in images if s is not None]  # all or none: a partial sum misleads
        sizes = sizes if len(sizes) == len(images) else []
        tokens = [t for _, (_, t) in clips if t is not None]
        patch, side = self.patch, self.max_side
        pictures = sum(image_tokens(w, h, patch=patch, max_side=side) for w, h in sizes)
        return Media(
            images=tuple(u for u, _ in images),
            image_sizes=tuple(sizes),
            image_tokens=pictures if sizes or not images else None,
            audio=tuple(c for c, _ in clips),
            audio_s=tuple(s for _, (s, _) in clips),
            audio_tokens=sum(tokens) if len(tokens) == len(clips) else None,
        )

    def _column(self, row: Mapping[str, Any], kind: str) -> str | None:
        given = self.image_column if kind == "image" else self.audio_column
        if given is not None:
            return given
        names = ("images", "image") if kind == "image" else ("audio",)
        return next((n for n in names if n in row), None)

    def _image(self, value: Any) -> tuple[str, tuple[int, int] | None]:
        if isinstance(value, str) and value.startswith(("http://", "https://")):
            return value, None  # passed on: loadlab fetches nothing
        raw, name = self._raw(value, "image")
        return _image_url(raw, name)

    def _clip(self, value: Any) -> tuple[tuple[str, str], tuple[float, int | None]]:
        if isinstance(value, str) and value.startswith(("http://", "https://")):
            raise MediaError(
                "an audio URL: an input_audio part carries the clip itself, not a URL; "
                "download it and give its path"
            )
        raw, name = self._raw(value, "audio")
        return _clip(raw, name, self.tokens_per_s)

    def _raw(self, value: Any, kind: str) -> tuple[bytes, str]:
        """An item's bytes and a name for messages: a HF value, a data: URL or a file."""
        if isinstance(value, Mapping):
            if isinstance(value.get("bytes"), bytes):
                return value["bytes"], str(value.get("path") or f"a stored {kind}")
            value = value.get("path")
        if not isinstance(value, str) or not value:
            raise MediaError(
                f"a {kind} of type {type(value).__name__}: give a file path, a URL or a data: URL"
            )
        if value.startswith("data:"):
            payload = value.partition(",")[2]
            try:
                return base64.b64decode(payload, validate=True), f"a {kind} data: URL"
            except ValueError:
                raise MediaError(f"a {kind} data: URL is not valid base64") from None
        path = Path(value).expanduser()
        return _read_file(path if path.is_absolute() else self.folder / path, kind), value


def carried(media: Media, cfg: Any) -> Media:
    """``media`` when every endpoint's API can carry them; else ``WorkloadError``."""
    if media.images:
        check_image_apis(cfg, "a dataset with images")
    if media.audio:
        check_audio_apis(cfg, "a dataset with audio")
    return media


def _items(row: Mapping[str, Any], column: str | None) -> list[Any]:
    value = row.get(column) if column is not None else None
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


@functools.lru_cache(maxsize=_CACHED_FILES)
def _read_file(path: Path, kind: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise MediaError(
            f"{kind} file {str(path)!r} cannot be read ({exc.strerror or exc}); give a path "
            "relative to the dataset file, or an absolute one"
        ) from None


def _image_url(raw: bytes, name: str) -> tuple[str, tuple[int, int]]:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(raw)) as img:
            fmt, size = img.format or "?", img.size
    except (UnidentifiedImageError, OSError):
        raise MediaError(f"image {name!r} is not an image loadlab can read") from None
    if fmt not in IMAGE_TYPES:
        raise MediaError(
            f"image {name!r} is {fmt}: servers take PNG, JPEG, WebP or GIF; convert it"
        )
    return f"data:{IMAGE_TYPES[fmt]};base64,{base64.b64encode(raw).decode()}", size


def _clip(
    raw: bytes, name: str, tokens_per_s: int
) -> tuple[tuple[str, str], tuple[float, int | None]]:
    """A clip as ``(format, base64)``, its seconds and its tokens when known (WAV: an MP3's
    length is read from its frame headers, but a server counts what it decodes)."""
    data = base64.b64encode(raw).decode()
    try:
        if raw[:4] == b"RIFF" and raw[8:12] == b"WAVE":
            frames, rate = wav_frames(raw)
            return ("wav", data), (frames / rate, audio_tokens(frames, rate, tokens_per_s))
        if raw[:3] == b"ID3" or (len(raw) > 1 and raw[0] == 0xFF and raw[1] & 0xE0 == 0xE0):
            return ("mp3", data), (mp3_seconds(raw), None)
    except ValueError as exc:
        raise MediaError(f"audio {name!r}: {exc}; convert it to 16-bit PCM WAV") from None
    raise MediaError(f"audio {name!r} is neither WAV nor MP3; convert it to one of them")

"""Images in prompts: synthetic images drawn here, sized from distributions, as ``data:`` URLs.

``[workload.images]`` (kind = "synthetic")::

    count      images per request: a number or a distribution (default 1)
    width      pixels: a number or a distribution (default 512)
    height     pixels (default: the width)
    format     "png" (default) or "jpeg"
    repeat     share of images drawn from a pool of ``pool`` images (a server's cache may hit
               them); the rest are new every time (default 0)
    pool       distinct images in that pool (default 4)
    patch, max_side   how the target counts an image's tokens (``image_tokens``): the
               reference server's policy by default (28-pixel patches of the image scaled to
               fit 448 x 448); set them to your model's

Each image is drawn by code from the run's seed (a gradient and rectangles, so PNG and JPEG
sizes are those of a real picture, not of noise or of a flat colour). A request's
``prompt_tokens`` counts its text and its images' tokens, so the prompt check compares the
whole prompt with the server's count; records keep ``images`` and ``image_pixels``.

Example::

    maker = ImageMaker.of({"count": 2, "width": 640, "format": "jpeg"}, seed=0)
    urls, sizes = maker.draw(rng)
"""

from __future__ import annotations

import base64
import functools
import io
import itertools
import math
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from loadlab.workloads._lengths import Dist, parse_dist
from loadlab.workloads._params import WorkloadError, check_keys

__all__ = [
    "IMAGE_KEYS",
    "ImageMaker",
    "check_image_apis",
    "draw_items",
    "image_tokens",
    "made_ahead",
]

IMAGE_KEYS = {"count", "width", "height", "format", "repeat", "pool", "patch", "max_side"}
MAX_SIDE_PX = 8192
AHEAD = 16  # new images (or clips) made ahead of the requests that take them
T = TypeVar("T")
FORMATS = {"png": ("PNG", "image/png"), "jpeg": ("JPEG", "image/jpeg")}


def check_image_apis(cfg: Any, key: str = "workload.images") -> None:
    """Images travel in chat, Anthropic and Responses messages; the completions API has none."""
    wrong = [ep.name for ep in cfg.endpoints if ep.api not in ("chat", "anthropic", "responses")]
    if wrong:
        raise WorkloadError(
            f"{key} needs api = 'chat', 'anthropic' or 'responses' on every endpoint; "
            f"{', '.join(wrong)} speak(s) another API"
        )


def image_tokens(width: int, height: int, *, patch: int = 28, max_side: int = 448) -> int:
    """Tokens of one image: scaled (never up) to fit ``max_side`` x ``max_side``, then one
    token per ``patch`` x ``patch`` tile, partial tiles counted.

    >>> image_tokens(448, 448), image_tokens(1024, 512), image_tokens(10, 10)
    (256, 128, 1)
    """
    scale = min(1.0, max_side / max(width, height))
    w, h = max(1, round(width * scale)), max(1, round(height * scale))
    return math.ceil(w / patch) * math.ceil(h / patch)


@dataclass
class ImageMaker:
    count: Dist
    width: Dist
    height: Dist | None
    format: str = "png"
    repeat: float = 0.0
    pool_size: int = 4
    patch: int = 28
    max_side: int = 448
    seed: int = 0
    _pool: list[tuple[str, tuple[int, int]]] = field(default_factory=list)
    _queue: queue.Queue[tuple[str, tuple[int, int]]] | None = None

    @classmethod
    def of(cls, params: Any, seed: int = 0, bases: Sequence[Path] = ()) -> ImageMaker:
        if not isinstance(params, Mapping):
            raise WorkloadError(
                "workload.images: give a table, e.g. images = {count = 1, width = 512}"
            )
        check_keys("images", params, IMAGE_KEYS | {"kind"})
        b = tuple(bases)
        fmt = str(params.get("format", "png")).lower()
        if fmt not in FORMATS:
            raise WorkloadError(f"workload.images.format = {fmt!r}: choose png or jpeg")
        repeat = params.get("repeat", 0.0)
        if isinstance(repeat, bool) or not isinstance(repeat, int | float) or not 0 <= repeat <= 1:
            raise WorkloadError(f"workload.images.repeat = {repeat!r}: a share from 0 to 1")
        ints = {}
        for key, default in (("pool", 4), ("patch", 28), ("max_side", 448)):
            v = params.get(key, default)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise WorkloadError(f"workload.images.{key} = {v!r}: a whole number >= 1")
            ints[key] = v
        maker = cls(
            count=parse_dist(params.get("count", 1), "images.count", bases=b),
            width=parse_dist(params.get("width", 512), "images.width", bases=b),
            height=parse_dist(params["height"], "images.height", bases=b)
            if "height" in params
            else None,
            format=fmt,
            repeat=float(repeat),
            pool_size=ints["pool"],
            patch=ints["patch"],
            max_side=ints["max_side"],
            seed=seed,
        )
        return maker

    def draw(self, rng: np.random.Generator) -> tuple[tuple[str, ...], tuple[tuple[int, int], ...]]:
        """One request's images: their URLs and (width, height) each. New images come from a
        thread that draws and encodes them ahead (a 1 MP image takes tens of milliseconds),
        so the send loop only takes a finished one."""
        drawn = draw_items(rng, self.count, self.repeat, self.pool_size, self._pooled, self._ahead)
        return tuple(u for u, _ in drawn), tuple(s for _, s in drawn)

    def tokens(self, sizes: Sequence[tuple[int, int]]) -> int:
        return sum(image_tokens(w, h, patch=self.patch, max_side=self.max_side) for w, h in sizes)

    def _ahead(self) -> queue.Queue[tuple[str, tuple[int, int]]]:
        if self._queue is None:
            rng = np.random.default_rng([self.seed, 78])
            self._queue = made_ahead(lambda tag: self._new(rng, tag), "images")
        return self._queue

    def _pooled(self, i: int) -> tuple[str, tuple[int, int]]:
        while len(self._pool) <= i:
            k = len(self._pool)
            self._pool.append(self._new(np.random.default_rng([self.seed, 77, k]), -1 - k))
        return self._pool[i]

    def _new(self, rng: np.random.Generator, tag: int) -> tuple[str, tuple[int, int]]:
        w = min(MAX_SIDE_PX, max(1, int(self.width.sample_int(rng, 1)[0])))
        h_dist = self.height if self.height is not None else None
        h = w if h_dist is None else min(MAX_SIDE_PX, max(1, int(h_dist.sample_int(rng, 1)[0])))
        return _encode(_picture(w, h, rng, tag), self.format), (w, h)


def draw_items(
    rng: np.random.Generator,
    count: Dist,
    repeat: float,
    pool_size: int,
    pooled: Callable[[int], T],
    ahead: Callable[[], queue.Queue[T]],
) -> list[T]:
    """One request's media: ``count`` drawn, each from the pool with chance ``repeat``, else a
    new one taken from the queue ``made_ahead`` fills."""
    n = max(0, int(count.sample_int(rng, 1)[0]))
    return [
        pooled(int(rng.integers(pool_size))) if repeat and rng.random() < repeat else ahead().get()
        for _ in range(n)
    ]


def made_ahead(make: Callable[[int], T], name: str) -> queue.Queue[T]:
    """A queue that a daemon thread keeps filled with ``make(0)``, ``make(1)``, ... (blocking
    while ``AHEAD`` wait): media drawn and encoded beside the send loop, which only takes
    finished ones."""
    q: queue.Queue[T] = queue.Queue(AHEAD)

    def fill() -> None:
        for tag in itertools.count():
            q.put(make(tag))

    threading.Thread(target=fill, daemon=True, name=name).start()
    return q


@functools.lru_cache(maxsize=16)
def _base(w: int, h: int) -> np.ndarray:
    """A colour gradient of the size (drawn once per size; each image is a copy made unique)."""
    x = np.linspace(0, 255, w, dtype=np.float32)[None, :]
    y = np.linspace(0, 255, h, dtype=np.float32)[:, None]
    rgb = np.stack([x * 0.6 + y * 0.4, x * 0.3 + y * 0.0, y * 0.7 + x * 0.0], axis=-1)
    return (rgb % 256).astype(np.uint8)  # [h, w, 3]


def _picture(w: int, h: int, rng: np.random.Generator, tag: int) -> Any:
    """A seeded picture: the gradient shifted in colour, six rectangles and a grain (so its
    PNG and JPEG sizes are those of a picture, not of a flat colour); ``tag`` makes it unique."""
    from PIL import Image

    img = _base(w, h) + rng.integers(0, 256, 3, dtype=np.uint8)  # wraps: a colour shift
    for _ in range(6):
        y0, x0 = int(rng.integers(h)), int(rng.integers(w))
        img[y0 : y0 + max(1, h // 4), x0 : x0 + max(1, w // 4)] = rng.integers(0, 256, 3)
    img += rng.integers(0, 12, (h, w, 1), dtype=np.uint8)  # grain
    img[0, 0] = (tag & 255, (tag >> 8) & 255, (tag >> 16) & 255)  # never two alike
    return Image.fromarray(img, "RGB")


def _encode(img: Any, fmt: str) -> str:
    pil_format, media = FORMATS[fmt]
    buf = io.BytesIO()
    img.save(buf, pil_format, **({"quality": 85} if fmt == "jpeg" else {"compress_level": 1}))
    return f"data:{media};base64,{base64.b64encode(buf.getvalue()).decode()}"

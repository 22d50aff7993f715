"""Images on the reference server: image tokens counted by the stated policy, prefilled like
text, cached by content; unreadable images are 400."""

from __future__ import annotations

import base64
import io
import urllib.error
import urllib.request
from typing import Any

import pytest
from PIL import Image

from loadlab.clients.counting import post_json
from reference_server.vision import image_tokens
from tests.helpers.server import AUTH

HEADERS = {"Content-Type": "application/json", **AUTH}


def _png(w: int, h: int, shade: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (shade, 255 - shade, 90)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _chat(server: Any, urls: list[str], text: str = "hi") -> dict[str, Any]:
    content = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    body = {
        "model": "loadlab-ref",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": [*content, {"type": "text", "text": text}]}],
    }
    return post_json(server.url + "/v1/chat/completions", body, HEADERS)


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("size", [(28, 28), (56, 112), (300, 90)])
def test_usage_counts_every_image_token(
    reasoning_server: Any, n: int, size: tuple[int, int]
) -> None:
    urls = [_png(*size, shade=10 * i + n) for i in range(n)]
    out = _chat(reasoning_server, urls)
    assert out["usage"]["prompt_tokens"] == len("hi") + n * image_tokens(*size)


def test_a_repeated_image_is_a_prefix_cache_hit(reasoning_server: Any) -> None:
    url = _png(112, 112, shade=201)  # 16 image tokens
    first = _chat(reasoning_server, [url], "first question")
    second = _chat(reasoning_server, [url], "another one")
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16 - 16 % 16


@pytest.mark.parametrize(
    ("url", "message"),
    [("https://example.com/a.png", "fetches no image URLs"),
     ("data:image/png;base64,!!!!", "not valid base64"),
     ("data:image/png;base64," + base64.b64encode(b"not an image").decode(), "could not be decoded")],
)  # fmt: skip
def test_unreadable_images_are_400(reasoning_server: Any, url: str, message: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as err:
        _chat(reasoning_server, [url])
    assert err.value.code == 400 and message in err.value.read().decode()

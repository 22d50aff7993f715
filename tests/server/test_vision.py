"""Images on the reference server: image tokens counted by the stated policy, placed in the
prompt's token ids where the image stands, prefilled like text, cached by content; unreadable
images are 400. (The encoder's own tests: tests/server_model/test_image_encoder.py.)"""

from __future__ import annotations

import base64
import io
import json
import struct
import urllib.error
import urllib.request
import zlib
from typing import Any

import pytest
from PIL import Image

from loadlab.clients._counting import post_json
from reference_server.vision import encode_pieces, image_part_text, image_tokens, prompt_pieces
from tests.helpers.server import AUTH

HEADERS = {"Content-Type": "application/json", **AUTH}


def _png(w: int, h: int, shade: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (shade, 255 - shade, 90)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _chat(server: Any, urls: list[str], text: str = "hi", max_tokens: int = 1) -> dict[str, Any]:
    content = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    body = {
        "model": "loadlab-ref",
        "max_tokens": max_tokens,
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


def test_the_same_image_and_text_again_is_answered_the_same_from_the_cache(
    reasoning_server: Any,
) -> None:
    url = _png(84, 56, shade=77)  # 6 image tokens
    first = _chat(reasoning_server, [url, url], "the same question")
    second = _chat(reasoning_server, [url, url], "the same question")
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16
    assert second["choices"] == first["choices"]


def test_an_image_prompt_is_answered_the_same_disaggregated(
    disaggregated_server: Any, continuous_server: Any
) -> None:
    """The prefill worker embeds the image (its Sequence carries it across processes) and the
    decode worker attends over its transferred K/V: the greedy text equals continuous mode's."""
    urls = [_png(140, 84, shade=9), _png(84, 140, shade=99)]  # 15 image tokens each
    cont = _chat(continuous_server, urls, "describe", max_tokens=12)
    dis = _chat(disaggregated_server, urls, "describe", max_tokens=12)
    assert dis["choices"] == cont["choices"]
    assert dis["usage"]["prompt_tokens"] == cont["usage"]["prompt_tokens"] == 8 + 30


def _step_log(server: Any) -> list[dict[str, Any]]:
    url = server.url + "/v1/step_log"  # the test's own server on loopback
    with urllib.request.urlopen(urllib.request.Request(url, headers=AUTH), timeout=10) as resp:  # noqa: S310
        return list(json.load(resp))


def test_a_chunked_prefill_splits_images_answers_as_whole_and_logs_their_tokens(
    servers: Any, continuous_server: Any
) -> None:
    """Chunks of 16 tokens cut the second image in two; the step log's prefill tokens of the
    request's steps count every image token, and the greedy text equals continuous mode's."""
    chunked = servers.get("chunked")
    urls = [_png(140, 84, shade=41), _png(84, 140, shade=42)]  # 15 image tokens each
    last = _step_log(chunked)
    since = last[-1]["end_ns"] if last else 0
    out = _chat(chunked, urls, "describe", max_tokens=8)
    steps = [e for e in _step_log(chunked) if e["start_ns"] >= since]
    assert out["usage"]["prompt_tokens"] == 30 + 8
    assert [e["prefill_tokens"] for e in steps if e["prefill_tokens"]] == [16, 16, 6]
    assert out["choices"] == _chat(continuous_server, urls, "describe", max_tokens=8)["choices"]


def _part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def test_images_stand_in_the_token_ids_where_they_are_in_the_prompt() -> None:
    a, b = _part(_png(56, 28, shade=1)), _part(_png(28, 84, shade=2))  # 2 and 3 tokens
    ta, tb = image_part_text(a), image_part_text(b)
    pieces = prompt_pieces(lambda: "é" + str(image_part_text(a)) + "xy" + str(image_part_text(b)))
    ids, images = encode_pieces(pieces, lambda s: list(s.encode()))
    assert ids == list(f"é{ta}xy{tb}".encode())  # what /tokenize counts
    assert [(pos, img.num_tokens) for pos, img in images] == [(2, 2), (6, 3)]  # é is 2 bytes
    assert [img.text for _, img in images] == [ta, tb]


def test_a_prompt_holding_the_image_mark_itself_is_left_to_the_encoder_to_refuse() -> None:
    a = _part(_png(28, 28, shade=3))
    pieces = prompt_pieces(lambda: "\udfff" + str(image_part_text(a)))
    with pytest.raises(UnicodeEncodeError):
        encode_pieces(pieces, lambda s: list(s.encode()))


def _png_header(w: int, h: int) -> str:
    """A PNG that claims ``w`` x ``h`` pixels and holds none: only its header can be read."""
    ihdr = b"IHDR" + struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", 13) + ihdr + struct.pack(">I", zlib.crc32(ihdr))
    data = b"\x89PNG\r\n\x1a\n" + chunk + struct.pack(">I", 0) + b"IEND\xaeB`\x82"
    return "data:image/png;base64," + base64.b64encode(data).decode()


@pytest.mark.parametrize(
    ("url", "message"),
    [("https://example.com/a.png", "fetches no image URLs"),
     (_png_header(8000, 6000), "over the server's limit"),
     (_png_header(100_000, 100_000), "could not be decoded"),
     ("data:image/png;base64,!!!!", "not valid base64"),
     ("data:image/png;base64," + base64.b64encode(b"not an image").decode(), "could not be decoded")],
)  # fmt: skip
def test_unreadable_images_are_400(reasoning_server: Any, url: str, message: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as err:
        _chat(reasoning_server, [url])
    assert err.value.code == 400 and message in err.value.read().decode()

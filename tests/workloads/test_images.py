"""Synthetic images: drawn by code, sized from distributions, sent in every dialect."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from loadlab.clients._bodies import build_body
from loadlab.config import EndpointConfig, RunConfig
from loadlab.records import RequestRecord, RequestSpec
from loadlab.workloads import build_requests, validate_workload
from loadlab.workloads._images import ImageMaker, image_tokens
from loadlab.workloads._params import WorkloadError


def _decode(url: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))


def test_images_are_real_pictures_of_the_drawn_sizes() -> None:
    maker = ImageMaker.of({"count": 3, "width": 64, "height": 40, "format": "jpeg"}, seed=1)
    urls, sizes = maker.draw(np.random.default_rng(0))
    assert sizes == ((64, 40),) * 3 and all(u.startswith("data:image/jpeg;base64,") for u in urls)
    assert all(_decode(u).size == (64, 40) and _decode(u).format == "JPEG" for u in urls)
    assert len(set(urls)) == 3  # never two alike without repeat
    assert maker.tokens(sizes) == 3 * image_tokens(64, 40) == 3 * 6


def test_repeat_draws_from_a_pool() -> None:
    maker = ImageMaker.of({"count": 4, "width": 32, "repeat": 1.0, "pool": 1}, seed=1)
    urls, _ = maker.draw(np.random.default_rng(0))
    assert len(set(urls)) == 1 and _decode(urls[0]).format == "PNG"


@pytest.mark.parametrize(
    ("images", "message"),
    [({"format": "gif"}, "png or jpeg"), ({"repeat": 2}, "share from 0 to 1"),
     ({"pool": 0}, ">= 1"), ({"colour": 1}, "colour")],
)  # fmt: skip
def test_bad_image_settings_are_refused_before_the_run(images: dict, message: str) -> None:
    cfg = RunConfig(concurrency=1, requests=1, workload={"kind": "synthetic", "images": images})
    with pytest.raises(WorkloadError, match=message):
        validate_workload(cfg)


def test_the_completions_api_cannot_carry_images() -> None:
    cfg = RunConfig(concurrency=1, requests=1, workload={"kind": "synthetic", "images": {}},
                    endpoints=(EndpointConfig("http://127.0.0.1:9", api="completions"),))  # fmt: skip
    with pytest.raises(WorkloadError, match="api = 'chat'"):
        validate_workload(cfg)


def test_specs_and_records_carry_images_and_their_tokens() -> None:
    cfg = RunConfig(concurrency=1, requests=2, prompt_tokens=10, tokenizer="none",
                    workload={"kind": "synthetic",
                              "images": {"count": 2, "width": 100, "height": 50}})  # fmt: skip
    specs = list(build_requests(cfg))
    assert all(len(s.images) == 2 and s.image_tokens == 2 * image_tokens(100, 50) for s in specs)
    rec = RequestRecord.for_spec(specs[0])
    assert rec.images == 2 and rec.image_pixels == 2 * 100 * 50
    assert rec.prompt_tokens_requested == specs[0].prompt_tokens + specs[0].image_tokens


def test_each_dialect_sends_its_own_image_parts() -> None:
    url = "data:image/png;base64,AAAA"
    spec = RequestSpec("r", "what is it", 4, images=(url,), image_sizes=((1, 1),))
    chat = build_body(spec, EndpointConfig("http://h", api="chat"), stream=False)
    assert chat["messages"][0]["content"][0] == {"type": "image_url", "image_url": {"url": url}}
    msgs = build_body(spec, EndpointConfig("http://h", api="anthropic"), stream=False)
    assert msgs["messages"][0]["content"][0] == {
        "type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}  # fmt: skip
    resp = build_body(spec, EndpointConfig("http://h", api="responses"), stream=False)
    assert resp["input"][0]["content"] == [
        {"type": "input_image", "image_url": url}, {"type": "input_text", "text": "what is it"}]  # fmt: skip

"""Admission and faults against running servers: every 4xx, a full queue, disconnects.

Bad input must get an OpenAI-shaped error body and a 4xx, never a 500 or FastAPI's 422.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from reference_server.api import MAX_BODY_BYTES
from tests.helpers.server import label, metrics, post, session, wait_idle

MODEL = "loadlab-ref"
COMPLETIONS = "/v1/completions"


def _assert_openai_error(body: Any) -> dict[str, Any]:
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    return err


async def _raw(url: str, data: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with session() as s, s.post(url, data=data, headers=headers or {}) as r:
        return r.status, await r.json(content_type=None)


ROUTES = [("GET", "/health"), ("GET", "/metrics"), ("GET", "/v1/models"),
          ("GET", "/v1/server_info"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions")]  # fmt: skip


@pytest.mark.parametrize("key", [None, "Bearer wrong", "test-key-not-a-secret"])
def test_every_route_needs_the_api_key(continuous_server: Any, key: str | None) -> None:
    async def go() -> list[tuple[int, Any]]:
        headers = {} if key is None else {"Authorization": key}
        out = []
        async with aiohttp.ClientSession() as s:  # no default auth header
            for method, path in ROUTES:
                body = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
                async with s.request(
                    method, continuous_server.url + path, json=body, headers=headers
                ) as r:
                    out.append((r.status, await r.json(content_type=None)))
        return out

    for status, body in asyncio.run(go()):
        assert status == 401  # a raw key without "Bearer " is refused too
        assert _assert_openai_error(body)["code"] == "invalid_api_key"


BAD_BODIES: list[tuple[str, Any, str | None]] = [
    ("not an object", [1, 2], None),
    ("a string", "hello", None),
    ("null", None, None),
    ("max_tokens 0", {"model": MODEL, "prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("max_tokens negative", {"model": MODEL, "prompt": "hi", "max_tokens": -3}, "max_tokens"),
    ("max_tokens text", {"model": MODEL, "prompt": "hi", "max_tokens": "many"}, "max_tokens"),
    ("max_tokens float", {"model": MODEL, "prompt": "hi", "max_tokens": 2.5}, "max_tokens"),
    ("max_tokens bool", {"model": MODEL, "prompt": "hi", "max_tokens": True}, "max_tokens"),
    ("over the context", {"model": MODEL, "prompt": "hi" * 50, "max_tokens": 100}, "max_tokens"),
    ("empty prompt", {"model": MODEL, "prompt": "", "max_tokens": 2}, "prompt"),
    ("two prompts", {"model": MODEL, "prompt": ["a", "b"], "max_tokens": 2}, "prompt"),
    ("no model", {"prompt": "hi"}, "model"),
    ("n = 2", {"model": MODEL, "prompt": "hi", "n": 2}, "n"),
    ("temperature < 0", {"model": MODEL, "prompt": "hi", "temperature": -1}, "temperature"),
    ("top_p 0", {"model": MODEL, "prompt": "hi", "top_p": 0}, "top_p"),
    ("stream not bool", {"model": MODEL, "prompt": "hi", "stream": "yes"}, "stream"),
    ("lone surrogate", {"model": MODEL, "prompt": "a\ud800b", "max_tokens": 2}, "prompt"),
    ("lone low surrogate", {"model": MODEL, "prompt": ["\udfff"], "stream": True}, "prompt"),
]


@pytest.mark.parametrize(("case", "body", "param"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_completion_bodies_are_openai_shaped_400s(
    continuous_server: Any, case: str, body: Any, param: str | None
) -> None:
    status, got, _ = asyncio.run(_post(continuous_server.url + COMPLETIONS, body))
    assert status == 400, (case, got)
    err = _assert_openai_error(got)
    assert err["type"] == "invalid_request_error" and err["param"] == param


def test_bad_chat_bodies_and_invalid_json(continuous_server: Any) -> None:
    url = continuous_server.url + "/v1/chat/completions"
    cases = [
        {"model": MODEL, "messages": []},
        {"model": MODEL, "messages": [{"content": "no role"}]},
        {"model": MODEL, "messages": "hello"},
        {"model": MODEL, "messages": [{"role": "user", "content": ""}]},
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "max_completion_tokens": 0,
        },
        {"model": MODEL, "messages": [{"role": "user", "content": "\ud800"}]},
        {"model": MODEL, "messages": [{"role": "user", "content": [{"text": "ok \udbff"}]}]},
    ]
    for body in cases:
        status, got, _ = asyncio.run(_post(url, body))
        assert status == 400, (body, got)
        _assert_openai_error(got)
    for raw in (b"{not json", b"", b'{"model": "loadlab-ref", "messages": [', b"\xff\xfe"):
        status, got = asyncio.run(_raw(url, raw, {"Content-Type": "application/json"}))
        assert status == 400, (raw, got)
        _assert_openai_error(got)


def test_unknown_model_route_and_method(continuous_server: Any) -> None:
    status, got, _ = asyncio.run(
        _post(continuous_server.url + COMPLETIONS, {"model": "gpt-9", "prompt": "hi"})
    )
    assert status == 404 and _assert_openai_error(got)["code"] == "model_not_found"

    async def go() -> list[tuple[int, Any]]:
        async with session() as s:
            out = []
            for method, path in [
                ("GET", "/v1/nope"),
                ("GET", COMPLETIONS),
                ("DELETE", "/v1/models"),
            ]:
                async with s.request(method, continuous_server.url + path) as r:
                    out.append((r.status, await r.json(content_type=None)))
            return out

    (s404, b404), (s405, b405), (s405b, _) = asyncio.run(go())
    assert s404 == 404 and s405 == 405 and s405b == 405
    _assert_openai_error(b404)
    _assert_openai_error(b405)


def test_oversized_bodies_get_413_with_or_without_content_length(continuous_server: Any) -> None:
    big = b'{"model": "loadlab-ref", "prompt": "' + b"x" * (MAX_BODY_BYTES + 1) + b'"}'
    status, got = asyncio.run(_raw(continuous_server.url + COMPLETIONS, big))
    assert status == 413 and _assert_openai_error(got)["code"] == "request_too_large"

    async def chunks() -> Any:
        for i in range(0, len(big), 1 << 16):
            yield big[i : i + (1 << 16)]

    async def chunked() -> tuple[int, Any]:
        async with session() as s, s.post(continuous_server.url + COMPLETIONS, data=chunks()) as r:
            return r.status, await r.json(content_type=None)

    status, got = asyncio.run(chunked())
    assert status == 413 and _assert_openai_error(got)["code"] == "request_too_large"


def test_models_server_info_and_metrics_names(continuous_server: Any) -> None:
    async def go() -> tuple[Any, Any, dict[str, float]]:
        async with session() as s:
            async with s.get(continuous_server.url + "/v1/models") as r:
                models = await r.json()
            async with s.get(continuous_server.url + "/v1/server_info") as r:
                info = await r.json()
            return models, info, await metrics(s, continuous_server.url)

    models, info, m = asyncio.run(go())
    assert [c["id"] for c in models["data"]] == [MODEL]
    assert info["mode"] == "continuous" and info["preset"] == "tiny" and info["max_num_seqs"] == 8
    assert info["num_kv_blocks"] == 40 and info["block_size"] == 16 and info["max_model_len"] == 128
    assert info["kv_bytes_per_token"] > 0 and info["num_params"] > 0
    for name in ("queue_depth", "running_requests", "kv_blocks_used", "kv_blocks_total",
                 "preemptions_total", "requests_in_flight", label("rejected_requests_total", reason="queue_full"),
                 label("tokens_total", phase="prefill"), label("tokens_total", phase="decode"),
                 label("step_seconds_count", phase="decode"), label("step_seconds_sum", phase="mixed")):  # fmt: skip
        assert name in m, name


def test_full_queue_answers_429_at_once_and_nothing_hangs(small_server: Any) -> None:
    """Capacity is 2 (one running, one queued): hold both, then 10 more are refused fast."""
    url = small_server.url
    finished = label("requests_total", finish_reason="length")

    async def attempt() -> tuple[
        list[tuple[int, Any, Any]], list[float], dict[str, float], dict[str, float], bool, int
    ]:
        async with session() as s:
            before = await metrics(s, url)
            long = {"model": MODEL, "prompt": "hold", "max_tokens": 1000, "stream": True}
            # Both at once: awaited one after the other, the second's headers came only when
            # the first had run, and the tiny model (1000 tokens in ~0.4 s on a quiet
            # machine) could free a place before the 10 were sent.
            held = await asyncio.gather(*(s.post(url + COMPLETIONS, json=long) for _ in range(2)))
            while (held_at := await metrics(s, url))["requests_in_flight"] < 2:
                await asyncio.sleep(0.002)

            async def timed() -> tuple[tuple[int, Any, Any], float]:
                t0 = time.monotonic()
                got = await post(
                    s, url + COMPLETIONS, {"model": MODEL, "prompt": "more", "max_tokens": 5}
                )
                return got, time.monotonic() - t0

            results = await asyncio.gather(*(timed() for _ in range(10)))
            after_reject = await metrics(s, url)
            # A held request that ran to its end freed a place while the 10 were sent (only
            # it can: nothing else runs), so this attempt says nothing about a full queue.
            held_throughout = after_reject[finished] == held_at[finished]
            for r in held:  # hang up: both are aborted and the server empties
                r.close()
            idle = await wait_idle(s, url)
            assert idle["kv_blocks_used"] == 0 and idle["requests_in_flight"] == 0
            status, _, _ = await post(
                s, url + COMPLETIONS, {"model": MODEL, "prompt": "ok", "max_tokens": 3}
            )
            got = [g for g, _ in results]
            return got, [t for _, t in results], before, after_reject, held_throughout, status

    # On a loaded 2-core machine the 10 can take longer than the tiny model needs for 1000
    # tokens (a clean-clone CI run saw a 200); such an attempt is repeated, never passed.
    for _ in range(5):
        rejected, seconds, before, after, held_throughout, status_after = asyncio.run(attempt())
        assert status_after == 200
        if held_throughout:
            break
    else:
        pytest.fail("in 5 attempts a held request always finished before the 10 were answered")
    for status, body, headers in rejected:
        assert status == 429 and headers["Retry-After"] == "1"
        assert _assert_openai_error(body)["code"] == "queue_full"
    assert max(seconds) < 5.0  # answered at once (a held request needs far longer to finish)
    key = label("rejected_requests_total", reason="queue_full")
    assert after[key] - before[key] == 10


def test_non_streaming_client_that_gives_up_is_aborted(small_server: Any) -> None:
    url = small_server.url

    async def give_up(s: aiohttp.ClientSession) -> None:
        body = {"model": MODEL, "prompt": "slow", "max_tokens": 1000}
        async with s.post(url + COMPLETIONS, json=body):
            pass

    async def go() -> tuple[dict[str, float], dict[str, float]]:
        async with session() as s:
            before = await metrics(s, url)
            request = asyncio.ensure_future(give_up(s))
            # Give up once the server runs it: a fixed client timeout raced the tiny model,
            # which can decode all 1000 tokens in under 0.5 s on a quiet machine.
            while (await metrics(s, url))["running_requests"] < 1 and not request.done():
                await asyncio.sleep(0.002)
            request.cancel()
            with pytest.raises(asyncio.CancelledError):
                await request
            return before, await wait_idle(s, url)

    before, after = asyncio.run(go())
    key = label("requests_total", finish_reason="abort")
    assert after[key] - before[key] == 1  # aborted, not finished after 1000 tokens
    assert after["kv_blocks_used"] == 0 and after["running_requests"] == 0


async def _post(url: str, body: Any) -> tuple[int, Any, Any]:
    async with session() as s:
        return await post(s, url, body)


def test_tiny_temperatures_sample_greedily_instead_of_failing(continuous_server: Any) -> None:
    """Found by the fuzz: temperature 1e-300 made the sampler's probabilities NaN (a 500)."""
    body = {"model": MODEL, "prompt": "tiny t", "max_tokens": 4, "temperature": 1e-300}
    status, got, _ = asyncio.run(_post(continuous_server.url + COMPLETIONS, body))
    assert status == 200 and got["usage"]["completion_tokens"] == 4


def test_degenerate_sampling_is_served_beside_normal_requests(continuous_server: Any) -> None:
    """Temperature 2 with top_p 1e-300 must not make the sampler raise (a 500, and every batch
    holding such a request rerun one request at a time): it samples the most likely token,
    and the normal requests batched with it finish with no engine error."""
    url = continuous_server.url + COMPLETIONS
    odd = {"model": MODEL, "prompt": "odd", "max_tokens": 6, "temperature": 2, "top_p": 1e-300}
    normal = {"model": MODEL, "prompt": "normal", "max_tokens": 6}

    async def go() -> tuple[list[tuple[int, Any, Any]], float, float]:
        async with session() as s:
            errors = await metrics(s, continuous_server.url)
            bodies = [odd, normal] * 4 + [{**odd, "seed": 7, "stream": False}]
            got = await asyncio.gather(*(post(s, url, b) for b in bodies))
            after = await metrics(s, continuous_server.url)
        key = label("requests_total", finish_reason="error")
        return got, errors.get(key, 0.0), after.get(key, 0.0)

    got, errors_before, errors_after = asyncio.run(go())
    assert [status for status, _, _ in got] == [200] * 9, got
    assert all(body["usage"]["completion_tokens"] == 6 for _, body, _ in got)
    assert errors_after == errors_before

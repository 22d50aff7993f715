"""The OpenAI client: request body, chunk interpretation, timing against a real server."""

from __future__ import annotations

import asyncio
import time

import pytest

from loadlab.clients import (
    AnthropicClient,
    OpenAIClient,
    OpenAIStreamState,
    build_body,
    make_client,
)
from loadlab.clients._state import StreamState
from loadlab.clients._streaming import api_url
from loadlab.config import EndpointConfig, RunConfig
from loadlab.records import RequestRecord, RequestSpec
from loadlab.selftest._fixed_server import FixedScheduleServer
from tests.helpers.clients import assert_matches_truth, sse_state

SPEC = RequestSpec("r1", "hello there", 4, prompt_tokens=2, extra_body={"ignore_eos": True})


def test_build_body_chat_with_history_and_extra_fields() -> None:
    ep = EndpointConfig("http://127.0.0.1:1", model="m")
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    body = build_body(SPEC, ep, history=history, extra_body={"temperature": 0, "ignore_eos": False})
    assert body == {
        "model": "m",
        "messages": [*history, {"role": "user", "content": "hello there"}],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "ignore_eos": True,  # the request's own extra_body wins over the run's
    }


def test_build_body_completions_without_stream() -> None:
    ep = EndpointConfig("http://127.0.0.1:1", model="m", api="completions")
    body = build_body(RequestSpec("r", "p", 3), ep, stream=False)
    assert body == {"model": "m", "prompt": "p", "max_tokens": 3, "stream": False}


@pytest.mark.parametrize(
    ("url", "api", "expected"),
    [
        ("http://h:1", "chat", "http://h:1/v1/chat/completions"),
        ("http://h:1/v1/", "completions", "http://h:1/v1/completions"),
        ("http://h:1/v1/chat/completions", "chat", "http://h:1/v1/chat/completions"),
        ("http://h:1", "anthropic", "http://h:1/v1/messages"),
        ("http://h:1/v1/", "anthropic", "http://h:1/v1/messages"),
        ("http://h:1/v1/messages", "anthropic", "http://h:1/v1/messages"),
        ("http://h:8000", "responses", "http://h:8000/v1/responses"),
        ("http://h:8000/v1/", "responses", "http://h:8000/v1/responses"),
        ("http://h/v1/responses", "responses", "http://h/v1/responses"),
    ],
)
def test_api_url(url: str, api: str, expected: str) -> None:
    """Every dialect's path (one table, ``API_PATHS``): added to a base URL, kept when given."""
    assert api_url(EndpointConfig(url, api=api)) == expected


def _chat_state() -> StreamState:
    return sse_state("chat")


def test_only_token_carrying_chunks_count() -> None:
    s = _chat_state()
    s.on_bytes(b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n', 2000)
    s.on_bytes(b'data: {"choices":[{"delta":{"reasoning_content":"hm"}}]}\n\n', 3000)
    s.on_bytes(b'data: {"choices":[{"delta":{"content":"A"}}]}\n\ndata: {"choices":', 4000)
    s.on_bytes(b'[{"delta":{"content":"B"}}]}\n\n: keep-alive\n\n', 5000)
    s.on_bytes(b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n', 6000)
    s.on_bytes(b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":4}}\n\n', 7000)
    s.on_bytes(b"data: [DONE]\n\n", 8000)
    s.finish(9000)
    r = s.record
    assert r.outcome == "ok"
    assert r.chunk_ns == [2000, 3000, 4000]  # reasoning counts; role-only/empty/usage do not
    assert s.text == "AB"
    assert (r.headers_ns, r.end_ns, r.finish_reason, r.prompt_tokens) == (100, 8000, "stop", 5)
    assert (r.output_tokens, r.output_tokens_source, r.output_tokens_chunks) == (4, "usage", 3)
    assert r.output_tokens_disagree


def test_tokens_from_chunks_without_usage() -> None:
    s = OpenAIStreamState(RequestRecord("r"), "completions")
    s.on_headers(200, {"Content-Type": "text/event-stream"}, 0)
    s.on_bytes(
        b'data: {"choices":[{"text":"a"}]}\r\n\r\ndata: {"choices":[{"text":""}]}\r\n\r\n', 5
    )
    s.on_bytes(b'data: {"choices":[{"text":"b","finish_reason":"length"}]}\r\n\r\n', 6)
    s.finish(7)  # no [DONE], but a finish_reason: complete
    r = s.record
    assert (r.outcome, r.chunk_ns, r.output_tokens, r.output_tokens_source) == (
        "ok",
        [5, 6],
        2,
        "chunks",
    )
    assert not r.output_tokens_disagree


@pytest.mark.parametrize("transport", ["raw", "aiohttp"])
def test_client_against_fixed_server(fixed_server: FixedScheduleServer, transport: str) -> None:
    async def main() -> None:
        for api in ("chat", "completions"):
            for stream in (True, False):
                ep = EndpointConfig(fixed_server.url, api=api, name="ref")
                async with OpenAIClient(ep, stream=stream, transport=transport) as client:
                    t0 = time.perf_counter_ns()
                    spec = RequestSpec(f"{api}-{stream}-{transport}", "a b c", 5, prompt_tokens=3)
                    done = await client.send(spec, t0_ns=t0)
                r = done.record
                assert (r.outcome, r.http_status, r.endpoint) == ("ok", 200, "ref")
                assert (r.output_tokens, r.output_tokens_source, r.prompt_tokens) == (5, "usage", 3)
                assert (r.max_tokens, r.prompt_tokens_requested, r.finish_reason) == (
                    5,
                    3,
                    "length",
                )
                assert done.text == " tok" * 5
                truth = fixed_server.truth[spec.request_id]  # X-Request-Id reached the server
                assert_matches_truth(r, truth, t0, 5 if stream else 1)

    asyncio.run(main())


def test_make_client_sizes_the_pool() -> None:
    ep = EndpointConfig("http://127.0.0.1:1", api="completions")
    cfg = RunConfig(concurrency=7, requests=1, stream=False, timeout_s=9.0)
    client = make_client(ep, cfg)
    assert isinstance(client, OpenAIClient)
    assert (client.max_connections, client.stream, client.timeout_s) == (7, False, 9.0)
    assert isinstance(
        make_client(EndpointConfig("http://h:1", api="anthropic"), cfg), AnthropicClient
    )


def test_missing_key_variable_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOADLAB_TEST_NO_SUCH_KEY", raising=False)
    ep = EndpointConfig("http://127.0.0.1:1", api_key_env="LOADLAB_TEST_NO_SUCH_KEY")
    with pytest.raises(ValueError, match="LOADLAB_TEST_NO_SUCH_KEY is empty or unset"):
        OpenAIClient(ep)


def test_a_number_as_content_is_its_text() -> None:
    s = _chat_state()
    s.on_bytes(b'data: {"choices": [{"delta": {"content": 5}}]}\n\ndata: [DONE]\n\n', 2000)
    s.finish(3000)
    assert (s.record.outcome, s.text) == ("ok", "5")


def test_cached_prompt_tokens_from_usage_details() -> None:
    s = _chat_state()
    s.on_bytes(b'data: {"choices":[{"delta":{"content":"A"},"finish_reason":"stop"}]}\n\n', 2000)
    s.on_bytes(b'data: {"choices":[],"usage":{"prompt_tokens":80,"completion_tokens":1,'
               b'"prompt_tokens_details":{"cached_tokens":64}}}\n\ndata: [DONE]\n\n', 3000)  # fmt: skip
    s.finish(4000)
    assert (s.record.prompt_tokens, s.record.cached_prompt_tokens) == (80, 64)
    plain = _chat_state()  # a server that does not say: unknown, not zero
    plain.on_bytes(b'data: {"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":1,'
                   b'"prompt_tokens_details":null}}\n\ndata: [DONE]\n\n', 2000)  # fmt: skip
    plain.finish(3000)
    assert (plain.record.prompt_tokens, plain.record.cached_prompt_tokens) == (8, None)

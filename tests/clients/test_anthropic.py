"""The Anthropic Messages client: body and headers, event interpretation, timing against the
fixed server's truth, and what its dialect makes of the fault server's faults (what every dialect
must do with them, the canary key included, is in ``test_faults.py``)."""

from __future__ import annotations

import asyncio
import time

import pytest

from loadlab.clients import AnthropicClient, AnthropicStreamState
from loadlab.clients._bodies import build_body
from loadlab.clients._state import StreamState
from loadlab.config import EndpointConfig
from loadlab.records import RequestRecord, RequestSpec
from loadlab.selftest._fixed_server import FixedScheduleServer
from tests.helpers.clients import (
    assert_faults_classified,
    assert_matches_truth,
    run_faults,
    sse_state,
)
from tests.helpers.fault_server import FaultServer
from tests.helpers.loopback import FAULT_OUTCOMES as EXPECTED

TRANSPORTS = ["raw", "aiohttp"]


def test_body_has_history_then_the_new_message_and_extra_fields() -> None:
    ep = EndpointConfig("http://127.0.0.1:1", model="claude-x", api="anthropic")
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    spec = RequestSpec("r", "next", 7, extra_body={"temperature": 1})
    body = build_body(spec, ep, history=history, extra_body={"temperature": 0, "a": 1})
    assert body == {
        "model": "claude-x",
        "max_tokens": 7,
        "messages": [*history, {"role": "user", "content": "next"}],
        "stream": True,
        "temperature": 1,  # the request's own extra_body wins over the run's
        "a": 1,
    }


def _state() -> StreamState:
    return sse_state("anthropic")


def _ev(kind: str, data: str) -> bytes:
    return f"event: {kind}\ndata: {data}\n\n".encode()


TEXT_A = '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"A"}}'
END_TURN = '{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":1}}'


def _streamed_with_usage(usage: str) -> RequestRecord:
    """A one-token streamed answer whose message_start carries ``usage``."""
    s = _state()
    start = '{"type":"message_start","message":{"usage":' + usage + "}}"
    s.on_bytes(_ev("message_start", start) + _ev("content_block_delta", TEXT_A), 2000)
    s.on_bytes(
        _ev("message_delta", END_TURN) + _ev("message_stop", '{"type":"message_stop"}'), 3000
    )
    s.finish(4000)
    return s.record


def _whole_message(body: bytes) -> AnthropicStreamState:
    """A non-streamed answer: headers at 10 ns, the whole JSON ``body`` at 20, the end at 30."""
    s = AnthropicStreamState(RequestRecord("r"), stream=False, t0_ns=0)
    s.on_headers(200, {"Content-Type": "application/json"}, 10)
    s.on_bytes(body, 20)
    s.finish(30)
    return s


def test_events_tokens_usage_and_stop_reason() -> None:
    s = _state()
    start = '{"type":"message_start","message":{"usage":{"input_tokens":9,"output_tokens":1}}}'
    s.on_bytes(_ev("message_start", start), 2000)
    block = '{"type":"content_block_start","index":0,"content_block":{"type":"thinking"}}'
    s.on_bytes(_ev("content_block_start", block) + _ev("ping", '{"type":"ping"}'), 2500)
    think = (
        '{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"h"}}'
    )
    s.on_bytes(_ev("content_block_delta", think), 3000)
    sig = '{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"x"}}'
    s.on_bytes(_ev("content_block_delta", sig), 3500)  # not a token
    a = '{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"A"}}'
    empty = '{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":""}}'
    b_half = '{"type":"content_block_delta","index":1,"delta":{"type":"text_de'
    s.on_bytes(_ev("content_block_delta", a) + _ev("content_block_delta", empty), 4000)
    s.on_bytes(b"event: content_block_delta\ndata: " + b_half.encode(), 5000)
    s.on_bytes(b'lta","text":"B"}}\n\n: keep-alive\n\n', 6000)  # B completes at 6000
    s.on_bytes(_ev("content_block_stop", '{"type":"content_block_stop","index":1}'), 6500)
    delta = (
        '{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":4}}'
    )
    s.on_bytes(_ev("message_delta", delta) + _ev("message_stop", '{"type":"message_stop"}'), 7000)
    s.finish(8000)
    r = s.record
    assert r.outcome == "ok" and s.done
    assert r.chunk_ns == [2000, 3000, 5000]  # thinking counts; signature/empty/ping do not
    assert s.text == "AB"
    assert (r.headers_ns, r.end_ns, r.finish_reason, r.prompt_tokens) == (
        100,
        7000,
        "max_tokens",
        9,
    )
    assert (r.output_tokens, r.output_tokens_source, r.output_tokens_chunks) == (4, "usage", 3)
    assert r.output_tokens_disagree


def test_stop_reason_without_message_stop_is_incomplete() -> None:
    s = _state()
    s.on_bytes(_ev("content_block_delta", TEXT_A) + _ev("message_delta", END_TURN), 2000)
    s.finish(3000)
    assert (s.record.outcome, s.record.error) == ("incomplete", "stream ended before message_stop")
    assert (s.record.output_tokens, s.record.output_tokens_source) == (1, "usage")


def test_an_error_event_is_a_stream_error_whatever_its_data_says() -> None:
    s = _state()
    s.on_bytes(b'event: error\ndata: {"error":{"message":"busy"}}\n\n', 2000)
    s.finish(3000)
    assert (s.record.outcome, s.record.error) == ("stream_error", "error in stream: busy")


def test_non_streaming_message_body() -> None:
    s = _whole_message(
        b'{"type":"message","content":[{"type":"thinking","thinking":"."},{"type":"text",'
        b'"text":"Hi"},{"type":"text","text":" there"}],"stop_reason":"end_turn",'
        b'"usage":{"input_tokens":3,"output_tokens":5}}'
    )
    r = s.record
    assert (r.outcome, s.text, r.chunk_ns, r.chunk_tokens) == ("ok", "Hi there", [30], [5])
    assert (r.prompt_tokens, r.output_tokens, r.finish_reason) == (3, 5, "end_turn")


def test_prompt_tokens_include_the_cached_part_which_is_also_kept_apart() -> None:
    """Anthropic's input_tokens excludes cache reads and writes (vLLM reports prefix-cache hits
    as cache_read_input_tokens): the whole prompt is the sum."""
    usage = '{"input_tokens":7,"cache_read_input_tokens":96,"cache_creation_input_tokens":null}'
    r = _streamed_with_usage(usage)
    assert (r.outcome, r.prompt_tokens, r.server) == ("ok", 103, {"cache_read_input_tokens": 96})
    s = _whole_message(
        b'{"type":"message","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn",'
        b'"usage":{"input_tokens":3,"output_tokens":1,"cache_read_input_tokens":0,'
        b'"cache_creation_input_tokens":40}}'
    )
    assert (s.record.prompt_tokens, s.record.server) == (
        43,
        {"cache_read_input_tokens": 0, "cache_creation_input_tokens": 40},
    )


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_client_against_fixed_server_truth(
    fixed_server: FixedScheduleServer, transport: str
) -> None:
    async def main() -> None:
        for stream in (True, False):
            ep = EndpointConfig(fixed_server.url, api="anthropic", name="claude")
            async with AnthropicClient(ep, stream=stream, transport=transport) as client:
                t0 = time.perf_counter_ns()
                spec = RequestSpec(f"anth-{stream}-{transport}", "a b c", 5, prompt_tokens=3)
                history = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
                done = await client.send(spec, t0_ns=t0, history=history)
            r = done.record
            assert (r.outcome, r.http_status, r.endpoint, r.error) == ("ok", 200, "claude", None)
            # usage: input words of the whole conversation (1 + 1 + 3); output from usage
            assert (r.prompt_tokens, r.output_tokens, r.output_tokens_source) == (5, 5, "usage")
            assert (r.finish_reason, done.text) == ("max_tokens", " tok" * 5)
            truth = fixed_server.truth[spec.request_id]
            assert_matches_truth(r, truth, t0, 5 if stream else 1)

    asyncio.run(main())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_each_fault_becomes_its_outcome(fault_server: FaultServer, transport: str) -> None:
    records = run_faults(AnthropicClient, fault_server.url, "anthropic", list(EXPECTED),
                         transport=transport)  # fmt: skip
    assert_faults_classified(records)
    eof = records["eof"]  # stop reason and usage came, message_stop did not
    assert (len(eof.chunk_ns), eof.finish_reason, eof.output_tokens) == (2, "end_turn", 3)
    ok = records["ok"]
    assert (ok.prompt_tokens, ok.output_tokens, len(ok.chunk_ns)) == (1, 3, 3)


def test_headers_and_missing_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOADLAB_TEST_KEY", "k1")
    ep = EndpointConfig("http://127.0.0.1:1", api="anthropic", api_key_env="LOADLAB_TEST_KEY")
    c = AnthropicClient(ep)
    assert c._headers["x-api-key"] == "k1" and "Authorization" not in c._headers
    assert c._headers["anthropic-version"] == "2023-06-01"
    custom = EndpointConfig(
        "http://127.0.0.1:1", api="anthropic", headers={"Anthropic-Version": "2099-01-01"}
    )
    assert "anthropic-version" not in AnthropicClient(custom)._headers  # the user's header wins
    monkeypatch.delenv("LOADLAB_TEST_KEY")
    with pytest.raises(ValueError, match="LOADLAB_TEST_KEY is empty or unset"):
        AnthropicClient(ep)
    with pytest.raises(ValueError, match="speaks api anthropic, not 'chat'"):
        AnthropicClient(EndpointConfig("http://127.0.0.1:1"))


def test_sse_event_plus_data_fast_path_matches_the_spec() -> None:
    from loadlab.clients._sse import SSEDecoder, SSEEvent

    body = (
        b"event: a\ndata: x\n\nevent:\ndata:y\n\nevent: b\ndata\n\nevent: c\ndata:\n\n"
        b"event: d\ndata: 1\ndata: 2\n\nevent: e\ndatum: z\n\nid: 7\nevent: f\ndata: q\n\n"
        b"event: g\ndata:  two spaces\n\n"
    )
    expected = [
        SSEEvent("x", "a"),
        SSEEvent("y", "message"),  # an empty event name is "message"
        SSEEvent("", "b"),  # "data" without a colon: an empty data line
        SSEEvent("", "c"),
        SSEEvent("1\n2", "d"),
        # "datum" is an unknown field: no data, so nothing is dispatched for "e"
        SSEEvent("q", "f", id="7"),
        SSEEvent(" two spaces", "g", id="7"),  # one space after the colon is dropped, no more
    ]
    assert SSEDecoder().feed(body) == expected
    dec = SSEDecoder()  # byte by byte goes through the slow path: same events
    assert [e for i in range(len(body)) for e in dec.feed(body[i : i + 1])] == expected


def test_prompt_cache_reads_and_writes() -> None:
    """Anthropic's input_tokens leaves the prompt cache out: the prompt is all three counts,
    the reads are the cached tokens, the writes are kept apart."""
    r = _whole_message(
        b'{"type":"message","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn",'
        b'"usage":{"input_tokens":3,"cache_read_input_tokens":64,'
        b'"cache_creation_input_tokens":16,"output_tokens":5}}'
    ).record
    assert (r.prompt_tokens, r.cached_prompt_tokens) == (83, 64)
    assert r.server["cache_creation_input_tokens"] == 16


def test_exact_output_fields_are_openai_dialect_and_not_sent() -> None:
    ep = EndpointConfig("http://127.0.0.1:1", model="claude-x", api="anthropic")
    spec = RequestSpec("r", "x", 7, extra_body={"ignore_eos": True, "min_tokens": 7, "top_k": 5})
    body = build_body(spec, ep, extra_body={"ignore_eos": True})
    assert "min_tokens" not in body and body["top_k"] == 5
    assert body["ignore_eos"] is True  # the user's own --extra-body is sent as given


def test_prompt_tokens_include_the_prompt_cache() -> None:
    # Anthropic (and vLLM's /v1/messages on a prefix-cache hit) count cached input apart
    usage = '{"input_tokens":2,"cache_read_input_tokens":768,"cache_creation_input_tokens":7}'
    r = _streamed_with_usage(usage)
    assert r.prompt_tokens == 777
    assert r.cached_prompt_tokens == 768

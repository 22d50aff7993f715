"""Reasoning, tool calls and server ids in each dialect's stream (sans-IO, hand-built streams).

TTFT counts the first token of any kind; TTFAT the first answer content; reasoning and
tool-call argument chunks are token chunks counted apart (ARCHITECTURE.md).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from loadlab._analysis import metrics
from loadlab.clients._anthropic import AnthropicStreamState
from loadlab.clients._bodies import build_body
from loadlab.clients._openai import OpenAIStreamState
from loadlab.clients._responses import ResponsesStreamState
from loadlab.clients._state import StreamState
from loadlab.clients._tools import assistant_turn, tool_result
from loadlab.config import EndpointConfig
from loadlab.records import RequestRecord, RequestSpec

TOOLS = ({"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}},)


def _sse(obj: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(obj)}\n\n".encode()


def _run(state: StreamState, events: list[bytes], headers: dict[str, str] | None = None) -> None:
    state.on_sent(1000)
    state.on_headers(200, {"Content-Type": "text/event-stream", **(headers or {})}, 1100)
    for i, ev in enumerate(events):
        state.on_bytes(ev, 2000 + 1000 * i)
    state.finish(2000 + 1000 * len(events))


def _chat(delta: dict[str, Any], **more: Any) -> bytes:
    return _sse({"id": "chatcmpl-9", "choices": [{"index": 0, "delta": delta, **more}]})


def test_chat_reasoning_then_answer() -> None:
    s = OpenAIStreamState(RequestRecord("r1"), "chat")
    usage = {
        "prompt_tokens": 5,
        "completion_tokens": 5,
        "completion_tokens_details": {"reasoning_tokens": 3},
    }
    _run(
        s,
        [
            _chat({"role": "assistant", "content": ""}),  # role only: no token
            _chat({"reasoning_content": "th"}),
            _chat({"reasoning": "in"}),
            _chat({"reasoning_content": "k"}),
            _chat({"content": "A"}),
            _chat({"content": "B"}, finish_reason="length"),
            _sse({"id": "chatcmpl-9", "choices": [], "usage": usage}) + b"data: [DONE]\n\n",
        ],
    )
    r = s.record
    assert r.outcome == "ok" and s.text == "AB"
    assert r.chunk_ns == [3000, 4000, 5000, 6000, 7000]
    assert (r.answer_ns, r.reasoning_start_ns, r.reasoning_end_ns) == (6000, 3000, 5000)
    assert metrics.ttft_ms(r) == 0.002 and metrics.ttfat_ms(r) == 0.005
    assert metrics.reasoning_ms(r) == 0.002
    assert (r.reasoning_chunks, r.reasoning_tokens, r.output_tokens) == (3, 3, 5)
    assert metrics.answer_token_count(r) == 2 and r.response_id == "chatcmpl-9"


def test_chat_tool_call_deltas_are_timed_tokens() -> None:
    s = OpenAIStreamState(RequestRecord("r1"), "chat")
    first = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "search"}}
    _run(
        s,
        [
            _chat({"role": "assistant", "tool_calls": [first]}),  # names the call: no token
            _chat({"tool_calls": [{"index": 0, "function": {"arguments": '{"q": '}}]}),
            _chat({"tool_calls": [{"index": 0, "function": {"arguments": '"x"}'}}]}),
            _chat({}, finish_reason="tool_calls") + b"data: [DONE]\n\n",
        ],
    )
    r = s.record
    assert r.outcome == "ok" and r.finish_reason == "tool_calls"
    assert r.chunk_ns == [3000, 4000] and r.answer_ns is None
    assert metrics.ttft_ms(r) == 0.002 and metrics.ttfat_ms(r) is None
    assert (r.tool_calls, r.tool_call_chunks, metrics.tool_call_token_count(r)) == (1, 2, 2)
    assert s.tool_calls == ({"id": "call_1", "name": "search", "arguments": '{"q": "x"}'},)
    assert metrics.answer_token_count(r) == 0


def test_a_plain_chat_stream_keeps_the_fast_path_and_ttfat_is_ttft() -> None:
    s = OpenAIStreamState(RequestRecord("r1"), "chat")
    _run(s, [_chat({"content": c}) for c in "ABCDEF"] + [b"data: [DONE]\n\n"])
    r = s.record
    assert s._tpl is not None  # the token frame was learned: later chunks skip the JSON parse
    assert len(r.chunk_ns) == 6 and s.text == "ABCDEF"
    assert metrics.ttfat_ms(r) == metrics.ttft_ms(r)
    assert r.reasoning_chunks == 0 and r.reasoning_tokens is None
    assert "answer_ns" in r.to_dict() and "reasoning_chunks" not in r.to_dict()


def test_the_server_id_falls_back_to_a_request_id_header() -> None:
    s = OpenAIStreamState(RequestRecord("r1"), "completions")
    _run(
        s,
        [_sse({"choices": [{"text": "A", "finish_reason": "length"}]}) + b"data: [DONE]\n\n"],
        headers={"x-request-id": "req-77"},
    )
    assert s.record.response_id == "req-77"
    echo = OpenAIStreamState(RequestRecord("r1"), "completions")  # our own id echoed back
    _run(echo, [b"data: [DONE]\n\n"], headers={"x-request-id": "r1"})
    assert echo.record.response_id is None


def test_anthropic_thinking_text_and_tool_use() -> None:
    s = AnthropicStreamState(RequestRecord("r1"))

    def ev(obj: dict[str, Any]) -> bytes:
        return _sse(obj, obj["type"])

    def delta(i: int, d: dict[str, Any]) -> bytes:
        return ev({"type": "content_block_delta", "index": i, "delta": d})

    _run(
        s,
        [
            ev({"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 3}}}),
            ev({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking"}}),
            delta(0, {"type": "thinking_delta", "thinking": "hm"}),
            delta(0, {"type": "signature_delta", "signature": "sig"}),
            delta(1, {"type": "text_delta", "text": "ok"}),
            ev(
                {
                    "type": "content_block_start",
                    "index": 2,
                    "content_block": {"type": "tool_use", "id": "toolu_1", "name": "search"},
                }
            ),
            delta(2, {"type": "input_json_delta", "partial_json": '{"q":'}),
            delta(2, {"type": "input_json_delta", "partial_json": "1}"}),
            ev(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "tool_use"},
                    "usage": {"output_tokens": 4},
                }
            ),
            ev({"type": "message_stop"}),
        ],
    )
    r = s.record
    assert r.outcome == "ok" and r.response_id == "msg_1"
    assert r.chunk_ns == [4000, 6000, 8000, 9000]
    assert (r.answer_ns, r.reasoning_chunks, r.reasoning_tokens) == (6000, 1, 1)
    assert s.tool_calls == ({"id": "toolu_1", "name": "search", "arguments": '{"q":1}'},)
    assert (metrics.tool_call_token_count(r), metrics.answer_token_count(r)) == (2, 1)


def test_responses_stream() -> None:
    s = ResponsesStreamState(RequestRecord("r1"))

    def ev(obj: dict[str, Any]) -> bytes:
        return _sse(obj, obj["type"])

    usage = {
        "input_tokens": 4,
        "output_tokens": 6,
        "output_tokens_details": {"reasoning_tokens": 2},
    }
    item = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "search"}
    _run(
        s,
        [
            ev({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}}),
            ev({"type": "response.reasoning_text.delta", "delta": "a", "sequence_number": 2}),
            ev({"type": "response.reasoning_text.delta", "delta": "b", "sequence_number": 3}),
            ev({"type": "response.output_text.delta", "delta": "X", "sequence_number": 4}),
            ev({"type": "response.output_text.delta", "delta": "Y", "sequence_number": 5}),
            ev({"type": "response.output_item.added", "output_index": 2, "item": item}),
            ev(
                {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "delta": "{}"}
            ),
            ev({"type": "response.function_call_arguments.delta", "item_id": "fc_1", "delta": " "}),
            ev(
                {
                    "type": "response.incomplete",
                    "response": {
                        "id": "resp_1",
                        "status": "incomplete",
                        "incomplete_details": {"reason": "max_output_tokens"},
                        "usage": usage,
                    },
                }
            ),
        ],
    )
    r = s.record
    assert r.outcome == "ok" and r.finish_reason == "max_output_tokens" and s.done
    assert r.chunk_ns == [3000, 4000, 5000, 6000, 8000, 9000]
    assert (r.response_id, r.answer_ns, r.prompt_tokens, r.output_tokens) == (
        "resp_1",
        5000,
        4,
        6,
    )
    assert (metrics.reasoning_token_count(r), metrics.answer_token_count(r)) == (2, 2)
    assert s.text == "XY" and s.tool_calls[0]["arguments"] == "{} "


@pytest.mark.parametrize(
    ("events", "outcome"),
    [
        ([{"type": "response.output_text.delta", "delta": "A"}], "incomplete"),
        ([{"type": "error", "code": "x", "message": "overloaded"}], "stream_error"),
        ([{"type": "response.failed", "response": {"error": {"message": "boom"}}}], "stream_error"),
        ([{"type": "response.output_text.delta"}], "protocol_error"),
    ],
)
def test_responses_failures(events: list[dict[str, Any]], outcome: str) -> None:
    s = ResponsesStreamState(RequestRecord("r1"))
    _run(s, [_sse(e) for e in events])
    assert s.record.outcome == outcome


def test_non_streaming_answers_count_reasoning_and_tools() -> None:
    body = {
        "id": "resp_2",
        "status": "completed",
        "output": [
            {"type": "reasoning", "content": []},
            {"type": "function_call", "call_id": "c9", "name": "f", "arguments": "{}"},
        ],
        "usage": {"input_tokens": 1, "output_tokens": 3},
    }
    s = ResponsesStreamState(RequestRecord("r1"), stream=False)
    s.on_sent(0)
    s.on_headers(200, {"Content-Type": "application/json"}, 10)
    s.on_bytes(json.dumps(body).encode(), 20)
    s.finish(30)
    r = s.record
    assert r.outcome == "ok" and r.response_id == "resp_2" and r.finish_reason == "completed"
    assert r.chunk_ns == [30] and r.answer_ns is None and r.tool_calls == 1
    assert s.tool_calls == ({"id": "c9", "name": "f", "arguments": "{}"},)


def test_each_dialect_sends_tools_history_and_effort_in_its_own_form() -> None:
    calls = [{"id": "c1", "name": "search", "arguments": '{"q": 1}'}]
    history = [{"role": "user", "content": "find"}, assistant_turn("", calls)]
    spec = RequestSpec(
        "r2", "", 8, tools=TOOLS, tool_results=(tool_result("c1", "42"),), reasoning_effort="low"
    )
    chat = build_body(spec, EndpointConfig("http://h", model="m"), history=history)
    assert chat["messages"][-1] == {"role": "tool", "tool_call_id": "c1", "content": "42"}
    assert chat["tools"] == list(TOOLS) and chat["reasoning_effort"] == "low"
    resp = build_body(spec, EndpointConfig("http://h", model="m", api="responses"),
                      history=history)  # fmt: skip
    assert resp["input"][1:] == [
        {"type": "function_call", "call_id": "c1", "name": "search", "arguments": '{"q": 1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
    ]
    assert resp["tools"][0]["name"] == "search" and resp["reasoning"] == {"effort": "low"}
    msgs = build_body(spec, EndpointConfig("http://h", model="m", api="anthropic"),
                      history=history)  # fmt: skip
    assert msgs["messages"][1]["content"] == [
        {"type": "tool_use", "id": "c1", "name": "search", "input": {"q": 1}}
    ]
    assert msgs["messages"][2] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "42"}],
    }
    assert msgs["tools"] == [{"name": "search", "input_schema": {"type": "object"}}]

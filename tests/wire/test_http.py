"""HTTP/1.1 exchanges and server-sent events read off hand-made TCP streams."""

from __future__ import annotations

import json

import pytest

from loadlab._wire.http import CHOICE, OTHER, TOKEN, event_kind, exchanges, sse_events
from loadlab._wire.tcp import reassemble
from tests.helpers.wire import Conversation

REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nX-Request-Id: r-1\r\n"
    b"Content-Length: 11\r\n\r\n"
)
HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


def _event(delta: dict[str, object]) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta}]}).encode() + b"\n\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def test_a_streamed_chat_exchange() -> None:
    conv = Conversation()
    conv.syn(0)
    conv.client(REQUEST + b'{"a":', 10)
    conv.client(b' "bcde"}', 12)  # the body's last bytes: the wire's "sent"
    conv.server(HEAD, 20)
    conv.server(_chunk(_event({"role": "assistant", "content": ""})), 25)
    tok = _chunk(_event({"content": "Hi"}))
    conv.server(tok[:20], 30)  # one event over two packets: it counts at the second
    conv.server(tok[20:] + _chunk(_event({"content": " there"})), 40)
    usage = b'data: {"choices": [], "usage": {"completion_tokens": 2}}\n\n'
    conv.server(_chunk(usage + b"data: [DONE]\n\n") + b"0\r\n\r\n", 50)
    (ex,) = exchanges(reassemble(conv.packets, 8000).connections[0])
    assert (ex.request_id, ex.request_first_ns, ex.request_last_ns) == ("r-1", 10, 12)
    assert (ex.status, ex.headers_ns, ex.end_ns, ex.complete) == (200, 20, 50, True)
    assert ex.kinds == [CHOICE, TOKEN, TOKEN, OTHER, OTHER]
    assert ex.event_ns == [25, 40, 40, 50, 50]
    assert ex.times() == [40, 40] and ex.times((TOKEN, CHOICE)) == [25, 40, 40]


def test_kept_alive_connection_pairs_responses_in_order() -> None:
    conv = Conversation()
    conv.syn(0)
    second = REQUEST.replace(b"r-1", b"r-2")
    conv.client(REQUEST + b"x" * 11, 10)
    conv.server(HEAD + _chunk(_event({"content": "a"})) + b"0\r\n\r\n", 20)
    conv.client(second + b"y" * 11, 30)
    conv.server(b"HTTP/1.1 429 Too Many\r\nContent-Length: 2\r\n\r\n{}", 40)
    first, then = exchanges(reassemble(conv.packets, 8000).connections[0])
    assert (first.request_id, first.times(), first.end_ns) == ("r-1", [20], 20)
    assert (then.request_id, then.status, then.event_ns, then.end_ns) == ("r-2", 429, [], 40)
    assert then.index == 1 and then.complete


def test_a_response_cut_short_keeps_what_came() -> None:
    conv = Conversation()
    conv.syn(0)
    conv.client(REQUEST + b"x" * 11, 10)
    conv.server(HEAD + _chunk(_event({"content": "a"})) + b"40\r\npartial", 20)
    (ex,) = exchanges(reassemble(conv.packets, 8000).connections[0])
    assert ex.times() == [20] and not ex.complete and ex.end_ns is None


def test_a_request_never_answered() -> None:
    conv = Conversation()
    conv.syn(0)
    conv.client(REQUEST + b"x" * 11, 10)
    (ex,) = exchanges(reassemble(conv.packets, 8000).connections[0])
    assert ex.status is None and not ex.complete


def test_sse_events_by_the_whatwg_rules() -> None:
    body = b": ping\r\n\r\nevent: delta\r\ndata: a\r\ndata: b\r\n\r\ndata:c\n\nid: 3\n\n"
    events = list(sse_events(body))
    assert [(k, d) for _, k, d in events] == [("delta", "a\nb"), ("message", "c")]
    assert body[events[0][0]] == ord("\n") and body[: events[0][0] + 1].endswith(b"b\r\n\r\n")


@pytest.mark.parametrize(
    ("obj", "kind"),
    [
        ({"choices": [{"delta": {"content": "x"}}]}, TOKEN),
        ({"choices": [{"delta": {"reasoning_content": "x"}}]}, TOKEN),
        ({"choices": [{"delta": {"reasoning": "x"}}]}, TOKEN),
        ({"choices": [{"delta": {"tool_calls": [{"function": {"arguments": "{"}}]}}]}, TOKEN),
        ({"choices": [{"delta": {"tool_calls": [{"function": {"name": "f"}}]}}]}, CHOICE),
        ({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, CHOICE),
        ({"choices": [{"delta": {}, "finish_reason": "length"}]}, CHOICE),
        ({"choices": [{"text": "x"}]}, TOKEN),
        ({"choices": [], "usage": {"completion_tokens": 3}}, OTHER),
        ({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "x"}}, TOKEN),
        ({"type": "content_block_delta", "delta": {"thinking": "x"}}, TOKEN),
        ({"type": "content_block_delta", "delta": {"partial_json": "{"}}, TOKEN),
        ({"type": "message_start", "message": {}}, OTHER),
        ({"type": "response.output_text.delta", "delta": "x"}, TOKEN),
        ({"type": "response.output_text.delta", "delta": ""}, OTHER),
        ({"type": "response.completed"}, OTHER),
    ],
)
def test_event_kinds(obj: dict[str, object], kind: str) -> None:
    assert event_kind(json.dumps(obj)) == kind


def test_event_kinds_of_what_is_not_a_json_object() -> None:
    assert [event_kind(d) for d in ("[DONE]", "", "{bad", "[1]")] == [OTHER] * 4

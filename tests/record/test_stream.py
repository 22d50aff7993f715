"""The proxy's token-frame fast path (``StreamWatch``) must change nothing but its cost.

Every test feeds one stream, cut into the same chunks at the same times, to a watch that may
learn the stream's token frame and to one that never does (``_learn = 0``: the SSE cut and the
JSON parse for every event), and requires the same figures: token times, reply length, tool
call, stream error, malformed events, usage, and (when the proxy asked for usage) the bytes to
forward.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadlab._record.stream import StreamWatch

TEXTS = [" tok", 'a"b', "line\n", "é", "😀 ok", "x\\", "", " tok", "\u2028", " done"]


def _data(obj: Any, style: str) -> bytes:
    if style == "spaced":
        return json.dumps(obj).encode()  # ", " and ": ", non-ASCII as \\u escapes
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _sse(payload: bytes, sep: bytes = b"\n\n", event: str = "", prefix: bytes = b"data: ") -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    if sep == b"\r\n\r\n":
        head = head.replace(b"\n", b"\r\n")
    return head + prefix + payload + sep


def _chat_events(style: str, *, part: str = "content", usage_null: bool = False) -> list[bytes]:
    """A chat stream: role chunk, one chunk per text (as ``part``), finish, usage, [DONE]."""
    frame: dict[str, Any] = {"id": "c-1", "object": "chat.completion.chunk", "model": "m"}
    if usage_null:
        frame["usage"] = None

    def chunk(delta: dict[str, Any], finish: str | None = None, **more: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _data(frame | {"choices": [choice]} | more, style)

    def token(text: str) -> dict[str, Any]:
        if part == "tool":
            return {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}
        return {part: text}

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk(token(t)) for t in TEXTS]
    out.append(chunk({}, "stop"))
    usage = {"prompt_tokens": 7, "completion_tokens": 9, "total_tokens": 16}
    out.append(_data(frame | {"choices": [], "usage": usage}, style))
    return [*out, b"[DONE]"]


def _completion_events(style: str) -> list[bytes]:
    def chunk(text: str, finish: str | None = None) -> bytes:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return _data({"id": "c-2", "object": "text_completion", "choices": [choice]}, style)

    usage = {"prompt_tokens": 3, "completion_tokens": 9}
    end = _data({"id": "c-2", "choices": [], "usage": usage}, style)
    return [chunk(t) for t in TEXTS] + [chunk("", "length"), end, b"[DONE]"]


def _anthropic_events(style: str) -> list[tuple[str, bytes]]:
    def ev(kind: str, **obj: Any) -> tuple[str, bytes]:
        return kind, _data({"type": kind} | obj, style)

    usage = {"input_tokens": 5, "cache_read_input_tokens": 2, "output_tokens": 1}
    out = [ev("message_start", message={"id": "m", "usage": usage})]
    out.append(ev("content_block_start", index=0, content_block={"type": "text", "text": ""}))
    out += [
        ev("content_block_delta", index=0, delta={"type": "text_delta", "text": t}) for t in TEXTS
    ]
    out.append(ev("content_block_start", index=1, content_block={"type": "tool_use", "id": "t"}))
    delta = {"type": "input_json_delta", "partial_json": '{"q": 1}'}
    out += [ev("content_block_delta", index=1, delta=delta)] * 3
    out.append(ev("message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 12}))
    return [*out, ev("message_stop")]


def _responses_events(style: str, *, numbered: bool = True, kind: str = "text") -> list[bytes]:
    """Responses deltas (``kind``: output ``text`` or ``function_call`` arguments), with a
    sequence number (the frame changes every event) or without."""
    delta = f"response.{'output_text' if kind == 'text' else 'function_call_arguments'}.delta"
    out = [
        _data({"type": delta} | ({"sequence_number": i} if numbered else {}) | {"delta": t}, style)
        for i, t in enumerate(TEXTS)
    ]
    usage = {
        "input_tokens": 4,
        "output_tokens": 9,
        "output_tokens_details": {"reasoning_tokens": 2},
    }
    done = {"type": "response.completed", "response": {"usage": usage}}
    return [*out, _data(done, style)]


def _stream(api: str, style: str, sep: bytes, **kw: Any) -> bytes:
    if api == "anthropic":
        return b"".join(_sse(p, sep, event=k) for k, p in _anthropic_events(style))
    events = {
        "chat": lambda: _chat_events(style, **kw),
        "completions": lambda: _completion_events(style),
        "responses": lambda: _responses_events(style, **kw),
    }[api]()
    return b"".join(_sse(p, sep) for p in events)


def _figures(w: StreamWatch) -> tuple[Any, ...]:
    return (w.token_times_ns, w.reply_chars, w.called_tool, w.stream_error, w.malformed, w.usage)


def _both(api: str, chunks: list[bytes], *, drop: bool = False) -> tuple[StreamWatch, StreamWatch]:
    """Feeds ``chunks`` to a learning watch and a full-way one; asserts they agree."""
    fast, full = StreamWatch(api, True, drop), StreamWatch(api, True, drop)
    full._learn = 0
    sent_fast, sent_full = bytearray(), bytearray()
    for i, chunk in enumerate(chunks):
        sent_fast += fast.feed(chunk, 1000 + i) or b""
        sent_full += full.feed(chunk, 1000 + i) or b""
    sent_fast += fast.finish()
    sent_full += full.finish()
    assert _figures(fast) == _figures(full)
    assert sent_fast == sent_full
    return fast, full


def _per_event(stream: bytes, sep: bytes = b"\n\n") -> list[bytes]:
    return [e + sep for e in stream.split(sep) if e]


VARIANTS: dict[str, list[dict[str, Any]]] = {
    "chat": [{}, {"part": "reasoning_content"}, {"part": "tool"}, {"usage_null": True}],
    "responses": [{}, {"numbered": False}, {"numbered": False, "kind": "function_call"}],
}
STREAMS = [
    (api, style, sep, kw)
    for api in ("chat", "completions", "anthropic", "responses")
    for style in ("compact", "spaced")
    for sep in (b"\n\n", b"\r\n\r\n")
    for kw in VARIANTS.get(api, [{}])
]


@pytest.mark.parametrize(("api", "style", "sep", "kw"), STREAMS)
def test_every_split_of_a_stream_gives_the_full_ways_figures(
    api: str, style: str, sep: bytes, kw: dict[str, Any]
) -> None:
    stream = _stream(api, style, sep, **kw)
    _both(api, _per_event(stream, sep))
    _both(api, [stream])
    for cut in range(1, len(stream), 7):  # an event split across two chunks, everywhere
        _both(api, [stream[:cut], stream[cut:]])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.integers(min_value=1, max_value=len(_stream("chat", "compact", b"\n\n")) - 1),
        max_size=12,
    )
)
def test_any_cut_of_a_stream_into_chunks_matches_the_full_way(cuts: list[int]) -> None:
    stream = _stream("chat", "compact", b"\n\n")
    bounds = [0, *sorted(set(cuts)), len(stream)]
    chunks = [stream[a:b] for a, b in itertools.pairwise(bounds)]
    _both("chat", chunks)
    _both("chat", chunks, drop=True)


class Counting(StreamWatch):
    """A watch that counts the events it parsed (the full way)."""

    parsed = 0

    def _event(self, event: bytes, t_ns: int) -> bool:
        self.parsed += 1
        return super()._event(event, t_ns)


def _counted(api: str, events: list[bytes]) -> Counting:
    w = Counting(api, True)
    for i, e in enumerate(events):
        w.feed(e, 1000 + i)
    w.finish()
    return w


def test_a_chat_stream_learns_its_frame_and_reads_tokens_without_parsing() -> None:
    w = _counted("chat", _per_event(_stream("chat", "compact", b"\n\n")))
    assert w._frame is not None
    # hand-counted: 9 non-empty texts are tokens; their characters: 4+3+5+1+4+2+4+1+5
    assert len(w.token_times_ns) == 9 and w.reply_chars == 29
    assert (w.usage.prompt_tokens, w.usage.output_tokens) == (7, 9)
    assert w.parsed <= 6  # role, the first token, the empty text, finish, usage, [DONE]


def test_a_frame_that_changes_is_learned_again_and_one_that_never_repeats_is_given_up() -> None:
    def chunk(second: int, text: str) -> bytes:
        obj = {"id": "c", "created": second, "choices": [{"index": 0, "delta": {"content": text}}]}
        return _sse(_data(obj, "compact"))

    # a server that stamps each chunk with its second: 3 frames, each learned once
    stamped = [chunk(100 + i // 20, f" t{i}") for i in range(60)]
    w = _counted("chat", stamped)
    assert len(w.token_times_ns) == 60 and w.parsed == 3
    _both("chat", stamped)
    _both("chat", [b"".join(stamped)])
    # a new frame per event: a few tries, then every event is parsed and nothing is lost
    w = _counted("chat", [chunk(i, f" t{i}") for i in range(60)])
    assert len(w.token_times_ns) == 60 and w.parsed == 60 and w._learn == 0


def test_the_usage_event_the_client_did_not_ask_for_is_taken_out_and_nothing_else() -> None:
    stream = _stream("chat", "compact", b"\n\n")
    usage_event = next(e for e in _per_event(stream) if b'"usage"' in e)
    fast, _ = _both("chat", _per_event(stream), drop=True)
    sent = bytearray()
    w = StreamWatch("chat", True, drop_usage_event=True)
    for i, chunk in enumerate(_per_event(stream)):
        sent += w.feed(chunk, 1 + i) or b""
    sent += w.finish()
    assert bytes(sent) == stream.replace(usage_event, b"")
    assert fast.usage.output_tokens == 9


@pytest.mark.parametrize(
    "text",
    [b"bad\\x", b"\xff\xfe", b"ok\xed\xa0\x80", b'half" , "x'],
    ids=["bad-escape", "not-utf8", "surrogate", "quote-inside"],
)
def test_a_malformed_event_in_the_learned_frame_is_read_the_full_way(text: bytes) -> None:
    events = [_sse(p) for p in _chat_events("compact")[:4]]  # role, " tok", 'a"b', "line\n"
    head, tail = events[2].split(b'"a\\"b"')
    bad = head + b'"' + text + b'"' + tail
    for chunks in ([*events, bad, events[3]], [b"".join([*events, bad, events[3]])]):
        fast, full = _both("chat", chunks)
        assert fast._frame is not None
        assert fast.malformed == full.malformed == 1
        assert len(fast.token_times_ns) == 4

"""The token-frame fast path (``loadlab.clients._token_frame``) must change nothing but speed.

Every test here feeds one stream to two states, one that may learn the stream's token frame and
one that never does (``_learn = 0``, the full SSE decode and JSON parse for every event), and
requires identical records: timestamps, text, outcome, finish reason, token counts.
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadlab.clients import OpenAIStreamState
from loadlab.clients._http1 import Ended, ResponseReader
from loadlab.clients._sse import SSEDecoder
from loadlab.clients._state import StreamState
from loadlab.clients._transports import settle
from loadlab.records import RequestRecord
from tests.helpers.clients import sse_state


def _pair(kind: str) -> tuple[StreamState, StreamState]:
    fast, slow = sse_state(kind), sse_state(kind)
    slow._learn = 0
    return fast, slow


def _outcome(s: StreamState) -> tuple[Any, ...]:
    r = s.record
    return (
        r.outcome,
        r.error,
        r.chunk_ns,
        s.text,
        r.finish_reason,
        r.output_tokens,
        r.output_tokens_source,
        r.prompt_tokens,
    )


def _feed(reads: list[bytes], kind: str = "chat") -> tuple[StreamState, StreamState]:
    fast, slow = _pair(kind)
    for i, data in enumerate(reads):
        t = 2000 + 10 * i
        assert fast.on_bytes(data, t) == slow.on_bytes(data, t)
    fast.finish(9_000_000)
    slow.finish(9_000_000)
    assert _outcome(fast) == _outcome(slow)
    return fast, slow


def _chat(text: str | None, finish: str | None = None, *, spaced: bool = False) -> bytes:
    delta = {} if text is None else {"content": text}
    obj = {
        "id": "cmpl-1",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    sep = (", ", ": ") if spaced else (",", ":")
    return b"data: " + json.dumps(obj, separators=sep, ensure_ascii=False).encode() + b"\n\n"


def test_a_plain_stream_learns_its_frame_and_matches_the_full_parse() -> None:
    reads = [_chat(None)] + [_chat(f" t{i}") for i in range(20)] + [_chat(None, "stop")]
    fast, _ = _feed([*reads, b"data: [DONE]\n\n"])
    assert fast._tpl is not None  # learned, so most token reads went the fast way
    assert fast.text == "".join(f" t{i}" for i in range(20))


def test_a_dialect_subclass_without_slots_learns_through_a_scratch_copy() -> None:
    """The probe runs on a shallow copy; a subclass's instance attributes travel with it."""

    class Tagged(OpenAIStreamState):  # no __slots__: has a __dict__
        def __init__(self) -> None:
            super().__init__(RequestRecord("r"), "chat", t0_ns=0)
            self.tag = "kept"

        def _event(self, data: str, event: str, t_rel: int) -> bool:
            assert self.tag == "kept"  # the scratch copy has it too
            return super()._event(data, event, t_rel)

    s = Tagged()
    s.on_headers(200, {"Content-Type": "text/event-stream"}, 0)
    for i, data in enumerate([_chat(" a"), _chat(" b"), _chat(None, "stop"), b"data: [DONE]\n\n"]):
        s.on_bytes(data, 10 + i)
    s.finish(100)
    assert s._tpl is not None
    assert (s.record.outcome, s.text, s.record.chunk_ns) == ("ok", " a b", [10, 11])


def test_spaced_json_learns_too() -> None:
    fast, _ = _feed([_chat(f"w{i}", spaced=True) for i in range(5)] + [b"data: [DONE]\n\n"])
    assert fast._tpl is not None


def test_texts_that_need_escapes_or_change_the_frame_go_the_full_way() -> None:
    reads = [
        _chat("a"),
        _chat("b"),
        _chat('say "hi"'),  # a quote: escaped in JSON, not plain
        _chat("back\\slash"),
        _chat("tab\there"),
        _chat("é"),  # raw UTF-8 is plain
        b"data: " + json.dumps({"choices": [{"delta": {"content": "\u00e9"}}]}).encode() + b"\n\n",
        _chat("c", "length"),  # same shape but a finish reason: another frame
        _chat("d"),
        b'data: {"choices":[{"delta":{"content":"x"}}],"usage":{"completion_tokens":9}}\n\n',
        _chat("e") + _chat("f") + _chat("g"),  # several events in one read
        _chat("h")[:20],  # an event split across reads
        _chat("h")[20:] + _chat("i"),
        _chat(""),  # an empty text is not a token
        _chat("j"),
        b"data: [DONE]\n\n",
    ]
    fast, _ = _feed(reads)
    assert fast.record.finish_reason == "length"


def test_a_look_alike_text_elsewhere_in_the_event_is_not_taken_for_the_token() -> None:
    # the token's text escaped (\\u0061 is "a"), and an unrelated "content" holding it plainly:
    # a frame cut around that one would read the wrong field; the probe must refuse it
    def odd(other: str) -> bytes:
        return (
            b'data: {"choices":[{"delta":{"content":"\\u0061"}}],"x":{"content":"'
            + other.encode()
            + b'"}}\n\n'
        )

    fast, _ = _feed([odd("a"), odd("a"), odd("b"), odd("c"), b"data: [DONE]\n\n"])
    assert fast._tpl is None
    assert fast.text == "aaaa"


def test_an_error_event_in_the_frame_is_still_an_error() -> None:
    reads = [_chat("a"), _chat("b"), b'data: {"error": {"message": "boom"}}\n\n', _chat("c")]
    fast, _ = _feed(reads)
    assert fast.record.outcome == "stream_error"


def test_completions_and_anthropic_frames() -> None:
    def comp(text: str) -> bytes:
        return b'data: {"id":"c","choices":[{"text":"' + text.encode() + b'","index":0}]}\n\n'

    fast, _ = _feed([comp(f"x{i}") for i in range(6)] + [b"data: [DONE]\n\n"], "completions")
    assert fast._tpl is not None

    def delta(text: str) -> bytes:
        body = {"type": "content_block_delta", "index": 0}
        body["delta"] = {"type": "text_delta", "text": text}  # type: ignore[assignment]
        return b"event: content_block_delta\ndata: " + json.dumps(body).encode() + b"\n\n"

    start = b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":3}}}\n\n'
    stop = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    fast, _ = _feed([start] + [delta(f"y{i}") for i in range(6)] + [stop], "anthropic")
    assert fast._tpl is not None
    assert fast.record.prompt_tokens == 3


_TEXT = st.one_of(
    st.just(" tok"),  # the same text again and again, as a fixed server sends
    st.text(alphabet=st.sampled_from([*list('ab é"\\\n\t/'), "\u2028", "\x00"]), max_size=6),
)


@settings(max_examples=150, deadline=None)
@given(
    texts=st.lists(_TEXT, min_size=1, max_size=25),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=12),
    spaced=st.booleans(),
)
def test_any_texts_split_anywhere_match_the_full_parse(
    texts: list[str], cuts: list[int], spaced: bool
) -> None:
    body = b"".join(_chat(t, spaced=spaced) for t in texts) + _chat(None, "stop")
    body += b"data: [DONE]\n\n"
    # one read per event (the usual case), then the same stream re-split anywhere
    per_event = [_chat(t, spaced=spaced) for t in texts]
    _feed([*per_event, _chat(None, "stop"), b"data: [DONE]\n\n"])
    bounds = sorted({c % (len(body) + 1) for c in cuts} | {0, len(body)})
    _feed([body[a:b] for a, b in itertools.pairwise(bounds) if b > a])


def test_decoder_idle() -> None:
    d = SSEDecoder()
    assert not d.idle()  # at the start a byte-order mark may still come
    d.feed(b"data: a\n\n")
    assert d.idle()
    d.feed(b"data: b\n")  # a data line without its empty line: an event half built
    assert not d.idle()
    d.feed(b"\n")
    assert d.idle()
    d.feed(b"data: c")  # a partial line
    assert not d.idle()
    d.feed(b"\n\nretry: 5\n")
    assert not d.idle()
    d.feed(b"\n")
    assert d.idle()
    d.feed(b"data: d\n\r")  # a CR whose LF may follow
    assert not d.idle()


def test_a_stream_read_behind_learns_its_frame_from_reads_of_several_events() -> None:
    """Read late, a stream comes a few events a read (the role chunk with the first tokens,
    then tokens three at a time): its frame is learned from them all the same, and the later
    reads of several token events take the fast way."""
    events = [_chat(None)] + [_chat(f" t{i}") for i in range(30)] + [_chat(None, "stop")]
    events.append(b"data: [DONE]\n\n")
    reads = [b"".join(events[i : i + 3]) for i in range(0, len(events), 3)]
    fast, _ = _feed(reads)
    assert fast._tpl is not None


def test_texts_with_escapes_take_the_learned_frame() -> None:
    """A newline, a quote, a backslash or an escaped character in a token's text is unescaped
    by the JSON parser on the fast way: the same text as the full parse, and no tries spent."""
    texts = ["a", "b", "\n\n", 'say "hi"', "back\\slash", "tab\there", "\u00e9", "c", "\\"]
    reads = [_chat(t) for t in texts]
    reads.append(b'data: {"id":"cmpl-1","object":"chat.completion.chunk","model":"m",'
                 b'"choices":[{"index":0,"delta":{"content":"\\u00e9\\ud83d\\ude00"},'
                 b'"finish_reason":null}]}\n\n')  # fmt: skip
    reads.append(b"data: [DONE]\n\n")
    fast, _ = _feed(reads)
    assert fast._tpl is not None and fast._learn == 2  # learned at the first token, no try spent
    assert fast.text == "".join(texts) + "\u00e9\U0001f600"


def test_a_text_whose_closing_quote_is_escaped_away_goes_the_full_way() -> None:
    """``"a\\"`` then the frame's tail: the quote that looks like the string's end is escaped,
    so the event is not the frame (here it is not even JSON): the full way decides."""
    bad = (
        _chat("a")[: -len(b'"},"finish_reason":null}]}\n\n')] + b'\\"},"finish_reason":null}]}\n\n'
    )
    fast, _ = _feed([_chat("x"), _chat("y"), bad, b"data: [DONE]\n\n"])
    assert fast.record.outcome == "protocol_error"


def test_a_long_text_that_is_not_the_frame_is_given_up_in_linear_time() -> None:
    """100 kB of text with escapes and no closing tail: the frame's patterns give it up at
    once (no retrying over every split of the text), and the full way reads it."""
    body = 'ab\\"c' * 20_000  # plain bytes and escaped pairs, over and over
    event = _chat("x")[: -len(b'"},"finish_reason":null}]}\n\n')] + body.encode()
    event += b'"},"finish_reason":null,"more":1}]}\n\n'  # not the learned tail
    started = time.monotonic()
    fast, _ = _feed([_chat("x"), _chat("y"), event, b"data: [DONE]\n\n"])
    assert time.monotonic() - started < 5.0  # linear: milliseconds; backtracking: forever
    assert fast.text.endswith('ab"c')  # each escaped pair, unescaped


class _ReaderWithoutFrame(ResponseReader):
    """A reader that never takes the sink's chunk frame: every read goes to ``on_bytes``."""

    @property  # type: ignore[override]
    def frame(self) -> None:
        return None

    @frame.setter
    def frame(self, _value: object) -> None:
        pass


_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _through_reader(reader: ResponseReader, reads: list[bytes]) -> tuple[Any, ...]:
    state = OpenAIStreamState(RequestRecord("r"), "chat", t0_ns=1000)
    result = reader.start(state, Ended())
    for i, data in enumerate(reads):
        reader.feed(data, 2000 + 10 * i)
    if reader.sink is not None:
        reader.connection_lost(None)
    settle(state, result)
    return _outcome(state)


def _chunk(event: bytes, size_line: bytes | None = None) -> bytes:
    return (size_line or b"%x" % len(event)) + b"\r\n" + event + b"\r\n"


@pytest.mark.parametrize(
    "odd",
    [
        _chunk(_chat(" tok"), b"%X" % len(_chat(" tok"))),  # upper-case hex, a valid size line
        _chunk(_chat(" tok"), b"0%x" % len(_chat(" tok"))),  # a leading zero, valid too
        _chunk(_chat(" tok"))[:-2] + b"\r\n" + _chunk(_chat(" x")),  # two whole chunks
        _chunk(_chat(' "a\\nb"')),  # escapes, unescaped by the JSON parser
        _chunk(_chat(" tok")).replace(b" tok", b" t\xffk"),  # not UTF-8
        _chunk(_chat(" tok"), b"%x" % (len(_chat(" tok")) + 1)),  # a size that lies: too long
        _chunk(_chat(" tok"), b"%x" % (len(_chat(" tok")) - 1)),  # too short
        _chunk(_chat(" tok")) + b"0\r\n\r\n",  # the last chunk in the same read
        _chunk(_chat(" tok"))[:-1],  # a chunk cut short
        _chunk(_chat(" a")) + _chunk(_chat(" b")) + _chunk(_chat(" c"))[:9],  # a backlog, cut
        _chunk(_chat(" a")) + _chunk(_chat(None, "stop")) + _chunk(_chat(" c")),
        _chunk(_chat(" a")) + _chunk(_chat(" b"), b"%x" % (len(_chat(" b")) + 2)) + b"\r\n",
        _chunk(_chat(" a")) + _chunk(_chat(' "b"')) + _chunk(_chat(" c\xff")),
        _chunk(_chat(" a" * 3000)) + _chunk(_chat(" b")),  # a chunk over the table's sizes
    ],
)
def test_the_readers_chunk_frame_changes_nothing_but_speed(odd: bytes) -> None:
    """The HTTP reader takes a whole chunk in the stream's learned frame itself
    (``ResponseReader.feed``); for any read, the record is the one ``on_bytes`` makes."""
    tokens = [_chunk(_chat(f" t{i}")) for i in range(6)]
    reads = [_HEAD + _chunk(_chat(None)), *tokens, odd, *tokens, _chunk(_chat(None, "stop"))]
    reads += [_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"]
    framed, plain = ResponseReader(), _ReaderWithoutFrame()
    assert _through_reader(framed, reads) == _through_reader(plain, reads)


def test_the_reader_takes_token_chunks_without_calling_the_sink() -> None:
    tokens = [_chunk(_chat(f" t{i}")) for i in range(20)]
    reads = [_HEAD + _chunk(_chat(None)), *tokens, _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"]
    state = OpenAIStreamState(RequestRecord("r"), "chat", t0_ns=1000)
    reader = ResponseReader()
    reader.start(state, Ended())
    seen = []
    on_bytes = state.on_bytes

    class Spy:  # counts the reads that reach the state
        def __getattr__(self, name: str) -> Any:
            return getattr(state, name)

        def on_bytes(self, data: bytes, t_ns: int) -> bool:
            seen.append(data)
            return on_bytes(data, t_ns)

    reader.sink = Spy()  # type: ignore[assignment]
    for i, data in enumerate(reads):
        reader.feed(data, 2000 + 10 * i)
    state.finish(9_000)
    assert state.text == "".join(f" t{i}" for i in range(20))
    assert state.record.chunk_ns == [1000 + 10 * i for i in range(1, 21)]
    assert len(seen) < 6  # the role chunk and the frame's learning, then the end

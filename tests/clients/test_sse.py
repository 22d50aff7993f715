"""SSE decoder: every WHATWG syntax variant, and re-splitting at any byte offset."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadlab.clients._sse import SSEDecoder, SSEEvent, SSELimitError


def decode(*parts: bytes) -> list[SSEEvent]:
    dec = SSEDecoder()
    out: list[SSEEvent] = []
    for p in parts:
        out += dec.feed(p)
    out += dec.close()
    return out


def test_openai_style_stream() -> None:
    body = b'data: {"x": 1}\n\ndata: {"x": 2}\n\ndata: [DONE]\n\n'
    assert [e.data for e in decode(body)] == ['{"x": 1}', '{"x": 2}', "[DONE]"]


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"])
def test_line_ends(eol: bytes) -> None:
    body = b"data: a" + eol + b"data: b" + eol + eol + b"data: c" + eol + eol
    assert decode(body) == [SSEEvent("a\nb"), SSEEvent("c")]


def test_crlf_split_across_feeds_is_one_line_end() -> None:
    # "data: a\r" | "\n\r\n": if the LF were a second line end, "a" would dispatch early
    # and the later CRLF would be an extra (harmless) blank; check with a data line after it.
    assert decode(b"data: a\r", b"\ndata: b\r\n\r\n") == [SSEEvent("a\nb")]


def test_lone_cr_then_other_byte() -> None:
    assert decode(b"data: a\r", b"data: b\r\r") == [SSEEvent("a\nb")]


def test_comments_and_keepalives_are_ignored() -> None:
    assert decode(b": keep-alive\n\n:\ndata: x\n: mid\n\n") == [SSEEvent("x")]


def test_data_with_and_without_space() -> None:
    # exactly one leading space is dropped, no more
    assert decode(b"data:x\n\ndata: y\n\ndata:  z\n\n") == [
        SSEEvent("x"),
        SSEEvent("y"),
        SSEEvent(" z"),
    ]


def test_multiline_data_and_empty_data() -> None:
    assert decode(b"data: a\ndata:\ndata\ndata: b\n\n") == [SSEEvent("a\n\n\nb")]
    assert decode(b"data:\n\n") == [SSEEvent("")]


def test_event_id_retry_fields() -> None:
    body = b"event: error\nid: 7\nretry: 1500\ndata: {}\n\ndata: next\n\n"
    assert decode(body) == [SSEEvent("{}", "error", "7", 1500), SSEEvent("next", "message", "7")]


def test_id_with_nul_is_ignored_and_empty_id_resets() -> None:
    assert decode(b"id: 1\ndata: a\n\nid: x\x00y\ndata: b\n\nid\ndata: c\n\n") == [
        SSEEvent("a", id="1"),
        SSEEvent("b", id="1"),
        SSEEvent("c", id=None),
    ]


def test_bad_retry_is_ignored_and_unknown_fields_too() -> None:
    dec = SSEDecoder()
    assert dec.feed(b"retry: 10x\nfoo: bar\ndata: a\n\n") == [SSEEvent("a")]
    assert dec.retry_ms is None


def test_block_without_data_dispatches_nothing() -> None:
    assert decode(b"event: ping\n\nid: 3\n\n") == []


def test_bom_at_start_only_and_split() -> None:
    bom = b"\xef\xbb\xbf"
    assert decode(bom + b"data: a\n\n") == [SSEEvent("a")]
    assert decode(bom[:1], bom[1:2], bom[2:] + b"data: a\n\n") == [SSEEvent("a")]
    # a BOM later in the stream is not skipped
    later = decode(b"data: a\n\n" + bom + b"data: b\n\n")
    assert later == [SSEEvent("a")]  # "\ufeffdata" is an unknown field name, so ignored


def test_one_whole_event_per_feed_from_the_stream_start() -> None:
    """The one-event fast path also serves the first feed (after the BOM check) and a feed
    after a split CRLF, but never a feed that completes a partial line."""
    bom = b"\xef\xbb\xbf"
    assert decode(b"data: a\n\n", b"data: b\n\n") == [SSEEvent("a"), SSEEvent("b")]
    assert decode(bom + b"data: a\n\n") == [SSEEvent("a")]
    assert decode(b"data: a\r", b"\n\r\n", b"data: b\n\n") == [SSEEvent("a"), SSEEvent("b")]
    # "data: x" is pending: the next feed looks like one whole event but continues that line
    assert decode(b"data: x", b"data: y\n\n", b"data: z\n\n") == [
        SSEEvent("xdata: y"),
        SSEEvent("z"),
    ]
    assert decode(b"da", b"ta: y\n\n", b"data: z\n\n") == [SSEEvent("y"), SSEEvent("z")]
    assert decode(b"event: e\n", b"data: y\n\n") == [SSEEvent("y", event="e")]
    raw = SSEDecoder().feed_raw(b"data: a\n\n")
    assert raw == [("a", "message", None, None)]


def test_split_inside_multibyte_utf8() -> None:
    body = "data: héllo 🙂 世界\n\n".encode()
    for i in range(len(body) + 1):
        assert decode(body[:i], body[i:]) == [SSEEvent("héllo 🙂 世界")], i


def test_unterminated_event_is_discarded_at_close() -> None:
    dec = SSEDecoder()
    assert dec.feed(b"data: a\n\ndata: [DONE]") == [SSEEvent("a")]
    assert dec.close() == []
    assert dec.discarded
    clean = SSEDecoder()
    clean.feed(b"data: a\n\n")
    clean.close()
    assert not clean.discarded


def test_invalid_utf8_becomes_replacement_char() -> None:
    assert decode(b"data: a\xffb\n\n") == [SSEEvent("a\ufffdb")]


# ------------------------------------------------------------ property: any split, same events

_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\x00"),
    max_size=12,
)
_event = st.tuples(
    st.lists(_text, min_size=1, max_size=3),  # data lines
    st.one_of(st.none(), st.text(alphabet="abcxyz_", min_size=1, max_size=6)),  # event type
    st.one_of(st.none(), st.text(alphabet="0123456789", min_size=1, max_size=4)),  # id
    st.booleans(),  # a comment line before it
)


@st.composite
def transcripts(draw: st.DrawFn) -> tuple[bytes, list[SSEEvent]]:
    """A valid stream and the events it must decode to, with mixed LF / CR / CRLF line ends."""
    out: list[str] = ["\ufeff"] if draw(st.booleans()) else []
    prev_eol = ""

    def eol() -> str:
        nonlocal prev_eol
        e = draw(st.sampled_from(["\n", "\r", "\r\n"]))
        if prev_eol == "\r" and e == "\n":
            e = "\r\n"  # a CR then an LF would be one line end, not two
        prev_eol = e
        return e

    expected: list[SSEEvent] = []
    last_id: str | None = None
    for data_lines, etype, eid, comment in draw(st.lists(_event, max_size=6)):
        if comment:
            out.append(": keep-alive" + eol())
        if etype is not None:
            out.append(f"event: {etype}" + eol())
        if eid is not None:
            out.append(f"id:{eid}" + eol())
            last_id = eid
        values = []
        for line in data_lines:
            if draw(st.booleans()):
                out.append("data: " + line + eol())
                values.append(line)
            else:  # no space after the colon: a value's own leading space would be dropped
                out.append("data:" + line.lstrip(" ") + eol())
                values.append(line.lstrip(" "))
        out.append(eol())
        expected.append(SSEEvent("\n".join(values), etype or "message", last_id))
    return "".join(out).encode(), expected


@settings(max_examples=100, deadline=None)
@given(transcripts(), st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_resplit_at_random_offsets_gives_identical_events(
    tr: tuple[bytes, list[SSEEvent]], cuts: list[int]
) -> None:
    body, expected = tr
    whole = decode(body)
    assert whole == expected
    offsets = sorted({min(c, len(body)) for c in cuts})
    parts = [body[a:b] for a, b in zip([0, *offsets], [*offsets, len(body)], strict=True)]
    assert decode(*parts) == whole
    # byte by byte as the worst case
    assert decode(*[body[i : i + 1] for i in range(len(body))]) == whole


def _feed_until_refused(dec: SSEDecoder, pieces: list[bytes]) -> int:
    """Feeds ``pieces`` in order; returns how many were taken before SSELimitError."""
    for i, piece in enumerate(pieces):
        try:
            dec.feed_raw(piece)
        except SSELimitError as exc:
            assert "--max-event-bytes" in str(exc)
            return i
    raise AssertionError("the limit was never hit")


def test_a_line_over_the_limit_is_refused_as_soon_as_it_passes_it() -> None:
    """A 100 MB line would take 490 MB and 14 s if each read re-joined the whole line: it is
    refused in the read that takes it past the limit, and its bytes are let go."""
    dec = SSEDecoder(max_bytes=1 << 20)
    pieces = [b"data: "] + [b"x" * (64 << 10)] * 1600  # a 100 MB line in 64 KiB reads
    taken = _feed_until_refused(dec, pieces)
    assert taken == 16  # 6 + 16 x 64 KiB > 1 MiB
    assert dec.idle()  # nothing held any more


def test_an_event_of_many_short_lines_over_the_limit_is_refused() -> None:
    dec = SSEDecoder(max_bytes=4096)
    assert dec.feed(b"data: " + b"y" * 3000 + b"\n\n") != []  # under: dispatched
    taken = _feed_until_refused(dec, [b"data: " + b"z" * 100 + b"\n"] * 100)
    assert taken == 40  # 41 lines of 101 characters > 4096


def test_one_read_holding_a_whole_line_over_the_limit_is_refused() -> None:
    dec = SSEDecoder(max_bytes=2048)
    with pytest.raises(SSELimitError):
        dec.feed(b": hi\n\ndata: " + b"w" * 5000 + b"\n\n")
    with pytest.raises(ValueError, match="1024"):
        SSEDecoder(max_bytes=10)

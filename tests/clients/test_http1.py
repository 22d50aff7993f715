"""The sans-I/O response reader: framing split at every byte gives the same body."""

from __future__ import annotations

import time

import pytest

from loadlab.clients._http1 import Done, Ended, Failure, ResponseReader, Target
from tests.helpers.clients import Sink


def parse(*parts: bytes) -> tuple[Sink, ResponseReader, Done]:
    reader, sink, done = ResponseReader(), Sink(), Ended()
    reader.start(sink, done)
    for p in parts:
        reader.feed(p, time.perf_counter_ns())
    return sink, reader, done


CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"6\r\ndata: \r\n" + b"b;ext=1\r\nhello world\r\n" + b"0\r\nX-Trailer: 1\r\n\r\n"
)


def test_chunked_with_extension_and_trailer_split_everywhere() -> None:
    for i in range(len(CHUNKED) + 1):
        for j in range(i, len(CHUNKED) + 1, 7):
            sink, reader, done = parse(CHUNKED[:i], CHUNKED[i:j], CHUNKED[j:])
            assert (sink.status, sink.body) == (200, b"data: hello world"), (i, j)
            assert sink.headers.get("content-type") == "text/event-stream"
            assert done.done() and reader.result.error is None and reader.reusable


def test_content_length_body_and_interim_100() -> None:
    raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 429 Too Many\r\nRetry-After: 7\r\nContent-Length: 5\r\n\r\nslow!"
    sink, reader, done = parse(raw[:30], raw[30:])
    assert (sink.status, sink.body, sink.headers.get("Retry-After")) == (429, b"slow!", "7")
    assert done.done() and reader.reusable


def test_close_delimited_body_ends_ok_at_close() -> None:
    sink, reader, done = parse(b"HTTP/1.0 200 OK\r\n\r\nabc", b"def")
    assert not done.done()
    reader.connection_lost(None)
    assert sink.body == b"abcdef" and reader.result.error is None and not reader.reusable


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", Failure.PROTOCOL),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n", Failure.PROTOCOL),
        # a signed size (int() takes one) is not hex digits: whole read, or split from its head
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-2\r\n", Failure.PROTOCOL),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\nabc\r\n", Failure.PROTOCOL),
        (b"SSH-2.0-OpenSSH\r\n\r\n", Failure.PROTOCOL),
    ],
)
def test_bad_framing_is_a_protocol_error(raw: bytes, error: Failure) -> None:
    _, reader, done = parse(raw)
    assert done.done() and reader.result.error is error
    cut = raw.index(b"\r\n\r\n") + 4  # the body as its own read (the one-chunk fast path)
    _, reader, done = parse(raw[:cut], raw[cut:])
    assert done.done() and reader.result.error is error


def test_cut_mid_body_is_incomplete_and_before_head_is_readerect() -> None:
    _, reader, _ = parse(CHUNKED[:100])
    reader.connection_lost(ConnectionResetError("reset"))
    assert reader.result.error is Failure.INCOMPLETE
    _, reader, _ = parse(b"HTTP/1.1 20")
    reader.connection_lost(None)
    assert reader.result.error is Failure.CONNECT


def test_target_and_request_head() -> None:
    t = Target.from_url("https://api.example.com/v1/chat/completions")
    assert (t.host, t.port, t.tls, t.path) == ("api.example.com", 443, True, "/v1/chat/completions")
    head = Target.from_url("http://127.0.0.1:8000/v1/completions").request_head({"A": "b"})
    assert head == b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nA: b\r\n"
    with pytest.raises(ValueError, match="http:// or https://"):
        Target.from_url("ftp://x")


def test_whole_chunks_of_one_read_reach_the_sink_in_one_call() -> None:
    calls: list[bytes] = []

    class Counting(Sink):
        def on_bytes(self, data: bytes, t_ns: int) -> bool:
            calls.append(data)
            return super().on_bytes(data, t_ns)

    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunks = b"".join(b"%x\r\ndata: %d\n\n\r\n" % (len(b"data: %d\n\n" % i), i) for i in range(12))
    reader, sink, done = ResponseReader(), Counting(), Ended()
    reader.start(sink, done)
    reader.feed(head, 1)
    reader.feed(chunks + b"6\r\nda", 2)  # 12 whole chunks and the start of another
    assert calls == [b"".join(b"data: %d\n\n" % i for i in range(12)) + b"da"]
    reader.feed(b"ta: \r\n0\r\n\r\n", 3)
    assert calls[1:] == [b"ta: "] and done.done() and reader.result.error is None

"""The raw transport's response parser: framing split at every byte gives the same body."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Mapping

import pytest

from loadlab.clients import rawhttp
from loadlab.clients.rawhttp import Target, _Conn, _Deferred


class Sink:
    def __init__(self) -> None:
        self.status = 0
        self.headers: Mapping[str, str] = {}
        self.body = b""

    def on_headers(self, status: int, headers: Mapping[str, str], t_ns: int) -> None:
        self.status, self.headers = status, headers

    def on_bytes(self, data: bytes, t_ns: int) -> bool:
        self.body += data
        return False


def parse(*parts: bytes) -> tuple[Sink, _Conn, asyncio.Future[None]]:
    loop = asyncio.new_event_loop()
    try:
        conn, sink, done = _Conn(), Sink(), loop.create_future()
        conn.start(sink, done)
        for p in parts:
            conn.data_received(p)
        return sink, conn, done
    finally:
        loop.close()


CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"6\r\ndata: \r\n" + b"b;ext=1\r\nhello world\r\n" + b"0\r\nX-Trailer: 1\r\n\r\n"
)


def test_chunked_with_extension_and_trailer_split_everywhere() -> None:
    for i in range(len(CHUNKED) + 1):
        for j in range(i, len(CHUNKED) + 1, 7):
            sink, conn, done = parse(CHUNKED[:i], CHUNKED[i:j], CHUNKED[j:])
            assert (sink.status, sink.body) == (200, b"data: hello world"), (i, j)
            assert sink.headers.get("content-type") == "text/event-stream"
            assert done.done() and conn.result.error is None and conn.reusable


def test_content_length_body_and_interim_100() -> None:
    raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 429 Too Many\r\nRetry-After: 7\r\nContent-Length: 5\r\n\r\nslow!"
    sink, conn, done = parse(raw[:30], raw[30:])
    assert (sink.status, sink.body, sink.headers.get("Retry-After")) == (429, b"slow!", "7")
    assert done.done() and conn.reusable


def test_close_delimited_body_ends_ok_at_close() -> None:
    sink, conn, done = parse(b"HTTP/1.0 200 OK\r\n\r\nabc", b"def")
    assert not done.done()
    conn.connection_lost(None)
    assert sink.body == b"abcdef" and conn.result.error is None and not conn.reusable


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "protocol"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n", "protocol"),
        # a signed size (int() takes one) is not hex digits: whole read, or split from its head
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-2\r\n", "protocol"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\nabc\r\n", "protocol"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", "protocol"),
    ],
)
def test_bad_framing_is_a_protocol_error(raw: bytes, error: str) -> None:
    _, conn, done = parse(raw)
    assert done.done() and conn.result.error == error
    cut = raw.index(b"\r\n\r\n") + 4  # the body as its own read (the one-chunk fast path)
    _, conn, done = parse(raw[:cut], raw[cut:])
    assert done.done() and conn.result.error == error


def test_cut_mid_body_is_incomplete_and_before_head_is_connect() -> None:
    _, conn, _ = parse(CHUNKED[:100])
    conn.connection_lost(ConnectionResetError("reset"))
    assert conn.result.error == "incomplete"
    _, conn, _ = parse(b"HTTP/1.1 20")
    conn.connection_lost(None)
    assert conn.result.error == "connect"


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
    loop = asyncio.new_event_loop()
    try:
        conn, sink, done = _Conn(), Counting(), loop.create_future()
        conn.start(sink, done)
        conn.data_received(head)
        conn.data_received(chunks + b"6\r\nda")  # 12 whole chunks and the start of another
        assert calls == [b"".join(b"data: %d\n\n" % i for i in range(12)) + b"da"]
        conn.data_received(b"ta: \r\n0\r\n\r\n")
        assert calls[1:] == [b"ta: "] and done.done() and conn.result.error is None
    finally:
        loop.close()


def test_deferred_reads_are_stamped_at_once_and_parsed_in_order_later() -> None:
    class Timed(Sink):
        def __init__(self) -> None:
            super().__init__()
            self.times: list[int] = []

        def on_bytes(self, data: bytes, t_ns: int) -> bool:
            self.times.append(t_ns)
            return super().on_bytes(data, t_ns)

    loop = asyncio.new_event_loop()
    try:
        deferred = _Deferred(loop)
        a, b = _Conn(deferred), _Conn(deferred)
        sa, sb = Timed(), Timed()
        da, db = loop.create_future(), loop.create_future()
        a.start(sa, da)
        b.start(sb, db)
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        a.data_received(head + b"3\r\none\r\n")
        b.data_received(head + b"3\r\ntwo\r\n")
        stamped = a.last_ns
        assert stamped and b.last_ns >= stamped  # stamped as read...
        assert sa.body == sb.body == b"" and len(deferred.items) == 2  # ...parsed later
        loop.call_soon(loop.stop)
        loop.run_forever()  # one loop turn: the flush ran
        assert (sa.body, sb.body) == (b"one", b"two") and sa.times == [stamped]
        a.data_received(b"5\r\nthree\r\n0\r\n\r\n")
        a.connection_lost(None)  # its queued bytes are parsed before the close counts
        assert sa.body == b"onethree" and da.done() and a.result.error is None
        b.data_received(b"2\r\nfo")
        b.connection_lost(None)
        assert sb.body == b"twofo" and b.result.error == "incomplete"
    finally:
        loop.close()


def test_parsing_is_sliced_so_the_loop_polls_between_slices() -> None:
    """With a zero slice, each loop turn parses one read and leaves the rest, in order, to the
    next turn; a backlog older than the cap is parsed in one go."""
    loop = asyncio.new_event_loop()
    try:
        deferred = _Deferred(loop, slice_ns=0, max_lag_ns=10**12)
        conns = [_Conn(deferred) for _ in range(3)]
        sinks = [Sink() for _ in conns]
        for c, sk in zip(conns, sinks, strict=True):
            c.start(sk, loop.create_future())
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        for i, c in enumerate(conns):
            c.data_received(head + b"1\r\n%d\r\n" % i)
        conns[0].data_received(b"1\r\nx\r\n")  # a second read of the first stream: parsed last
        assert rawhttp.parse_backlog_ms(loop) > 0.0  # four reads wait to be parsed
        bodies = []
        for _ in range(4):
            loop.call_soon(loop.stop)
            loop.run_forever()  # one turn: one read parsed
            bodies.append([sk.body for sk in sinks])
        assert bodies == [
            [b"0", b"", b""],
            [b"0", b"1", b""],
            [b"0", b"1", b"2"],
            [b"0x", b"1", b"2"],
        ]
        assert not deferred.items and not deferred._scheduled

        old = _Deferred(loop, slice_ns=0, max_lag_ns=0)  # everything waiting is past the cap
        more = [_Conn(old) for _ in range(3)]
        more_sinks = [Sink() for _ in more]
        for c, sk in zip(more, more_sinks, strict=True):
            c.start(sk, loop.create_future())
            c.data_received(head + b"1\r\nz\r\n")
        loop.call_soon(loop.stop)
        loop.run_forever()
        assert [sk.body for sk in more_sinks] == [b"z"] * 3 and not old.items
    finally:
        loop.close()


def test_the_loops_parse_queue_reports_its_oldest_read() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert rawhttp.parse_backlog_ms(loop) == 0.0  # no raw connection yet
        deferred = _Deferred(loop)  # a pool's parse queue
        conn = _Conn(deferred)
        conn.start(Sink(), loop.create_future())
        conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
        time.sleep(0.003)
        assert rawhttp.parse_backlog_ms(loop) >= 3.0  # stamped, not yet parsed
        await asyncio.sleep(0)
        assert rawhttp.parse_backlog_ms(loop) == 0.0

    asyncio.run(main())


def test_a_response_parsed_late_ends_at_the_stamp_of_its_last_read() -> None:
    loop = asyncio.new_event_loop()
    try:
        deferred = _Deferred(loop)
        conn, done = _Conn(deferred), loop.create_future()
        result = conn.start(Sink(), done)
        conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        stamped = conn.last_ns
        time.sleep(0.003)  # the parse runs later (a backlog)
        loop.call_soon(loop.stop)
        loop.run_forever()
        assert done.done() and result.error is None and result.end_ns == stamped
        late = _Conn(deferred)
        late_result = late.start(Sink(), loop.create_future())
        late.end("timeout", "no byte")  # ended by a timer, not by a read: now
        assert late_result.end_ns is not None and late_result.end_ns > stamped + 2_000_000
    finally:
        loop.close()


def test_a_finished_loop_leaves_no_parse_queue_behind() -> None:
    async def main() -> None:
        queue = _Deferred(asyncio.get_running_loop())
        assert queue in rawhttp._QUEUES

    gc.collect()  # earlier tests' queues
    before = len(rawhttp._QUEUES)
    for _ in range(3):
        asyncio.run(main())
    gc.collect()
    assert len(rawhttp._QUEUES) == before

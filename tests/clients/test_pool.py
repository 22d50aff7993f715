"""The asyncio side: connections stamp reads at once; the parse queue parses them later, in
order and in slices."""

from __future__ import annotations

import asyncio
import gc
import time

from loadlab.clients import _pool as pool
from loadlab.clients._gate import SendGate
from loadlab.clients._http1 import Failure, Target, frame_request
from loadlab.clients._pool import _Conn, _Deferred
from tests.helpers.clients import Sink


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
        # A slice no loaded machine ends: one turn parses both reads (with the default slice,
        # a descheduled parse of the first read left the second to the next turn at load 3.4;
        # slicing has its own test below).
        deferred = _Deferred(loop, slice_ns=60 * 10**9)
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
        assert sb.body == b"twofo" and b.result.error is Failure.INCOMPLETE
    finally:
        loop.close()


def test_parsing_is_sliced_so_the_loop_polls_between_slices() -> None:
    """With a zero slice, each loop turn parses one read and leaves the rest, in order, to the
    next turn; a backlog older than the cap is parsed in one go."""
    loop = asyncio.new_event_loop()
    try:
        deferred = _Deferred(loop, slice_ns=0, max_lag_ns=10**12, clock_every=1)
        conns = [_Conn(deferred) for _ in range(3)]
        sinks = [Sink() for _ in conns]
        for c, sk in zip(conns, sinks, strict=True):
            c.start(sk, loop.create_future())
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        for i, c in enumerate(conns):
            c.data_received(head + b"1\r\n%d\r\n" % i)
        conns[0].data_received(b"1\r\nx\r\n")  # a second read of the first stream: parsed last
        assert pool.parse_backlog_ms(loop) > 0.0  # four reads wait to be parsed
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
        assert not deferred.items

        old = _Deferred(
            loop, slice_ns=0, max_lag_ns=0, clock_every=1
        )  # everything waiting is past the cap
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
        assert pool.parse_backlog_ms(loop) == 0.0  # no raw connection yet
        deferred = _Deferred(loop)  # a pool's parse queue
        conn = _Conn(deferred)
        conn.start(Sink(), loop.create_future())
        conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
        time.sleep(0.003)
        assert pool.parse_backlog_ms(loop) >= 3.0  # stamped, not yet parsed
        await asyncio.sleep(0)
        assert pool.parse_backlog_ms(loop) == 0.0

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
        late.end(Failure.TIMEOUT, "no byte")  # ended by a timer, not by a read: now
        assert late_result.end_ns is not None and late_result.end_ns > stamped + 2_000_000
    finally:
        loop.close()


def test_a_finished_loop_leaves_no_parse_queue_behind() -> None:
    async def main() -> None:
        queue = _Deferred(asyncio.get_running_loop())
        assert queue in pool._QUEUES

    gc.collect()  # earlier tests' queues
    before = len(pool._QUEUES)
    for _ in range(3):
        asyncio.run(main())
    gc.collect()
    assert len(pool._QUEUES) == before


def test_a_kept_alive_connection_the_server_closed_is_retried_once_on_a_fresh_one() -> None:
    """The server answers the first request and keeps the connection; the second request on it
    finds it closed without a byte (the server dropped it as idle): a stale connection, sent
    once more on a new one."""
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    seen: list[int] = []  # per request: the number of the connection it came on

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn_no = len(set(seen)) + 1
        while await reader.readuntil(b"\r\n\r\n"):
            await reader.readexactly(2)  # the body: {}
            seen.append(conn_no)
            if conn_no == 1 and seen.count(1) == 2:
                break  # the idle connection's second request: closed unanswered
            writer.write(ok)
            await writer.drain()
        writer.close()

    async def main() -> tuple[list[Failure | None], list[bool]]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        target = Target("127.0.0.1", port, False, "/")
        request = frame_request(target.request_head({}), "r", b"{}")
        raw, sinks = pool.RawPool(), [Sink(), Sink()]
        results = [
            await raw.request(target, request, s, timeout_s=5.0, read_timeout_s=5.0) for s in sinks
        ]
        raw.close()
        server.close()
        await server.wait_closed()
        assert [s.body for s in sinks] == [b"ok", b"ok"]
        return [r.error for r in results], [r.stale for r in results]

    errors, stale = asyncio.run(main())
    assert errors == [None, None] and stale == [False, False]
    assert seen == [1, 1, 2]  # the second request went out twice: on the stale and a fresh one


def test_a_connection_closed_while_its_request_waited_for_the_gate_is_replaced() -> None:
    """A request takes a connection ahead of its send time; the server closes that one before
    the gate fires (an idle timeout): the request goes out on a fresh connection, once, when
    the gate fires, and never before."""
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    connections: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections) + 1)
        if len(connections) > 1:  # the first is closed at once, unread
            await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(2)
            writer.write(ok)
            await writer.drain()
        writer.close()

    async def main() -> tuple[Failure | None, int, int]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        target = Target("127.0.0.1", port, False, "/")
        request = frame_request(target.request_head({}), "r", b"{}")
        raw, sink, gate = pool.RawPool(), Sink(), SendGate()
        task = asyncio.ensure_future(
            raw.request(target, request, sink, timeout_s=5.0, read_timeout_s=5.0, gate=gate)
        )
        await asyncio.sleep(0.3)  # the server has closed the connection the request holds
        fired = time.perf_counter_ns()
        gate.fire()
        result = await task
        raw.close()
        server.close()
        await server.wait_closed()
        assert sink.body == b"ok"
        return result.error, (result.sent_ns or 0) - fired, len(connections)

    error, sent_after_fire, count = asyncio.run(main())
    assert error is None and sent_after_fire >= 0 and count == 2


def test_a_spare_connection_is_opened_ahead_and_the_next_request_goes_out_on_it() -> None:
    """``preconnect`` opens one connection when none is idle (and only one while it opens);
    the request that follows is sent on it without a connect of its own; a capped pool opens
    no spare."""
    accepted: list[int] = []

    async def main() -> None:
        server, target, request = await _ok_server(accepted)
        raw = pool.RawPool()
        spare = raw.preconnect(target, 5.0)
        assert spare is not None and raw.preconnect(target, 5.0) is None  # one at a time
        await spare
        assert raw.preconnect(target, 5.0) is None  # one is idle: nothing more
        connects = 0
        connect = raw._connect

        async def counted(*args: object) -> object:
            nonlocal connects
            connects += 1
            return await connect(*args)  # type: ignore[arg-type]

        raw._connect = counted  # type: ignore[method-assign, assignment]
        sink = Sink()
        result = await raw.request(target, request, sink, timeout_s=5.0, read_timeout_s=5.0)
        assert result.error is None and sink.body == b"ok" and connects == 0
        assert pool.RawPool(max_connections=4).preconnect(target, 5.0) is None
        raw.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())
    assert len(accepted) == 1


def test_a_request_leaves_no_reference_cycle_behind() -> None:
    """A run freezes its heap now and then (``loadlab._runner.runner._freeze_every``), so a
    cycle made by a request waits for the run's end: 60 requests, plain and through a gate,
    leave none (each left 13 objects in one before: its read timer's callback held itself)."""

    async def main() -> int:
        server, target, request = await _ok_server()
        raw = pool.RawPool()
        await raw.request(target, request, Sink(), timeout_s=5.0, read_timeout_s=5.0)
        gc.collect()
        gc.disable()
        try:
            for i in range(60):
                gate = SendGate() if i % 2 else None
                if gate is not None:
                    asyncio.get_running_loop().call_soon(gate.fire)
                res = await raw.request(
                    target, request, Sink(), timeout_s=5.0, read_timeout_s=5.0, gate=gate
                )
                assert res.error is None
            left = gc.collect()
        finally:
            gc.enable()
        raw.close()
        server.close()
        await server.wait_closed()
        return left

    assert asyncio.run(main()) < 60  # under one object a request: none is a request's


async def _ok_server(accepted: list[int] | None = None) -> tuple[asyncio.Server, Target, bytes]:
    """A server that answers every request (a 2-byte body) with ``ok`` on a kept-alive
    connection; each connection it accepts is noted in ``accepted``. Its target and a request."""
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if accepted is not None:
            accepted.append(1)
        while await reader.readuntil(b"\r\n\r\n"):
            await reader.readexactly(2)
            writer.write(ok)
            await writer.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    target = Target("127.0.0.1", server.sockets[0].getsockname()[1], False, "/")
    return server, target, frame_request(target.request_head({}), "r", b"{}")

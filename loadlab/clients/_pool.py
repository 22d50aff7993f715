"""The asyncio side of the raw HTTP/1.1 client: keep-alive connections per target (``RawPool``),
each an asyncio ``Protocol`` (``_Conn``) that stamps every read first, and the parse queue
(``_Deferred``) that parses the stamped reads a moment later, in slices.

Why: through aiohttp every streamed chunk goes parser -> ``StreamReader`` -> future -> task
wake-up -> ``iter_any`` -> our code. On a loaded 2-core machine that is most of the client's CPU
per token, and the chunk's timestamp waits for the task to run. Here ``data_received`` stamps
``perf_counter_ns`` first and the connection's ``ResponseReader`` (``loadlab.clients._http1``)
de-chunks the body and calls ``sink.on_bytes(piece, t_ns)`` (the stream state) with no task
wake-up; the request coroutine wakes once, at the end of the response. docs/clients.md has the
measurements.

Example::

    pool = RawPool(max_connections=64)
    request = frame_request(target.request_head(headers), "r1", body)
    result = await pool.request(target, request, sink, timeout_s=120.0, read_timeout_s=30.0)
    pool.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import time
import weakref
from collections.abc import Callable

from loadlab.clients._gate import SendGate
from loadlab.clients._http1 import Failure, RawResult, ResponseReader, Sink, Target

__all__ = ["PARSE_CLOCK_EVERY", "PARSE_MAX_LAG_NS", "PARSE_SLICE_NS", "RawPool", "parse_backlog_ms"]

# _Deferred: the most parsing one loop turn does before the loop polls again, unless the
# oldest read still waiting to be parsed is PARSE_MAX_LAG_NS old
PARSE_SLICE_NS = 500_000
PARSE_MAX_LAG_NS = 50_000_000
PARSE_CLOCK_EVERY = 8  # reads parsed between two looks at the clock
_clock = time.perf_counter_ns


class _Conn(ResponseReader, asyncio.Protocol):
    """One connection: the asyncio protocol around its ``ResponseReader``."""

    def __init__(self, deferred: _Deferred) -> None:
        super().__init__()
        self.deferred = deferred
        self._items = deferred.items  # looked up once, not on every read
        self._call_soon, self._turn = deferred.loop.call_soon, deferred.turn
        self.transport: asyncio.Transport | None = None
        self.fd = -1  # the socket's descriptor, for a sender thread's write (-1: TLS)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and transport.get_extra_info("sslcontext") is None:
            self.fd = sock.fileno()

    def data_received(self, data: bytes) -> None:
        t = _clock()  # first: this is the chunk's arrival time
        items = self._items
        if not items:  # the first read since the queue's last turn: a turn is due
            self._call_soon(self._turn)
        items.append((self, data, t))
        self.last_ns = t

    def connection_lost(self, exc: Exception | None) -> None:
        self.deferred.flush()  # this connection's last bytes first
        super().connection_lost(exc)


class _Deferred:
    """Reads stamped now, parsed a moment later: in one turn of the event loop, every socket
    that became readable is read and stamped before any response is parsed.

    Without it, when many streams' tokens arrive together (a server writes a whole batch's
    tokens in one step), the k-th socket's stamp waited for k-1 responses' parsing, SSE
    decoding and bookkeeping. ``call_soon`` runs after this turn's I/O callbacks (asyncio and
    uvloop alike), and one callback per turn parses what was read, in order.

    That callback parses for at most ``slice_ns`` and leaves the rest, still in order, to the
    next turn: the loop polls its sockets in between, so reads that arrive while a backlog is
    parsed (the first tokens of 128 streams that started together, each a full parse and a
    frame probe) are stamped within about a slice, not after the whole backlog.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        slice_ns: int = PARSE_SLICE_NS,
        max_lag_ns: int = PARSE_MAX_LAG_NS,
        clock_every: int = PARSE_CLOCK_EVERY,
    ) -> None:
        self.loop = loop
        self.slice_ns = slice_ns
        self.max_lag_ns = max_lag_ns
        self.clock_every = clock_every
        # what was read and not parsed yet; while it holds anything, a turn is due (a read
        # that finds it empty asks for one, a turn that leaves reads asks for the next)
        self.items: list[tuple[_Conn, bytes, int]] = []
        _QUEUES.add(self)  # for parse_backlog_ms; the queue lives as long as its pool

    def turn(self) -> None:
        """One turn of the loop's parsing: at most a slice."""
        self.flush(_clock() + self.slice_ns)

    def flush(self, until_ns: int | None = None) -> None:
        """Parse what was read, in order; with ``until_ns``, stop once it has passed and
        schedule the rest for the next turn. The clock is read every ``clock_every`` reads,
        not after each: a read parses in microseconds, so the slice ends at most a few tens of
        microseconds late, and each read saves a clock call."""
        items, every = self.items, self.clock_every
        i = 0
        try:
            for conn, data, t in items:  # the loop queues reads only between callbacks
                conn.feed(data, t)
                i += 1
                if (
                    not i % every
                    and until_ns is not None
                    and i < len(items)
                    and (now := _clock()) >= until_ns
                    and now - items[i][2] < self.max_lag_ns
                ):  # the slice is used up, and what is left was read recently: next turn
                    return
        finally:
            del items[:i]
            if items:  # what is left is parsed in a later turn
                self.loop.call_soon(self.turn)


_QUEUES: weakref.WeakSet[_Deferred] = weakref.WeakSet()  # every live parse queue


def parse_backlog_ms(loop: asyncio.AbstractEventLoop) -> float:
    """How long the oldest read on ``loop`` that is not parsed yet has waited (0: none). The
    runner's monitor samples it: reads are stamped at once, so a backlog does not move a
    timestamp, but it delays what follows a response's end (a closed loop's next request)."""
    oldest = min((q.items[0][2] for q in list(_QUEUES) if q.loop is loop and q.items), default=None)
    if oldest is None:
        return 0.0
    return max(0.0, (time.perf_counter_ns() - oldest) / 1e6)


class _Watchdog:
    """A request's read timeout and total timeout, from its write on: one timer per read-timeout
    period, not one per chunk. ``stop`` drops the timer, and with it the one reference cycle
    (the timer's callback is this object's method): a run that freezes its heap would keep
    every request's cycle until it ended."""

    __slots__ = ("conn", "deadline_ns", "handle", "loop", "read_ns", "read_timeout_s")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, conn: _Conn, deadline_ns: int, read_timeout_s: float
    ) -> None:
        self.loop, self.conn, self.deadline_ns = loop, conn, deadline_ns
        self.read_timeout_s, self.read_ns = read_timeout_s, int(read_timeout_s * 1e9)
        self.handle: asyncio.TimerHandle | None = None

    def start(self, sent_ns: int) -> None:
        wait_ns = min(self.read_ns, self.deadline_ns - sent_ns)
        self.handle = self.loop.call_later(wait_ns / 1e9, self.check)

    def check(self) -> None:
        now, conn = _clock(), self.conn
        if now >= self.deadline_ns:
            conn.end(Failure.TIMEOUT, "past the total timeout")
        elif now - conn.last_ns >= self.read_ns:
            conn.end(Failure.TIMEOUT, f"no byte for {self.read_timeout_s} s (read timeout)")
        else:
            due_ns = min(conn.last_ns + self.read_ns, self.deadline_ns)
            self.handle = self.loop.call_later((due_ns - now) / 1e9, self.check)

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


class RawPool:
    """Keep-alive connections per target; ``max_connections`` > 0 caps them (others wait)."""

    def __init__(self, max_connections: int = 0) -> None:
        self._idle: dict[Target, list[_Conn]] = {}
        self._sem = asyncio.Semaphore(max_connections) if max_connections > 0 else None
        self._ssl: ssl.SSLContext | None = None
        self._deferred: _Deferred | None = None
        self._opening: dict[Target, asyncio.Task[None]] = {}  # spare connections under way

    def preconnect(self, target: Target, timeout_s: float) -> asyncio.Task[None] | None:
        """Start opening a spare connection to ``target``, kept idle, when none is idle or
        opening (the task that opens it, else None): a request due soon then goes out at its
        time, not after a connect. Nothing for a capped pool (the spare would hold a place); a
        failure is left to the request."""
        if self._sem is not None or target in self._opening:
            return None
        if any(not c.lost for c in self._idle.get(target, ())):
            return None
        task = asyncio.get_running_loop().create_task(self._open_spare(target, timeout_s))
        self._opening[target] = task
        return task

    async def _open_spare(self, target: Target, timeout_s: float) -> None:
        try:
            made = await self._connect(target, time.perf_counter_ns() + int(timeout_s * 1e9))
        finally:
            self._opening.pop(target, None)
        if isinstance(made, _Conn):
            self._idle.setdefault(target, []).append(made)

    async def request(
        self,
        target: Target,
        request: bytes,
        sink: Sink,
        *,
        timeout_s: float,
        read_timeout_s: float,
        gate: SendGate | None = None,
    ) -> RawResult:
        """Send ``request`` (``frame_request``) and feed the response to ``sink``. Never raises
        for a network failure (``result.error``). With ``gate``, the connection is taken now
        and the request written when the gate fires (``loadlab.clients._gate``); a withdrawn
        gate returns a result with no ``sent_ns``."""
        deadline_ns = time.perf_counter_ns() + int(timeout_s * 1e9)
        if self._sem is not None:
            await self._sem.acquire()
        try:
            result = await self._exchange(target, request, sink, deadline_ns, read_timeout_s, gate)
            if result.stale:
                # the server closed an idle kept-alive connection as we reused it (or while
                # it waited for its gate): once more
                result = await self._exchange(
                    target, request, sink, deadline_ns, read_timeout_s, gate, fresh=True
                )
            return result
        finally:
            if self._sem is not None:
                self._sem.release()

    async def _connect(self, target: Target, deadline_ns: int) -> _Conn | RawResult:
        loop = asyncio.get_running_loop()
        if self._deferred is None or self._deferred.loop is not loop:
            self._deferred = _Deferred(loop)
        deferred = self._deferred
        if target.tls and self._ssl is None:
            self._ssl = ssl.create_default_context()
        wait_s = max(0.0, (deadline_ns - time.perf_counter_ns()) / 1e9)
        try:
            async with asyncio.timeout(wait_s):
                _, conn = await loop.create_connection(
                    lambda: _Conn(deferred),
                    target.host,
                    target.port,
                    ssl=self._ssl if target.tls else None,
                )
        except TimeoutError:
            return RawResult(error=Failure.TIMEOUT, message=f"no connection within {wait_s:.1f} s")
        except OSError as exc:
            return RawResult(error=Failure.CONNECT, message=f"{type(exc).__name__}: {exc}")
        return conn

    async def _exchange(
        self,
        target: Target,
        request: bytes,
        sink: Sink,
        deadline_ns: int,
        read_timeout_s: float,
        gate: SendGate | None,
        fresh: bool = False,
    ) -> RawResult:
        idle = self._idle.setdefault(target, [])
        conn: _Conn | None = None
        while idle and not fresh:
            c = idle.pop()
            if not c.lost:
                conn = c
                break
        reused = conn is not None
        if conn is None:
            made = await self._connect(target, deadline_ns)
            if isinstance(made, RawResult):  # failed when due, not before
                if gate is not None and not await gate.wait():
                    return RawResult()
                return made
            conn = made
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        result = RawResult()
        clock = time.perf_counter_ns
        watch = _Watchdog(loop, conn, deadline_ns, read_timeout_s)

        budget_ns = deadline_ns - clock()  # the whole-request timeout runs from the write

        def write() -> None:  # the send itself: at once, or when the gate fires
            nonlocal result
            if conn.lost:  # closed while it waited for the gate: the caller takes a fresh one
                return
            assert conn.transport is not None  # noqa: S101 (set by connection_made)
            result = conn.start(sink, done)
            sent = conn.last_ns = result.sent_ns = clock()
            watch.deadline_ns = max(watch.deadline_ns, sent + budget_ns)
            conn.transport.write(request)
            watch.start(sent)

        if gate is None:
            write()
        else:
            # the sender's thread writes on a duplicate of the socket's descriptor, taken here
            # while the connection is open: the loop may close its own at any time, and a
            # descriptor number closed and reused must never get this request
            fd = -1
            if conn.fd >= 0 and not conn.lost and not conn.transport.is_closing():  # type: ignore[union-attr]
                fd = os.dup(conn.fd)

            def direct() -> Callable[[], None] | None:
                """``write`` in the sender's thread: stamp, write what the socket takes; the
                loop writes the rest, if any, and sets the timer (what this returns)."""
                nonlocal result
                try:
                    if conn.lost or conn.transport is None or conn.transport.is_closing():
                        return write  # (the loop's write finds it closed: a fresh one)
                    result = conn.start(sink, done)
                    sent = conn.last_ns = result.sent_ns = clock()
                    watch.deadline_ns = max(watch.deadline_ns, sent + budget_ns)
                    try:
                        n = os.write(fd, request)
                    except OSError:  # full (the loop writes it), or broken (its write says)
                        n = 0
                    rest = request[n:] if n < len(request) else b""
                    return lambda: after(rest, sent)
                finally:
                    with contextlib.suppress(OSError):  # (raising now would write it twice)
                        os.close(fd)

            def after(rest: bytes, sent: int) -> None:
                if rest and not conn.lost and conn.transport is not None:
                    conn.transport.write(rest)
                watch.start(sent)

            try:
                held = await gate.hold(write, direct if fd >= 0 else None)
            except asyncio.CancelledError:
                gate.withdraw()  # a sender thread that has not fired it never will now
                if gate.fired and conn.transport is not None:
                    conn.transport.abort()  # written (or being written): not a clean connection
                else:
                    self._release(idle, conn)
                raise
            finally:
                if fd >= 0 and not gate.by_thread:
                    os.close(fd)  # (the sender's thread closes the one it wrote on)
            if not held:  # withdrawn: never written
                self._release(idle, conn)
                return result
            if result.sent_ns is None:  # the connection closed while it waited
                return RawResult(error=Failure.CONNECT, message="connection closed", stale=True)
        assert conn.transport is not None  # noqa: S101 (set by connection_made)
        try:
            await done
        except asyncio.CancelledError:
            conn.end(Failure.INCOMPLETE, "cancelled")
            conn.transport.abort()
            raise
        finally:
            watch.stop()
        if result.error is Failure.CONNECT and reused and not conn.got_bytes:
            result.stale = True
        if conn.reusable and result.error is None and not conn.lost:
            idle.append(conn)
        else:
            conn.transport.abort()
        return result

    @staticmethod
    def _release(idle: list[_Conn], conn: _Conn) -> None:
        """A connection taken for a request that was never written goes back to the pool."""
        if conn.lost:
            if conn.transport is not None:
                conn.transport.abort()
        else:
            idle.append(conn)

    def close(self) -> None:
        for task in self._opening.values():
            task.cancel()
        self._opening.clear()
        for conns in self._idle.values():
            for c in conns:
                if c.transport is not None:
                    c.transport.close()
        self._idle.clear()

"""A lean HTTP/1.1 client transport for the streaming hot path: an asyncio ``Protocol`` that hands
each body piece to a sink as it arrives, with no task wake-up per chunk.

Why: through aiohttp every streamed chunk goes parser -> ``StreamReader`` -> future -> task
wake-up -> ``iter_any`` -> our code. On a loaded 2-core machine that is most of the client's CPU
per token, and the chunk's timestamp waits for the task to run. Here ``data_received`` stamps
``perf_counter_ns`` first, de-chunks the body and calls ``sink.on_bytes(piece, t_ns)``
(``OpenAIStreamState``) at once; the request coroutine wakes once, at the end of the response.
docs/clients.md has the measurements.

Scope is what an inference endpoint needs: POST with a ``Content-Length`` body; responses framed by
``Transfer-Encoding: chunked``, ``Content-Length`` or the connection's close; keep-alive with an
idle pool per host; ``https`` through the default SSL context. No proxies, redirects or
compression (the client sends ``Accept-Encoding: identity``).

Example::

    pool = RawPool(max_connections=64)
    request = frame_request(target.request_head(headers), "r1", body)
    result = await pool.request(target, request, sink, timeout_s=120.0, read_timeout_s=30.0)
    pool.close()
"""

from __future__ import annotations

import asyncio
import ssl
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

__all__ = [
    "Done",
    "RawPool",
    "RawResult",
    "ResponseReader",
    "Sink",
    "Target",
    "frame_request",
    "header_value",
]

# _Deferred: the most parsing one loop turn does before the loop polls again, unless the
# oldest read still waiting to be parsed is PARSE_MAX_LAG_NS old
PARSE_SLICE_NS = 500_000
PARSE_MAX_LAG_NS = 50_000_000
_MAX_HEAD = 64 * 1024
_SIZE, _DATA, _CRLF, _TRAILER = 0, 1, 2, 3  # chunked-body parser states


class Sink(Protocol):
    def on_headers(self, status: int, headers: Mapping[str, str], t_ns: int) -> None: ...

    def on_bytes(self, data: bytes, t_ns: int) -> bool: ...


class Done(Protocol):
    """What an exchange's end is signalled on: an ``asyncio.Future``, or any object with these."""

    def done(self) -> bool: ...

    def set_result(self, result: None, /) -> None: ...


@dataclass
class RawResult:
    """How one exchange ended. ``error``: None (complete body, or the sink stopped reading), or
    ``"connect"``, ``"timeout"``, ``"incomplete"``, ``"protocol"`` with ``message``."""

    sent_ns: int | None = None
    error: str | None = None
    message: str = ""
    end_ns: int | None = None  # when the read that ended it was read (else when it ended)


@dataclass(frozen=True)
class Target:
    """Where requests go: parsed once per client from its URL."""

    host: str
    port: int
    tls: bool
    path: str

    @classmethod
    def from_url(cls, url: str) -> Target:
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"expected an http:// or https:// URL, got {url!r}")
        tls = u.scheme == "https"
        return cls(u.hostname, u.port or (443 if tls else 80), tls, u.path or "/")

    def request_head(self, headers: Mapping[str, str]) -> bytes:
        """Request line and fixed headers; per request, add ``X-Request-Id`` etc. and length
        (``frame_request``)."""
        host = self.host if self.port in (80, 443) else f"{self.host}:{self.port}"
        lines = [f"POST {self.path} HTTP/1.1", f"Host: {host}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(lines) + "\r\n").encode("latin-1")


def header_value(value: str) -> str:
    """``value`` with CR and LF dropped: no header injection through a request id."""
    return value.replace("\r", "").replace("\n", "")


def frame_request(head: bytes, request_id: str, body: bytes) -> bytes:
    """The whole request: ``head`` (``Target.request_head``), this request's ``X-Request-Id``,
    ``Content-Length`` and ``body``."""
    rid = header_value(request_id).encode("latin-1", "replace")
    return head + b"X-Request-Id: " + rid + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body


class _Headers(dict[str, str]):
    """Response headers: lower-case keys, case-insensitive ``get``."""

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return dict.get(self, key.lower(), default)


class _Conn(asyncio.Protocol):
    """One connection, one exchange at a time.

    Also a sans-IO response reader: ``start``, then ``feed(data, t)`` with each read's bytes
    and its time, and ``connection_lost`` at EOF; the Locust user's gevent transport uses it
    so.
    """

    def __init__(self, deferred: _Deferred | None = None) -> None:
        self.deferred = deferred  # None: parse in data_received
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.reusable = True
        self.sink: Sink | None = None
        self.done: Done | None = None
        self.result = RawResult()
        self.last_ns = 0  # when the last byte came (read timeout)
        self.got_bytes = False
        self._read_ns: int | None = None  # the stamp of the read being parsed, during feed()
        self._head = True
        self._buf = b""
        self._chunked = False
        self._state = _SIZE
        self._remaining = -1  # body bytes left (Content-Length or current chunk); -1: until close

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def start(self, sink: Sink, done: Done) -> RawResult:
        self.sink, self.done, self.result, self.got_bytes = sink, done, RawResult(), False
        self._head, self._buf, self._chunked, self._state, self._remaining = (
            True,
            b"",
            False,
            _SIZE,
            -1,
        )
        return self.result

    def data_received(self, data: bytes) -> None:
        t = time.perf_counter_ns()  # first: this is the chunk's arrival time
        if self.deferred is None:
            self.feed(data, t)
        else:
            self.last_ns = t
            self.deferred.add(self, data, t)

    def feed(self, data: bytes, t: int) -> None:
        """The bytes of one read, and when that read returned."""
        self.last_ns = t
        self.got_bytes = True
        if self.sink is None:
            if data:
                self.reusable = False  # bytes outside an exchange
            return
        self._read_ns = t
        try:
            if self._chunked:
                if self._state == _SIZE and not self._buf:
                    # The usual read of a token stream: exactly one whole chunk.
                    nl = data.find(b"\r\n", 0, 10)
                    if nl > 0:
                        try:
                            size = int(data[:nl], 16)
                        except ValueError:  # a chunk extension, or garbage: the full way
                            size = 0
                        end = nl + 2 + size
                        if size > 0 and end + 2 == len(data) and data.endswith(b"\r\n"):
                            self._deliver(data[nl + 2 : end], t)
                            return
                self._chunks(data, t)
            elif self._head:
                self._response_head(data, t)
            else:
                self._plain(data, t)
        except Exception as exc:  # a sink bug must end this request, not hang it
            self.end("protocol", f"{type(exc).__name__}: {exc}")
        finally:
            self._read_ns = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.deferred is not None:
            self.deferred.flush()  # this connection's last bytes first
        self.lost = True
        self.reusable = False
        if self.sink is None:
            return
        if not self._head and not self._chunked and self._remaining == -1:
            self.end(None)  # a body delimited by the close is complete
        else:
            why = f": {exc}" if exc else ""
            self.end("connect" if self._head else "incomplete", f"connection closed{why}")

    def end(self, error: str | None, message: str = "") -> None:
        done, self.sink = self.done, None
        if self.result.end_ns is None:  # a read parsed late (a backlog) ended at its stamp
            self.result.end_ns = self._read_ns or time.perf_counter_ns()
        if error is not None:
            self.result.error, self.result.message = error, message
            self.reusable = False
        if done is not None and not done.done():
            done.set_result(None)

    # ---------------------------------------------------------------- parsing

    def _response_head(self, data: bytes, t: int) -> None:
        buf = self._buf + data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            self._buf = buf
            if len(buf) > _MAX_HEAD:
                self.end("protocol", "response head larger than 64 KiB")
            return
        head, rest = buf[:end], buf[end + 4 :]
        self._buf = b""
        try:
            lines = head.decode("latin-1").split("\r\n")
            version, status_text = lines[0].split(" ", 2)[:2]
            status = int(status_text)
            if not version.startswith("HTTP/1."):
                raise ValueError(version)
            headers = _Headers()
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers["content-length"]) if "content-length" in headers else -1
        except (ValueError, IndexError):
            self.end("protocol", f"not an HTTP/1.x response: {head[:80]!r}")
            return
        if 100 <= status < 200:  # an interim response (100 Continue, 103 Early Hints): skip it
            if rest:
                self._response_head(rest, t)
            return
        self._head = False
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self._remaining = 0 if status in (204, 304) else length
        if version == "HTTP/1.0" or headers.get("connection", "").lower() == "close":
            self.reusable = False
        if not self._chunked and self._remaining == -1:
            self.reusable = False
        sink = self.sink
        if sink is None:
            return
        sink.on_headers(status, headers, t)
        if not self._chunked and self._remaining == 0:
            self.end(None)
        elif rest:
            (self._chunks if self._chunked else self._plain)(rest, t)

    def _deliver(self, piece: bytes, t: int) -> bool:
        """Hand a body piece to the sink; True when reading stops."""
        sink = self.sink
        if sink is None:
            return True
        if sink.on_bytes(piece, t):
            self.reusable = False  # unread body left on the wire
            self.end(None)
            return True
        return False

    def _plain(self, data: bytes, t: int) -> None:
        n = self._remaining
        if n < 0:
            self._deliver(data, t)
        elif len(data) < n:
            self._remaining = n - len(data)
            self._deliver(data, t)
        else:
            self._remaining = 0
            if len(data) > n:
                self.reusable = False  # more bytes than announced
            if not self._deliver(data[:n], t):
                self.end(None)

    def _chunks(self, data: bytes, t: int) -> None:
        """De-chunk ``data``; every whole piece this read completed goes to the sink in one
        call (one read is one arrival time, and under load one read holds a dozen chunks:
        one SSE decode for all of them, not one each)."""
        buf = self._buf + data if self._buf else data
        pos, n = 0, len(buf)
        pieces: list[bytes] = []
        while pos < n:
            state = self._state
            if state == _SIZE:
                nl = buf.find(b"\r\n", pos)
                if nl < 0:
                    break
                try:
                    size = int(buf[pos:nl].split(b";", 1)[0], 16)
                except ValueError:
                    size = -1
                if size < 0:  # not hex digits (int() would also take a sign)
                    self._flush(pieces, t)
                    self.end("protocol", f"bad chunk size line {buf[pos:nl][:40]!r}")
                    return
                pos = nl + 2
                if not size:
                    self._state, self._remaining = _TRAILER, 0
                elif pos + size + 2 <= n and buf[pos + size : pos + size + 2] == b"\r\n":
                    pieces.append(buf[pos : pos + size])  # the usual case: a whole chunk
                    pos += size + 2
                else:
                    self._state, self._remaining = _DATA, size
            elif state == _DATA:
                take = buf[pos : pos + self._remaining]
                pos += len(take)
                self._remaining -= len(take)
                if self._remaining == 0:
                    self._state = _CRLF
                pieces.append(take)
            elif state == _CRLF:
                if n - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    self._flush(pieces, t)
                    self.end("protocol", "chunk data longer than its size line said")
                    return
                pos += 2
                self._state = _SIZE
            else:  # _TRAILER: trailer lines, then an empty line
                nl = buf.find(b"\r\n", pos)
                if nl < 0:
                    break
                empty = nl == pos
                pos = nl + 2
                if empty:
                    if pos < n:
                        self.reusable = False
                    if not self._flush(pieces, t):
                        self.end(None)
                    return
        if self._flush(pieces, t):
            return
        self._buf = buf[pos:]
        if len(self._buf) > _MAX_HEAD:
            self.end("protocol", "chunk size line or trailer too long")

    def _flush(self, pieces: list[bytes], t: int) -> bool:
        """Deliver the pieces of one read as one; True when reading stops."""
        if not pieces:
            return False
        return self._deliver(pieces[0] if len(pieces) == 1 else b"".join(pieces), t)


ResponseReader = _Conn


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
    ) -> None:
        self.loop = loop
        self.slice_ns = slice_ns
        self.max_lag_ns = max_lag_ns
        self.items: list[tuple[_Conn, bytes, int]] = []
        self._scheduled = False
        _QUEUES.add(self)  # for parse_backlog_ms; the queue lives as long as its pool

    def add(self, conn: _Conn, data: bytes, t: int) -> None:
        self.items.append((conn, data, t))
        if not self._scheduled:
            self._schedule()

    def _schedule(self) -> None:
        self._scheduled = True
        self.loop.call_soon(self._turn)

    def _turn(self) -> None:
        self._scheduled = False
        self.flush(time.perf_counter_ns() + self.slice_ns)

    def flush(self, until_ns: int | None = None) -> None:
        """Parse what was read, in order; with ``until_ns``, stop once it has passed and
        schedule the rest for the next turn."""
        items, clock = self.items, time.perf_counter_ns
        i = 0
        try:
            while i < len(items):
                conn, data, t = items[i]
                i += 1
                conn.feed(data, t)
                if (
                    until_ns is not None
                    and i < len(items)
                    and (now := clock()) >= until_ns
                    and now - items[i][2] < self.max_lag_ns
                ):  # the slice is used up, and what is left was read recently: next turn
                    if not self._scheduled:
                        self._schedule()
                    return
        finally:
            del items[:i]


_QUEUES: weakref.WeakSet[_Deferred] = weakref.WeakSet()  # every live parse queue


def parse_backlog_ms(loop: asyncio.AbstractEventLoop) -> float:
    """How long the oldest read on ``loop`` that is not parsed yet has waited (0: none). The
    runner's monitor samples it: reads are stamped at once, so a backlog does not move a
    timestamp, but it delays what follows a response's end (a closed loop's next request)."""
    oldest = min((q.items[0][2] for q in list(_QUEUES) if q.loop is loop and q.items), default=None)
    if oldest is None:
        return 0.0
    return max(0.0, (time.perf_counter_ns() - oldest) / 1e6)


class RawPool:
    """Keep-alive connections per target; ``max_connections`` > 0 caps them (others wait)."""

    def __init__(self, max_connections: int = 0) -> None:
        self._idle: dict[Target, list[_Conn]] = {}
        self._sem = asyncio.Semaphore(max_connections) if max_connections > 0 else None
        self._ssl: ssl.SSLContext | None = None
        self._deferred: _Deferred | None = None

    async def request(
        self,
        target: Target,
        request: bytes,
        sink: Sink,
        *,
        timeout_s: float,
        read_timeout_s: float,
    ) -> RawResult:
        """Send ``request`` (``frame_request``) and feed the response to ``sink``. Never raises
        for a network failure (``result.error``)."""
        deadline_ns = time.perf_counter_ns() + int(timeout_s * 1e9)
        if self._sem is not None:
            await self._sem.acquire()
        try:
            result = await self._exchange(target, request, sink, deadline_ns, read_timeout_s)
            if (
                result.error == "connect"
                and result.sent_ns is not None
                and result.message == "reused"
            ):
                # the server closed an idle kept-alive connection as we reused it: once more
                result = await self._exchange(
                    target, request, sink, deadline_ns, read_timeout_s, fresh=True
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
            return RawResult(error="timeout", message=f"no connection within {wait_s:.1f} s")
        except OSError as exc:
            return RawResult(error="connect", message=f"{type(exc).__name__}: {exc}")
        return conn

    async def _exchange(
        self,
        target: Target,
        request: bytes,
        sink: Sink,
        deadline_ns: int,
        read_timeout_s: float,
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
            if isinstance(made, RawResult):
                return made
            conn = made
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        result = conn.start(sink, done)
        read_ns = int(read_timeout_s * 1e9)
        clock = time.perf_counter_ns

        timer: list[asyncio.TimerHandle] = []

        def watchdog() -> None:  # one timer per read-timeout period, not one per chunk
            now = clock()
            if now >= deadline_ns:
                conn.end("timeout", "past the total timeout")
            elif now - conn.last_ns >= read_ns:
                conn.end("timeout", f"no byte for {read_timeout_s} s (read timeout)")
            else:
                timer[0] = loop.call_later(
                    min(conn.last_ns + read_ns, deadline_ns) / 1e9 - now / 1e9, watchdog
                )

        assert conn.transport is not None  # noqa: S101 (set by connection_made)
        sent = conn.last_ns = result.sent_ns = clock()
        conn.transport.write(request)
        timer.append(loop.call_later(min(read_ns, deadline_ns - sent) / 1e9, watchdog))
        try:
            await done
        except asyncio.CancelledError:
            conn.end("incomplete", "cancelled")
            conn.transport.abort()
            raise
        finally:
            timer[0].cancel()
        if result.error == "connect" and reused and not conn.got_bytes:
            result.message = "reused"
        if conn.reusable and result.error is None and not conn.lost:
            idle.append(conn)
        else:
            conn.transport.abort()
        return result

    def close(self) -> None:
        for conns in self._idle.values():
            for c in conns:
                if c.transport is not None:
                    c.transport.close()
        self._idle.clear()

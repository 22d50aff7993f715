"""``loadlab record``'s reverse proxy: pass traffic through unchanged, write its shape.

The relay is asyncio protocols over HTTP/1.1 (``loadlab.record.relay`` reads the bytes): a
client's request is read whole (head and ``Content-Length`` or chunked body) and sent over a
kept-alive connection to the upstream, with its body and headers as they came (this hop's
aside); the answer's bytes are written to the client as each read returns them, framing
included (a chunked body passes through untouched), before the proxy reads its copy. Nothing is
buffered but what the client's socket has not taken yet (past 64 KiB the proxy stops reading
the upstream until it drains) and, when the proxy asked for usage itself, a partial SSE event
(then the proxy sends the body in chunks of its own, that one event taken out). Per traced
request (OpenAI chat, completions, Responses and Anthropic messages; other paths pass through
untraced) one trace line goes to a bounded queue that a writer task empties: a write that fails
is counted and said once, and the traffic goes on. The request's shape (``RequestShape``: block
hashes, the tokenizer's counts) is read when its answer has ended, never on its way upstream.

The proxy answers 502 only when the upstream could not be reached, or closed or timed out
before its answer's head; an upstream answer, error statuses included, is passed on as it came.
An upstream that breaks off mid-answer closes the client's connection at the same byte.

Example::

    proxy = RecordingProxy("http://127.0.0.1:8000", TraceWriter(Path("trace.jsonl"), ...))
    await proxy.start("127.0.0.1", 9000)
    ...
    await proxy.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import ssl
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, cast

import orjson

from loadlab.record.relay import (
    ChunkDecoder,
    HTTPError,
    Request,
    RequestReader,
    ResponseHead,
    Upstream,
    client_head,
    error_response,
    upstream_request,
)
from loadlab.record.shape import RequestShape, Tokenize
from loadlab.record.stream import StreamWatch
from loadlab.record.tracefile import TraceWriter

__all__ = ["API_PATHS", "RecordingProxy", "api_of"]

API_PATHS = {
    "/v1/chat/completions": "chat",
    "/chat/completions": "chat",
    "/v1/completions": "completions",
    "/completions": "completions",
    "/v1/responses": "responses",
    "/responses": "responses",
    "/v1/messages": "anthropic",
    "/messages": "anthropic",
}


def api_of(path: str) -> str | None:
    """The API a request path speaks (a prefix before ``/v1/...`` is allowed), or None.

    >>> api_of("/v1/chat/completions"), api_of("/openai/v1/messages"), api_of("/v1/models")
    ('chat', 'anthropic', None)
    """
    for suffix, api in API_PATHS.items():
        if path.endswith(suffix) and suffix.startswith("/v1"):
            return api
    return API_PATHS.get(path)


CONTINUATIONS_KEPT = 200_000  # conversations remembered to find a request's previous turn
IDLE_KEPT = 1024  # kept-alive upstream connections waiting for a request
STOP_GRACE_S = 5.0
TRACE_SLICE_NS = 200_000  # trace lines written per turn of the event loop, in time
TRACE_DUE_MAX = 4096  # answers waiting for their trace line (each holds its request's JSON)  # how long ``stop`` lets answers in flight finish
_PIPELINED = 1 << 20  # a client's bytes read ahead of its answer before the proxy stops reading
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class _Turn(NamedTuple):
    """A conversation's last request, remembered to find its next turn. A tuple of ints: the
    collector stops tracking it, so a full collection never walks the remembered turns."""

    line_id: int  # its trace line's ``id``
    session: int
    turn: int
    end_ns: int


def _no_delay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _Client(asyncio.Protocol):
    """A client's connection: its requests, one at a time (pipelined ones wait their turn)."""

    def __init__(self, proxy: RecordingProxy) -> None:
        self.proxy = proxy
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # connection_made
        self.reader = RequestReader()
        self.busy: _Exchange | None = None
        self.eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        _no_delay(self.transport)
        self.proxy._clients.add(self)

    def data_received(self, data: bytes) -> None:
        t_ns = time.perf_counter_ns()
        if self.busy is not None:  # pipelined: read when its turn comes
            self.reader.hold(data, t_ns)
            if len(self.reader.buf) > _PIPELINED and self.transport is not None:
                self.transport.pause_reading()
            return
        self._take(lambda: self.reader.feed(data, t_ns))

    def _take(self, read: Callable[[], Request | None]) -> None:
        transport = self.transport
        try:
            req = read()
        except HTTPError as exc:
            reason = {400: "Bad Request", 413: "Content Too Large", 431: "Too Large"}
            kind = "invalid_request_error"
            transport.write(
                error_response(
                    exc.status,
                    reason.get(exc.status, "Error"),
                    f"loadlab record: {exc}",
                    kind,
                    close=True,
                )
            )
            transport.close()
            return
        if self.reader.continue_due:
            self.reader.continue_due = False
            transport.write(_CONTINUE)
        if req is not None:
            self.busy = self.proxy._exchange(self, req)

    def answered(self, close: bool) -> None:
        """The answer in flight has ended: close, or go on to the next request."""
        self.busy = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if close or self.eof:
            transport.close()
            return
        transport.resume_reading()
        t_ns = time.perf_counter_ns()
        self._take(lambda: self.reader.next(t_ns))

    def eof_received(self) -> bool | None:
        if self.busy is not None:  # a client that half-closed still gets its answer
            self.eof = True
            return True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.proxy._clients.discard(self)
        if self.busy is not None:
            self.busy.client_lost()

    def pause_writing(self) -> None:
        if self.busy is not None:
            self.busy.pause(True)

    def resume_writing(self) -> None:
        if self.busy is not None:
            self.busy.pause(False)


class _UpstreamConn(asyncio.Protocol):
    """A connection to the upstream, kept alive between answers; it hands each read to the
    exchange it serves."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # connection_made
        self.ex: _Exchange | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        _no_delay(self.transport)

    def data_received(self, data: bytes) -> None:
        ex = self.ex
        if ex is None:  # nothing was asked: a connection that cannot be trusted again
            self.closed = True
            if self.transport is not None:
                self.transport.abort()
            return
        ex.received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.ex is not None:
            self.ex.upstream_lost(exc)


class _Exchange:
    """One request and its answer, from the client's request to the answer's last byte."""

    def __init__(
        self, proxy: RecordingProxy, client: _Client, req: Request, request_bytes: bytes,
        api: str | None,
    ) -> None:  # fmt: skip
        self.proxy = proxy
        self.client = client
        self.out = client.transport
        self.req = req
        self.request_bytes = request_bytes
        self.api = api
        self.traced: dict[str, Any] | None = None
        self.watch: StreamWatch | None = None
        self.up: _UpstreamConn | None = None
        self.reused = False
        self.sent_ns = self.last_ns = 0
        self.status = 0
        self.head = bytearray()
        self.on_body: Callable[[bytes, int], None] | None = None
        self.decoder: ChunkDecoder | None = None
        self.left = 0  # a Content-Length body's bytes still to come
        self.length_framed = self.framed = False  # by Content-Length; by it or chunks
        self.got = False  # a byte of the answer came
        self.chunk_out = False  # the body goes out in the proxy's own chunks
        self.close_client = False
        self.keep_upstream = False
        self.paused = False
        self.finished = False

    def send(self, up: _UpstreamConn, *, reused: bool) -> None:
        self.up, self.reused = up, reused
        up.ex = self
        self.last_ns = time.perf_counter_ns()
        up.transport.write(self.request_bytes)

    def received(self, data: bytes) -> None:
        t_ns = time.perf_counter_ns()
        self.last_ns = t_ns
        if self.on_body is not None:
            self.on_body(data, t_ns)
            return
        self.got = True
        self.head += data
        try:
            while self.on_body is None and not self.finished:
                end = self.head.find(b"\r\n\r\n")
                if end < 0:
                    if len(self.head) > 64 << 10:
                        raise HTTPError(502, "the upstream's answer head is past 64 KiB")
                    return
                head = ResponseHead.parse(bytes(self.head[:end]))
                rest = bytes(self.head[end + 4 :])
                del self.head[: end + 4]
                if 100 <= head.status < 200:
                    continue  # an interim answer (the client's Expect was answered already)
                self._start(head, rest, t_ns)
        except HTTPError:
            self.upstream_lost(None)

    def _start(self, head: ResponseHead, rest: bytes, t_ns: int) -> None:
        """The answer's head has come: send it on with what followed it, framed as chosen."""
        self.status = head.status
        req, watch = self.req, self.watch
        no_body = req.method == b"HEAD" or head.status in (204, 304)
        delimited = head.chunked or head.length is not None
        is_10 = req.version == b"HTTP/1.0"
        own = not no_body and (
            (watch is not None and watch.drop_usage_event) or (head.chunked and is_10)
        )
        self.chunk_out = own and not is_10
        self.close_client = (
            not req.keep_alive or is_10 or (not no_body and not delimited and not self.chunk_out)
        )
        self.keep_upstream = head.keep_alive and (no_body or delimited)
        self.left = head.length or 0
        self.length_framed, self.framed = head.length is not None, delimited
        self.decoder = ChunkDecoder() if head.chunked else None
        out = client_head(head, own_framing=own, chunked=self.chunk_out, close=self.close_client)
        if no_body:
            self.out.write(out)
            self.end()
            return
        if own:
            self.out.write(out)
            self.on_body = self._own
        else:
            self.on_body = self._pass_chunked if head.chunked else self._pass
            if not rest:
                self.out.write(out)
            else:  # the body's first bytes came with the head: one write for both
                if self.length_framed:
                    rest = rest[: self.left]
                self.out.write(out + rest)
                self._watch(rest, t_ns)
                return
        if rest or (head.length == 0 and not head.chunked):
            self.on_body(rest, t_ns)

    def _pass_chunked(self, data: bytes, t_ns: int) -> None:
        """A chunked answer's read: to the client untouched, then its payload to the watch."""
        self.out.write(data)
        decoder: ChunkDecoder = self.decoder  # type: ignore[assignment]  # set with this handler
        try:
            payload = decoder.feed(data)
        except HTTPError:
            self.broke()
            return
        if payload and self.watch is not None:
            self.proxy._feed_soon(self.watch, payload, t_ns)
        if decoder.done:
            self.end()

    def _pass(self, data: bytes, t_ns: int) -> None:
        """A read of an answer framed by its length or its connection's close: to the client
        untouched (up to the length: what follows is not the answer's), then to the watch."""
        if self.length_framed and len(data) > self.left:
            data = data[: self.left]
        self.out.write(data)
        self._watch(data, t_ns)

    def _watch(self, data: bytes, t_ns: int) -> None:
        """The payload of a read already sent on: to the watch; the answer's end when it is."""
        got = self._payload(data)
        if got is None:
            return
        payload, done = got
        if payload and self.watch is not None:
            self.proxy._feed_soon(self.watch, payload, t_ns)
        if done:
            self.end()

    def _own(self, data: bytes, t_ns: int) -> None:
        """A read of an answer whose bytes change on the way: its payload, what the watch lets
        through of it, sent in the proxy's own chunks (or as it is, to an HTTP/1.0 client)."""
        got = self._payload(data)
        if got is None:
            return
        data, done = got
        watch = self.watch
        if watch is not None and watch.drop_usage_event:
            data = watch.feed(data, t_ns) or b""
        elif watch is not None:
            watch.feed(data, t_ns)
        self._emit(data)
        if done:
            self.end()

    def _payload(self, data: bytes) -> tuple[bytes, bool] | None:
        """A read's payload, and whether the answer ends with it; None when its framing broke."""
        if self.decoder is not None:
            try:
                data = self.decoder.feed(data)
            except HTTPError:
                self.broke()
                return None
            return data, self.decoder.done
        if self.length_framed:
            data = data[: self.left]
            self.left -= len(data)
            return data, not self.left
        return data, False

    def _emit(self, data: bytes) -> None:
        if data:
            self.out.write(b"%x\r\n%b\r\n" % (len(data), data) if self.chunk_out else data)

    def end(self) -> None:
        """The answer's last byte has come and gone on."""
        if self.finished:
            return
        self.finished = True
        self.proxy._feed_all()
        if self.watch is not None:
            rest = self.watch.finish()
            if self.on_body == self._own:
                self._emit(rest)
        if self.chunk_out:
            self.out.write(b"0\r\n\r\n")
        self._release_upstream(keep=self.keep_upstream)
        self.client.answered(self.close_client)
        self.proxy._finished(self, "ok" if self.status < 400 else f"http_{self.status}")

    def broke(self) -> None:
        """The upstream broke off mid-answer (closed, reset, bad framing or silent past the
        timeout): the client's connection closes where the answer stopped."""
        if self.finished:
            return
        self.finished = True
        self._release_upstream(keep=False)
        self.client.answered(close=True)
        self.proxy._finished(self, "incomplete")

    def upstream_lost(self, exc: BaseException | None) -> None:
        if self.finished:
            return
        if self.on_body is not None:
            if not self.framed and exc is None:
                self.end()  # the answer's end is the connection's
            else:
                self.broke()
            return
        if self.reused and not self.got and self.up is not None:
            # a kept-alive connection the upstream closed as the request went out: once more,
            # on a new one (no byte of an answer came)
            self.up.ex = None
            self.up, self.reused = None, False
            self.proxy._connect_soon(self)
            return
        self.unreachable(exc if exc is not None else ConnectionResetError())

    def unreachable(self, exc: BaseException) -> None:
        """No answer came: the proxy's own 502."""
        if self.finished:
            return
        self.finished = True
        self._release_upstream(keep=False)
        self.proxy.upstream_failures += 1
        close = not self.req.keep_alive
        message = f"loadlab record: upstream unreachable ({type(exc).__name__})"
        self.out.write(error_response(502, "Bad Gateway", message, "upstream_error", close=close))
        self.client.answered(close)
        self.proxy._finished(self, "upstream_error")

    def client_lost(self) -> None:
        if self.finished:
            return
        self.finished = True
        self._release_upstream(keep=False)
        self.client.busy = None
        self.proxy._finished(self, "client_disconnect")

    def pause(self, paused: bool) -> None:
        """The client's socket is full (or has room again): stop (or go on) reading the upstream."""
        self.paused = paused
        up = self.up
        if up is not None and up.transport is not None and not up.closed:
            if paused:
                up.transport.pause_reading()
            else:
                up.transport.resume_reading()

    def _release_upstream(self, *, keep: bool) -> None:
        up, self.up = self.up, None
        if up is None:
            return
        up.ex = None
        if self.paused and up.transport is not None and not up.closed:
            up.transport.resume_reading()
        self.proxy._release(up, keep=keep)


class RecordingProxy:
    def __init__(
        self,
        upstream: str,
        writer: TraceWriter,
        *,
        salt: bytes | None = None,
        block: int = 16,
        tokenize: Tokenize | None = None,
        ask_usage: bool = True,
        timeout_s: float = 600.0,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self._up = Upstream.of(self.upstream)
        self.writer = writer
        self.salt = salt if salt is not None else os.urandom(32)  # never written anywhere
        self.block = block
        self.tokenize = tokenize
        self.ask_usage = ask_usage
        self.timeout_s = timeout_s
        self._turns: OrderedDict[bytes, _Turn] = OrderedDict()
        self._count = 0
        self._sessions = 0
        self._t0_ns: int | None = None
        self._server: asyncio.Server | None = None
        self._ssl = ssl.create_default_context() if self._up.tls else None
        self._idle: list[_UpstreamConn] = []
        self._clients: set[_Client] = set()
        self._active: set[_Exchange] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._due: deque[tuple[Any, ...]] = deque()  # trace lines to write (_trace_due)
        self._feeds: list[tuple[StreamWatch, bytes, int]] = []  # payloads to read (_feed_soon)
        self.upstream_failures = 0

    async def start(self, host: str, port: int) -> int:
        """Starts listening; returns the port (a free one when ``port`` is 0)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Client(self), host, port, backlog=4096)
        await self.writer.start()
        self._spawn(self._watch_timeouts())
        return int(self._server.sockets[0].getsockname()[1]) if self._server.sockets else port

    async def stop(self) -> None:
        """Stops listening, lets answers in flight end (``STOP_GRACE_S``), then closes all."""
        if self._server is not None:
            self._server.close()
        deadline = time.monotonic() + STOP_GRACE_S
        while self._active and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for ex in list(self._active):
            ex.broke()
        for client in list(self._clients):
            if client.transport is not None:
                client.transport.abort()
        for up in self._idle:
            if up.transport is not None:
                up.transport.close()
        self._idle.clear()
        for task in list(self._tasks):
            task.cancel()
        while self._due:
            self._trace(*self._due.popleft())
        await self.writer.stop()

    def _exchange(self, client: _Client, req: Request) -> _Exchange:
        """A whole request from a client: send it upstream (its answer comes back in reads),
        then read its JSON for the trace; first only when the proxy may ask for usage in it."""
        api = api_of(req.path) if req.method == b"POST" else None
        body, traced, read = req.body, None, False
        if api in ("chat", "completions") and self.ask_usage and not _asks_usage(body):
            traced, read = _json_object(body), True
            body = (traced is not None and self._ask_usage(api, traced)) or body
        ex = _Exchange(self, client, req, upstream_request(self._up, req, body), api)
        self._active.add(ex)
        ex.sent_ns = time.perf_counter_ns()
        self._send(ex)
        if api is not None:  # its shape is read after the answer
            ex.traced = traced if read else _json_object(req.body)
            if ex.traced is not None:
                stream = bool(ex.traced.get("stream", False))
                ex.watch = StreamWatch(api, stream, drop_usage_event=body is not req.body)
        return ex

    def _send(self, ex: _Exchange) -> None:
        while self._idle:
            up = self._idle.pop()
            if not up.closed:
                ex.send(up, reused=True)
                return
        self._connect_soon(ex)

    def _connect_soon(self, ex: _Exchange) -> None:
        ex.last_ns = time.perf_counter_ns()
        self._spawn(self._connect(ex))

    async def _connect(self, ex: _Exchange) -> None:
        up = self._up
        try:
            _, conn = await asyncio.wait_for(
                asyncio.get_running_loop().create_connection(
                    _UpstreamConn, up.host, up.port, ssl=self._ssl,
                    server_hostname=up.host if self._ssl else None,
                ),
                self.timeout_s,
            )  # fmt: skip
        except (TimeoutError, OSError, ssl.SSLError) as exc:
            ex.unreachable(exc)
            return
        if ex.finished:  # the client left meanwhile
            self._release(conn, keep=True)
            return
        ex.send(conn, reused=False)

    def _release(self, up: _UpstreamConn, *, keep: bool) -> None:
        if keep and not up.closed and len(self._idle) < IDLE_KEPT:
            self._idle.append(up)
            return
        up.closed = True
        if up.transport is not None:
            up.transport.abort()  # one mid-answer cannot be reused; an extra one is not needed

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch_timeouts(self) -> None:
        """An upstream silent past ``timeout_s`` (no answer, or a stream that stalled) ends its
        exchange: 502 before the answer's head, ``incomplete`` after. A client that does not
        read (the proxy paused the upstream for it) is not the upstream's silence."""
        step = min(1.0, self.timeout_s / 4)
        limit_ns = int(self.timeout_s * 1e9)
        while True:
            await asyncio.sleep(step)
            now = time.perf_counter_ns()
            for ex in [e for e in self._active if not e.paused and now - e.last_ns > limit_ns]:
                if ex.on_body is None:
                    ex.unreachable(TimeoutError())
                else:
                    ex.broke()

    def _feed_soon(self, watch: StreamWatch, payload: bytes, t_ns: int) -> None:
        """Has the watch read a payload already passed on once the reads that came with it are
        passed on too: a burst of reads (every stream's next token at once) goes out at the
        cost of its writes, not of its writes and their reading."""
        self._feeds.append((watch, payload, t_ns))
        if len(self._feeds) == 1:
            asyncio.get_running_loop().call_soon(self._feed_all)

    def _feed_all(self) -> None:
        feeds, self._feeds = self._feeds, []
        for watch, payload, t_ns in feeds:
            watch.feed(payload, t_ns)

    def _finished(self, ex: _Exchange, outcome: str) -> None:
        """An exchange has ended: its trace line is due, written when no read is waiting."""
        self._feed_all()  # what its watch has yet to read
        self._active.discard(ex)
        if ex.api is None or ex.traced is None:
            return
        if outcome == "ok" and ex.watch is not None and ex.watch.stream_error:
            outcome = "stream_error"
        status = ex.status if outcome != "upstream_error" else 0
        watch = ex.watch if outcome != "upstream_error" else None
        due = (ex.api, ex.traced, ex.req.arrival_ns, ex.sent_ns, time.perf_counter_ns(), watch)
        if len(self._due) >= TRACE_DUE_MAX:  # behind: catch up now rather than hold more
            self._trace(*self._due.popleft())
        self._due.append((*due, outcome, status))
        if len(self._due) == 1:
            asyncio.get_running_loop().call_soon(self._trace_due)

    def _trace_due(self) -> None:
        """Writes the trace lines due, for at most ``TRACE_SLICE_NS`` per turn of the event
        loop: reading a request's shape costs tens of microseconds, and a burst of answers
        that end together would otherwise hold up the requests and reads that follow them."""
        until = time.perf_counter_ns() + TRACE_SLICE_NS
        due = self._due
        while due and time.perf_counter_ns() < until:
            self._trace(*due.popleft())
        if due:
            asyncio.get_running_loop().call_soon(self._trace_due)

    def _ask_usage(self, api: str, body: dict[str, Any]) -> bytes | None:
        """The body to send instead, asking for usage, for a stream that did not; else None."""
        options = body.get("stream_options")
        if (
            not self.ask_usage
            or api not in ("chat", "completions")
            or not body.get("stream", False)
            or not isinstance(options, Mapping | None)
            or (options or {}).get("include_usage")
        ):
            return None
        return orjson.dumps(body | {"stream_options": {**(options or {}), "include_usage": True}})

    def _trace(
        self,
        api: str,
        body: dict[str, Any],
        arrival_ns: int,
        sent_ns: int,
        end_ns: int,
        watch: StreamWatch | None,
        outcome: str,
        status: int,
    ) -> None:
        """Writes one request's trace line, its shape read after its answer ended (``end_ns``;
        no request waits for it); a body whose shape cannot be read is not traced."""
        try:
            shape = RequestShape.of(
                api, body, salt=self.salt, block=self.block, tokenize=self.tokenize
            )
        except (TypeError, ValueError, AttributeError):
            return
        if self._t0_ns is None:
            self._t0_ns = arrival_ns
        index = self._count
        self._count += 1
        prev = self._continues(shape)
        if prev is None:
            session, turn, new_from = self._sessions, 0, 0
            self._sessions += 1
        else:
            (j, before) = prev
            session, turn, new_from = before.session, before.turn + 1, j
        chain = shape.message_chain
        if chain:
            self._turns[chain[-1]] = _Turn(index, session, turn, end_ns)
            self._turns.move_to_end(chain[-1])
            while len(self._turns) > CONTINUATIONS_KEPT:
                self._turns.popitem(last=False)
        line = _line(shape, watch, outcome, status)
        line.update(
            id=index,
            timestamp=round((arrival_ns - self._t0_ns) / 1e6, 3),
            session=session,
            turn=turn,
            continues=None if prev is None else prev[1].line_id,
            think_ms=None if prev is None else round((arrival_ns - prev[1].end_ns) / 1e6, 3),
            new_length=_new_length(shape, new_from),
            new_kind=_new_kind(shape, new_from),
            proxy_ms=round((sent_ns - arrival_ns) / 1e6, 3),
        )
        line.update(_latencies(watch, sent_ns, end_ns))
        self.writer.put(line)

    def _continues(self, shape: RequestShape) -> tuple[int, _Turn] | None:
        """The earlier request whose messages this one repeats and adds to (the longest)."""
        chain = shape.message_chain
        for j in range(len(chain) - 1, 0, -1):
            found = self._turns.get(chain[j - 1])
            if found is not None:
                return j, found
        return None


def _asks_usage(body: bytes) -> bool:
    """The body asks for usage in its stream already (``"include_usage": true`` outside any
    string: a quote inside a JSON string is always escaped)."""
    return b'"include_usage":true' in body or b'"include_usage": true' in body


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _new_length(shape: RequestShape, start: int) -> int:
    """What a request adds to the one it continues: its messages after the repeated ones, less
    the earlier answer (the first assistant messages), in the trace's unit."""
    lengths = shape.message_lengths[start:]
    roles = shape.message_roles[start:]
    i = 0
    while start and i < len(roles) and roles[i] == "assistant":
        i += 1
    return sum(lengths[i:])


def _new_kind(shape: RequestShape, start: int) -> str:
    """``tool`` when what a request adds is tool results (an agent's next step), else ``user``."""
    return "tool" if "tool" in shape.message_roles[start:] and start else "user"


def _line(
    shape: RequestShape, watch: StreamWatch | None, outcome: str, status: int
) -> dict[str, Any]:
    usage = watch.usage if watch is not None else None
    return {
        "input_length": usage.prompt_tokens if usage and usage.prompt_tokens is not None else None,
        "output_length": usage.output_tokens if usage and usage.output_tokens is not None else None,
        "hash_ids": shape.hash_ids,
        "api": shape.api,
        "model": shape.model,
        "stream": shape.stream,
        "max_tokens": shape.max_tokens,
        "params": shape.params,
        "status": status,
        "outcome": outcome,
        "cached_tokens": usage.cached_tokens if usage else None,
        "reasoning_tokens": usage.reasoning_tokens if usage else None,
        "prompt_length": shape.prompt_length,
        "messages": shape.roles,
        "tools": shape.tools,
        "tools_length": shape.tools_length,
        "tool_calls": shape.tool_calls,
        "images": shape.images,
        "images_unsized": shape.images_unsized,
        "reply_length": watch.reply_chars if watch else 0,
        "answer_tool_call": watch.called_tool if watch else False,
        "tool_choice": shape.tool_choice,
        "chunks": len(watch.token_times_ns) if watch else 0,
    }


def _latencies(watch: StreamWatch | None, sent_ns: int, end_ns: int) -> dict[str, Any]:
    """TTFT, ITL (p50 and max) and E2E as the proxy saw them, in ms from its send upstream."""
    times = watch.token_times_ns if watch is not None else []
    if not times:
        return {
            "ttft_ms": None,
            "itl_ms_p50": None,
            "itl_ms_max": None,
            "e2e_ms": round((end_ns - sent_ns) / 1e6, 3),
        }
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    return {
        "ttft_ms": round((times[0] - sent_ns) / 1e6, 3),
        "itl_ms_p50": round(gaps[len(gaps) // 2] / 1e6, 3) if gaps else None,
        "itl_ms_max": round(gaps[-1] / 1e6, 3) if gaps else None,
        "e2e_ms": round((times[-1] - sent_ns) / 1e6, 3),
    }

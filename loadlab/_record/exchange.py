"""The recording proxy's connections: a client's (``Client``), the upstream's, kept alive
between answers (``UpstreamConn``), and one request with its answer (``Exchange``): asyncio
protocols that the proxy (``Hub``, which ``loadlab._record.proxy.RecordingProxy`` is) drives.

A client's request is read whole and handed to the hub, which sends it upstream; the answer's
reads come to its exchange, which writes each to the client as it came (a chunked body's
framing untouched) and then has the stream watch read its payload; or, when the bytes change
on the way (the proxy took out the usage event it asked for; an HTTP/1.0 client), sends the
body in chunks of its own. A client whose socket is full pauses the upstream's reads until it
drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable
from typing import Protocol, cast

from loadlab._record.relay import (
    MAX_HEAD,
    ChunkDecoder,
    HTTPError,
    Request,
    RequestReader,
    ResponseHead,
    client_head,
    error_response,
)
from loadlab._record.stream import StreamWatch

__all__ = ["Client", "Exchange", "Hub", "UpstreamConn"]

_PIPELINED = 1 << 20  # a client's bytes read ahead of its answer before the proxy stops reading
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Hub(Protocol):
    """What the connections ask of the proxy."""

    clients: set[Client]
    watched: dict[int, Client]  # by descriptor: connections between requests (the lookout)

    def exchange(self, client: Client, req: Request) -> Exchange: ...

    def watch(self, conn: Client) -> None: ...

    def forget(self, conn: Client) -> None: ...

    def look(self) -> None: ...

    def warm(self) -> None: ...

    def connect_soon(self, ex: Exchange) -> None: ...

    def release(self, up: UpstreamConn, *, keep: bool) -> None: ...

    def feed_soon(self, watch: StreamWatch, payload: bytes, t_ns: int) -> None: ...

    def feed_all(self) -> None: ...

    def finished(self, ex: Exchange, outcome: str) -> None: ...


def _raw_fd(transport: asyncio.BaseTransport) -> int:
    """The socket's descriptor, for the lookout to read it; -1 over TLS (its bytes are the
    TLS layer's to read) or where there is none."""
    sock = transport.get_extra_info("socket")
    if sock is None or transport.get_extra_info("sslcontext") is not None:
        return -1
    return int(sock.fileno())


def _no_delay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Client(asyncio.Protocol):
    """A client's connection: its requests, one at a time (pipelined ones wait their turn)."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # connection_made
        self.fd = -1  # the socket's descriptor, for the hub's lookout (-1: none)
        self.reader = RequestReader()
        self.busy: Exchange | None = None
        self.eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        _no_delay(self.transport)
        self.fd = _raw_fd(self.transport)
        self.hub.clients.add(self)
        self.hub.warm()
        self.hub.watch(self)  # its first request

    def read_now(self) -> None:
        """The lookout saw this connection readable between requests: read its request now, as
        the loop would have once the reads ahead of it were done. What is not there (a close,
        an error, nothing after all) is left for the loop's own read to find."""
        transport = self.transport
        if self.busy is not None or transport is None or transport.is_closing():
            return
        try:
            data = os.read(self.fd, 1 << 18)
        except OSError:
            return
        if data:
            self.data_received(data)

    def data_received(self, data: bytes) -> None:
        t_ns = time.perf_counter_ns()
        watched = self.hub.watched
        if watched and watched.get(self.fd) is self:
            del watched[self.fd]  # a request is coming: not idle any more
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
            self.busy = self.hub.exchange(self, req)

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
        if self.busy is None:
            self.hub.watch(self)  # its next request

    def eof_received(self) -> bool | None:
        if self.busy is not None:  # a client that half-closed still gets its answer
            self.eof = True
            return True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.hub.clients.discard(self)
        self.hub.forget(self)
        if self.busy is not None:
            self.busy.client_lost()

    def pause_writing(self) -> None:
        if self.busy is not None:
            self.busy.pause(True)

    def resume_writing(self) -> None:
        if self.busy is not None:
            self.busy.pause(False)


class UpstreamConn(asyncio.Protocol):
    """A connection to the upstream, kept alive between answers; it hands each read to the
    exchange it serves."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # connection_made
        self.ex: Exchange | None = None
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
        if self.hub.watched:  # a request may have come in while this read went on
            self.hub.look()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.ex is not None:
            self.ex.upstream_lost(exc)


class Exchange:
    """One request and its answer, from the client's request to the answer's last byte."""

    def __init__(
        self, hub: Hub, client: Client, req: Request, request_bytes: bytes,
        api: str | None,
    ) -> None:  # fmt: skip
        self.hub = hub
        self.client = client
        self.out = client.transport
        self.req = req
        self.request_bytes = request_bytes
        self.api = api
        self.watch: StreamWatch | None = None
        self.up: UpstreamConn | None = None
        self.reused = False
        self.sent_ns = self.last_ns = 0
        self.status = 0
        self.head = bytearray()
        self.on_body: Callable[[bytes, int], None] | None = None
        self.decoder: ChunkDecoder | None = None
        self.left = 0  # a Content-Length body's bytes still to come
        self.length_framed = False  # by Content-Length (chunked: ``decoder`` is set)
        self.got = False  # a byte of the answer came
        self.chunk_out = False  # the body goes out in the proxy's own chunks
        self.close_client = False
        self.keep_upstream = False
        self.paused = False
        self.finished = False

    def send(self, up: UpstreamConn, *, reused: bool) -> None:
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
                    if len(self.head) > MAX_HEAD:
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
        self.length_framed = head.length is not None
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
        """A chunked answer's read: to the client untouched, then its payload to the watch
        (``_pass`` then ``_watch`` and ``_payload`` inlined: this runs for every read)."""
        self.out.write(data)
        decoder: ChunkDecoder = self.decoder  # type: ignore[assignment]  # set with this handler
        try:
            payload = decoder.feed(data)
        except HTTPError:
            self.broke()
            return
        if payload and self.watch is not None:
            self.hub.feed_soon(self.watch, payload, t_ns)
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
            self.hub.feed_soon(self.watch, payload, t_ns)
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
        self.hub.feed_all()
        if self.watch is not None:
            rest = self.watch.finish()
            if self.on_body == self._own:
                self._emit(rest)
        if self.chunk_out:
            self.out.write(b"0\r\n\r\n")
        self._release_upstream(keep=self.keep_upstream)
        self.client.answered(self.close_client)
        self.hub.finished(self, "ok" if self.status < 400 else f"http_{self.status}")

    def broke(self) -> None:
        """The upstream broke off mid-answer (closed, reset, bad framing or silent past the
        timeout): the client's connection closes where the answer stopped."""
        if self.finished:
            return
        self.finished = True
        self._release_upstream(keep=False)
        self.client.answered(close=True)
        self.hub.finished(self, "incomplete")

    def upstream_lost(self, exc: BaseException | None) -> None:
        if self.finished:
            return
        if self.on_body is not None:
            if not self.length_framed and self.decoder is None and exc is None:
                self.end()  # the answer's end is the connection's
            else:
                self.broke()
            return
        if self.reused and not self.got and self.up is not None:
            # a kept-alive connection the upstream closed as the request went out: once more,
            # on a new one (no byte of an answer came)
            self.up.ex = None
            self.up, self.reused = None, False
            self.hub.connect_soon(self)
            return
        self.unreachable(exc if exc is not None else ConnectionResetError())

    def unreachable(self, exc: BaseException) -> None:
        """No answer came: the proxy's own 502."""
        if self.finished:
            return
        self.finished = True
        self._release_upstream(keep=False)
        close = not self.req.keep_alive
        message = f"loadlab record: upstream unreachable ({type(exc).__name__})"
        self.out.write(error_response(502, "Bad Gateway", message, "upstream_error", close=close))
        self.client.answered(close)
        self.hub.finished(self, "upstream_error")

    def client_lost(self) -> None:
        if self.finished:
            return
        self.finished = True
        self._release_upstream(keep=False)
        self.client.busy = None
        self.hub.finished(self, "client_disconnect")

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
        self.hub.release(up, keep=keep)

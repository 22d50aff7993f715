"""A minimal HTTP/1.1 server layer on raw asyncio, for the test servers on loopback.

Why not aiohttp.web or uvicorn: the fixed-schedule server must write ~50k chunks/s on a core
it shares with the load generator, and the fault server must misbehave at the byte level
(reset a socket mid-chunk, stall, send a malformed frame). A ``Protocol`` that writes
prebuilt bytes to its transport does both with no framework between the schedule and the
socket. It handles keep-alive, ``Content-Length`` request bodies and one request at a time per
connection (clients do not pipeline); it is not a general web server.

Example::

    class Hello:
        def handle(self, conn: HTTPConnection, req: Request) -> None:
            conn.respond(200, b'{"ok": true}')

    server = await loop.create_server(lambda: HTTPConnection(Hello()), "127.0.0.1", 0)
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from loadlab.clients._state import dumps, loads

__all__ = [
    "App",
    "HTTPConnection",
    "Handoff",
    "Request",
    "chunk_frame",
    "json_bytes",
    "parse_json_body",
]

_MAX_HEAD_BYTES = 64 * 1024
_MAX_BODY_BYTES = 64 * 1024 * 1024
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Content Too Large",
    429: "Too Many Requests",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    # perf_counter_ns when the read that completed the request returned, taken before any
    # parsing (of this request or, with a ``Handoff``, of others)
    recv_ns: int

    @property
    def keep_alive(self) -> bool:
        return self.headers.get("connection", "").lower() != "close"


class App(Protocol):
    def handle(self, conn: HTTPConnection, req: Request) -> None: ...

    def connection_lost(self, conn: HTTPConnection) -> None: ...


def json_bytes(obj: Any) -> bytes:
    """Compact JSON (orjson when present: the fixed server builds a few per request)."""
    return dumps(obj)


def chunk_frame(data: bytes) -> bytes:
    """One HTTP/1.1 chunked-transfer frame."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def parse_json_body(req: Request) -> dict[str, Any] | None:
    raw = req.body or b"{}"
    try:
        body = loads(raw)
    except ValueError:  # orjson refuses some valid JSON (integers past 64 bits): json decides
        try:
            body = json.loads(raw)
        except ValueError:  # not JSON, or not UTF-8
            return None
    return body if isinstance(body, dict) else None


class Handoff:
    """Requests stamped as they arrive, handed to the app after the event loop's turn of reads,
    ``slice_ns`` of handling per turn: the loop reads its sockets between slices.

    Handled inside the read that completed it, a request delays the reads (and so the arrival
    stamps) of every connection behind it; a burst of big requests (a JSON body of tens of
    kilobytes, its words counted) would be stamped later and later. Here a request's stamp
    waits for at most one slice of other requests' handling."""

    def __init__(self, slice_ns: int = 200_000) -> None:
        self.slice_ns = slice_ns
        self.items: deque[tuple[HTTPConnection, Request]] = deque()
        self.scheduled = False

    def add(self, conn: HTTPConnection, req: Request) -> None:
        self.items.append((conn, req))
        if not self.scheduled:
            self._schedule()

    def _schedule(self) -> None:
        self.scheduled = True
        asyncio.get_running_loop().call_soon(self._turn)

    def _turn(self) -> None:
        self.scheduled = False
        until = time.perf_counter_ns() + self.slice_ns
        while self.items:
            conn, req = self.items.popleft()
            conn.app.handle(conn, req)
            if self.items and time.perf_counter_ns() >= until:
                self._schedule()  # the rest after the loop has read its sockets again
                return


class HTTPConnection(asyncio.Protocol):
    """One client connection. The app answers with ``respond`` (a whole response) or
    ``start_stream`` + ``write`` + ``end_stream`` (chunked), then the next request is read.

    ``handoff``: requests go to the app through it (``Handoff``), not from inside the read
    that completed them."""

    def __init__(self, app: App, handoff: Handoff | None = None) -> None:
        self.app = app
        self.handoff = handoff
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._read_ns = 0  # when the last read returned
        self._buf = b""
        self._busy = False  # a response is in progress; later bytes wait in _buf
        self._keep_alive = True
        self.state: Any = None  # the app's per-connection state (e.g. the current stream)

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self._read_ns = time.perf_counter_ns()  # first: when these bytes arrived
        self._buf += data
        if not self._busy:
            self._next_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.app.connection_lost(self)

    # ------------------------------------------------------------------ responses

    def respond(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        head = self._head(status, content_type, headers) + b"Content-Length: %d\r\n\r\n" % len(body)
        self.write(head + body)
        self.finish()

    def start_stream(
        self, status: int = 200, content_type: str = "text/event-stream", first: bytes = b""
    ) -> None:
        """Status line and headers (chunked), plus an optional first chunk, in one write."""
        head = self._head(status, content_type, None) + b"Transfer-Encoding: chunked\r\n\r\n"
        self.write(head + (chunk_frame(first) if first else b""))

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def end_stream(self, last: bytes = b"") -> None:
        self.write((chunk_frame(last) if last else b"") + b"0\r\n\r\n")
        self.finish()

    def finish(self) -> None:
        """The response is complete: read the next request, or close without keep-alive."""
        self._busy = False
        self.state = None
        if not self._keep_alive:
            self.close()
        elif self._buf and not self.closed:
            self._next_request()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Reset the connection (RST, no FIN): what a crashing server looks like."""
        if self.transport is not None:
            self.transport.abort()

    # ------------------------------------------------------------------ parsing

    def _head(self, status: int, content_type: str, headers: dict[str, str] | None) -> bytes:
        lines = [
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}",
            f"Content-Type: {content_type}",
        ]
        if not self._keep_alive:
            lines.append("Connection: close")
        for k, v in (headers or {}).items():
            lines.append(f"{k}: {v}")
        return ("\r\n".join(lines) + "\r\n").encode("latin-1")

    def _next_request(self) -> None:
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > _MAX_HEAD_BYTES:
                self._fail(413, "request head too large")
            return
        try:
            lines = self._buf[:end].decode("latin-1").split("\r\n")
            method, target, _version = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0"))
        except ValueError:
            self._fail(400, "malformed request head")
            return
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._fail(411, "send Content-Length; chunked request bodies are not supported")
            return
        if length > _MAX_BODY_BYTES:
            self._fail(413, "request body too large")
            return
        start = end + 4
        if len(self._buf) < start + length:
            return  # wait for the rest of the body
        body = self._buf[start : start + length]
        self._buf = self._buf[start + length :]
        req = Request(method, target.split("?", 1)[0], headers, body, self._read_ns)
        self._busy = True
        self._keep_alive = req.keep_alive
        if self.handoff is not None:
            self.handoff.add(self, req)
        else:
            self.app.handle(self, req)

    def _fail(self, status: int, message: str) -> None:
        self._busy = True
        self._keep_alive = False
        self._buf = b""
        self.respond(status, json_bytes({"error": {"message": message, "type": "invalid_request"}}))

"""HTTP/1.1 for ``loadlab record``'s relay, without I/O: a request read off the client's bytes
(``RequestReader``), the request sent upstream (``upstream_request``), the answer's head
(``ResponseHead``) and what the client gets of it (``client_head``), and a chunked body's
payload read beside the bytes that pass through untouched (``ChunkDecoder``).

Scope is what a reverse proxy for inference APIs needs: requests with a ``Content-Length`` body
or a chunked one (sent upstream with its length), ``Expect: 100-continue``, pipelined requests;
answers framed by ``Transfer-Encoding: chunked``, ``Content-Length`` or the connection's close.
No upgrades (WebSocket), no ``CONNECT``.

>>> reader = RequestReader()
>>> req = reader.feed(b"POST /v1/completions HTTP/1.1\\r\\nContent-Length: 2\\r\\n\\r\\n{}", 7)
>>> req.method, req.target, req.body, req.keep_alive
(b'POST', b'/v1/completions', b'{}', True)
>>> dec = ChunkDecoder()
>>> dec.feed(b"2\\r\\nhi\\r\\n3\\r\\n yo\\r\\n0\\r\\n\\r\\n"), dec.done
(b'hi yo', True)
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

import orjson

__all__ = [
    "MAX_BODY",
    "ChunkDecoder",
    "HTTPError",
    "Request",
    "RequestReader",
    "ResponseHead",
    "Upstream",
    "client_head",
    "error_response",
    "upstream_request",
]

MAX_HEAD = 64 << 10  # a request's or an answer's head
MAX_BODY = 256 << 20  # a request's body
_MAX_LINE = 4096  # a chunk-size or trailer line
# headers of one hop (RFC 9110 7.6.1), never forwarded; a request's Host and framing are the
# proxy's to write
_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"proxy-connection",
     b"te", b"trailer", b"trailers", b"upgrade"}
)  # fmt: skip
_REQUEST_OWN = _HOP | {b"host", b"content-length", b"transfer-encoding", b"expect"}
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})
_SIZE, _DATA, _CRLF, _TRAILER, _DONE = range(5)  # ChunkDecoder's states


class HTTPError(Exception):
    """A request the proxy answers itself (``status``), or an answer it cannot read."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ChunkDecoder:
    """A chunked body's payload, read a piece at a time (``feed``); ``done`` after the last
    chunk and its trailers. Bad framing raises ``HTTPError``."""

    __slots__ = ("_left", "_line", "_state", "done", "rest")

    def __init__(self) -> None:
        self._state = _SIZE
        self._left = 0  # bytes of chunk data (or of its closing CRLF) still to come
        self._line = b""  # a size or trailer line split across reads
        self.done = False
        self.rest = b""  # bytes fed after the body's end

    def feed(self, data: bytes) -> bytes:
        if self._line:
            data, self._line = self._line + data, b""
        out: list[bytes] = []
        pos, n = 0, len(data)
        while pos < n:
            state = self._state
            if state == _DATA:
                end = pos + self._left
                if end <= n:
                    out.append(data[pos:end])
                    pos, self._state, self._left = end, _CRLF, 2
                else:
                    out.append(data[pos:])
                    self._left, pos = end - n, n
            elif state == _CRLF:
                take = min(self._left, n - pos)
                pos, self._left = pos + take, self._left - take
                if not self._left:
                    self._state = _SIZE
            elif state == _DONE:
                self.rest = data[pos:]  # the caller's to judge
                break
            else:
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    if n - pos > _MAX_LINE:
                        raise HTTPError(502, "chunked body: a line past 4 KiB")
                    self._line = data[pos:]
                    break
                if state == _SIZE:
                    self._size(data[pos:eol])
                elif eol == pos:
                    self._state, self.done = _DONE, True
                pos = eol + 2
        return out[0] if len(out) == 1 else b"".join(out)

    def _size(self, line: bytes) -> None:
        try:
            size = int(line.split(b";", 1)[0], 16)
        except ValueError:
            size = -1
        if size < 0:
            raise HTTPError(502, "chunked body: a chunk size that is not hexadecimal")
        self._state, self._left = (_DATA, size) if size else (_TRAILER, 0)


@dataclass(slots=True)
class Request:
    method: bytes
    target: bytes  # as sent: ``/path?query``
    version: bytes  # b"HTTP/1.1"
    headers: list[tuple[bytes, bytes]]  # (lower-case name, value) in order
    raw_headers: list[bytes]  # each header line as it came, in the same order
    body: bytes
    arrival_ns: int  # when its first byte was read
    keep_alive: bool

    @property
    def path(self) -> str:
        return self.target.split(b"?", 1)[0].decode("latin-1")


class RequestReader:
    """Requests off a client connection's bytes: ``feed(data, t_ns)`` returns the next whole
    request (or None until it is whole); ``next(t_ns)`` the one after it from bytes already
    read. ``continue_due`` is set once per request that asked for ``100 Continue``."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self._arrival_ns = 0
        self._head: tuple[bytes, bytes, bytes, list[tuple[bytes, bytes]], list[bytes]] | None = None
        self._body_at = 0
        self._length = 0
        self._chunked: ChunkDecoder | None = None
        self._payload = bytearray()
        self.continue_due = False

    def feed(self, data: bytes, t_ns: int) -> Request | None:
        self.hold(data, t_ns)
        return self.next(t_ns)

    def hold(self, data: bytes, t_ns: int) -> None:
        """Keep bytes read while an earlier request's answer is in flight."""
        if not self.buf:
            self._arrival_ns = t_ns
        self.buf += data

    def next(self, t_ns: int) -> Request | None:
        if not self.buf:
            return None
        if self._head is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > MAX_HEAD:
                    raise HTTPError(431, "request head past 64 KiB")
                return None
            self._head = _request_head(bytes(self.buf[:end]))
            self._body_at = end + 4
            self._start_body(self._head[3])
        if self._chunked is not None:
            got = self._chunked.feed(bytes(self.buf[self._body_at :]))
            self._payload += got
            if len(self._payload) > MAX_BODY:
                raise HTTPError(413, "request body past 256 MiB")
            del self.buf[: self._body_at]
            self._body_at = 0
            if not self._chunked.done:
                return None
            body, self._payload = bytes(self._payload), bytearray()
            self.buf[:] = self._chunked.rest  # a pipelined request's bytes
        else:
            end = self._body_at + self._length
            if len(self.buf) < end:
                return None
            body = bytes(self.buf[self._body_at : end])
            del self.buf[:end]
        method, target, version, headers, raw = self._head
        self._head, self._chunked, self.continue_due = None, None, False
        arrival, self._arrival_ns = self._arrival_ns, t_ns
        return Request(
            method, target, version, headers, raw, body, arrival, _keep_alive(version, headers)
        )

    def _start_body(self, headers: list[tuple[bytes, bytes]]) -> None:
        values = dict(headers)
        if b"chunked" in values.get(b"transfer-encoding", b"").lower():
            self._chunked, self._payload = ChunkDecoder(), bytearray()
        else:
            try:
                self._length = int(values.get(b"content-length", b"0"))
            except ValueError:
                raise HTTPError(400, "Content-Length is not a number") from None
            if self._length < 0:
                raise HTTPError(400, "Content-Length is negative")
            if self._length > MAX_BODY:
                raise HTTPError(413, "request body past 256 MiB")
        body_due = self._chunked is not None or self._length > len(self.buf) - self._body_at
        self.continue_due = body_due and values.get(b"expect", b"").lower() == b"100-continue"


def _request_head(
    head: bytes,
) -> tuple[bytes, bytes, bytes, list[tuple[bytes, bytes]], list[bytes]]:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise HTTPError(400, "not an HTTP/1.x request line")
    method, target, version = parts
    if not target.startswith(b"/"):  # absolute form: the path is what the upstream gets
        split = urlsplit(target.decode("latin-1"))
        target = ((split.path or "/") + (f"?{split.query}" if split.query else "")).encode(
            "latin-1"
        )
    headers, raw = [], []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise HTTPError(400, "a malformed header line")
        headers.append((name.lower(), value.strip()))
        raw.append(line)
    return method, target, version, headers, raw


def _keep_alive(version: bytes, headers: list[tuple[bytes, bytes]]) -> bool:
    tokens = _connection_tokens(headers)
    if version == b"HTTP/1.0":
        return b"keep-alive" in tokens
    return b"close" not in tokens


def _connection_tokens(headers: list[tuple[bytes, bytes]]) -> set[bytes]:
    return {
        t.strip().lower()
        for name, value in headers
        if name == b"connection"
        for t in value.split(b",")
    }


@dataclass(frozen=True)
class Upstream:
    """Where requests go: ``Upstream.of("http://host:port/prefix")``."""

    host: str
    port: int
    tls: bool
    netloc: bytes  # the Host header
    prefix: bytes  # a path the upstream's routes start with, or b""

    @classmethod
    def of(cls, url: str) -> Upstream:
        split = urlsplit(url)
        if split.scheme not in ("http", "https") or not split.hostname:
            raise ValueError(f"upstream {url!r}: give an http:// or https:// URL")
        tls = split.scheme == "https"
        port = split.port or (443 if tls else 80)
        netloc = split.netloc.rsplit("@", 1)[-1]
        return cls(split.hostname, port, tls, netloc.encode(), split.path.rstrip("/").encode())


def upstream_request(up: Upstream, req: Request, body: bytes) -> bytes:
    """The request's bytes for the upstream: its method, path and headers as they came but for
    this hop's (Host, framing, ``Connection`` and the headers it names), with ``body``."""
    own = _REQUEST_OWN | _connection_tokens(req.headers)
    lines = [b"%s %s%s HTTP/1.1" % (req.method, up.prefix, req.target), b"Host: " + up.netloc]
    lines += [
        raw for (name, _), raw in zip(req.headers, req.raw_headers, strict=True) if name not in own
    ]
    if body or req.method not in (b"GET", b"HEAD", b"DELETE", b"OPTIONS"):
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


@dataclass(slots=True)
class ResponseHead:
    """An answer's status line and headers, and how its body is framed."""

    status: int
    status_line: bytes
    headers: list[tuple[bytes, bytes]]  # (lower-case name, value)
    raw_headers: list[bytes]
    chunked: bool
    length: int | None  # None: chunked, or until the connection closes
    keep_alive: bool  # the upstream keeps the connection (when the body's end is known)

    @classmethod
    def parse(cls, head: bytes) -> ResponseHead:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise HTTPError(502, "the upstream's answer has no HTTP/1.x status line")
        headers, raw = [], []
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if colon and name:
                headers.append((name.strip().lower(), value.strip()))
                raw.append(line)
        values = dict(headers)
        chunked = b"chunked" in values.get(b"transfer-encoding", b"").lower()
        length = None
        if not chunked and b"content-length" in values:
            try:
                length = int(values[b"content-length"])
            except ValueError:
                raise HTTPError(502, "the upstream's Content-Length is not a number") from None
        keep = _keep_alive(parts[0], headers)
        return cls(int(parts[1]), lines[0], headers, raw, chunked, length, keep)


def client_head(head: ResponseHead, *, own_framing: bool, chunked: bool, close: bool) -> bytes:
    """The answer's head for the client: as it came but for this hop's headers. ``own_framing``:
    the body's bytes change on the way (the upstream's framing headers go), sent in chunks of
    the proxy's own when ``chunked``, else until the connection closes; ``close``: the
    connection closes after this answer."""
    drop = _HOP | _connection_tokens(head.headers)
    if own_framing:
        drop |= _FRAMING
    lines = [b"HTTP/1.1" + head.status_line[8:]]
    lines += [
        raw
        for (name, _), raw in zip(head.headers, head.raw_headers, strict=True)
        if name not in drop
    ]
    if own_framing and chunked:
        lines.append(b"Transfer-Encoding: chunked")
    if close:
        lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def error_response(status: int, reason: str, message: str, kind: str, *, close: bool) -> bytes:
    """A JSON error of the proxy's own (an OpenAI-shaped ``error`` object)."""
    body = orjson.dumps({"error": {"message": message, "type": kind}})
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n" + ("Connection: close\r\n" if close else "") + "\r\n"
    )
    return head.encode() + body

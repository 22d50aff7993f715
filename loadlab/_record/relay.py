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

import re
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
        if self._state == _SIZE and not self._line:  # the usual read: one whole chunk
            eol = data.find(b"\r\n", 0, 18)
            try:
                end = eol + 2 + int(data[:eol], 16)
            except ValueError:  # the full way says what is wrong
                end = -1
            if eol > 0 and end + 2 == len(data) and end > eol + 2 and data.endswith(b"\r\n"):
                return data[eol + 2 : end]
        elif self._line:
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
    fields: bytes  # the header lines as they came, each after its CRLF: b"\\r\\nHost: ..."
    tokens: set[bytes]  # the Connection header's
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
        self._head: _Head | None = None
        self._body_at = 0
        self._chunked: ChunkDecoder | None = None
        self._payload = bytearray()
        self.continue_due = False

    def feed(self, data: bytes, t_ns: int) -> Request | None:
        if not self.buf and self._head is None:  # the usual case: one read, one request
            self._arrival_ns = t_ns
            end = data.find(b"\r\n\r\n")
            if end >= 0:
                head = _Head.parse(data[:end])
                if not head.chunked and len(data) == end + 4 + head.length:
                    return self._request(head, data[end + 4 :], t_ns)
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
        head = self._head
        if head is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > MAX_HEAD:
                    raise HTTPError(431, "request head past 64 KiB")
                return None
            self._head = head = _Head.parse(bytes(self.buf[:end]))
            self._body_at = end + 4
            if head.chunked:
                self._chunked, self._payload = ChunkDecoder(), bytearray()
            self.continue_due = head.expect_continue and (
                head.chunked or head.length > len(self.buf) - self._body_at
            )
        if self._chunked is not None:
            self._payload += self._chunked.feed(bytes(self.buf[self._body_at :]))
            if len(self._payload) > MAX_BODY:
                raise HTTPError(413, "request body past 256 MiB")
            self.buf.clear()  # the decoder took it all (a split size line it keeps)
            self._body_at = 0
            if not self._chunked.done:
                return None
            body, self._payload = bytes(self._payload), bytearray()
            self.buf += self._chunked.rest  # a pipelined request's bytes
        else:
            end = self._body_at + head.length
            if len(self.buf) < end:
                return None
            body = bytes(self.buf[self._body_at : end])
            del self.buf[:end]
        return self._request(head, body, t_ns)

    def _request(self, head: _Head, body: bytes, t_ns: int) -> Request:
        self._head, self._chunked, self.continue_due = None, None, False
        arrival, self._arrival_ns = self._arrival_ns, t_ns
        return Request(
            head.method, head.target, head.version, head.fields, head.tokens, body, arrival,
            head.keep_alive,
        )  # fmt: skip


def _field(name: bytes) -> re.Pattern[bytes]:
    """Header lines (each with the CRLF before it) whose name is one of ``name`` (a regex)."""
    return re.compile(rb"\r\n(?:" + name + rb")[ \t]*:[^\r]*", re.IGNORECASE)


_HOP_NAMES = rb"connection|keep-alive|proxy-[a-z-]+|te|trailers?|upgrade"
_HOP_LINES = _field(_HOP_NAMES)  # removed from an answer
_HOP_FRAMING_LINES = _field(_HOP_NAMES + rb"|content-length|transfer-encoding")
_REQUEST_OWN_LINES = _field(_HOP_NAMES + rb"|host|content-length|transfer-encoding|expect")
# the header lines that decide framing and the connection's life, with their values
_FRAMING = re.compile(
    rb"\r\n(content-length|transfer-encoding|connection|expect)[ \t]*:[ \t]*([^\r]*)", re.IGNORECASE
)
_NO_COLON = re.compile(rb"\r\n[^:\r]*(?:\r|$)")  # a header line that is not ``name: value``
_PLAIN_TOKENS = frozenset({b"close", b"keep-alive", b""})


def _framing(fields: bytes) -> tuple[int | None, bool, set[bytes], bool]:
    """(Content-Length, chunked, the Connection header's tokens, ``Expect: 100-continue``) of
    header lines; a Content-Length that is not a number is -1."""
    length, chunked, tokens, expect = None, False, set(), False
    for name, value in _FRAMING.findall(fields):
        name = name.lower()
        if name == b"content-length":
            length = int(value) if value.strip().isdigit() else -1
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            tokens |= {t.strip() for t in value.lower().split(b",")}
        else:
            expect = value.strip().lower() == b"100-continue"
    return length, chunked, tokens, expect


def _without(fields: bytes, lines: re.Pattern[bytes], tokens: set[bytes]) -> bytes:
    """Header lines less those ``lines`` matches and those the Connection header names."""
    fields = lines.sub(b"", fields)
    named = tokens - _PLAIN_TOKENS
    if named:
        fields = _field(b"|".join(re.escape(t) for t in named)).sub(b"", fields)
    return fields


@dataclass(slots=True)
class _Head:
    method: bytes
    target: bytes
    version: bytes
    fields: bytes
    length: int
    chunked: bool
    tokens: set[bytes]
    expect_continue: bool
    keep_alive: bool

    @classmethod
    def parse(cls, head: bytes) -> _Head:
        eol = head.find(b"\r\n")
        line, fields = (head, b"") if eol < 0 else (head[:eol], head[eol:])
        parts = line.split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            raise HTTPError(400, "not an HTTP/1.x request line")
        method, target, version = parts
        if not target.startswith(b"/"):  # absolute form: the path is what the upstream gets
            split = urlsplit(target.decode("latin-1"))
            query = f"?{split.query}" if split.query else ""
            target = ((split.path or "/") + query).encode("latin-1")
        if _NO_COLON.search(fields):
            raise HTTPError(400, "a header line that is not name: value")
        length, chunked, tokens, expect = _framing(fields)
        if length is not None and length < 0:
            raise HTTPError(400, "Content-Length is not a number")
        if (length or 0) > MAX_BODY:
            raise HTTPError(413, "request body past 256 MiB")
        keep = b"keep-alive" in tokens if version == b"HTTP/1.0" else b"close" not in tokens
        return cls(method, target, version, fields, length or 0, chunked, tokens, expect, keep)


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
            raise ValueError("--upstream: give an http:// or https:// URL with a host")
        tls = split.scheme == "https"
        port = split.port or (443 if tls else 80)
        netloc = split.netloc.rsplit("@", 1)[-1]
        return cls(split.hostname, port, tls, netloc.encode(), split.path.rstrip("/").encode())


def upstream_request(up: Upstream, req: Request, body: bytes) -> bytes:
    """The request's bytes for the upstream: its method, path and headers as they came but for
    this hop's (Host, framing, ``Connection`` and the headers it names), with ``body``."""
    fields = _without(req.fields, _REQUEST_OWN_LINES, req.tokens)
    length = b""
    if body or req.method not in (b"GET", b"HEAD", b"DELETE", b"OPTIONS"):
        length = b"\r\nContent-Length: %d" % len(body)
    return b"%s %s%s HTTP/1.1\r\nHost: %s%s%s\r\n\r\n%s" % (
        req.method, up.prefix, req.target, up.netloc, fields, length, body
    )  # fmt: skip


@dataclass(slots=True)
class ResponseHead:
    """An answer's status line and headers, and how its body is framed."""

    status: int
    status_line: bytes
    fields: bytes  # header lines, each after its CRLF
    tokens: set[bytes]  # the Connection header's
    chunked: bool
    length: int | None  # None: chunked, or until the connection closes
    keep_alive: bool  # the upstream keeps the connection (when the body's end is known)

    @classmethod
    def parse(cls, head: bytes) -> ResponseHead:
        eol = head.find(b"\r\n")
        line, fields = (head, b"") if eol < 0 else (head[:eol], head[eol:])
        parts = line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise HTTPError(502, "the upstream's answer has no HTTP/1.x status line")
        length, chunked, tokens, _ = _framing(fields)
        if length is not None and length < 0 and not chunked:
            raise HTTPError(502, "the upstream's Content-Length is not a number")
        keep = b"keep-alive" in tokens if parts[0] == b"HTTP/1.0" else b"close" not in tokens
        return cls(int(parts[1]), line, fields, tokens, chunked, None if chunked else length, keep)


def client_head(head: ResponseHead, *, own_framing: bool, chunked: bool, close: bool) -> bytes:
    """The answer's head for the client: as it came but for this hop's headers. ``own_framing``:
    the body's bytes change on the way (the upstream's framing headers go), sent in chunks of
    the proxy's own when ``chunked``, else until the connection closes; ``close``: the
    connection closes after this answer."""
    fields = _without(head.fields, _HOP_FRAMING_LINES if own_framing else _HOP_LINES, head.tokens)
    if own_framing and chunked:
        fields += b"\r\nTransfer-Encoding: chunked"
    if close:
        fields += b"\r\nConnection: close"
    return b"HTTP/1.1%s%s\r\n\r\n" % (head.status_line[8:], fields)


def error_response(status: int, reason: str, message: str, kind: str, *, close: bool) -> bytes:
    """A JSON error of the proxy's own (an OpenAI-shaped ``error`` object)."""
    body = orjson.dumps({"error": {"message": message, "type": kind}})
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n" + ("Connection: close\r\n" if close else "") + "\r\n"
    )
    return head.encode() + body

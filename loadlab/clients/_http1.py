"""HTTP/1.1 for the streaming hot path, without I/O: where requests go (``Target``), the bytes
of a request (``frame_request``) and a response reader (``ResponseReader``) that hands each body
piece to a sink as soon as the read that carried it is fed in.

The reader owns no socket: ``start(sink, done)``, then ``feed(data, t_ns)`` with each read's
bytes and the ``perf_counter_ns`` at which that read returned, and ``connection_lost(exc)`` at
EOF. The asyncio pool (``loadlab.clients._pool``) and the Locust user's gevent socket both drive
it, so both transports share one parser (docs/clients.md has the measurements).

Scope is what an inference endpoint needs: POST with a ``Content-Length`` body; responses framed by
``Transfer-Encoding: chunked``, ``Content-Length`` or the connection's close; ``https`` through the
default SSL context (the pool's). No proxies, redirects or compression (the client sends
``Accept-Encoding: identity``).

Example (a sink is the stream state; this one keeps the status and body):

>>> class Body:
...     def on_headers(self, status, headers, t_ns): self.status = status
...     def on_bytes(self, data, t_ns): self.data = data; return False
>>> target = Target.from_url("http://127.0.0.1:8000/v1/completions")
>>> frame_request(target.request_head({}), "r1", b"{}")
b'POST /v1/completions HTTP/1.1\\r\\nHost: 127.0.0.1:8000\\r\\nX-Request-Id: r1\\r\\nContent-Length: 2\\r\\n\\r\\n{}'
>>> reader, sink, done = ResponseReader(), Body(), Ended()
>>> result = reader.start(sink, done)
>>> reader.feed(b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\nok", time.perf_counter_ns())
>>> sink.status, sink.data, done.done(), result.error
(200, b'ok', True, None)
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import re

from loadlab._headers import check_header

__all__ = [
    "ChunkFrame",
    "Done",
    "Ended",
    "Failure",
    "RawResult",
    "ResponseReader",
    "Sink",
    "Target",
    "frame_request",
    "header_value",
]

_MAX_HEAD = 64 * 1024
_SIZE, _DATA, _CRLF, _TRAILER = 0, 1, 2, 3  # chunked-body parser states

# A sink's token frame (``TokenFrameState``): the bytes before a token's text, their length,
# the fullmatch of the text, the rest of the event and the chunk's closing CRLF (at a
# position), where a read's time goes (``t - t0``), where its text goes, ``t0``, how a text
# with a backslash in it is unescaped (ValueError when it cannot be), the same match as the
# third, not to the end of the read, and an empty dict for the reader (``_frame_start``)
ChunkFrame = tuple[
    bytes,
    int,
    Callable[[bytes, int], "re.Match[bytes] | None"],
    Callable[[int], None],
    Callable[[str], None],
    int,
    Callable[[bytes], str],
    Callable[[bytes, int], "re.Match[bytes] | None"],
    dict[int, tuple[bytes, int]],
]
# Reads that are one whole chunk of n bytes (n < _FRAME_READS): _CHUNK_LINE[n] is the size
# line such a chunk starts with (b"9c\r\n" for n = 162; a byte no line starts with for an n
# that no chunk has), _CHUNK_LINE_LEN[n] its length. Two look-ups check a chunk's framing.
_FRAME_READS = 4096 + 7
_CHUNK_LINE = [b"\xff"] * _FRAME_READS
_CHUNK_LINE_LEN = bytearray(_FRAME_READS)
for _size in range(1, 4096):
    _line = b"%x\r\n" % _size
    _CHUNK_LINE[len(_line) + _size + 2] = _line
    _CHUNK_LINE_LEN[len(_line) + _size + 2] = len(_line)
del _size, _line
_BACKSLASH = ord("\\")  # ``in`` with an int: with bytes, ``in`` first tries them as an int


def _frame_start(starts: dict[int, tuple[bytes, int]], head: bytes, n: int) -> tuple[bytes, int]:
    """How a read of ``n`` bytes that is one whole chunk in the frame of ``head`` starts (its
    size line, then ``head``) and that length; kept in ``starts``, the frame's, per ``n``: a
    comparison of one slice is cheaper than two ``startswith`` (each parses its arguments)."""
    line = _CHUNK_LINE[n] if n < _FRAME_READS else b"\xff"  # no chunk of n bytes: no match
    start = starts[n] = (line + head, len(line) + len(head))
    return start


class Sink(Protocol):
    """Where a response goes (the stream state). A sink may also have ``chunk_frame``, a
    ``ChunkFrame`` or None (``ResponseReader.feed`` says what the reader does with it)."""

    def on_headers(self, status: int, headers: Mapping[str, str], t_ns: int) -> None: ...

    def on_bytes(self, data: bytes, t_ns: int) -> bool: ...


class Done(Protocol):
    """What an exchange's end is signalled on: an ``asyncio.Future``, or any object with these."""

    def done(self) -> bool: ...

    def set_result(self, result: None, /) -> None: ...


class Ended:
    """A ``Done`` without an event loop (the gevent transport's, and tests')."""

    __slots__ = ("ended",)

    def __init__(self) -> None:
        self.ended = False

    def done(self) -> bool:
        return self.ended

    def set_result(self, _result: None, /) -> None:
        self.ended = True


class Failure(enum.Enum):
    """Why an exchange failed (``RawResult.error``); each maps to one outcome class."""

    CONNECT = "connect"  # no connection, or it closed before a response head
    TIMEOUT = "timeout"  # past the total timeout, or no byte for the read timeout
    INCOMPLETE = "incomplete"  # the connection closed, or the run cancelled, mid-body
    PROTOCOL = "protocol"  # not HTTP/1.x, bad chunk framing, or the sink raised


@dataclass
class RawResult:
    """How one exchange ended. ``error``: None (complete body, or the sink stopped reading), or
    a ``Failure`` with ``message``. ``stale``: it failed on a kept-alive connection that the
    server had closed before sending a byte (the pool tries once more on a fresh one)."""

    sent_ns: int | None = None
    error: Failure | None = None
    message: str = ""
    end_ns: int | None = None  # when the read that ended it was read (else when it ended)
    stale: bool = False


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
        (``frame_request``). A header holding CR, LF or NUL raises ``ValueError``: written as
        is, it would inject headers (aiohttp refuses it too)."""
        host = self.host if self.port in (80, 443) else f"{self.host}:{self.port}"
        lines = [f"POST {self.path} HTTP/1.1", f"Host: {host}"]
        for k, v in headers.items():
            check_header(k, v)
            lines.append(f"{k}: {v}")
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


class ResponseReader:
    """The responses of one connection, one exchange at a time; no I/O.

    ``start`` an exchange, then ``feed(data, t)`` with each read's bytes and its time, and
    ``connection_lost`` at EOF; ``end`` stops the exchange from outside (a timeout, a cancel).
    ``reusable`` says whether the connection may carry another exchange after this one.
    """

    def __init__(self) -> None:
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
        # the sink's chunk_frame while the body stands at a chunk boundary, else None (feed)
        self.frame: ChunkFrame | None = None

    def start(self, sink: Sink, done: Done) -> RawResult:
        self.sink, self.done, self.result, self.got_bytes = sink, done, RawResult(), False
        self.frame = None
        self._head, self._buf, self._chunked, self._state, self._remaining = (
            True,
            b"",
            False,
            _SIZE,
            -1,
        )
        return self.result

    def feed(self, data: bytes, t: int) -> None:
        """The bytes of one read, and when that read returned.

        The usual read of a token stream is one whole chunk holding one token event in the
        stream's learned frame (the sink's ``chunk_frame``, taken at a chunk boundary): the
        chunk's size line is the one its length implies, the event is the frame around a
        text, and the text goes to the sink's lists here, at the read's time, with no call
        into the sink and no SSE decode. Anything else goes to ``sink.on_bytes``.
        """
        self.last_ns = t
        frame = self.frame
        if frame is not None:  # one token event per read: the fewest calls this can take
            n = len(data)
            head, _, match, stamp, keep, t0, unescape, _, starts = frame
            start, k = starts.get(n) or _frame_start(starts, head, n)
            if data[:k] == start:  # the size line of n bytes, then the frame's head
                if (m := match(data, k)) is not None:
                    raw = m[1]
                    try:  # a text with escapes ("\n", "\u00e9") is unescaped by the sink
                        text = unescape(raw) if _BACKSLASH in raw else raw.decode()
                    except ValueError:
                        pass  # not UTF-8, a bad escape: the sink's way (and its verdict)
                    else:
                        stamp(t - t0)
                        keep(text)
                        return
            elif pos := self._frame_chunks(data, t, frame):  # several chunks (a backlog)
                if pos == n:
                    return
                data = data[pos:]  # the rest, from a chunk boundary, goes the usual way
        self.got_bytes = True
        sink = self.sink
        if sink is None:
            if data:
                self.reusable = False  # bytes outside an exchange
            return
        if self._chunked and self._state == _SIZE and not self._buf:
            # The usual read of a token stream: exactly one whole chunk, handed to the sink
            # here (``_deliver`` inline, and no stamp kept for ``end``: this runs every read)
            nl = data.find(b"\r\n", 0, 10)
            if nl > 0:
                try:
                    end = nl + 2 + int(data[:nl], 16)
                except ValueError:  # a chunk extension, or garbage: the full way
                    end = 0
                # a piece of one byte or more, then CRLF and nothing after it
                if end > nl + 2 and data[end : end + 3] == b"\r\n":
                    try:
                        if not sink.on_bytes(data[nl + 2 : end], t):
                            self.frame = getattr(sink, "chunk_frame", None)
                            return
                        self.reusable = False  # the sink stopped: unread body on the wire
                        error, message = None, ""
                    except Exception as exc:  # a sink bug must end this request, not hang it
                        error, message = Failure.PROTOCOL, f"{type(exc).__name__}: {exc}"
                    self._read_ns = t
                    self.end(error, message)
                    self._read_ns = None
                    return
        self._read_ns = t
        try:
            if self._chunked:
                self._chunks(data, t)
            elif self._head:
                self._response_head(data, t)
            else:
                self._plain(data, t)
        except Exception as exc:  # a sink bug must end this request, not hang it
            self.end(Failure.PROTOCOL, f"{type(exc).__name__}: {exc}")
        finally:
            self._read_ns = None
        at_boundary = self._chunked and self._state == _SIZE and not self._buf
        self.frame = getattr(self.sink, "chunk_frame", None) if at_boundary else None

    def _frame_chunks(self, data: bytes, t: int, frame: ChunkFrame) -> int:
        """The whole chunks in the sink's frame at the start of ``data``, taken as ``feed``
        takes one; how many bytes they were."""
        head, lh, _, stamp, keep, t0, unescape, match, _ = frame
        pos = 0
        while (
            (nl := data.find(b"\r\n", pos, pos + 8)) >= 0
            and data.startswith(head, nl + 2)
            and (m := match(data, nl + 2 + lh)) is not None
        ):
            end = m.end()
            if end - pos >= _FRAME_READS or not data.startswith(_CHUNK_LINE[end - pos], pos):
                break  # a size line that does not say this chunk's size
            raw = m[1]
            try:
                text = unescape(raw) if _BACKSLASH in raw else raw.decode()
            except ValueError:
                break
            stamp(t - t0)
            keep(text)
            pos = end
        return pos

    def connection_lost(self, exc: Exception | None) -> None:
        """EOF, or the connection failed with ``exc``."""
        self.lost = True
        self.reusable = False
        if self.sink is None:
            return
        if not self._head and not self._chunked and self._remaining == -1:
            self.end(None)  # a body delimited by the close is complete
        else:
            why = f": {exc}" if exc else ""
            failure = Failure.CONNECT if self._head else Failure.INCOMPLETE
            self.end(failure, f"connection closed{why}")

    def end(self, error: Failure | None, message: str = "") -> None:
        done, self.sink, self.frame = self.done, None, None
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
                self.end(Failure.PROTOCOL, "response head larger than 64 KiB")
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
            self.end(Failure.PROTOCOL, f"not an HTTP/1.x response: {head[:80]!r}")
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
                    size = int(buf[pos:nl], 16)
                except ValueError:
                    try:  # a chunk extension (";name=value"), seldom sent
                        size = int(buf[pos:nl].split(b";", 1)[0], 16)
                    except ValueError:
                        size = -1
                if size < 0:  # not hex digits (int() would also take a sign)
                    self._flush(pieces, t)
                    self.end(Failure.PROTOCOL, f"bad chunk size line {buf[pos:nl][:40]!r}")
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
                    self.end(Failure.PROTOCOL, "chunk data longer than its size line said")
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
            self.end(Failure.PROTOCOL, "chunk size line or trailer too long")

    def _flush(self, pieces: list[bytes], t: int) -> bool:
        """Deliver the pieces of one read as one; True when reading stops."""
        if not pieces:
            return False
        return self._deliver(pieces[0] if len(pieces) == 1 else b"".join(pieces), t)

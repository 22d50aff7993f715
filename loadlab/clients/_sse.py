"""A pure, incremental server-sent-events decoder (WHATWG HTML, "Server-sent events", §9.2.6).

No I/O: feed it the bytes as they arrive, in pieces of any size, and it returns the events
completed so far. It follows the WHATWG parsing rules:

- line ends are LF, CR or CRLF; a CR at the end of one ``feed`` followed by an LF at the start of
  the next is *one* line end;
- a line starting with ``:`` is a comment (servers send ``: keep-alive``) and is ignored;
- ``field: value`` and ``field:value`` (one space after the colon is dropped, no more); a line
  without a colon is a field with an empty value;
- ``data`` lines accumulate, joined by ``"\\n"``; ``event`` sets the type (default
  ``"message"``); ``id`` sets the last event ID (ignored when it contains U+0000; it persists to
  later events, as the spec says); ``retry`` is kept only when it is all ASCII digits;
- an empty line dispatches the event, unless no ``data`` line came (then nothing is dispatched);
- one UTF-8 byte-order mark at the very start of the stream is skipped;
- bytes are decoded as UTF-8 (invalid bytes become U+FFFD), and a split anywhere, even inside
  a multi-byte character, decodes the same as the whole stream.

Limits: a line (complete or still arriving) or an event's data over ``max_bytes`` (default
``MAX_EVENT_BYTES``, 4 MiB) raises ``SSELimitError``: no LLM sends that, and a stream that does
would hold the memory and, line by line, the time to re-scan it. The checks run where bytes are
held across reads (a partial line, an event still building) and on a read longer than the
limit, so the one-line fast paths below pay nothing.

At the end of the stream (``close``) the spec says pending data is discarded: an event whose
closing empty line never came is *not* dispatched. ``close`` therefore returns no events and
sets ``discarded`` when something was dropped, so a caller can tell "clean end" from "cut".

Fast path: bytes are split with ``bytes.rfind``/``str.split``, never a loop per byte; each
``feed`` decodes its completed lines in one call. UTF-8 never uses the bytes CR (0x0D) or
LF (0x0A) inside a multi-byte character, so text up to the last line end is always whole
characters and the tail waits, undecoded, for the next ``feed``.

Example::

    >>> dec = SSEDecoder()
    >>> dec.feed(b'data: {"a": 1}\\n\\ndata: [DO')
    [SSEEvent(data='{"a": 1}', event='message', id=None, retry=None)]
    >>> dec.feed(b"NE]\\n\\n")
    [SSEEvent(data='[DONE]', event='message', id=None, retry=None)]
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from loadlab.errors import ConfigError

__all__ = ["MAX_EVENT_BYTES", "RawEvent", "SSEDecoder", "SSEEvent", "SSELimitError"]

MAX_EVENT_BYTES = 4 << 20  # a few MB: a whole long answer in one event still fits

RawEvent = tuple[str, str, "str | None", "int | None"]  # data, event, id, retry

_BOM = b"\xef\xbb\xbf"
# A partial line this long grows in place (_grow); a shorter one, e.g. an event split over two
# reads, is joined as before, which costs less than looking for a line end first.
_GROW_BYTES = 16 << 10


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event. ``id`` is the last event ID (``None`` while unset or reset);
    ``retry`` is the reconnection time in ms when a ``retry`` field came in this event's block.
    """

    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


class SSELimitError(ValueError):
    """A line or an event over the decoder's ``max_bytes``: the stream is not one to read on.
    It never leaves the client: the stream state makes it the request's ``protocol_error``."""


class SSEDecoder:
    """Incremental decoder: ``feed(bytes) -> [SSEEvent]``, then ``close()`` at end of stream.
    ``max_bytes`` bounds a line and an event's data (``SSELimitError`` past it)."""

    __slots__ = (
        "_bom_pending",
        "_buf",
        "_data",
        "_event",
        "_last_id",
        "_pending_cr",
        "_retry",
        "_size",
        "discarded",
        "max_bytes",
        "retry_ms",
    )

    def __init__(self, max_bytes: int = MAX_EVENT_BYTES) -> None:
        if max_bytes < 1024:
            raise ConfigError(
                f"the SSE line and event limit must be >= 1024 bytes, got {max_bytes}"
            )
        self.max_bytes = max_bytes
        self._size = 0  # characters of data in the event being built
        self._buf: bytes | bytearray = b""  # bytes after the last line end (an incomplete line)
        self._pending_cr = False  # the previous feed ended with CR: skip one leading LF
        self._bom_pending = True  # still at the stream start, where one BOM may be skipped
        self._data: list[str] = []  # data lines of the event being built
        self._event = ""  # event type buffer ("" means "message")
        self._last_id: str | None = None
        self._retry: int | None = None  # retry seen since the last dispatch
        self.retry_ms: int | None = None  # the stream's reconnection time, once set
        self.discarded = False  # close() dropped an unterminated line or event

    def feed(self, data: bytes) -> list[SSEEvent]:
        """Decode ``data`` (any split of the stream); return the events it completed."""
        return [SSEEvent(*raw) for raw in self.feed_raw(data)]

    def feed_raw(self, data: bytes) -> list[RawEvent]:
        """``feed`` as ``(data, event, id, retry)`` tuples: the client's hot path (a tuple is
        several times cheaper to build than a frozen dataclass)."""
        buf: bytes | bytearray = data
        if self._buf or self._pending_cr or self._bom_pending:
            if len(self._buf) >= _GROW_BYTES and b"\n" not in data and b"\r" not in data:
                return self._grow(data)  # the same long unfinished line: no re-join, no re-scan
            buf = self._prepare(data)
            whole = not self._buf and not self._bom_pending  # buf starts at a line start
        else:
            whole = True
        if (
            whole
            and buf.startswith(b"data: ")
            and buf.find(b"\n") == len(buf) - 2
            and buf.endswith(b"\n\n")
            and b"\r" not in buf
            and not self._data
            and not self._event
            and self._retry is None
        ):  # the usual read of a token stream: exactly one whole one-line "data:" event
            return [(buf[6:-2].decode("utf-8", "replace"), "message", self._last_id, None)]
        end = buf.rfind(b"\n")
        cr = b"\r" in buf
        if cr:
            end = max(end, buf.rfind(b"\r"))
        if end < 0:
            self._buf = buf
            if len(buf) > self.max_bytes:
                raise self._over("a line")
            return []
        if end == len(buf) - 1:
            self._buf = b""
            text = buf.decode("utf-8", "replace")
        else:
            self._buf = buf[end + 1 :]
            text = buf[: end + 1].decode("utf-8", "replace")
            if len(self._buf) > self.max_bytes:
                raise self._over("a line")
        if len(text) > self.max_bytes and max(map(len, text.splitlines())) > self.max_bytes:
            raise self._over("a line")  # a huge read (a limit below the read size)
        if cr:
            self._pending_cr = text[-1] == "\r" and not self._buf
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        out: list[RawEvent] = []
        # Blocks end with an empty line; most blocks of an LLM stream are one "data:" line
        # (OpenAI) or an "event:" line and one "data:" line (Anthropic): both skip _lines.
        blocks = text.split("\n\n")
        tail = blocks.pop()  # the lines after the last empty line (each ends with "\n")
        for block in blocks:
            if (
                block.startswith("data:")
                and "\n" not in block
                and not self._data
                and not self._event
                and self._retry is None
            ):
                value = block[6:] if block.startswith("data: ") else block[5:]
                out.append((value, "message", self._last_id, None))
            elif (
                block.startswith("event:")
                and block.count("\n") == 1
                and (nl := block.index("\n")) + 5 < len(block)
                and block.startswith("data:", nl + 1)
                and not self._data
                and not self._event
                and self._retry is None
            ):  # "event: X\ndata: Y", every event of an Anthropic stream
                name = block[7:nl] if block.startswith("event: ") else block[6:nl]
                value = block[nl + 7 :] if block.startswith("data: ", nl + 1) else block[nl + 6 :]
                out.append((value, name or "message", self._last_id, None))
            else:
                self._lines(block.split("\n"), out)
                self._lines(("",), out)
        if tail:
            lines = tail.split("\n")
            lines.pop()
            self._lines(lines, out)
        return out

    def _grow(self, data: bytes) -> list[RawEvent]:
        """A read inside a line that began earlier: appended in place (a bytearray grows in
        amortised constant time), so a long line costs its length, not its length squared."""
        if type(self._buf) is not bytearray:
            self._buf = bytearray(self._buf)
        self._buf += data
        if len(self._buf) > self.max_bytes:
            raise self._over("a line")
        return []

    def _prepare(self, data: bytes) -> bytes | bytearray:
        """The slow start: a pending CR, a partial line, or a possible BOM."""
        if self._pending_cr and data:
            self._pending_cr = False
            if data[0] == 0x0A:  # the LF of a CRLF split across two feeds
                data = data[1:]
        buf = self._buf + data if self._buf else data
        if self._bom_pending:
            if len(buf) < 3 and _BOM.startswith(buf):
                return buf  # could still be a BOM: wait for more bytes (no line end in it)
            self._bom_pending = False
            if buf.startswith(_BOM):
                buf = buf[3:]
        return buf

    def idle(self) -> bool:
        """Nothing pending: no partial line, no half-built event, past the stream's start. The
        next bytes then decode on their own, as if they began a stream."""
        return not (
            self._buf
            or self._pending_cr
            or self._bom_pending
            or self._data
            or self._event
            or self._retry is not None
        )

    def close(self) -> list[SSEEvent]:
        """End of stream. Per WHATWG an unterminated event is discarded: returns ``[]`` and
        sets ``discarded`` when a partial line or an undispatched event was dropped."""
        self.discarded = bool(self._buf) or bool(self._data)
        self._buf = b""
        self._data = []
        self._size = 0
        self._event = ""
        return []

    def _lines(self, lines: Iterable[str], out: list[RawEvent]) -> None:
        data = self._data
        for line in lines:
            if not line:  # dispatch
                if data:
                    out.append(
                        ("\n".join(data), self._event or "message", self._last_id, self._retry)
                    )
                    data.clear()
                    self._size = 0
                self._event = ""
                self._retry = None
            elif line.startswith("data:"):
                value = line[6:] if line.startswith("data: ") else line[5:]
                data.append(value)
                self._size += len(value) + 1
                if self._size > self.max_bytes:
                    raise self._over("an event")
            elif line[0] != ":":  # ":" starts a comment / keep-alive
                name, colon, value = line.partition(":")
                if colon and value.startswith(" "):
                    value = value[1:]
                self._field(name, value)

    def _over(self, what: str) -> SSELimitError:
        self._buf, self._data, self._size = b"", [], 0  # let the memory go at once
        return SSELimitError(
            f"{what} of the event stream is over {self.max_bytes} bytes "
            "(raise the limit with --max-event-bytes)"
        )

    def _field(self, name: str, value: str) -> None:
        if name == "data":  # "data" without a colon: an empty data line
            self._data.append(value)
            self._size += 1
            if self._size > self.max_bytes:
                raise self._over("an event")
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\x00" not in value:
                self._last_id = value or None
        elif name == "retry":
            if value.isascii() and value.isdigit():
                self._retry = self.retry_ms = int(value)
        # any other field name is ignored (WHATWG)

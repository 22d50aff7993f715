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

from dataclasses import dataclass

__all__ = ["SSEDecoder", "SSEEvent"]

_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event. ``id`` is the last event ID (``None`` while unset or reset);
    ``retry`` is the reconnection time in ms when a ``retry`` field came in this event's block.
    """

    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


class SSEDecoder:
    """Incremental decoder: ``feed(bytes) -> [SSEEvent]``, then ``close()`` at end of stream."""

    __slots__ = (
        "_bom_pending",
        "_buf",
        "_data",
        "_event",
        "_last_id",
        "_pending_cr",
        "_retry",
        "discarded",
        "retry_ms",
    )

    def __init__(self) -> None:
        self._buf = b""  # bytes after the last line end (an incomplete line)
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
        if self._pending_cr and data:
            self._pending_cr = False
            if data[0] == 0x0A:  # the LF of a CRLF split across two feeds
                data = data[1:]
        buf = self._buf + data if self._buf else data
        if self._bom_pending:
            if len(buf) < 3 and _BOM.startswith(buf):
                self._buf = buf  # could still be a BOM: wait for more bytes
                return []
            self._bom_pending = False
            if buf.startswith(_BOM):
                buf = buf[3:]
        end = max(buf.rfind(b"\n"), buf.rfind(b"\r"))
        if end < 0:
            self._buf = buf
            return []
        self._buf = buf[end + 1 :]
        if buf[end] == 0x0D and end == len(buf) - 1:
            self._pending_cr = True
        text = buf[: end + 1].decode("utf-8", "replace")
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n")
        lines.pop()  # "" after the final line end
        return self._lines(lines)

    def close(self) -> list[SSEEvent]:
        """End of stream. Per WHATWG an unterminated event is discarded: returns ``[]`` and
        sets ``discarded`` when a partial line or an undispatched event was dropped."""
        self.discarded = bool(self._buf) or bool(self._data)
        self._buf = b""
        self._data = []
        self._event = ""
        return []

    def _lines(self, lines: list[str]) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        data = self._data
        for line in lines:
            if not line:  # dispatch
                if data:
                    events.append(
                        SSEEvent(
                            "\n".join(data), self._event or "message", self._last_id, self._retry
                        )
                    )
                    data.clear()
                self._event = ""
                self._retry = None
                continue
            if line.startswith("data:"):  # the hot path: most lines of an LLM stream
                data.append(line[6:] if line.startswith("data: ") else line[5:])
                continue
            if line[0] == ":":
                continue  # comment / keep-alive
            name, colon, value = line.partition(":")
            if colon and value.startswith(" "):
                value = value[1:]
            self._field(name, value)
        return events

    def _field(self, name: str, value: str) -> None:
        if name == "data":  # "data" without a colon: an empty data line
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\x00" not in value:
                self._last_id = value or None
        elif name == "retry":
            if value.isascii() and value.isdigit():
                self._retry = self.retry_ms = int(value)
        # any other field name is ignored (WHATWG)

"""HTTP/1.1 exchanges and their server-sent events, read off reassembled TCP streams.

On each connection the requests are read in order (request line, headers, a
``Content-Length`` or chunked body) and the responses paired with them in order (HTTP/1.1
without pipelining, as every load tester sends). Of each exchange the wire gives:

- ``request_first_ns``, ``request_last_ns``: the packets that carried the request's first and
  last byte (``request_last_ns`` is the wire's "sent": the server cannot start before it);
- ``headers_ns``: the packet that completed the response head;
- ``event_ns`` and ``kinds``: every server-sent event of the body, at the packet that carried
  the blank line ending it (a client can act on an event no earlier), and what it is:
  ``TOKEN`` when it carries a token as ``../shared/ARCHITECTURE.md`` defines one (non-empty
  answer text, reasoning or tool-call arguments, in the OpenAI chat and completions,
  Anthropic Messages and Responses shapes), ``CHOICE`` for an OpenAI chunk with choices but
  no token (the role-only first chunk, an empty finish chunk: ``vllm bench serve`` counts
  these), ``OTHER`` for the rest (a usage chunk, ``[DONE]``, Anthropic's framing events);
- ``end_ns``: the packet that carried the body's last byte.

Times are the capture's (CLOCK_REALTIME, ns). Decoding is independent of loadlab's client
(``loadlab.clients``), so the wire is a second reading of the same bytes, not the same code.
Only the ``X-Request-Id`` request header is kept of what the client sent: no prompt text,
no key.

Example::

    for conn in reassemble(read_pcap(path), 8000).connections:
        for ex in exchanges(conn):
            ex.request_id, ex.request_last_ns, ex.times()  # sent, and each token's time
"""

from __future__ import annotations

import bisect
import json
import os
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

from loadlab._wire.tcp import Connection, Stream, Streams, read_pcap, reassemble

__all__ = [
    "CHOICE",
    "OTHER",
    "TOKEN",
    "Exchange",
    "event_kind",
    "exchanges",
    "read_exchanges",
    "sse_events",
]

TOKEN, CHOICE, OTHER = "token", "choice", "other"

_LINE = re.compile(rb"([^\r\n]*)(\r\n|\r|\n)")
_TOKEN_DELTAS = {
    "response.output_text.delta",
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
    "response.function_call_arguments.delta",
}


@dataclass
class Exchange:
    """One request and its response on one connection (times: CLOCK_REALTIME ns)."""

    client: tuple[str, int]
    index: int  # the exchange's place on its connection (0: first)
    request_id: str | None
    request_first_ns: int
    request_last_ns: int
    status: int | None = None
    headers_ns: int | None = None
    event_ns: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # TOKEN, CHOICE or OTHER, per event
    end_ns: int | None = None  # the body's last byte; None: the body never ended
    complete: bool = False  # the whole response is in the capture

    def times(self, kinds: tuple[str, ...] = (TOKEN,)) -> list[int]:
        """The times of the events of ``kinds`` (default: the token-carrying ones)."""
        return [t for t, k in zip(self.event_ns, self.kinds, strict=True) if k in kinds]


def _head(data: bytes, pos: int) -> tuple[str, dict[str, str], int] | None:
    """(start line, lower-cased headers, offset after the blank line), or None if cut."""
    end = data.find(b"\r\n\r\n", pos)
    if end < 0:
        return None
    lines = data[pos:end].decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return lines[0], headers, end + 4


def _dechunk(data: bytes, pos: int) -> tuple[bytes, list[tuple[int, int]], int | None]:
    """A chunked body from ``pos``: (the body, (body offset, stream offset) of each chunk's
    first byte, the stream offset after the last chunk or None if it is cut short)."""
    parts: list[bytes] = []
    spans: list[tuple[int, int]] = []
    size_total = 0
    while True:
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            return b"".join(parts), spans, None
        try:
            size = int(data[pos:eol].split(b";")[0], 16)
        except ValueError:
            return b"".join(parts), spans, None
        start = eol + 2
        if size == 0:  # the last chunk: trailers, if any, then a blank line
            if data[start : start + 2] == b"\r\n":
                return b"".join(parts), spans, start + 2
            end = data.find(b"\r\n\r\n", start)
            return b"".join(parts), spans, (end + 4 if end >= 0 else None)
        chunk = data[start : start + size]
        spans.append((size_total, start))
        parts.append(chunk)
        size_total += len(chunk)
        if len(chunk) < size:
            return b"".join(parts), spans, None
        pos = start + size + 2


def sse_events(body: bytes) -> Iterator[tuple[int, str, str]]:
    """(offset of the last byte of the line end that dispatched it, event type, data) for
    each event of a ``text/event-stream`` body (WHATWG: a blank line dispatches an event
    that has data; ``:`` lines are comments)."""
    data: list[str] = []
    kind = ""
    for m in _LINE.finditer(body):
        line = m.group(1)
        if not line:
            if data:
                yield m.end() - 1, kind or "message", "\n".join(data)
            data, kind = [], ""
            continue
        if line.startswith(b":"):
            continue
        name, sep, value = line.partition(b":")
        if sep and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            data.append(value.decode("utf-8", "replace"))
        elif name == b"event":
            kind = value.decode("utf-8", "replace")


def event_kind(data: str) -> str:
    """``TOKEN`` when one event's data carries an output token (answer text, reasoning,
    tool-call arguments; OpenAI chat or completions, Anthropic Messages, Responses),
    ``CHOICE`` for an OpenAI chunk with choices and no token, else ``OTHER``."""
    if not data or data == "[DONE]":
        return OTHER
    try:
        obj: Any = json.loads(data)
    except ValueError:
        return OTHER
    if not isinstance(obj, dict):
        return OTHER
    kind = obj.get("type")
    if kind == "content_block_delta":
        d = obj.get("delta") or {}
        return TOKEN if d.get("text") or d.get("thinking") or d.get("partial_json") else OTHER
    if kind in _TOKEN_DELTAS:
        return TOKEN if obj.get("delta") else OTHER
    choices = obj.get("choices")
    if not choices or not isinstance(choices, list):
        return OTHER
    return TOKEN if any(_choice_token(c) for c in choices if isinstance(c, dict)) else CHOICE


def _choice_token(c: dict[str, Any]) -> bool:
    if c.get("text"):
        return True
    d = c.get("delta") or {}
    if d.get("content") or d.get("reasoning_content") or d.get("reasoning"):
        return True
    return any(
        ((call or {}).get("function") or {}).get("arguments") for call in d.get("tool_calls") or ()
    )


def _stream_offset(spans: list[tuple[int, int]], body_offset: int, base: int) -> int:
    """Where a body byte sits in the stream: ``base + body_offset`` for a body not chunked,
    else through the chunks' ``spans``."""
    if not spans:
        return base + body_offset
    i = bisect.bisect_right(spans, (body_offset, 1 << 62)) - 1
    body_start, stream_start = spans[i]
    return stream_start + body_offset - body_start


def _requests(stream: Stream, client: tuple[str, int]) -> Iterator[Exchange]:
    data, pos, index = stream.data, 0, 0
    while pos < len(data):
        head = _head(data, pos)
        if head is None:
            return
        _line, headers, body = head
        if headers.get("transfer-encoding", "").lower() == "chunked":
            _b, _s, end = _dechunk(data, body)
        else:
            end = body + int(headers.get("content-length") or 0)
        if end is None or end > len(data):
            return
        rid = headers.get("x-request-id")
        yield Exchange(client, index, rid, stream.time_at(pos), stream.time_at(end - 1))
        pos, index = end, index + 1


def _response(stream: Stream, pos: int, ex: Exchange) -> int | None:
    """Fill ``ex`` from the response at ``pos``; the offset after it (None: cut short)."""
    data = stream.data
    while True:
        head = _head(data, pos)
        if head is None:
            return None
        line, headers, body = head
        try:
            status = int(line.split(" ", 2)[1])
        except (IndexError, ValueError):
            return None
        if not 100 <= status < 200:  # an interim response (100 Continue): the real one follows
            break
        pos = body
    ex.status, ex.headers_ns = status, stream.time_at(body - 1)
    spans: list[tuple[int, int]] = []
    end: int | None
    if status in (204, 304):
        content, end = b"", body
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        content, spans, end = _dechunk(data, body)
    elif "content-length" in headers:
        stop = body + int(headers["content-length"])
        content = data[body:stop]
        end = stop if stop <= len(data) else None
    else:  # until the connection closes
        content = data[body:]
        end = len(data) if stream.closed and stream.complete else None
    if "text/event-stream" in headers.get("content-type", ""):
        for off, _kind, payload in sse_events(content):
            ex.event_ns.append(stream.time_at(_stream_offset(spans, off, body)))
            ex.kinds.append(event_kind(payload))
    if end is not None:
        ex.end_ns = stream.time_at(end - 1) if end > body else ex.headers_ns
        ex.complete = True
    return end


def exchanges(conn: Connection) -> list[Exchange]:
    """The exchanges of one connection, in order; a response cut short ends the list."""
    out = []
    pos: int | None = 0
    for ex in _requests(conn.to_server, conn.client):
        out.append(ex)
        if pos is None or pos >= len(conn.to_client.data):
            continue  # no response (yet): a request the server never answered
        pos = _response(conn.to_client, pos, ex)
    return out


def read_exchanges(
    pcap: str | os.PathLike[str], port: int, servers: Collection[str] | None = None
) -> tuple[Streams, list[Exchange]]:
    """Every exchange with ``port`` (on ``servers`` when given) in a capture file, and the
    connections they came from."""
    streams = reassemble(read_pcap(pcap), port, servers)
    return streams, [ex for conn in streams.connections for ex in exchanges(conn)]

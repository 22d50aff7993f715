"""What ``loadlab record`` reads of an upstream's answer: token events, usage, latencies.

``StreamWatch`` is fed the response's bytes as they pass through the proxy (a copy: the proxy
forwards every chunk before the watch reads it) with the time each chunk arrived. For a stream
it cuts the bytes into SSE events, finds the events that carry output tokens (content,
reasoning, tool-call arguments, in each API's own event shape) and the usage; for a plain JSON
answer it reads the usage from the body (kept up to ``MAX_BODY`` bytes, then dropped).

When the proxy asked for usage on the client's behalf (``drop_usage_event``), ``feed`` returns
the bytes to forward with that usage-only event taken out; otherwise it returns ``None`` and the
proxy has already forwarded the chunk as it came.

A stream's token events differ only in their text (the same id, model and nulls around it), so
the watch learns that frame from the first token events it reads in full (``_learn_frame``),
checks it with a probe on a scratch watch, and from then on takes an event that is the frame
around a JSON string body with a prefix comparison and one regex match instead of the SSE cut
and the JSON parse (the top of ``feed``'s loop). Anything else (the first events, usage, finish, tool
calls, errors, an event split across chunks, a frame whose bytes change per event) goes the full
way; either way the figures are the same (the tests compare both on every split of generated
streams).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = ["MAX_BODY", "StreamWatch", "Usage"]

MAX_BODY = 8 << 20  # a non-streamed answer's JSON kept for its usage; past this, no usage
_LEARN_TRIES = 3  # frames learned per stream that were never used (StreamWatch._full_event)
_PROBE = "loadlab~probe"
_BACKSLASH = ord("\\")  # an int: ``b"\\" in raw`` would first fail as one (a TypeError)
# a JSON string's body that needs no escaping: no quote, backslash or control character
_plain = re.compile(rb'[^"\\\x00-\x1f]+').fullmatch

_MatchAt = Callable[[bytes, int], "re.Match[bytes] | None"]
# a token event's frame: the bytes before the text, their length, the text-then-tail match,
# whether the text counts in ``reply_chars`` (a tool call's frame needs no flag: the event it
# was learned from already set ``called_tool``)
_Frame = tuple[bytes, int, _MatchAt, bool]
_NO_FRAME: _Frame = (b"\xff", 1, lambda data, pos: None, False)  # matches no event


@functools.lru_cache(maxsize=256)
def _text_then(tail: bytes) -> _MatchAt:
    """A JSON string body (escaped pairs allowed), then ``tail``: the rest of a token event.
    Possessive: giving bytes back could never let ``tail`` match (it starts with the closing
    quote), so a body that does not end in ``tail`` is given up at once. Streams of one server
    share their tails."""
    body = rb'((?:[^"\\\x00-\x1f]++|\\[^\x00-\x1f])++)'
    return re.compile(body + re.escape(tail)).match


@dataclass
class Usage:
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None

    def read(self, usage: Mapping[str, Any], api: str) -> None:
        """Take the counts one usage object gives (OpenAI, Responses or Anthropic names)."""
        if api == "anthropic":
            base = _int(usage.get("input_tokens"))
            read_ = _int(usage.get("cache_read_input_tokens"))
            made = _int(usage.get("cache_creation_input_tokens"))
            if base is not None:
                self.prompt_tokens = base + (read_ or 0) + (made or 0)
            if read_ is not None:
                self.cached_tokens = read_
            if _int(usage.get("output_tokens")) is not None:
                self.output_tokens = _int(usage.get("output_tokens"))
            return
        prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
        output = usage.get("completion_tokens", usage.get("output_tokens"))
        if _int(prompt) is not None:
            self.prompt_tokens = _int(prompt)
        if _int(output) is not None:
            self.output_tokens = _int(output)
        details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
        out_details = (
            usage.get("completion_tokens_details") or usage.get("output_tokens_details") or {}
        )
        if isinstance(details, Mapping) and _int(details.get("cached_tokens")) is not None:
            self.cached_tokens = _int(details.get("cached_tokens"))
        if (
            isinstance(out_details, Mapping)
            and _int(out_details.get("reasoning_tokens")) is not None
        ):
            self.reasoning_tokens = _int(out_details.get("reasoning_tokens"))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


@dataclass
class StreamWatch:
    api: str
    streaming: bool
    drop_usage_event: bool = False
    usage: Usage = field(default_factory=Usage)
    token_times_ns: list[int] = field(default_factory=list)  # one per token-carrying event
    reply_chars: int = 0  # the answer's text length (never the text)
    called_tool: bool = False  # the answer was (or held) a tool call
    stream_error: bool = False
    malformed: int = 0
    _pending: bytes = b""
    _body: bytearray = field(default_factory=bytearray)
    _body_overflow: bool = False
    _frame: _Frame | None = None  # the stream's token frame, once learned (_learn_frame)
    _learn: int = _LEARN_TRIES
    _text: str | None = None  # the text of the last token event read in full

    def feed(self, chunk: bytes, t_ns: int) -> bytes | None:
        """Read one chunk that arrived at ``t_ns`` (> 0). With ``drop_usage_event``, return the
        bytes to forward now: the whole events so far, the usage-only one taken out."""
        frame = self._frame
        if frame is not None and not self._pending and chunk.startswith(frame[0]):
            # the usual read: one whole token event in the learned frame (the loop's first case)
            m = frame[2](chunk, frame[1])
            if m is not None and m.end() == len(chunk):
                raw = m[1]
                size = len(raw) if raw.isascii() and _BACKSLASH not in raw else _text_size(raw)
                if size >= 0:
                    self.token_times_ns.append(t_ns)
                    self.reply_chars += size if frame[3] else 0
                    self._learn = _LEARN_TRIES
                    return chunk if self.drop_usage_event else None
        if not self.streaming:
            if not self._body_overflow:
                self._body += chunk
                if len(self._body) > MAX_BODY:
                    self._body_overflow = True
                    self._body = bytearray()
            return None
        data = self._pending + chunk if self._pending else chunk
        pos, n = 0, len(data)
        head, lh, match, chars = self._frame or _NO_FRAME
        out: bytearray | None = None  # what to forward, once an event was taken out
        sent = 0  # data[:sent] is in ``out``
        used = False  # the frame read an event: it earned its try back
        while pos < n:
            if data.startswith(head, pos) and (m := match(data, pos + lh)) is not None:
                raw = m[1]
                size = len(raw) if raw.isascii() and _BACKSLASH not in raw else _text_size(raw)
                if size >= 0:  # a token event in the learned frame
                    self.token_times_ns.append(t_ns)
                    self.reply_chars += size if chars else 0
                    pos = m.end()
                    used = True
                    continue
            end, sep = _event_end(data, pos)
            if end < 0:
                break
            if not self._full_event(data[pos : end + sep], end - pos, t_ns):
                if out is None:  # the usage-only event the client did not ask for
                    out = bytearray(data[:pos])
                else:
                    out += data[sent:pos]
                sent = end + sep
            pos = end + sep
        self._pending = data[pos:]
        if used:
            self._learn = _LEARN_TRIES
        if not self.drop_usage_event:
            return None
        return data[:pos] if out is None else bytes(out + data[sent:pos])

    def finish(self) -> bytes:
        """At the end of the answer: read a plain body's usage; return bytes still held back."""
        if not self.streaming and self._body and not self._body_overflow:
            try:
                obj = orjson.loads(bytes(self._body))
            except orjson.JSONDecodeError:
                self.malformed += 1
                return b""
            if isinstance(obj, Mapping):
                if isinstance(obj.get("usage"), Mapping):
                    self.usage.read(obj["usage"], self.api)
                self.reply_chars = _reply_chars(obj)
                self.called_tool = _called_tool(obj)
            return b""
        rest, self._pending = self._pending, b""
        if rest.strip():
            self._event(rest, 0)
        return rest if self.drop_usage_event else b""

    def _full_event(self, raw: bytes, size: int, t_ns: int) -> bool:
        """The full way for one event (``raw``: its bytes and separator; ``size``: its length
        without the separator). A token event here is tried as the stream's frame: the first
        one, and one after the frame changed (a server that stamps each chunk's second); a
        stream whose frames never repeat stops trying after a few."""
        learn = self._learn > 0
        count = len(self.token_times_ns)
        keep = self._event(raw[:size], t_ns)
        if learn and len(self.token_times_ns) == count + 1 and self._text:
            frame = self._frame
            if frame is None or not (raw.startswith(frame[0]) and frame[2](raw, frame[1])):
                self._learn -= 1  # (an event that fits the frame came split across reads)
                self._frame = _learn_frame(self.api, raw, self._text) or frame
        return keep

    def _event(self, event: bytes, t_ns: int) -> bool:
        """Reads one SSE event; False for the usage-only event the client did not ask for."""
        payload = b"".join(
            line[5:].lstrip() for line in event.splitlines() if line.startswith(b"data:")
        )
        if not payload or payload == b"[DONE]":
            return True
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self.malformed += 1
            return True
        if not isinstance(obj, Mapping):
            return True
        token, usage_only = self._read(obj)
        if token and t_ns:
            self.token_times_ns.append(t_ns)
            self._text = token if isinstance(token, str) else None
        return not (usage_only and self.drop_usage_event)

    def _read(self, obj: Mapping[str, Any]) -> tuple[Any, bool]:
        """(what carries output tokens, falsy when none: the text, or the tool calls; is a
        usage-only chunk) for one event's JSON."""
        kind = obj.get("type")
        if kind == "error" or ("error" in obj and "choices" not in obj):
            self.stream_error = True
            return False, False
        if self.api == "anthropic":
            if kind == "message_start":
                usage = (obj.get("message") or {}).get("usage")
                if isinstance(usage, Mapping):
                    self.usage.read(usage, "anthropic")
            elif kind == "message_delta" and isinstance(obj.get("usage"), Mapping):
                self.usage.read(obj["usage"], "anthropic")
            elif kind == "content_block_start":
                block = obj.get("content_block") or {}
                self.called_tool |= isinstance(block, Mapping) and block.get("type") == "tool_use"
            elif kind == "content_block_delta":
                delta = obj.get("delta") or {}
                text = delta.get("text") or delta.get("thinking") or delta.get("partial_json")
                self.reply_chars += len(text) if isinstance(text, str) else 0
                return text, False
            return False, False
        if isinstance(kind, str):  # the Responses API's typed events
            if kind == "response.completed":
                usage = (obj.get("response") or {}).get("usage")
                if isinstance(usage, Mapping):
                    self.usage.read(usage, "responses")
            delta = obj.get("delta")
            self.called_tool |= kind.startswith("response.function_call_arguments")
            if kind.endswith(".delta") and isinstance(delta, str) and delta:
                self.reply_chars += len(delta)
                return delta, False
            return False, False
        usage = obj.get("usage")
        if isinstance(usage, Mapping):
            self.usage.read(usage, self.api)
        choices = obj.get("choices") or []
        if not choices:
            return False, isinstance(usage, Mapping)
        first = choices[0] if isinstance(choices[0], Mapping) else {}
        delta = first.get("delta") or {}
        text = first.get("text") or delta.get("content")
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        calls = delta.get("tool_calls")
        self.called_tool |= bool(calls)
        self.reply_chars += len(text) if isinstance(text, str) else 0
        return text or reasoning or calls, False


def _learn_frame(api: str, raw: bytes, text: str) -> _Frame | None:
    """The frame of a token event read in full (``raw``, separator included; ``text``: its
    token text): the bytes before and after the text, kept when the text appears once in
    ``raw`` as a plain JSON string and a probe (the frame around another text, read in full by
    a scratch watch) reads as one token event and nothing else. An event that is the frame
    around any JSON string body is then the same JSON with another text."""
    body = text.encode()
    quoted = b'"' + body + b'"'
    if _plain(body) is None or raw.count(quoted) != 1:
        return None
    start = raw.find(quoted) + 1
    head, tail = raw[:start], raw[start + len(body) :]
    probe = StreamWatch(api, True, _learn=0)
    probe.feed(head + _PROBE.encode() + tail, 1)
    if (
        probe.token_times_ns != [1]
        or probe._pending
        or probe.usage != Usage()
        or probe.stream_error
        or probe.malformed
        or probe.reply_chars not in (0, len(_PROBE))
    ):
        return None
    return head, len(head), _text_then(tail), probe.reply_chars > 0


def _text_size(raw: bytes) -> int:
    """A JSON string body's length in characters, as the JSON parser decodes it (for a body
    with escapes or past ASCII); -1 when it is not valid (not UTF-8, a bad escape), so that its
    event goes the full way and gets the parser's verdict."""
    try:
        return len(orjson.loads(b'"' + raw + b'"'))
    except orjson.JSONDecodeError:
        return -1


def _event_end(data: bytes, start: int) -> tuple[int, int]:
    """Where the SSE event starting at ``start`` ends, and its separator's length."""
    a = data.find(b"\n\n", start)
    # a CRLF separator before ``a`` ends by a + 3: a backlog is not scanned to its end per event
    b = data.find(b"\r\n\r\n", start, a + 3 if a >= 0 else None)
    if b >= 0 and (a < 0 or b < a):
        return b, 4
    return (a, 2) if a >= 0 else (-1, 0)


def _reply_chars(obj: Mapping[str, Any]) -> int:
    choices = obj.get("choices") or []
    if choices and isinstance(choices[0], Mapping):
        msg = choices[0].get("message") or {}
        text = msg.get("content") if isinstance(msg, Mapping) else choices[0].get("text")
        return len(text) if isinstance(text, str) else 0
    content = obj.get("content")
    if isinstance(content, list):
        return sum(len(str(c.get("text", ""))) for c in content if isinstance(c, Mapping))
    return 0


def _called_tool(obj: Mapping[str, Any]) -> bool:
    choices = obj.get("choices") or []
    if choices and isinstance(choices[0], Mapping):
        msg = choices[0].get("message") or {}
        return isinstance(msg, Mapping) and bool(msg.get("tool_calls"))
    items = obj.get("content") or obj.get("output") or []
    kinds = (
        {i.get("type") for i in items if isinstance(i, Mapping)}
        if isinstance(items, list)
        else set()
    )
    return bool(kinds & {"tool_use", "function_call"})

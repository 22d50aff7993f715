"""What ``loadlab record`` reads of an upstream's answer: token events, usage, latencies.

``StreamWatch`` is fed the response's bytes as they pass through the proxy (a copy: the proxy
forwards every chunk before the watch reads it) with the time each chunk arrived. For a stream
it cuts the bytes into SSE events, finds the events that carry output tokens (content,
reasoning, tool-call arguments, in each API's own event shape) and the usage; for a plain JSON
answer it reads the usage from the body (kept up to ``MAX_BODY`` bytes, then dropped).

When the proxy asked for usage on the client's behalf (``drop_usage_event``), ``feed`` returns
the bytes to forward with that usage-only event taken out; otherwise it returns ``None`` and the
proxy has already forwarded the chunk as it came.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = ["MAX_BODY", "StreamWatch", "Usage"]

MAX_BODY = 8 << 20  # a non-streamed answer's JSON kept for its usage; past this, no usage


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

    def feed(self, chunk: bytes, t_ns: int) -> bytes | None:
        if not self.streaming:
            if not self._body_overflow:
                self._body += chunk
                if len(self._body) > MAX_BODY:
                    self._body_overflow = True
                    self._body = bytearray()
            return None
        data = self._pending + chunk
        out = bytearray() if self.drop_usage_event else None
        start = 0
        while True:
            end, sep = _event_end(data, start)
            if end < 0:
                break
            event = data[start:end]
            keep = self._event(event, t_ns)
            if out is not None and keep:
                out += data[start : end + sep]
            start = end + sep
        self._pending = data[start:]
        return bytes(out) if out is not None else None

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
        tokens, usage_only = self._read(obj)
        if tokens and t_ns:
            self.token_times_ns.append(t_ns)
        return not (usage_only and self.drop_usage_event)

    def _read(self, obj: Mapping[str, Any]) -> tuple[bool, bool]:
        """(carries output tokens, is a usage-only chunk) for one event's JSON."""
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
                return bool(text), False
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
                return True, False
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
        return bool(text or reasoning or calls), False


def _event_end(data: bytes, start: int) -> tuple[int, int]:
    """Where the SSE event starting at ``start`` ends, and its separator's length."""
    a = data.find(b"\n\n", start)
    b = data.find(b"\r\n\r\n", start)
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

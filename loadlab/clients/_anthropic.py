"""The Anthropic Messages API client: ``POST /v1/messages``, streamed or not.

Same two layers, transports, SSE decoder, record type and outcome classes as the OpenAI client
(``loadlab.clients._openai``), its sibling over ``loadlab.clients._streaming``; only the dialect
differs:

- request: ``x-api-key: <key>`` (from ``endpoint.api_key_env``) and
  ``anthropic-version: 2023-06-01`` headers; body ``{model, max_tokens, messages, stream}``
  (the chat session so far plus the new user message), then the run's and the request's
  ``extra_body``;
- stream events (Anthropic, "Streaming Messages"): ``message_start`` (``usage``: the prompt
  tokens, see below), ``content_block_start`` (a ``tool_use`` block names a tool call),
  ``content_block_delta`` (a ``text_delta`` with non-empty text is answer content, a
  ``thinking_delta`` reasoning, an ``input_json_delta`` a tool call's arguments: each carries
  tokens, its read time goes into ``chunk_ns``), ``content_block_stop``, ``message_delta`` (``usage.output_tokens``, the
  cumulative output count; ``delta.stop_reason`` becomes the record's ``finish_reason``
  unchanged: ``end_turn``, ``max_tokens``, ``stop_sequence``, ...), ``message_stop`` (the
  stream is complete), ``ping`` (ignored), ``error`` (``stream_error``);
- complete: only ``message_stop``; EOF before it is ``incomplete`` even after a stop reason;
- prompt tokens: Anthropic's ``input_tokens`` counts only the prompt tokens after the last
  cache breakpoint; ``cache_read_input_tokens`` and ``cache_creation_input_tokens`` count the
  rest. The record's ``prompt_tokens`` is their sum (the whole prompt, as the OpenAI dialects
  count it; vLLM's ``/v1/messages`` moves prefix-cache hits into ``cache_read_input_tokens``),
  and the two cache counts are kept apart in ``record.server`` under their own names.

The event's JSON ``type`` field is what is read, not the SSE ``event:`` line (proxies that
drop ``event:`` lines still work); an SSE ``event: error`` is an error whatever its data says.

Example::

    ep = EndpointConfig("https://api.anthropic.com", model="claude-...", api="anthropic",
                        api_key_env="ANTHROPIC_API_KEY")
    async with AnthropicClient(ep) as client:
        done = await client.send(spec, t0_ns=time.perf_counter_ns())
"""

from __future__ import annotations

from typing import Any

from loadlab.clients._state import dumps, token_count
from loadlab.clients._streaming import StreamingClient
from loadlab.clients._token_frame import TypedEventState
from loadlab.config import EndpointConfig
from loadlab.records import OUTCOME_PROTOCOL_ERROR

__all__ = [
    "ANTHROPIC_VERSION",
    "AnthropicClient",
    "AnthropicStreamState",
]

ANTHROPIC_VERSION = "2023-06-01"
_TOOL_BLOCKS = ("tool_use", "server_tool_use")
# Prompt tokens Anthropic's usage counts apart from input_tokens (both null or absent: none)
_CACHE_USAGE_KEYS = ("cache_read_input_tokens", "cache_creation_input_tokens")


class AnthropicStreamState(TypedEventState):
    """Interprets one Messages API response; no I/O (``StreamState`` has the protocol, ``TokenFrameState`` the per-read path)."""

    __slots__ = ()

    TEXT_KEYS = (b'"text":"', b'"text": "')
    PROMPT_KEY = "input_tokens"
    OUTPUT_KEY = "output_tokens"
    INCOMPLETE = "stream ended before message_stop"

    def _prompt_usage(self, usage: dict[str, Any]) -> tuple[int | None, int | None]:
        """Anthropic's ``input_tokens`` leaves out the prompt cache: the prompt is
        ``input_tokens + cache_read_input_tokens + cache_creation_input_tokens``, of which
        the cache reads were served from the cache. Both cache counts, when given, are also
        kept as the server said them in ``record.server``."""
        prompt = token_count(usage.get("input_tokens"))
        if prompt is None:
            return None, None
        for key in _CACHE_USAGE_KEYS:
            n = token_count(usage.get(key))
            if n is not None:
                self.record.server[key] = n
                prompt += n
        return prompt, token_count(usage.get("cache_read_input_tokens"))

    def _typed(self, obj: dict[str, Any], kind: Any, event: str, data: str, t_rel: int) -> bool:
        """One event (``TypedEventState`` parsed it); True when it decided a failure."""
        if kind == "content_block_delta":  # first: nearly every event is one
            d = obj["delta"]
            text = d.get("text")
            if text:
                self._stamps.append(t_rel)
                self._parts.append(text)
                if self.record.answer_ns is None:
                    self.record.answer_ns = t_rel
            elif delta := d.get("type"):
                if delta == "thinking_delta":
                    if d.get("thinking"):
                        self._reasoning(t_rel)
                elif delta == "input_json_delta" and (part := d.get("partial_json")):
                    self._tool_args(obj.get("index"), part, t_rel)
        elif event == "error" or kind == "error":
            return self._error(obj, data)
        elif kind == "content_block_start":
            block = obj["content_block"]
            if block.get("type") in _TOOL_BLOCKS:
                self._tool_start(obj.get("index"), block.get("id"), block.get("name"))
        elif kind == "message_start":
            message = obj["message"]
            self.record.response_id = message.get("id")
            usage = message.get("usage")
            if isinstance(usage, dict):
                self.usage = {**(self.usage or {}), **usage}
        elif kind == "message_delta":
            if sr := obj["delta"].get("stop_reason"):
                self.record.finish_reason = sr
            usage = obj.get("usage")
            if isinstance(usage, dict):  # output_tokens is cumulative: the last one wins
                self.usage = {**(self.usage or {}), **usage}
                self._note_usage(usage)
        elif kind == "message_stop":
            self.done = True
        # ping, content_block_start/stop and unknown future types carry nothing we time
        return False

    def _answer(self, obj: dict[str, Any], raw: bytes, t_ns: int) -> None:
        """A non-streaming Message: text blocks joined; the whole answer is one chunk."""
        t_rel = t_ns - self._t0
        try:
            blocks = obj["content"]
            text = "".join(b.get("text") or "" for b in blocks if b.get("type") == "text")
            if any(b.get("type") == "thinking" for b in blocks):
                self._reasoning(t_rel, stamp=not text)
            for i, b in enumerate(blocks):
                if b.get("type") in _TOOL_BLOCKS:
                    self._tool_start(i, b.get("id"), b.get("name"))
                    args = dumps(b.get("input") or {}).decode()
                    self._tool_args(i, args, t_rel, not text and not self._stamps)
        except (KeyError, TypeError, AttributeError):
            self._set(OUTCOME_PROTOCOL_ERROR, "no content blocks in body: " + raw.decode())
            return
        self.record.response_id = obj.get("id")
        self.record.finish_reason = obj.get("stop_reason")
        self.usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
        if text:
            self._parts.append(text)
            self._stamps.append(t_rel)
            self.record.answer_ns = t_rel


class AnthropicClient(StreamingClient):
    """Async Messages API client: ``StreamingClient`` with the Messages dialect.

    ``include_usage`` is ignored (the Messages stream always reports usage).
    """

    APIS = ("anthropic",)
    STATE = AnthropicStreamState

    def __init__(self, endpoint: EndpointConfig, **kw: Any) -> None:
        super().__init__(endpoint, **kw)
        if not any(k.lower() == "anthropic-version" for k in self._headers):  # a --header wins
            self._headers["anthropic-version"] = ANTHROPIC_VERSION

    def _auth(self, key: str) -> dict[str, str]:
        return {"x-api-key": key}

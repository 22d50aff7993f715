"""The OpenAI-compatible client: ``/v1/chat/completions`` and ``/v1/completions``, streamed or not.

Two layers, so the Locust user (gevent, no asyncio) shares every rule of interpretation:

- sans-IO: ``build_body`` (the request JSON, ``loadlab.clients._bodies``) and
  ``OpenAIStreamState`` (feed it the response status, then bytes with the ``perf_counter_ns``
  at which they were read; it decodes SSE, finds token-carrying chunks, usage, finish reason
  and errors, and sets the outcome);
- I/O: ``OpenAIClient`` (``loadlab.clients._streaming.StreamingClient`` with this dialect) over
  a transport (``loadlab.clients._transports``): ``"raw"``
  (default; a lean asyncio HTTP/1.1 protocol that stamps and interprets each chunk inside
  ``data_received``) or ``"aiohttp"`` (one session, a connector sized to the run's
  concurrency). Both keep connections alive. docs/clients.md has the measurements behind the
  default.

Timing and the API key's handling: ``loadlab.clients._streaming``. The key is sent as
``Authorization: Bearer``.

Example::

    async with OpenAIClient(EndpointConfig("http://127.0.0.1:8000", model="m")) as client:
        done = await client.send(spec, t0_ns=time.perf_counter_ns())
        print(done.record.outcome, done.record.chunk_ns)
"""

from __future__ import annotations

from typing import Any

from loadlab.clients._state import StreamState
from loadlab.clients._streaming import StreamingClient
from loadlab.clients._token_frame import TokenFrameState
from loadlab.records import OUTCOME_PROTOCOL_ERROR, RequestRecord

__all__ = ["OpenAIClient", "OpenAIStreamState"]


class OpenAIStreamState(TokenFrameState):
    """Interprets one OpenAI-dialect response; no I/O (``StreamState`` has the protocol, ``TokenFrameState`` the per-read path).

    Complete: ``[DONE]``, or a ``finish_reason`` before EOF. Token-carrying chunks: a chat
    delta with non-empty ``content`` (answer content: ``answer_ns``), reasoning
    (``reasoning_content`` or ``reasoning``: counted apart) or tool-call arguments
    (``tool_calls[].function.arguments``: counted apart), a completions choice with non-empty
    ``text``. The stream's ``id`` is the record's ``response_id``.
    """

    __slots__ = ("_chat", "api")

    INCOMPLETE = "stream ended before [DONE] or a finish_reason"

    def __init__(self, record: RequestRecord, api: str, **kw: Any) -> None:
        super().__init__(record, **kw)  # stream, t0_ns, secrets, max_event_bytes: StreamState's
        self.api = api
        self._chat = api == "chat"
        if not self._chat:
            self._keys = (b'"text":"', b'"text": "')

    def _complete(self) -> bool:
        return bool(self.record.finish_reason)

    def _event(self, data: str, event: str, t_rel: int) -> bool:
        """One SSE event; True when it decided a failure."""
        if data == "[DONE]":
            self.done = True
            return False
        obj = self._json_event(data)
        if obj is None:
            return True
        if event != "message" or "error" in obj:
            if event == "error" or obj.get("error"):
                return self._error(obj, data)
        rec = self.record
        if rec.response_id is None:
            rec.response_id = obj.get("id")
        choices = obj.get("choices")
        if choices:
            try:
                c = choices[0]
                if self._chat:
                    d = c.get("delta") or {}
                    text = d.get("content")
                    if text:
                        self._stamps.append(t_rel)
                        self._parts.append(text)
                        if rec.answer_ns is None:
                            rec.answer_ns = t_rel
                    if text is None or len(d) > 1:  # reasoning, tool calls (or both at once)
                        self._other_delta(d, t_rel, not text)
                elif text := c.get("text"):
                    self._stamps.append(t_rel)
                    self._parts.append(text)
                    if rec.answer_ns is None:
                        rec.answer_ns = t_rel
                if fr := c.get("finish_reason"):
                    self.record.finish_reason = fr
                    if "kv_transfer" in obj:
                        self._kv_transfer(obj["kv_transfer"])
            except (AttributeError, KeyError, TypeError):
                return self._set(OUTCOME_PROTOCOL_ERROR, "unexpected chunk shape: " + data)
        if obj.get("usage"):
            self.usage = obj["usage"]
            self._note_usage(self.usage)
            if "kv_transfer" in obj:
                self._kv_transfer(obj["kv_transfer"])
        return False

    def _other_delta(self, d: dict[str, Any], t_rel: int, stamp: bool) -> None:
        """A chat delta's reasoning (``reasoning_content``, vLLM and DeepSeek; ``reasoning``,
        OpenRouter and newer vLLM) and tool-call argument deltas (``tool_calls``); ``stamp``
        is False when the chunk was already stamped for its content."""
        if d.get("reasoning_content") or d.get("reasoning"):
            self._reasoning(t_rel, stamp)
            stamp = False
        for call in d.get("tool_calls") or ():
            key = call.get("index", 0)
            fn = call.get("function") or {}
            if call.get("id") or fn.get("name"):
                self._tool_start(key, call.get("id"), fn.get("name"))
            if args := fn.get("arguments"):
                self._tool_args(key, args, t_rel, stamp)
                stamp = False

    def _kv_transfer(self, kv: Any) -> None:
        """The reference server's disaggregated mode: this request's KV transfer."""
        if isinstance(kv, dict):
            nbytes, seconds = kv.get("bytes"), kv.get("seconds")
            if isinstance(nbytes, int):
                self.record.server["kv_transfer_bytes"] = nbytes
            if isinstance(seconds, (int, float)):
                self.record.server["kv_transfer_s"] = float(seconds)
            cached = kv.get("cached_bytes")  # the part the prefill side had in its prefix cache
            if isinstance(cached, int):
                self.record.server["kv_transfer_cached_bytes"] = cached

    def _answer(self, obj: dict[str, Any], raw: bytes, t_ns: int) -> None:
        t_rel = t_ns - self._t0  # the whole answer is one chunk
        try:
            c = obj["choices"][0]
            message = (c.get("message") or {}) if self.api == "chat" else {}
            text = message.get("content") if self.api == "chat" else c.get("text")
            self.record.finish_reason = c.get("finish_reason")
            if message and (message.get("reasoning_content") or message.get("reasoning")):
                self._reasoning(t_rel, stamp=not text)
            for i, call in enumerate(message.get("tool_calls") or ()):
                fn = call.get("function") or {}
                self._tool_start(i, call.get("id"), fn.get("name"))
                self._tool_args(i, fn.get("arguments") or "", t_rel, not text and not self._stamps)
        except (KeyError, IndexError, TypeError, AttributeError):
            self._set(OUTCOME_PROTOCOL_ERROR, "no choices[0] in body: " + raw.decode())
            return
        self.record.response_id = obj.get("id")
        self.usage = obj.get("usage") or None
        if "kv_transfer" in obj:
            self._kv_transfer(obj["kv_transfer"])
        if text:
            self._parts.append(text)
            self._stamps.append(t_rel)
            self.record.answer_ns = t_rel


class OpenAIClient(StreamingClient):
    """Async OpenAI-compatible client (see module docstring): ``StreamingClient`` with the
    OpenAI dialect. Use as ``async with``."""

    APIS = ("chat", "completions")
    STATE = OpenAIStreamState

    def _state(self, rec: RequestRecord, t0_ns: int) -> StreamState:
        """``OpenAIStreamState`` also takes the API (chat or completions)."""
        return OpenAIStreamState(
            rec,
            self.endpoint.api,
            stream=self.stream,
            t0_ns=t0_ns,
            secrets=self._secrets,
            max_event_bytes=self.max_event_bytes,
        )

"""Anthropic Messages wire format (``POST /v1/messages``): the request schema and the
response and stream-event builders, so the ``anthropic`` SDK and loadlab's Anthropic dialect
work against the reference server.

The prompt is built as for chat completions (``protocol.chat_prompt``), with ``system`` first
when given. ``ignore_eos`` defaults to true here too, so a request generates exactly
``max_tokens`` tokens unless a stop sequence ends it. Stop reasons: ``max_tokens`` (length),
``stop_sequence`` (a stop string matched; ``stop_sequence`` names it when exactly one was
given), ``end_turn`` (end of sequence) and ``tool_use`` (the answer called a tool:
``reference_server.answer``; reasoning goes out as a ``thinking`` block). ``usage.input_tokens`` is the whole prompt: this
server's prefix-cache hits are ``cache_read_input_tokens`` (known once the prompt is
prefilled: ``message_start`` says 0, ``message_delta`` the count) and ``input_tokens`` the rest,
as Anthropic counts; ``cache_creation_input_tokens`` is 0. Errors keep the server's one
(OpenAI) error shape; the SDKs read the status code.

Usage::

    req = MessagesRequest.model_validate({"model": "loadlab-ref", "max_tokens": 8,
                                          "messages": [{"role": "user", "content": "hi"}]})
    prompt = messages_prompt(req)
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from pydantic import Field, StrictInt, StrictStr

from reference_server.answer import Answer, Piece
from reference_server.engine_like import TokenEvent
from reference_server.protocol import ChatMessage, TextPart, _Request, chat_prompt
from reference_server.sequence import SamplingParams

__all__ = ["MessagesRequest", "MessagesStream", "messages_prompt", "sse_event", "stop_reason"]


class MessagesRequest(_Request):
    max_tokens: StrictInt = Field(ge=1)  # required by the Messages API
    messages: list[ChatMessage] = Field(min_length=1)
    system: StrictStr | list[TextPart] | None = None
    stop_sequences: list[StrictStr] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None  # {"type": "auto" | "any" | "none" | "tool"}

    def tool_choice_name(self) -> Any:
        """``tool_choice`` as ``answer.choose_tool`` reads it."""
        kind = (self.tool_choice or {}).get("type")
        return self.tool_choice if kind == "tool" else kind

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        params = super().sampling_params(max_tokens)
        stops = tuple(s for s in self.stop_sequences or () if s)
        return SamplingParams(
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            seed=params.seed,
            stop=params.stop + stops,
            ignore_eos=params.ignore_eos,
        )


def messages_prompt(req: MessagesRequest) -> str:
    """``system`` then the messages' contents, joined by "\\n" as ``chat_prompt`` joins them."""
    system = req.system
    if isinstance(system, list):
        system = "".join(p.text for p in system)
    head = [ChatMessage(role="system", content=system)] if system else []
    return chat_prompt([*head, *req.messages])


def stop_reason(finish_reason: str, req: MessagesRequest) -> str:
    """The engine's ``length``/``stop`` as a Messages API stop reason."""
    if finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if (req.stop or req.stop_sequences) else "end_turn"


def _usage(prompt_tokens: int, output_tokens: int, cached: int = 0) -> dict[str, int]:
    """Anthropic's usage: ``input_tokens`` leaves out the prompt tokens read from the cache."""
    return {"input_tokens": prompt_tokens - cached, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}  # fmt: skip


def _stop_sequence(reason: str, req: MessagesRequest) -> str | None:
    stops = [*([req.stop] if isinstance(req.stop, str) else req.stop or []),
             *(req.stop_sequences or [])]  # fmt: skip
    return stops[0] if reason == "stop_sequence" and len(stops) == 1 else None


# a piece of the answer (``reference_server.answer``) -> its content block and delta
_BLOCKS: dict[Piece, tuple[str, str, str]] = {
    "reasoning": ("thinking", "thinking_delta", "thinking"),
    "text": ("text", "text_delta", "text"),
    "tool": ("tool_use", "input_json_delta", "partial_json"),
}


class MessagesStream:
    """Anthropic's event stream of one answer: ``message_start``, then a content block per
    kind of piece (``thinking``, ``text``, ``tool_use``), each opened by its first delta and
    closed when the next begins, then ``message_delta`` (stop reason, usage) and
    ``message_stop``. Each method returns the SSE text to write ("" for nothing)."""

    def __init__(self, req: MessagesRequest, message_id: str, model: str, prompt_tokens: int,
                 answer: Answer) -> None:  # fmt: skip
        self.req, self.id, self.model = req, message_id, model
        self.prompt_tokens, self.answer = prompt_tokens, answer
        self._block: Piece | None = None
        self._index = -1
        self._tool_id = "toolu_" + uuid.uuid4().hex[:24]

    def head(self) -> str:
        message: dict[str, Any] = {
            "id": self.id, "type": "message", "role": "assistant", "content": [],
            "model": self.model, "stop_reason": None, "stop_sequence": None,
            "usage": _usage(self.prompt_tokens, 0),
        }  # fmt: skip
        return sse_event("message_start", {"type": "message_start", "message": message})

    def _open(self, piece: Piece) -> str:
        out = self._close()
        self._block, self._index = piece, self._index + 1
        kind, _, key = _BLOCKS[piece]
        block: dict[str, Any] = {"type": kind, key: ""}
        if piece == "tool":
            block = {"type": kind, "id": self._tool_id, "name": self.answer.log.tool, "input": {}}
        start = {"type": "content_block_start", "index": self._index, "content_block": block}
        return out + sse_event("content_block_start", start)

    def _close(self) -> str:
        if self._block is None:
            return ""
        self._block = None
        stop = {"type": "content_block_stop", "index": self._index}
        return sse_event("content_block_stop", stop)

    def piece(self, piece: Piece, text: str) -> str:
        if not text:  # a token that completed no character: nothing to send
            return ""
        out = self._open(piece) if piece != self._block else ""
        _, delta_type, key = _BLOCKS[piece]
        delta = {"type": "content_block_delta", "index": self._index,
                 "delta": {"type": delta_type, key: text}}  # fmt: skip
        return out + sse_event("content_block_delta", delta)

    def tail(self, ev: TokenEvent) -> str:
        out = self._open("text") if self._index < 0 else ""  # always one block, maybe empty
        reason = self._stop_reason(ev.finish_reason or "")
        delta = {"stop_reason": reason, "stop_sequence": _stop_sequence(reason, self.req)}
        end = {"type": "message_delta", "delta": delta,
               "usage": _usage(self.prompt_tokens, ev.completion_tokens, ev.cached_tokens)}  # fmt: skip
        return (out + self._close() + sse_event("message_delta", end)
                + sse_event("message_stop", {"type": "message_stop"}))  # fmt: skip

    def error(self, message: str) -> str:
        return sse_event(
            "error", {"type": "error", "error": {"type": "api_error", "message": message}}
        )

    def _stop_reason(self, finish_reason: str) -> str:
        return "tool_use" if self.answer.called else stop_reason(finish_reason, self.req)

    def whole(self, ev: TokenEvent) -> dict[str, Any]:
        """A non-streaming Message: a thinking block, then the text or the tool call."""
        a = self.answer
        content: list[dict[str, Any]] = []
        if a.reasoning:
            content.append({"type": "thinking", "thinking": "".join(a.reasoning), "signature": ""})
        if a.called:
            content.append({"type": "tool_use", "id": self._tool_id, "name": a.log.tool,
                            "input": json.loads("".join(a.arguments))})  # fmt: skip
        else:
            content.append({"type": "text", "text": "".join(a.text)})
        reason = self._stop_reason(ev.finish_reason or "")
        return {"id": self.id, "type": "message", "role": "assistant", "content": content,
                "model": self.model, "stop_reason": reason,
                "stop_sequence": _stop_sequence(reason, self.req),
                "usage": _usage(self.prompt_tokens, ev.completion_tokens, ev.cached_tokens)}  # fmt: skip


def sse_event(name: str, obj: dict[str, Any]) -> str:
    """A named event, as Anthropic's stream (and the Responses API's) sends each one."""
    return f"event: {name}\ndata: {json.dumps(obj, separators=(',', ':'))}\n\n"

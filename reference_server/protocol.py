"""OpenAI wire format: request schemas (pydantic, at the edge) and response/chunk builders.

Only what the reference server serves: one choice (``n`` = 1), text in and text out. Unknown
fields are accepted and ignored, as OpenAI-compatible servers do, so real clients work.
``ignore_eos`` defaults to true: a request generates exactly ``max_tokens`` tokens unless a
stop string (or ``ignore_eos: false`` and the model's end-of-sequence token) ends it sooner.
``temperature`` defaults to 0 (greedy), unlike OpenAI's 1: greedy picks a whole batch's tokens
in one vectorized argmax, while seeded temperature sampling costs a few small ops per request,
which on a CPU would blur the batching effects the server exists to show.

Usage::

    req = ChatRequest.model_validate({"model": "loadlab-ref", "messages": [...], "max_tokens": 8})
    prompt = chat_prompt(req.messages)         # contents joined by "\\n", no role markers
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from reference_server.answer import Answer, Piece
from reference_server.audio import audio_part_text
from reference_server.engine_like import TokenEvent
from reference_server.sequence import SamplingParams
from reference_server.vision import image_part_text

__all__ = [
    "ChatRequest",
    "ChatStream",
    "CompletionRequest",
    "DetokenizeRequest",
    "TokenizeRequest",
    "chat_prompt",
    "error_body",
    "stream_chunk",
    "whole_response",
]

DEFAULT_MAX_TOKENS = 16  # OpenAI's completions default
SAMPLING_EPS = 1e-5


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Loose):
    include_usage: StrictBool = False


class TextPart(_Loose):
    type: StrictStr = "text"
    text: StrictStr = ""


class ChatMessage(_Loose):
    role: StrictStr
    content: StrictStr | list[TextPart] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an earlier answer that called tools


class _Request(_Loose):
    model: StrictStr
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)  # greedy unless asked: see module doc
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = Field(default=None)
    ignore_eos: StrictBool = True
    n: StrictInt = Field(default=1, ge=1, le=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_tokens=max_tokens,
            # As vLLM does: below 1e-5 is greedy (logits / 1e-300 overflow to inf, then NaN).
            temperature=0.0 if self.temperature < SAMPLING_EPS else self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=tuple(s for s in stop if s),
            ignore_eos=self.ignore_eos,
        )

    def requested_max_tokens(self) -> int:
        return self.max_tokens if self.max_tokens is not None else DEFAULT_MAX_TOKENS

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None

    def requested_max_tokens(self) -> int:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return super().requested_max_tokens()


class CompletionRequest(_Request):
    prompt: StrictStr | list[StrictStr] = Field(min_length=1)


def part_text(part: TextPart) -> str:
    """A content part's text: a text part's ``text``, a tool result's ``content`` (Anthropic
    ``tool_result``), a tool call's ``input`` as JSON (Anthropic ``tool_use``)."""
    if part.text:
        return part.text
    extra = part.model_extra or {}
    image = image_part_text({"type": part.type, **extra})
    if image is not None:
        return image
    audio = audio_part_text({"type": part.type, **extra})
    if audio is not None:
        return audio
    content = extra.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(c.get("text", "") for c in content if isinstance(c, dict))
    return json.dumps(extra["input"]) if "input" in extra else ""


class TokenizeRequest(_Loose):
    """vLLM's ``/tokenize`` body: ``prompt`` (completions) or ``messages`` (chat)."""

    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool = True  # the byte tokenizer has none to add
    add_generation_prompt: StrictBool = True  # the chat formatting adds no generation prompt


class DetokenizeRequest(_Loose):
    """vLLM's ``/detokenize`` body: token ids in, their text out."""

    model: StrictStr | None = None
    tokens: list[StrictInt]


def chat_prompt(messages: list[ChatMessage]) -> str:
    """Message contents joined by "\\n", no role markers: N ASCII characters are N tokens. An
    earlier answer's tool calls count by their arguments."""
    parts: list[str] = []
    for m in messages:
        if isinstance(m.content, list):
            parts.append("".join(part_text(p) for p in m.content))
        else:
            parts.append(m.content or "")
        for call in m.tool_calls or ():
            fn = call.get("function")
            parts.append(str(fn.get("arguments", "")) if isinstance(fn, dict) else "")
    return "\n".join(parts)


def error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


Kind = Literal["chat", "completion"]


def stream_chunk(
    kind: Kind,
    request_id: str,
    model: str,
    created: int,
    *,
    text: str | None = None,
    role: bool = False,
    finish_reason: str | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One SSE event's JSON; ``usage`` alone gives the trailing usage chunk (no choices)."""
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    chunk: dict[str, Any] = {"id": request_id, "object": obj, "created": created, "model": model}
    if usage is not None:
        chunk["choices"] = []
        chunk["usage"] = usage
        return chunk
    if kind == "chat":
        delta: dict[str, str] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
    chunk["choices"] = [choice]
    return chunk


def whole_response(
    kind: Kind, request_id: str, model: str, text: str, finish_reason: str, usage: dict[str, Any]
) -> dict[str, Any]:
    """A non-streaming response body."""
    created = int(time.time())
    if kind == "chat":
        message = {"role": "assistant", "content": text}
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish_reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    return {
        "id": request_id,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage,
    }


def usage_body(prompt_tokens: int, ev: TokenEvent, answer: Answer) -> dict[str, Any]:
    """OpenAI's usage: the prefix cache's hits as ``prompt_tokens_details.cached_tokens``,
    and ``completion_tokens_details.reasoning_tokens`` from a reasoning model."""
    n = ev.completion_tokens
    usage: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                             "total_tokens": prompt_tokens + n,
                             "prompt_tokens_details": {"cached_tokens": ev.cached_tokens}}  # fmt: skip
    if answer.reasoning_budget:
        usage["completion_tokens_details"] = {"reasoning_tokens": answer.log.reasoning_tokens}
    return usage


def with_transfer(body: dict[str, Any], ev: TokenEvent) -> dict[str, Any]:
    """Disaggregated mode: the request's KV transfer beside ``usage``."""
    if ev.kv_transfer is not None:
        body["kv_transfer"] = ev.kv_transfer
    return body


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


class ChatStream:
    """The chat (or completions) chunks of one answer: content as ``delta.content``, reasoning
    as ``delta.reasoning_content`` and ``delta.reasoning`` (vLLM's old and new names), a tool
    call as ``delta.tool_calls`` (id and name on the first, then argument deltas). Each method
    returns the SSE text to write ("" for nothing)."""

    def __init__(self, kind: Kind, request_id: str, model: str, prompt_tokens: int,
                 answer: Answer, include_usage: bool = False) -> None:  # fmt: skip
        self.kind, self.id, self.model, self.answer = kind, request_id, model, answer
        self.prompt_tokens, self.include_usage = prompt_tokens, include_usage
        self.created = int(time.time())
        self._role = True  # the first chunk names the role
        self._call_id = "call_" + request_id[-24:]

    def chunk(self, **kw: Any) -> dict[str, Any]:
        return stream_chunk(self.kind, self.id, self.model, self.created, **kw)

    def piece(self, piece: Piece, text: str) -> str:
        if piece == "text":
            out = sse(self.chunk(text=text, role=self._role))
        elif not text and piece == "reasoning":
            return ""  # a token that completed no character: nothing to send
        else:
            delta: dict[str, Any] = {"role": "assistant"} if self._role else {}
            if piece == "reasoning":
                delta.update(reasoning_content=text, reasoning=text)
            else:
                fn = {"arguments": text}
                call: dict[str, Any] = {"index": 0, "function": fn}
                if len(self.answer.arguments) == 1:  # the call's first delta names it
                    call.update(id=self._call_id, type="function")
                    fn["name"] = self.answer.log.tool or ""
                delta["tool_calls"] = [call]
            body = self.chunk()
            body["choices"] = [{"index": 0, "delta": delta, "finish_reason": None}]
            out = sse(body)
        self._role = False
        return out

    def head(self) -> str:
        return ""

    def error(self, message: str) -> str:
        return sse(error_body(message, "server_error", None, "engine_error")) + "data: [DONE]\n\n"

    def _usage(self, ev: TokenEvent) -> dict[str, Any]:
        return usage_body(self.prompt_tokens, ev, self.answer)

    def tail(self, ev: TokenEvent) -> str:
        """The chunk with the finish reason, the usage chunk when asked, ``[DONE]``; the
        disaggregated mode's KV transfer beside each (SSE has no trailers)."""
        text = "" if self.kind == "completion" else None
        reason = self.answer.finish_reason(ev.finish_reason or "")
        out = sse(with_transfer(self.chunk(text=text, finish_reason=reason), ev))
        if self.include_usage:
            out += sse(with_transfer(self.chunk(usage=self._usage(ev)), ev))
        return out + "data: [DONE]\n\n"

    def whole(self, ev: TokenEvent) -> dict[str, Any]:
        a = self.answer
        reason = a.finish_reason(ev.finish_reason or "")
        usage = self._usage(ev)
        body = with_transfer(
            whole_response(self.kind, self.id, self.model, "".join(a.text), reason, usage), ev
        )
        if self.kind == "chat":
            message = body["choices"][0]["message"]
            if a.reasoning:
                message["reasoning_content"] = message["reasoning"] = "".join(a.reasoning)
            if a.called:
                fn = {"name": a.log.tool, "arguments": "".join(a.arguments)}
                message["tool_calls"] = [{"id": self._call_id, "type": "function", "function": fn}]
                message["content"] = None
        return body

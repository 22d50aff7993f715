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

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from reference_server.sequence import SamplingParams

__all__ = [
    "ChatRequest",
    "CompletionRequest",
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

    def requested_max_tokens(self) -> int:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return super().requested_max_tokens()


class CompletionRequest(_Request):
    prompt: StrictStr | list[StrictStr] = Field(min_length=1)


def chat_prompt(messages: list[ChatMessage]) -> str:
    """Message contents joined by "\\n", no role markers: N ASCII characters are N tokens."""
    parts: list[str] = []
    for m in messages:
        if isinstance(m.content, list):
            parts.append("".join(p.text for p in m.content))
        else:
            parts.append(m.content or "")
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
    usage: dict[str, int] | None = None,
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
    kind: Kind, request_id: str, model: str, text: str, finish_reason: str, usage: dict[str, int]
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

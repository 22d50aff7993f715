"""Anthropic Messages wire format (``POST /v1/messages``): the request schema and the
response and stream-event builders, so the ``anthropic`` SDK and loadlab's Anthropic dialect
work against the reference server.

The prompt is built as for chat completions (``protocol.chat_prompt``), with ``system`` first
when given. ``ignore_eos`` defaults to true here too, so a request generates exactly
``max_tokens`` tokens unless a stop sequence ends it. Stop reasons: ``max_tokens`` (length),
``stop_sequence`` (a stop string matched; ``stop_sequence`` names it when exactly one was
given) and ``end_turn`` (end of sequence). ``usage.input_tokens`` is the whole prompt: this
server has no prompt cache, so ``cache_read_input_tokens`` and ``cache_creation_input_tokens``
are 0. Errors keep the server's one (OpenAI) error shape; the SDKs read the status code.

Usage::

    req = MessagesRequest.model_validate({"model": "loadlab-ref", "max_tokens": 8,
                                          "messages": [{"role": "user", "content": "hi"}]})
    prompt = messages_prompt(req)
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictInt, StrictStr

from reference_server.protocol import ChatMessage, TextPart, _Request, chat_prompt
from reference_server.sequence import SamplingParams

__all__ = [
    "MessagesRequest",
    "message_delta",
    "message_start",
    "messages_prompt",
    "stop_reason",
    "text_delta",
    "whole_message",
]


class MessagesRequest(_Request):
    max_tokens: StrictInt = Field(ge=1)  # required by the Messages API
    messages: list[ChatMessage] = Field(min_length=1)
    system: StrictStr | list[TextPart] | None = None
    stop_sequences: list[StrictStr] | None = None

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


def _usage(prompt_tokens: int, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": prompt_tokens, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}  # fmt: skip


def _stop_sequence(reason: str, req: MessagesRequest) -> str | None:
    stops = [*([req.stop] if isinstance(req.stop, str) else req.stop or []),
             *(req.stop_sequences or [])]  # fmt: skip
    return stops[0] if reason == "stop_sequence" and len(stops) == 1 else None


def message_start(message_id: str, model: str, prompt_tokens: int) -> list[tuple[str, Any]]:
    """The events before the first token: ``message_start`` and the text block's start."""
    message: dict[str, Any] = {
        "id": message_id, "type": "message", "role": "assistant", "content": [], "model": model,
        "stop_reason": None, "stop_sequence": None, "usage": _usage(prompt_tokens, 0),
    }  # fmt: skip
    return [
        ("message_start", {"type": "message_start", "message": message}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
    ]  # fmt: skip


def text_delta(text: str) -> tuple[str, Any]:
    delta = {"type": "text_delta", "text": text}
    return "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}


def message_delta(
    finish_reason: str, req: MessagesRequest, prompt_tokens: int, output_tokens: int
) -> list[tuple[str, Any]]:
    """The events after the last token: block stop, the stop reason and usage, message stop."""
    reason = stop_reason(finish_reason, req)
    delta = {"stop_reason": reason, "stop_sequence": _stop_sequence(reason, req)}
    return [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": delta,
                           "usage": _usage(prompt_tokens, output_tokens)}),
        ("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip


def whole_message(
    message_id: str,
    model: str,
    text: str,
    finish_reason: str,
    req: MessagesRequest,
    prompt_tokens: int,
    output_tokens: int,
) -> dict[str, Any]:
    """A non-streaming Message."""
    reason = stop_reason(finish_reason, req)
    return {"id": message_id, "type": "message", "role": "assistant",
            "content": [{"type": "text", "text": text}], "model": model,
            "stop_reason": reason, "stop_sequence": _stop_sequence(reason, req),
            "usage": _usage(prompt_tokens, output_tokens)}  # fmt: skip

"""OpenAI Responses wire format (``POST /v1/responses``): the request schema, the prompt, and
the event stream and body of one answer, as OpenAI and vLLM serve them.

The prompt is ``instructions`` then every input item's text joined by "\\n", as for chat
(``protocol.chat_prompt``): a message's content (a string, or parts with ``text``), a
``function_call``'s arguments, a ``function_call_output``'s output. ``max_output_tokens``
bounds the answer (default 16, as the server's other routes). Stream: ``response.created``,
``response.in_progress``, then per output item (``reasoning``, ``message``, ``function_call``,
in that order, each as the answer's pieces reach it: ``reference_server.answer``)
``response.output_item.added``, its deltas (``response.reasoning_text.delta``,
``response.output_text.delta`` inside a ``content_part``, ``response.function_call_arguments.delta``)
and its ``.done`` events, then ``response.completed`` (or ``response.incomplete`` with
``incomplete_details.reason = "max_output_tokens"`` when the length limit ended a text
answer) carrying the whole response and its usage (``output_tokens_details.reasoning_tokens``).
Every event has a ``sequence_number``.

Usage::

    req = ResponsesRequest.model_validate({"model": "loadlab-ref", "input": "hi"})
    prompt = responses_prompt(req)
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import Field, StrictInt, StrictStr

from reference_server.answer import Answer, Piece
from reference_server.engine_like import TokenEvent
from reference_server.messages import sse_event
from reference_server.protocol import DEFAULT_MAX_TOKENS, _Request
from reference_server.vision import image_part_text

__all__ = ["ResponsesRequest", "ResponsesStream", "responses_prompt"]


class ResponsesRequest(_Request):
    input: StrictStr | list[dict[str, Any]] = Field(min_length=1)
    instructions: StrictStr | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None  # {"effort": ...}: accepted; --reasoning-tokens rules

    def requested_max_tokens(self) -> int:
        if self.max_output_tokens is not None:
            return self.max_output_tokens
        return self.max_tokens if self.max_tokens is not None else DEFAULT_MAX_TOKENS


def _item_text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            image_part_text(p) or str(p.get("text", "")) for p in content if isinstance(p, dict)
        )
    for key in ("arguments", "output"):  # function_call, function_call_output
        if isinstance(item.get(key), str):
            return str(item[key])
    return ""


def responses_prompt(req: ResponsesRequest) -> str:
    """``instructions`` then each input item's text, joined by "\\n"."""
    head = [req.instructions] if req.instructions else []
    items = [req.input] if isinstance(req.input, str) else [_item_text(i) for i in req.input]
    return "\n".join([*head, *items])


class ResponsesStream:
    """The Responses events of one answer; each method returns the SSE text to write."""

    def __init__(self, response_id: str, model: str, prompt_tokens: int, answer: Answer) -> None:
        self.id, self.model, self.prompt_tokens, self.answer = (
            response_id,
            model,
            prompt_tokens,
            answer,
        )
        self.created = int(time.time())
        self._seq = 0
        self._item: Piece | None = None
        self._items: list[dict[str, Any]] = []  # output items, as they are when done
        suffix = response_id.removeprefix("resp_")
        self._ids: dict[Piece, str] = {"reasoning": "rs_" + suffix, "text": "msg_" + suffix,
                                       "tool": "fc_" + suffix}  # fmt: skip
        self._call_id = "call_" + uuid.uuid4().hex[:24]

    def _event(self, kind: str, **fields: Any) -> str:
        obj = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse_event(kind, obj)

    def _response(self, status: str, usage: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created, "model": self.model,
            "status": status, "output": list(self._items), "usage": usage,
        }  # fmt: skip
        return body

    def head(self) -> str:
        return self._event(
            "response.created", response=self._response("in_progress")
        ) + self._event("response.in_progress", response=self._response("in_progress"))

    def _item_body(self, piece: Piece, done: bool) -> dict[str, Any]:
        a, status = self.answer, "completed" if done else "in_progress"
        if piece == "reasoning":
            text = "".join(a.reasoning) if done else ""
            content = [{"type": "reasoning_text", "text": text}] if done else []
            return {"type": "reasoning", "id": self._ids[piece], "summary": [], "content": content}
        if piece == "tool":
            args = "".join(a.arguments) if done else ""
            return {"type": "function_call", "id": self._ids[piece], "call_id": self._call_id,
                    "name": a.log.tool, "arguments": args, "status": status}  # fmt: skip
        part = [{"type": "output_text", "text": "".join(a.text), "annotations": []}] if done else []
        return {"type": "message", "id": self._ids[piece], "role": "assistant", "status": status,
                "content": part}  # fmt: skip

    def _open(self, piece: Piece) -> str:
        out = self._close()
        self._item = piece
        index = len(self._items)
        out += self._event("response.output_item.added", output_index=index,
                           item=self._item_body(piece, False))  # fmt: skip
        if piece == "text":
            part = {"type": "output_text", "text": "", "annotations": []}
            out += self._event("response.content_part.added", item_id=self._ids[piece],
                               output_index=index, content_index=0, part=part)  # fmt: skip
        return out

    def _close(self) -> str:
        piece = self._item
        if piece is None:
            return ""
        self._item, index, item_id, a = None, len(self._items), self._ids[piece], self.answer
        where = {"item_id": item_id, "output_index": index}
        if piece == "reasoning":
            out = self._event("response.reasoning_text.done", **where, content_index=0,
                              text="".join(a.reasoning))  # fmt: skip
        elif piece == "tool":
            out = self._event("response.function_call_arguments.done", **where,
                              arguments="".join(a.arguments))  # fmt: skip
        else:
            text = "".join(a.text)
            part = {"type": "output_text", "text": text, "annotations": []}
            out = self._event("response.output_text.done", **where, content_index=0, text=text)
            out += self._event("response.content_part.done", **where, content_index=0, part=part)
        item = self._item_body(piece, True)
        self._items.append(item)
        return out + self._event("response.output_item.done", output_index=index, item=item)

    def piece(self, piece: Piece, text: str) -> str:
        if not text:  # a token that completed no character: nothing to send
            return ""
        out = self._open(piece) if piece != self._item else ""
        where = {"item_id": self._ids[piece], "output_index": len(self._items)}
        if piece == "reasoning":
            return out + self._event("response.reasoning_text.delta", **where, content_index=0,
                                     delta=text)  # fmt: skip
        if piece == "tool":
            return out + self._event("response.function_call_arguments.delta", **where, delta=text)
        return out + self._event("response.output_text.delta", **where, content_index=0,
                                 delta=text, logprobs=[])  # fmt: skip

    def usage(self, output_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
        return {"input_tokens": self.prompt_tokens,
                "input_tokens_details": {"cached_tokens": cached_tokens},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": self.answer.log.reasoning_tokens},
                "total_tokens": self.prompt_tokens + output_tokens}  # fmt: skip

    def _final(self, ev: TokenEvent) -> dict[str, Any]:
        cut = ev.finish_reason == "length" and not self.answer.called
        usage = self.usage(ev.completion_tokens, ev.cached_tokens)
        body = self._response("incomplete" if cut else "completed", usage)
        body["incomplete_details"] = {"reason": "max_output_tokens"} if cut else None
        return body

    def tail(self, ev: TokenEvent) -> str:
        out = self._open("text") if not self._items and self._item is None else ""
        out += self._close()
        body = self._final(ev)
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        return out + self._event(kind, response=body)

    def error(self, message: str) -> str:
        return self._event("error", code="server_error", message=message, param=None)

    def whole(self, ev: TokenEvent) -> dict[str, Any]:
        """A non-streaming response: every output item, done."""
        a = self.answer
        pieces: list[Piece] = ["reasoning"] if a.reasoning else []
        pieces.append("tool" if a.called else "text")
        self._items = [self._item_body(p, True) for p in pieces]
        return self._final(ev)

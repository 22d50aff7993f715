"""The OpenAI Responses API client: ``POST /v1/responses``, streamed or not.

A sibling of the chat and Messages dialects (``loadlab.clients._openai``,
``loadlab.clients._anthropic``) over ``loadlab.clients._streaming``: same transports, SSE decoder,
record type and outcome classes; only the dialect differs (OpenAI's "Streaming responses"
reference; vLLM serves the same events):

- request: ``Authorization: Bearer <key>``; body ``{model, input, max_output_tokens, stream}``
  where ``input`` is the session so far and the new user message (an earlier tool call and its
  result become ``function_call`` and ``function_call_output`` items), then ``tools`` (the
  Responses form: ``{"type": "function", "name", "parameters"}``), ``reasoning: {"effort"}``
  and the run's and the request's ``extra_body``;
- stream events (the JSON ``type`` is read, not the SSE ``event:`` line):
  ``response.created`` (its ``response.id`` is the record's ``response_id``),
  ``response.output_text.delta`` (answer content), ``response.reasoning_text.delta`` and
  ``response.reasoning_summary_text.delta`` (reasoning), ``response.output_item.added`` with a
  ``function_call`` item (a tool call's id and name), ``response.function_call_arguments.delta``
  (its arguments): each non-empty ``delta`` is a token chunk whose read time goes into
  ``chunk_ns``; ``response.completed`` or ``response.incomplete`` (the stream is complete;
  ``response.usage`` has ``input_tokens``, ``output_tokens`` and
  ``output_tokens_details.reasoning_tokens``; the record's ``finish_reason`` is the status, or
  ``incomplete_details.reason`` such as ``max_output_tokens``), ``response.failed`` and
  ``error`` (``stream_error``); every other event carries nothing timed;
- complete: only ``response.completed`` or ``response.incomplete``; EOF before is
  ``incomplete``.

The token frame's fast path (``loadlab.clients._token_frame``) rarely holds here: each event
carries a ``sequence_number``, so no two token events share their bytes around the text. The
full way is taken, with the same results.

Example::

    ep = EndpointConfig("http://127.0.0.1:8000", model="m", api="responses")
    async with ResponsesClient(ep) as client:
        done = await client.send(spec, t0_ns=time.perf_counter_ns())
"""

from __future__ import annotations

from typing import Any

from loadlab.clients._streaming import StreamingClient
from loadlab.clients._token_frame import TypedEventState
from loadlab.records import OUTCOME_PROTOCOL_ERROR

__all__ = ["ResponsesClient", "ResponsesStreamState"]

_TEXT = "response.output_text.delta"
_REASONING = ("response.reasoning_text.delta", "response.reasoning_summary_text.delta")
_ARGS = "response.function_call_arguments.delta"
_ENDS = ("response.completed", "response.incomplete")


class ResponsesStreamState(TypedEventState):
    """Interprets one Responses API response; no I/O (``StreamState`` has the protocol,
    ``TokenFrameState`` the per-read path)."""

    __slots__ = ()

    TEXT_KEYS = (b'"delta":"', b'"delta": "')
    PROMPT_KEY = "input_tokens"
    OUTPUT_KEY = "output_tokens"
    OUTPUT_DETAILS_KEY = "output_tokens_details"
    INCOMPLETE = "stream ended before response.completed"

    def _typed(self, obj: dict[str, Any], kind: Any, event: str, data: str, t_rel: int) -> bool:
        """One event (``TypedEventState`` parsed it); True when it decided a failure."""
        if kind == _TEXT:  # first: nearly every event of an answer is one
            if text := obj["delta"]:
                self._stamps.append(t_rel)
                self._parts.append(text)
                if self.record.answer_ns is None:
                    self.record.answer_ns = t_rel
        elif kind in _REASONING:
            if obj["delta"]:
                self._reasoning(t_rel)
        elif kind == _ARGS:
            if args := obj["delta"]:
                self._tool_args(obj.get("item_id") or obj.get("output_index"), args, t_rel)
        elif event == "error" or kind == "error":
            return self._error(obj, data)
        elif kind == "response.output_item.added":
            item = obj["item"]
            if item.get("type") == "function_call":
                key = item.get("id") or obj.get("output_index")
                self._tool_start(key, item.get("call_id"), item.get("name"))
        elif kind == "response.created":
            self.record.response_id = obj["response"].get("id")
        elif kind in _ENDS:
            self.done = True
            self._ended(obj["response"])
        elif kind == "response.failed":
            err = obj["response"].get("error") or {}
            return self._error({"error": err}, data, "response failed")
        return False

    def _ended(self, response: dict[str, Any]) -> None:
        """A finished response (a stream's last event, or a whole body): usage, why it ended."""
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        self.record.finish_reason = reason or response.get("status") or "completed"
        if isinstance(response.get("usage"), dict):
            self.usage = response["usage"]
        if self.record.response_id is None:
            self.record.response_id = response.get("id")

    def _answer(self, obj: dict[str, Any], raw: bytes, t_ns: int) -> None:
        """A non-streaming response: its output items; the whole answer is one chunk."""
        t_rel = t_ns - self._t0
        try:
            items = obj["output"]
            text = "".join(
                part.get("text") or ""
                for item in items
                if item.get("type") == "message"
                for part in item.get("content") or ()
                if part.get("type") == "output_text"
            )
            if any(item.get("type") == "reasoning" for item in items):
                self._reasoning(t_rel, stamp=not text)
            for i, item in enumerate(items):
                if item.get("type") == "function_call":
                    self._tool_start(i, item.get("call_id"), item.get("name"))
                    args = item.get("arguments") or ""
                    self._tool_args(i, args, t_rel, not text and not self._stamps)
        except (KeyError, TypeError, AttributeError):
            self._set(OUTCOME_PROTOCOL_ERROR, "no output items in body: " + raw.decode())
            return
        self._ended(obj)
        if text:
            self._parts.append(text)
            self._stamps.append(t_rel)
            self.record.answer_ns = t_rel


class ResponsesClient(StreamingClient):
    """Async Responses API client: ``StreamingClient`` with the Responses dialect.

    ``include_usage`` is ignored (``response.completed`` always carries usage).
    """

    APIS = ("responses",)
    STATE = ResponsesStreamState

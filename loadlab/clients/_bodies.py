"""The request JSON of each API dialect, from one ``RequestSpec``: one function, a table of
the dialects' own parts.

Every body is the model, the dialect's messages (the chat session so far plus the new user
message, in the dialect's form: ``loadlab.clients._tools``), the output cap and ``stream``,
then the dialect's options, then the run's ``extra_body`` and last the request's own
``spec.extra_body`` (so either can add or override fields; the request's wins):

- ``chat``: ``messages``, ``max_tokens``, ``stream_options.include_usage`` when streaming,
  ``tools``, ``reasoning_effort``;
- ``completions``: ``prompt`` (the spec's text alone), ``max_tokens``, ``stream_options``,
  ``reasoning_effort``;
- ``anthropic`` (Messages): ``messages`` with ``tool_use`` / ``tool_result`` blocks,
  ``max_tokens``, ``tools``; no ``reasoning_effort`` (the Messages API asks for a thinking
  budget: pass ``{"thinking": {"type": "enabled", "budget_tokens": N}}`` in ``extra_body``)
  and no ``exact_output`` fields (``EXACT_OUTPUT_FIELDS``: the Messages API cannot ignore
  EOS, so answers that stop early are counted as short in the summary instead);
- ``responses``: ``input`` with ``function_call`` / ``function_call_output`` items,
  ``max_output_tokens``, ``tools`` in the Responses form, ``reasoning.effort``.

The Messages and Responses streams always report usage, so ``include_usage`` is theirs to
ignore.

>>> from loadlab.config import EndpointConfig
>>> spec = RequestSpec("r", "hi", 8)
>>> build_body(spec, EndpointConfig("http://h", model="m", api="anthropic"), stream=False)
{'model': 'm', 'max_tokens': 8, 'messages': [{'role': 'user', 'content': 'hi'}], 'stream': False}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from loadlab.clients._base import Message
from loadlab.clients._tools import (
    anthropic_messages,
    anthropic_tools,
    responses_input,
    responses_tools,
)
from loadlab.config import EndpointConfig
from loadlab.records import RequestSpec

__all__ = ["EXACT_OUTPUT_FIELDS", "build_body"]

# exact_output's fields: OpenAI-dialect ones that the Messages API lacks
EXACT_OUTPUT_FIELDS = frozenset({"ignore_eos", "min_tokens"})


def _chat(
    body: dict[str, Any], spec: RequestSpec, history: Sequence[Message], stream: bool, usage: bool
) -> None:
    body["messages"] = [*history, *spec.new_messages()]
    _openai_options(body, spec, stream, usage, tools=True)


def _completions(
    body: dict[str, Any], spec: RequestSpec, history: Sequence[Message], stream: bool, usage: bool
) -> None:
    body["prompt"] = spec.prompt
    _openai_options(body, spec, stream, usage, tools=False)


def _openai_options(
    body: dict[str, Any], spec: RequestSpec, stream: bool, usage: bool, *, tools: bool
) -> None:
    body["max_tokens"] = spec.max_tokens
    body["stream"] = stream
    if stream and usage:
        body["stream_options"] = {"include_usage": True}
    if spec.tools and tools:
        body["tools"] = list(spec.tools)
    if spec.reasoning_effort:
        body["reasoning_effort"] = spec.reasoning_effort


def _messages(
    body: dict[str, Any], spec: RequestSpec, history: Sequence[Message], stream: bool, usage: bool
) -> None:
    body["max_tokens"] = spec.max_tokens
    body["messages"] = anthropic_messages([*history, *spec.new_messages()])
    body["stream"] = stream
    if spec.tools:
        body["tools"] = anthropic_tools(spec.tools)


def _responses(
    body: dict[str, Any], spec: RequestSpec, history: Sequence[Message], stream: bool, usage: bool
) -> None:
    body["input"] = responses_input([*history, *spec.new_messages()])
    body["max_output_tokens"] = spec.max_tokens
    body["stream"] = stream
    if spec.tools:
        body["tools"] = responses_tools(spec.tools)
    if spec.reasoning_effort:
        body["reasoning"] = {"effort": spec.reasoning_effort}


# Each dialect's own part of the body, after "model": (body, spec, history, stream, usage)
_Dialect = Callable[[dict[str, Any], RequestSpec, Sequence[Message], bool, bool], None]
_DIALECTS: dict[str, _Dialect] = {
    "chat": _chat,
    "completions": _completions,
    "anthropic": _messages,
    "responses": _responses,
}


def build_body(
    spec: RequestSpec,
    endpoint: EndpointConfig,
    *,
    history: Sequence[Message] = (),
    stream: bool = True,
    include_usage: bool = True,
    extra_body: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The request JSON for ``endpoint.api`` (see the module docstring)."""
    body: dict[str, Any] = {"model": endpoint.model}
    _DIALECTS[endpoint.api](body, spec, history, stream, include_usage)
    body.update(extra_body or {})
    if endpoint.api == "anthropic":
        body.update((k, v) for k, v in spec.extra_body.items() if k not in EXACT_OUTPUT_FIELDS)
    else:
        body.update(spec.extra_body)
    return body

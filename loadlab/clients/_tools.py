"""Tool calls across dialects: one neutral form, each API's own on the wire.

A session's history and a request's tools are kept in OpenAI chat's shape (the form most
servers speak): a tool is ``{"type": "function", "function": {"name", "description",
"parameters"}}``; an assistant turn that called tools is ``{"role": "assistant", "content":
text or None, "tool_calls": [{"id", "type": "function", "function": {"name", "arguments"}}]}``
and a tool's result ``{"role": "tool", "tool_call_id", "content"}``. The chat dialect sends them
as they are; the Messages and Responses dialects convert them here.

Example::

    >>> call = {"id": "c1", "name": "search", "arguments": '{"q": "x"}'}
    >>> assistant_turn("", [call])["tool_calls"][0]["function"]["name"]
    'search'
    >>> responses_input([tool_result("c1", "found")])
    [{'type': 'function_call_output', 'call_id': 'c1', 'output': 'found'}]
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from loadlab.records import RequestSpec

__all__ = [
    "anthropic_messages",
    "anthropic_tools",
    "assistant_turn",
    "next_turn",
    "responses_input",
    "responses_tools",
    "tool_result",
]


def assistant_turn(text: str, calls: Sequence[Mapping[str, str]]) -> dict[str, Any]:
    """The history entry of an answer: its text, and its tool calls when it made any."""
    if not calls:
        return {"role": "assistant", "content": text}
    return {
        "role": "assistant",
        "content": text or None,
        "tool_calls": [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in calls
        ],
    }


def next_turn(spec: RequestSpec, text: str, calls: Sequence[Mapping[str, str]]) -> RequestSpec:
    """A session's later turn as sent after an answer of ``text`` and tool ``calls``: a tool
    turn carries each call's result (``spec.prompt``), and a replayed turn
    (``spec.answer_chars``) has its new text resized by what this answer adds to the prompt
    less what the recorded one added (the trace's layout: the answer's text and each call's
    arguments, one newline before each message), so its prompt has the recorded length.

    >>> s = RequestSpec("r2", "result", 8, turn=1, tool_turn=True, answer_chars=9)
    >>> call = {"id": "c1", "name": "f", "arguments": "{}"}  # adds 1 + len("\\n{}") + 1 = 5
    >>> next_turn(s, "", [call]).tool_results  # the recorded answer added 4 more
    ({'role': 'tool', 'tool_call_id': 'c1', 'content': 'result res'},)
    """
    if spec.answer_chars is not None:
        parts = [text, *(c["arguments"] for c in calls)]
        added = 1 + len("\n".join(parts)) + (max(1, len(calls)) if spec.tool_turn else 1)
        spec = dataclasses.replace(spec, prompt=_resized(spec.prompt, spec.answer_chars - added))
    if spec.tool_turn:
        spec = dataclasses.replace(
            spec, tool_results=tuple(tool_result(c["id"], spec.prompt) for c in calls)
        )
    return spec


def _resized(text: str, by: int) -> str:
    """``text`` cut or lengthened (by repeating it) by ``by`` characters, at least one kept."""
    n = max(1, len(text) + by)
    if n <= len(text) or not text:
        return text[:n]
    return (text + " ") * (n // (len(text) + 1)) + (text + " ")[: n % (len(text) + 1)]


def tool_result(call_id: str, content: str) -> dict[str, Any]:
    """The history entry of one tool call's result."""
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    fn = tool.get("function")
    return fn if isinstance(fn, Mapping) else tool


def responses_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Tools in the Responses form: the function's fields at the top level."""
    return [{"type": "function", **_function(t)} for t in tools]


def anthropic_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Tools in the Messages form: ``name``, ``description``, ``input_schema``."""
    out = []
    for t in tools:
        fn = _function(t)
        tool = {"name": fn.get("name"), "input_schema": fn.get("parameters") or {"type": "object"}}
        if fn.get("description"):
            tool["description"] = fn["description"]
        out.append(tool)
    return out


def _arguments(text: str) -> Any:
    """A call's streamed arguments as JSON (a model may stream text that is not JSON)."""
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return {"arguments": text}


def responses_input(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A session as Responses input items: messages, ``function_call`` items for an
    answer's tool calls and ``function_call_output`` items for their results."""
    items: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": m["tool_call_id"],
                    "output": m["content"],
                }
            )
            continue
        if m.get("content"):
            items.append({"role": role, "content": _responses_content(m["content"])})
        for c in m.get("tool_calls") or ():
            fn = c["function"]
            items.append(
                {
                    "type": "function_call",
                    "call_id": c["id"],
                    "name": fn["name"],
                    "arguments": fn["arguments"],
                }
            )
    return items


def anthropic_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A session as Messages: an answer's tool calls become ``tool_use`` blocks, and their
    results ``tool_result`` blocks in one user message (consecutive results together)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": m["tool_call_id"],
                "content": m["content"],
            }
            last = out[-1] if out else None
            if last and last["role"] == "user" and isinstance(last["content"], list):
                last["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif m.get("tool_calls"):
            blocks: list[dict[str, Any]] = []
            if m.get("content"):
                blocks.append({"type": "text", "text": m["content"]})
            for c in m["tool_calls"]:
                fn = c["function"]
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": c["id"],
                        "name": fn["name"],
                        "input": _arguments(fn["arguments"]),
                    }
                )
            out.append({"role": "assistant", "content": blocks})
        else:
            out.append({"role": role, "content": _anthropic_content(m.get("content") or "")})
    return out


def _anthropic_content(content: Any) -> Any:
    """OpenAI content parts as Messages blocks: an ``image_url`` becomes an ``image`` block
    (base64 from a ``data:`` URL, else a ``url`` source)."""
    if not isinstance(content, list):
        return content
    out: list[dict[str, Any]] = []
    for part in content:
        if part.get("type") != "image_url":
            out.append(part)
            continue
        url = part["image_url"]["url"]
        if url.startswith("data:") and ";base64," in url:
            media, data = url[5:].split(";base64,", 1)
            out.append({"type": "image", "source": {"type": "base64", "media_type": media,
                                                    "data": data}})  # fmt: skip
        else:
            out.append({"type": "image", "source": {"type": "url", "url": url}})
    return out


def _responses_content(content: Any) -> Any:
    """OpenAI content parts as Responses ones: ``input_text`` and ``input_image``."""
    if not isinstance(content, list):
        return content
    return [
        {"type": "input_image", "image_url": p["image_url"]["url"]}
        if p.get("type") == "image_url"
        else {"type": "input_text", "text": p.get("text", "")}
        for p in content
    ]

"""How an answer's tokens go out: as reasoning, answer text or a tool call's arguments.

The model decodes every token the same way; only the framing changes. With
``--reasoning-tokens N`` the first N generated tokens of each answer are reasoning (chat
``reasoning_content``, Anthropic thinking blocks, Responses ``reasoning_text``). When a request
offers tools and a draw seeded by the server's seed and the prompt says so (``--tool-call-rate``,
or always with ``tool_choice`` required or naming a tool, never with ``none``), the answer
after the reasoning is a call of the first tool (or the named one) whose arguments are the
generated text as a JSON object, ``{"input": "<text>"}``, streamed one token per delta: the
first delta opens the object, the last closes it, so the arguments always parse.

``Answer`` splits one request's token events into those pieces and keeps the request's log
(``AnswerLog``): what the server wrote and when (raw ``perf_counter_ns``, the clock a client
on the same machine reads too), and the tokens of each kind. ``AnswerBook`` keeps the last
entries for ``GET /v1/request_log``, so a test can hold a client's records against them.

Example::

    >>> a = Answer(AnswerLog("r1", "chat", 0), reasoning_tokens=2, tool=None)
    >>> [a.split(TokenEvent(t, n)) for n, t in enumerate("abc", 1)]
    [('reasoning', 'a'), ('reasoning', 'b'), ('text', 'c')]
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from reference_server.engine_like import TokenEvent

__all__ = ["Answer", "AnswerBook", "AnswerLog", "Piece", "choose_tool"]

Piece = Literal["reasoning", "text", "tool"]
_OPEN, _CLOSE = '{"input": "', '"}'


@dataclass
class AnswerLog:
    """One request as the server framed it. Times are raw ``perf_counter_ns`` taken right
    before a piece was handed to the transport; chunks count the pieces written with text."""

    response_id: str
    api: str
    received_ns: int
    first_token_ns: int | None = None
    first_answer_ns: int | None = None  # first answer text written
    reasoning_end_ns: int | None = None  # last reasoning written
    reasoning_tokens: int = 0
    answer_tokens: int = 0  # answer text tokens
    tool_call_tokens: int = 0
    reasoning_chunks: int = 0
    answer_chunks: int = 0
    tool_call_chunks: int = 0
    tool: str | None = None  # the called tool's name

    def wrote(self, piece: Piece, t_ns: int) -> None:
        """A piece with text went out at ``t_ns``."""
        if self.first_token_ns is None:
            self.first_token_ns = t_ns
        if piece == "text":
            self.answer_chunks += 1
            if self.first_answer_ns is None:
                self.first_answer_ns = t_ns
        elif piece == "reasoning":
            self.reasoning_chunks += 1
            self.reasoning_end_ns = t_ns
        else:
            self.tool_call_chunks += 1

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ttft_ms"] = _ms(self.first_token_ns, self.received_ns)
        out["ttfat_ms"] = _ms(self.first_answer_ns, self.received_ns)
        return out


def _ms(t_ns: int | None, start_ns: int) -> float | None:
    return None if t_ns is None else (t_ns - start_ns) / 1e6


class AnswerBook:
    """The last ``size`` requests' logs, oldest first."""

    def __init__(self, size: int = 1024) -> None:
        self._logs: deque[AnswerLog] = deque(maxlen=size)

    def add(self, log: AnswerLog) -> None:
        self._logs.append(log)

    def to_list(self) -> list[dict[str, Any]]:
        return [log.to_dict() for log in self._logs]


def _tool_name(tool: Mapping[str, Any]) -> str | None:
    fn = tool.get("function")
    name = fn.get("name") if isinstance(fn, Mapping) else tool.get("name")
    return name if isinstance(name, str) else None


def choose_tool(
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: Any,
    *,
    rate: float,
    seed: int,
    prompt: str,
) -> str | None:
    """The tool this answer calls, or None. Seeded: the same server seed and prompt give the
    same draw (the prompt of each turn of a session differs, so the draws do too)."""
    names = [n for t in tools or () if isinstance(t, Mapping) and (n := _tool_name(t))]
    if not names or tool_choice == "none":
        return None
    if isinstance(tool_choice, Mapping):  # {"type": "function", "function": {"name"}}, ...
        named = _tool_name(tool_choice)
        if named in names:
            return named
    forced = tool_choice in ("required", "any") or isinstance(tool_choice, Mapping)
    if forced or random.Random(f"{seed}:{prompt}").random() < rate:  # noqa: S311 - not crypto
        return names[0]
    return None


class Answer:
    """One request's framing: ``split`` each token event into the piece to write."""

    def __init__(self, log: AnswerLog, *, reasoning_tokens: int, tool: str | None) -> None:
        self.log = log
        self.reasoning_budget = reasoning_tokens
        log.tool = tool
        self.reasoning: list[str] = []
        self.text: list[str] = []
        self.arguments: list[str] = []

    @property
    def called(self) -> bool:
        """Whether the answer became a tool call (some token went out as its arguments)."""
        return bool(self.arguments)

    def split(self, ev: TokenEvent) -> tuple[Piece, str] | None:
        """The piece this event's token goes out as, or None (no token: an error, the end)."""
        if ev.completion_tokens <= 0 or ev.finish_reason == "error":
            return None
        log = self.log
        if ev.completion_tokens <= self.reasoning_budget:
            log.reasoning_tokens += 1
            self.reasoning.append(ev.text)
            return "reasoning", ev.text
        if log.tool is not None:
            log.tool_call_tokens += 1
            piece = ("" if self.arguments else _OPEN) + json.dumps(ev.text)[1:-1]
            if ev.finish_reason is not None:
                piece += _CLOSE
            self.arguments.append(piece)
            return "tool", piece
        log.answer_tokens += 1
        self.text.append(ev.text)
        return "text", ev.text

    def finish_reason(self, reason: str) -> str:
        """The engine's reason, or ``tool_calls`` for an answer that called a tool."""
        return "tool_calls" if self.called and reason in ("length", "stop") else reason

"""Agent workload: tool-calling sessions.

A session is a task (turn 0: a user message that offers the tools), then up to ``tool_rounds``
tool-result turns. When an answer calls a tool, the runner sends the next turn ``think_time_s``
later (the tool's run time) with the call's result in place of a user message
(``RequestSpec.tool_turn``); an answer without a tool call ends the session, so a session
has between 1 and ``1 + tool_rounds`` requests. Every request carries the session so far
(the task, each answer's tool calls, each result), so the prompt grows each round, as an
agent's does.

``[workload]`` keys (kind = "agent")::

    sessions            number of sessions (default: until `requests` turns, or `duration_s`
                        of session arrivals, or forever in a closed-loop duration run)
    tool_rounds         tool-result turns a session may send: number or distribution (default 3)
    tools               tools offered: a number (named tool_0, tool_1, ...) or a list of
                        names (default 1); each takes one string argument
    prompt_tokens       the task's length (default 200)
    tool_result_tokens  each tool result's length (default 100)
    output_tokens       max_tokens of every turn (default 128)
    think_time_s        a tool's run time before its result is sent (default 0.5)
    request_class, max_prompt_tokens, max_output_tokens, exact_output, reasoning_effort
                        (as for synthetic; request_class defaults to "agent")

Sessions arrive by the run's arrival process in open loop (``rate_rps`` is sessions per
second), back to back per user in closed loop.

Example::

    cfg = RunConfig(concurrency=2, requests=8, workload={"kind": "agent", "sessions": 2})
    [(s.turn, s.tool_turn) for s in agent_requests(cfg)][:4]
    # [(0, False), (1, True), (2, True), (3, True)]
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from loadlab.config import RunConfig
from loadlab.records import RequestSpec
from loadlab.workloads._base import RequestStream, caps, check_common, clamp, rng_for, text_seed
from loadlab.workloads._exact import Sizing, draft_chars_per_token
from loadlab.workloads._lengths import Dist, parse_dist
from loadlab.workloads._params import WorkloadError, check_keys, get_int
from loadlab.workloads._sessions import SESSION_KEYS, TurnMaker, session_starts, sessions

__all__ = ["KEYS", "agent_requests", "tool_definitions", "validate"]

KEYS = SESSION_KEYS | {"tool_rounds", "tools", "tool_result_tokens"}
_DEFAULTS = {
    "tool_rounds": 3,
    "prompt_tokens": 200,
    "tool_result_tokens": 100,
    "output_tokens": 128,
    "think_time_s": 0.5,
}


def tool_definitions(tools: Any) -> tuple[dict[str, Any], ...]:
    """The offered tools in OpenAI chat's form (``loadlab.clients._tools`` converts them).

    >>> [t["function"]["name"] for t in tool_definitions(2)]
    ['tool_0', 'tool_1']
    """
    if isinstance(tools, bool) or not isinstance(tools, int | list):
        raise WorkloadError(f"workload.tools = {tools!r}: a number of tools or a list of names")
    names = [f"tool_{i}" for i in range(tools)] if isinstance(tools, int) else tools
    if not names or not all(isinstance(n, str) and n for n in names):
        raise WorkloadError(f"workload.tools = {tools!r}: at least one tool, names non-empty")
    schema = {
        "type": "object",
        "properties": {"input": {"type": "string"}},
        "required": ["input"],
    }
    return tuple(
        {
            "type": "function",
            "function": {"name": n, "description": f"the {n} tool", "parameters": schema},
        }
        for n in names
    )


def _dists(params: Mapping[str, Any], bases: Sequence[Path]) -> dict[str, Dist]:
    return {
        key: parse_dist(params.get(key, default), key, integer=key != "think_time_s", bases=bases)
        for key, default in _DEFAULTS.items()
    }


def validate(cfg: RunConfig, params: Mapping[str, Any], bases: Sequence[Path] = ()) -> None:
    check_keys("agent", params, KEYS)
    _dists(params, bases)
    tool_definitions(params.get("tools", 1))
    get_int(params, "sessions", None)
    check_common(params, bases)


def agent_requests(cfg: RunConfig, sizing: Sizing | None = None) -> RequestStream:
    params = cfg.workload
    chars_per_token = draft_chars_per_token(params, sizing)
    validate(cfg, params)
    d = _dists(params, ())
    tools = tool_definitions(params.get("tools", 1))
    max_prompt, max_output = caps(params)
    n_sessions = get_int(params, "sessions", None)
    cls = str(params.get("request_class", "agent"))
    starts = session_starts(cfg, params, n_sessions)
    counts = {"sessions": 0, "turns_planned": 0}  # a tool turn is sent only if called

    def specs() -> Iterator[RequestSpec]:
        seed = cfg.request_seed
        rng_turns, rng_think = rng_for(seed, "turns"), rng_for(seed, "think")
        rng_prompt, rng_output = rng_for(seed, "prompt"), rng_for(seed, "output")
        text = rng_for(text_seed(cfg), "text")
        make = TurnMaker("agent", "a", params, cls, text, chars_per_token)
        emitted = 0
        for s, start in sessions(n_sessions, starts):
            rounds = int(d["tool_rounds"].sample_int(rng_turns, 1)[0])
            think = d["think_time_s"].sample(rng_think, rounds + 1)
            task = int(d["prompt_tokens"].sample_int(rng_prompt, 1)[0])
            results = d["tool_result_tokens"].sample_int(rng_prompt, rounds + 1)
            outputs = d["output_tokens"].sample_int(rng_output, rounds + 1)
            counts["sessions"] += 1
            for k in range(rounds + 1):
                if cfg.requests is not None and emitted >= cfg.requests:
                    return
                p_tok = clamp(task if k == 0 else int(results[k]), max_prompt)
                out = clamp(int(outputs[k]), max_output)
                think_s = float(think[k])
                yield make.turn(
                    s,
                    k,
                    p_tok,
                    out,
                    start=start,
                    think_time_s=think_s,
                    tools=tools,
                    tool_turn=k > 0,
                )
                emitted += 1
                counts["turns_planned"] += 1

    return RequestStream(specs(), lambda: {"kind": "agent", **counts})

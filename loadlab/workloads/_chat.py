"""Chat workload: multi-turn sessions.

Sessions arrive by the run's arrival process (``rate_rps`` is *sessions* per second; constant,
poisson or gamma) or at the times of a trace (``arrival_trace``). A session's specs are
contiguous: turn 0 (with ``intended_at_s`` in open loop), then turns 1..T-1 with
``intended_at_s = None`` and ``think_time_s`` drawn from ``think_time_s``. The runner sends turn
k+1 ``think_time_s`` after turn k completes, with the session's history (earlier user messages
and the answers actually received) before the new message, so the sent prompt grows each turn.
A spec's ``prompt`` and ``prompt_tokens`` are only the NEW user message.

``[workload]`` keys (kind = "chat")::

    sessions        number of sessions (default: until `requests` turns, or `duration_s` of
                    session arrivals, or forever in a closed-loop duration run)
    turns           turns per session: number or distribution (default 5)
    think_time_s    seconds between an answer and the next message: number or distribution
                    (default {dist = "exponential", mean = 2.0})
    prompt_tokens   new user message length per turn (default: ShareGPT, see below)
    output_tokens   answer length (max_tokens) per turn (default: ShareGPT)
    divide_prompt_by_turns   default true only when prompt_tokens is not given
    max_context_tokens  end a session before a turn whose context (earlier messages and their
                    requested answers, one separator token between messages as on the
                    reference server, plus this message and its answer) would pass this
    arrival_trace, arrival_time_scale   session start times from a trace's timestamps (a file,
                                        or a shipped name: azure-2023-conv, azure-2023-code)
    request_class, max_prompt_tokens, max_output_tokens, exact_output  (as for synthetic)

Default lengths: each turn draws one ShareGPT row (prompt P, completion D) together. ShareGPT's
prompt lengths already include the conversation's earlier turns, so a turn's new message is
P / T tokens for a session of T turns: the session's messages add up to about one ShareGPT
prompt, and the answer is D tokens.

Example::

    cfg = RunConfig(rate_rps=0.5, requests=100, workload={"kind": "chat", "sessions": 20})
    for spec in chat_requests(cfg): print(spec.session_id, spec.turn, spec.think_time_s)
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from loadlab.config import RunConfig
from loadlab.records import RequestSpec
from loadlab.workloads._base import RequestStream, caps, check_common, clamp, rng_for, text_seed
from loadlab.workloads._exact import Sizing, draft_chars_per_token
from loadlab.workloads._lengths import Dist, parse_dist, sample_pairs
from loadlab.workloads._params import WorkloadError, check_keys, get_bool, get_float, get_int
from loadlab.workloads._sessions import SESSION_KEYS, TurnMaker, session_starts, sessions

__all__ = ["DEFAULT_THINK", "KEYS", "chat_requests", "turn_context", "validate"]

KEYS = SESSION_KEYS | {
    "turns",
    "divide_prompt_by_turns",
    "max_context_tokens",
    "arrival_trace",
    "arrival_time_scale",
}
DEFAULT_TURNS = 5
DEFAULT_THINK = {"dist": "exponential", "mean": 2.0}


def _dists(
    params: Mapping[str, Any], bases: Sequence[Path]
) -> tuple[Dist, Dist, Dist | None, Dist | None]:
    turns = parse_dist(params.get("turns", DEFAULT_TURNS), "turns", bases=bases)
    think = parse_dist(
        params.get("think_time_s", DEFAULT_THINK), "think_time_s", integer=False, bases=bases
    )
    prompt = output = None
    if "prompt_tokens" in params:
        prompt = parse_dist(params["prompt_tokens"], "prompt_tokens", bases=bases)
    if "output_tokens" in params:
        output = parse_dist(params["output_tokens"], "output_tokens", bases=bases)
    return turns, think, prompt, output


def validate(cfg: RunConfig, params: Mapping[str, Any], bases: Sequence[Path] = ()) -> None:
    check_keys("chat", params, KEYS)
    _dists(params, bases)
    get_int(params, "sessions", None)
    get_int(params, "max_context_tokens", None)
    get_bool(params, "divide_prompt_by_turns", "prompt_tokens" not in params)
    get_float(params, "arrival_time_scale", 1.0)
    check_common(params, bases)
    if "arrival_trace" in params and cfg.rate_rps is None:
        raise WorkloadError(
            "workload.arrival_trace: session arrivals from a trace need open loop; "
            "set rate_rps (its value is not used) instead of concurrency"
        )


def turn_context(history_tokens: int, turn: int, prompt_tokens: int, output_tokens: int) -> int:
    """Tokens turn ``turn`` of a session holds: its prompt is the earlier messages and answers
    (``history_tokens``), "\\n"-joined (one separator token between messages, as on the
    reference server: ``2 * turn`` of them), then this message; then its answer.

    >>> turn_context(0, 0, 64, 32), turn_context(96, 1, 64, 32)
    (96, 194)
    """
    return history_tokens + 2 * turn + prompt_tokens + output_tokens


def chat_requests(cfg: RunConfig, sizing: Sizing | None = None) -> RequestStream:
    params = cfg.workload
    chars_per_token = draft_chars_per_token(params, sizing)
    validate(cfg, params)
    turns_d, think_d, prompt_d, output_d = _dists(params, ())
    divide = get_bool(params, "divide_prompt_by_turns", prompt_d is None)
    max_prompt, max_output = caps(params)
    max_context = get_int(params, "max_context_tokens", None)
    n_sessions = get_int(params, "sessions", None)
    cls = str(params.get("request_class", "chat"))
    starts = session_starts(cfg, params, n_sessions)
    counts = {"sessions": 0, "turns": 0, "sessions_cut_by_context": 0}

    def specs() -> Iterator[RequestSpec]:
        seed = cfg.request_seed
        rng_turns, rng_think = rng_for(seed, "turns"), rng_for(seed, "think")
        rng_prompt, rng_output = rng_for(seed, "prompt"), rng_for(seed, "output")
        rng_pairs = rng_for(seed, "pairs")
        text = rng_for(text_seed(cfg), "text")
        make = TurnMaker("chat", "s", params, cls, text, chars_per_token)
        emitted = 0
        for s, start in sessions(n_sessions, starts):
            n_turns = int(turns_d.sample_int(rng_turns, 1)[0])
            think = think_d.sample(rng_think, n_turns)
            if prompt_d is None or output_d is None:
                pairs = sample_pairs("sharegpt", rng_pairs, n_turns)
            msg = prompt_d.sample_int(rng_prompt, n_turns) if prompt_d else pairs[:, 0]
            ans = output_d.sample_int(rng_output, n_turns) if output_d else pairs[:, 1]
            counts["sessions"] += 1
            context = 0
            for k in range(n_turns):
                if cfg.requests is not None and emitted >= cfg.requests:
                    return
                p_tok = int(msg[k])
                if divide:
                    p_tok = math.ceil(p_tok / n_turns)
                p_tok, out = clamp(p_tok, max_prompt), clamp(int(ans[k]), max_output)
                if max_context is not None and turn_context(context, k, p_tok, out) > max_context:
                    counts["sessions_cut_by_context"] += 1
                    break
                context += p_tok + out
                think_s = float(think[k])
                yield make.turn(s, k, p_tok, out, start=start, think_time_s=think_s)
                emitted += 1
                counts["turns"] += 1

    return RequestStream(specs(), lambda: {"kind": "chat", **counts})

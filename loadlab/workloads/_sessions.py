"""What the session kinds (``chat``, ``agent``) share: their keys, when sessions start, the
loop over sessions and the shape of a turn's ``RequestSpec``.

A session is a run of turns that the runner sends one after the other: turn 0 at the
session's start (``intended_at_s`` in open loop), turn k+1 ``think_time_s`` after turn k
completes. Sessions arrive by the run's arrival process (``rate_rps`` is sessions per second)
or, for chat, at a trace's times; in closed loop each user runs them back to back.

Example::

    cfg = RunConfig(rate_rps=0.5, requests=4, workload={"kind": "chat", "sessions": 2})
    [s for s, _ in sessions(2, session_starts(cfg, cfg.workload, 2))]  # [0, 1]
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from loadlab.config import RunConfig
from loadlab.records import RequestSpec
from loadlab.workloads._base import COMMON_KEYS, common_extra_body, open_loop_times
from loadlab.workloads._params import get_float, trace_file
from loadlab.workloads._prompts import prompt_text

__all__ = ["SESSION_KEYS", "TurnMaker", "session_starts", "sessions"]

# keys every session kind accepts (besides its own)
SESSION_KEYS = COMMON_KEYS | {"sessions", "prompt_tokens", "output_tokens", "think_time_s"}


def session_starts(
    cfg: RunConfig, params: Mapping[str, Any], n: int | None
) -> Iterable[float] | None:
    """Open-loop session start offsets (s; a list or a lazy iterator), or None in closed loop.

    ``n`` sessions at most (None: until ``cfg.requests`` sessions, the most a run of that many
    requests can start, or ``cfg.duration_s``); from ``params["arrival_trace"]`` when given."""
    if cfg.rate_rps is None:
        return None
    if n is None and cfg.duration_s is None:
        n = cfg.requests  # at most one session per request: an upper bound on sessions
    if "arrival_trace" not in params:
        return open_loop_times(cfg, n)
    from loadlab.workloads._trace import iter_trace  # only when used

    scale = float(get_float(params, "arrival_time_scale", 1.0))
    end = None if cfg.duration_s is None else cfg.duration_s * scale
    path = trace_file(str(params["arrival_trace"]), "workload.arrival_trace")
    rows = iter_trace(path, duration_s=end)
    starts = (row.t_s / scale for row in rows)
    return itertools.islice(starts, n) if n is not None else starts


def sessions(n: int | None, starts: Iterable[float] | None) -> Iterator[tuple[int, float | None]]:
    """Each session's number and start (None in closed loop), until ``n`` sessions or the
    arrival process (or trace) has no more."""
    start_iter = iter(starts) if starts is not None else None
    for s in itertools.count() if n is None else range(n):
        start = None
        if start_iter is not None:
            start = next(start_iter, None)
            if start is None:
                return
        yield s, start


@dataclass(frozen=True)
class TurnMaker:
    """Builds a session kind's turns: request ids ``<kind>-<session>-<turn>``, session ids
    ``<tag><session>``, prompt text drawn from ``rng``, the kind's common request fields."""

    kind: str
    tag: str
    params: Mapping[str, Any]
    request_class: str
    rng: np.random.Generator
    chars_per_token: float = 1.0

    def turn(
        self,
        s: int,
        k: int,
        prompt_tokens: int,
        max_tokens: int,
        *,
        start: float | None,
        think_time_s: float,
        **extra: Any,
    ) -> RequestSpec:
        """Turn ``k`` of session ``s`` (``start`` is used on turn 0 only, ``think_time_s`` on
        later turns); ``extra`` holds the kind's own ``RequestSpec`` fields."""
        rid = f"{self.kind}-{s:05d}-{k}"
        text = prompt_text(prompt_tokens, self.rng, tag=rid, chars_per_token=self.chars_per_token)
        return RequestSpec(
            request_id=rid,
            prompt=text,
            max_tokens=max_tokens,
            intended_at_s=start if k == 0 else None,
            prompt_tokens=prompt_tokens,
            session_id=f"{self.tag}{s:05d}",
            turn=k,
            think_time_s=think_time_s if k > 0 else 0.0,
            request_class=self.request_class,
            extra_body=common_extra_body(self.params, max_tokens),
            **extra,
        )

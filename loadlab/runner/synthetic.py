"""A minimal synthetic workload, used only while ``loadlab.workloads.build_requests`` is absent.

Every request has a prompt of ``cfg.prompt_tokens`` ASCII characters (one token each on the
reference server's byte tokenizer) and asks ``cfg.max_tokens``. Open loop: arrivals from
``loadlab.runner.arrivals``; closed loop: an endless lazy stream (the runner's stop rules end it).

Example::

    >>> cfg = RunConfig(concurrency=1, requests=2, prompt_tokens=4)
    >>> [s.prompt for s in itertools.islice(build_requests(cfg), 2)]
    ['abcd', 'bcde']
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Iterator

from loadlab.config import RunConfig
from loadlab.records import RequestSpec
from loadlab.runner.arrivals import arrival_times

__all__ = ["build_requests"]

_ALPHABET = string.ascii_lowercase


def _prompt(i: int, n: int) -> str:
    # a different rotation per request so a prefix cache cannot serve every prompt at once
    start = i % len(_ALPHABET)
    return "".join(_ALPHABET[(start + k) % len(_ALPHABET)] for k in range(n))


def build_requests(cfg: RunConfig) -> Iterator[RequestSpec]:
    if cfg.rate_rps is not None:
        times: Iterator[float | None] = iter(
            arrival_times(
                cfg.arrival,
                cfg.rate_rps,
                n=cfg.requests,
                duration_s=cfg.duration_s,
                cv=cfg.cv,
                seed=cfg.seed,
            )
        )
    else:
        times = itertools.repeat(None)
    for i, t in enumerate(times):
        yield RequestSpec(
            request_id=f"s{cfg.seed}-{i}",
            prompt=_prompt(i, cfg.prompt_tokens),
            max_tokens=cfg.max_tokens,
            intended_at_s=t,
            prompt_tokens=cfg.prompt_tokens,
        )

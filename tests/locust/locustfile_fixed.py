"""Locustfile for the tests and the timing benchmark: fixed-size single-turn requests.

The fixed-schedule server ignores prompts, so the workload is the simplest one that still
goes through ``LLMUser``: ``--max-tokens`` tokens per request, sessions of ``--turns`` turns
with ``--think-time`` seconds between them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from loadlab.locust import LLMUser
from loadlab.records import RequestSpec


class FixedUser(LLMUser):
    def make_specs(self, seed: int) -> Iterator[RequestSpec]:
        opts = self.environment.parsed_options
        for n in itertools.count():
            for turn in range(opts.turns):
                yield RequestSpec(
                    request_id=f"s{n}t{turn}",
                    prompt="hello there",
                    max_tokens=opts.max_tokens,
                    session_id=f"s{n}",
                    turn=turn,
                    think_time_s=opts.think_time if turn else 0.0,
                )

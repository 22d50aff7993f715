"""Locust scenario: multi-turn chat sessions, streaming, with loadlab's exact LLM metrics.

Each Locust user runs chat sessions one after another (``loadlab.workloads`` chat generator):
``--turns`` turns, ``--think-time`` seconds (exponential mean) between an answer and the next
message, each new message ``--prompt-tokens`` long and each answer up to ``--max-tokens``;
later turns send the whole conversation so far (the answers really received).

    locust -f scenarios/chat.py --headless -u 50 -r 10 -t 60s --host http://127.0.0.1:8000
    locust -f scenarios/chat.py --host http://127.0.0.1:8000            # web UI on :8089
    locust -f scenarios/chat.py --headless -u 50 -r 10 -t 60s --processes 2 --host ...
    locust -f scenarios/chat.py --master ... / locust -f scenarios/chat.py --worker ...

Add ``--loadlab-out reports/chat.json`` to name the results file and ``--slo slo.toml`` to make
the exit code follow the SLO verdict (docs/locust.md).
"""

from __future__ import annotations

from collections.abc import Iterator

from loadlab.locust import LLMUser, workload_specs
from loadlab.records import RequestSpec


class ChatUser(LLMUser):
    def make_specs(self, seed: int) -> Iterator[RequestSpec]:
        opts = self.environment.parsed_options
        return workload_specs(
            {
                "kind": "chat",
                "turns": opts.turns,
                "think_time_s": {"dist": "exponential", "mean": opts.think_time},
                "prompt_tokens": opts.prompt_tokens,
                "output_tokens": opts.max_tokens,
            },
            seed,
        )

"""Locustfile for the agent test: tool-calling sessions (``kind = "agent"``) of three rounds."""

from __future__ import annotations

from collections.abc import Iterator

from loadlab.locust import LLMUser, workload_specs
from loadlab.records import RequestSpec

AGENT = {"kind": "agent", "tool_rounds": 3, "tools": ["search"], "prompt_tokens": 30,
         "tool_result_tokens": 20, "output_tokens": 12, "think_time_s": 0.01}  # fmt: skip


class AgentUser(LLMUser):
    def make_specs(self, seed: int) -> Iterator[RequestSpec]:
        return workload_specs(AGENT, seed)

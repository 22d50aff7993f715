"""Locust scenario: long-document batch (summarisation), with a stepped ramp of users.

Each user sends documents back to back (``loadlab.workloads`` batch generator: arXiv
summarisation lengths drawn together, long prompts and short answers), prompts clamped to
``--doc-max-tokens`` and answers to ``--max-tokens``. The ``StepRamp`` shape adds ``--step-users``
users every ``--step-s`` seconds up to ``-u`` and stops after ``-t`` (default: one more step at
the top), so one run shows how TTFT grows with concurrency.

    locust -f scenarios/batch.py --headless -u 16 -t 120s --step-users 4 --step-s 30 \\
        --host http://127.0.0.1:8000 --loadlab-out reports/batch.json
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from locust import LoadTestShape, events

from loadlab.locust import LLMUser, workload_specs
from loadlab.records import RequestSpec


@events.init_command_line_parser.add_listener
def _options(parser: Any, **_: Any) -> None:
    group = parser.add_argument_group("batch scenario")
    group.add_argument("--doc-max-tokens", type=int, default=2048, help="longest document")
    group.add_argument("--step-users", type=int, default=4, help="users added per step")
    group.add_argument("--step-s", type=float, default=30.0, help="seconds per step")


def _workload(opts: Any) -> dict[str, Any]:
    return {
        "kind": "batch",
        "documents": 50,
        "max_prompt_tokens": opts.doc_max_tokens,
        "max_output_tokens": opts.max_tokens,
    }


@events.init.add_listener
def _warm(environment: Any, **_: Any) -> None:
    # Load the arXiv length table before users start: the first load takes ~0.3 s, which
    # would stall every user's timestamps on the gevent loop mid-run.
    next(workload_specs(_workload(environment.parsed_options), seed=0))


class BatchUser(LLMUser):
    def make_specs(self, seed: int) -> Iterator[RequestSpec]:
        return workload_specs(_workload(self.environment.parsed_options), seed)


class StepRamp(LoadTestShape):
    """``--step-users`` more users every ``--step-s`` seconds, up to ``-u``; ends at ``-t``."""

    use_common_options = True  # -u and -t keep their meaning (top step, run length)

    def tick(self) -> tuple[int, float] | None:
        opts = self.runner.environment.parsed_options
        top = max(1, int(opts.num_users or opts.step_users))
        steps = math.ceil(top / opts.step_users)
        end_s = opts.run_time or (steps + 1) * opts.step_s
        t = self.get_run_time()
        if t >= end_s:
            return None
        users = min(top, opts.step_users * (1 + int(t // opts.step_s)))
        return users, float(opts.step_users)  # spawn a whole step within a second

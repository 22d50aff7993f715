"""Locustfile for the tests and the timing benchmark: sessions of fixed-size requests.

The fixed-schedule server ignores prompts, so the workload is the simplest one that still
goes through ``LLMUser``: sessions of ``--turns`` turns, ``--think-time`` seconds apart; the
first turn of a session asks for ``--first-tokens`` tokens (when > 0), the others for
``--max-tokens``; with ``--bad-input-every N`` every Nth session is one its workload could not
build. A short first turn then a long one leaves long streams in flight at stop.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from locust import events

from loadlab.locust import LLMUser
from loadlab.records import RequestSpec


@events.init_command_line_parser.add_listener
def _options(parser: Any, **_: Any) -> None:
    parser.add_argument(
        "--first-tokens", type=int, default=0, help="tokens of turn 0 (0: --max-tokens)"
    )
    parser.add_argument(
        "--bad-input-every", type=int, default=0, help="every Nth session one its workload "
        "could not build (a dataset row whose image is gone; 0: none)"
    )  # fmt: skip


class FixedUser(LLMUser):
    def make_specs(self, seed: int) -> Iterator[RequestSpec]:
        opts = self.environment.parsed_options
        for n in itertools.count():
            for turn in range(opts.turns):
                tokens = opts.first_tokens if turn == 0 and opts.first_tokens else opts.max_tokens
                yield RequestSpec(
                    request_id=f"s{n}t{turn}",
                    prompt="hello there",
                    max_tokens=tokens,
                    session_id=f"s{n}",
                    turn=turn,
                    think_time_s=opts.think_time if turn else 0.0,
                    error="row 3: image file 'gone.png' cannot be read"
                    if opts.bad_input_every and n % opts.bad_input_every == 1
                    else None,
                )

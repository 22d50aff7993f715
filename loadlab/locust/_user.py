"""``LLMUser``: a Locust user that streams from an OpenAI-compatible endpoint with exact timing.

Import it only from a locustfile (Locust monkey-patches the interpreter with gevent)::

    # my_locustfile.py
    from loadlab.locust import LLMUser, workload_specs

    class Chat(LLMUser):
        def make_specs(self, seed):
            return workload_specs({"kind": "chat", "turns": 3}, seed)

    $ locust -f my_locustfile.py --headless -u 50 -r 10 -t 60s --host http://127.0.0.1:8000 \\
          --loadlab-out reports/locust.json --slo slo.toml

What it adds to Locust:

- Rows in Locust's stats (UI, CSV, HTML) per request name: ``TTFT``, ``ITL`` (one sample per
  gap between tokens), ``TPOT`` and ``E2E`` (the response length is the output tokens;
  failures appear on the ``E2E`` row with their outcome class).
- Locust's response-time histogram keeps 3 significant figures instead of 2 (see
  ``bucket_response_time``); the exact numbers come from loadlab's records anyway.
- Exact records: each worker ships its ``RequestRecord``s to the master every second and at
  stop; the master (or the single process) writes one loadlab results file when Locust quits,
  so ``loadlab report``, ``slo`` and ``compare`` read it unchanged.
- A clean end of distributed runs (locust issue #1426): the master's ``quit`` becomes stop →
  wait (bounded) for every worker's final batch → quit; requests still in flight at stop either
  complete (``--stop-timeout``) or are recorded ``cancelled``.
- ``--slo FILE``: the process exit code follows the SLO verdict.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import gevent
import locust.stats
import numpy as np
from greenlet import GreenletExit
from locust import User, events, task
from locust.exception import StopUser

from loadlab._analysis import metrics
from loadlab._limits import MAX_DURATION_S
from loadlab.clients._base import Message
from loadlab.clients._tools import assistant_turn, next_turn
from loadlab.config import EndpointConfig, RunConfig
from loadlab.locust import _hooks as hooks
from loadlab.locust._options import add_options, endpoint_from_options
from loadlab.locust._stream import StreamConnection
from loadlab.records import OUTCOME_BAD_INPUT, RequestRecord, RequestSpec
from loadlab.workloads import build_requests

__all__ = ["LLMUser", "StreamFailure", "bucket_response_time", "workload_specs"]

log = logging.getLogger("loadlab.locust")

_ENDLESS_S = MAX_DURATION_S  # a closed-loop "duration" for the generators: Locust decides the end


def bucket_response_time(response_time_ms: float) -> float:
    """Locust's histogram key with 3 significant figures (relative error <= 0.5 %).

    Locust's default keeps 2 (147 ms -> 150, 3432 ms -> 3400): too coarse for a 20 ms ITL
    (20.4 would become 20) or a TTFT SLO at 150 ms. Keys stay few enough (~900 per decade at
    most) to ship to the master; msgpack carries float keys.

    >>> bucket_response_time(147.26), bucket_response_time(20.44), bucket_response_time(3432.0)
    (147.0, 20.4, 3430.0)
    """
    return float(f"{response_time_ms:.3g}")


# Module level, as Locust documents ("customizing response time bucketing"): every process that
# imports the locustfile (master and workers) uses it.
locust.stats.bucket_response_time = bucket_response_time  # type: ignore[assignment]


def workload_specs(workload: Mapping[str, Any], seed: int) -> Iterator[RequestSpec]:
    """One Locust user's endless traffic from a ``[workload]`` table (``loadlab.workloads``).

    The generators are built for a closed-loop run; a finite one (a batch of ``documents``)
    is started again with the next seed when it ends, its ids prefixed by the round (``r1-``)
    so request and session ids stay unique.

    >>> specs = workload_specs({"kind": "chat", "turns": 2, "prompt_tokens": 8,
    ...                         "output_tokens": 4, "think_time_s": 0.5}, seed=1)
    >>> [(s.turn, s.think_time_s) for s in itertools.islice(specs, 3)]
    [(0, 0.0), (1, 0.5), (0, 0.0)]
    """
    out = workload.get("output_tokens")
    for round_ in itertools.count():
        # Round k's seed is mixed from (seed, k): seed + k would replay the next user's traffic.
        mixed = np.random.SeedSequence([seed, round_]).generate_state(1, np.uint64)[0]
        cfg = RunConfig(
            concurrency=1,
            duration_s=_ENDLESS_S,
            seed=seed if round_ == 0 else int(mixed),
            max_tokens=out if isinstance(out, int) else RunConfig.max_tokens,
            workload=dict(workload),
        )
        produced = False
        # Built when asked, not 2,048 ahead: a user starts on the live gevent loop, and reading
        # ahead took ~80 ms per user, so a 20 users/s ramp would block the loop.
        for spec in build_requests(cfg, read_ahead=0):
            produced = True
            if round_ == 0:
                yield spec
            else:
                sid = f"r{round_}-{spec.session_id}" if spec.session_id else None
                yield dataclasses.replace(
                    spec, request_id=f"r{round_}-{spec.request_id}", session_id=sid
                )
        if not produced:
            return


class StreamFailure(Exception):
    """A failed request as Locust shows it: ``StreamFailure('http_429: Too Many Requests')``."""

    def __init__(self, outcome: str, error: str | None) -> None:
        super().__init__(f"{outcome}: {error}" if error else outcome)
        self.outcome = outcome


class LLMUser(User):
    """A Locust user that streams requests from ``make_specs`` and records every token.

    Subclass it and implement ``make_specs(seed)``: an iterator of ``RequestSpec`` (one user's
    traffic, e.g. chat sessions: turn 0, then later turns that carry ``think_time_s``).
    One task sends one request; between turns of a session the user waits the next turn's
    think time (a Locust wait, so a stop never waits for it); between sessions it waits
    ``session_gap_s``. ``--host`` is the endpoint's base URL.
    """

    abstract = True
    session_gap_s: float = 0.0

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        opts = environment.parsed_options
        self.endpoint: EndpointConfig = endpoint_from_options(opts, self.host)
        self.timeout_s = float(getattr(opts, "request_timeout", 120.0))
        self._conn = StreamConnection(
            self.endpoint, read_timeout_s=float(getattr(opts, "read_timeout", 30.0))
        )
        seed = hooks.next_user_seed(environment)
        self._tag = hooks.user_tag(environment)  # request ids unique across the run
        self._specs: Iterator[RequestSpec] = iter(self.make_specs(seed))
        self._next: RequestSpec | None = None
        self._history: list[Message] = []
        self._answer = ""  # the last answer's text
        self._calls: Sequence[Mapping[str, str]] = ()  # the last answer's tool calls
        self._wait_s = 0.0

    def make_specs(self, seed: int) -> Iterator[RequestSpec]:
        raise NotImplementedError(
            f"{type(self).__name__} must implement make_specs(seed) -> Iterator[RequestSpec]"
        )

    def wait_time(self) -> float:
        return self._wait_s

    def on_stop(self) -> None:
        self._conn.close()

    def _take(self) -> RequestSpec | None:
        spec = self._next if self._next is not None else next(self._specs, None)
        self._next = None
        if spec is None:
            return None
        sid = f"{self._tag}-{spec.session_id}" if spec.session_id else None
        return dataclasses.replace(
            spec, request_id=f"{self._tag}-{spec.request_id}", session_id=sid
        )

    @task
    def send_next(self) -> None:
        spec = self._take()
        if spec is None:  # this user's workload is exhausted
            raise StopUser()
        if spec.turn == 0:
            self._history = []
        if spec.turn > 0:  # answers the last answer's tool calls (_after skips it otherwise)
            spec = next_turn(spec, self._answer, self._calls)
        hooks.request_started()  # the master counts it lost if no record of it ever arrives
        if spec.error is not None:  # its workload could not build it: a failure, never sent
            self._after(
                spec, RequestRecord.for_spec(spec, outcome=OUTCOME_BAD_INPUT, error=spec.error), ""
            )
            return
        try:
            done = self._conn.send(
                spec,
                t0_ns=hooks.t0_ns(),
                history=self._history if self.endpoint.api == "chat" else (),
                timeout_s=self.timeout_s,
            )
        except GreenletExit:  # Locust stopped this user mid-stream: never lose the request
            # Recorded as cancelled in loadlab's records, but not shown to Locust as a failure:
            # with the default --stop-timeout 0 every run would then exit 1 (Locust's code for
            # "there were failures"); the summary counts them.
            for rec in self._conn.cancelled_records:
                hooks.record_done(rec)
            self._conn.cancelled_records.clear()
            raise
        self._after(spec, done.record, done.text, done.tool_calls)

    def _after(
        self,
        spec: RequestSpec,
        record: RequestRecord,
        text: str,
        calls: Sequence[Mapping[str, str]] = (),
    ) -> None:
        hooks.record_done(record)
        fire_locust_events(self.environment, record)
        # The history a later turn sends is what was really asked and answered.
        self._history += [*spec.new_messages(), assistant_turn(text, calls)]
        self._answer, self._calls = text, calls
        nxt = next(self._specs, None)
        while nxt is not None and nxt.tool_turn and not calls:
            nxt = next(self._specs, None)  # an agent that answered without a tool is done
        self._next = nxt
        later_turn = nxt is not None and nxt.turn > 0
        self._wait_s = nxt.think_time_s if nxt is not None and later_turn else self.session_gap_s


def fire_locust_events(environment: Any, r: RequestRecord) -> None:
    """Locust samples for one finished request (rows TTFT, TPOT, E2E; ITL: one per gap).

    A failed request is one failure on the E2E row, named by its outcome class. The response
    length is the output token count.
    """
    fire = environment.events.request.fire
    name = r.request_class
    tokens = metrics.output_token_count(r)
    ctx = {"request_id": r.request_id}
    if not r.ok:
        elapsed_ms = ((r.end_ns or r.sent_ns or 0) - (r.sent_ns or 0)) / metrics.NS_PER_MS
        failure = StreamFailure(r.outcome, r.error)
        fire(
            request_type="E2E",
            name=name,
            response_time=elapsed_ms,
            response_length=tokens,
            exception=failure,
            context=ctx,
        )
        return
    rows = [("TTFT", metrics.ttft_ms(r)), ("TPOT", metrics.tpot_ms(r)), ("E2E", metrics.e2e_ms(r))]
    if getattr(environment.parsed_options, "itl_rows", "gaps") == "gaps":
        rows += [("ITL", gap) for gap in metrics.itl_ms(r)]
    for i, (row, value) in enumerate(rows, 1):
        if value is not None:
            fire(
                request_type=row,
                name=name,
                response_time=value,
                response_length=tokens if row != "ITL" else 0,
                exception=None,
                context=ctx,
            )
        if i % _EVENTS_PER_YIELD == 0:
            gevent.sleep(0)  # let other users read their sockets between slices of bookkeeping
    gevent.sleep(0)


# Locust's request event costs tens of microseconds (stats, histogram, listeners); a 64-token
# answer fires ~66 of them. Fired in one go that was ~2 ms during which no other user read a
# byte. (``gevent.idle()`` between slices, i.e. bookkeeping only when nothing else is ready,
# measured worse: TTFT p99 error 9-15 ms against 7-9 ms, the sends then queued behind it.)
_EVENTS_PER_YIELD = 8


@events.init_command_line_parser.add_listener
def _add_options(parser: Any, **_: Any) -> None:
    add_options(parser)


hooks.install(events)

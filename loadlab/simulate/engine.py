"""The discrete-event loop: a workload's requests through a simulated server, step by step.

It plays both sides of a run. The client side is the runner's (``loadlab.runner.runner``):
open loop sends each unit (a request, or a chat session's first turn) at its
``intended_at_s``; closed loop keeps ``concurrency`` units going; a session's next turn goes
``think_time_s`` after the previous one completed, its prompt carrying the history (earlier
prompts and answers); ``requests`` truncates the stream, ``duration_s`` stops sending, and
each request times out ``timeout_s`` after it was sent (the runner's drain ends at the same
bound, so a timeout always comes first); ``max_in_flight`` drops. The server
side is the reference server's engine (``reference_server/engine.py``): requests that have
arrived by the start of a step join the queue, the policy (``policies.py``) schedules the
step, the step-time model (``steptime.py``) prices it, and every token sampled in it reaches
its client at the step's end. Like the server's API, a prompt + max_tokens over the context
is refused (400) and a request over ``max_num_seqs + max_queue`` in flight gets a 429.

Speed: a plain decode stretch (``Policy.decode_stretch``) is priced with one numpy call and
advanced in one pass over the running set; tokens are kept as runs of step indices per
request, and their times come from one array of step end times at the end.

Example::

    sim = Simulator(cfg, ServerConfig(mode="chunked", num_kv_blocks=2048), step_model)
    out = sim.run(build_requests(cfg))
    results = out.to_results()          # a normal results file, marked predicted
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loadlab.config import RunConfig
from loadlab.records import RequestSpec
from loadlab.runner.runner import group_units
from loadlab.simulate.policies import Policy, ServerConfig, SimSeq, make_policy
from loadlab.simulate.steptime import StepTimeModel

__all__ = ["Request", "SimOutput", "Simulator", "simulate"]

INF = math.inf


class Request:
    """One request's life on both sides; ``seq`` is its server-side state once it arrived."""

    __slots__ = ("arrival_s", "deadline_s", "end_s", "error", "intended_s", "outcome",
                 "prompt_tokens", "seq", "spec", "unit")  # fmt: skip

    def __init__(self, spec: RequestSpec, unit: _Unit, arrival_s: float, intended_s: float | None):
        self.spec = spec
        self.unit = unit
        self.arrival_s = arrival_s
        self.intended_s = intended_s
        self.prompt_tokens = 0
        self.seq: SimSeq | None = None
        self.outcome = "ok"
        self.error: str | None = None
        self.end_s: float | None = None
        self.deadline_s = INF


class _Unit:
    """A request or a whole chat session, sent one turn after another."""

    __slots__ = ("history_tokens", "next_turn", "open_loop", "specs")

    def __init__(self, specs: list[RequestSpec], open_loop: bool) -> None:
        self.specs = specs
        self.next_turn = 0
        self.history_tokens = 0
        self.open_loop = open_loop


@dataclass
class SimOutput:
    """What a simulation produced: every request, the step timeline, and counters."""

    cfg: RunConfig
    server: ServerConfig
    step_model: StepTimeModel
    requests: list[Request]
    step_start_s: np.ndarray
    step_end_s: np.ndarray
    end_s: float
    preemptions: int
    wall_s: float
    stretch_steps: int  # steps advanced by the decode shortcut (the rest one by one)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        return len(self.step_end_s)

    def to_results(self, endpoint: str = "predicted") -> Any:
        """A ``loadlab.results.Results`` marked predicted (``loadlab.simulate.output``)."""
        from loadlab.simulate.output import to_results

        return to_results(self, endpoint=endpoint)


class Simulator:
    """One simulated run of ``cfg``'s load against a server ``server`` priced by ``step_model``.

    ``chat_join_tokens``: tokens the chat template adds between messages (the reference
    server joins contents with one newline, one byte-level token). ``fast=False`` steps one
    at a time (the shortcut's reference, for tests).
    """

    def __init__(
        self,
        cfg: RunConfig,
        server: ServerConfig,
        step_model: StepTimeModel,
        *,
        chat_join_tokens: int = 1,
        fast: bool = True,
    ) -> None:
        self.cfg = cfg
        self.server = server
        self.model = step_model
        self.join = chat_join_tokens
        self.fast = fast
        self.policy: Policy = make_policy(server)
        self.now = 0.0
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.requests: list[Request] = []
        self._arrivals: list[tuple[float, int, Request]] = []  # heap: server-side arrivals
        self._deadlines: list[tuple[float, int, Request]] = []  # heap: timeouts
        self._turns: list[tuple[float, int, _Unit]] = []  # heap: chat turns after think time
        self._order = itertools.count()
        self._in_server: dict[SimSeq, Request] = {}
        self._in_flight = 0
        self._units: Iterator[list[RequestSpec]] = iter(())
        self._next_unit: list[RequestSpec] | None = None
        self.stretch_steps = 0
        self._stop_s = INF if cfg.duration_s is None else cfg.duration_s

    # ------------------------------------------------------------------ the run

    def run(self, specs: Iterable[RequestSpec]) -> SimOutput:
        t0 = time.perf_counter()
        if self.cfg.requests is not None:
            specs = itertools.islice(specs, self.cfg.requests)
        self._units = group_units(specs)
        if self.cfg.rate_rps is not None:
            self._next_unit = next(self._units, None)
        else:
            for _ in range(self.cfg.concurrency or 1):
                self._start_next_unit(0.0)
        while True:
            self._pull_open_loop(self.now)
            self._pull_turns(self.now)
            self._admit_arrivals()
            self._expire()
            if not self.policy.has_work:
                t = self._next_event_s()
                if t == INF:
                    break
                self.now = max(self.now, t)
                continue
            if self.fast and self._stretch():
                continue
            if not self._step():
                t = min(self._next_event_s(), self._deadline_s())
                if t == INF:
                    raise RuntimeError("simulated server stuck: work waiting, nothing can run")
                self.now = max(self.now, t)
        return SimOutput(
            cfg=self.cfg,
            server=self.server,
            step_model=self.model,
            requests=self.requests,
            step_start_s=np.asarray(self.starts, dtype=np.float64),
            step_end_s=np.asarray(self.ends, dtype=np.float64),
            end_s=self.now,
            preemptions=self.policy.num_preemptions,
            wall_s=time.perf_counter() - t0,
            stretch_steps=self.stretch_steps,
        )

    # ------------------------------------------------------------------ server side

    def _step(self) -> bool:
        """One step, as ``Engine.step``; False when nothing could be scheduled."""
        items = self.policy.schedule()
        if not items:
            return False
        tokens = seqs = pairs = kv = 0
        step = len(self.ends)
        for seq, n, _pad in items:
            start = seq.computed
            tokens += n
            seqs += 1
            pairs += start * n + n * (n + 1) // 2
            kv += start
            if seq.first_step < 0:
                seq.first_step = step
        dt = float(self.model.step_s(tokens, seqs, pairs, kv))
        self.starts.append(self.now)
        self.now += dt
        self.ends.append(self.now)
        for seq in self.policy.postprocess(items, step):
            self._finish(self._in_server.pop(seq), self.now)
        return True

    def _stretch(self) -> bool:
        """Advance a run of plain decode steps at once; False when there is none."""
        policy = self.policy
        k, matter = policy.decode_stretch()
        if k < 1:
            return False
        running = policy.running
        b = len(running)
        total = sum(s.prompt + s.out for s in running)
        held = getattr(policy, "held", ())
        p = len(held)
        pad_pairs = sum(s.prompt + s.out for s in held)  # a padding row: its last token again
        j = np.arange(k, dtype=np.float64)
        pairs = total + j * b + pad_pairs
        kv = pairs - (b + p)
        dts = np.broadcast_to(self.model.step_s(b + p, b + p, pairs, kv), (k,))
        ends = self.now + np.cumsum(dts)
        t_break = min(self._deadline_s(), self._next_event_s() if matter else INF)
        if k > 1 and t_break < INF:
            k = 1 + int(np.searchsorted(ends[: k - 1], t_break, side="left"))
        step = len(self.ends)
        self.starts.append(self.now)
        self.starts.extend(ends[: k - 1].tolist())
        self.ends.extend(ends[:k].tolist())
        self.now = float(ends[k - 1])
        policy.advance_decode(k, step)
        self.stretch_steps += k
        return True

    def _admit_arrivals(self) -> None:
        """Requests that reached the server by now join its queue (or are refused)."""
        heap, cfg = self._arrivals, self.server
        while heap and heap[0][0] <= self.now:
            _, _, req = heapq.heappop(heap)
            prompt = req.prompt_tokens
            if prompt + req.spec.max_tokens > cfg.context_tokens:
                self._fail(req, "http_400", "context_length_exceeded", req.arrival_s)
                continue
            if len(self._in_server) >= cfg.max_num_seqs + cfg.max_queue:
                self._fail(req, "http_429", "queue_full", req.arrival_s)
                continue
            seq = SimSeq(len(self.requests), prompt, req.spec.max_tokens)
            req.seq = seq
            self._in_server[seq] = req
            self.policy.add(seq)

    def _expire(self) -> None:
        """Abort what timed out (the client hung up: the server frees its slot and blocks)."""
        heap = self._deadlines
        while heap and heap[0][0] <= self.now:
            _, _, req = heapq.heappop(heap)
            if req.end_s is None and req.seq is not None:
                self.policy.abort(req.seq)
                del self._in_server[req.seq]
                why = f"no completion within {self.cfg.timeout_s} s"
                self._fail(req, "timeout", why, req.deadline_s)

    def _deadline_s(self) -> float:
        heap = self._deadlines
        while heap and heap[0][2].end_s is not None:
            heapq.heappop(heap)
        return heap[0][0] if heap else INF

    def _next_event_s(self) -> float:
        """When the next request reaches the server (INF: none will)."""
        t = self._arrivals[0][0] if self._arrivals else INF
        if self._turns:
            t = min(t, self._turns[0][0])
        if self._next_unit is not None:
            t = min(t, float(self._next_unit[0].intended_at_s or 0.0))
        return t

    # ------------------------------------------------------------------ client side

    def _pull_open_loop(self, now: float) -> None:
        """Open loop: send every unit due by ``now`` (or drop it at the in-flight cap)."""
        while self._next_unit is not None:
            first = self._next_unit[0]
            due = first.intended_at_s
            if due is None:
                raise ValueError(
                    f"open loop needs intended_at_s on request {first.request_id!r} "
                    "(or on turn 0 of its session); for closed loop use --concurrency"
                )
            if due >= self._stop_s:
                self._next_unit = None
                return
            if due > now:
                return
            unit = _Unit(self._next_unit, open_loop=True)
            self._next_unit = next(self._units, None)
            self._send(unit, due)

    def _start_next_unit(self, now: float) -> None:
        """Closed loop: a worker takes the next unit (while sending is not over)."""
        if now >= self._stop_s:
            return
        specs = next(self._units, None)
        if specs is not None:
            self._send(_Unit(specs, open_loop=False), now)

    def _send(self, unit: _Unit, t: float) -> None:
        """Send ``unit``'s next turn at ``t``."""
        spec = unit.specs[unit.next_turn]
        intended = t if unit.open_loop else None
        req = Request(spec, unit, t, intended)
        self.requests.append(req)
        cap = self.cfg.max_in_flight
        if unit.open_loop and cap is not None and self._in_flight >= cap:
            req.outcome, req.error = "dropped", f"in-flight cap {cap} reached"
            req.end_s = t
            return
        own = spec.prompt_tokens if spec.prompt_tokens is not None else len(spec.prompt)
        turns = unit.next_turn
        req.prompt_tokens = unit.history_tokens + own + 2 * turns * self.join
        self._in_flight += 1
        req.deadline_s = t + self.cfg.timeout_s
        heapq.heappush(self._arrivals, (t, next(self._order), req))
        heapq.heappush(self._deadlines, (req.deadline_s, next(self._order), req))

    def _finish(self, req: Request, t: float) -> None:
        req.end_s = t
        self._in_flight -= 1
        unit = req.unit
        seq = req.seq
        out = seq.out if seq is not None else 0
        # the history a next turn carries: earlier messages, this prompt, this answer
        unit.history_tokens = req.prompt_tokens + out - 2 * unit.next_turn * self.join
        unit.next_turn += 1
        if unit.next_turn < len(unit.specs):
            due = t + unit.specs[unit.next_turn].think_time_s
            if due < self._stop_s:  # else sending is over: the rest is not scheduled
                heapq.heappush(self._turns, (due, next(self._order), unit))
                return
        if not unit.open_loop:
            self._start_next_unit(t)

    def _pull_turns(self, now: float) -> None:
        """Send the later turns whose think time is over by ``now``."""
        heap = self._turns
        while heap and heap[0][0] <= now:
            due, _, unit = heapq.heappop(heap)
            self._send(unit, due)

    def _fail(self, req: Request, outcome: str, why: str, t: float) -> None:
        req.outcome, req.error = outcome, why
        req.end_s = t
        self._in_flight -= 1
        if not req.unit.open_loop:  # a failed turn ends its session; the worker goes on
            self._start_next_unit(t)


def simulate(
    cfg: RunConfig, specs: Iterable[RequestSpec], server: ServerConfig, step_model: StepTimeModel
) -> SimOutput:
    """``Simulator(cfg, server, step_model).run(specs)``."""
    return Simulator(cfg, server, step_model).run(specs)

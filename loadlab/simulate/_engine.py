"""The discrete-event loop: a workload's requests through a simulated server, step by step.

It plays both sides of a run. The client side is the runner's (``loadlab._runner.runner``):
open loop sends each unit (a request, or a chat session's first turn) at its
``intended_at_s``; closed loop keeps ``concurrency`` units going; a session's next turn goes
``think_time_s`` after the previous one completed, its prompt carrying the history (earlier
prompts and answers); ``requests`` truncates the stream, ``duration_s`` stops sending; each
request times out ``timeout_s`` after it was sent (the runner's drain ends at the same bound,
so a timeout always comes first) and the server then frees it; ``max_in_flight`` drops.

The server side is one engine loop per worker (``reference_server/engine.py``; one worker,
or disaggregated mode's prefill and decode workers): requests that have arrived by the start
of a step join the queue, the policy (``policies.py``, ``disagg.py``) schedules the step, the
step-time model (``steptime.py``) prices it, and every token sampled in it reaches its client
at the step's end. Like the server's API, a prompt + max_tokens over the context is refused
(400) and a request over ``max_num_seqs + max_queue`` in flight gets a 429.

Order of events: the loop always handles the earliest thing next, an event (a send, a
timeout, a finished request, a prefilled request offered, a KV transfer arriving) before a
worker's step that starts at the same time. A step's effects are computed when it starts; what
it tells others (a finish, an offer) is an event at its end.

Speed: a plain decode stretch (``Policy.decode_stretch``) is priced with one numpy call and
advanced in one pass over the running set, up to the next event that could change it; tokens
are kept as runs of step indices, and their times come from one array of step end times.

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
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loadlab._runner.runner import group_units
from loadlab.config import RunConfig
from loadlab.records import RequestSpec
from loadlab.simulate._disagg import DecodePolicy, PrefillPolicy, make_workers
from loadlab.simulate._policies import Policy, SimSeq, make_policy
from loadlab.simulate._prefix import Content
from loadlab.simulate._server import ServerConfig
from loadlab.simulate._steptime import RoleStepTime, StepTimeModel

__all__ = ["Request", "SimOutput", "Simulator", "simulate"]

INF = math.inf


class Request:
    """One request's life on both sides. ``seq`` is its server-side state once it arrived
    (disaggregated: the prefill side's; ``dseq`` the decode side's)."""

    __slots__ = ("arrival_s", "deadline_s", "decode_rank", "dseq", "end_s", "error", "intended_s",
                 "outcome", "phase", "prefill_rank", "prompt_tokens", "seq", "spec", "unit")  # fmt: skip

    def __init__(self, spec: RequestSpec, unit: _Unit, arrival_s: float, intended_s: float | None):
        self.spec = spec
        self.unit = unit
        self.arrival_s = arrival_s
        self.intended_s = intended_s
        self.prompt_tokens = 0
        self.seq: SimSeq | None = None
        self.dseq: SimSeq | None = None
        self.prefill_rank = -1
        self.decode_rank = -1
        self.phase = 0  # disaggregated: 0 prefill, 1 offered, 2 decoding (its KV arrived)
        self.outcome = "ok"
        self.error: str | None = None
        self.end_s: float | None = None
        self.deadline_s = INF

    @property
    def output_tokens(self) -> int:
        seq = self.dseq or self.seq
        return seq.out if seq is not None else 0


class _Unit:
    """A request or a whole chat session, sent one turn after another."""

    __slots__ = ("history", "history_tokens", "next_turn", "open_loop", "specs")

    def __init__(self, specs: list[RequestSpec], open_loop: bool) -> None:
        self.specs = specs
        self.next_turn = 0
        self.history_tokens = 0
        self.history: list[tuple[Hashable, int]] = []  # prefix caching: the messages so far
        self.open_loop = open_loop


class Worker:
    """One engine loop: a policy, its step-time model, and its clock (when it is next free)."""

    __slots__ = ("jitter", "model", "now", "policy", "rank")

    def __init__(
        self, policy: Policy, model: StepTimeModel, rank: int = 0, seed: Any = None
    ) -> None:
        self.policy = policy
        self.model = model
        self.rank = rank
        self.now = 0.0
        factors = getattr(model, "jitter", ())
        self.jitter = StepJitter(factors, seed) if factors else None


class StepJitter:
    """Each step's factor (``LinearStepTime.jitter``), drawn from a seeded stream that is
    indexed by the worker's step count: the n-th step of a worker gets the same factor
    whether it was taken alone or inside a decode stretch (which prices more steps than it
    may take), so the shortcut and stepping one at a time still agree."""

    __slots__ = ("drawn", "factors", "rng")

    def __init__(self, factors: Iterable[float], seed: Any) -> None:
        self.factors = np.asarray(tuple(factors), dtype=np.float64)
        self.rng = np.random.default_rng(seed)
        self.drawn = np.empty(0, dtype=np.float64)  # the factors of the steps to come

    def peek(self, k: int) -> np.ndarray:
        """The factors of the worker's next ``k`` steps (not yet taken)."""
        if k > len(self.drawn):
            more = self.factors[self.rng.integers(0, len(self.factors), max(k, 4096))]
            self.drawn = np.concatenate((self.drawn, more))
        return self.drawn[:k]

    def take(self, k: int) -> None:
        """The worker took ``k`` steps."""
        self.drawn = self.drawn[k:]


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
        """A ``loadlab.results.Results`` marked predicted (``loadlab.simulate._output``)."""
        from loadlab.simulate._output import to_results

        return to_results(self, endpoint=endpoint)


class Simulator:
    """One simulated run of ``cfg``'s load against ``server`` priced by ``step_model``.

    ``chat_join_tokens``: tokens the chat template adds between messages (the reference
    server joins contents with one newline, one byte-level token). ``fast=False`` steps one
    at a time (the shortcut's reference, for tests). ``decode_model``: disaggregated mode's
    decode workers' step time when it differs from the prefill workers'.
    """

    def __init__(
        self,
        cfg: RunConfig,
        server: ServerConfig,
        step_model: StepTimeModel,
        *,
        chat_join_tokens: int = 1,
        fast: bool = True,
        decode_model: StepTimeModel | None = None,
    ) -> None:
        self.cfg = cfg
        self.server = server
        self.model = step_model
        self.join = chat_join_tokens
        self.fast = fast
        seed = cfg.request_seed & (2**63 - 1)  # each worker's step jitter stream
        if server.mode == "disaggregated":
            pre, dec = make_workers(server)
            pre_model = step_model
            if isinstance(step_model, RoleStepTime):  # each worker its role's model
                pre_model, decode_model = step_model.prefill, decode_model or step_model.decode
            self.prefill = [Worker(p, pre_model, i, (seed, 1, i)) for i, p in enumerate(pre)]
            self.decode = [Worker(d, decode_model or step_model, i, (seed, 2, i))
                           for i, d in enumerate(dec)]  # fmt: skip
            self.workers = self.prefill + self.decode
        else:
            self.prefill, self.decode = [], []
            self.workers = [Worker(make_policy(server), step_model, 0, (seed, 0, 0))]
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.requests: list[Request] = []
        self._events: list[tuple[float, int, Callable[[float], None]]] = []  # heap
        self._deadlines: list[tuple[float, int, Request]] = []  # heap: timeouts
        self._order = itertools.count()
        # workers that could not run and have not seen anything happen since (see _wait)
        self._stalled: set[Worker] = set()
        self._in_server = 0  # requests the API has admitted and not yet answered
        self._owner: dict[SimSeq, Request] = {}  # server-side state -> request, while in flight
        self._prefill_load = [0] * len(self.prefill)  # requests not yet decoding, per worker
        self._decode_load = [0] * len(self.decode)  # requests offered or decoding, per worker
        self._in_flight = 0  # requests the client has sent and not yet seen end
        self._units: Iterator[list[RequestSpec]] = iter(())
        self._next_unit: list[RequestSpec] | None = None
        self.stretch_steps = 0
        # the largest step shapes reached, held against a fitted model's range (fit.py)
        self.seen = {"prompt_tokens": 0.0, "decode_batch": 0.0, "context_tokens": 0.0}
        self._stop_s = INF if cfg.duration_s is None else cfg.duration_s

    # ------------------------------------------------------------------ the loop

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
            worker = self._next_worker()
            t_step = worker.now if worker is not None else INF
            t_event = self._next_event_s()
            if t_event <= t_step:
                if t_event == INF:
                    break
                self._handle_event()
                self._stalled.clear()
                continue
            assert worker is not None  # noqa: S101 - t_step < INF
            if (self.fast and self._stretch(worker)) or self._step(worker):
                self._stalled.clear()
            else:
                self._wait(worker)
        return SimOutput(
            cfg=self.cfg,
            server=self.server,
            step_model=self.model,
            requests=self.requests,
            step_start_s=np.asarray(self.starts, dtype=np.float64),
            step_end_s=np.asarray(self.ends, dtype=np.float64),
            end_s=max(w.now for w in self.workers),
            preemptions=sum(w.policy.num_preemptions for w in self.workers),
            wall_s=time.perf_counter() - t0,
            stretch_steps=self.stretch_steps,
            extra={"seen": dict(self.seen)},
        )

    def _wait(self, w: Worker) -> None:
        """``w`` has work that cannot run yet (no blocks until a pull frees some): it waits
        for the next event or another worker's next step. A worker that is itself waiting
        does not count until something happens: two workers each waiting for the other
        would otherwise take turns one float step at a time, for ever in effect (a prefill
        worker short of blocks and a decode worker whose preempted head is, both until a
        KV transfer arrives)."""
        stalled = self._stalled
        stalled.add(w)
        t = self._next_event_s()
        for other in self.workers:
            if other not in stalled and other.policy.has_work:
                t = min(t, other.now)
        if t == INF:
            raise RuntimeError("simulated server stuck: work waiting, nothing can run")
        w.now = max(t, math.nextafter(w.now, INF))  # (a tie goes to the other worker)

    def _next_worker(self) -> Worker | None:
        best: Worker | None = None
        for w in self.workers:
            if w.policy.has_work and (best is None or w.now < best.now):
                best = w
        return best

    def _next_event_s(self, sends: bool = True) -> float:
        t = self._events[0][0] if self._events else INF
        heap = self._deadlines
        while heap and heap[0][2].end_s is not None:  # answered: its timeout is moot
            heapq.heappop(heap)
        if heap:
            t = min(t, heap[0][0])
        if sends and self._next_unit is not None:
            t = min(t, float(self._next_unit[0].intended_at_s or 0.0))
        return t

    def _handle_event(self) -> None:
        """The earliest event: a deadline, a queued event, or the next open-loop unit."""
        t_unit = INF
        if self._next_unit is not None:
            t_unit = float(self._next_unit[0].intended_at_s or 0.0)
        t_dead = self._deadlines[0][0] if self._deadlines else INF
        t_ev = self._events[0][0] if self._events else INF
        if t_ev <= t_dead and t_ev <= t_unit:
            t, _, action = heapq.heappop(self._events)
            action(t)
        elif t_dead <= t_unit:
            t, _, req = heapq.heappop(self._deadlines)
            self._timeout(req, t)
        else:
            self._pull_open_loop()

    def _at(self, t: float, action: Callable[[float], None]) -> None:
        heapq.heappush(self._events, (t, next(self._order), action))

    # ------------------------------------------------------------------ server side

    def _step(self, w: Worker) -> bool:
        """One step of worker ``w``, as ``Engine.step``; False when nothing could run."""
        policy = w.policy
        pulled = isinstance(policy, DecodePolicy) and self._pull(w)
        items = policy.schedule()
        if not items:
            return pulled
        prefill = decode = pairs = kv = ctx = 0
        step = len(self.ends)
        for seq, n, _pad in items:
            start = seq.computed
            if n > 1:
                prefill += n
            else:
                decode += 1
            pairs += start * n + n * (n + 1) // 2
            kv += start
            if seq.first_step < 0:
                seq.first_step = step
            if start + n > ctx:
                ctx = start + n
        self._see(prefill, decode, ctx)
        self.starts.append(w.now)
        dt = float(w.model.step_s(prefill, decode, pairs, kv))
        if w.jitter is not None:
            dt *= float(w.jitter.peek(1)[0])
            w.jitter.take(1)
        w.now += dt
        self.ends.append(w.now)
        for seq in policy.postprocess(items, step):
            self._at(w.now, self._finished(self._owner[seq]))
        if isinstance(policy, PrefillPolicy):
            for seq, _n, _pad in items:
                if seq in policy.held:
                    self._at(w.now, self._ready(seq))
        return True

    def _stretch(self, w: Worker) -> bool:
        """Advance a run of plain decode steps of ``w`` at once; False when there is none."""
        policy = w.policy
        k, matter = policy.decode_stretch()
        if k < 1:
            return False
        running = policy.running
        b = len(running)
        total = sum(s.prompt + s.out for s in running)
        held = getattr(policy, "held", ()) if policy.mode == "static" else ()
        p = len(held)
        pad_pairs = sum(s.prompt + s.out for s in held)  # a padding row: its last token again
        j = np.arange(k, dtype=np.float64)
        pairs = total + j * b + pad_pairs
        kv = pairs - (b + p)
        dts = np.broadcast_to(w.model.step_s(0, b + p, pairs, kv), (k,))
        if w.jitter is not None:
            dts = dts * w.jitter.peek(k)
        # summed from w.now one step at a time, as stepping does: the same floats, so a tie
        # with a deadline or an arrival goes the same way with and without the shortcut
        ends = np.cumsum(np.concatenate(([w.now], dts)))[1:]
        t_break = self._next_event_s(sends=matter) if matter else self._deadline_or_internal()
        for other in self.workers:  # another worker's next step may send this one work
            if other is not w and other.policy.has_work:
                t_break = min(t_break, other.now)
        if k > 1 and t_break < INF:
            k = 1 + int(np.searchsorted(ends[: k - 1], t_break, side="left"))
        step = len(self.ends)
        self._see(0, b + p, max(s.prompt + s.out for s in running) + k - 1)
        self.starts.append(w.now)
        self.starts.extend(ends[: k - 1].tolist())
        self.ends.extend(ends[:k].tolist())
        w.now = float(ends[k - 1])
        if w.jitter is not None:
            w.jitter.take(k)
        policy.advance_decode(k, step)
        self.stretch_steps += k
        return True

    def _see(self, prefill: float, decode: float, context: float) -> None:
        seen = self.seen
        if prefill > seen["prompt_tokens"]:
            seen["prompt_tokens"] = prefill
        if decode > seen["decode_batch"]:
            seen["decode_batch"] = decode
        if context > seen["context_tokens"]:
            seen["context_tokens"] = context

    def _deadline_or_internal(self) -> float:
        """The next event that changes a worker's running set even when arrivals do not."""
        return self._next_event_s(sends=False)

    def _arrive(self, req: Request, t: float) -> None:
        """A request reaches the server at ``t``: refused, or queued on a worker."""
        cfg = self.server
        if req.prompt_tokens + req.spec.max_tokens > cfg.context_tokens:
            self._fail(req, "http_400", "context_length_exceeded", t)
            return
        if self._in_server >= cfg.max_num_seqs + cfg.max_queue:
            self._fail(req, "http_429", "queue_full", t)
            return
        self._in_server += 1
        content = None
        if cfg.caching:  # what its tokens are: the history, then its own prompt text
            spec = req.spec
            own = req.prompt_tokens - req.unit.history_tokens - 2 * req.unit.next_turn * self.join
            content = Content([*req.unit.history, (spec.prompt, own)])
        seq = SimSeq(len(self.requests), req.prompt_tokens, req.spec.max_tokens, content)
        req.seq = seq
        self._owner[seq] = req
        w = self.workers[0]
        if self.prefill:  # the least loaded prefill worker (requests not yet decoding)
            load = self._prefill_load
            w = self.prefill[min(range(len(load)), key=load.__getitem__)]
            req.prefill_rank = w.rank
            load[w.rank] += 1
        w.policy.add(seq)
        if w.now < t:
            w.now = t  # an idle worker wakes when work comes

    def _finished(self, req: Request) -> Callable[[float], None]:
        return lambda t: self._finish(req, t)

    def _timeout(self, req: Request, t: float) -> None:
        """The client gives up at ``t``; the server frees the request at its next step."""
        if req.end_s is not None:
            return
        for seq in (req.seq, req.dseq):
            if seq is not None and seq.status != 2:
                for w in self.workers:
                    if w.policy.abort(seq):
                        break
        self._leave_server(req)
        self._fail(req, "timeout", f"no completion within {self.cfg.timeout_s} s", t)

    def _leave_server(self, req: Request) -> None:
        """The API answered ``req`` (finished or gone): it no longer counts anywhere."""
        self._in_server -= 1
        for seq in (req.seq, req.dseq):
            if seq is not None:
                self._owner.pop(seq, None)
        if self.prefill:
            if req.phase < 2:
                self._prefill_load[req.prefill_rank] -= 1
            if req.decode_rank >= 0:
                self._decode_load[req.decode_rank] -= 1

    # -- disaggregated: offers, pulls, transfers -----------------------------------------------

    def _ready(self, seq: SimSeq) -> Callable[[float], None]:
        def offer(t: float) -> None:
            req = self._owner.get(seq)
            if req is None or req.end_s is not None:
                return  # finished by its first token, or timed out: nothing to decode
            load = self._decode_load
            w = self.decode[min(range(len(load)), key=load.__getitem__)]
            req.decode_rank, req.phase = w.rank, 1
            load[w.rank] += 1
            dseq = SimSeq(seq.idx, seq.prompt, seq.max_out)
            dseq.out, dseq.segs, dseq.first_step = seq.out, seq.segs, seq.first_step
            dseq.content, dseq.cached = seq.content, seq.cached  # for its record
            req.dseq = dseq
            self._owner[dseq] = req
            policy = w.policy
            assert isinstance(policy, DecodePolicy)  # noqa: S101
            policy.offers.append(dseq)
            if w.now < t:
                w.now = t  # an idle decode worker wakes (and pulls) now

        return offer

    def _pull(self, w: Worker) -> bool:
        """Decode worker ``w`` pulls what it can now; True if it pulled any."""
        policy = w.policy
        assert isinstance(policy, DecodePolicy)  # noqa: S101
        pulled = policy.pull()
        for dseq in pulled:
            req = self._owner[dseq]
            pw = self.prefill[req.prefill_rank]
            assert isinstance(pw.policy, PrefillPolicy) and req.seq is not None  # noqa: S101
            pw.policy.take(req.seq)  # the prefill side's blocks go back now
            if pw.now < w.now:
                pw.now = w.now  # a worker paused on max_held goes on
            arrive = w.now + self.server.kv_transfer_s(dseq.prompt)
            self._at(arrive, self._kv_arrived(dseq, w))
        return bool(pulled)

    def _kv_arrived(self, dseq: SimSeq, w: Worker) -> Callable[[float], None]:
        def arrived(t: float) -> None:
            policy = w.policy
            assert isinstance(policy, DecodePolicy)  # noqa: S101
            req = self._owner.get(dseq)
            policy.arrived(dseq, aborted=req is None)
            if req is not None:
                req.phase = 2
                self._prefill_load[req.prefill_rank] -= 1
            if w.now < t:
                w.now = t

        return arrived

    # ------------------------------------------------------------------ client side

    def _pull_open_loop(self) -> None:
        """Open loop: send the next unit at its intended time (or drop it at the cap)."""
        assert self._next_unit is not None  # noqa: S101
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
        """Send ``unit``'s next turn at ``t``: it reaches the server at once."""
        spec = unit.specs[unit.next_turn]
        req = Request(spec, unit, t, t if unit.open_loop else None)
        self.requests.append(req)
        cap = self.cfg.max_in_flight
        if unit.open_loop and cap is not None and self._in_flight >= cap:
            req.outcome, req.error = "dropped", f"in-flight cap {cap} reached"
            req.end_s = t
            return
        own = spec.prompt_tokens if spec.prompt_tokens is not None else len(spec.prompt)
        own += spec.image_tokens + spec.audio_tokens  # media tokens are prefilled as text is
        req.prompt_tokens = unit.history_tokens + own + 2 * unit.next_turn * self.join
        self._in_flight += 1
        req.deadline_s = t + self.cfg.timeout_s
        heapq.heappush(self._deadlines, (req.deadline_s, next(self._order), req))
        self._arrive(req, t)

    def _finish(self, req: Request, t: float) -> None:
        if req.end_s is not None:
            return  # it timed out before its last token came
        self._leave_server(req)
        req.end_s = t
        self._in_flight -= 1
        unit = req.unit
        # the history a next turn carries: earlier messages, this prompt, this answer
        unit.history_tokens = req.prompt_tokens + req.output_tokens - 2 * unit.next_turn * self.join
        seq = req.seq
        if seq is not None and seq.content is not None:  # the template joins messages with "\n"
            join = ("\n" * self.join, self.join)
            unit.history = [
                *seq.content.pieces,
                join,
                (seq.content.answer, req.output_tokens),
                join,
            ]
        unit.next_turn += 1
        if unit.next_turn < len(unit.specs):
            due = t + unit.specs[unit.next_turn].think_time_s
            if due < self._stop_s:  # else sending is over: the rest is not scheduled
                self._at(due, lambda when: self._send(unit, when))
                return
        if not unit.open_loop:
            self._start_next_unit(t)

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

"""The runner: sends a workload's requests through a client, open or closed loop, and returns
a ``Results``.

Open loop (``cfg.rate_rps``): every request (or the first turn of a chat session) is sent at
``t0 + spec.intended_at_s``. Nothing heavy waits for the due time: the coming units are built
(prompts fitted, first bodies encoded) while the scheduler waits (``loadlab._runner.ahead``),
and with a client that takes a gate (``loadlab.clients._gate``) each request is started
``SEND_LEAD_NS`` ahead (its connection taken or opened then) and written when due by the run's
sender thread (``loadlab._runner.sender``), which does not wait for the loop's turn; the run's
garbage is collected between sends (``_collect_between_sends``). Otherwise the scheduler sleeps
until about 1 ms before the due time, then yields to the event loop until the time has come
(sub-millisecond precision without blocking the chunk readers); a client without gates is
asked for a spare connection (``preconnect``, where it has one) ``PRECONNECT_AHEAD_NS`` before
each due request; every client that has one, once before t0.
With ``cfg.max_in_flight`` a request due while the cap is full is recorded ``dropped`` at
once: it is never silently delayed (such a run starts each request when due). A request sent
more than
``late_tolerance_ms`` after its intended time is marked ``late``.

Closed loop (``cfg.concurrency``): that many workers, each sending the next request (a whole
chat session) as soon as its previous one completed. While the endpoint refuses connections
they back off (``CONNECT_BACKOFF_BASE_S`` doubling up to ``CONNECT_BACKOFF_MAX_S``; the total
is ``extra["connect_backoff_s"]``) instead of spinning out failed records.

Chat sessions: a session's specs are contiguous, turn 0 first. Turn k+1 is sent
``think_time_s`` after turn k completed, with the history of earlier user prompts and the
answers actually received. A failed or dropped turn ends its session (the later turns depend
on an answer that never came; they are not scheduled). Tool-calling sessions
(``spec.tool_turn``): when an answer called tools, the next turn sends each call's result
(the turn's ``prompt``) after its think time; an answer without a tool call ends the session.
A replayed recording's turn (``spec.answer_chars``) has its new text resized by what the answer
it follows adds to the prompt (``loadlab.clients._tools.next_turn``).

Stop rules: ``cfg.requests`` truncates the request stream (counting every turn);
``cfg.duration_s`` stops sending at ``t0 + duration``; requests still in flight may finish
for ``drain_s`` more (default ``cfg.timeout_s``, which bounds every request anyway) and are then
cancelled and recorded ``cancelled``. ``stop()`` (Ctrl-C) stops sending and cancels what is in
flight at once. Nothing is lost: every scheduled request ends as exactly one record, so
scheduled = sent + dropped and sent = ok + failed.

Measurement window: ``[warmup_s, end - cooldown_s]`` where ``end`` is ``duration_s`` for a
duration run and the last completion otherwise.

Example::

    async with make_client(endpoint, cfg) as client:
        results = await Runner(cfg, build_requests(cfg), client).run()
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from loadlab._analysis.metrics import percentile
from loadlab._runner.ahead import Lookahead
from loadlab._runner.monitor import LoopMonitor
from loadlab._runner.sender import Sender
from loadlab.clients._base import Client, Completion, Message, SendOptions
from loadlab.clients._gate import SendGate
from loadlab.clients._tools import assistant_turn, next_turn
from loadlab.config import RunConfig
from loadlab.errors import at_least
from loadlab.journal import JournalWriter
from loadlab.records import (
    OUTCOME_BAD_INPUT,
    OUTCOME_CANCELLED,
    OUTCOME_CONNECT_ERROR,
    OUTCOME_DROPPED,
    OUTCOME_PROTOCOL_ERROR,
    RequestRecord,
    RequestSpec,
)
from loadlab.results import Results, environment_info

__all__ = ["LiveStats", "Runner", "group_units", "run_async"]

_FREEZE_EVERY_S = 0.1  # the run freezes the heap this often (_freeze_every)
SWITCH_INTERVAL_S = 0.0002  # the GIL switch interval while a run lasts (_short_switch_interval)
NS_PER_S = 1_000_000_000
SPIN_NS = 1_000_000  # the last stretch before a due time is waited by yielding, not sleeping
# open loop: a request is started (record, framing, connection) this long before it is due
SEND_LEAD_NS = 200_000_000
# a spare connection is started this long before a due request (Client.preconnect), so that
# the request is sent at its time instead of after a connect (a session's first turn, a rise)
PRECONNECT_AHEAD_NS = 50_000_000
# Closed loop against an endpoint that refuses connections: after k connect errors in a row
# (run-wide; any answered request resets it) each worker waits min(MAX, BASE * 2**(k-1))
# before its next request, instead of making ~10,000 failed records a second.
CONNECT_BACKOFF_BASE_S = 0.01
CONNECT_BACKOFF_MAX_S = 1.0
T = TypeVar("T")


class _Due:
    """An open-loop unit with its due time (perf_counter_ns) and its first request's encoded
    body."""

    __slots__ = ("body", "due_ns", "unit")

    def __init__(self, unit: list[RequestSpec], body: bytes | None, due_ns: int) -> None:
        self.unit, self.body, self.due_ns = unit, body, due_ns


@dataclass
class LiveStats:
    """Counters the progress display reads while the run goes on."""

    scheduled: int = 0
    in_flight: int = 0  # started (a gated open loop's from SEND_LEAD_NS before they are due)
    ahead: int = 0  # a gated open loop's requests started ahead (the loop's thread counts)
    fired: int = 0  # of which their gate has fired (the sender's thread counts)
    done: int = 0
    failed: int = 0
    dropped: int = 0
    output_tokens: int = 0


def group_units(specs: Iterable[RequestSpec]) -> Iterator[list[RequestSpec]]:
    """Lazily group a spec stream into units: one request, or one whole chat session.

    >>> [len(u) for u in group_units([RequestSpec("a", "x", 1),
    ...     RequestSpec("b0", "x", 1, session_id="s"), RequestSpec("b1", "x", 1, session_id="s", turn=1)])]
    [1, 2]
    """
    it = iter(specs)
    pending: RequestSpec | None = None
    while True:
        first = pending if pending is not None else next(it, None)
        pending = None
        if first is None:
            return
        unit = [first]
        if first.session_id is not None:
            for spec in it:
                if spec.session_id == first.session_id and spec.turn > 0:
                    unit.append(spec)
                else:
                    pending = spec
                    break
        yield unit


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on uvloop when it is installed (faster I/O), else on asyncio's loop.

    ``LOADLAB_LOOP=asyncio`` in the environment forces asyncio's own loop (benchmarks)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        return asyncio.run(coro)
    if os.environ.get("LOADLAB_LOOP") == "asyncio":  # for measuring the difference
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


class Runner:
    """One run of one workload against one client. ``await Runner(...).run()`` -> Results."""

    def __init__(
        self,
        cfg: RunConfig,
        specs: Iterable[RequestSpec],
        client: Client,
        *,
        endpoint: str = "",
        worker: int = 0,
        t0_ns: int | None = None,
        late_tolerance_ms: float = 10.0,
        drain_s: float | None = None,
        concurrency: int | None = None,
        max_in_flight: int | None = None,
        kind: str = "run",
        journal: JournalWriter | None = None,
    ) -> None:
        at_least("late_tolerance_ms", late_tolerance_ms, 0)
        self.cfg = cfg
        self.client = client
        self.endpoint = endpoint
        self.worker = worker
        self.t0_ns = t0_ns
        self.late_tolerance_ns = int(late_tolerance_ms * 1e6)
        self.drain_s = cfg.timeout_s if drain_s is None else drain_s
        # a worker process of a --workers run gets its share of the concurrency and the cap
        self.concurrency = concurrency if concurrency is not None else cfg.concurrency
        self.max_in_flight = max_in_flight if max_in_flight is not None else cfg.max_in_flight
        self.kind = kind
        self.journal = journal  # finished records also go here, flushed every interval
        self.stats = LiveStats()
        self.records: list[RequestRecord] = []
        self.dispatch_lag_ns: list[int] = []  # open loop: when the scheduler got to each request
        self.built_late = 0  # open loop: units whose building ended after their due time
        self.interrupted = False
        self.connect_errors_in_a_row = 0
        self.backoff_s = 0.0  # time the closed-loop workers spent backing off, summed
        self._specs = specs
        self._prepared = False
        self._units: Iterator[list[RequestSpec]] = iter(())
        self._send_tasks: set[asyncio.Task[Completion]] = set()
        self._unit_tasks: set[asyncio.Task[None]] = set()
        self._unit_errors: list[BaseException] = []
        self._stop_sending: asyncio.Future[None] | None = None
        self._room: asyncio.Future[None] | None = None  # a closed loop's builder waits on it
        self._sender: Sender | None = None  # the gated open loop's (``_open_loop_gated``)
        self._collector: asyncio.Task[None] | None = None  # its garbage collection

    # ------------------------------------------------------------------ control

    def stop(self) -> None:
        """Stop sending now and cancel the requests in flight (they are recorded). Idempotent."""
        self.interrupted = True
        self._end_sending()
        self._stop_sender()  # started ahead, not yet due: never sent
        for task in list(self._send_tasks):
            task.cancel()

    def _end_sending(self) -> None:
        if self._stop_sending is not None and not self._stop_sending.done():
            self._stop_sending.set_result(None)
        self._made_room()

    def _made_room(self) -> None:
        """Wake the closed loop's builder (``_build_ahead``) if it waits."""
        if self._room is not None and not self._room.done():
            self._room.set_result(None)

    def _sending_over(self) -> bool:
        return self._stop_sending is None or self._stop_sending.done()

    async def _wait_or_stop(self, seconds: float) -> None:
        """Sleep ``seconds`` unless sending ends first (interruptible, creates no task)."""
        if seconds > 0 and self._stop_sending is not None:
            await asyncio.wait([self._stop_sending], timeout=seconds)

    async def _sleep_until(self, due_ns: int, precise: bool = True) -> None:
        """Until ``due_ns`` (or sending ends); ``precise``: the last ``SPIN_NS`` by yielding."""
        remaining = due_ns - time.perf_counter_ns()
        if remaining > SPIN_NS or (not precise and remaining > 0):
            await self._wait_or_stop((remaining - (SPIN_NS if precise else 0)) / NS_PER_S)
        while precise and time.perf_counter_ns() < due_ns and not self._sending_over():
            await asyncio.sleep(0)  # yield: chunk readers keep running while we wait

    async def _first_connection(self) -> None:
        """Open loop: the first request's connection, made before t0 (its connect would make
        the run's first request late, and every gap after it measured from a late start)."""
        preconnect = getattr(self.client, "preconnect", None)
        spare = preconnect() if preconnect is not None and self.cfg.rate_rps is not None else None
        if spare is not None:
            await asyncio.wait([spare])  # bounded by the transport's preconnect time limit

    # ------------------------------------------------------------------ run

    def prepare(self) -> None:
        """Build the first unit now: a lazy workload may do its set-up (datasets, tokenizers)
        on its first item, which must happen before t0, not on the schedule. Idempotent."""
        if self._prepared:
            return
        self._prepared = True
        specs: Iterable[RequestSpec] = self._specs
        if self.cfg.requests is not None:
            specs = itertools.islice(specs, self.cfg.requests)
        units = group_units(specs)
        first = next(units, None)
        self._units = itertools.chain([first], units) if first is not None else iter(())

    async def run(self) -> Results:
        loop = asyncio.get_running_loop()
        self._stop_sending = loop.create_future()
        if self.interrupted:  # stop() came before the run started
            self._stop_sending.set_result(None)
        self.prepare()
        started_at = datetime.now(UTC).isoformat(timespec="seconds")
        monitor = LoopMonitor(threshold_ms=self.cfg.saturation_lag_ms)
        freezer = loop.create_task(_freeze_every(_FREEZE_EVERY_S))
        _SWITCH.hold()
        journaling = loop.create_task(self.journal.run()) if self.journal is not None else None
        if self.t0_ns is None:
            await self._first_connection()
            self.t0_ns = time.perf_counter_ns()
        monitor.start(self.t0_ns)
        deadline = None
        if self.cfg.duration_s is not None:
            due_s = (self.t0_ns - time.perf_counter_ns()) / NS_PER_S + self.cfg.duration_s
            deadline = loop.call_later(max(due_s, 0.0), self._end_sending)
        try:
            if self.cfg.rate_rps is not None:
                await self._open_loop()  # (it builds ahead while it waits for t0 too)
            else:
                await self._sleep_until(self.t0_ns)  # worker processes share a t0 ahead
                self._closed_loop()
            await self._drain()
        finally:
            if deadline is not None:
                deadline.cancel()
            self._end_sending()
            self._stop_sender()
            freezer.cancel()
            gc.unfreeze()
            _SWITCH.release()
            generator = await monitor.stop()
            if journaling is not None and self.journal is not None:
                journaling.cancel()
                await self.journal.close()
        end_ns = time.perf_counter_ns() - self.t0_ns
        monitor.judge_tokens(generator, [r.chunk_ns for r in self.records])
        lag_p99_ns = percentile(self.dispatch_lag_ns, 99)
        generator["dispatch_lag_ms_p99"] = None if lag_p99_ns is None else lag_p99_ns / 1e6
        if self.cfg.rate_rps is not None:
            generator["built_late"] = self.built_late
        if self._sender is not None:  # how soon its thread runs when a request is due
            generator["sender_priority"] = self._sender.priority
        return Results(
            records=self.records,
            config=self.cfg.to_dict(),
            environment=environment_info(),
            started_at=started_at,
            duration_ns=end_ns,
            window_ns=self._window(end_ns),
            scheduled=len(self.records),
            workers=1,
            kind=self.kind,
            generator=generator,
            # t0 as an absolute perf_counter_ns: lines records up with another process's
            # clock on this machine (the self-test's server truth); meaningless elsewhere
            extra={
                "t0_ns": self.t0_ns,
                **({"interrupted": True} if self.interrupted else {}),
                **({"connect_backoff_s": round(self.backoff_s, 3)} if self.backoff_s else {}),
            },
        )

    def _window(self, end_ns: int) -> tuple[int, int]:
        lo = int(self.cfg.warmup_s * NS_PER_S)
        # the load ends at the last response (not when the runner has tidied up), or at the
        # duration when sending stopped there
        last = max(
            (
                t
                for r in self.records
                for t in (r.end_ns, r.chunk_ns[-1] if r.chunk_ns else None)
                if t is not None
            ),
            default=end_ns,
        )
        if self.cfg.duration_s is not None and not self.interrupted:
            last = min(last, int(self.cfg.duration_s * NS_PER_S))
        hi = last - int(self.cfg.cooldown_s * NS_PER_S)
        return (lo, max(lo, hi))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._unit_tasks.add(task)
        task.add_done_callback(self._unit_done)

    def _unit_done(self, task: asyncio.Task[None]) -> None:
        self._unit_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._unit_errors.append(task.exception())  # type: ignore[arg-type]

    async def _open_loop(self) -> None:
        """Every unit sent at its due time. The coming units are built while the scheduler
        waits (``Lookahead``). With a client that takes a gate and no in-flight cap, each
        request is started ``SEND_LEAD_NS`` before it is due (record, framing, connection)
        and the run's sender thread (``loadlab._runner.sender``) fires its gate when due: the
        write runs inside that call, whatever the loop is doing. With a cap, whether a request
        goes is decided when it is due, so it starts then; a client without gates is asked for
        a spare connection ``PRECONNECT_AHEAD_NS`` ahead instead."""
        ahead = self._lookahead()
        ahead.build_one()  # the first unit (prepare() built it before t0)
        if getattr(self.client, "SENDS_AT_GATE", False) and self.max_in_flight is None:
            await self._open_loop_gated(ahead)
            return
        preconnect = getattr(self.client, "preconnect", None)
        lead_ns = PRECONNECT_AHEAD_NS if preconnect else 0
        ready: deque[_Due] = deque()  # their connection asked for ahead, in schedule order
        nxt = self._next_due(ahead)
        while nxt is not None or ready:
            clock = time.perf_counter_ns()
            while preconnect and nxt is not None and nxt.due_ns - lead_ns <= clock:
                preconnect()
                ready.append(nxt)
                nxt = self._next_due(ahead)
            due = ready[0].due_ns if ready else None
            start = nxt.due_ns - lead_ns if nxt is not None else None
            wake = min(t for t in (due, start) if t is not None)
            # the next units are built while this one waits, when the wait leaves room
            await ahead.build_while(wake - SPIN_NS, self._sending_over)
            await self._sleep_until(wake, precise=wake == due or not lead_ns)
            if self._sending_over():
                break
            while ready and ready[0].due_ns <= time.perf_counter_ns():
                self._dispatch(ready.popleft())
            if not lead_ns and nxt is not None and nxt.due_ns <= time.perf_counter_ns():
                self._dispatch(nxt)
                nxt = self._next_due(ahead)
        # what ``ready`` holds when the run stopped first was never sent: never recorded

    async def _open_loop_gated(self, ahead: Lookahead) -> None:
        """Each unit started ``SEND_LEAD_NS`` ahead, its gate handed to the sender thread;
        the loop builds the next units meanwhile. Returns once the last unit has started:
        ``_drain`` waits for them, the sender fires them (``stop`` withdraws those left)."""
        sender = self._sender = Sender(self.dispatch_lag_ns, self.stats)
        sender.start()
        self._collector = asyncio.get_running_loop().create_task(_collect_between_sends(sender))
        nxt = self._next_due(ahead)
        while nxt is not None:
            start = nxt.due_ns - SEND_LEAD_NS
            await ahead.build_while(start - SPIN_NS, self._sending_over)
            await self._sleep_until(start, precise=False)
            if self._sending_over():
                return
            clock = time.perf_counter_ns()
            while nxt is not None and nxt.due_ns - SEND_LEAD_NS <= clock:
                gate = SendGate()
                self.stats.in_flight += 1
                self.stats.ahead += 1
                intended_ns = nxt.due_ns - self.t0_ns  # type: ignore[operator]  # set by run()
                self._spawn(self._run_unit(nxt.unit, intended_ns, nxt.body, gate))
                sender.add(nxt.due_ns, gate)
                nxt = self._next_due(ahead)

    def _stop_sender(self) -> None:
        """No gate fires after this; those not fired are withdrawn (never sent)."""
        if self._sender is not None:
            left = self._sender.stop()
            self.stats.ahead -= len(left)  # never sent
            for gate in left:
                gate.withdraw()
        if self._collector is not None:
            self._collector.cancel()  # (the collector gives the automatic collection back)

    def _lookahead(self, **bounds: int) -> Lookahead:
        """The run's units built ahead, each first request's body encoded with them by a
        client that can (a request its workload could not build is never encoded)."""
        encode = getattr(self.client, "encode_body", None)
        return Lookahead(
            self._units,
            (lambda unit: encode(unit[0]) if unit[0].error is None else None) if encode else None,
            **bounds,
        )

    def _next_due(self, ahead: Lookahead) -> _Due | None:
        """The next unit of the schedule with its due time; None past the end or the duration."""
        assert self.t0_ns is not None  # noqa: S101 - set by run()
        was_built = len(ahead) > 0
        built = ahead.pop()
        if built is None:
            return None
        unit, body = built
        first = unit[0]
        if first.intended_at_s is None:
            raise ValueError(
                f"open loop needs intended_at_s on request {first.request_id!r} "
                "(or on turn 0 of its session); for closed loop use --concurrency"
            )
        if self.cfg.duration_s is not None and first.intended_at_s >= self.cfg.duration_s:
            return None
        due_ns = self.t0_ns + int(first.intended_at_s * NS_PER_S)
        if not was_built and time.perf_counter_ns() > due_ns:
            self.built_late += 1
        return _Due(unit, body, due_ns)

    def _dispatch(self, item: _Due) -> None:
        """Start ``item``'s unit at its due time (or drop it: the in-flight cap is full)."""
        assert self.t0_ns is not None  # noqa: S101 - set by run()
        self.dispatch_lag_ns.append(time.perf_counter_ns() - item.due_ns)
        intended_rel = item.due_ns - self.t0_ns
        cap = self.max_in_flight
        if cap is not None and self.stats.in_flight >= cap:
            self._record_dropped(item.unit[0], intended_rel, f"in-flight cap {cap} reached")
            return
        self.stats.in_flight += 1  # reserve the slot now: the task starts next iteration
        self._spawn(self._run_unit(item.unit, intended_rel, item.body))

    def _closed_loop(self) -> None:
        """Closed loop: each worker sends its next unit when its last one ends. The units are
        built ahead (``Lookahead``, up to a whole wave of them) by a task that builds one each
        turn of the event loop, between reads: built when a worker takes it, a unit is built
        in the burst of requests that end together, and every read waiting in that burst is
        stamped that much late."""
        ahead = self._lookahead(max_units=self.concurrency or 1)
        self._spawn(self._build_ahead(ahead))
        for _ in range(self.concurrency or 1):
            self._spawn(self._closed_worker(ahead))

    async def _build_ahead(self, ahead: Lookahead) -> None:
        """Keep ``ahead`` full, one unit a turn of the loop, until the stream or the run ends;
        while it is full, wait for a worker to take a unit (or for sending to end)."""
        loop = asyncio.get_running_loop()
        while not self._sending_over() and not ahead.ended:
            if ahead.build_one():
                await asyncio.sleep(0)
            elif not ahead.ended:
                self._room = loop.create_future()
                await self._room

    async def _closed_worker(self, ahead: Lookahead) -> None:
        while not self._sending_over():
            if self.connect_errors_in_a_row:
                wait_s = min(
                    CONNECT_BACKOFF_MAX_S,
                    CONNECT_BACKOFF_BASE_S * 2 ** min(self.connect_errors_in_a_row - 1, 30),
                )
                self.backoff_s += wait_s
                await self._wait_or_stop(wait_s)
                if self._sending_over():
                    return
            built = ahead.pop()  # lazy: the stream may be infinite
            self._made_room()
            if built is None:
                return
            self.stats.in_flight += 1
            await self._run_unit(built[0], None, built[1])

    async def _run_unit(
        self,
        unit: Sequence[RequestSpec],
        intended_ns: int | None,
        body: bytes | None = None,
        gate: SendGate | None = None,
    ) -> None:
        """Send one request or a whole session (``body``: its first request's, encoded ahead;
        ``gate``: what writes it). The caller reserved one in-flight slot."""
        assert self.t0_ns is not None  # noqa: S101 - set by run()
        history: list[Message] = []
        answer = ""  # the last answer's text
        calls: Sequence[Mapping[str, str]] = ()  # the last answer's tool calls
        open_loop = intended_ns is not None
        for k, spec in enumerate(unit):
            if spec.tool_turn and not calls:
                return  # the agent answered without calling a tool: its session is over
            if k > 0:
                await self._wait_or_stop(spec.think_time_s)
                if self._sending_over():
                    return  # the rest of the session is not scheduled
                if open_loop:
                    intended_ns = time.perf_counter_ns() - self.t0_ns
                    cap = self.max_in_flight
                    if cap is not None and self.stats.in_flight >= cap:
                        self._record_dropped(spec, intended_ns, f"in-flight cap {cap} reached")
                        return
                self.stats.in_flight += 1
            if k > 0:  # the last turn's tool calls answered (checked above), a replay resized
                spec = next_turn(spec, answer, calls)
            if k > 0:
                body, gate = None, None
            done = await self._send(spec, history, intended_ns, body, gate)
            if done is None or not done.record.ok or k + 1 == len(unit):
                return  # (a lone request, most of a run's, builds no history)
            answer, calls = done.text, done.tool_calls
            history.extend(spec.new_messages())
            history.append(assistant_turn(done.text, calls))

    async def _send(
        self,
        spec: RequestSpec,
        history: Sequence[Message],
        intended_ns: int | None,
        body: bytes | None = None,
        gate: SendGate | None = None,
    ) -> Completion | None:
        """One request; the in-flight slot was taken by the caller and is released here.
        None: its gate was withdrawn before it fired (never sent, not recorded)."""
        assert self.t0_ns is not None  # noqa: S101 - set by run()
        self.stats.scheduled += 1
        dispatch_ns = time.perf_counter_ns() - self.t0_ns
        options: SendOptions = {"t0_ns": self.t0_ns, "history": list(history)}
        options["intended_ns"] = intended_ns
        if body is not None:
            options["body"] = body
        if gate is not None:
            options["gate"] = gate
        coro = self.client.send(spec, **options) if spec.error is None else _unsendable(spec, gate)
        task = asyncio.ensure_future(coro)
        self._send_tasks.add(task)
        try:
            await task  # (half the cost of asyncio.wait, which builds a waiter per call)
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling():  # the unit was cancelled: keep the request
                task.cancel()
                await asyncio.wait([task])
                raise
            # else the send task alone was cancelled (the run stopping): recorded below
        except Exception:  # noqa: S110 - a client raising is recorded by _completion
            pass
        finally:
            self._send_tasks.discard(task)
            self.stats.in_flight -= 1
            if gate is not None and not gate.fired:
                self.stats.scheduled -= 1
                done = None
            else:
                done = self._completion(task, spec, dispatch_ns)
                self._record(done.record, spec, intended_ns)
        return done

    def _completion(
        self, task: asyncio.Task[Completion], spec: RequestSpec, dispatch_ns: int
    ) -> Completion:
        if task.cancelled():
            rec = _record_for(spec, OUTCOME_CANCELLED, "run stopped while in flight")
            rec.sent_ns = dispatch_ns
            return Completion(rec)
        exc = task.exception()
        if exc is not None:  # a client must not raise; keep the request anyway
            rec = _record_for(spec, OUTCOME_PROTOCOL_ERROR, f"client raised {exc!r}"[:200])
            rec.sent_ns = dispatch_ns
            return Completion(rec)
        return task.result()

    def _record(self, rec: RequestRecord, spec: RequestSpec, intended_ns: int | None) -> None:
        rec.worker = self.worker
        rec.endpoint = self.endpoint
        if intended_ns is not None:
            rec.intended_ns = intended_ns
            if rec.sent_ns is not None:
                rec.late = rec.sent_ns - intended_ns > self.late_tolerance_ns
        if rec.request_class == "default" and spec.request_class != "default":
            rec.request_class = spec.request_class
        self.records.append(rec)
        if self.journal is not None:
            self.journal.add(rec)
        self.stats.done += 1
        if not rec.ok:
            self.stats.failed += 1
        if rec.outcome == OUTCOME_CONNECT_ERROR:
            self.connect_errors_in_a_row += 1
        elif rec.headers_ns is not None or rec.ok:
            self.connect_errors_in_a_row = 0
        self.stats.output_tokens += rec.output_tokens or rec.output_tokens_chunks

    def _record_dropped(self, spec: RequestSpec, intended_ns: int, why: str) -> None:
        rec = _record_for(spec, OUTCOME_DROPPED, why)
        rec.intended_ns = intended_ns
        rec.worker = self.worker
        rec.endpoint = self.endpoint
        self.records.append(rec)
        if self.journal is not None:
            self.journal.add(rec)
        self.stats.scheduled += 1
        self.stats.dropped += 1

    async def _drain(self) -> None:
        """Let in-flight requests finish (bounded in a duration run), then cancel the rest."""
        pending = set(self._unit_tasks)
        if pending and not self.interrupted:
            timeout = None
            if self.cfg.duration_s is not None:
                assert self.t0_ns is not None  # noqa: S101 - set by run()
                end_ns = self.t0_ns + int((self.cfg.duration_s + self.drain_s) * NS_PER_S)
                timeout = max(0.0, (end_ns - time.perf_counter_ns()) / NS_PER_S)
            _, pending = await asyncio.wait(pending, timeout=timeout)
        if pending:
            self._end_sending()
            for task in list(self._send_tasks):
                task.cancel()
            await asyncio.wait(pending)
        if self._unit_errors:
            raise self._unit_errors[0]


class _WhileRuns(Generic[T]):
    """A process-wide setting held while any run of the process lasts (``hold``), given back
    as it was after the last (``release``): ``take`` sets it and returns what it was,
    ``give_back`` restores that."""

    def __init__(self, take: Callable[[], T], give_back: Callable[[T], None]) -> None:
        self.take, self.give_back = take, give_back
        self.runs = 0
        self.saved: T | None = None

    def hold(self) -> None:
        if self.runs == 0:
            self.saved = self.take()
        self.runs += 1

    def release(self) -> None:
        self.runs -= 1
        if self.runs == 0:
            self.give_back(self.saved)  # type: ignore[arg-type]  # set by the first hold


def _short_switch_interval() -> float:
    """The run's thread switch interval: ``SWITCH_INTERVAL_S`` (Python's own is 5 ms).

    Other threads of a run hold the GIL now and then (the journal encoding a second's records,
    images being drawn, the open loop's sender); when the event loop wakes while one does, it
    waits for the GIL until the holder blocks or the interval forces a switch: up to 5 ms."""
    saved = sys.getswitchinterval()
    sys.setswitchinterval(min(saved, SWITCH_INTERVAL_S))
    return saved


_SWITCH = _WhileRuns(_short_switch_interval, sys.setswitchinterval)


async def _freeze_every(period_s: float) -> None:
    """The run's garbage-collector policy: freeze the heap now and every ``period_s``.

    The cyclic collector walks every object of a generation, and on a 2-core VM a walk costs
    about 80 ns per reference: a full collection of the imported modules took 60 ms and a
    second-generation one over the finished records' timestamps 10-20 ms, each a stall of
    the event loop that every timestamp read in it absorbs. ``gc.freeze`` moves what is alive
    to a permanent generation in O(1), so collections only walk what the last period
    allocated. Frozen objects are still freed by reference counting when they die; only
    reference cycles made during the run wait for its end (loadlab's request path makes
    none). ``gc.unfreeze`` at the end hands everything back."""
    while True:
        gc.freeze()
        await asyncio.sleep(period_s)


# a gated open loop's garbage collection (_collect_between_sends)
GC_EVERY_S = 0.01  # the young objects are collected about this often,
GC_ROOM_NS = 1_000_000  # at a moment with no request due this soon (or twice the last's time),
GC_OVERDUE_NS = 1_000_000_000  # or anyway, this long after the last collection
GC_OLDER_EVERY = 10  # every this many collections also take the generation above


def _automatic_gc_off() -> bool:
    """Python's automatic garbage collection off (a gated open loop collects its own, between
    sends: ``_collect_between_sends``); whether it was on."""
    was_on = gc.isenabled()
    gc.disable()
    return was_on


_AUTOMATIC_GC = _WhileRuns(_automatic_gc_off, lambda was_on: gc.enable() if was_on else None)


async def _collect_between_sends(sender: Sender) -> None:
    """A gated open loop's garbage collection: between its sends, not across them.

    Python collects whenever allocations pass a threshold: a collection holds the interpreter
    for a few milliseconds, and the sender thread, due meanwhile, waits for it (a trace replay's
    sends were 3-4 ms late at p99 with it, under 0.5 ms without it). Here the automatic
    collection is off while the run lasts, and the young objects are collected every
    ``GC_EVERY_S`` when no request is due within ``GC_ROOM_NS`` (or twice the last
    collection's time); a schedule with no such moment is collected anyway once a second.
    ``_freeze_every`` still freezes what lives on."""
    _AUTOMATIC_GC.hold()
    clock = time.perf_counter_ns
    last_ns = clock()
    cost_ns = 0
    done = 0
    try:
        while True:
            await asyncio.sleep(GC_EVERY_S)
            now = clock()
            if _time_to_collect(now, sender.next_due_ns(), last_ns, cost_ns):
                done += 1
                gc.collect(1 if done % GC_OLDER_EVERY == 0 else 0)
                last_ns = clock()
                cost_ns = max(last_ns - now, cost_ns * 9 // 10)
    finally:
        _AUTOMATIC_GC.release()


def _time_to_collect(now_ns: int, due_ns: int | None, last_ns: int, cost_ns: int) -> bool:
    """Whether to collect now: no request due within ``GC_ROOM_NS`` (or twice ``cost_ns``, the
    recent collections' time), or the last collection ``GC_OVERDUE_NS`` ago."""
    room = due_ns is None or due_ns - now_ns > max(GC_ROOM_NS, 2 * cost_ns)
    return room or now_ns - last_ns > GC_OVERDUE_NS


async def _unsendable(spec: RequestSpec, gate: SendGate | None = None) -> Completion:
    """A request its workload could not build: recorded as a failure, never sent. Started
    ahead with a gate, it is recorded when the gate fires, at its time (a gate withdrawn first,
    the run stopped before its time: not recorded, as a request that was never due)."""
    if gate is not None:
        await gate.wait()
    return Completion(_record_for(spec, OUTCOME_BAD_INPUT, spec.error or "bad input"))


def _record_for(spec: RequestSpec, outcome: str, error: str) -> RequestRecord:
    return RequestRecord.for_spec(spec, outcome=outcome, error=error)

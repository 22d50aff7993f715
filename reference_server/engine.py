"""The engine: one loop in its own thread, one step = schedule -> run -> postprocess.

The HTTP layer lives on an asyncio loop in another thread. It hands requests in with
``submit`` (thread-safe; each request brings its own asyncio queue) and gets ``TokenEvent``s
back through ``loop.call_soon_threadsafe``. ``abort`` is thread-safe too; both go through an
inbox the engine drains at the top of each step, so the scheduler and block manager are only
ever touched by the engine thread. The engine never asks which mode runs.

Usage::

    engine = Engine(runner, make_scheduler("continuous", BlockManager(runner.num_kv_blocks, 16)))
    engine.start()
    engine.submit(seq, loop, queue)      # queue receives TokenEvent(text, ..., finish_reason)
    engine.abort(seq.seq_id)             # a client went away: free its KV blocks
    engine.stop()
"""

from __future__ import annotations

import asyncio
import codecs
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from reference_server.engine_like import EngineGauges, EventQueue, TokenEvent
from reference_server.metrics import ServerStats
from reference_server.scheduler.base import Scheduler
from reference_server.sequence import ScheduledBatch, Sequence

__all__ = ["Engine", "Runner", "TextStream"]

log = logging.getLogger("reference_server.engine")


class Runner(Protocol):
    num_kv_blocks: int
    block_size: int

    def run(self, batch: ScheduledBatch) -> list[int | None]: ...

    def info(self) -> dict[str, Any]: ...


class TextStream:
    """Token ids to text deltas: never half a UTF-8 character, stop strings cut and held back.

    Text that could still turn out to be the start of a stop string is held back until it
    cannot (so a stop string never leaks into the output, as in OpenAI's API).
    """

    def __init__(self, stop: tuple[str, ...] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = stop
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._text = ""
        self._sent = 0
        self.stopped = False

    def push(self, token_id: int, final: bool) -> str:
        if not self.stopped:
            if 0 <= token_id < 256:  # ids >= 256 (eos, padding) carry no text
                self._text += self._decoder.decode(bytes((token_id,)))
            if final:
                self._text += self._decoder.decode(b"", final=True)
            self._cut_at_stop()
        end = len(self._text) if final or self.stopped else len(self._text) - self._hold
        delta = self._text[self._sent : max(end, self._sent)]
        self._sent += len(delta)
        return delta

    def _cut_at_stop(self) -> None:
        if not self._stop:
            return
        start = max(0, self._sent - self._hold - 4)
        hits = [i for s in self._stop if (i := self._text.find(s, start)) >= 0]
        if hits:
            self._text = self._text[: min(hits)]
            self.stopped = True


@dataclass
class _Request:
    seq: Sequence
    loop: asyncio.AbstractEventLoop
    queue: EventQueue
    text: TextStream


class Engine:
    """Drives a scheduler and a model runner; see the module docstring. An ``EngineLike``."""

    def __init__(
        self,
        runner: Runner,
        scheduler: Scheduler,
        *,
        stats: ServerStats | None = None,
        clock: Callable[[], int] = time.perf_counter_ns,
        idle_wait_s: float = 0.05,
    ) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.stats = stats or ServerStats()
        self.clock = clock
        self.idle_wait_s = idle_wait_s
        self._inbox: deque[tuple[str, Any]] = deque()  # deque appends are atomic
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._requests: dict[str, _Request] = {}  # engine thread only

    # -- called from any thread -------------------------------------------------------------

    def submit(self, seq: Sequence, loop: asyncio.AbstractEventLoop, queue: EventQueue) -> None:
        """Queue ``seq``; its ``TokenEvent``s arrive on ``queue`` via ``loop``."""
        self._inbox.append(("add", _Request(seq, loop, queue, TextStream(seq.params.stop))))
        self._wake.set()

    def abort(self, seq_id: str) -> None:
        """Drop a request wherever it is and free its KV blocks (no further events)."""
        self._inbox.append(("abort", seq_id))
        self._wake.set()

    def pool(self, token_lists: list[list[int]]) -> list[list[float]]:
        """Embeddings of whole sequences (``ModelRunner.pool``), run beside the engine's steps
        on the caller's thread; a runner without pooling raises ``NotImplementedError``."""
        pool = getattr(self.runner, "pool", None)
        if pool is None:
            raise NotImplementedError("this engine's runner does not pool")
        return [list(map(float, row)) for row in pool(token_lists).tolist()]

    @property
    def queue_depth(self) -> int:
        """Requests not yet running: waiting in the scheduler or still in the inbox."""
        pending = sum(1 for kind, _ in list(self._inbox) if kind == "add")
        return self.scheduler.num_waiting + pending

    @property
    def max_num_seqs(self) -> int:
        return self.scheduler.max_num_seqs

    def gauges(self) -> EngineGauges:
        sched = self.scheduler
        bm = sched.block_manager
        return EngineGauges(queue_depth=self.queue_depth, running_requests=sched.num_running,
                            batch_slots=sched.num_batch_slots, kv_blocks_used=bm.num_used_blocks,
                            kv_blocks_total=bm.num_blocks,
                            preemptions_total=sched.num_preemptions,
                            kv_blocks_cached=bm.num_cached_blocks,
                            prefix_cache_queries_total=sched.prefix_cache_queries,
                            prefix_cache_hits_total=sched.prefix_cache_hits)  # fmt: skip

    def extra_metrics(self) -> list[str]:
        return []  # everything this engine has is in the gauges and ServerStats

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    # -- the engine thread ------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()
            try:
                worked = self.step()
            except Exception:  # a bug must not kill the server silently: log and go on
                log.exception("engine step failed")
                worked = False
            if not worked:
                self._wake.wait(self.idle_wait_s)

    def step(self) -> bool:
        """One step; returns False when there was nothing to run."""
        t_begin = self.clock()
        self._drain_inbox()
        batch = self.scheduler.schedule()
        if not batch:
            return False
        prefill, decode, padding = batch.token_counts()
        shape = batch.step_shape()  # before the run advances num_computed_tokens
        waiting = self.scheduler.num_waiting > 0  # slots were all taken (or held): saturated
        t0 = self.clock()
        try:
            tokens = self.runner.run(batch)
        except Exception:  # the model failed: find the culprit, keep serving the others
            log.exception("model runner failed on a batch of %d", len(batch.items))
            tokens = self._run_one_by_one(batch)
        updated = self.scheduler.postprocess(batch, tokens)
        seconds = (self.clock() - t0) / 1e9
        phase = "mixed" if prefill and decode else ("prefill" if prefill else "decode")
        self.stats.record_step(phase, seconds, prefill_tokens=prefill, decode_tokens=decode,
                               padding_tokens=padding, waiting=waiting)  # fmt: skip
        self._emit(updated)
        # the whole step, scheduling and hand-off included: what a simulated step stands for
        self.stats.log_step("engine", 0, t_begin, self.clock(), shape)
        return True

    def _drain_inbox(self) -> None:
        while self._inbox:
            kind, item = self._inbox.popleft()
            if kind == "add":
                self._requests[item.seq.seq_id] = item
                self.scheduler.add(item.seq)
            elif self.scheduler.abort(item) is not None:
                self._requests.pop(item, None)
                self.stats.record_finished("abort")

    def _emit(self, updated: list[Sequence]) -> None:
        """Hand each updated request its event: one cross-thread call per step and event loop,
        not one per token, so the API thread wakes once and the GIL changes hands less often."""
        outbox: dict[asyncio.AbstractEventLoop, list[tuple[_Request, TokenEvent]]] = {}
        for seq in updated:
            req = self._requests.get(seq.seq_id)
            if req is None:
                continue
            final = seq.is_finished
            text = req.text.push(seq.output_token_ids[-1], final)
            n = len(seq.output_token_ids)
            event = TokenEvent(text, n, seq.finish_reason if final else None,
                               cached_tokens=seq.num_cached_tokens)  # fmt: skip
            if final:
                del self._requests[seq.seq_id]
                self.stats.record_finished(seq.finish_reason or "length")
            outbox.setdefault(req.loop, []).append((req, event))
        for loop, items in outbox.items():
            _deliver_all(loop, items)

    def _run_one_by_one(self, batch: ScheduledBatch) -> list[int | None]:
        """Rerun each item alone (rewriting its K/V is idempotent); only the items that fail
        again are failed, so one bad request does not take its batch-mates down with it."""
        tokens: list[int | None] = []
        for item in batch.items:
            try:
                tokens += self.runner.run(ScheduledBatch([item]))
            except Exception as exc:
                self._fail(ScheduledBatch([item]), f"model runner error: {type(exc).__name__}")
                tokens.append(None)  # postprocess skips it: it is finished (aborted)
        return tokens

    def _fail(self, batch: ScheduledBatch, message: str) -> None:
        for item in batch.items:
            seq_id = item.seq.seq_id
            self.scheduler.abort(seq_id)
            req = self._requests.pop(seq_id, None)
            self.stats.record_finished("error")
            if req is not None:
                n = len(req.seq.output_token_ids)
                _deliver(req, TokenEvent("", n, "error", error=message))


def _deliver(req: _Request, event: TokenEvent) -> None:
    _deliver_all(req.loop, [(req, event)])


def _put_all(items: list[tuple[_Request, TokenEvent]]) -> None:
    for req, event in items:
        req.queue.put_nowait(event)


def _deliver_all(loop: asyncio.AbstractEventLoop, items: list[tuple[_Request, TokenEvent]]) -> None:
    try:
        loop.call_soon_threadsafe(_put_all, items)
    except RuntimeError:  # the API loop has closed (shutdown): nobody is listening
        pass

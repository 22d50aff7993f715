"""Self-monitoring: is the load generator itself the bottleneck?

A ticker wakes every ``tick_ms`` (10 ms) and measures how late it woke (the *event-loop lag*):
while the loop is busy parsing chunks or starting requests, every ready callback, including
the one that timestamps a chunk, waits that long. Process CPU (psutil) is sampled every
``sample_s``.

Rule (documented in docs/harness.md): the run is ``saturated`` when the p99 of the ticker's
lag exceeds ``threshold_ms`` (``RunConfig.saturation_lag_ms``, 20 ms by default). The p99
rather than the max, because one garbage-collection pause or a scheduler hiccup of a shared
machine is not saturation; the p99 rather than the mean, because a generator that is late one
tick in a hundred already shifts the tail latencies users gate on. ``cpu_percent_mean`` near
100 (one core) is reported as the likely cause.

Each tick also samples the raw transport's *parse backlog*: how long the oldest read that was
stamped but not yet parsed has waited (``loadlab.clients._pool``: reads are stamped at once
and parsed in slices, so a burst of work does not hold back the next reads' stamps). It moves
no timestamp; it delays what follows a response's end (its record, a closed loop's next
request). A generator
whose median backlog exceeds ``threshold_ms`` cannot keep up with interpreting what it reads
(the backlog sits near its 50 ms cap, past which the parser stops yielding): that run is
``saturated`` too.

A third watch is per request: a bare timer callback every ``WATCH_MS`` (2 ms) keeps each span
in which it ran 2 ms or more late, and at the end every first token's read time is looked up
in them. A stall in the moment many first tokens arrive together (256 streams that started
together) is one late tick among hundreds, invisible to the p99, and yet dozens of TTFTs
absorbed it. When more than ``STALLED_SHARE`` (1 %) of the first tokens were stamped after the
loop had been away ``threshold_ms`` or more, the run is ``saturated``: the TTFT p99 itself may
be off by that much. The later tokens' stamps (what ITL is made of) are judged the same way.

Example::

    mon = LoopMonitor(threshold_ms=20.0)
    mon.start(t0_ns)
    ...  # the run
    generator = await mon.stop()   # the results file's "generator" section
    mon.judge_tokens(generator, [r.chunk_ns for r in records])

``loadlab._analysis.generator`` reads that section (for the CLI's warning and the reports).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from loadlab._analysis.generator import STALLED_SHARE
from loadlab._analysis.metrics import distribution, percentile
from loadlab.clients._pool import parse_backlog_ms

__all__ = ["WATCH_MS", "LoopMonitor"]

WATCH_MS = 2.0  # the stall watcher's period
STALL_NS = 2_000_000  # a watcher call at least this late is kept as a stall
STALLS_KEPT = 1 << 20  # at most this many (16 MiB): past them stalls are counted, not kept
TOKENS_CHECKED = 1_000_000  # later tokens' stamps looked up at most (a sample of requests past it)


class LoopMonitor:
    """Samples event-loop lag and process CPU while a run goes on."""

    def __init__(self, threshold_ms: float = 20.0, tick_ms: float = 10.0, sample_s: float = 0.5):
        if tick_ms <= 0 or sample_s <= 0:
            raise ValueError("tick_ms and sample_s must be > 0")
        self.threshold_ms = threshold_ms
        self.tick_ns = int(tick_ms * 1e6)
        self.sample_ns = int(sample_s * 1e9)
        self.lags_ms: list[float] = []
        self.backlog_ms: list[float] = []
        self.samples: list[list[float]] = []  # [t_ns, max lag in the interval ms, cpu %]
        # every late call of the watcher as the span the loop was seen away: from when the
        # call was due to when it ran (ns from t0); a read stamped in that span waited up to
        # its length (the watcher is a bare timer callback, every WATCH_MS: a stall is seen
        # from at most that long after it began)
        self.stall_from = array("q")
        self.stall_to = array("q")
        self.stall_count = 0
        self._watch_due = 0
        self._watch: asyncio.TimerHandle | None = None
        self.cpu: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._t0_ns = 0
        self._proc = _process()  # imported and primed here, not in the first tick of the run
        self._cpu_start_s = 0.0
        if self._proc is not None:
            self._proc.cpu_percent(None)  # the first call only sets the reference point

    def start(self, t0_ns: int) -> None:
        self._t0_ns = t0_ns
        self._cpu_start_s = self._cpu_s()
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._tick())
        self._watch_due = time.perf_counter_ns() + int(WATCH_MS * 1e6)
        self._watch = loop.call_later(WATCH_MS / 1e3, self._watcher, loop)

    def _watcher(self, loop: asyncio.AbstractEventLoop) -> None:
        now = time.perf_counter_ns()
        if now - self._watch_due >= STALL_NS:
            self.stall_count += 1
            if self.stall_count <= STALLS_KEPT:
                self.stall_from.append(self._watch_due - self._t0_ns)
                self.stall_to.append(now - self._t0_ns)
        self._watch_due = now + int(WATCH_MS * 1e6)
        self._watch = loop.call_later(WATCH_MS / 1e3, self._watcher, loop)

    async def _tick(self) -> None:
        proc = self._proc
        loop = asyncio.get_running_loop()
        interval_max = 0.0
        next_sample = time.perf_counter_ns() + self.sample_ns
        expected = time.perf_counter_ns() + self.tick_ns
        while True:
            await asyncio.sleep(max(0.0, (expected - time.perf_counter_ns()) / 1e9))
            now = time.perf_counter_ns()
            lag_ms = max(0.0, (now - expected) / 1e6)
            self.lags_ms.append(lag_ms)
            self.backlog_ms.append(parse_backlog_ms(loop))
            interval_max = max(interval_max, lag_ms)
            # the next tick is due one period after this wake-up (a late tick is not caught up)
            expected = now + self.tick_ns
            if now >= next_sample:
                cpu = float(proc.cpu_percent(None)) if proc is not None else float("nan")
                if cpu == cpu:
                    self.cpu.append(cpu)
                self.samples.append([now - self._t0_ns, round(interval_max, 3), cpu])
                interval_max = 0.0
                next_sample = now + self.sample_ns

    def stalled_stamps(self, stamps_ns: Iterable[int]) -> np.ndarray:
        """For each read time (ns from t0), how long the loop had been seen away when it was
        stamped: its time minus the start of the stall it fell in, 0 outside every stall.

        A read that arrives while the loop is busy (or the process waits for a CPU) is
        stamped when the loop returns, before the late watcher call runs: in the span that
        call saw. Its stamp may be late by up to the figure (or by up to ``WATCH_MS`` more: a
        stall is seen from when the call was due, not from when it began)."""
        t = np.fromiter(stamps_ns, dtype=np.int64)
        if not len(self.stall_to) or not t.size:
            return np.zeros(t.size)
        ends = np.frombuffer(self.stall_to, dtype=np.int64)
        starts = np.frombuffer(self.stall_from, dtype=np.int64)
        # the first stall that ends at or after each stamp: the only one it can lie in
        i = np.minimum(np.searchsorted(ends, t), ends.size - 1)
        inside = (starts[i] <= t) & (t <= ends[i])
        return np.where(inside, (t - starts[i]) / 1e6, 0.0)

    def judge_tokens(self, section: dict[str, Any], chunks: Sequence[Sequence[int]]) -> None:
        """Add to ``section`` (``summary``'s), from each request's token read times
        (``chunks``, ns from t0), how many were stamped after the loop had been away
        ``threshold_ms`` or more: first tokens (TTFT's ends) and the later ones (what ITL is
        made of), each apart. More than ``STALLED_SHARE`` of either marks the run saturated:
        they may be late by that much, and are enough to move the p99. The ticker's p99 misses
        this when the stalls come in the bursts where many tokens arrive together (a closed
        loop's streams that started together): a few late ticks, many late stamps. Past
        ``TOKENS_CHECKED`` later stamps, every k-th request's are looked up (a stall touches
        the streams alike, so a sample gives the share)."""
        first = self.stalled_stamps(c[0] for c in chunks if c)
        section["first_tokens"] = int(first.size)
        section["stalled_first_tokens"] = self._judge(section, first)
        # None where no token was read (not streamed, embeddings): no figure, not a zero
        p99 = percentile(first, 99)
        section["stalled_first_token_ms_p99"] = None if p99 is None else round(p99, 3)
        section["stalled_first_token_ms_max"] = round(float(first.max()), 3) if first.size else None
        section["stalls"] = self.stall_count  # tokens after the kept ones: not judged
        every = max(1, -(-sum(max(0, len(c) - 1) for c in chunks) // TOKENS_CHECKED))
        later = self.stalled_stamps(itertools.chain.from_iterable(c[1:] for c in chunks[::every]))
        section["later_tokens_checked"] = int(later.size)
        section["stalled_later_tokens"] = self._judge(section, later)

    def _judge(self, section: dict[str, Any], away: np.ndarray) -> int:
        """How many of ``away`` reach the threshold; past ``STALLED_SHARE``, ``section`` is
        marked saturated."""
        stalled = int(np.count_nonzero(away >= self.threshold_ms))
        if stalled > STALLED_SHARE * away.size:
            section["saturated"] = True
        return stalled

    def _cpu_s(self) -> float:
        if self._proc is None:
            return 0.0
        t = self._proc.cpu_times()
        return float(t.user + t.system)

    async def stop(self) -> dict[str, Any]:
        """Stop sampling; the ``generator`` section of the results file."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.cpu_s = self._cpu_s() - self._cpu_start_s
        return self.summary()

    def summary(self) -> dict[str, Any]:
        lags = distribution(self.lags_ms, (50.0, 99.0))
        backlog = distribution(self.backlog_ms, (50.0, 99.0))
        p99 = lags.at(99) or 0.0
        backlog_p50 = backlog.at(50) or 0.0
        return {
            "saturated": p99 > self.threshold_ms or backlog_p50 > self.threshold_ms,
            "loop_lag_ms_max": lags.max or 0.0,
            "loop_lag_ms_p99": p99,
            "loop_lag_ms_p50": lags.at(50) or 0.0,
            "parse_backlog_ms_p50": backlog_p50,
            "parse_backlog_ms_p99": backlog.at(99) or 0.0,
            "parse_backlog_ms_max": backlog.max or 0.0,
            "cpu_percent_mean": float(np.mean(self.cpu)) if self.cpu else None,
            "cpu_s": round(getattr(self, "cpu_s", 0.0), 3),  # user + system over the run
            "threshold_ms": self.threshold_ms,
            "rule": (
                "saturated when the p99 of a 10 ms ticker's oversleep, or the median age of the "
                "oldest read not yet parsed, exceeds threshold_ms, or when more than 1 % of the "
                "first tokens, or of the later ones, were read after the loop had been away "
                "threshold_ms or more"
            ),
            "samples": [[int(s[0]), s[1], s[2] if s[2] == s[2] else None] for s in self.samples],
        }


def _process() -> Any:
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency
        return None
    return psutil.Process()

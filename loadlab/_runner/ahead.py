"""The coming requests built ahead of their send time: in an open loop's waits, and in a
closed loop between reads (``Runner._closed_loop``).

Building a unit (one request, or a whole chat session) runs the workload's lazy stream: prompt
text, the prompt fitted to its token count under the run's sizing, and the client encoding the
first request's body. For prompts of thousands of tokens that is a fraction of a millisecond,
several on a busy machine. Built when it is due, a request is written that much late, and in
a burst (a production trace sends dozens within a few milliseconds) each one waits for the
building of every one before it.

So the scheduler builds while it waits for the next due time (``Lookahead.build_while``): one
unit at a time, only while the wait leaves room for one more (the slowest recent build, with
the last millisecond left to the wait itself), yielding to the event loop between builds so
that reads are stamped on time. Up to ``max_units`` units, or ``max_chars`` characters of
prompt text, are kept built ahead (the read-ahead's bounds, so an endless stream stays cheap).
A unit that the waits left no room for is built when the scheduler takes it, as before (the
runner counts those that were due before their building ended: ``generator.built_late``).

``prepare(unit)`` runs on each unit as it is built; what it returns goes with the unit (the
client's encoded body of the unit's first request, ``StreamingClient.encode_body``).

Example::

    ahead = Lookahead(units, prepare=lambda unit: client.encode_body(unit[0]))
    unit, body = ahead.pop()                # the next unit, built ahead if there was room
    await ahead.build_while(due_ns, stop)   # the ones after it, while the scheduler waits
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from loadlab.records import RequestSpec
from loadlab.workloads._base import PREFETCH_CHARS, PREFETCH_SPECS

__all__ = ["BUILD_COST_DECAY", "Lookahead"]

Unit = list[RequestSpec]
Built = tuple[Unit, Any]  # a unit and what ``prepare`` made of it
# the estimate of a build's cost is the slowest recent one: each build lowers it this much
# from the previous estimate before comparing (a one-off stall fades within a few dozen)
BUILD_COST_DECAY = 0.95
_clock = time.perf_counter_ns


class Lookahead:
    """Units taken from ``units`` ahead of the scheduler, each with what ``prepare`` made of
    it (None without one)."""

    def __init__(
        self,
        units: Iterator[Unit],
        prepare: Callable[[Unit], Any] | None = None,
        *,
        max_units: int = PREFETCH_SPECS,
        max_chars: int = PREFETCH_CHARS,
    ) -> None:
        self._units = units
        self._prepare = prepare
        self.max_units = max(1, max_units)
        self.max_chars = max_chars
        self._built: deque[Built] = deque()
        self._chars = 0
        self._ended = False
        self.cost_ns = 0  # the slowest recent build (decaying): what room one more needs

    def __len__(self) -> int:
        return len(self._built)

    @property
    def ended(self) -> bool:
        """The stream has given its last unit (some may still wait here)."""
        return self._ended

    def full(self) -> bool:
        return self._ended or len(self._built) >= self.max_units or self._chars >= self.max_chars

    def pop(self) -> Built | None:
        """The next unit and what ``prepare`` made of it (None when the stream has ended):
        the one built ahead, else built now."""
        if self._built:
            built = self._built.popleft()
            self._chars -= _chars(built[0])
            return built
        return self._build()

    def build_one(self) -> bool:
        """Build one more unit into the buffer; False when full or the stream has ended."""
        if self.full():
            return False
        built = self._build()
        if built is None:
            return False
        self._built.append(built)
        self._chars += _chars(built[0])
        return True

    def has_room(self, until_ns: int) -> bool:
        """Whether one more build, as slow as the slowest recent one, ends before ``until_ns``."""
        return not self.full() and _clock() + self.cost_ns < until_ns

    async def build_while(self, until_ns: int, stop: Callable[[], bool]) -> None:
        """Build units while each can end before ``until_ns`` (and ``stop()`` is False),
        yielding to the event loop after each one."""
        while not stop() and self.has_room(until_ns) and self.build_one():
            await asyncio.sleep(0)

    def _build(self) -> Built | None:
        if self._ended:
            return None
        start = _clock()
        unit = next(self._units, None)
        if unit is None:
            self._ended = True
            return None
        made = self._prepare(unit) if self._prepare is not None else None
        cost = _clock() - start
        self.cost_ns = max(cost, int(self.cost_ns * BUILD_COST_DECAY))
        return unit, made


def _chars(unit: Unit) -> int:
    return sum(len(s.prompt) for s in unit)

"""A live one-line progress display on a terminal (stderr), silent otherwise.

    [ 12.0s / 60s]  done 412  in flight 32  dropped 0  errors 3  out 5,120 tok/s

Example::

    async with Progress(runner.stats, total_s=60.0, enabled=cfg.progress):
        results = await runner.run()
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import IO, Any

from loadlab._runner.runner import LiveStats

__all__ = ["Progress", "format_line"]


def format_line(
    stats: LiveStats,
    elapsed_s: float,
    tokens_per_s: float,
    total_s: float | None = None,
    total_requests: int | None = None,
) -> str:
    """One status line; the pure part of the display (tested without a terminal)."""
    span = f"{elapsed_s:6.1f}s" + (f" / {total_s:.0f}s" if total_s else "")
    done = f"done {stats.done:,}" + (f"/{total_requests:,}" if total_requests else "")
    sent = stats.in_flight - (stats.ahead - stats.fired)  # not those started ahead, not yet due
    return (
        f"[{span}]  {done}  in flight {sent}  dropped {stats.dropped:,}  "
        f"errors {stats.failed:,}  out {tokens_per_s:,.0f} tok/s"
    )


class Progress:
    """Redraws the line every ``interval_s`` while the run goes on (only on a tty)."""

    def __init__(
        self,
        stats: LiveStats | list[LiveStats],
        *,
        total_s: float | None = None,
        total_requests: int | None = None,
        enabled: bool = True,
        interval_s: float = 0.5,
        stream: IO[str] | None = None,
    ) -> None:
        self.stats = stats if isinstance(stats, list) else [stats]
        self.total_s = total_s
        self.total_requests = total_requests
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and self.stream.isatty()
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def _combined(self) -> LiveStats:
        total = LiveStats()
        for s in self.stats:
            for name in vars(total):
                setattr(total, name, getattr(total, name) + getattr(s, name))
        return total

    async def _loop(self) -> None:
        start = time.perf_counter()
        last_t, last_tokens = start, 0
        rate = 0.0
        while True:
            await asyncio.sleep(self.interval_s)
            now = time.perf_counter()
            stats = self._combined()
            rate = (stats.output_tokens - last_tokens) / max(now - last_t, 1e-9)
            last_t, last_tokens = now, stats.output_tokens
            line = format_line(stats, now - start, rate, self.total_s, self.total_requests)
            self.stream.write("\r\033[K" + line)
            self.stream.flush()

    async def __aenter__(self) -> Progress:
        if self.enabled:
            self._task = asyncio.get_running_loop().create_task(self._loop())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self.stream.write("\r\033[K")
            self.stream.flush()

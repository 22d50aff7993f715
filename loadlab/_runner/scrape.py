"""Sample a server's Prometheus ``/metrics`` during a run: the server's side of the story.

``PrometheusScraper`` polls the URL every ``interval_s`` and keeps each sample as
``{"t_ns": time relative to the run's t0, "metrics": {"name{labels}": value}}`` for the
results file's ``server_samples``. A failed scrape is counted, never fatal: the run goes on.
The first failure is said at once on stderr (a 401 or 403: the server wants credentials), and
at the end how many failed. The page is read by ``loadlab._analysis.server_metrics``.

Example::

    scraper = PrometheusScraper("http://127.0.0.1:8000/metrics", 1.0, t0_ns)
    await scraper.start()
    ...                                   # the run
    samples = await scraper.stop()        # also scraper.failures, scraper.last_error
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from typing import Any

import aiohttp

from loadlab._analysis.server_metrics import parse_prometheus_text
from loadlab._headers import split_userinfo
from loadlab.errors import ConfigError
from loadlab.records import printable

__all__ = ["PrometheusScraper"]


class PrometheusScraper:
    """Polls a ``/metrics`` URL in the background; ``stop()`` returns the samples.

    Histogram buckets are dropped unless ``keep_buckets`` (vLLM exposes hundreds of them;
    ``_sum`` and ``_count`` stay, which is enough for a mean). Non-finite values are dropped
    (the results file is strict JSON).
    """

    def __init__(
        self,
        url: str,
        interval_s: float,
        t0_ns: int,
        *,
        timeout_s: float | None = None,
        keep_buckets: bool = False,
        quiet: bool = False,
    ) -> None:
        url, basic = split_userinfo(url)  # user-info: Basic auth, kept out of every message
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"scrape URL must start with http:// or https://, got {url!r}")
        if not interval_s > 0:
            raise ConfigError(f"scrape interval must be > 0 seconds, got {interval_s}")
        self.url = url
        self._headers = {"Authorization": basic} if basic else {}
        self.interval_s = interval_s
        self.t0_ns = t0_ns
        self.timeout_s = timeout_s if timeout_s is not None else max(0.5, min(interval_s, 5.0))
        self.keep_buckets = keep_buckets
        self.samples: list[dict[str, Any]] = []
        self.failures = 0
        self.attempts = 0
        self.last_error: str | None = None
        self.quiet = quiet  # else the first failure and the count of failures go to stderr
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("scraper already started")
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        # The first sample before the run's first request: counters' increases over the
        # samples (a prefix-cache hit rate) then cover every request of the run.
        await self.scrape_once()
        self._task = asyncio.create_task(self._loop(), name="loadlab-scrape")

    async def stop(self) -> list[dict[str, Any]]:
        """Stop polling (one last sample first, so the end of the run is covered)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
            await self.scrape_once()
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self.failures:
            self._tell(
                f"{self.failures} of {self.attempts} samples failed (last: {self.last_error})"
            )
        return self.samples

    def _tell(self, text: str) -> None:
        if not self.quiet:
            print(printable(f"loadlab run: --scrape {self.url}: {text}"), file=sys.stderr)

    async def _loop(self) -> None:
        next_t = time.perf_counter()
        while True:
            next_t += self.interval_s
            # A slow scrape does not pile up: skip the ticks it overran.
            now = time.perf_counter()
            if next_t < now:
                next_t = now + self.interval_s - ((now - next_t) % self.interval_s)
            await asyncio.sleep(next_t - now)
            await self.scrape_once()

    async def scrape_once(self) -> bool:
        """One scrape; True when a sample was kept. Errors are counted, never raised."""
        if self._session is None:
            return False
        start_ns = time.perf_counter_ns()
        try:
            async with self._session.get(self.url, headers=self._headers) as resp:
                if resp.status in (401, 403):
                    raise ValueError(
                        f"HTTP {resp.status}: the server wants credentials for it; give them "
                        "in the URL (http://user:password@host/metrics) or open /metrics"
                    )
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                text = await resp.text(errors="replace")
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, TimeoutError, ValueError, OSError) as exc:
            self.attempts += 1
            self.failures += 1
            named = isinstance(exc, ValueError)  # an HTTP status, said above
            self.last_error = (str(exc) if named else f"{type(exc).__name__}: {exc}")[:200]
            if self.failures == 1:
                self._tell(f"{self.last_error}; the run goes on, without the server's samples")
            return False
        end_ns = time.perf_counter_ns()
        self.attempts += 1
        values = {
            k: v
            for k, v in parse_prometheus_text(text).items()
            if math.isfinite(v) and (self.keep_buckets or "_bucket{" not in k)
        }
        # The values describe the server somewhere inside the round trip: stamp the middle.
        t_ns = (start_ns + end_ns) // 2 - self.t0_ns
        self.samples.append({"t_ns": t_ns, "metrics": values})
        return True

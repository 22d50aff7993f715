"""A DCGM exporter on loopback that replays a recorded page (``tests/data/dcgm_exporter_h100.txt``:
dcgm-exporter's default counters, two H100s of one node) with values that change over time.

For ``idle_s`` seconds after its first scrape the GPUs idle (the recorded values); then they
are busy: power ``busy_w`` (GPU 1: 20 W less) with a ±10 W ripple of period 1 s, utilisation
near 85 %, the SM clock up, memory filling, temperature rising. The energy counter (mJ since
boot) is the exact integral of that power, so it can check a power integral.

    with DcgmReplay(idle_s=1.2) as dcgm:
        ...  # loadlab run --gpu-metrics {dcgm.url}
"""

from __future__ import annotations

import asyncio
import math
import re
import threading
import time
from pathlib import Path
from types import TracebackType

from aiohttp import web

from tests.helpers.loopback import free_port

PAGE = Path(__file__).resolve().parent.parent / "data" / "dcgm_exporter_h100.txt"
_LINE = re.compile(r'^(?P<name>DCGM_FI_[A-Z_]+)\{gpu="(?P<gpu>\d+)".*\} (?P<value>\S+)$')
RIPPLE_W = 10.0


class DcgmReplay:
    """The replay server in a thread of this process, bound to 127.0.0.1."""

    def __init__(self, idle_s: float = 1.0, busy_w: float = 300.0) -> None:
        self.idle_s, self.busy_w = idle_s, busy_w
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.scrapes = 0
        self.t_first: float | None = None
        self._template = PAGE.read_text(encoding="utf-8").splitlines()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    # ---------------------------------------------------------------- the GPUs' physics

    def power_w(self, gpu: int, t: float, idle_w: float) -> float:
        if t < self.idle_s:
            return idle_w
        return self.busy_w - 20 * gpu + RIPPLE_W * math.sin(2 * math.pi * t)

    def energy_mj(self, gpu: int, t: float, e0: float, idle_w: float) -> float:
        """``e0`` plus the integral of ``power_w`` from 0 to ``t``, in mJ."""
        joules = idle_w * min(t, self.idle_s)
        if t > self.idle_s:
            busy = self.busy_w - 20 * gpu
            joules += busy * (t - self.idle_s) - RIPPLE_W / (2 * math.pi) * (
                math.cos(2 * math.pi * t) - math.cos(2 * math.pi * self.idle_s)
            )
        return e0 + joules * 1000

    def value(self, name: str, gpu: int, recorded: float, t: float) -> float:
        busy = t >= self.idle_s
        up = max(0.0, t - self.idle_s)
        idle_w = float(recorded) if name == "DCGM_FI_DEV_POWER_USAGE" else 70.0 + 2 * gpu
        changes = {
            "DCGM_FI_DEV_POWER_USAGE": lambda: self.power_w(gpu, t, idle_w),
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": lambda: self.energy_mj(
                gpu, t, recorded, idle_w
            ),
            "DCGM_FI_DEV_GPU_UTIL": lambda: 85 + 10 * math.sin(2 * math.pi * t) if busy else 0,
            "DCGM_FI_DEV_SM_CLOCK": lambda: 1980 if busy else recorded,
            "DCGM_FI_DEV_FB_USED": lambda: recorded + (61234 + 100 * up if busy else 0),
            "DCGM_FI_DEV_GPU_TEMP": lambda: recorded + min(30.0, 3 * up),
        }
        fn = changes.get(name)
        return float(fn()) if fn is not None else recorded

    def page(self) -> str:
        now = time.monotonic()
        if self.t_first is None:
            self.t_first = now
        t = now - self.t_first
        out = []
        for line in self._template:
            m = _LINE.match(line)
            if m is None:
                out.append(line)
                continue
            v = self.value(m["name"], int(m["gpu"]), float(m["value"]), t)
            out.append(f"{line[: m.start('value')]}{v:.6f}")
        return "\n".join(out) + "\n"

    # ---------------------------------------------------------------- the server

    async def _metrics(self, request: web.Request) -> web.Response:
        self.scrapes += 1
        return web.Response(text=self.page(), content_type="text/plain", charset="utf-8")

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        self._ready.set()
        try:
            await asyncio.wait_for(self._stop.wait(), timeout=300)  # bounded in time
        finally:
            await runner.cleanup()

    def __enter__(self) -> DcgmReplay:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the DCGM replay server did not start")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

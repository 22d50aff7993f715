"""GPU telemetry sampled beside the load: a DCGM exporter's page, or NVML on this host.

``GpuTelemetry`` samples in a background thread of its own (the load's event loop and its
worker processes never wait for it), from one of two sources:

- a URL: a Prometheus page with GPU metrics (a DCGM exporter, ``:9400/metrics``; or the
  reference server's ``/metrics`` on CUDA), polled by ``PrometheusScraper``;
- ``nvml``: NVML on this machine (``pip install "loadlab[gpu]"``, the ``pynvml`` module of
  nvidia-ml-py), for loadlab running on the GPU's host.

Entering it takes the idle baseline: ``baseline_s`` seconds of samples before the first
request. Leaving it stops the sampling; ``attach(results)`` writes the per-GPU series
(``loadlab._analysis.telemetry``) into ``results.extra["gpu_telemetry"]``, times relative to
the run's t0. A failed sample is counted, never fatal; a source that gives nothing at the
start (no NVML, no GPU metric on the page) is an error before any request.

Example::

    with GpuTelemetry("http://gpu-node:9400/metrics", interval_s=1.0, baseline_s=5.0) as gpu:
        results = run_specs(...)
    gpu.attach(results)
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from loadlab._analysis.telemetry import gpu_series
from loadlab._headers import public_url
from loadlab._runner.scrape import PrometheusScraper
from loadlab.errors import ConfigError

if TYPE_CHECKING:
    from types import TracebackType

    from loadlab.config import RunConfig
    from loadlab.results import Results

__all__ = ["NVML", "GpuTelemetry", "for_run", "nvml_sample", "open_nvml"]

NVML = "nvml"
_NO_NVML = (
    "--gpu-metrics nvml: no NVML/no GPU here ({why}); on the GPU's host install the NVIDIA "
    'driver and pip install "loadlab[gpu]", or give a DCGM exporter\'s URL '
    "(http://HOST:9400/metrics)"
)


def open_nvml() -> Any:
    """The ``pynvml`` module, initialised; ``ConfigError`` saying why not."""
    try:
        import pynvml
    except ImportError:
        raise ConfigError(_NO_NVML.format(why="the pynvml module is not installed")) from None
    try:
        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() < 1:
            raise ConfigError(_NO_NVML.format(why="NVML sees no GPU"))
    except pynvml.NVMLError as exc:
        raise ConfigError(_NO_NVML.format(why=f"NVML: {exc}")) from None
    return pynvml


def nvml_sample(nvml: Any, host: str) -> dict[str, float]:
    """One reading of every GPU NVML sees, under the ``loadlab_gpu_*`` names (base units).
    A quantity a GPU does not report (energy before Volta, power on some boards) is left out."""
    out: dict[str, float] = {}
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        uuid, model = nvml.nvmlDeviceGetUUID(h), nvml.nvmlDeviceGetName(h)
        labels = f'Hostname="{host}",UUID="{uuid}",gpu="{i}",modelName="{model}"'
        reads = {
            "utilization_percent": lambda h=h: nvml.nvmlDeviceGetUtilizationRates(h).gpu,
            "memory_used_bytes": lambda h=h: nvml.nvmlDeviceGetMemoryInfo(h).used,
            "power_watts": lambda h=h: nvml.nvmlDeviceGetPowerUsage(h) / 1000,  # mW
            "sm_clock_hertz": lambda h=h: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM) * 1e6,
            "temperature_celsius": lambda h=h: nvml.nvmlDeviceGetTemperature(
                h, nvml.NVML_TEMPERATURE_GPU
            ),
            "energy_joules_total": lambda h=h: nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000,
        }
        for name, read in reads.items():
            with contextlib.suppress(nvml.NVMLError):
                out[f"loadlab_gpu_{name}{{{labels}}}"] = float(read())
    return out


class GpuTelemetry:
    """Samples a GPU source every ``interval_s`` in a thread; a context manager (see above)."""

    def __init__(self, source: str, interval_s: float = 1.0, baseline_s: float = 5.0) -> None:
        if source != NVML and not source.startswith(("http://", "https://")):
            raise ConfigError(
                f"--gpu-metrics must be a DCGM exporter's URL (http://HOST:9400/metrics) or "
                f"'nvml', got {public_url(source)!r}"
            )
        self.source = source
        self.interval_s = interval_s
        self.baseline_s = baseline_s
        self.samples: list[dict[str, Any]] = []  # t_ns: absolute perf_counter_ns
        self.failures = 0
        self.last_error: str | None = None
        self.baseline_ns: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    def __enter__(self) -> GpuTelemetry:
        target = self._nvml_main if self.source == NVML else self._scrape_main
        self._thread = threading.Thread(target=target, name="loadlab-gpu", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            self._thread.join()
            raise self._start_error
        start = time.perf_counter_ns()
        if self.baseline_s > 0:  # the GPU idle, before the first request
            time.sleep(self.baseline_s)
            self.baseline_ns = (start, time.perf_counter_ns())
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._loop is not None and self._wake is not None:
            with contextlib.suppress(RuntimeError):  # its loop has ended already
                self._loop.call_soon_threadsafe(self._wake.set)
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _check_first(self, sample: dict[str, Any] | None) -> None:
        """The first sample must hold a GPU metric; otherwise the run does not start."""
        if sample is None:
            self._start_error = ConfigError(
                f"--gpu-metrics {public_url(self.source)}: no answer ({self.last_error}); "
                "is the DCGM exporter running there?"
            )
        elif not gpu_series([sample]):
            self._start_error = ConfigError(
                f"--gpu-metrics {public_url(self.source)}: the page has no GPU metric "
                "(DCGM_FI_DEV_* or loadlab_gpu_*); give a DCGM exporter's /metrics URL"
            )

    def _scrape_main(self) -> None:
        asyncio.run(self._scrape())

    async def _scrape(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        scraper = PrometheusScraper(self.source, self.interval_s, t0_ns=0)
        try:
            await scraper.start()  # one sample at once
        except BaseException as exc:
            self._start_error = exc
            self._started.set()
            return
        self.last_error = scraper.last_error
        self._check_first(scraper.samples[0] if scraper.samples else None)
        self._started.set()
        if self._start_error is None and not self._stop.is_set():
            await self._wake.wait()
        self.samples = await scraper.stop()
        self.failures, self.last_error = scraper.failures, scraper.last_error

    def _nvml_main(self) -> None:
        try:
            nvml = open_nvml()
        except ConfigError as exc:
            self._start_error = exc
            self._started.set()
            return
        host = socket.gethostname()
        try:
            first = self._nvml_once(nvml, host)
            self._check_first(first)
            self._started.set()
            while self._start_error is None and not self._stop.wait(self.interval_s):
                self._nvml_once(nvml, host)
            self._nvml_once(nvml, host)  # the end of the run covered
        finally:
            self._started.set()
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()

    def _nvml_once(self, nvml: Any, host: str) -> dict[str, Any] | None:
        t = time.perf_counter_ns()
        try:
            values = nvml_sample(nvml, host)
        except nvml.NVMLError as exc:
            self.failures += 1
            self.last_error = f"NVML: {exc}"[:200]
            return None
        sample = {"t_ns": (t + time.perf_counter_ns()) // 2, "metrics": values}
        self.samples.append(sample)
        return sample

    def attach(self, results: Results) -> None:
        """The series into ``results.extra["gpu_telemetry"]``, relative to the run's t0."""
        t0 = int(results.extra.get("t0_ns", 0))
        base = self.baseline_ns
        results.extra["gpu_telemetry"] = {
            "source": NVML if self.source == NVML else public_url(self.source),
            "interval_s": self.interval_s,
            "baseline_ns": [base[0] - t0, base[1] - t0] if base else None,
            "failures": self.failures,
            "last_error": self.last_error,
            "gpus": gpu_series(self.samples, t0),
        }


class _Off:
    """No GPU source for this endpoint: nothing to sample, nothing to attach."""

    def __enter__(self) -> _Off:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def attach(self, results: Results) -> None:
        return None


def for_run(cfg: RunConfig, endpoint: str) -> GpuTelemetry | _Off:
    """The sampler of ``endpoint``'s run: its own ``--gpu-metrics`` source, else the one for
    every endpoint, else none."""
    source = cfg.gpu_metrics.get(endpoint) or cfg.gpu_metrics.get("*")
    if not source:
        return _Off()
    return GpuTelemetry(source, cfg.gpu_interval_s, cfg.gpu_baseline_s)

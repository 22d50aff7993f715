"""GPU telemetry beside the load, and the energy a run used (ARCHITECTURE.md, "Cost and energy").

``gpu_series`` turns the samples of a GPU source into per-GPU time series. Sources are read
by their metric names: a DCGM exporter's (``DCGM_FI_DEV_*``, labels ``gpu``, ``UUID``,
``Hostname``, ``modelName``), or loadlab's own ``loadlab_gpu_*`` names, which loadlab's NVML
sampler and the reference server's ``/metrics`` (on CUDA) use::

    field            unit  DCGM field                            loadlab name
    gpu_util_pct     %     DCGM_FI_DEV_GPU_UTIL                  loadlab_gpu_utilization_percent
    memory_used_mib  MiB   DCGM_FI_DEV_FB_USED                   loadlab_gpu_memory_used_bytes
    power_w          W     DCGM_FI_DEV_POWER_USAGE               loadlab_gpu_power_watts
    sm_clock_mhz     MHz   DCGM_FI_DEV_SM_CLOCK                  loadlab_gpu_sm_clock_hertz
    temperature_c    °C    DCGM_FI_DEV_GPU_TEMP                  loadlab_gpu_temperature_celsius
    energy_j         J     DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION  loadlab_gpu_energy_joules_total
                           (mJ since boot)

The results file keeps them as ``extra["gpu_telemetry"]``::

    {"source": "nvml" | URL, "interval_s", "baseline_ns": [start, end] (before t0: negative),
     "failures", "last_error",
     "gpus": [{"gpu", "uuid", "host", "model", "t_ns": [...], FIELD: [value | null, ...]}]}

``energy_of`` integrates each GPU's power over the measurement window (trapezoids between
samples; the window's ends interpolated, or held at the nearest sample), subtracts the mean
power of the idle baseline taken before the first request, and divides by the window's
output tokens and completed requests. Without a power series there is no figure.

Example::

    e = energy_of(read_results("reports/run.json"))
    e.joules_per_output_token, e.joules_per_output_token_above_idle
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from loadlab._analysis import metrics
from loadlab._analysis.cost import completed_in, pricing_of
from loadlab._analysis.server_metrics import split_key

if TYPE_CHECKING:
    from loadlab.results import Results

__all__ = [
    "ENERGY_METRICS",
    "GPU_FIELDS",
    "EnergySummary",
    "GpuEnergy",
    "energy_of",
    "gpu_label",
    "gpu_series",
    "telemetry_of",
]

# field -> (unit, ((metric name, factor to the unit), ...))
GPU_FIELDS: dict[str, tuple[str, tuple[tuple[str, float], ...]]] = {
    "gpu_util_pct": (
        "%",
        (("DCGM_FI_DEV_GPU_UTIL", 1.0), ("loadlab_gpu_utilization_percent", 1.0)),
    ),
    "memory_used_mib": (
        "MiB",
        (("DCGM_FI_DEV_FB_USED", 1.0), ("loadlab_gpu_memory_used_bytes", 1 / 2**20)),
    ),
    "power_w": ("W", (("DCGM_FI_DEV_POWER_USAGE", 1.0), ("loadlab_gpu_power_watts", 1.0))),
    "sm_clock_mhz": (
        "MHz",
        (("DCGM_FI_DEV_SM_CLOCK", 1.0), ("loadlab_gpu_sm_clock_hertz", 1e-6)),
    ),
    "temperature_c": (
        "°C",
        (("DCGM_FI_DEV_GPU_TEMP", 1.0), ("loadlab_gpu_temperature_celsius", 1.0)),
    ),
    "energy_j": (
        "J",
        (("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3), ("loadlab_gpu_energy_joules_total", 1.0)),
    ),
}
_BY_NAME = {name: (f, k) for f, (_, names) in GPU_FIELDS.items() for name, k in names}
ENERGY_METRICS = ("joules_per_output_token", "joules_per_request")


def _identity(labels: Mapping[str, str]) -> tuple[str, str]:
    """(host, gpu index or UUID): what tells one GPU from another across sources."""
    return labels.get("Hostname", ""), labels.get("gpu", labels.get("UUID", ""))


def gpu_series(samples: Sequence[Mapping[str, Any]], t0_ns: int = 0) -> list[dict[str, Any]]:
    """Per-GPU series from samples ``{"t_ns", "metrics": {"name{labels}": value}}``; every
    series holds a value (or ``None``) for each sample that saw the GPU; times minus ``t0_ns``.
    Metrics that are not GPU fields are left out."""
    gpus: dict[tuple[str, str], dict[str, Any]] = {}
    for s in samples:
        seen: dict[tuple[str, str], dict[str, float]] = {}
        for key, value in s.get("metrics", {}).items():
            name = key.split("{", 1)[0]
            if name not in _BY_NAME:
                continue
            field, factor = _BY_NAME[name]
            _, labels = split_key(key)
            ident = _identity(labels)
            if ident not in gpus:
                gpus[ident] = {"gpu": labels.get("gpu", ""), "uuid": labels.get("UUID", ""),
                               "host": labels.get("Hostname", ""),
                               "model": labels.get("modelName", ""), "t_ns": [],
                               **{f: [] for f in GPU_FIELDS}}  # fmt: skip
            seen.setdefault(ident, {})[field] = float(value) * factor
        for ident, values in seen.items():
            g = gpus[ident]
            g["t_ns"].append(int(s["t_ns"]) - t0_ns)
            for f in GPU_FIELDS:
                g[f].append(values.get(f))
    return [gpus[k] for k in sorted(gpus)]


def telemetry_of(results: Results) -> Mapping[str, Any] | None:
    """A run's ``extra["gpu_telemetry"]`` section, or ``None``."""
    tel = results.extra.get("gpu_telemetry")
    return tel if isinstance(tel, Mapping) else None


def gpu_label(g: Mapping[str, Any]) -> str:
    """``node-a gpu 0 (NVIDIA H100 80GB HBM3)``: a GPU as a report names it."""
    host = f"{g['host']} " if g.get("host") else ""
    text = f"{host}gpu {g.get('gpu') or g.get('uuid') or '?'}"
    return f"{text} ({g['model']})" if g.get("model") else text


@dataclass(frozen=True)
class GpuEnergy:
    """One GPU over the measurement window."""

    gpu: str
    joules: float
    window_s: float
    coverage: float  # fraction of the window between the first and the last power sample
    idle_w: float | None  # mean power of the baseline before the load; None: no baseline
    idle_samples: int
    counter_joules: float | None  # the GPU's own energy counter over the window, a cross-check

    @property
    def mean_w(self) -> float:
        return self.joules / self.window_s if self.window_s else 0.0

    @property
    def joules_above_idle(self) -> float | None:
        return None if self.idle_w is None else self.joules - self.idle_w * self.window_s


@dataclass(frozen=True)
class EnergySummary:
    """The energy of a run's window, per GPU and in total, and per token and request.

    ``missing`` says why there is no figure (no power sensor, too few samples); the energy
    figures are then ``None``."""

    gpus: tuple[GpuEnergy, ...]
    window_s: float
    output_tokens: float
    requests: int
    baseline_s: float | None  # the idle baseline's span before the load; None: none taken
    usd_per_kwh: float | None = None
    missing: str = ""

    @property
    def joules(self) -> float | None:
        return sum(g.joules for g in self.gpus) if self.gpus else None

    @property
    def joules_above_idle(self) -> float | None:
        above = [g.joules_above_idle for g in self.gpus]
        return None if not above or None in above else sum(a for a in above if a is not None)

    def _per(self, joules: float | None, n: float) -> float | None:
        return joules / n if joules is not None and n else None

    @property
    def joules_per_output_token(self) -> float | None:
        return self._per(self.joules, self.output_tokens)

    @property
    def joules_per_request(self) -> float | None:
        return self._per(self.joules, self.requests)

    @property
    def joules_per_output_token_above_idle(self) -> float | None:
        return self._per(self.joules_above_idle, self.output_tokens)

    @property
    def joules_per_request_above_idle(self) -> float | None:
        return self._per(self.joules_above_idle, self.requests)

    @property
    def kwh(self) -> float | None:
        return None if self.joules is None else self.joules / 3.6e6

    @property
    def usd(self) -> float | None:
        """The electricity's cost at ``usd_per_kwh`` (None without a price)."""
        return None if self.kwh is None or self.usd_per_kwh is None else self.kwh * self.usd_per_kwh

    def to_dict(self) -> dict[str, Any]:
        names = ("window_s output_tokens requests baseline_s missing joules joules_above_idle "
                 "joules_per_output_token joules_per_request joules_per_output_token_above_idle "
                 "joules_per_request_above_idle kwh usd").split()  # fmt: skip
        return {
            **{n: getattr(self, n) for n in names},
            "gpus": [
                {**g.__dict__, "mean_w": g.mean_w, "joules_above_idle": g.joules_above_idle}
                for g in self.gpus
            ],
        }


def _power(g: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    pts = [(t, p) for t, p in zip(g.get("t_ns", []), g.get("power_w", []), strict=False)
           if p is not None]  # fmt: skip
    return np.asarray([t for t, _ in pts], dtype=float), np.asarray([p for _, p in pts])


def _integral_j(ts: np.ndarray, ps: np.ndarray, lo: int, hi: int) -> float:
    """∫ power dt over [lo, hi] ns: the samples joined by straight lines, held flat beyond
    the first and the last."""
    inner = ts[(ts > lo) & (ts < hi)]
    grid = np.concatenate([[lo], inner, [hi]])
    return float(np.trapezoid(np.interp(grid, ts, ps), grid) / metrics.NS_PER_S)


def _counter_j(g: Mapping[str, Any], lo: int, hi: int) -> float | None:
    pts = [(t, e) for t, e in zip(g.get("t_ns", []), g.get("energy_j", []), strict=False)
           if e is not None]  # fmt: skip
    if len(pts) < 2:
        return None
    ts, es = np.asarray([t for t, _ in pts], dtype=float), np.asarray([e for _, e in pts])
    return float(np.interp(hi, ts, es) - np.interp(lo, ts, es))


def energy_of(results: Results) -> EnergySummary | None:
    """The window's energy from the run's GPU power series (``None``: no telemetry)."""
    tel = telemetry_of(results)
    if tel is None:
        return None
    lo, hi = results.measurement_window_ns()
    tp = metrics.throughput(results.records, (lo, hi))
    base = tel.get("baseline_ns")
    b0, b1 = (int(base[0]), int(base[1])) if base else (0, 0)
    pricing = pricing_of(results)
    out = []
    for g in tel.get("gpus", []):
        ts, ps = _power(g)
        if ts.size < 2:
            continue
        idle = ps[(ts >= b0) & (ts <= b1)] if base else ps[:0]
        span = (min(hi, ts[-1]) - max(lo, ts[0])) / max(hi - lo, 1)
        out.append(GpuEnergy(
            gpu=gpu_label(g), joules=_integral_j(ts, ps, lo, hi), window_s=tp.window_s,
            coverage=float(max(0.0, min(1.0, span))),
            idle_w=float(idle.mean()) if idle.size else None, idle_samples=int(idle.size),
            counter_joules=_counter_j(g, lo, hi)))  # fmt: skip
    missing = ""
    if not out:
        has_power = any(p is not None for g in tel.get("gpus", []) for p in g.get("power_w", []))
        missing = (
            "fewer than two power samples per GPU: sample longer or more often (--gpu-interval)"
            if has_power
            else "no power sensor in the GPU telemetry: no energy figure"
        )
    return EnergySummary(
        gpus=tuple(out),
        window_s=tp.window_s,
        output_tokens=tp.output_tokens,
        requests=len(completed_in(results.records, (lo, hi))),
        baseline_s=(b1 - b0) / metrics.NS_PER_S if base and b1 > b0 else None,
        usd_per_kwh=pricing.usd_per_kwh if pricing is not None else None,
        missing=missing,
    )

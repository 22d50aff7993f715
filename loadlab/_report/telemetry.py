"""The GPU telemetry plot of the HTML report: each GPU's utilisation, memory, power, SM clock
and temperature over the run, on the time axis of the latency timeline (the measurement
window shaded green, the idle baseline before it grey).

Example::

    uri = gpu_plot(read_results("reports/run.json"))   # None: the run has no GPU telemetry
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import matplotlib

from loadlab._analysis.telemetry import GPU_FIELDS, gpu_label, telemetry_of
from loadlab._report.plots import _RC, _figure, _uri

if TYPE_CHECKING:
    from loadlab.results import Results

__all__ = ["gpu_plot"]

PANELS = {
    "gpu_util_pct": "utilisation",
    "memory_used_mib": "memory used",
    "power_w": "power",
    "sm_clock_mhz": "SM clock",
    "temperature_c": "temperature",
}


def gpu_plot(results: Results) -> str | None:
    """One panel per quantity any GPU reported, one line per GPU; ``None`` without telemetry."""
    tel = telemetry_of(results)
    gpus = list(tel.get("gpus", [])) if tel else []
    shown = [f for f in PANELS if any(v is not None for g in gpus for v in g.get(f, []))]
    if tel is None or not shown:
        return None
    lo, hi = results.measurement_window_ns()
    base = tel.get("baseline_ns")
    with matplotlib.rc_context(_RC):
        fig = _figure(9, 1.5 * len(shown) + 0.8)
        axes = fig.subplots(len(shown), 1, sharex=True, squeeze=False)[:, 0]
        for ax, field in zip(axes, shown, strict=True):
            for g in gpus:
                pts = [
                    (t / 1e9, v) for t, v in zip(g["t_ns"], g[field], strict=False) if v is not None
                ]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1, label=gpu_label(g))
            ax.set_ylabel(f"{PANELS[field]} ({GPU_FIELDS[field][0]})")
            ax.axvspan(lo / 1e9, hi / 1e9, color="tab:green", alpha=0.06)
            if base:
                ax.axvspan(base[0] / 1e9, base[1] / 1e9, color="grey", alpha=0.12)
        if len(gpus) <= 8:
            axes[0].legend(loc="upper left", fontsize=7)
        axes[-1].set_xlabel("time since run start (s)  grey: idle baseline, green: window")
        return _uri(fig)

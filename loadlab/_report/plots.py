"""The report's plots (matplotlib, Agg, no pyplot state), each returned as an SVG data URI.

Text from a results file (labels, classes) is drawn as glyph outlines with mathtext off, so
no string from a run reaches the page as markup; the URI goes into ``<img src>``, where an
SVG cannot run scripts either.

Example::

    uri = latency_cdfs(read_results("reports/run.json"))   # "data:image/svg+xml;base64,..."
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")  # before any figure: never try to open a window

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from loadlab._analysis import metrics
from loadlab._analysis.server_metrics import server_series

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from loadlab.results import Results

__all__ = [
    "comparison_cdfs",
    "latency_cdfs",
    "server_side",
    "throughput_inflight",
    "timeline",
    "ttft_vs_prompt",
]

_RC: Any = {
    "svg.fonttype": "path",  # text as outlines: nothing from the data is SVG text
    "svg.hashsalt": "loadlab",  # stable ids, reproducible files
    "text.parse_math": False,  # "$" in a label is a dollar sign, not TeX
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
}
_MAX_POINTS = 3000  # scatter points per plot (seeded subsample beyond this)
_MAX_STEPS = 800  # vertices per ECDF line: the shape, not every step
LATENCY = (("TTFT", "ttft_ms"), ("ITL", "itl_ms"), ("TPOT", "tpot_ms"), ("E2E", "e2e_ms"))


def _uri(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", dpi=110, metadata={"Date": None})
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(w: float, h: float, bottom_in: float = 0.55) -> Figure:
    """Fixed margins in inches: one draw per figure (layout engines and tight bboxes draw twice,
    which doubles the report's time on a busy machine)."""
    fig = Figure(figsize=(w, h))
    fig.subplots_adjust(
        left=0.85 / w,
        right=1 - 0.2 / w,
        bottom=bottom_in / h,
        top=1 - 0.35 / h,
        hspace=0.45,
        wspace=0.22,
    )
    return fig


def _values(lat: Sequence[Any], key: str) -> np.ndarray:
    if key == "itl_ms":
        return np.asarray([g for r in lat for g in metrics.itl_ms(r)], dtype=float)
    fn = metrics.PER_REQUEST_METRICS[key]
    return np.asarray([v for v in map(fn, lat) if v is not None], dtype=float)


def _ecdf(ax: Axes, x: np.ndarray, label: str | None = None, **kw: Any) -> None:
    if x.size == 0:
        return
    xs = np.sort(x)
    ys = np.arange(1, xs.size + 1) / xs.size
    if xs.size > _MAX_STEPS:
        idx = np.unique(np.linspace(0, xs.size - 1, _MAX_STEPS).astype(int))
        xs, ys = xs[idx], ys[idx]
    ax.step(xs, ys, where="post", label=label, **kw)
    lo, hi = float(xs[0]), float(xs[-1])
    if lo > 0 and hi / lo > 30:
        ax.set_xscale("log")
        # The default log labels are mathtext ("$10^{2}$"), which parse_math=False would print
        # raw: plain numbers instead.
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())


def _sample(n: int, k: int, seed: int = 0) -> np.ndarray:
    if n <= k:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=k, replace=False))


def latency_cdfs(results: Results) -> str:
    """ECDFs of TTFT, ITL, TPOT and E2E (dashed: from the intended send time, open loop)."""
    lat = metrics.latency_records(results.records, results.measurement_window_ns())
    open_loop = any(r.intended_ns is not None for r in lat)
    with matplotlib.rc_context(_RC):
        fig = _figure(9, 5.5)
        axes = fig.subplots(2, 2)
        for ax, (title, key) in zip(axes.flat, LATENCY, strict=True):
            _ecdf(ax, _values(lat, key), label="from send")
            if open_loop and key in ("ttft_ms", "e2e_ms"):
                _ecdf(
                    ax,
                    _values(lat, key.replace("_ms", "_from_intended_ms")),
                    "from intended",
                    ls="--",
                )
                ax.legend(loc="lower right")
            ax.set_title(f"{title} (ms)")
            ax.set_ylabel("fraction of requests" if key != "itl_ms" else "fraction of gaps")
            for q in (0.5, 0.99):
                ax.axhline(q, color="grey", lw=0.6, ls=":")
        return _uri(fig)


def _in_flight(results: Results) -> tuple[np.ndarray, np.ndarray]:
    events: list[tuple[int, int]] = []
    for r in results.records:
        if r.sent_ns is None:
            continue
        end = r.end_ns or (r.chunk_ns[-1] if r.chunk_ns else r.sent_ns)
        events += [(r.sent_ns, 1), (end, -1)]
    if not events:
        return np.zeros(0), np.zeros(0)
    events.sort()
    t = np.asarray([e[0] for e in events], dtype=float) / 1e9
    return t, np.cumsum([e[1] for e in events])


def throughput_inflight(results: Results) -> str:
    """Output tokens/s per second and requests in flight, measurement window shaded."""
    lo, hi = results.measurement_window_ns()
    tp = metrics.throughput(results.records, (lo, hi))
    series = np.asarray(tp.output_tokens_per_s_series, dtype=float)
    with matplotlib.rc_context(_RC):
        fig = _figure(9, 4.5)
        ax1, ax2 = fig.subplots(2, 1, sharex=True)
        if series.size:
            ax1.step(np.arange(series.size) * tp.series_bin_s, series, where="post")
        ax1.set_ylabel("output tokens/s")
        t, n = _in_flight(results)
        if t.size:
            ax2.step(t, n, where="post", color="tab:orange")
        ax2.set_ylabel("requests in flight")
        ax2.set_xlabel("time since run start (s)")
        for ax in (ax1, ax2):
            ax.axvspan(lo / 1e9, hi / 1e9, color="tab:green", alpha=0.06, label="window")
        return _uri(fig)


def ttft_vs_prompt(results: Results) -> str | None:
    """TTFT against prompt length (server usage, else the requested length)."""
    lat = metrics.latency_records(results.records, results.measurement_window_ns())
    pts = [
        (r.prompt_tokens or r.prompt_tokens_requested, metrics.ttft_ms(r))
        for r in lat
        if (r.prompt_tokens or r.prompt_tokens_requested) and metrics.ttft_ms(r) is not None
    ]
    if not pts:
        return None
    idx = _sample(len(pts), _MAX_POINTS)
    x = np.asarray([pts[i][0] for i in idx], dtype=float)
    y = np.asarray([pts[i][1] for i in idx], dtype=float)
    with matplotlib.rc_context(_RC):
        fig = _figure(6, 3.8)
        ax = fig.subplots()
        ax.scatter(x, y, s=6, alpha=0.5, rasterized=True)
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("TTFT (ms)")
        return _uri(fig)


def timeline(results: Results, max_requests: int = 60) -> str | None:
    """Gantt of a sample of requests: waiting for the first token, then streaming."""
    recs = sorted(
        (r for r in results.records if r.sent_ns is not None), key=lambda r: r.sent_ns or 0
    )
    if not recs:
        return None
    sample = [recs[i] for i in np.unique(np.linspace(0, len(recs) - 1, max_requests).astype(int))]
    with matplotlib.rc_context(_RC):
        fig = _figure(9, max(2.5, 0.09 * len(sample) + 1.2), bottom_in=0.7)
        ax = fig.subplots()
        for y, r in enumerate(sample):
            s = (r.sent_ns or 0) / 1e9
            if r.ok and r.chunk_ns:
                first, last = r.chunk_ns[0] / 1e9, r.chunk_ns[-1] / 1e9
                ax.barh(y, first - s, left=s, color="#f4b183", height=0.8)
                ax.barh(y, max(last - first, 1e-4), left=first, color="#4472c4", height=0.8)
            else:
                end = (r.end_ns or (r.chunk_ns[-1] if r.chunk_ns else r.sent_ns or 0)) / 1e9
                ax.barh(y, max(end - s, 1e-4), left=s, color="#c00000", height=0.8)
        ax.set_yticks([])
        ax.set_ylabel(f"{len(sample)} of {len(recs)} requests")
        ax.set_xlabel(
            "time since run start (s)  orange: waiting for the first token, "
            "blue: streaming, red: failed"
        )
        ax.invert_yaxis()
        return _uri(fig)


def server_side(results: Results) -> str | None:
    """TTFT and ITL against the server's queue depth, running batch, KV use and prefix-cache hit
    rate, one time axis."""
    series = server_series(results.server_samples)
    if not series:
        return None
    lat = metrics.latency_records(results.records, results.measurement_window_ns())
    ttft = [((r.sent_ns or 0) / 1e9, metrics.ttft_ms(r)) for r in lat]
    itl = [(r.chunk_ns[i] / 1e9, g) for r in lat for i, g in enumerate(metrics.itl_ms(r), 1)]
    panels: list[tuple[str, Any]] = [("TTFT (ms)", ttft), ("ITL (ms)", itl)]
    titles = {
        "queue_depth": "queue depth",
        "running_batch": "running batch",
        "kv_cache_use": "KV-cache use",
        "prefix_cache_hit_rate": "prefix-cache hits",
    }
    for key in titles:
        if key in series:
            panels.append((titles[key], series[key]))
    with matplotlib.rc_context(_RC):
        fig = _figure(9, 1.6 * len(panels) + 0.6)
        axes = fig.subplots(len(panels), 1, sharex=True)
        for ax, (title, data) in zip(axes, panels, strict=True):
            if isinstance(data, tuple):  # a server series: (t_s, values, source)
                ax.step(data[0], data[1], where="post", color="tab:purple")
            elif data:
                idx = _sample(len(data), _MAX_POINTS)
                ax.scatter(
                    [data[i][0] for i in idx],
                    [data[i][1] for i in idx],
                    s=4,
                    alpha=0.5,
                    rasterized=True,
                )
            ax.set_ylabel(title)
        axes[-1].set_xlabel("time since run start (s)")
        return _uri(fig)


def comparison_cdfs(runs: Sequence[Results], labels: Sequence[str]) -> str:
    """ECDFs of TTFT, ITL, TPOT and E2E, one line per run."""
    with matplotlib.rc_context(_RC):
        fig = _figure(9, 5.5)
        axes = fig.subplots(2, 2)
        for ax, (title, key) in zip(axes.flat, LATENCY, strict=True):
            for r, label in zip(runs, labels, strict=True):
                lat = metrics.latency_records(r.records, r.measurement_window_ns())
                _ecdf(ax, _values(lat, key), label=label)
            ax.set_title(f"{title} (ms)")
            ax.legend(loc="lower right")
        return _uri(fig)

"""A predicted sweep beside a measured one: SLO-max loads with their error, and each latency
metric's p50 / p90 / p99 against load, measured (solid) and predicted (dashed).

Used by ``loadlab sweep --predict``. Example::

    text = versus_text(measured, predicted, curves)
    html = versus_html(measured, predicted, curves)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loadlab._runner.sweep import SweepResult

__all__ = [
    "METRICS",
    "PERCENTILES",
    "curves_of",
    "max_load_error_pct",
    "versus_html",
    "versus_text",
]

METRICS = ("ttft_ms", "itl_ms", "e2e_ms")
PERCENTILES = ("p50", "p90", "p99")

# {"measured" | "predicted": {load: {metric: {percentile: ms}}}}
Curves = Mapping[str, Mapping[float, Mapping[str, Mapping[str, float | None]]]]


def curves_of(results_by_load: Mapping[float, Any]) -> dict[float, dict[str, dict[str, Any]]]:
    """Each load's metric percentiles, from its results (measured or predicted)."""
    from loadlab._analysis.summary import summarize

    out: dict[float, dict[str, dict[str, Any]]] = {}
    for load, res in sorted(results_by_load.items()):
        s = summarize(res)
        out[float(load)] = {
            m: {p: s.latency(m).at(float(p[1:])) for p in PERCENTILES} for m in METRICS
        }
    return out


def max_load_error_pct(measured: SweepResult, predicted: SweepResult) -> float | None:
    """(predicted - measured) / measured SLO-max load, in %; None when either has none."""
    m, p = measured.max_passing_load, predicted.max_passing_load
    if not m or p is None:
        return None
    return (p - m) / m * 100.0


def versus_text(measured: SweepResult, predicted: SweepResult, curves: Curves) -> str:
    unit = "rps" if measured.mode == "rate" else "streams"
    err = max_load_error_pct(measured, predicted)
    lines = [
        f"highest load meeting the SLOs: measured {_num(measured.max_passing_load)} {unit}, "
        f"predicted {_num(predicted.max_passing_load)} {unit}"
        + ("" if err is None else f" (error {err:+.1f} %)"),
        "",
        f"{'load':>8} {'metric':<8} {'measured p50 / p90 / p99':>28} {'predicted p50 / p90 / p99':>28}",
    ]
    meas, pred = curves.get("measured", {}), curves.get("predicted", {})
    for load in sorted(set(meas) & set(pred)):
        for m in METRICS:
            lines.append(f"{_num(load):>8} {m.removesuffix('_ms'):<8} "
                         f"{_triple(meas[load][m]):>28} {_triple(pred[load][m]):>28}")  # fmt: skip
    return "\n".join(lines)


def versus_html(measured: SweepResult, predicted: SweepResult, curves: Curves) -> str:
    """A standalone page: one panel per metric, percentiles against load, both sweeps."""
    import base64
    import html
    import io

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 3.6))
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.15, top=0.88, wspace=0.25)
    axes = fig.subplots(1, len(METRICS))
    colors = {"p50": "tab:blue", "p90": "tab:orange", "p99": "tab:red"}
    for ax, m in zip(axes, METRICS, strict=True):
        for kind, style in (("measured", "o-"), ("predicted", "s--")):
            data = curves.get(kind, {})
            loads = sorted(data)
            for p in PERCENTILES:
                ys = [data[x][m][p] for x in loads]
                ax.plot(loads, [float("nan") if y is None else y for y in ys], style,
                        color=colors[p], ms=4, label=f"{kind} {p}")  # fmt: skip
        ax.set(xlabel=measured.mode, ylabel="ms", title=m.removesuffix("_ms").upper())
        ax.set_yscale("log")
    axes[0].legend(fontsize=7, loc="upper left")
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "loadlab",
                                "text.parse_math": False}):  # fmt: skip
        buf = io.BytesIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    uri = "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
    body = versus_text(measured, predicted, curves)
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>loadlab sweep: measured vs "
        "predicted</title></head><body><h1>measured (solid) vs predicted (dashed)</h1>"
        f"<img alt='percentiles against load' src='{uri}'><pre>{html.escape(body)}</pre>"
        f"<h2>predicted sweep</h2><pre>{html.escape(predicted.to_text())}</pre></body></html>"
    )


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def _triple(d: Mapping[str, float | None]) -> str:
    return " / ".join("-" if d[p] is None else f"{d[p]:.1f}" for p in PERCENTILES)

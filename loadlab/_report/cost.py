"""The cost and energy of a run, as report lines and table rows (``loadlab._analysis.cost``,
``loadlab._analysis.telemetry``).

Example::

    print("\\n".join(cost_lines(read_results("reports/run.json"))))
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from loadlab._analysis.cost import CostSummary, cost_of, pricing_of
from loadlab._analysis.telemetry import EnergySummary, energy_of

if TYPE_CHECKING:
    from loadlab.results import Results

__all__ = ["cost_lines", "cost_rows", "energy_rows", "usd"]


def fmt_num(v: float | None, digits: int = 1) -> str:
    """``1,234.5``; ``-`` for ``None`` (``report.text`` shows this module's lines)."""
    if v is None:
        return "-"
    return f"{v:,.{digits}f}" if abs(v) >= 1 or v == 0 else f"{v:.3g}"


def usd(v: float | None) -> str:
    """Dollars to about three significant digits; ``-`` for ``None``.

    >>> [usd(x) for x in (1234.5, 1.2345, 0.012345, 0.00009181, None)]
    ['$1,234.50', '$1.234', '$0.01235', '$0.0000918', '-']
    """
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"${v:,.2f}"
    if v == 0 or abs(v) >= 0.01:
        return f"${v:.4g}"
    return f"${v:.{2 - math.floor(math.log10(abs(v)))}f}"  # $0.0000918, not $9.18e-05


def _basis(c: CostSummary) -> str:
    if c.kind == "api":
        cached = f", {c.cached_input_tokens:,} of them cached" if c.cached_input_tokens else ""
        return (
            f"{c.requests:,} ok requests in the window: {c.input_tokens:,} input tokens{cached}, "
            f"{fmt_num(c.output_tokens)} output tokens ({c.usage_requests:,} counted by the "
            "server's usage)"
        )
    return (
        f"{fmt_num(c.hours * 3600, 2)} s of the window: {fmt_num(c.output_tokens)} output "
        f"tokens, {c.requests:,} requests, {c.sessions:,} sessions completed"
    )


def cost_rows(results: Results) -> list[tuple[str, str]]:
    """(label, value) rows of the run's cost; empty without prices."""
    pricing = pricing_of(results)
    c = cost_of(results)
    if pricing is None or c is None:
        return []
    return [
        ("prices", pricing.describe()),
        ("bill", f"{usd(c.usd)} for {_basis(c)}"),
        ("per million output tokens", usd(c.usd_per_million_output_tokens)),
        ("per 1,000 requests", usd(c.usd_per_1k_requests)),
        ("per session", f"{usd(c.usd_per_session)} ({c.sessions:,} sessions)"),
    ]


def energy_rows(e: EnergySummary) -> list[tuple[str, str]]:
    """(label, value) rows of a run's energy: totals, per token and request, per GPU."""
    if e.missing:
        return [("energy", e.missing)]
    base = (
        f"idle baseline {fmt_num(e.baseline_s, 1)} s before the load"
        if e.baseline_s
        else "no idle baseline (--gpu-baseline 0)"
    )
    rows = [
        (
            "energy",
            f"{fmt_num(e.joules)} J over {fmt_num(e.window_s, 2)} s on "
            f"{len(e.gpus)} GPU(s); {fmt_num(e.joules_above_idle)} J above idle ({base})",
        ),
        (
            "per output token",
            f"{fmt_num(e.joules_per_output_token, 3)} J, above idle "
            f"{fmt_num(e.joules_per_output_token_above_idle, 3)} J",
        ),
        (
            "per request",
            f"{fmt_num(e.joules_per_request, 2)} J, above idle "
            f"{fmt_num(e.joules_per_request_above_idle, 2)} J",
        ),
    ]
    if e.usd is not None:
        rows.append(("electricity", f"{usd(e.usd)} ({fmt_num(e.kwh, 4)} kWh at "
                                    f"${e.usd_per_kwh:g}/kWh)"))  # fmt: skip
    for g in e.gpus:
        idle = (
            f"idle {fmt_num(g.idle_w)} W ({g.idle_samples} samples)"
            if g.idle_w is not None
            else "no idle baseline"
        )
        counter = (
            f"; its energy counter: {fmt_num(g.counter_joules)} J"
            if g.counter_joules is not None
            else ""
        )
        cover = f"; samples cover {g.coverage:.0%} of the window" if g.coverage < 0.95 else ""
        rows.append(
            (g.gpu, f"{fmt_num(g.joules)} J, mean {fmt_num(g.mean_w)} W, {idle}{counter}{cover}")
        )
    return rows


def cost_lines(results: Results) -> list[str]:
    """The summary's ``cost`` and ``energy`` paragraphs (none without prices or telemetry)."""
    out = []
    rows = cost_rows(results)
    if rows:
        out.append("cost        " + "\n            ".join(f"{k}: {v}" for k, v in rows))
    e = energy_of(results)
    if e is not None:
        out.append("energy      " + "\n            ".join(f"{k}: {v}" for k, v in energy_rows(e)))
    return out

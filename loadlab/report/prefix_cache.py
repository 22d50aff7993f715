"""The report's prefix-cache section: expected beside measured hit rate, TTFT cached vs not.

One list of rows (``prefix_cache_rows``) that the text, Markdown and HTML reports each lay
out; the figures come from ``loadlab.analysis.prefix_cache``.

Example::

    pc = prefix_cache_summary(results)
    for label, value in prefix_cache_rows(pc): print(label, value)
"""

from __future__ import annotations

from loadlab.analysis.metrics import Distribution
from loadlab.analysis.prefix_cache import PrefixCacheSummary

__all__ = ["WARM_PP", "prefix_cache_rows", "render_prefix_cache_text"]

WARM_PP = 2.0  # measured this far from expected is worth a sentence (the acceptance bound)


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.1f} %"


def _ttft(d: Distribution) -> str:
    if not d.count:
        return "-"
    p50, p99 = d.at(50), d.at(99)
    return f"p50 {p50 or 0:.1f} ms  p99 {p99 or 0:.1f} ms  (n {d.count:,})"


def prefix_cache_rows(pc: PrefixCacheSummary) -> list[tuple[str, str]]:
    """(label, value) rows: expected, measured by the server's counters and by usage, their
    difference, and TTFT of cached and uncached requests."""
    aligned = (
        f"{pc.block_size}-token blocks" if pc.block_size else "token-exact: block size not given"
    )
    rows = [("expected hit rate", f"{_pct(pc.expected_hit_rate)} ({aligned})")]
    server = _pct(pc.server_hit_rate)
    if pc.server_source:
        server += f" ({pc.server_source}, {pc.server_queries or 0:,.0f} prompt tokens)"
    rows.append(("measured, server counters", server))
    rows.append(("measured, usage cached tokens", _pct(pc.usage_hit_rate)))
    if pc.difference_pp is not None:
        note = ""
        if pc.difference_pp > WARM_PP and not pc.cache_bust:
            note = ": the server had prefixes cached before the run; --cache-bust starts cold"
        elif pc.difference_pp < -WARM_PP:
            note = ": fewer hits than the prompts allow (evictions? a cache too small?)"
        rows.append(("measured - expected", f"{pc.difference_pp:+.1f} pp{note}"))
    rows.append(("TTFT, cached requests", _ttft(pc.ttft_cached_ms)))
    rows.append(("TTFT, uncached requests", _ttft(pc.ttft_uncached_ms)))
    if pc.basis:
        rows.append(("shared prefixes counted", pc.basis))
    return rows


def render_prefix_cache_text(pc: PrefixCacheSummary) -> str:
    """The section as aligned text lines under a ``prefix cache`` heading."""
    rows = prefix_cache_rows(pc)
    width = max(len(label) for label, _ in rows)
    return "prefix cache\n" + "\n".join(f"  {label:<{width}}  {value}" for label, value in rows)

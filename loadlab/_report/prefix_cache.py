"""The report's prefix-cache section: expected beside measured hit rate, TTFT cached vs not.

One list of rows (``prefix_cache_rows``) that the text, Markdown and HTML reports each lay
out; the figures come from ``loadlab._analysis.prefix_cache``.

Example::

    pc = prefix_cache_summary(results)
    for label, value in prefix_cache_rows(pc): print(label, value)
"""

from __future__ import annotations

from loadlab._analysis.metrics import Distribution
from loadlab._analysis.prefix_cache import PrefixCacheSummary, TTFTSplit

__all__ = ["WARM_PP", "prefix_cache_rows", "render_prefix_cache_text"]

WARM_PP = 2.0  # measured this far from expected is worth a sentence (the acceptance bound)


def _pct(rate: float | None, why: str = "") -> str:
    if rate is not None:
        return f"{rate * 100:.1f} %"
    return f"- ({why})" if why else "-"


def _ttft(d: Distribution, empty: str) -> str:
    if not d.count:
        return f"- ({empty})"
    p50, p99 = d.at(50), d.at(99)
    return f"p50 {p50 or 0:.1f} ms  p99 {p99 or 0:.1f} ms  (n {d.count:,})"


def _group(d: Distribution, prompt_p50: float | None, turns: tuple[int, int] | None,
           empty: str) -> str:  # fmt: skip
    """One group's TTFT with what its requests were: prompt length and turns."""
    text = _ttft(d, empty)
    if not d.count or prompt_p50 is None:
        return text
    what = f"prompts p50 {prompt_p50:,.0f} tokens"
    if turns is not None and turns[1] > 0:
        first, last = turns
        what += f", turn {first}" if first == last else f", turns {first}-{last}"
    return text[:-1] + f"; {what})"


def _like_for_like(t: TTFTSplit) -> str | None:
    """The comparison of the two groups over prompts of like length, or why there is none."""
    if not (t.cached_ms.count and t.uncached_ms.count):
        return None
    a, b = t.matched_cached_ms, t.matched_uncached_ms
    if not (a.count and b.count):
        return ("not compared: no turn and prompt length (within x1.4) holds both groups; "
                "the cached requests differ in more than their cache (longer prompts, later "
                "turns sent under other load), so their TTFT above is not the cache's effect")  # fmt: skip
    ca, ub = a.at(50) or 0.0, b.at(50) or 0.0
    ratio = f" = {ca / ub:.2f}x" if ub > 0 else ""
    p = t.matched_p_value
    if p is None:
        verdict = "too few requests to tell a difference"
    elif p >= 0.05:
        verdict = f"no difference shown (Mann-Whitney p {p:.2g})"
    else:
        verdict = f"cached {'faster' if ca < ub else 'slower'} (Mann-Whitney p {p:.2g})"
    return (f"p50 {ca:.1f} vs {ub:.1f} ms{ratio}: {verdict}; n {a.count:,} vs {b.count:,}, "
            "over the turns and prompt lengths that hold both groups")  # fmt: skip


def prefix_cache_rows(pc: PrefixCacheSummary) -> list[tuple[str, str]]:
    """(label, value) rows: expected, measured by the server's counters and by usage, their
    difference, and TTFT of cached and uncached requests, each empty figure with its reason."""
    if pc.block_size:
        who = " (the server's block_size)" if pc.block_size_source == "server" else ""
        aligned = f"{pc.block_size}-token blocks{who}"
    else:
        aligned = "token-exact: block size unknown; give --cache-block-size B"
    expected = (f"{_pct(pc.expected_hit_rate)} ({aligned})" if pc.expected_hit_rate is not None
                else "- (only a shared-prefix workload (--prefix-tokens, kind = \"prefix\") "
                "says which prompt tokens an earlier prompt had)")  # fmt: skip
    rows = [("expected hit rate", expected)]
    if pc.server_source:
        server = _pct(pc.server_hit_rate, "no prompt tokens queried")
        server += f" ({pc.server_source}, {pc.server_queries or 0:,.0f} prompt tokens)"
    elif pc.scraped:
        server = "- (the scraped /metrics has no prefix-cache hit and query counters)"
    else:
        server = "- (not scraped: add --scrape URL/metrics for the server's hit counters)"
    rows.append(("measured, server counters", server))
    rows.append(("measured, usage cached tokens",
                 _pct(pc.usage_hit_rate, "the server reported no cached tokens in its usage")))  # fmt: skip
    if pc.difference_pp is not None:
        note = ""
        if pc.difference_pp > WARM_PP and not pc.cache_bust:
            note = ": the server had prefixes cached before the run; --cache-bust starts cold"
        elif pc.difference_pp < -WARM_PP:
            note = ": fewer hits than the prompts allow (evictions? a cache too small?)"
        rows.append(("measured - expected", f"{pc.difference_pp:+.1f} pp{note}"))
    t = pc.ttft
    rows.append(("TTFT, cached requests", _group(t.cached_ms, t.cached_prompt_p50,
                 t.cached_turns, "no request reported cached tokens")))  # fmt: skip
    rows.append(("TTFT, uncached requests", _group(t.uncached_ms, t.uncached_prompt_p50,
                 t.uncached_turns, "every request had cached tokens, or none said")))  # fmt: skip
    same = _like_for_like(t)
    if same is not None:
        rows.append(("TTFT cached vs uncached, like for like", same))
    if pc.basis:
        rows.append(("shared prefixes counted", pc.basis))
    return rows


def render_prefix_cache_text(pc: PrefixCacheSummary) -> str:
    """The section as aligned text lines under a ``prefix cache`` heading."""
    rows = prefix_cache_rows(pc)
    width = max(len(label) for label, _ in rows)
    return "prefix cache\n" + "\n".join(f"  {label:<{width}}  {value}" for label, value in rows)

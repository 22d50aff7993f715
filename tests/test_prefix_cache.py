"""Expected and measured prefix-cache hit rates, against hand-computed values."""

from __future__ import annotations

from typing import Any

from loadlab._analysis.prefix_cache import (
    expected_cached_tokens,
    expected_hit_rate,
    server_hit_rate,
    usage_hit_rate,
)
from loadlab.records import RequestRecord


def rec(prompt: int, shared: int | None = None, cached: int | None = None, outcome: str = "ok") -> RequestRecord:  # fmt: skip
    return RequestRecord("r", outcome=outcome, prompt_tokens=prompt, shared_prefix_tokens=shared,
                         cached_prompt_tokens=cached)  # fmt: skip


def test_expected_cached_tokens_block_aligned_and_last_token_computed() -> None:
    assert expected_cached_tokens(1024, 1088, 16) == 1024
    assert expected_cached_tokens(1030, 1088, 16) == 1024
    assert expected_cached_tokens(64, 64, 16) == 48  # all seen: 63 usable -> 3 blocks
    assert expected_cached_tokens(64, 64, None) == 63
    assert expected_cached_tokens(15, 100, 16) == 0


def test_expected_hit_rate_of_a_prefix_pool() -> None:
    # 2 prefixes x 4 requests, 256-token prefix + 32-token suffix: 6 of 8 hit 256 tokens.
    records = [rec(288, 0), *(rec(288, 260) for _ in range(3))] * 2
    assert expected_hit_rate(records, 16) == 6 * 256 / (8 * 288)
    assert expected_hit_rate(records, None) == 6 * 260 / (8 * 288)
    failed = [*records, rec(288, 260, outcome="timeout")]  # not admitted: not counted
    assert expected_hit_rate(failed, 16) == expected_hit_rate(records, 16)
    assert expected_hit_rate([rec(10)], 16) is None


def test_usage_hit_rate_over_records_that_said() -> None:
    assert usage_hit_rate([rec(100, cached=0), rec(100, cached=64), rec(100)]) == 64 / 200
    assert usage_hit_rate([rec(100)]) is None


def sample(t_s: float, **metrics: float) -> dict[str, Any]:
    return {"t_ns": int(t_s * 1e9), "metrics": metrics}


def test_server_hit_rate_from_counter_increases_summed_over_labels() -> None:
    hits, queries = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
    e0, e1 = '{engine="0"}', '{engine="1"}'
    samples = [
        sample(0, **{hits + e0: 100.0, queries + e0: 400.0}),
        sample(1, **{hits + e0: 400.0, hits + e1: 100.0, queries + e0: 800.0, queries + e1: 200.0}),
    ]
    rate, n, source = server_hit_rate(samples) or (None, 0, "")
    assert (rate, n) == (400 / 600, 600) and source.startswith("vllm:prefix_cache_hits")
    ref = [sample(t, loadlab_server_prefix_cache_hits_total=h,
                  loadlab_server_prefix_cache_queries_total=q)
           for t, h, q in ((0, 0, 0), (1, 0, 0))]  # fmt: skip
    assert server_hit_rate(ref) == (None, 0, "loadlab_server_prefix_cache_hits_total / "
                                             "loadlab_server_prefix_cache_queries_total")  # fmt: skip
    assert server_hit_rate(ref[:1]) is None and server_hit_rate([sample(0, other=1)]) is None


def timed(prompt: int, cached: int, ttft_ms: float, turn: int = 0) -> RequestRecord:
    """An ok streamed request sent at 0 whose first token came after ``ttft_ms``."""
    return RequestRecord("r", prompt_tokens=prompt, cached_prompt_tokens=cached, turn=turn,
                         sent_ns=0, chunk_ns=[int(ttft_ms * 1e6)], output_tokens=1)  # fmt: skip


def test_cached_and_uncached_ttft_are_compared_only_over_prompts_of_like_length() -> None:
    """A chat run's cached requests are later turns with longer prompts: their raw TTFT is no
    measure of the cache. The like-for-like figures keep only prompt-length bands holding
    both groups; none such, and the rows say so instead of a comparison."""
    from loadlab._analysis.prefix_cache import PrefixCacheSummary, ttft_split
    from loadlab._report.prefix_cache import prefix_cache_rows

    first = [timed(64, 0, 30.0 + i) for i in range(6)]  # turn 0: short, uncached
    later = [timed(162, 96, 48.0 + i, turn=1) for i in range(6)]  # turn 1: long, cached
    split = ttft_split(first + later)
    assert (split.cached_prompt_p50, split.uncached_prompt_p50) == (162, 64)
    assert (split.cached_turns, split.uncached_turns) == ((1, 1), (0, 0))
    assert split.matched_cached_ms.count == split.matched_uncached_ms.count == 0

    def rows(split):  # type: ignore[no-untyped-def]
        pc = PrefixCacheSummary(None, None, "", False, 0.5, None, None, None, split)
        return dict(prefix_cache_rows(pc))

    shown = rows(split)
    assert "prompts p50 162 tokens, turn 1" in shown["TTFT, cached requests"]
    assert shown["TTFT, uncached requests"].endswith("prompts p50 64 tokens)")
    assert shown["TTFT cached vs uncached, like for like"].startswith("not compared")
    # long first messages too: still no like for like, the cached requests are later turns
    long_first = [timed(170, 0, 90.0 + i) for i in range(6)]
    assert ttft_split(first + later + long_first).matched_cached_ms.count == 0
    # first turns of one length, some with a prefix cached (a shared system prompt): compared
    # where turn and length band agree; the 1,000-token prompt and the later turns left out
    warm_first = [timed(162, 96, 48.0 + i) for i in range(6)]
    other = [timed(1000, 0, 400.0)]
    split = ttft_split(first + later + long_first + warm_first + other)
    assert split.matched_cached_ms.count == 6 and split.matched_uncached_ms.count == 6
    assert split.matched_uncached_ms.at(50) == 92.5 and split.matched_cached_ms.at(50) == 50.5
    same = rows(split)["TTFT cached vs uncached, like for like"]
    assert same.startswith("p50 50.5 vs 92.5 ms = 0.55x: cached faster (Mann-Whitney p")

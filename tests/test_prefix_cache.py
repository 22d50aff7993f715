"""Expected and measured prefix-cache hit rates, against hand-computed values."""

from __future__ import annotations

from typing import Any

from loadlab.analysis.prefix_cache import (
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

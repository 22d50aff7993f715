"""Prefix-cache hit rates of a run: expected from its own prompts, measured two ways.

Three numbers, each a fraction of prompt tokens (vLLM's definition: hits / queries, in tokens):

- **expected**: ``sum(expected_cached_tokens(r)) / sum(prompt tokens)`` over the ok records
  that say how much of their prompt an earlier prompt had (``shared_prefix_tokens``, set by a
  ``prefix`` workload). A server computes the last prompt token whatever it has cached (its
  logits give the first output token) and caches whole blocks, so a request can hit at most
  ``min(shared, prompt - 1) // block_size * block_size`` tokens; with no block size known the
  figure is token-exact (a 1-token block) and says so. It assumes nothing is evicted.
- **measured (usage)**: ``sum(cached_prompt_tokens) / sum(prompt_tokens)`` over the ok records
  whose server reported cached tokens (OpenAI ``prompt_tokens_details.cached_tokens``,
  Anthropic ``cache_read_input_tokens``).
- **measured (server)**: the increase of the server's hit and query counters from the first
  to the last ``/metrics`` sample of the run (``--scrape``): vLLM's
  ``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total`` (or their ``gpu_``
  forms) or the reference server's ``loadlab_server_prefix_cache_*_total``.

TTFT is split between requests served partly from the cache (``cached_prompt_tokens > 0``)
and those that were not (``== 0``), from the latency population of the summary.

Example::

    pc = prefix_cache_summary(read_results("reports/run.json"))
    if pc is not None:
        print(pc.expected_hit_rate, pc.server_hit_rate, pc.ttft_cached_ms.at(50))
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from loadlab.analysis import vectors
from loadlab.analysis.columns import NONE, RecordColumns, columns_of
from loadlab.analysis.metrics import Distribution, distribution
from loadlab.records import RequestRecord, pick

if TYPE_CHECKING:
    from loadlab.results import Results

__all__ = [
    "SERVER_COUNTERS",
    "PrefixCacheSummary",
    "expected_cached_tokens",
    "expected_hit_rate",
    "prefix_cache_summary",
    "server_hit_rate",
    "usage_hit_rate",
]

# (hits, queries) counter names, first present wins: vLLM v1, vLLM's older gpu_ names,
# the reference server.
SERVER_COUNTERS = (
    ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
    ("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total"),
    ("loadlab_server_prefix_cache_hits_total", "loadlab_server_prefix_cache_queries_total"),
)


def expected_cached_tokens(shared_tokens: int, prompt_tokens: int, block_size: int | None) -> int:
    """Prompt tokens a cache with ``block_size``-token blocks can serve when the first
    ``shared_tokens`` were seen before: the last prompt token is always computed.

    >>> expected_cached_tokens(1034, 1088, 16), expected_cached_tokens(1034, 1088, None)
    (1024, 1034)
    >>> expected_cached_tokens(74, 74, 16)   # the whole prompt seen: 73 usable, 4 blocks
    64
    """
    usable = max(0, min(shared_tokens, prompt_tokens - 1))
    return usable // block_size * block_size if block_size else usable


def _prompt_tokens(cols: RecordColumns) -> np.ndarray:
    """Each record's prompt: the server's count, else the requested one, else 0."""
    counted, asked = cols.ints["prompt_tokens"], cols.ints["prompt_tokens_requested"]
    return np.where((counted != NONE) & (counted != 0), counted, np.where(asked != NONE, asked, 0))


def _rate(hits: np.ndarray, queries: np.ndarray) -> float | None:
    total = int(queries.sum())
    return int(hits.sum()) / total if total else None


def expected_hit_rate(records: Iterable[RequestRecord], block_size: int | None) -> float | None:
    """Expected fraction of prompt tokens served from the cache (module docstring), over the
    ok records with a ``shared_prefix_tokens``; None when there are none.

    Reads the server's prompt count when it gave one, so a chat template's tokens are in the
    denominator as in the server's query counter."""
    cols = columns_of(records if isinstance(records, Sequence) else list(records))
    n, shared = _prompt_tokens(cols), cols.ints["shared_prefix_tokens"]
    use = cols.ok & (shared != NONE) & (n != 0)
    usable = np.maximum(0, np.minimum(shared[use], n[use] - 1))  # expected_cached_tokens
    hits = usable // block_size * block_size if block_size else usable
    return _rate(hits, n[use])


def usage_hit_rate(records: Iterable[RequestRecord]) -> float | None:
    """Fraction of prompt tokens the server reported cached, over the ok records that said."""
    cols = columns_of(records if isinstance(records, Sequence) else list(records))
    n, cached = _prompt_tokens(cols), cols.ints["cached_prompt_tokens"]
    use = cols.ok & (cached != NONE) & (n != 0)
    return _rate(cached[use], n[use])


def _total(metrics: Mapping[str, float], name: str) -> float | None:
    vals = [v for k, v in metrics.items() if k.split("{", 1)[0] == name]
    return sum(vals) if vals else None


def server_hit_rate(
    samples: Sequence[Mapping[str, Any]],
) -> tuple[float | None, float, str] | None:
    """``(hit rate, queries, source)`` from the counters' increase over the samples (first
    to last; the hit rate is None when nothing was queried); None without the counters or
    with fewer than two samples."""
    for hits_name, queries_name in SERVER_COUNTERS:
        pairs = []
        for s in samples:
            m = s.get("metrics", {})
            h, q = _total(m, hits_name), _total(m, queries_name)
            if h is not None and q is not None:
                pairs.append((h, q))
        if len(pairs) >= 2:
            dh, dq = pairs[-1][0] - pairs[0][0], pairs[-1][1] - pairs[0][1]
            return (dh / dq if dq > 0 else None), dq, f"{hits_name} / {queries_name}"
    return None


@dataclass(frozen=True)
class PrefixCacheSummary:
    """Expected and measured hit rates (fractions of prompt tokens) and TTFT split (ms)."""

    expected_hit_rate: float | None
    block_size: int | None  # what the expected rate is aligned to (None: token-exact)
    basis: str  # how shared prefixes were counted (the workload says)
    cache_bust: bool  # the workload salted its prompts for a cold start
    usage_hit_rate: float | None
    server_hit_rate: float | None
    server_queries: float | None
    server_source: str | None
    ttft_cached_ms: Distribution
    ttft_uncached_ms: Distribution

    @property
    def difference_pp(self) -> float | None:
        """Measured (server, else usage) minus expected, in percentage points."""
        measured = self.server_hit_rate if self.server_hit_rate is not None else self.usage_hit_rate
        if measured is None or self.expected_hit_rate is None:
            return None
        return (measured - self.expected_hit_rate) * 100

    def to_dict(self) -> dict[str, Any]:
        return {
            **pick(
                self,
                "expected_hit_rate block_size basis cache_bust usage_hit_rate "
                "server_hit_rate server_queries server_source difference_pp",
            ),
            "ttft_cached_ms": self.ttft_cached_ms.to_dict(),
            "ttft_uncached_ms": self.ttft_uncached_ms.to_dict(),
        }


def prefix_cache_summary(results: Results) -> PrefixCacheSummary | None:
    """The run's prefix-cache figures; None when it has none of them (no shared-prefix
    workload, no cached tokens reported, no counters scraped)."""
    records = results.records
    workload = results.extra.get("workload") or {}
    block_size = workload.get("block_size") if isinstance(workload.get("block_size"), int) else None
    expected = expected_hit_rate(records, block_size)
    usage = usage_hit_rate(records)
    server = server_hit_rate(results.server_samples)
    if expected is None and usage is None and (server is None or server[0] is None):
        return None
    cols = columns_of(records)
    lat = vectors.latency_mask(cols, results.measurement_window_ns())
    ttft, said = vectors.per_request(cols, "ttft_ms"), cols.ints["cached_prompt_tokens"]
    timed = lat & ~np.isnan(ttft)
    cached, uncached = ttft[timed & (said > 0)], ttft[timed & (said == 0)]
    basis = str(workload.get("shared_prefix_basis") or "")
    return PrefixCacheSummary(
        expected_hit_rate=expected,
        block_size=block_size,
        basis=basis,
        cache_bust=bool(workload.get("cache_bust")),
        usage_hit_rate=usage,
        server_hit_rate=server[0] if server else None,
        server_queries=server[1] if server else None,
        server_source=server[2] if server else None,
        ttft_cached_ms=distribution(cached),
        ttft_uncached_ms=distribution(uncached),
    )

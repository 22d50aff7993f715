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
and those that were not (``== 0``), from the latency population of the summary. The two
groups are rarely alike: in a chat run the cached requests are the later turns, whose prompts
carry the history (longer, and sent once the load has built up), the uncached ones the first
turns. So beside the two groups (each with its prompt length and turns) the comparison is also
made like for like (``TTFTSplit``): only over the requests whose turn and prompt-length band
(``band``: lengths within a factor of about 1.4) requests of the other group share; none such
(a chat run: every cached request a later turn), and it says it cannot be made.

The server's KV block size aligns the expected rate: the workload's ``block_size``
(``--cache-block-size``), else what the server said (``results.extra["server_info"]``,
``/v1/server_info``).

Example::

    pc = prefix_cache_summary(read_results("reports/run.json"))
    if pc is not None:
        print(pc.expected_hit_rate, pc.server_hit_rate, pc.ttft_cached_ms.at(50))
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from loadlab._analysis import vectors
from loadlab._analysis.columns import NONE, RecordColumns, columns_of
from loadlab._analysis.metrics import Distribution, distribution, percentile, ttft_ms
from loadlab.records import RequestRecord, pick

if TYPE_CHECKING:
    from loadlab.results import Results

__all__ = [
    "SERVER_COUNTERS",
    "PrefixCacheSummary",
    "TTFTSplit",
    "band",
    "expected_cached_tokens",
    "expected_hit_rate",
    "prefix_cache_summary",
    "server_hit_rate",
    "ttft_split",
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


def _prompt_tokens(r: RequestRecord) -> int:
    return r.prompt_tokens or r.prompt_tokens_requested or 0


def _prompt_tokens_of(cols: RecordColumns) -> np.ndarray:
    """``_prompt_tokens`` of every record: the server's count, else the requested, else 0."""
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
    n, shared = _prompt_tokens_of(cols), cols.ints["shared_prefix_tokens"]
    use = cols.ok & (shared != NONE) & (n != 0)
    usable = np.maximum(0, np.minimum(shared[use], n[use] - 1))  # expected_cached_tokens
    hits = usable // block_size * block_size if block_size else usable
    return _rate(hits, n[use])


def usage_hit_rate(records: Iterable[RequestRecord]) -> float | None:
    """Fraction of prompt tokens the server reported cached, over the ok records that said."""
    cols = columns_of(records if isinstance(records, Sequence) else list(records))
    n, cached = _prompt_tokens_of(cols), cols.ints["cached_prompt_tokens"]
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


def band(prompt_tokens: int) -> int:
    """The prompt-length band of a request: lengths within a factor of sqrt(2) share one.

    >>> band(64), band(90), band(91), band(162)
    (12, 12, 13, 14)
    """
    return int(2 * math.log2(max(1, prompt_tokens)))


@dataclass(frozen=True)
class TTFTSplit:
    """TTFT of cached and uncached requests, raw and like for like (module docstring)."""

    cached_ms: Distribution
    uncached_ms: Distribution
    cached_prompt_p50: float | None  # prompt tokens of each group (median)
    uncached_prompt_p50: float | None
    cached_turns: tuple[int, int] | None  # (first, last) turn of each group
    uncached_turns: tuple[int, int] | None
    # over the (turn, prompt-length band) pairs holding requests of both groups only
    matched_cached_ms: Distribution
    matched_uncached_ms: Distribution
    # two-sided Mann-Whitney U of the matched groups' TTFTs: is the difference more than
    # chance? None with fewer than two requests in either
    matched_p_value: float | None = None

    def to_dict(self) -> dict[str, Any]:
        dists = "cached_ms uncached_ms matched_cached_ms matched_uncached_ms"
        return {
            **{k: getattr(self, k).to_dict() for k in dists.split()},
            **pick(
                self,
                "cached_prompt_p50 uncached_prompt_p50 cached_turns uncached_turns matched_p_value",
            ),
        }


def _turns(group: Sequence[RequestRecord]) -> tuple[int, int] | None:
    return (min(r.turn for r in group), max(r.turn for r in group)) if group else None


def ttft_split(records: Sequence[RequestRecord]) -> TTFTSplit:
    """``TTFTSplit`` of the ok, streamed ``records`` (a summary's latency population)."""
    timed = [(r, t) for r in records if (t := ttft_ms(r)) is not None]
    cached = [(r, t) for r, t in timed if (r.cached_prompt_tokens or 0) > 0]
    uncached = [(r, t) for r, t in timed if r.cached_prompt_tokens == 0]

    def like(r: RequestRecord) -> tuple[int, int]:
        return r.turn, band(_prompt_tokens(r))

    both = {like(r) for r, _ in cached} & {like(r) for r, _ in uncached}

    def matched(group: list[tuple[RequestRecord, float]]) -> list[float]:
        return [t for r, t in group if like(r) in both]

    def prompt_p50(group: list[tuple[RequestRecord, float]]) -> float | None:
        return percentile([float(_prompt_tokens(r)) for r, _ in group], 50) if group else None

    return TTFTSplit(
        cached_ms=distribution([t for _, t in cached]),
        uncached_ms=distribution([t for _, t in uncached]),
        cached_prompt_p50=prompt_p50(cached),
        uncached_prompt_p50=prompt_p50(uncached),
        cached_turns=_turns([r for r, _ in cached]),
        uncached_turns=_turns([r for r, _ in uncached]),
        matched_cached_ms=distribution(matched(cached)),
        matched_uncached_ms=distribution(matched(uncached)),
        matched_p_value=_p_value(matched(cached), matched(uncached)),
    )


def _p_value(a: Sequence[float], b: Sequence[float]) -> float | None:
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy import stats

    return float(stats.mannwhitneyu(a, b, alternative="two-sided").pvalue)


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
    ttft: TTFTSplit
    block_size_source: str = ""  # "workload" | "server" | "" (not known)
    scraped: bool = False  # the run sampled the server's /metrics (--scrape)

    @property
    def ttft_cached_ms(self) -> Distribution:
        return self.ttft.cached_ms

    @property
    def ttft_uncached_ms(self) -> Distribution:
        return self.ttft.uncached_ms

    @property
    def difference_pp(self) -> float | None:
        """Measured (server, else usage) minus expected, in percentage points."""
        measured = self.server_hit_rate if self.server_hit_rate is not None else self.usage_hit_rate
        if measured is None or self.expected_hit_rate is None:
            return None
        return (measured - self.expected_hit_rate) * 100

    def to_dict(self) -> dict[str, Any]:
        return pick(
            self,
            "expected_hit_rate block_size basis cache_bust usage_hit_rate server_hit_rate "
            "server_queries server_source difference_pp ttft_cached_ms ttft_uncached_ms ttft "
            "block_size_source",
        )


def prefix_cache_summary(results: Results) -> PrefixCacheSummary | None:
    """The run's prefix-cache figures; None when it has none of them (no shared-prefix
    workload, no cached tokens reported, no counters scraped)."""
    records = results.records
    workload = results.extra.get("workload") or {}
    block_size, source = _block_size(workload, results.extra.get("server_info") or {})
    expected = expected_hit_rate(records, block_size)
    usage = usage_hit_rate(records)
    server = server_hit_rate(results.server_samples)
    if expected is None and usage is None and (server is None or server[0] is None):
        return None
    # the split's population: the window's ok requests that said what they had cached (only
    # those are records again; a million of them are columns until here)
    cols = columns_of(records)
    said = vectors.latency_mask(cols, results.measurement_window_ns())
    said &= cols.ints["cached_prompt_tokens"] != NONE
    lat = [cols.record(int(i)) for i in np.flatnonzero(said)]
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
        ttft=ttft_split(lat),
        block_size_source=source,
        scraped=bool(results.server_samples),
    )


def _block_size(workload: Mapping[str, Any], server: Mapping[str, Any]) -> tuple[int | None, str]:
    """The KV block size the expected rate is aligned to, and who said it."""
    for said, who in (
        (workload.get("block_size"), "workload"),
        (server.get("block_size"), "server"),
    ):
        if isinstance(said, int) and not isinstance(said, bool) and said > 0:
            return said, who
    return None, ""

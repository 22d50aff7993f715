"""The metrics of ``loadlab._analysis.metrics`` over ``RecordColumns``: every record at once.

The definitions are ``metrics``' (its per-request functions are the normative ones); these
give the same values bit for bit (the same float operations in the same order,
``tests/test_vectors.py`` holds them against each other), over whole columns. A run of a
million requests is summarised in a second or two instead of minutes.

Per-request values come back as float64 [n] with NaN where the per-request function gives
None; pooled ones (ITL) as the values of the records asked for, in record order.

Example::

    cols = columns_of(results)
    ttft = per_request(cols, "ttft_ms")[latency_mask(cols, results.measurement_window_ns())]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from loadlab._analysis.columns import NONE, RecordColumns
from loadlab._analysis.metrics import (
    NS_PER_MS,
    NS_PER_S,
    PER_REQUEST_METRICS,
    Counts,
    Throughput,
    tally_outcomes,
)
from loadlab._analysis.token_checks import STOP_REASONS, PromptMatch

__all__ = [
    "count_outcomes",
    "good_mask",
    "goodput_count",
    "has_reasoning_or_tools",
    "itl_ms",
    "itl_per_token_ms",
    "itl_with_owner",
    "latency_mask",
    "per_request",
    "per_token_is_per_chunk",
    "prompt_match",
    "short_outputs",
    "stall_counts",
    "throughput",
]


def _ms(later: np.ndarray, earlier: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """(later - earlier) / 1e6 where ``valid`` (the int difference, then one division, as
    ``metrics`` computes it), NaN elsewhere."""
    out = np.full(later.shape, np.nan)
    out[valid] = (later[valid] - earlier[valid]) / NS_PER_MS
    return out


def _start(cols: RecordColumns) -> np.ndarray:
    """The intended send time, else the actual one (``*_from_intended_ms``)."""
    intended = cols.ints["intended_ns"]
    return np.where(intended != NONE, intended, cols.sent)


def _gaps(cols: RecordColumns) -> tuple[np.ndarray, np.ndarray]:
    """Every gap between consecutive token chunks of a stream (ms), and its record."""
    return cols.gaps


def per_request(cols: RecordColumns, name: str) -> np.ndarray:
    """``metrics.PER_REQUEST_METRICS[name]`` of every record (float64 [n], NaN: None)."""
    if name not in PER_REQUEST_METRICS:
        raise ValueError(f"unknown per-request metric {name!r}")
    sent, first = cols.sent, cols.first_chunk
    streamed = cols.ints["streamed"].astype(bool)
    chunks = cols.n_chunks > 0
    ints = cols.ints
    if name in ("ttft_ms", "ttft_from_intended_ms"):
        start = sent if name == "ttft_ms" else _start(cols)
        return _ms(first, start, (start != NONE) & chunks & streamed)
    if name in ("e2e_ms", "e2e_from_intended_ms"):
        start = sent if name == "e2e_ms" else _start(cols)
        end = _last(cols)
        return _ms(end, start, (start != NONE) & (end != NONE))
    if name == "tpot_ms":
        n = cols.output_tokens
        valid = (n >= 2) & chunks & streamed
        out = np.full(cols.n, np.nan)
        out[valid] = (cols.last_chunk[valid] - first[valid]) / NS_PER_MS / (n[valid] - 1)
        return out
    if name == "max_gap_ms":
        gaps, owner = _gaps(cols)
        out = np.full(cols.n, np.nan)
        if gaps.size:  # a stream's gaps lie together: the max of each run of one owner
            first_gap = np.flatnonzero(np.concatenate([[True], owner[1:] != owner[:-1]]))
            out[owner[first_gap]] = np.maximum.reduceat(gaps, first_gap)
        out[~streamed] = np.nan
        return out
    if name == "ttfat_ms":
        answer = ints["answer_ns"]
        return _ms(answer, sent, (sent != NONE) & (answer != NONE) & streamed)
    if name == "reasoning_ms":
        a, b = ints["reasoning_start_ns"], ints["reasoning_end_ns"]
        return _ms(b, a, (a != NONE) & (b != NONE))
    reasoning = np.where(
        ints["reasoning_tokens"] != NONE, ints["reasoning_tokens"], ints["reasoning_chunks"]
    )
    if name == "reasoning_tokens":
        return reasoning.astype(float)
    if name == "tool_call_tokens":
        return ints["tool_call_chunks"].astype(float)
    answer_tokens = cols.output_tokens - reasoning - ints["tool_call_chunks"]
    return np.maximum(0, answer_tokens).astype(float)  # answer_tokens


def _last(cols: RecordColumns) -> np.ndarray:
    """int64 [n]: ``metrics._last_ns``, where E2E ends: the last token chunk, else for an
    embeddings or rerank request completed ok the end of its answer (NONE: neither)."""
    pooled = (cols.ints["inputs"] != NONE) & cols.ok
    return np.where(cols.n_chunks > 0, cols.last_chunk, np.where(pooled, cols.end, NONE))


def latency_mask(cols: RecordColumns, window_ns: tuple[int, int]) -> np.ndarray:
    """bool [n]: ``metrics.latency_records``, the ok requests sent inside the window."""
    lo, hi = window_ns
    sent = cols.sent
    return cols.ok & (sent != NONE) & (sent >= lo) & (sent <= hi)


def itl_ms(cols: RecordColumns, mask: np.ndarray) -> np.ndarray:
    """``metrics.itl_ms`` pooled over the records of ``mask``, in record order."""
    gaps, owner = _gaps(cols)
    return gaps[mask[owner]]


def itl_with_owner(cols: RecordColumns, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``itl_ms`` of the records of ``mask``, and the record of each gap."""
    gaps, owner = _gaps(cols)
    keep = _select(mask[owner])
    return (gaps, owner) if keep is None else (gaps[keep], owner[keep])


def itl_per_token_ms(cols: RecordColumns, mask: np.ndarray) -> np.ndarray:
    """``metrics.itl_per_token_ms`` pooled over the records of ``mask`` whose split is known:
    each gap divided over the tokens of the chunk it ends, once per token."""
    gaps, owner = _gaps(cols)
    tokens, known = cols.chunk_counts
    keep = _select((mask & known)[owner])
    if tokens.strides == (0,) and tokens.size and tokens[0] <= 1:  # a token every chunk
        return gaps if keep is None else gaps[keep]
    k = tokens[1:][cols.gap_mask]  # the tokens of the chunk that ends each gap
    if keep is not None:
        gaps, k = gaps[keep], k[keep]
    if not (k > 1).any():  # a token a chunk: the per-token view is the gaps themselves
        return gaps
    k = np.maximum(1, k)
    return np.repeat(gaps / k, k)


def per_token_is_per_chunk(cols: RecordColumns, mask: np.ndarray) -> bool:
    """True when ``itl_per_token_ms`` of ``mask`` is ``itl_ms`` of it, value for value: every
    stream's split known and a token in each chunk (most servers): one distribution, not two."""
    tokens, known = cols.chunk_counts
    one_each = tokens.strides == (0,) and (not tokens.size or tokens[0] <= 1)
    return bool(one_each and not (mask & ~known).any())


def _select(keep: np.ndarray) -> np.ndarray | None:
    """``keep``, or None when it keeps everything (no copy to make)."""
    return None if keep.all() else keep


def stall_counts(cols: RecordColumns, mask: np.ndarray, k: float = 3.0) -> np.ndarray:
    """``metrics.stall_count`` of the records of ``mask`` (int [mask.sum()]): gaps over ``k``
    times the stream's own median gap, for streams of two gaps or more. The medians are
    numpy's, over the streams of each length at once (one row a stream); nothing the size
    of all the gaps is copied."""
    gaps, owner = _gaps(cols)
    counts = cols.gap_counts  # gaps of each stream, laid out one after another
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])  # where its gaps start
    med = np.full(cols.n, np.inf)  # fewer than two gaps, or not asked for: no gap is over inf
    for length in np.unique(counts[mask & (counts >= 2)]):
        same = np.flatnonzero(mask & (counts == length))
        for at in range(0, same.size, 1 << 16):  # bounded: 65,536 streams a block
            rows = same[at : at + (1 << 16)]
            med[rows] = np.median(gaps[first[rows, None] + np.arange(length)], axis=1)
    over = np.zeros(cols.n, dtype=np.int64)
    for at in range(0, gaps.size, 1 << 22):  # bounded: 4 M gaps a block
        o = owner[at : at + (1 << 22)]
        over += np.bincount(o[gaps[at : at + (1 << 22)] > k * med[o]], minlength=cols.n)
    return over[mask]


def count_outcomes(
    cols: RecordColumns, scheduled: int | None = None, mask: np.ndarray | None = None
) -> Counts:
    """``metrics.count_outcomes`` of every record (of those of ``mask``)."""
    codes, levels = cols.coded["outcome"]
    late = cols.ints["late"]
    if mask is not None:
        codes, late = codes[mask], late[mask]
    tally = np.bincount(codes, minlength=len(levels))
    by = {levels[i]: int(c) for i, c in enumerate(tally) if c}
    return tally_outcomes(by, int(late.sum()), scheduled)


def _chunk_weights(cols: RecordColumns) -> np.ndarray | None:
    """``metrics._chunk_token_weights`` of every chunk: tokens each carried, adding up to its
    record's output tokens; None when every chunk weighs one token (the common stream)."""
    tokens, known = cols.chunk_counts
    total = cols.output_tokens
    owner = cols.chunk_owner
    running = np.concatenate([[0], np.cumsum(tokens, dtype=np.int64)])
    starts = cols.lists["chunk_ns"][0]
    split_i = running[starts[1:]] - running[starts[:-1]]  # each record's chunks' tokens
    exact = (split_i == total) | (split_i == 0)
    if known.all() and exact.all() and not (tokens != 1).any():
        return None
    w = tokens.astype(float)
    spread = ~known[owner]
    w[spread] = (total / np.maximum(cols.n_chunks, 1))[owner][spread]  # total / n, each
    scaled = known[owner] & ~exact[owner]
    w[scaled] = tokens[scaled] * total[owner][scaled] / split_i[owner][scaled]
    return w


def _running_sum(w: np.ndarray | None, keep: np.ndarray) -> float:
    """The sum of ``w[keep]`` added one after another (as ``metrics`` adds each chunk's
    tokens), in blocks; ``w`` None: ones."""
    if w is None:
        return float(np.count_nonzero(keep))  # 1.0 + 1.0 + ... is the count, exactly
    total = 0.0
    for at in range(0, w.size, 1 << 22):
        block = w[at : at + (1 << 22)][keep[at : at + (1 << 22)]]
        if block.size:
            total = float(np.cumsum(np.concatenate([[total], block]))[-1])
    return total


def _series(ns: np.ndarray, w: np.ndarray | None, bin_ns: int) -> np.ndarray:
    """Tokens in each ``bin_ns`` bin from the run's start (a chunk before it: dropped, as in
    ``metrics``), added chunk after chunk in order, 4 M chunks at a time."""
    if not ns.size or ns.max() < 0:
        return np.zeros(0)
    sums = np.zeros(int(ns.max()) // bin_ns + 1)
    for at in range(0, ns.size, 1 << 22):
        bins = ns[at : at + (1 << 22)] // bin_ns
        later = bins >= 0
        if w is None:  # one token a chunk: counts, exact in any order
            sums += np.bincount(bins[later], minlength=sums.size)
        else:  # one after another, across blocks too
            np.add.at(sums, bins[later], w[at : at + (1 << 22)][later])
    return sums


def throughput(
    cols: RecordColumns,
    window_ns: tuple[int, int],
    bin_s: float = 1.0,
    mask: np.ndarray | None = None,
) -> Throughput:
    """``metrics.throughput`` of every record (of those of ``mask``): the same sums, in the
    same order."""
    lo, hi = window_ns
    span_s = max((hi - lo) / NS_PER_S, 1e-9)
    mine = np.ones(cols.n, dtype=bool) if mask is None else mask
    ns = cols.lists["chunk_ns"][1]
    w = cols.kept("chunk_weights", lambda: _chunk_weights(cols))
    if mask is not None:
        ns = ns[mine[cols.chunk_owner]]
        w = None if w is None else w[mine[cols.chunk_owner]]
    out_tokens = _running_sum(w, (ns >= lo) & (ns <= hi))
    sent = cols.sent
    answered = cols.ok | (cols.n_chunks > 0)
    counted = mine & answered & (sent != NONE) & (sent >= lo) & (sent <= hi)
    prompt = cols.ints["prompt_tokens"]
    asked = cols.ints["prompt_tokens_requested"]
    n = np.where((prompt != NONE) & (prompt != 0), prompt, np.where(asked != NONE, asked, 0))
    prompt_tokens = int(n[counted].sum())
    last = _last(cols)
    done = mine & cols.ok & (last != NONE) & (last >= lo) & (last <= hi)
    completed = int(done.sum())
    texts = cols.ints["inputs"]
    given = mine & (texts != NONE)  # embeddings and rerank: how many texts, and their tokens
    pooled = (int(texts[done & given].sum()), int(n[done & given].sum())) if given.any() else None
    series = tuple(float(x) / bin_s for x in _series(ns, w, int(bin_s * NS_PER_S)))
    return Throughput.over(span_s, out_tokens, prompt_tokens, completed, series, bin_s, pooled)


def good_mask(cols: RecordColumns, limits: Mapping[str | None, Mapping[str, float]]) -> np.ndarray:
    """bool [n]: ``metrics.good_requests``, each request by its class's limits
    (``limits[class]``, else ``limits[None]``): ok, and every defined metric <= its limit."""
    good = cols.ok.copy()
    codes, levels = cols.coded["request_class"]
    values: dict[str, np.ndarray] = {}
    for code, cls in enumerate(levels):
        own = limits.get(cls, limits.get(None, {}))
        rows = codes == code
        for name, limit in own.items():
            if name not in values:
                values[name] = per_request(cols, name)
            v = values[name][rows]
            good[rows] &= np.isnan(v) | (v <= limit)
    return good


def prompt_match(cols: RecordColumns) -> PromptMatch:
    """``token_checks.prompt_match``: first turns' requested against server-counted lengths."""
    asked, counted = cols.ints["prompt_tokens_requested"], cols.ints["prompt_tokens"]
    both = (cols.ints["turn"] == 0) & (asked != NONE) & (counted != NONE)
    diff = counted[both] - asked[both]
    exact, one = int((diff == 0).sum()), int((np.abs(diff) == 1).sum())
    worst = int(diff[np.argmax(np.abs(diff))]) if diff.size and np.abs(diff).max() else 0
    return PromptMatch(compared=int(diff.size), exact=exact, off_by_one=one,
                       missed=int(diff.size) - exact - one, worst=worst)  # fmt: skip


def short_outputs(cols: RecordColumns, mask: np.ndarray) -> int:
    """``token_checks.short_outputs`` of the records of ``mask``: ok answers that stopped by
    themselves before ``max_tokens``."""
    most = cols.ints["max_tokens"]
    stopped = cols.mask("finish_reason", STOP_REASONS)
    short = cols.ok & (most != NONE) & stopped & (cols.output_tokens < most)
    return int((short & mask).sum())


def goodput_count(cols: RecordColumns, good: np.ndarray, window_ns: tuple[int, int]) -> int:
    """Good requests (``good_mask``) whose last token came inside the window
    (``metrics.goodput_rps`` times the window)."""
    lo, hi = window_ns
    last = cols.last_chunk
    return int((good & (cols.n_chunks > 0) & (last >= lo) & (last <= hi)).sum())


def has_reasoning_or_tools(cols: RecordColumns) -> bool:
    """``summary.has_reasoning_or_tools``: some request streamed reasoning or called a tool."""
    ints = cols.ints
    said = (ints["reasoning_tokens"] != NONE) & (ints["reasoning_tokens"] != 0)
    return bool(ints["reasoning_chunks"].any() or said.any() or ints["tool_calls"].any())


def first_index(mask: np.ndarray) -> int | None:
    """The first true index of ``mask``, or None."""
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


def text_of(cols: RecordColumns, name: str, i: int) -> Any:
    """Field ``name`` of record ``i`` (text or coded)."""
    if name in cols.text:
        return cols.text[name][i]
    codes, levels = cols.coded[name]
    return levels[codes[i]]

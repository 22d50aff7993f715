"""Tokens per chunk: the server's count where it says, else the model's tokenizer over each
chunk's text; TPOT and tokens/s stay exact, and the per-token ITL view divides each gap."""

from __future__ import annotations

import json

import pytest

from loadlab._analysis.metrics import (
    chunk_token_counts,
    itl_ms,
    itl_per_token_ms,
    throughput,
    tpot_ms,
)
from loadlab.clients import OpenAIStreamState, make_client
from loadlab.config import EndpointConfig, RunConfig
from loadlab.records import RequestRecord
from loadlab.workloads._tokenizers import ByteTokens


def _chunk(text: str, usage: int | None = None, finish: str | None = None) -> bytes:
    obj: dict[str, object] = {"choices": [{"delta": {"content": text}, "finish_reason": finish}]}
    if usage is not None:  # vLLM's continuous_usage_stats: cumulative on every chunk
        obj["usage"] = {"prompt_tokens": 7, "completion_tokens": usage}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _run(chunks: list[bytes], tail: bytes = b"", token_ends=None) -> RequestRecord:
    s = OpenAIStreamState(RequestRecord("r"), "chat", t0_ns=0)
    s.token_ends = token_ends
    s.on_headers(200, {"Content-Type": "text/event-stream"}, 0)
    for i, c in enumerate(chunks):
        s.on_bytes(c, (i + 1) * 10_000_000)  # one chunk every 10 ms
    s.on_bytes(tail + b"data: [DONE]\n\n", 99_000_000)
    s.finish(100_000_000)
    return s.record


def _usage(n: int) -> bytes:
    return b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":%d}}\n\n' % n


def test_the_servers_count_per_chunk_wins() -> None:
    r = _run([_chunk("ab", 2), _chunk("cde", 5), _chunk("f", 6, "length")], _usage(6))
    assert r.chunk_tokens == [2, 3, 1] and (r.output_tokens, r.output_tokens_source) == (6, "usage")
    assert not r.output_tokens_disagree  # 6 tokens in 3 chunks is no disagreement


def test_the_tokenizer_splits_when_the_server_gives_only_a_total() -> None:
    # byte tokenizer: one token per byte; the usage says 6, the chunks' text splits 2/3/1
    r = _run(
        [_chunk("ab"), _chunk("cde"), _chunk("f", None, "length")],
        _usage(6),
        ByteTokens().token_ends,
    )
    assert r.chunk_tokens == [2, 3, 1] and r.output_tokens == 6 and not r.output_tokens_disagree
    # without usage, the tokenizer's count is the output count
    r = _run(
        [_chunk("ab"), _chunk("cde"), _chunk("f", None, "length")], b"", ByteTokens().token_ends
    )
    assert (r.output_tokens, r.output_tokens_source, r.chunk_tokens) == (6, "tokenizer", [2, 3, 1])


def test_one_token_per_chunk_records_nothing_and_unknown_splits_stay_unknown() -> None:
    r = _run(
        [_chunk("a"), _chunk("b"), _chunk("c", None, "length")], _usage(3), ByteTokens().token_ends
    )
    assert r.chunk_tokens == [] and chunk_token_counts(r) == [1, 1, 1]
    r = _run([_chunk("ab"), _chunk("cde"), _chunk("f", None, "length")], _usage(6))  # no tokenizer
    assert r.chunk_tokens == [] and chunk_token_counts(r) is None and r.output_tokens_disagree
    assert itl_per_token_ms(r) == [] and itl_ms(r) == [10.0, 10.0]


def test_tpot_tokens_per_s_and_the_per_token_view() -> None:
    r = _run([_chunk("ab", 2), _chunk("cde", 5), _chunk("f", 6, "length")], _usage(6))
    r.sent_ns = 0
    assert itl_ms(r) == [10.0, 10.0]  # per chunk: what a reader sees
    assert itl_per_token_ms(r) == pytest.approx([10 / 3] * 3 + [10.0])  # per token
    assert tpot_ms(r) == pytest.approx(20.0 / 5)  # (last - first) / (6 - 1): the usage's 6
    t = throughput([r], (0, 1_000_000_000))
    assert t.output_tokens == 6  # every token, each counted when its chunk came


def test_a_tokenizer_that_disagrees_with_usage_keeps_the_usage_total() -> None:
    r = RequestRecord("r", chunk_ns=[1, 2], chunk_tokens=[1, 3], output_tokens=8)
    assert throughput([r], (0, 10)).output_tokens == 8  # the split scaled to the usage's total


def test_the_runs_local_tokenizer_reaches_the_client() -> None:
    from loadlab._runner.prompt_sizing import ask_endpoint, size_prompts
    from loadlab._runner.run import Prepared

    ep = EndpointConfig("http://127.0.0.1:1")
    cfg = RunConfig(concurrency=1, requests=1, tokenizer="byte")
    byte = make_client(ep, cfg, Prepared(ep, size_prompts(cfg, ep)).token_ends)
    assert byte.token_ends is not None and byte.token_ends("héllo") == [1, 2, 2, 3, 4, 5]
    none = size_prompts(cfg.replace(tokenizer="none"), ep)
    estimate = ask_endpoint(ep, "auto")  # nothing listens there: an estimate, nothing local
    for sizing in (none, estimate):
        assert Prepared(ep, sizing).token_ends is None

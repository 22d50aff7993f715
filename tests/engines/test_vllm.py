"""loadlab against vLLM's CPU build serving the tiny model (one server for the session).

What a user sees from ``loadlab run`` on a real engine: prompts of exactly the requested length
with the model's tokenizer (chat template included), exact output lengths, a context overflow's
outcome, the server's own series in the report, and the Anthropic dialect's prompt counts with
vLLM's prefix cache on. The side-by-side with ``vllm bench serve`` is in test_vs_vllm_bench.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadlab._analysis.server_metrics import server_series
from loadlab._report.html import render_html
from loadlab.results import read_results
from tests.engines.conftest import Engine, loadlab_run


def _args(server: Engine, *more: str) -> list[str]:
    return ["--endpoint", server.url, "--model", server.model, *more]


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_prompt_lengths_are_exact_with_the_models_tokenizer(
    vllm: Engine, tiny_model: Path, tmp_path: Path, api: str
) -> None:
    """Every request's usage.prompt_tokens equals the requested count, chat template included."""
    for n in (128, 1000, 1900):
        out = tmp_path / f"{api}-{n}.json"
        run = loadlab_run(out, _args(vllm, "--api", api, "--concurrency", "4", "--requests", "8",
                                     "--prompt-tokens", str(n), "--max-tokens", "4",
                                     "--tokenizer", str(tiny_model)))  # fmt: skip
        assert run["_rc"] == 0, run["_stderr"][-2000:]
        recs = read_results(out).records
        assert all(r.ok for r in recs) and len(recs) == 8
        assert [(r.prompt_tokens_requested, r.prompt_tokens) for r in recs] == [(n, n)] * 8


def test_context_overflow_is_refused_before_the_run(
    vllm: Engine, tiny_model: Path, tmp_path: Path
) -> None:
    """vLLM 0.32 would shorten max_tokens to the context left (2,041 + 8 asked: 7 generated), a
    figure that misleads, and answer 400 only when the prompt leaves no room at all. loadlab
    reads max_model_len from /v1/models and refuses, before sending anything, every run whose
    prompt + max_tokens exceed it: exit 2, no results file, a message that says the fix."""
    for prompt in (2040, 2041, 2048, 2100):  # max_model_len 2,048, max_tokens 8
        out = tmp_path / f"overflow-{prompt}.json"
        run = loadlab_run(out, _args(vllm, "--concurrency", "1", "--requests", "1",
                                     "--prompt-tokens", str(prompt), "--max-tokens", "8",
                                     "--tokenizer", str(tiny_model)), expect_file=False)  # fmt: skip
        if prompt == 2040:  # 2,040 + 8 = 2,048 fits exactly
            assert run["_rc"] == 0, run["_stderr"][-2000:]
            (r,) = read_results(out).records
            assert (r.outcome, r.prompt_tokens, r.output_tokens) == ("ok", 2040, 8)
            continue
        assert run["_rc"] == 2 and not out.exists(), run
        err = run["_stderr"]
        assert "cannot fit the server's context of 2,048 tokens (max_model_len" in err, err
        assert f"prompt {prompt:,} tokens + max_tokens 8 = {prompt + 8:,}" in err, err
        assert "Fix: lower --prompt-tokens / --max-tokens" in err, err


def test_exact_output_lengths(vllm: Engine, tmp_path: Path) -> None:
    """--exact-output sends vLLM ignore_eos and min_tokens: every answer is max_tokens long."""
    for api in ("chat", "completions"):
        out = tmp_path / f"{api}.json"
        run = loadlab_run(out, _args(vllm, "--api", api, "--concurrency", "4", "--requests", "12",
                                     "--prompt-tokens", "200", "--max-tokens", "48",
                                     "--exact-output"))  # fmt: skip
        assert run["_rc"] == 0, run["_stderr"][-2000:]
        recs = read_results(out).records
        assert len(recs) == 12 and all(r.ok for r in recs)
        assert {(r.output_tokens, r.output_tokens_source, r.finish_reason) for r in recs} == {
            (48, "usage", "length")
        }, api


def test_scrape_of_vllm_metrics_gives_every_server_series(vllm: Engine, tmp_path: Path) -> None:
    out = tmp_path / "scrape.json"
    run = loadlab_run(out, _args(vllm, "--concurrency", "8", "--requests", "48",
                                 "--prompt-tokens", "400", "--max-tokens", "64",
                                 "--extra-body", json.dumps({"ignore_eos": True}),
                                 "--scrape", vllm.url + "/metrics",
                                 "--scrape-interval", "0.1"))  # fmt: skip
    assert run["_rc"] == 0, run["_stderr"][-2000:]
    res = read_results(out)
    assert len(res.server_samples) >= 3
    series = server_series(res.server_samples)
    sources = {k: v[2] for k, v in series.items()}
    assert sources["queue_depth"] == "vllm:num_requests_waiting"
    assert sources["running_batch"] == "vllm:num_requests_running"
    assert sources["kv_cache_use"] == "vllm:kv_cache_usage_perc"
    assert sources["prefix_cache_hit_rate"].startswith("vllm:prefix_cache_hits_total")
    # Eight streams of 64 tokens were running at once at some sample, holding KV blocks.
    assert max(series["running_batch"][1]) >= 2
    assert 0 < max(series["kv_cache_use"][1]) <= 1
    rates = series["prefix_cache_hit_rate"][1]
    assert rates and all(0 <= v <= 1 for v in rates)  # prompts were looked up: points exist
    html = render_html(res)
    assert "vllm:num_requests_running" in html and "vllm:prefix_cache_queries_total" in html


def test_anthropic_prompt_counts_include_prefix_cache_hits(
    vllm: Engine, tiny_model: Path, tmp_path: Path
) -> None:
    """vLLM's /v1/messages reports prefix-cache hits as cache_read_input_tokens and the rest as
    input_tokens (Anthropic's definition): the record's prompt count is the whole prompt, the
    count asked for and the count the chat API gives for the same messages."""
    common = ["--concurrency", "4", "--requests", "12", "--prompt-tokens", "300",
              "--max-tokens", "8", "--seed", "16", "--tokenizer", str(tiny_model)]  # fmt: skip
    counts = {}
    for api in ("chat", "anthropic"):  # chat first: its prompts are in the cache for anthropic's
        out = tmp_path / f"{api}.json"
        run = loadlab_run(out, _args(vllm, "--api", api, *common))
        assert run["_rc"] == 0, run["_stderr"][-2000:]
        recs = read_results(out).records
        assert len(recs) == 12 and all(r.ok for r in recs)
        counts[api] = {r.request_id: r for r in recs}
    chat, anth = counts["chat"], counts["anthropic"]
    assert {r.prompt_tokens for r in chat.values()} == {300}
    assert {k: r.prompt_tokens for k, r in anth.items()} == {
        k: r.prompt_tokens for k, r in chat.items()
    }
    cached = [r.cached_prompt_tokens or 0 for r in anth.values()]
    assert all(n > 0 for n in cached), cached  # the whole prompt was cached once: a real split
    assert all(n < (r.prompt_tokens or 0) for n, r in zip(cached, anth.values(), strict=True))

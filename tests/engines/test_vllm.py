"""loadlab against vLLM's CPU build serving the tiny model (one server for the session).

What a user sees from ``loadlab run`` on a real engine: a context overflow's outcome, exact
output lengths with EOS ignored, the server's own series in the report, and the Anthropic
dialect's prompt counts with vLLM's prefix cache on.
"""

from __future__ import annotations

import json
from pathlib import Path

from loadlab.report.html import render_html
from loadlab.results import read_results
from loadlab.scrape import server_series
from tests.engines.conftest import Engine, loadlab_run


def _args(server: Engine, *more: str) -> list[str]:
    return ["--endpoint", server.url, "--model", server.model, *more]


def test_context_overflow_is_http_400_for_every_request(vllm: Engine, tmp_path: Path) -> None:
    # Far past the 2,048-token context whatever the words cost in tokens.
    out = tmp_path / "overflow.json"
    run = loadlab_run(out, _args(vllm, "--concurrency", "2", "--requests", "4",
                                 "--prompt-tokens", "6000", "--max-tokens", "16"))  # fmt: skip
    assert run["_rc"] == 3, run["_stdout"][-2000:]  # no request succeeded
    recs = read_results(out).records
    assert [r.outcome for r in recs] == ["http_400"] * 4
    assert all(r.http_status == 400 and r.error and "context" in r.error.lower() for r in recs)


def test_exact_output_lengths_with_eos_ignored(vllm: Engine, tmp_path: Path) -> None:
    for api in ("chat", "completions"):
        out = tmp_path / f"{api}.json"
        run = loadlab_run(out, _args(vllm, "--api", api, "--concurrency", "4", "--requests", "12",
                                     "--prompt-tokens", "200", "--max-tokens", "48",
                                     "--extra-body", json.dumps({"ignore_eos": True})))  # fmt: skip
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
    assert all(0 <= v <= 1 for v in series["prefix_cache_hit_rate"][1])
    html = render_html(res)
    assert "vllm:num_requests_running" in html and "vllm:prefix_cache_queries_total" in html


def test_anthropic_prompt_counts_include_prefix_cache_hits(vllm: Engine, tmp_path: Path) -> None:
    """vLLM's /v1/messages reports prefix-cache hits as cache_read_input_tokens and the rest as
    input_tokens (Anthropic's definition): the record's prompt count is the whole prompt, the
    same count the chat API gives for the same messages."""
    common = ["--concurrency", "4", "--requests", "12", "--prompt-tokens", "300",
              "--max-tokens", "8", "--seed", "16"]  # fmt: skip
    counts = {}
    for api in ("chat", "anthropic"):  # chat first: its prompts are in the cache for anthropic's
        out = tmp_path / f"{api}.json"
        run = loadlab_run(out, _args(vllm, "--api", api, *common))
        assert run["_rc"] == 0, run["_stderr"][-2000:]
        recs = read_results(out).records
        assert len(recs) == 12 and all(r.ok for r in recs)
        counts[api] = {r.request_id: r for r in recs}
    chat, anth = counts["chat"], counts["anthropic"]
    assert {k: r.prompt_tokens for k, r in anth.items()} == {
        k: r.prompt_tokens for k, r in chat.items()
    }
    cached = [r.cached_prompt_tokens or 0 for r in anth.values()]
    assert all(n > 0 for n in cached), cached  # the whole prompt was cached once: a real split
    assert all(n < (r.prompt_tokens or 0) for n, r in zip(cached, anth.values(), strict=True))

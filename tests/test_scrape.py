"""Prometheus text parsing (real exposition formats) and the background scraper against a
real HTTP server on loopback."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from aiohttp import web

from loadlab._analysis.server_metrics import parse_prometheus_text, server_series
from loadlab._runner.scrape import PrometheusScraper
from tests.helpers.loopback import free_port

# Shaped like vLLM's /metrics (0.6-0.8): HELP/TYPE comments, labels, a histogram, a timestamp.
VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="meta-llama/Llama-3.1-8B"} 12.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="meta-llama/Llama-3.1-8B"} 3.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B"} 0.4375
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="meta-llama/Llama-3.1-8B"} 0.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="meta-llama/Llama-3.1-8B"} 57.0
vllm:time_to_first_token_seconds_sum{model_name="meta-llama/Llama-3.1-8B"} 4.25
vllm:time_to_first_token_seconds_count{model_name="meta-llama/Llama-3.1-8B"} 57.0
process_start_time_seconds 1.70000000012e+09 1700000000000
weird_label{path="C:\\\\tmp",quote="say \\"hi\\"",nl="a\\nb",} 1
not_a_number NaN
positive_inf +Inf
this line is broken
"""


def test_parse_real_format() -> None:
    errors: list[str] = []
    m = parse_prometheus_text(VLLM_TEXT, errors)
    model = 'model_name="meta-llama/Llama-3.1-8B"'
    assert m[f"vllm:num_requests_running{{{model}}}"] == 12.0
    assert m[f"vllm:gpu_cache_usage_perc{{{model}}}"] == 0.4375
    # Histogram lines are separate keys; labels sorted by name; the timestamp is ignored.
    assert m[f'vllm:time_to_first_token_seconds_bucket{{le="+Inf",{model}}}'] == 57.0
    assert m[f"vllm:time_to_first_token_seconds_sum{{{model}}}"] == 4.25
    assert m["process_start_time_seconds"] == 1.70000000012e9
    assert m['weird_label{nl="a\\nb",path="C:\\\\tmp",quote="say \\"hi\\""}'] == 1.0
    assert math.isnan(m["not_a_number"]) and m["positive_inf"] == math.inf
    assert len(errors) == 1 and "line 20" in errors[0]
    assert not any(k.startswith("#") for k in m)


def test_server_series_maps_vllm_sglang_and_reference_names() -> None:
    vllm = [{"t_ns": 1_000_000_000, "metrics": parse_prometheus_text(VLLM_TEXT)}]
    s = server_series(vllm)
    assert s["queue_depth"][:2] == ([1.0], [3.0]) and s["running_batch"][1] == [12.0]
    assert s["kv_cache_use"][1] == [0.4375] and s["kv_cache_use"][2] == "vllm:gpu_cache_usage_perc"
    sglang = [
        {
            "t_ns": 0,
            "metrics": {
                "sglang:num_queue_reqs": 5,
                "sglang:num_running_reqs": 7,
                "sglang:token_usage": 0.5,
            },
        }
    ]
    assert {k: v[1] for k, v in server_series(sglang).items()} == {
        "queue_depth": [5.0],
        "running_batch": [7.0],
        "kv_cache_use": [0.5],
    }
    ref = [
        {
            "t_ns": 0,
            "metrics": {
                "loadlab_server_queue_depth": 2,
                "loadlab_server_running_requests": 4,
                "loadlab_server_kv_blocks_used": 30,
                "loadlab_server_kv_blocks_total": 120,
            },
        },
    ]
    s = server_series(ref)
    assert s["queue_depth"][1] == [2.0] and s["running_batch"][1] == [4.0]
    assert s["kv_cache_use"][1] == [0.25]
    assert server_series([]) == {}


def test_scraper_against_a_real_server() -> None:
    """Samples while the server answers; a 500 and a dead server are counted, not raised."""
    calls = {"n": 0}

    async def metrics(_request: web.Request) -> web.Response:
        calls["n"] += 1
        if calls["n"] == 2:
            return web.Response(status=500, text="boom")
        return web.Response(
            text=f'# TYPE q gauge\nq {calls["n"]}\nh_bucket{{le="1"}} 3\nnan_metric NaN\n'
        )

    async def scenario() -> tuple[list[dict], int, str | None, int, int]:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        t0 = time.perf_counter_ns()
        # A generous timeout: on a busy machine a slow answer must not turn into a lost sample.
        scraper = PrometheusScraper(f"http://127.0.0.1:{port}/metrics", 0.05, t0, timeout_s=10)
        try:
            await scraper.start()
            deadline = time.monotonic() + 10
            while len(scraper.samples) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        finally:
            await runner.cleanup()  # the server goes away while the scraper still runs
        await asyncio.sleep(0.2)
        samples = await scraper.stop()
        # A URL where nothing listens: every scrape fails, none raises.
        dead = PrometheusScraper(f"http://127.0.0.1:{free_port()}/metrics", 0.05, t0)
        await dead.start()
        await asyncio.sleep(0.15)
        dead_samples = await dead.stop()
        return samples, scraper.failures, scraper.last_error, len(dead_samples), dead.failures

    samples, failures, last_error, n_dead, dead_failures = asyncio.run(scenario())
    assert len(samples) >= 3
    assert failures >= 2 and last_error is not None  # the 500 and the vanished server
    assert n_dead == 0 and dead_failures >= 2
    ts = [s["t_ns"] for s in samples]
    assert ts == sorted(ts) and ts[0] >= 0
    assert samples[0]["metrics"] == {"q": 1.0}  # buckets and NaN dropped
    assert samples[1]["metrics"] == {"q": 3.0}  # call 2 was the 500


def test_prefix_cache_hit_rate_per_interval_from_vllm_counters_and_sglang_gauge() -> None:
    def sample(t_s: int, hits: float, queries: float) -> dict[str, Any]:
        return {
            "t_ns": t_s * 1_000_000_000,
            "metrics": {
                'vllm:prefix_cache_hits_total{engine="0",model_name="tiny"}': hits,
                'vllm:prefix_cache_queries_total{engine="0",model_name="tiny"}': queries,
            },
        }

    # 10 of 40 so far; then 30 of 40 more; then no lookups (no point); then 0 of 20
    s = server_series([sample(1, 10, 40), sample(2, 40, 80), sample(3, 40, 80), sample(4, 40, 100)])
    ts, rates, source = s["prefix_cache_hit_rate"]
    assert ts == [1.0, 2.0, 4.0] and rates == [0.25, 0.75, 0.0]
    assert source.startswith("vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total")
    ref = [{"t_ns": 0, "metrics": {"loadlab_server_prefix_cache_hits_total": 3,
                                   "loadlab_server_prefix_cache_queries_total": 4}}]  # fmt: skip
    assert server_series(ref)["prefix_cache_hit_rate"][1] == [0.75]
    sglang = [{"t_ns": 0, "metrics": {"sglang:cache_hit_rate": 0.6}}]
    assert server_series(sglang)["prefix_cache_hit_rate"][1] == [0.6]
    assert server_series([]) == {}

"""Disaggregated mode beyond the shared end-to-end tests: the KV really moves (greedy output
equals continuous mode's), bytes per token match the model's shapes, transfer stats reach
/metrics, the response and loadlab's client, disconnects at any stage free both pools, and the
workers stop with the server."""

from __future__ import annotations

import asyncio
import subprocess
import time
from typing import Any

import aiohttp
import pytest

from loadlab.clients._openai import OpenAIClient
from loadlab.config import EndpointConfig
from loadlab.records import RequestSpec
from reference_server.cli import build_app
from reference_server.config import ServerConfig
from reference_server.disagg.router import parse_cpus, split_cpus
from reference_server.disagg.worker import _gone
from tests.helpers.server import label, metrics, post, session, stream

COMPLETIONS = "/v1/completions"
MODEL = "loadlab-ref"
# tiny preset: 2 layers, 2 KV heads, head_dim 64 / 4 heads = 16, fp32 (4 bytes):
# 2 (K and V) * 2 * 2 * 16 * 4 = 512 bytes per token.
TINY_KV_BYTES_PER_TOKEN = 512


def test_cpu_lists_and_the_default_split() -> None:
    assert parse_cpus("0-2,5") == (0, 1, 2, 5)
    assert split_cpus((0, 1)) == ((0,), (1,))
    assert split_cpus((0, 1, 2)) == ((0, 1), (2,))
    assert split_cpus((3,)) == ((3,), (3,))


def test_greedy_output_equals_continuous_mode(disaggregated_server: Any, continuous_server: Any) -> None:  # fmt: skip
    """The first token comes from the prefill worker and the rest from the decode worker,
    which attends over the transferred KV: any corrupted K/V changes the greedy text."""
    body = {"model": MODEL, "prompt": "The quick brown fox jumps over the lazy dog. " * 2,
            "max_tokens": 24, "temperature": 0}  # fmt: skip

    async def go() -> tuple[Any, Any]:
        async with session() as s:
            _, a, _ = await post(s, continuous_server.url + COMPLETIONS, body)
            _, b, _ = await post(s, disaggregated_server.url + COMPLETIONS, body)
            return a, b

    cont, dis = asyncio.run(go())
    assert dis["choices"][0]["text"] == cont["choices"][0]["text"]
    counts = {"prompt_tokens": 90, "completion_tokens": 24, "total_tokens": 114}
    for usage in (dis["usage"], cont["usage"]):  # cached_tokens: whatever ran before
        assert {k: usage[k] for k in counts} == counts
    assert dis["kv_transfer"]["bytes"] == 90 * TINY_KV_BYTES_PER_TOKEN
    assert "kv_transfer" not in cont


def test_transfer_stats_in_metrics_stream_and_client_record(disaggregated_server: Any) -> None:
    url = disaggregated_server.url

    async def go() -> tuple[dict[str, float], list[Any], Any, dict[str, float], Any]:
        async with session() as s:
            info = await (await s.get(url + "/v1/server_info")).json()
            before = await metrics(s, url)
            events = await stream(s, url + COMPLETIONS, {"model": MODEL, "prompt": "a" * 33,
                                  "max_tokens": 4, "stream": True,
                                  "stream_options": {"include_usage": True}})  # fmt: skip
            ep = EndpointConfig(url, api="completions", api_key_env="LOADLAB_TEST_KEY")
            async with OpenAIClient(ep) as client:
                spec = RequestSpec("kv-1", "b" * 50, 3, prompt_tokens=50)
                done = await client.send(spec, t0_ns=time.perf_counter_ns())
            async with OpenAIClient(ep, stream=False) as whole:
                spec = RequestSpec("kv-2", "c" * 20, 2, prompt_tokens=20)
                body = await whole.send(spec, t0_ns=time.perf_counter_ns())
            assert body.record.server["kv_transfer_bytes"] == 20 * 512
            return before, events, done.record, await metrics(s, url), info

    before, events, record, after, info = asyncio.run(go())
    assert info["kv_bytes_per_token"] == TINY_KV_BYTES_PER_TOKEN
    assert info["prefill_workers"] == info["decode_workers"] == 1
    assert {w["role"] for w in info["workers"]} == {"prefill", "decode"}
    split = info["compute_split"]
    assert set(split) == {"prefill_cpus", "decode_cpus", "api_cpus", "prefill_nice"}
    assert split["prefill_nice"] == 10  # CPU default: token delivery preempts prefill
    nice = {w["role"]: w["nice"] for w in info["workers"]}
    assert nice["prefill"] >= nice["decode"] + 10, nice
    finish, usage = events[-3], events[-2]
    assert finish["choices"][0]["finish_reason"] == "length"
    assert usage["kv_transfer"]["bytes"] == finish["kv_transfer"]["bytes"] == 33 * 512
    assert 0 < usage["kv_transfer"]["seconds"] < 30
    assert record.outcome == "ok" and record.output_tokens == 3
    assert record.server["kv_transfer_bytes"] == 50 * 512
    assert 0 < record.server["kv_transfer_s"] < 30
    # whole 16-token blocks from the prefill side's prefix cache (0 unless a test sent it before)
    assert record.server["kv_transfer_cached_bytes"] in (0, 16 * 512, 32 * 512, 48 * 512)
    assert after["kv_transfers_total"] - before["kv_transfers_total"] == 3
    assert after["kv_transfer_bytes_total"] - before["kv_transfer_bytes_total"] == 103 * 512
    assert after["kv_transfer_seconds_count"] == after["kv_transfers_total"]
    assert after["kv_transfer_seconds_total"] > before["kv_transfer_seconds_total"]


def test_one_token_requests_finish_on_the_prefill_side(disaggregated_server: Any) -> None:
    async def go() -> Any:
        async with session() as s:
            body = {"model": MODEL, "prompt": "one", "max_tokens": 1}
            return await post(s, disaggregated_server.url + COMPLETIONS, body)

    status, body, _ = asyncio.run(go())
    assert status == 200 and body["usage"]["completion_tokens"] == 1
    assert body["kv_transfer"] == {"bytes": 0, "seconds": 0.0}  # nothing to move


def test_disconnects_at_every_stage_free_both_pools(disaggregated_server: Any) -> None:
    """Clients hang up while queued, prefilling, with the KV held or in transfer (right after
    the first token, which the prefill side sends), and while decoding."""
    url = disaggregated_server.url

    async def one(s: aiohttp.ClientSession, i: int) -> None:
        body = {"model": MODEL, "prompt": f"{i:03d}" * 35, "max_tokens": 20, "stream": True}
        if i % 3 == 0:  # before or during prefill
            task = asyncio.create_task(_read_all(s, url + COMPLETIONS, body))
            await asyncio.sleep(0.002 * (i % 7))
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            return
        async with s.post(url + COMPLETIONS, json=body) as r:
            seen = 0
            async for line in r.content:
                seen += line.startswith(b"data: {")
                if seen == 1 + (i % 3 == 2) * 3:  # after the first token, or while decoding
                    r.close()
                    return

    async def go() -> dict[str, float]:
        async with session() as s:
            await asyncio.gather(*(one(s, i) for i in range(30)))
            deadline = time.monotonic() + 20
            while True:
                m = await metrics(s, url)
                used = [m[label("kv_pool_blocks_used", pool=p)] for p in ("prefill", "decode")]
                idle = m["requests_in_flight"] == 0 and used == [0, 0]
                if idle or time.monotonic() > deadline:
                    return m
                await asyncio.sleep(0.05)

    m = asyncio.run(go())
    assert m["requests_in_flight"] == 0 and m["queue_depth"] == 0 and m["running_requests"] == 0
    assert m[label("kv_pool_blocks_used", pool="prefill")] == 0
    assert m[label("kv_pool_blocks_used", pool="decode")] == 0
    assert m[label("kv_pool_blocks_total", pool="decode")] == 40


async def _read_all(s: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> None:
    async with s.post(url, json=body) as r:
        await r.read()


def test_stopping_the_engine_ends_every_worker() -> None:
    """A second engine (forked from the warm fork server: cheap) that is started and stopped."""
    config = ServerConfig(mode="disaggregated", preset="tiny", num_kv_blocks=8, max_model_len=64,
                          threads=1, decode_workers=2)  # fmt: skip
    _app, engine, info = build_app(config)
    try:
        assert info["decode_workers"] == 2 and len(engine.procs) == 3
        assert all(p.is_alive() for p in engine.procs)
    finally:
        engine.stop()
    assert all(not p.is_alive() and p.exitcode is not None for p in engine.procs)


def test_watchdog_sees_a_dead_api_process_even_before_it_is_reaped() -> None:
    """Workers watch the API process's pid (they are the fork server's children)."""
    proc = subprocess.Popen(["sleep", "30"])  # a stand-in for the API process
    try:
        assert not _gone(proc.pid)
        proc.kill()
        deadline = time.monotonic() + 10
        while not _gone(proc.pid) and time.monotonic() < deadline:  # a zombie until reaped
            time.sleep(0.01)
        assert _gone(proc.pid)
    finally:
        proc.wait(10)
    assert _gone(proc.pid)


@pytest.mark.slow  # a server of its own, started and stopped
def test_sigterm_stops_the_server_and_frees_every_semaphore(tmp_path: Any) -> None:
    """SIGTERM (what ``launch`` sends) shuts the server down, stops its workers, exits 143 and
    leaves nothing for multiprocessing's resource tracker to clean up: before, uvicorn raised
    the signal again after its shutdown, the process died before atexit, and the tracker
    reported the queues' semaphores as leaked."""
    import signal
    import sys

    from reference_server.launch import free_port

    port = free_port()
    log = tmp_path / "server.log"
    argv = [sys.executable, "-m", "reference_server.cli", "--mode", "disaggregated",
            "--preset", "tiny", "--threads", "1", "--port", str(port)]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while "ready" not in log.read_text() and time.monotonic() < deadline:
                assert proc.poll() is None, log.read_text()
                time.sleep(0.2)
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    text = log.read_text()
    assert code == 128 + signal.SIGTERM, text
    assert "leaked" not in text, text


def test_the_help_says_what_the_ready_line_says_about_prefix_caching(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Disaggregated mode caches prefixes on its prefill workers (its ready line says
    ``prefix_caching=on``); the help said it did not."""
    from reference_server.cli import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "not yet in disaggregated mode" not in text
    assert "in disaggregated mode the prefill workers cache them" in text

"""End to end over real HTTP, in every mode: exact token counts, SSE framing, stop strings,
concurrent requests, and clients that disconnect mid-stream freeing every KV block."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import aiohttp

from tests.helpers.server import label, metrics, post, session, stream, wait_idle

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MODEL = "loadlab-ref"


def _chat(prompt: str, max_tokens: int, **kw: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        **kw,
    }


def _counts(usage: dict[str, Any]) -> dict[str, Any]:
    """``usage`` without its cached-token detail (which depends on what ran before), after
    checking that the detail is there and in range."""
    usage = dict(usage)
    cached = usage.pop("prompt_tokens_details")["cached_tokens"]
    assert 0 <= cached < usage["prompt_tokens"]
    return usage


def _content_chunks(events: list[Any], key: str) -> list[dict[str, Any]]:
    return [
        e
        for e in events
        if isinstance(e, dict) and e["choices"] and e["choices"][0]["finish_reason"] is None
    ]


def test_chat_stream_has_one_chunk_per_token_then_finish_usage_done(server: Any) -> None:
    async def go() -> list[Any]:
        async with session() as s:
            body = _chat("x" * 37, 9, stream=True, stream_options={"include_usage": True})
            return await stream(s, server.url + CHAT, body)

    events = asyncio.run(go())
    tokens = _content_chunks(events, "delta")
    assert len(tokens) == 9  # one token per chunk
    assert tokens[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in t["choices"][0]["delta"] for t in tokens[1:])
    assert all("content" in t["choices"][0]["delta"] for t in tokens)
    final, usage, done = events[-3:]
    assert final["choices"] == [{"index": 0, "delta": {}, "finish_reason": "length"}]
    assert usage["choices"] == [] and _counts(usage["usage"]) == {
        "prompt_tokens": 37,
        "completion_tokens": 9,
        "total_tokens": 46,
    }
    assert done == "[DONE]" and len(events) == 12
    assert {e["object"] for e in events[:-1]} == {"chat.completion.chunk"}
    assert len({e["id"] for e in events[:-1]}) == 1


def test_chat_whole_response_counts_exactly(server: Any) -> None:
    async def go() -> tuple[int, Any, Any]:
        async with session() as s:
            msgs = [{"role": "system", "content": "ab"}, {"role": "user", "content": "cde"}]
            return await post(
                s, server.url + CHAT, {"model": MODEL, "messages": msgs, "max_tokens": 5}
            )

    status, body, _ = asyncio.run(go())
    assert status == 200 and body["object"] == "chat.completion"
    # "ab\ncde": contents joined by a newline, no role markers -> 6 tokens.
    assert _counts(body["usage"]) == {
        "prompt_tokens": 6,
        "completion_tokens": 5,
        "total_tokens": 11,
    }
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["role"] == "assistant"


def test_completions_stream_and_whole(server: Any) -> None:
    async def go() -> tuple[list[Any], Any]:
        async with session() as s:
            body = {"model": MODEL, "prompt": "y" * 20, "max_tokens": 7, "stream": True,
                    "stream_options": {"include_usage": True}}  # fmt: skip
            events = await stream(s, server.url + COMPLETIONS, body)
            whole = await post(s, server.url + COMPLETIONS, {**body, "stream": False})
            return events, whole

    events, (status, whole, _) = asyncio.run(go())
    tokens = _content_chunks(events, "text")
    assert len(tokens) == 7 and all("text" in t["choices"][0] for t in tokens)
    assert events[-3]["choices"][0]["finish_reason"] == "length"
    assert events[-2]["usage"]["completion_tokens"] == 7 and events[-1] == "[DONE]"
    assert status == 200 and whole["object"] == "text_completion"
    assert _counts(whole["usage"]) == {
        "prompt_tokens": 20,
        "completion_tokens": 7,
        "total_tokens": 27,
    }


def test_stream_without_include_usage_has_no_usage_chunk(server: Any) -> None:
    async def go() -> list[Any]:
        async with session() as s:
            return await stream(s, server.url + CHAT, _chat("hi", 3, stream=True))

    events = asyncio.run(go())
    assert len(events) == 5 and all("usage" not in e for e in events[:-1])


def test_concurrent_requests_of_mixed_lengths_all_complete_exactly(server: Any) -> None:
    """More requests than batch slots and than KV blocks hold at once: queueing, refilling
    (or static batches) and preemption must still give every request exactly max_tokens."""
    lengths = [(5 + 7 * i % 40, 1 + 11 * i % 40) for i in range(24)]

    async def go() -> list[tuple[int, Any, Any]]:
        async with session() as s:
            reqs = [post(s, server.url + COMPLETIONS, {"model": MODEL, "prompt": "z" * p, "max_tokens": m})
                    for p, m in lengths]  # fmt: skip
            return await asyncio.gather(*reqs)

    for (p, m), (status, body, _) in zip(lengths, asyncio.run(go()), strict=True):
        assert status == 200, body
        assert body["usage"]["prompt_tokens"] == p and body["usage"]["completion_tokens"] == m


def test_stop_string_ends_generation_and_is_not_returned(server: Any) -> None:
    async def go() -> tuple[Any, Any, str]:
        async with session() as s:
            greedy = {"model": MODEL, "prompt": "stop test", "max_tokens": 30, "temperature": 0}
            _, first, _ = await post(s, server.url + COMPLETIONS, greedy)
            text = first["choices"][0]["text"]
            # A 2-character stop string made of whole characters, first seen at index k.
            k = next(i for i in range(3, len(text) - 1) if "\ufffd" not in text[i : i + 2])
            stop = text[k : k + 2]
            _, second, _ = await post(s, server.url + COMPLETIONS, {**greedy, "stop": [stop]})
            return first, second, stop

    first, second, stop = asyncio.run(go())
    text = first["choices"][0]["text"]
    assert second["choices"][0]["finish_reason"] == "stop"
    assert second["choices"][0]["text"] == text[: text.find(stop)]
    assert second["usage"]["completion_tokens"] < 30


def test_hundred_clients_disconnecting_mid_stream_free_everything(server: Any) -> None:
    async def one(s: aiohttp.ClientSession, i: int, gate: asyncio.Semaphore) -> int:
        body = {"model": MODEL, "prompt": f"client {i:03d}", "max_tokens": 100, "stream": True}
        async with gate, s.post(server.url + COMPLETIONS, json=body) as r:
            assert r.status == 200
            seen = 0
            async for line in r.content:
                seen += line.startswith(b"data: {")
                if seen == 2:
                    r.close()  # hang up mid-stream
                    return seen
        return seen

    async def go() -> tuple[list[int], dict[str, float], dict[str, float]]:
        async with session() as s:
            before = await metrics(s, server.url)
            gate = asyncio.Semaphore(16)
            seen = await asyncio.gather(*(one(s, i, gate) for i in range(100)))
            return seen, before, await wait_idle(s, server.url)

    seen, before, after = asyncio.run(go())
    assert seen == [2] * 100
    assert after["running_requests"] == 0 and after["queue_depth"] == 0
    assert after["requests_in_flight"] == 0
    pools = 2 if server.mode == "disaggregated" else 1  # prefill and decode: 40 blocks each
    assert after["kv_blocks_used"] == 0 and after["kv_blocks_total"] == 40 * pools
    crashes = getattr(getattr(server, "engine", None), "crashes", [])
    assert not crashes, crashes[0]
    aborted = after[label("requests_total", finish_reason="abort")]
    aborted -= before[label("requests_total", finish_reason="abort")]
    if server.mode == "disaggregated":
        # Tokens come from worker processes on their own cores: a client starved of CPU on a
        # busy machine can receive its whole answer before it hangs up (seen: 3 of 100).
        key = label("requests_total", finish_reason="length")
        assert aborted + after[key] - before[key] == 100 and aborted >= 50
    else:
        assert aborted == 100


def test_a_repeated_prefix_is_served_from_the_cache(server: Any) -> None:
    """The same 74-token prompt twice: the second time its first 64 tokens (4 full blocks of
    16; the last token is always computed) come from the cache, the greedy text is the same,
    and /metrics counts the queries and hits in tokens."""
    prompt = uuid.uuid4().hex * 2 + "a prompt seen twice"  # unique: no earlier test hit it
    body = {"model": MODEL, "prompt": prompt[:74], "max_tokens": 6}

    async def go() -> tuple[Any, Any, dict[str, float], dict[str, float]]:
        async with session() as s:
            before = await wait_idle(s, server.url)
            _, first, _ = await post(s, server.url + COMPLETIONS, body)
            events = await stream(s, server.url + COMPLETIONS, {**body, "stream": True,
                                  "stream_options": {"include_usage": True}})  # fmt: skip
            return first, events, before, await wait_idle(s, server.url)

    first, events, before, after = asyncio.run(go())
    second = events[-2]["usage"]
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert second["prompt_tokens_details"] == {"cached_tokens": 64}
    text = "".join(e["choices"][0]["text"] for e in events[:-2] if e["choices"])
    assert text == first["choices"][0]["text"]
    queries = after["prefix_cache_queries_total"] - before["prefix_cache_queries_total"]
    hits = after["prefix_cache_hits_total"] - before["prefix_cache_hits_total"]
    assert (queries, hits) == (2 * 74, 64) and after["kv_blocks_cached"] >= 4
    if server.mode == "disaggregated":  # the prefill side cached; the transfer says so
        moved = {k: after[f"kv_transfer_{k}_total"] - before[f"kv_transfer_{k}_total"]
                 for k in ("cached_blocks", "computed_blocks", "cached_bytes", "computed_bytes")}  # fmt: skip
        assert (moved["cached_blocks"], moved["computed_blocks"]) == (4, 5 + 1)
        assert moved["cached_bytes"] * 84 == moved["computed_bytes"] * 64  # 64 of 148 tokens
        assert events[-2]["kv_transfer"]["cached_blocks"] == 4


def test_step_log_has_each_step_of_a_request_with_its_shape(server: Any) -> None:
    """GET /v1/step_log: a lone request's steps, whole prompt prefilled (in slices when
    chunked) and one decode row per later token; disaggregated: each on its worker's role."""
    prompt = uuid.uuid4().hex + "y" * 5  # 37 tokens, never seen before: no prefix-cache hit

    async def go() -> list[dict[str, Any]]:
        async with session() as s:
            await wait_idle(s, server.url)
            t0 = time.perf_counter_ns()
            status, _, _ = await post(s, server.url + CHAT, _chat(prompt, 5))
            assert status == 200
            await wait_idle(s, server.url)
            async with s.get(server.url + "/v1/step_log") as r:
                return [e for e in await r.json() if e["start_ns"] >= t0]

    log = asyncio.run(go())
    assert sum(e["prefill_tokens"] for e in log) == 37
    assert sum(e["decode_tokens"] for e in log) == 4  # the first token came with the prefill
    assert all(e["end_ns"] > e["start_ns"] and e["attn_pairs"] > 0 for e in log)
    roles = {e["role"] for e in log}
    assert roles == ({"prefill", "decode"} if server.mode == "disaggregated" else {"engine"})

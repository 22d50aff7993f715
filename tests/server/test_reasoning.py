"""The reference server as a reasoning model (``--reasoning-tokens 6``)
and an agent (``--tool-call-rate 1``), held against its own log (``GET /v1/request_log``).

For every request, through chat, Anthropic messages and the Responses API: loadlab's record
and the server's log agree on the reasoning, answer and tool-call counts, and on TTFT and TTFAT
on one clock (the server stamps a piece right before handing it to the transport and stamps
the request on arrival, on the same monotonic clock the client reads, so the client's times
are the server's plus the loopback and parse delays: never less, and within a bound).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from loadlab._analysis import metrics
from loadlab.clients import make_client
from loadlab.config import EndpointConfig, RunConfig
from loadlab.records import RequestRecord, RequestSpec
from tests.helpers.server import AUTH

MODEL = "loadlab-ref"
REASONING = 6  # the fixture's --reasoning-tokens
# Loopback + parse, usually ~1 ms. The server runs in this process (a thread), so the client
# waits whenever the server's threads or a garbage collection hold the interpreter: a
# clean-clone CI run saw 560 ms once (all of one request's chunks read in one 8 ms burst).
# The exact checks are the lower bound and one clock; this one only rules out seconds off.
SLACK_MS = 2000.0
TOOLS = ({"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}},)


async def _log(url: str) -> dict[str, dict[str, Any]]:
    async with (
        aiohttp.ClientSession(headers=AUTH) as s,
        s.get(url + "/v1/request_log") as r,
    ):
        return {e["response_id"]: e for e in await r.json()}


def _send_all(url: str, api: str, specs: list[RequestSpec], stream: bool) -> list[RequestRecord]:
    ep = EndpointConfig(url, model=MODEL, api=api, api_key_env="LOADLAB_TEST_KEY")
    cfg = RunConfig(endpoints=(ep,), stream=stream, concurrency=len(specs), requests=len(specs))

    async def go() -> list[RequestRecord]:
        t0 = time.perf_counter_ns()
        async with make_client(ep, cfg) as client:
            done = await asyncio.gather(*(client.send(s, t0_ns=t0) for s in specs))
        for d in done:  # back to raw perf_counter_ns, the server log's clock
            r = d.record
            r.sent_ns = (r.sent_ns or 0) + t0
            r.chunk_ns = [t + t0 for t in r.chunk_ns]
            r.answer_ns = None if r.answer_ns is None else r.answer_ns + t0
        return [d.record for d in done]

    return asyncio.run(go())


def _within(
    mine_ms: float | None, server_ns: int | None, received_ns: int, r: RequestRecord
) -> None:
    """The client's latency is the server's plus the delivery delay and the time the request
    took to arrive: at least the server's, and not far above it."""
    assert (mine_ms is None) == (server_ns is None)
    if mine_ms is None or server_ns is None:
        return
    assert r.sent_ns is not None and r.sent_ns <= received_ns
    server_ms = (server_ns - received_ns) / 1e6
    assert server_ms <= mine_ms <= server_ms + SLACK_MS


@pytest.mark.parametrize("api", ["chat", "anthropic", "responses"])
def test_ttft_ttfat_and_token_counts_equal_the_server_log(reasoning_server: Any, api: str) -> None:
    # 4 < 6: all reasoning, no answer (TTFAT undefined); 6: exactly the reasoning; the rest answer
    lengths = (4, 6, 7, 12, 20, 33)
    specs = [RequestSpec(f"{api}-{n}", f"question {n} for {api}", n) for n in lengths]
    tool_spec = RequestSpec(f"{api}-tool", "use the tool", 15, tools=TOOLS)
    records = _send_all(reasoning_server.url, api, [*specs, tool_spec], stream=True)
    log = asyncio.run(_log(reasoning_server.url))
    for r, n in zip(records, (*lengths, 15), strict=True):
        assert r.outcome == "ok", r.error
        entry = log[r.response_id or ""]
        assert entry["api"] == {"chat": "chat", "anthropic": "messages"}.get(api, api)
        assert r.output_tokens == n and r.output_tokens_source == "usage"
        # counts: every piece the server wrote is one token chunk here, of the same kind
        assert r.reasoning_chunks == entry["reasoning_chunks"] == min(n, REASONING)
        assert metrics.reasoning_token_count(r) == entry["reasoning_tokens"]
        assert metrics.answer_token_count(r) == entry["answer_tokens"]
        assert metrics.tool_call_token_count(r) == entry["tool_call_tokens"]
        assert len(r.chunk_ns) == (
            entry["reasoning_chunks"] + entry["answer_chunks"] + entry["tool_call_chunks"]
        )
        # times, on one clock
        _within(metrics.ttft_ms(r), entry["first_token_ns"], entry["received_ns"], r)
        _within(metrics.ttfat_ms(r), entry["first_answer_ns"], entry["received_ns"], r)
    tool = records[-1]
    assert tool.tool_calls == 1 and tool.answer_ns is None
    assert log[tool.response_id or ""]["tool"] == "lookup"


@pytest.mark.parametrize("api", ["chat", "anthropic", "responses"])
def test_non_streaming_answers_carry_the_same_counts(reasoning_server: Any, api: str) -> None:
    specs = [
        RequestSpec(f"w-{api}", "a whole answer", 10),
        RequestSpec(f"w-{api}-t", "t", 9, tools=TOOLS),
    ]
    plain, tool = _send_all(reasoning_server.url, api, specs, stream=False)
    log = asyncio.run(_log(reasoning_server.url))
    assert plain.outcome == tool.outcome == "ok"
    assert plain.reasoning_chunks == 1 and plain.answer_ns is not None  # one chunk, whole
    assert (plain.output_tokens, tool.tool_calls, tool.answer_ns) == (10, 1, None)
    if api != "anthropic":  # the Messages API's usage has no reasoning count
        assert plain.reasoning_tokens == log[plain.response_id or ""]["reasoning_tokens"] == 6

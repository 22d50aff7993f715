"""The Responses API dialect against the fault server: every misbehaviour classifies as in the
chat dialect (``tests/clients/test_faults.py``); its stream parsing is in test_reasoning.py."""

from __future__ import annotations

import asyncio
import time

import pytest

from loadlab.clients import ResponsesClient
from loadlab.clients.responses import responses_url
from loadlab.config import EndpointConfig
from loadlab.records import RequestRecord, RequestSpec
from loadlab.testing.fault_server import FaultServer
from tests.helpers.clients import CANARY
from tests.helpers.loopback import FAULT_OUTCOMES as EXPECTED

TRANSPORTS = ["raw", "aiohttp"]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://h:8000", "http://h:8000/v1/responses"),
        ("http://h:8000/v1/", "http://h:8000/v1/responses"),
        ("http://h/v1/responses", "http://h/v1/responses"),
    ],
)
def test_responses_url(url: str, expected: str) -> None:
    assert responses_url(EndpointConfig(url, api="responses")) == expected


async def _send_one(url: str, *, stream: bool = True, transport: str = "raw") -> RequestRecord:
    ep = EndpointConfig(url, api="responses")
    async with ResponsesClient(
        ep, stream=stream, timeout_s=0.6, read_timeout_s=0.3, transport=transport
    ) as c:
        return (await c.send(RequestSpec("f1", "hi", 3), t0_ns=time.perf_counter_ns())).record


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_each_fault_becomes_its_outcome(fault_server: FaultServer, transport: str) -> None:
    async def main() -> dict[str, RequestRecord]:
        modes = list(EXPECTED)
        recs = await asyncio.gather(
            *(_send_one(f"{fault_server.url}/fault/{m}", transport=transport) for m in modes)
        )
        return dict(zip(modes, recs, strict=True))

    records = asyncio.run(main())
    assert {m: r.outcome for m, r in records.items()} == EXPECTED
    assert records["429"].server["retry_after_s"] == 7.0
    assert "model overloaded" in (records["429"].error or "")
    assert "500 Internal Server Error" in (records["500_html"].error or "")
    assert records["stream_error"].error == "error in stream: model overloaded"
    assert len(records["reset"].chunk_ns) == 1  # tokens before the failure keep their times
    assert len(records["eof"].chunk_ns) == 2  # the text was done, the response never completed
    ok = records["ok"]
    assert (ok.prompt_tokens, ok.output_tokens, len(ok.chunk_ns), ok.response_id) == (1, 3, 3, "f")
    assert ok.finish_reason == "completed"
    for r in records.values():
        assert r.sent_ns is not None and r.end_ns is not None


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_non_streaming_faults(fault_server: FaultServer, transport: str) -> None:
    async def main() -> list[str]:
        modes = ["ok", "non_json", "429", "stream_error"]
        urls = [f"{fault_server.url}/fault/{m}" for m in modes]
        recs = await asyncio.gather(
            *(_send_one(u, stream=False, transport=transport) for u in urls)
        )
        return [r.outcome for r in recs]

    assert asyncio.run(main()) == ["ok", "protocol_error", "http_429", "protocol_error"]


def test_the_key_never_reaches_a_record(
    fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOADLAB_TEST_KEY", CANARY)

    async def main() -> RequestRecord:
        ep = EndpointConfig(
            f"{fault_server.url}/fault/echo_auth", api="responses", api_key_env="LOADLAB_TEST_KEY"
        )
        async with ResponsesClient(ep) as c:
            return (await c.send(RequestSpec("k", "hi", 3), t0_ns=time.perf_counter_ns())).record

    r = asyncio.run(main())
    assert r.outcome == "http_401" and CANARY not in str(r.to_dict())
    assert "***" in (r.error or "")

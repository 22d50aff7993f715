"""The Responses API dialect against the fault server: every misbehaviour classifies as in the
chat dialect (``tests/clients/test_faults.py``); its stream parsing is in test_reasoning.py."""

from __future__ import annotations

import asyncio
import time

import pytest

from loadlab.clients import ResponsesClient
from loadlab.clients.streaming import api_url
from loadlab.config import EndpointConfig
from loadlab.records import RequestRecord, RequestSpec
from loadlab.testing.fault_server import FaultServer
from tests.helpers.clients import CANARY, assert_faults_classified, run_faults
from tests.helpers.loopback import FAULT_OUTCOMES

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
    assert api_url(EndpointConfig(url, api="responses")) == expected


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_each_fault_becomes_its_outcome(fault_server: FaultServer, transport: str) -> None:
    records = run_faults(ResponsesClient, fault_server.url, "responses", list(FAULT_OUTCOMES),
                         transport=transport)  # fmt: skip
    assert_faults_classified(records)
    assert len(records["eof"].chunk_ns) == 2  # the text was done, the response never completed
    ok = records["ok"]
    assert (ok.prompt_tokens, ok.output_tokens, len(ok.chunk_ns), ok.response_id) == (1, 3, 3, "f")
    assert ok.finish_reason == "completed"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_non_streaming_faults(fault_server: FaultServer, transport: str) -> None:
    modes = ["ok", "non_json", "429", "stream_error"]
    records = run_faults(ResponsesClient, fault_server.url, "responses", modes, stream=False,
                         transport=transport)  # fmt: skip
    outcomes = [r.outcome for r in records.values()]
    assert outcomes == ["ok", "protocol_error", "http_429", "protocol_error"]


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

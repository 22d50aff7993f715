"""Every fault of a real misbehaving server becomes its outcome class; a run goes on past them;
an API key never leaks into records, results or logs. What every dialect must do is checked here
for each of them (``DIALECTS``); what a dialect adds is in its own module."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from loadlab.clients import AnthropicClient, OpenAIClient, ResponsesClient
from loadlab.clients._streaming import StreamingClient
from loadlab.config import EndpointConfig
from loadlab.records import RequestRecord, RequestSpec
from loadlab.results import Results, write_results
from tests.helpers.clients import CANARY, assert_faults_classified, run_faults, send_one, sse_state
from tests.helpers.fault_server import FaultServer
from tests.helpers.loopback import FAULT_OUTCOMES, free_port

EXPECTED = FAULT_OUTCOMES
TRANSPORTS = ["raw", "aiohttp"]
DIALECTS = [  # each dialect's client and its api
    pytest.param(OpenAIClient, "chat", id="chat"),
    pytest.param(AnthropicClient, "anthropic", id="anthropic"),
    pytest.param(ResponsesClient, "responses", id="responses"),
]
# Streams of JSON events in shapes a dialect never sends (or not JSON at all), by dialect.
ODD_SHAPES = {
    "chat": [
        b'data: {"choices": {"a": 1}}\n\n',
        b'data: {"choices": ["x"]}\n\n',
        b"data: [1, 2]\n\n",
        b'data: {"choices": [{"delta": "x"}]}\n\n',
    ],
    "anthropic": [
        b"data: [1]\n\n",
        b"data: not json\n\n",
        b'data: {"type":"content_block_delta","delta":"x"}\n\n',
        b'data: {"type":"content_block_delta"}\n\n',
        b'data: {"type":"message_start","message":[]}\n\n',
        b'data: {"type":"message_delta","delta":null}\n\n',
    ],
}
# The modes that mean something to a non-streamed request, and what each must become: a
# stream's error event where JSON is expected is a protocol error, not a stream error.
NON_STREAMING_FAULTS = {
    "ok": "ok",
    "non_json": "protocol_error",
    "429": "http_429",
    "stream_error": "protocol_error",
}


@pytest.mark.parametrize(
    ("kind", "body"), [(kind, body) for kind, bodies in ODD_SHAPES.items() for body in bodies]
)
def test_odd_event_shapes_are_protocol_errors_not_exceptions(kind: str, body: bytes) -> None:
    """The whole stream ``body`` ends the request as a protocol error, not an exception: the
    state asks to stop reading, and the record's outcome says why."""
    state = sse_state(kind)
    assert state.on_bytes(body, 2000) is True
    state.finish(3000)
    assert state.record.outcome == "protocol_error"


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("api", ["chat", "completions"])
def test_each_fault_becomes_its_outcome(
    fault_server: FaultServer, api: str, transport: str
) -> None:
    records = run_faults(OpenAIClient, fault_server.url, api, list(EXPECTED), transport=transport)
    assert_faults_classified(records)
    assert len(records["eof"].chunk_ns) == 2  # tokens before the failure keep their times


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(("client", "api"), DIALECTS)
def test_non_streaming_faults(
    fault_server: FaultServer, client: type[StreamingClient], api: str, transport: str
) -> None:
    modes = list(NON_STREAMING_FAULTS)
    records = run_faults(client, fault_server.url, api, modes, stream=False, transport=transport)
    assert {m: r.outcome for m, r in records.items()} == NON_STREAMING_FAULTS


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_connection_refused_is_connect_error(transport: str) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    rec = asyncio.run(send_one(OpenAIClient, url, "chat", transport=transport))
    assert rec.outcome == "connect_error"


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(("client", "api"), DIALECTS)
def test_a_run_continues_past_faults(
    fault_server: FaultServer, client: type[StreamingClient], api: str, transport: str
) -> None:
    """One client, requests in sequence over kept-alive connections, faults in between."""
    modes = ["ok", "429", "ok", "reset", "ok", "malformed", "ok", "500_html", "ok", "eof", "ok"]

    async def main() -> list[str]:
        ep = EndpointConfig(fault_server.url, api=api)
        async with client(ep, max_connections=2, transport=transport) as c:
            t0 = time.perf_counter_ns()
            out = []
            for i, mode in enumerate(modes):
                spec = RequestSpec(f"q{i}", "hi", 3, extra_body={"fault": mode})  # per request
                out.append((await c.send(spec, t0_ns=t0)).record.outcome)
            return out

    outcomes = asyncio.run(main())
    assert outcomes == [EXPECTED[m] for m in modes]  # every ok after a fault is still ok


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_cancel_records_then_reraises(fault_server: FaultServer, transport: str) -> None:
    async def main() -> OpenAIClient:
        ep = EndpointConfig(fault_server.url + "/fault/stall")
        async with OpenAIClient(ep, transport=transport) as c:
            task = asyncio.ensure_future(
                c.send(RequestSpec("c1", "hi", 3), t0_ns=time.perf_counter_ns())
            )
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return c

    client = asyncio.run(main())
    [rec] = client.cancelled_records
    assert (rec.request_id, rec.outcome) == ("c1", "cancelled")
    assert len(rec.chunk_ns) == 1 and rec.end_ns is not None


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(("client", "api"), DIALECTS)
def test_canary_key_never_leaks(
    client: type[StreamingClient],
    api: str,
    transport: str,
    fault_server: FaultServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("LOADLAB_TEST_KEY", CANARY)
    caplog.set_level(logging.DEBUG)
    modes = ["ok", "echo_auth", "429", "reset", "malformed", "stream_error"]

    async def main() -> list[RequestRecord]:
        recs = []
        for mode in modes:
            url = f"{fault_server.url}/fault/{mode}"
            ep = EndpointConfig(url, api=api, api_key_env="LOADLAB_TEST_KEY")
            async with client(ep, transport=transport) as c:
                recs.append((await c.send(RequestSpec(mode, "hi", 3), t0_ns=0)).record)
        return recs

    records = asyncio.run(main())
    assert [r.outcome for r in records] == [
        "ok",
        "http_401",
        "http_429",
        "incomplete",
        "protocol_error",
        "stream_error",
    ]
    # the server echoed the key back: OpenAI's dialects send "Authorization: Bearer <key>",
    # Anthropic's the bare key as x-api-key
    echoed = "bad key: ***" if api == "anthropic" else "bad key: Bearer ***"
    assert echoed in (records[1].error or "")
    cfg = {"endpoints": [{"url": fault_server.url, "api_key_env": "LOADLAB_TEST_KEY"}]}
    path = write_results(Results(records=records, config=cfg), tmp_path / "run.json")
    assert CANARY not in path.read_text()
    assert all(CANARY not in repr(r) for r in records)
    assert CANARY not in caplog.text


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_url_credentials_go_as_basic_auth_and_never_into_records(
    transport: str, fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """URL user-info is not dropped: the raw transport and aiohttp both
    send it as Basic auth, the client's URL holds none, and an echo of it is scrubbed."""
    seen: list[str | None] = []
    handle = fault_server.handle

    def recording(conn: Any, req: Any) -> None:
        seen.append(req.headers.get("authorization"))
        handle(conn, req)

    monkeypatch.setattr(fault_server, "handle", recording)
    base = fault_server.url.replace("http://", "http://al%40ice:pa55word@")

    async def main() -> list[Any]:
        recs = []
        for mode in ("ok", "echo_auth"):
            ep = EndpointConfig(f"{base}/fault/{mode}", api="completions")
            async with OpenAIClient(ep, transport=transport, timeout_s=5) as c:
                assert "pa55word" not in c.url
                recs.append((await c.send(RequestSpec(mode, "hi", 3), t0_ns=0)).record)
        return recs

    ok, echoed = asyncio.run(main())
    token = base64.b64encode(b"al@ice:pa55word").decode()
    assert seen == [f"Basic {token}"] * 2
    assert (ok.outcome, echoed.outcome) == ("ok", "http_401")
    assert token not in repr(echoed) and "bad key: ***" in echoed.error


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_endless_sse_line_is_a_protocol_error_and_closes_the_connection(
    fault_server: FaultServer, transport: str
) -> None:
    """A server sending one endless line; the client stops at its limit (here
    1 MiB, set as a run's --max-event-bytes would) and hangs up, so the server sees the close."""
    before = len(fault_server._conns)

    async def main() -> tuple[Any, int]:
        ep = EndpointConfig(f"{fault_server.url}/fault/huge_line", api="chat")
        client = OpenAIClient(ep, transport=transport, timeout_s=20, max_event_bytes=1 << 20)
        async with client as c:
            rec = (await c.send(RequestSpec("h1", "hi", 3), t0_ns=0)).record
            deadline = time.monotonic() + 5
            while len(fault_server._conns) > before and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            return rec, len(fault_server._conns)

    rec, open_after = asyncio.run(main())
    assert rec.outcome == "protocol_error", rec.error
    assert "over 1048576 bytes" in rec.error and len(rec.chunk_ns) == 1
    assert open_after == before  # closed while the client was still open: not kept for reuse

"""The client over https, against a real TLS server on loopback with a self-signed certificate
trusted through SSL_CERT_FILE (as a user would trust a private CA)."""

from __future__ import annotations

import asyncio
import ssl
import time
from pathlib import Path

import pytest

from loadlab._runner.runner import Runner, run_async
from loadlab.clients import OpenAIClient
from loadlab.clients._gate import SendGate
from loadlab.config import EndpointConfig, RunConfig
from loadlab.records import RequestSpec
from loadlab.results import Results
from loadlab.selftest._fixed_server import FixedScheduleServer
from tests.helpers.loopback import self_signed_cert


@pytest.fixture
def cert(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    crt, key = self_signed_cert(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(crt))
    return crt, key


@pytest.mark.parametrize("transport", ["raw", "aiohttp"])
def test_streaming_over_tls(cert: tuple[Path, Path], transport: str) -> None:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(*cert)

    async def main() -> None:
        async with FixedScheduleServer(ttft_ms=5, itl_ms=1, ssl_context=ctx) as srv:
            assert srv.url.startswith("https://")
            async with OpenAIClient(EndpointConfig(srv.url), transport=transport) as c:
                for i in range(2):  # the second request reuses the TLS connection
                    spec = RequestSpec(f"tls{i}", "hi", 4)
                    done = await c.send(spec, t0_ns=time.perf_counter_ns())
                    assert (done.record.outcome, done.record.output_tokens) == ("ok", 4), (
                        done.record.error
                    )
                    assert len(done.record.chunk_ns) == 4

    asyncio.run(main())


@pytest.mark.parametrize("tls", [True, False])
def test_an_open_loop_on_uvloop_sends_from_its_thread_in_the_clear_only(
    cert: tuple[Path, Path], tls: bool
) -> None:
    # the sender thread writes a request on the socket itself only where the bytes go as they
    # are; over TLS the loop's transport encrypts them: every request is answered either way
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(*cert)
    by_thread: list[bool] = []
    hold = SendGate.hold

    async def watched(gate: SendGate, write, direct=None):  # type: ignore[no-untyped-def]
        by_thread.append(direct is not None)
        return await hold(gate, write, direct)

    async def main() -> Results:
        server = FixedScheduleServer(ttft_ms=2, itl_ms=1, ssl_context=ctx if tls else None)
        async with server as srv:
            async with OpenAIClient(EndpointConfig(srv.url, model="m")) as client:
                specs = [RequestSpec(f"u{i}", "hi", 3, intended_at_s=0.01 * i) for i in range(8)]
                return await Runner(RunConfig(rate_rps=10, requests=8), iter(specs), client).run()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SendGate, "hold", watched)
        res = run_async(main())
    assert [r.outcome for r in res.records] == ["ok"] * 8
    assert by_thread == [not tls] * 8

"""The client over https, against a real TLS server on loopback with a self-signed certificate
trusted through SSL_CERT_FILE (as a user would trust a private CA)."""

from __future__ import annotations

import asyncio
import ssl
import time
from pathlib import Path

import pytest

from loadlab.clients import OpenAIClient
from loadlab.config import EndpointConfig
from loadlab.records import RequestSpec
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

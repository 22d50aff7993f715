"""How a client moves bytes: two interchangeable transports for one sans-IO state.

Both feed a sans-IO ``StreamState`` (``on_sent``, ``on_headers``, ``on_bytes``, then ``finish`` or
``fail``) and turn every network failure into an outcome, never an exception (a cancellation
propagates; the client records it).

- ``RawTransport`` (default): ``loadlab.clients._pool`` over ``loadlab.clients._http1``; a chunk is stamped and interpreted
  inside ``data_received``, with no task wake-up per chunk. Lowest CPU per token and the
  earliest timestamp.
- ``AiohttpTransport``: aiohttp's session and ``iter_any``; a chunk is stamped when the reading
  task resumes. The fallback for what the raw transport leaves out: proxies from the
  environment (``HTTP_PROXY``, ``HTTPS_PROXY``, ``NO_PROXY``, as ``urllib`` reads them), redirects.

The raw transport does not go through a proxy. Where the environment names one for the
endpoint (and ``NO_PROXY`` does not exempt it), ``make_transport("raw", ...)`` refuses with a
``ConfigError`` that says to use ``--transport aiohttp`` (``RunConfig`` refuses first, before
any request), rather than bypass the proxy unseen.

Example::

    settings = TransportSettings(url, headers, max_connections=64, timeout_s=120, read_timeout_s=30)
    transport = make_transport("raw", settings)
    await transport.exchange(body_bytes, "req-1", state)
    await transport.close()
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
from aiohttp.payload import BytesPayload

from loadlab._headers import check_no_proxy, split_userinfo
from loadlab.clients._gate import SendGate
from loadlab.clients._http1 import Failure, RawResult, Target, frame_request, header_value
from loadlab.clients._pool import RawPool
from loadlab.errors import ConfigError
from loadlab.records import (
    OUTCOME_CONNECT_ERROR,
    OUTCOME_INCOMPLETE,
    OUTCOME_PROTOCOL_ERROR,
    OUTCOME_TIMEOUT,
)

if TYPE_CHECKING:
    from loadlab.clients._state import StreamState

__all__ = [
    "RAW_OUTCOMES",
    "TRANSPORTS",
    "AiohttpTransport",
    "RawTransport",
    "Transport",
    "TransportSettings",
    "make_transport",
    "settle",
]

TRANSPORTS = ("raw", "aiohttp")
PRECONNECT_TIMEOUT_S = 2.0  # a spare connection not made by then is left to the request
RAW_OUTCOMES = {  # RawResult.error -> outcome class (the Locust transport shares it)
    Failure.CONNECT: OUTCOME_CONNECT_ERROR,
    Failure.TIMEOUT: OUTCOME_TIMEOUT,
    Failure.INCOMPLETE: OUTCOME_INCOMPLETE,
    Failure.PROTOCOL: OUTCOME_PROTOCOL_ERROR,
}


def settle(state: StreamState, result: RawResult) -> None:
    """Hand a raw exchange's ending to its stream state: finished, or failed with the outcome
    class of ``result.error``, at the stamp of the read that ended it (``RawResult.end_ns``)."""
    end_ns = result.end_ns or time.perf_counter_ns()
    if result.error is None:
        state.finish(end_ns)
    else:
        state.fail(RAW_OUTCOMES[result.error], result.message, end_ns)


class Transport(Protocol):
    async def exchange(
        self, body: bytes, request_id: str, state: StreamState, gate: SendGate | None = None
    ) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class TransportSettings:
    """What either transport is built from: where to send, the headers every request carries,
    the connection cap, and the two time limits (the whole exchange, and the wait for any byte)."""

    url: str
    headers: Mapping[str, str]
    max_connections: int
    timeout_s: float
    read_timeout_s: float


class RawTransport:
    def __init__(self, settings: TransportSettings) -> None:
        self.target = Target.from_url(settings.url)
        self._head = self.target.request_head(settings.headers)
        self._pool = RawPool(settings.max_connections)
        self.timeout_s, self.read_timeout_s = settings.timeout_s, settings.read_timeout_s

    async def exchange(
        self, body: bytes, request_id: str, state: StreamState, gate: SendGate | None = None
    ) -> None:
        res = await self._pool.request(
            self.target,
            frame_request(self._head, request_id, body),
            state,
            timeout_s=self.timeout_s,
            read_timeout_s=self.read_timeout_s,
            gate=gate,
        )
        if gate is not None and gate.withdrawn:
            return  # never written: nothing to record
        if res.sent_ns is not None:
            state.on_sent(res.sent_ns)
        settle(state, res)

    def preconnect(self) -> asyncio.Task[None] | None:
        return self._pool.preconnect(self.target, min(self.timeout_s, PRECONNECT_TIMEOUT_S))

    async def close(self) -> None:
        self._pool.close()


class _StampedBody(BytesPayload):
    """The request body; stamps ``perf_counter_ns`` as aiohttp starts writing it (it holds the
    headers back and writes them with the body), i.e. right before the bytes go to the socket."""

    sent_ns: int | None = None

    async def write(self, writer: Any) -> None:
        self.sent_ns = time.perf_counter_ns()
        await super().write(writer)

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        self.sent_ns = time.perf_counter_ns()
        await super().write_with_length(writer, content_length)


class AiohttpTransport:
    def __init__(self, settings: TransportSettings) -> None:
        self.url = url = settings.url
        self._headers = dict(settings.headers)
        self.timeout = aiohttp.ClientTimeout(
            total=settings.timeout_s, sock_read=settings.read_timeout_s
        )
        # A context made now (not aiohttp's, cached at import) honours SSL_CERT_FILE as set for
        # this run, like the raw transport.
        tls = ssl.create_default_context() if url.startswith("https://") else True
        connector = aiohttp.TCPConnector(limit=settings.max_connections, limit_per_host=0, ssl=tls)
        # trust_env: HTTP_PROXY, HTTPS_PROXY and NO_PROXY from the environment, as documented
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self.timeout, trust_env=True
        )

    async def exchange(
        self, body: bytes, request_id: str, state: StreamState, gate: SendGate | None = None
    ) -> None:
        """With ``gate``: sent when it fires (aiohttp takes its connection as it sends)."""
        if gate is not None and not await gate.wait():
            return  # withdrawn: never sent
        payload = _StampedBody(body, content_type="application/json")
        headers = {**self._headers, "X-Request-Id": header_value(request_id)}
        clock = time.perf_counter_ns
        try:
            try:
                async with self._session.post(self.url, data=payload, headers=headers) as resp:
                    state.on_headers(resp.status, resp.headers, clock())
                    async for data in resp.content.iter_any():
                        if state.on_bytes(data, clock()):
                            break
                    state.finish(clock())
            finally:
                if payload.sent_ns is not None:
                    state.on_sent(payload.sent_ns)
        except TimeoutError:
            t = self.timeout
            state.fail(OUTCOME_TIMEOUT, f"no byte for {t.sock_read} s or past {t.total} s", clock())
        except aiohttp.ClientPayloadError as exc:
            state.fail(OUTCOME_INCOMPLETE, f"stream cut: {exc}", clock())
        except (aiohttp.ClientConnectionError, OSError) as exc:
            outcome = (
                OUTCOME_CONNECT_ERROR if state.record.headers_ns is None else OUTCOME_INCOMPLETE
            )
            state.fail(outcome, f"{type(exc).__name__}: {exc}", clock())
        except aiohttp.ClientError as exc:  # e.g. an unparseable HTTP response
            state.fail(OUTCOME_PROTOCOL_ERROR, f"{type(exc).__name__}: {exc}", clock())

    async def close(self) -> None:
        await self._session.close()


def make_transport(kind: str, settings: TransportSettings) -> Transport:
    """The transport named ``kind`` (one of ``TRANSPORTS``); ``ConfigError`` for the raw one
    where the environment names a proxy for the URL (``loadlab._headers.check_no_proxy``)."""
    classes: dict[str, type[RawTransport] | type[AiohttpTransport]] = {
        "raw": RawTransport,
        "aiohttp": AiohttpTransport,
    }
    # URL user-info becomes Basic auth on both transports (aiohttp would send it, the raw one
    # would drop it), and the URL kept for messages no longer holds it.
    url, basic = split_userinfo(settings.url)
    headers = settings.headers
    if basic is not None and not any(k.lower() == "authorization" for k in headers):
        headers = {"Authorization": basic, **headers}
    settings = replace(settings, url=url, headers=headers)
    if kind == "raw":
        check_no_proxy(url)
    if kind in classes:
        return classes[kind](settings)
    raise ConfigError(f"transport must be one of {', '.join(TRANSPORTS)}, got {kind!r}")

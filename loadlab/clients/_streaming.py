"""What every dialect's async client shares: the API key, the headers, the transport and the
``send`` that turns a ``RequestSpec`` into a timed record. A dialect (``OpenAIClient``,
``AnthropicClient``, ``ResponsesClient``) subclasses ``StreamingClient`` and names its APIs and
its stream state (each API's URL path is in ``API_PATHS``, its body in
``loadlab.clients._bodies``); the dialects are siblings, none knows another.

Timing (docs/clients.md, "What is measured"): ``sent_ns`` is taken immediately before the
request bytes are written to the socket (after the connection is made, so connection set-up is
not latency); a chunk's time is taken when its bytes are read (raw: first thing in
``data_received``; aiohttp: as ``iter_any`` hands them over), before any JSON parsing.

The API key is read from the environment variable ``endpoint.api_key_env``; it is never stored
in a record, and any error text that could echo it is scrubbed.

Example::

    async with OpenAIClient(EndpointConfig("http://127.0.0.1:8000", model="m")) as client:
        done = await client.send(spec, t0_ns=time.perf_counter_ns())
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Self

from loadlab._headers import is_credential
from loadlab._version import __version__
from loadlab.clients._base import Completion, Message
from loadlab.clients._bodies import build_body
from loadlab.clients._gate import SendGate
from loadlab.clients._sse import MAX_EVENT_BYTES
from loadlab.clients._state import StreamState, dumps
from loadlab.clients._transports import TRANSPORTS, Transport, TransportSettings, make_transport
from loadlab.config import EndpointConfig
from loadlab.errors import ConfigError
from loadlab.records import OUTCOME_CANCELLED, RequestRecord, RequestSpec

__all__ = ["API_PATHS", "StreamingClient", "api_url", "read_api_key", "secret_values", "v1_url"]

# The path each API posts to (after the base URL's /v1)
API_PATHS = {
    "chat": "/chat/completions",
    "completions": "/completions",
    "anthropic": "/messages",
    "responses": "/responses",
    "embeddings": "/embeddings",
    "rerank": "/rerank",
    "score": "/score",
}


def v1_url(endpoint: EndpointConfig, path: str) -> str:
    """The request URL: ``endpoint.url`` with ``/v1`` and ``path`` appended (a base that ends in
    ``/v1`` gets ``path`` alone; one that names the path already is used as is).

    >>> v1_url(EndpointConfig("http://h:8000/v1/"), "/responses")
    'http://h:8000/v1/responses'
    """
    url = endpoint.url.rstrip("/")
    if url.endswith(path):
        return url
    return url + path if url.endswith("/v1") else url + "/v1" + path


def api_url(endpoint: EndpointConfig) -> str:
    """The request URL of ``endpoint.api`` (``API_PATHS``), as ``v1_url`` makes it.

    >>> api_url(EndpointConfig("http://h:8000/v1", api="completions"))
    'http://h:8000/v1/completions'
    >>> api_url(EndpointConfig("http://h:8000", api="anthropic"))
    'http://h:8000/v1/messages'
    """
    return v1_url(endpoint, API_PATHS[endpoint.api])


def read_api_key(endpoint: EndpointConfig) -> str | None:
    """The key from ``endpoint.api_key_env``; a named but unset variable is an error."""
    if not endpoint.api_key_env:
        return None
    key = os.environ.get(endpoint.api_key_env, "")
    if not key:
        raise ConfigError(
            f"endpoint {endpoint.name!r}: environment variable {endpoint.api_key_env} is empty "
            "or unset; export it with the API key (or drop api_key_env)"
        )
    return key


class StreamingClient:
    """What every dialect's client shares (see module docstring). Use as ``async with``.

    ``max_connections=0`` means no limit (open loop without a cap); closed loop passes the
    concurrency. ``transport`` is ``"raw"`` (default, lowest overhead) or ``"aiohttp"``
    (``loadlab.clients._transports``). A cancelled ``send`` records the request (outcome
    ``cancelled``) in ``cancelled_records`` and re-raises.

    A dialect subclasses it and names ``APIS`` and ``STATE`` (its stream state); one whose key
    header is not ``Authorization: Bearer`` or whose state takes more arguments overrides
    ``_auth`` or ``_state``. The body comes from ``loadlab.clients._bodies``.
    """

    APIS: tuple[str, ...] = ()
    STATE: ClassVar[type[StreamState]]
    SENDS_AT_GATE = True  # send() takes a gate: ready now, written when it fires

    def __init__(
        self,
        endpoint: EndpointConfig,
        *,
        stream: bool = True,
        include_usage: bool = True,
        extra_body: Mapping[str, Any] | None = None,
        timeout_s: float = 120.0,
        read_timeout_s: float = 30.0,
        max_connections: int = 0,
        transport: str = "raw",
        token_ends: Callable[[str], Sequence[int]] | None = None,
        max_event_bytes: int = MAX_EVENT_BYTES,
    ) -> None:
        if endpoint.api not in self.APIS:
            raise ConfigError(
                f"{type(self).__name__} speaks api {' or '.join(self.APIS)}, not {endpoint.api!r}"
            )
        if timeout_s <= 0 or read_timeout_s <= 0:
            raise ConfigError("--timeout and --read-timeout must be > 0 seconds")
        if transport not in TRANSPORTS:
            raise ConfigError(
                f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}"
            )
        self.endpoint = endpoint
        self.url = api_url(endpoint)
        self.stream = stream
        self.include_usage = include_usage
        self.extra_body = dict(extra_body or {})
        self.timeout_s, self.read_timeout_s = timeout_s, read_timeout_s
        self.max_connections = max_connections
        self.max_event_bytes = max_event_bytes  # longest SSE line, event or whole body
        self.transport_kind = transport
        self.token_ends = token_ends  # the model's tokenizer: tokens per chunk (StreamState)
        key = read_api_key(endpoint)
        self._secrets: tuple[str, ...] = (key,) if key else ()
        self._headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream" if stream else "application/json",
            "Accept-Encoding": "identity",  # a compressed stream would be buffered
            "User-Agent": f"loadlab/{__version__}",  # some gateways refuse requests without one
            **endpoint.headers,
        }
        if key:
            self._headers.update(self._auth(key))
        self._secrets += secret_values(self._headers)
        self._transport: Transport | None = None
        self.cancelled_records: list[RequestRecord] = []

    def _auth(self, key: str) -> dict[str, str]:
        """The headers that carry the API key (OpenAI's, which most servers take)."""
        return {"Authorization": f"Bearer {key}"}

    def _body(self, spec: RequestSpec, history: Sequence[Message]) -> dict[str, Any]:
        """The request body (``loadlab.clients._bodies``; a dialect with its own shape overrides)."""
        return build_body(
            spec,
            self.endpoint,
            history=history,
            stream=self.stream,
            include_usage=self.include_usage,
            extra_body=self.extra_body,
        )

    def _state(self, rec: RequestRecord, t0_ns: int) -> StreamState:
        """The sans-IO state that interprets one response into ``rec``."""
        return self.STATE(
            rec,
            stream=self.stream,
            t0_ns=t0_ns,
            secrets=self._secrets,
            max_event_bytes=self.max_event_bytes,
        )

    async def __aenter__(self) -> Self:
        settings = TransportSettings(
            self.url,
            self._headers,
            max_connections=self.max_connections,
            timeout_s=self.timeout_s,
            read_timeout_s=self.read_timeout_s,
        )
        self._transport = make_transport(self.transport_kind, settings)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._transport is not None:
            await self._transport.close()
            self._transport = None

    def encode_body(self, spec: RequestSpec) -> bytes:
        """The body of ``spec`` as the first request of its session, encoded: what ``send``
        takes as ``body`` (a run encodes big prompts ahead of their send time)."""
        return dumps(self._body(spec, ()))

    def preconnect(self) -> asyncio.Task[None] | None:
        """Start opening a spare connection for a request due soon (the open loop calls it
        ahead of each one), where the transport keeps its own connections (``raw``): the task
        that opens it, or None."""
        spare = getattr(self._transport, "preconnect", None)
        return spare() if spare is not None else None

    async def send(
        self,
        spec: RequestSpec,
        *,
        t0_ns: int,
        history: Sequence[Message] = (),
        intended_ns: int | None = None,
        body: bytes | None = None,
        gate: SendGate | None = None,
    ) -> Completion:
        if self._transport is None:
            name = type(self).__name__
            raise RuntimeError(f"use {name} as `async with {name}(...) as client`")
        rec = RequestRecord.for_spec(
            spec, endpoint=self.endpoint.name, intended_ns=intended_ns, streamed=self.stream
        )
        state = self._state(rec, t0_ns)
        state.token_ends = self.token_ends
        if body is None or history:
            body = dumps(self._body(spec, history))
        attempt_ns = time.perf_counter_ns()
        try:
            if gate is None:
                await self._transport.exchange(body, spec.request_id, state)
            else:
                await self._transport.exchange(body, spec.request_id, state, gate)
        except asyncio.CancelledError:
            msg = "the run stopped while the request was in flight"
            state.fail(OUTCOME_CANCELLED, msg, time.perf_counter_ns())
            if gate is None or gate.fired:  # (one whose gate never fired was never sent)
                self.cancelled_records.append(rec)
            raise
        finally:
            if rec.sent_ns is None and (gate is None or gate.fired):
                # never written (no connection): the attempt counts as sent
                state.on_sent(gate.fired_ns if gate is not None else attempt_ns)
        return Completion(rec, state.text, state.tool_calls)


def secret_values(headers: Mapping[str, str]) -> tuple[str, ...]:
    """Credential header values (and their part after a scheme such as ``Basic``) to scrub
    from error excerpts: a server that echoes a header must not put it in a record. Values
    under 6 characters are left alone, or every ``1`` in a message would become ``***``."""
    values = [v for k, v in headers.items() if is_credential(k)]
    parts = [v.partition(" ")[2] for v in values]
    return tuple(s for s in values + parts if len(s) >= 6)

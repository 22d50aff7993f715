"""The OpenAI-compatible client: ``/v1/chat/completions`` and ``/v1/completions``, streamed or not.

Two layers, so the Locust user (gevent, no asyncio) shares every rule of interpretation:

- sans-IO: ``build_body`` (the request JSON) and ``OpenAIStreamState`` (feed it the response
  status, then bytes with the ``perf_counter_ns`` at which they were read; it decodes SSE,
  finds token-carrying chunks, usage, finish reason and errors, and sets the outcome);
- I/O: ``OpenAIClient`` over a transport (``loadlab.clients.transports``): ``"raw"``
  (default; a lean asyncio HTTP/1.1 protocol that stamps and interprets each chunk inside
  ``data_received``) or ``"aiohttp"`` (one session, a connector sized to the run's
  concurrency). Both keep connections alive. docs/clients.md has the measurements behind the
  default.

Timing (ARCHITECTURE.md): ``sent_ns`` is taken immediately before the request bytes are
written to the socket (after the connection is made, so connection set-up is not latency);
a chunk's time is taken when its bytes are read (raw: first thing in ``data_received``;
aiohttp: as ``iter_any`` hands them over), before any JSON parsing.

The API key is read from the environment variable ``endpoint.api_key_env`` and sent as
``Authorization: Bearer``; it is never stored in a record, and any error text that could echo
it is scrubbed.

Example::

    async with OpenAIClient(EndpointConfig("http://127.0.0.1:8000", model="m")) as client:
        done = await client.send(spec, t0_ns=time.perf_counter_ns())
        print(done.record.outcome, done.record.chunk_ns)
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from loadlab._version import __version__
from loadlab.clients.base import Completion, Message
from loadlab.clients.state import StreamState, dumps
from loadlab.clients.transports import TRANSPORTS, Transport, make_transport
from loadlab.config import EndpointConfig
from loadlab.records import (
    OUTCOME_CANCELLED,
    OUTCOME_PROTOCOL_ERROR,
    RequestRecord,
    RequestSpec,
)

__all__ = ["OpenAIClient", "OpenAIStreamState", "api_url", "build_body", "read_api_key"]


def api_url(endpoint: EndpointConfig) -> str:
    """The request URL: a base URL gets ``/v1/chat/completions`` or ``/v1/completions``.

    >>> api_url(EndpointConfig("http://h:8000/v1", api="completions"))
    'http://h:8000/v1/completions'
    """
    url = endpoint.url.rstrip("/")
    path = "/chat/completions" if endpoint.api == "chat" else "/completions"
    if url.endswith(path):
        return url
    return url + path if url.endswith("/v1") else url + "/v1" + path


def read_api_key(endpoint: EndpointConfig) -> str | None:
    """The key from ``endpoint.api_key_env``; a named but unset variable is an error."""
    if not endpoint.api_key_env:
        return None
    key = os.environ.get(endpoint.api_key_env, "")
    if not key:
        raise ValueError(
            f"endpoint {endpoint.name!r}: environment variable {endpoint.api_key_env} is empty "
            "or unset; export it with the API key (or drop api_key_env)"
        )
    return key


def build_body(
    spec: RequestSpec,
    endpoint: EndpointConfig,
    *,
    history: Sequence[Message] = (),
    stream: bool = True,
    include_usage: bool = True,
    extra_body: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The request JSON. ``extra_body`` (the run's) then ``spec.extra_body`` are merged last,
    so either can add or override fields (``{"ignore_eos": true}``)."""
    body: dict[str, Any] = {"model": endpoint.model}
    if endpoint.api == "chat":
        body["messages"] = [*history, {"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = spec.prompt
    body["max_tokens"] = spec.max_tokens
    body["stream"] = stream
    if stream and include_usage:
        body["stream_options"] = {"include_usage": True}
    body.update(extra_body or {})
    body.update(spec.extra_body)
    return body


class OpenAIStreamState(StreamState):
    """Interprets one OpenAI-dialect response; no I/O (``StreamState`` has the protocol).

    Complete: ``[DONE]``, or a ``finish_reason`` before EOF. Token-carrying chunks: a chat
    delta with non-empty ``content`` (or reasoning), a completions choice with non-empty
    ``text``.
    """

    __slots__ = ("_chat", "api")

    INCOMPLETE = "stream ended before [DONE] or a finish_reason"

    def __init__(
        self,
        record: RequestRecord,
        api: str,
        *,
        stream: bool = True,
        t0_ns: int = 0,
        secrets: Sequence[str] = (),
    ) -> None:
        super().__init__(record, stream=stream, t0_ns=t0_ns, secrets=secrets)
        self.api = api
        self._chat = api == "chat"
        if not self._chat:
            self._keys = (b'"text":"', b'"text": "')

    def _complete(self) -> bool:
        return bool(self.record.finish_reason)

    def _event(self, data: str, event: str, t_rel: int) -> bool:
        """One SSE event; True when it decided a failure."""
        if data == "[DONE]":
            self.done = True
            return False
        obj = self._json_event(data)
        if obj is None:
            return True
        if event != "message" or "error" in obj:
            if event == "error" or obj.get("error"):
                return self._error(obj, data)
        choices = obj.get("choices")
        if choices:
            try:
                c = choices[0]
                if self._chat:
                    d = c.get("delta") or {}
                    text = d.get("content")
                    if text or d.get("reasoning_content") or d.get("reasoning"):
                        self._stamps.append(t_rel)
                        if text:
                            self._parts.append(text)
                elif text := c.get("text"):
                    self._stamps.append(t_rel)
                    self._parts.append(text)
                if fr := c.get("finish_reason"):
                    self.record.finish_reason = fr
                    if "kv_transfer" in obj:
                        self._kv_transfer(obj["kv_transfer"])
            except (AttributeError, KeyError, TypeError):
                return self._set(OUTCOME_PROTOCOL_ERROR, "unexpected chunk shape: " + data)
        if obj.get("usage"):
            self.usage = obj["usage"]
            if "kv_transfer" in obj:
                self._kv_transfer(obj["kv_transfer"])
        return False

    def _kv_transfer(self, kv: Any) -> None:
        """The reference server's disaggregated mode: this request's KV transfer."""
        if isinstance(kv, dict):
            nbytes, seconds = kv.get("bytes"), kv.get("seconds")
            if isinstance(nbytes, int):
                self.record.server["kv_transfer_bytes"] = nbytes
            if isinstance(seconds, (int, float)):
                self.record.server["kv_transfer_s"] = float(seconds)

    def _answer(self, obj: dict[str, Any], raw: bytes, t_ns: int) -> None:
        try:
            c = obj["choices"][0]
            text = (c.get("message") or {}).get("content") if self.api == "chat" else c.get("text")
            self.record.finish_reason = c.get("finish_reason")
        except (KeyError, IndexError, TypeError, AttributeError):
            self._set(OUTCOME_PROTOCOL_ERROR, "no choices[0] in body: " + raw.decode())
            return
        self.usage = obj.get("usage") or None
        if "kv_transfer" in obj:
            self._kv_transfer(obj["kv_transfer"])
        if text:
            self._parts.append(text)
            self._stamps.append(t_ns - self._t0)  # the whole answer is one chunk


class OpenAIClient:
    """Async OpenAI-compatible client (see module docstring). Use as ``async with``.

    ``max_connections=0`` means no limit (open loop without a cap); closed loop passes the
    concurrency. ``transport`` is ``"raw"`` (default, lowest overhead) or ``"aiohttp"``
    (``loadlab.clients.transports``). A cancelled ``send`` records the request (outcome
    ``cancelled``) in ``cancelled_records`` and re-raises.

    Another dialect over the same transports subclasses it and overrides the hooks
    ``APIS``, ``_url``, ``_auth``, ``_body`` and ``_state`` (``AnthropicClient``).
    """

    APIS: tuple[str, ...] = ("chat", "completions")

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
    ) -> None:
        if endpoint.api not in self.APIS:
            raise ValueError(
                f"{type(self).__name__} speaks api {' or '.join(self.APIS)}, not {endpoint.api!r}"
            )
        if timeout_s <= 0 or read_timeout_s <= 0:
            raise ValueError("--timeout and --read-timeout must be > 0 seconds")
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
        self.endpoint = endpoint
        self.url = self._url()
        self.stream = stream
        self.include_usage = include_usage
        self.extra_body = dict(extra_body or {})
        self.timeout_s, self.read_timeout_s = timeout_s, read_timeout_s
        self.max_connections = max_connections
        self.transport_kind = transport
        key = read_api_key(endpoint)
        self._secrets = (key,) if key else ()
        self._headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream" if stream else "application/json",
            "Accept-Encoding": "identity",  # a compressed stream would be buffered
            "User-Agent": f"loadlab/{__version__}",  # some gateways refuse requests without one
            **endpoint.headers,
        }
        if key:
            self._headers.update(self._auth(key))
        self._transport: Transport | None = None
        self.cancelled_records: list[RequestRecord] = []

    def _url(self) -> str:
        return api_url(self.endpoint)

    def _auth(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    def _body(self, spec: RequestSpec, history: Sequence[Message]) -> dict[str, Any]:
        return build_body(
            spec,
            self.endpoint,
            history=history,
            stream=self.stream,
            include_usage=self.include_usage,
            extra_body=self.extra_body,
        )

    def _state(self, rec: RequestRecord, t0_ns: int) -> StreamState:
        return OpenAIStreamState(
            rec, self.endpoint.api, stream=self.stream, t0_ns=t0_ns, secrets=self._secrets
        )

    async def __aenter__(self) -> OpenAIClient:
        self._transport = make_transport(
            self.transport_kind,
            self.url,
            self._headers,
            max_connections=self.max_connections,
            timeout_s=self.timeout_s,
            read_timeout_s=self.read_timeout_s,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._transport is not None:
            await self._transport.close()
            self._transport = None

    async def send(
        self,
        spec: RequestSpec,
        *,
        t0_ns: int,
        history: Sequence[Message] = (),
        intended_ns: int | None = None,
    ) -> Completion:
        if self._transport is None:
            name = type(self).__name__
            raise RuntimeError(f"use {name} as `async with {name}(...) as client`")
        rec = RequestRecord.for_spec(spec, endpoint=self.endpoint.name, intended_ns=intended_ns)
        state = self._state(rec, t0_ns)
        body = self._body(spec, history)
        attempt_ns = time.perf_counter_ns()
        try:
            await self._transport.exchange(dumps(body), spec.request_id, state)
        except asyncio.CancelledError:
            msg = "the run stopped while the request was in flight"
            state.fail(OUTCOME_CANCELLED, msg, time.perf_counter_ns())
            self.cancelled_records.append(rec)
            raise
        finally:
            if rec.sent_ns is None:  # never written (no connection): the attempt counts as sent
                state.on_sent(attempt_ns)
        return Completion(rec, state.text)

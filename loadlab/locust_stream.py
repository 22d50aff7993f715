"""One streaming request under gevent: geventhttpclient, ``readline`` on the raw response.

Chosen by measurement (``benchmarks/locust_timing.py``, docs/locust.md): Locust's own
``FastHttpUser`` ``iter_lines`` reads fixed 1 KiB blocks, so tokens arrive in batches (TTFT
off by the time the block takes to fill); ``readline`` on the underlying geventhttpclient
response returns each SSE line as soon as its bytes are read, at ~0.1 ms of CPU per token;
``requests`` (urllib3) streaming costs more CPU and had 5x the tail error here; httpx is not
a Locust dependency and builds an SSL context per client (blocks the gevent loop ~20 ms).

Every chunk time is ``perf_counter_ns`` taken when ``readline`` returns, before any parsing;
the bytes then go to loadlab's sans-IO ``OpenAIStreamState`` (the same SSE decoding, token
counting and outcome rules as the asyncio client). Transport failures are values: the
record's outcome class, never an exception, except ``GreenletExit`` (Locust stopping the
user), which marks the record ``cancelled`` and is re-raised.

Example (inside a gevent-patched process)::

    conn = StreamConnection("http://127.0.0.1:8000", read_timeout_s=30)
    done = conn.send(spec, t0_ns=t0, endpoint=ep, history=[], timeout_s=120)
    print(done.record.outcome, done.text)
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import gevent
from geventhttpclient import HTTPClient
from geventhttpclient.response import HTTPConnectionClosed, HTTPParseError
from greenlet import GreenletExit

from loadlab.clients.base import Completion, Message
from loadlab.clients.openai import OpenAIStreamState, api_url, build_body, read_api_key
from loadlab.config import EndpointConfig
from loadlab.records import (
    OUTCOME_CANCELLED,
    OUTCOME_CONNECT_ERROR,
    OUTCOME_INCOMPLETE,
    OUTCOME_PROTOCOL_ERROR,
    OUTCOME_TIMEOUT,
    RequestRecord,
    RequestSpec,
)

__all__ = ["StreamConnection"]

_SSL_CONTEXT: ssl.SSLContext | None = None
_BLANK = (b"\n", b"\r\n")  # the line that ends an SSE event


def _shared_ssl_context(**_: Any) -> ssl.SSLContext:
    # One context per process: building one costs ~20 ms of CPU, which would stall every
    # other user's timestamps on the gevent loop if each connection built its own.
    global _SSL_CONTEXT
    if _SSL_CONTEXT is None:
        _SSL_CONTEXT = ssl.create_default_context()
    return _SSL_CONTEXT


class StreamConnection:
    """One Locust user's keep-alive connection to an OpenAI-compatible endpoint."""

    def __init__(
        self,
        endpoint: EndpointConfig,
        *,
        read_timeout_s: float = 30.0,
        connect_timeout_s: float = 10.0,
        include_usage: bool = True,
    ) -> None:
        self.endpoint = endpoint
        self.include_usage = include_usage
        url = api_url(endpoint)
        parts = urlsplit(url)
        self.path = parts.path
        key = read_api_key(endpoint)
        self._secrets = (key,) if key else ()
        self._client = HTTPClient.from_url(
            url,
            concurrency=1,
            network_timeout=read_timeout_s,
            connection_timeout=connect_timeout_s,
            ssl_context_factory=_shared_ssl_context if parts.scheme == "https" else None,
        )
        self._headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "Accept-Encoding": "identity",  # a compressed stream would be buffered
            **endpoint.headers,
        }
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        # Requests cut by Locust stopping the user (GreenletExit): recorded, then re-raised.
        self.cancelled_records: list[RequestRecord] = []

    def close(self) -> None:
        self._client.close()

    def send(
        self,
        spec: RequestSpec,
        *,
        t0_ns: int,
        history: Sequence[Message] = (),
        timeout_s: float = 120.0,
    ) -> Completion:
        """Stream one request; never raises for a transport or protocol failure."""
        rec = RequestRecord.for_spec(spec, endpoint=self.endpoint.name)
        state = OpenAIStreamState(
            rec, self.endpoint.api, stream=True, t0_ns=t0_ns, secrets=self._secrets
        )
        body = build_body(
            spec, self.endpoint, history=history, stream=True, include_usage=self.include_usage
        )
        payload = json.dumps(body).encode()
        headers = {**self._headers, "X-Request-Id": spec.request_id}
        clock = time.perf_counter_ns
        try:
            with gevent.Timeout(timeout_s):
                self._exchange(payload, headers, state, t0_ns)
        except gevent.Timeout:
            state.fail(OUTCOME_TIMEOUT, f"no complete answer within {timeout_s:g} s", clock())
        except GreenletExit:
            state.fail(OUTCOME_CANCELLED, "the load test stopped mid-request", clock())
            if rec.sent_ns is None:
                rec.sent_ns = rec.end_ns
            self.cancelled_records.append(rec)
            raise
        finally:
            if rec.sent_ns is None:  # never written: the attempt still counts as sent
                rec.sent_ns = rec.end_ns
        return Completion(rec, state.text)

    def _exchange(
        self, payload: bytes, headers: Mapping[str, str], state: OpenAIStreamState, t0_ns: int
    ) -> None:
        clock = time.perf_counter_ns
        rec = state.record
        try:
            self._connect()
            rec.sent_ns = clock() - t0_ns  # connected: the request bytes go out now
            resp = self._client.request("POST", self.path, body=payload, headers=headers)
        except TimeoutError as exc:
            state.fail(OUTCOME_TIMEOUT, f"no response headers: {exc}", clock())
            return
        except HTTPConnectionClosed as exc:
            state.fail(OUTCOME_CONNECT_ERROR, f"connection closed: {exc}", clock())
            return
        except HTTPParseError as exc:
            state.fail(OUTCOME_PROTOCOL_ERROR, f"bad HTTP response: {exc}", clock())
            return
        except OSError as exc:
            state.fail(OUTCOME_CONNECT_ERROR, f"{type(exc).__name__}: {exc}", clock())
            return
        try:
            state.on_headers(resp.status_code, _headers(resp), clock())
            readline = resp.readline
            event: list[bytes] = []  # the lines of the SSE event being read
            t_event = 0
            while True:
                line = readline(b"\n")
                t = clock()  # the read time, before any parsing
                if not line:
                    if event:
                        state.on_bytes(b"".join(event), t_event)
                    break
                if not event:
                    t_event = t  # an event's time is when its first bytes were read
                event.append(line)
                if line in _BLANK:  # whole events to the decoder: one decode per token, not two
                    data, event = b"".join(event), []
                    if state.on_bytes(data, t_event):
                        break
            state.finish(clock())
        except TimeoutError as exc:
            state.fail(OUTCOME_TIMEOUT, f"no byte within the read timeout: {exc}", clock())
        except (OSError, HTTPParseError) as exc:
            state.fail(OUTCOME_INCOMPLETE, f"stream cut: {type(exc).__name__}: {exc}", clock())
        finally:
            resp.release()

    def _connect(self) -> None:
        # Open (or reuse) the keep-alive socket before stamping sent_ns, so a TCP/TLS
        # handshake is not counted in TTFT. geventhttpclient has no public hook for this.
        pool = getattr(self._client, "_connection_pool", None)
        if pool is not None:
            pool.return_socket(pool.get_socket())


def _headers(resp: Any) -> dict[str, str]:
    out = {}
    for name in ("Content-Type", "Retry-After"):
        value = resp.get(name.lower())
        if value is not None:
            out[name] = value if isinstance(value, str) else ", ".join(value)
    return out

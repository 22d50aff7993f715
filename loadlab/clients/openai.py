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
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from email.utils import parsedate_to_datetime
from typing import Any

from loadlab import __version__
from loadlab.clients.base import Completion, Message
from loadlab.clients.sse import SSEDecoder
from loadlab.clients.transports import TRANSPORTS, Transport, make_transport
from loadlab.config import EndpointConfig
from loadlab.records import (
    OUTCOME_CANCELLED,
    OUTCOME_INCOMPLETE,
    OUTCOME_OK,
    OUTCOME_PROTOCOL_ERROR,
    OUTCOME_STREAM_ERROR,
    RequestRecord,
    RequestSpec,
    http_outcome,
)

_loads: Callable[[str | bytes], Any]
try:  # a faster JSON parser when present (~4x on small chunks); same results
    from orjson import loads as _loads
except ImportError:  # pragma: no cover
    _loads = json.loads

__all__ = ["OpenAIClient", "OpenAIStreamState", "api_url", "build_body", "read_api_key"]

_EXCERPT_CHARS = 200
_BODY_KEEP_BYTES = 4096  # of an error body, for the excerpt
_SSE_STARTS = (b"data", b"event", b"id", b"retry", b":")


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


def _excerpt(text: str, secrets: Sequence[str] = ()) -> str:
    for s in secrets:
        text = text.replace(s, "***")
    text = " ".join(text.split())
    return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "..."


def _retry_after_s(value: str) -> float | None:
    """``Retry-After``: delay-seconds or an HTTP-date (RFC 9110 §10.2.3)."""
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class OpenAIStreamState:
    """Interprets one response; no I/O. All ``t_ns`` are raw ``time.perf_counter_ns()``.

    Call ``on_headers`` once, ``on_bytes`` for each read (it returns True once the outcome is
    decided and reading may stop), then ``finish`` at EOF (``eof=True``) or ``fail`` when the
    transport failed. ``text`` is the answer's content (for a chat session's history).
    """

    __slots__ = (
        "_any_event",
        "_body",
        "_chat",
        "_decoder",
        "_head",
        "_outcome",
        "_parts",
        "_sse",
        "_t0",
        "api",
        "done",
        "record",
        "secrets",
        "stream",
        "usage",
    )

    def __init__(
        self,
        record: RequestRecord,
        api: str,
        *,
        stream: bool = True,
        t0_ns: int = 0,
        secrets: Sequence[str] = (),
    ) -> None:
        self.record = record
        self.api = api
        self._chat = api == "chat"
        self.stream = stream
        self.secrets = tuple(s for s in secrets if s)
        self.done = False  # [DONE] seen
        self.usage: dict[str, Any] | None = None
        self._t0 = t0_ns
        self._decoder = SSEDecoder()
        self._sse = stream  # False: collect the body (non-streaming, an error, a non-SSE 200)
        self._body: list[bytes] = []
        self._parts: list[str] = []
        self._outcome: str | None = None
        self._any_event = False
        self._head = b""  # the first bytes, until an event decodes (to spot a non-SSE body)

    @property
    def text(self) -> str:
        return "".join(p if isinstance(p, str) else str(p) for p in self._parts)

    def on_sent(self, t_ns: int) -> None:
        """The request bytes are about to go to the socket."""
        self.record.sent_ns = t_ns - self._t0

    def on_headers(self, status: int, headers: Mapping[str, str], t_ns: int) -> None:
        rec = self.record
        rec.http_status = status
        rec.headers_ns = t_ns - self._t0
        if not 200 <= status < 300:
            self._outcome = http_outcome(status)
            self._sse = False
            retry = headers.get("Retry-After")
            if retry is not None and (seconds := _retry_after_s(retry)) is not None:
                rec.server["retry_after_s"] = seconds
        elif self.stream and "text/event-stream" not in headers.get(
            "Content-Type", "text/event-stream"
        ):
            self._sse = False
            rec.error = f"expected text/event-stream, got {headers.get('Content-Type')}"

    def on_bytes(self, data: bytes, t_ns: int) -> bool:
        if not self._sse:
            if sum(map(len, self._body)) < _BODY_KEEP_BYTES or self.record.http_status == 200:
                self._body.append(data)
            return False
        if not self._any_event and len(self._head) < 256:
            self._head = (self._head + data[:256]).lstrip(b"\xef\xbb\xbf\r\n")
        events = self._decoder.feed_raw(data)
        if events:
            self._any_event = True
            t_rel = t_ns - self._t0
            for ev_data, ev_type, _, _ in events:
                if self._event(ev_data, ev_type, t_rel):
                    return True
        return False

    def _event(self, data: str, event: str, t_rel: int) -> bool:
        """One SSE event; True when it decided a failure."""
        if data == "[DONE]":
            self.done = True
            return False
        try:
            obj = _loads(data)
        except ValueError:
            return self._set(OUTCOME_PROTOCOL_ERROR, "bad JSON in event: " + data)
        if type(obj) is not dict:
            return self._set(OUTCOME_PROTOCOL_ERROR, "event is not a JSON object: " + data)
        if event != "message" or "error" in obj:
            if event == "error" or obj.get("error"):
                err = obj.get("error", obj)
                msg = err.get("message", data) if isinstance(err, dict) else str(err)
                return self._set(OUTCOME_STREAM_ERROR, f"error in stream: {msg}")
        choices = obj.get("choices")
        if choices:
            try:
                c = choices[0]
                if self._chat:
                    d = c.get("delta") or {}
                    text = d.get("content")
                    if text or d.get("reasoning_content") or d.get("reasoning"):
                        self.record.chunk_ns.append(t_rel)
                        if text:
                            self._parts.append(text)
                elif text := c.get("text"):
                    self.record.chunk_ns.append(t_rel)
                    self._parts.append(text)
                if fr := c.get("finish_reason"):
                    self.record.finish_reason = fr
            except (AttributeError, KeyError, TypeError):
                return self._set(OUTCOME_PROTOCOL_ERROR, "unexpected chunk shape: " + data)
        if obj.get("usage"):
            self.usage = obj["usage"]
        return False

    def _set(self, outcome: str, message: str) -> bool:
        if self._outcome is None:
            self._outcome = outcome
            self.record.error = _excerpt(message, self.secrets)
        return True

    def fail(self, outcome: str, message: str, t_ns: int) -> None:
        """The transport failed (reset, timeout, cancel). A stream that already sent [DONE]
        stays ok; an outcome already decided (an error event, an HTTP status) is kept."""
        if not self.done:
            self._set(outcome, message)
        self.finish(t_ns, eof=False)

    def finish(self, t_ns: int, eof: bool = True) -> None:
        rec = self.record
        rec.end_ns = t_ns - self._t0
        if self._outcome is None and not self.done:
            if not self.stream or not self._sse:
                self._parse_body(t_ns)
            elif not self._any_event and self._head and not self._head.startswith(_SSE_STARTS):
                text = self._head.decode("utf-8", "replace")
                self._set(OUTCOME_PROTOCOL_ERROR, f"body is not an SSE stream: {text}")
            elif not rec.finish_reason:
                self._decoder.close()
                self._set(OUTCOME_INCOMPLETE, "stream ended before [DONE] or a finish_reason")
        elif self._outcome is not None and rec.http_status is not None and rec.http_status >= 300:
            body = b"".join(self._body).decode("utf-8", "replace")
            rec.error = _excerpt(f"HTTP {rec.http_status}: {body}", self.secrets)
        rec.outcome = self._outcome or OUTCOME_OK
        self._count_tokens()

    def _parse_body(self, t_ns: int) -> None:
        raw = b"".join(self._body)
        try:
            obj = _loads(raw)
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            what = self.record.error or "response is not JSON"
            self._set(OUTCOME_PROTOCOL_ERROR, f"{what}: {raw.decode('utf-8', 'replace')}")
            return
        if obj.get("error"):
            err = obj["error"]
            msg = err.get("message", "") if isinstance(err, dict) else str(err)
            self._set(OUTCOME_STREAM_ERROR, f"error in 200 body: {msg}")
            return
        if self.stream:  # JSON where a stream was asked for
            self._set(OUTCOME_PROTOCOL_ERROR, f"{self.record.error}: {raw.decode()}")
            return
        try:
            c = obj["choices"][0]
            text = (c.get("message") or {}).get("content") if self.api == "chat" else c.get("text")
            self.record.finish_reason = c.get("finish_reason")
        except (KeyError, IndexError, TypeError, AttributeError):
            self._set(OUTCOME_PROTOCOL_ERROR, "no choices[0] in body: " + raw.decode())
            return
        self.usage = obj.get("usage") or None
        if text:
            self._parts.append(text)
            self.record.chunk_ns.append(t_ns - self._t0)  # the whole answer is one chunk

    def _count_tokens(self) -> None:
        rec = self.record
        rec.output_tokens_chunks = len(rec.chunk_ns) if self.stream else 0
        usage = self.usage if isinstance(self.usage, dict) else {}
        if isinstance(usage.get("prompt_tokens"), int):
            rec.prompt_tokens = usage["prompt_tokens"]
        completion = usage.get("completion_tokens")
        if isinstance(completion, int):
            rec.output_tokens, rec.output_tokens_source = completion, "usage"
            rec.output_tokens_disagree = self.stream and rec.output_tokens_chunks != completion
            if not self.stream and rec.chunk_ns:
                rec.chunk_tokens = [completion]
        elif rec.output_tokens_chunks:
            rec.output_tokens, rec.output_tokens_source = rec.output_tokens_chunks, "chunks"


class OpenAIClient:
    """Async OpenAI-compatible client (see module docstring). Use as ``async with``.

    ``max_connections=0`` means no limit (open loop without a cap); closed loop passes the
    concurrency. ``transport`` is ``"raw"`` (default, lowest overhead) or ``"aiohttp"``
    (``loadlab.clients.transports``). A cancelled ``send`` records the request (outcome
    ``cancelled``) in ``cancelled_records`` and re-raises.
    """

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
        if endpoint.api not in ("chat", "completions"):
            raise ValueError(f"OpenAIClient speaks api chat or completions, not {endpoint.api!r}")
        if timeout_s <= 0 or read_timeout_s <= 0:
            raise ValueError("--timeout and --read-timeout must be > 0 seconds")
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
        self.endpoint = endpoint
        self.url = api_url(endpoint)
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
            self._headers["Authorization"] = f"Bearer {key}"
        self._transport: Transport | None = None
        self.cancelled_records: list[RequestRecord] = []

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
            raise RuntimeError("use OpenAIClient as `async with OpenAIClient(...) as client`")
        rec = RequestRecord(
            request_id=spec.request_id,
            session_id=spec.session_id,
            turn=spec.turn,
            request_class=spec.request_class,
            endpoint=self.endpoint.name,
            intended_ns=intended_ns,
            prompt_tokens_requested=spec.prompt_tokens,
            max_tokens=spec.max_tokens,
        )
        state = OpenAIStreamState(
            rec, self.endpoint.api, stream=self.stream, t0_ns=t0_ns, secrets=self._secrets
        )
        body = build_body(
            spec,
            self.endpoint,
            history=history,
            stream=self.stream,
            include_usage=self.include_usage,
            extra_body=self.extra_body,
        )
        attempt_ns = time.perf_counter_ns()
        try:
            await self._transport.exchange(json.dumps(body).encode(), spec.request_id, state)
        except asyncio.CancelledError:
            msg = "the run stopped while the request was in flight"
            state.fail(OUTCOME_CANCELLED, msg, time.perf_counter_ns())
            self.cancelled_records.append(rec)
            raise
        finally:
            if rec.sent_ns is None:  # never written (no connection): the attempt counts as sent
                state.on_sent(attempt_ns)
        return Completion(rec, state.text)

"""One streaming request under gevent: a plain gevent socket and loadlab's own HTTP reader.

Chosen by measurement (``benchmarks/locust_timing.py``, docs/locust.md): Locust's own
``FastHttpUser`` ``iter_lines`` reads fixed 1 KiB blocks, so tokens arrive in batches (TTFT
off by the time the block takes to fill); ``requests`` (urllib3) streaming costs more CPU and
had 5x the tail error; httpx is not a Locust dependency and builds an SSL context per client
(blocks the gevent loop ~20 ms). geventhttpclient's ``readline`` gets every line on time but
cost ~95 us of CPU per token here, and its keep-alive check (gevent's ``select`` with a zero
timeout) yields to the hub between the send stamp and the write. So each user owns one
keep-alive socket with no socket timeout (gevent arms a timer for every wait of a socket that
has one: ~16 us per token), reads with ``recv`` and feeds the bytes to the same sans-IO HTTP/1.1
reader as the CLI's raw transport (``loadlab.clients._http1.ResponseReader``): 47 us per
token for the bare reads. The read timeout is one lazy timer per request that re-arms itself
from the last read's time, as in the CLI.

``sent_ns`` is taken right before the request's one ``sendall``; every chunk time is
``perf_counter_ns`` taken as ``recv`` returns, before any parsing; the bytes then go to
loadlab's sans-IO ``OpenAIStreamState`` (the same SSE decoding, token counting and outcome
rules as the asyncio client). Transport failures are values: the record's outcome class, never
an exception, except ``GreenletExit`` (Locust stopping the user), which marks the record
``cancelled`` and is re-raised.

Example (inside a gevent-patched process)::

    conn = StreamConnection(endpoint, read_timeout_s=30)
    done = conn.send(spec, t0_ns=t0, history=[], timeout_s=120)
    print(done.record.outcome, done.text)
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Sequence
from typing import Any

import gevent
import gevent.monkey
from greenlet import GreenletExit, getcurrent

from loadlab.clients._base import Completion, Message
from loadlab.clients._bodies import build_body
from loadlab.clients._http1 import Ended, Failure, ResponseReader, Target, frame_request
from loadlab.clients._openai import OpenAIStreamState
from loadlab.clients._state import dumps
from loadlab.clients._streaming import api_url, read_api_key, secret_values
from loadlab.clients._transports import settle
from loadlab.config import EndpointConfig
from loadlab.records import (
    OUTCOME_CANCELLED,
    OUTCOME_CONNECT_ERROR,
    OUTCOME_TIMEOUT,
    RequestRecord,
    RequestSpec,
)

__all__ = ["StreamConnection"]

_SSL_CONTEXT: ssl.SSLContext | None = None
_POLL = gevent.monkey.get_original("select", "poll")  # the real poll(2): never yields
_POLLIN = gevent.monkey.get_original("select", "POLLIN")
_READ_BYTES = 256 * 1024


def _shared_ssl_context() -> ssl.SSLContext:
    # One context per process: building one costs ~20 ms of CPU, which would stall every
    # other user's timestamps on the gevent loop if each connection built its own.
    global _SSL_CONTEXT
    if _SSL_CONTEXT is None:
        _SSL_CONTEXT = ssl.create_default_context()
    return _SSL_CONTEXT


def _idle_socket_alive(sock: Any) -> bool:
    """Whether an idle keep-alive socket can carry the next request, without a trip through
    the gevent hub (gevent's ``select``, even with a zero timeout, yields to every other ready
    user). An idle socket that is readable has been closed by the server (or is dirty)."""
    try:
        fd = sock.fileno()
        if fd < 0:
            return False
        poller = _POLL()
        poller.register(fd, _POLLIN)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False


class _ReadStalled(Exception):
    """Thrown into a user's greenlet by its read-timeout timer."""


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
        self.read_timeout_s = read_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.target = Target.from_url(api_url(endpoint))
        key = read_api_key(endpoint)
        self._secrets: tuple[str, ...] = (key,) if key else ()
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "Accept-Encoding": "identity",  # a compressed stream would be buffered
            **endpoint.headers,
        }
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._secrets += secret_values(headers)  # URL user-info's Basic auth, X-Custom-Auth...
        self._head = self.target.request_head(headers)
        self._sock: Any = None
        # Requests cut by Locust stopping the user (GreenletExit): recorded, then re-raised.
        self.cancelled_records: list[RequestRecord] = []

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

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
        request = frame_request(self._head, spec.request_id, dumps(body))
        clock = time.perf_counter_ns
        try:
            with gevent.Timeout(timeout_s):
                self._exchange(request, state)
        except gevent.Timeout:
            self.close()
            state.fail(OUTCOME_TIMEOUT, f"no complete answer within {timeout_s:g} s", clock())
        except GreenletExit:
            self.close()
            state.fail(OUTCOME_CANCELLED, "the load test stopped mid-request", clock())
            if rec.sent_ns is None:
                rec.sent_ns = rec.end_ns
            self.cancelled_records.append(rec)
            raise
        finally:
            if rec.sent_ns is None:  # never written: the attempt still counts as sent
                rec.sent_ns = rec.end_ns
        return Completion(rec, state.text, state.tool_calls)

    def _connect(self, fresh: bool) -> tuple[Any, bool]:
        """The user's socket and whether it is reused: the idle one if the server kept it
        open, else a new one. TCP and TLS handshakes happen here, before ``sent_ns``, so they
        are not counted in TTFT."""
        sock = self._sock
        if sock is not None and not fresh and _idle_socket_alive(sock):
            return sock, True
        self.close()
        t = self.target
        sock = socket.create_connection((t.host, t.port), timeout=self.connect_timeout_s)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if t.tls:
                sock = _shared_ssl_context().wrap_socket(sock, server_hostname=t.host)
            sock.settimeout(None)  # reads time out by the lazy timer below, not per wait
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        return sock, False

    def _exchange(self, request: bytes, state: OpenAIStreamState) -> None:
        clock = time.perf_counter_ns
        for fresh in (False, True):
            try:
                sock, reused = self._connect(fresh)
            except TimeoutError as exc:
                state.fail(OUTCOME_CONNECT_ERROR, f"connect timed out: {exc}", clock())
                return
            except OSError as exc:
                state.fail(OUTCOME_CONNECT_ERROR, f"{type(exc).__name__}: {exc}", clock())
                return
            reader = self._round_trip(sock, request, state)
            result = reader.result
            if result.error is Failure.CONNECT and reused and not reader.got_bytes:
                continue  # the server closed the idle connection as we wrote: once more, new
            break
        settle(state, result)
        if not reader.reusable or result.error is not None:
            self.close()

    def _round_trip(self, sock: Any, request: bytes, state: OpenAIStreamState) -> Any:
        clock = time.perf_counter_ns
        reader, ended = ResponseReader(), Ended()
        reader.start(state, ended)
        timer = _ReadTimer(reader, self.read_timeout_s)
        try:
            reader.last_ns = now = clock()
            state.on_sent(now)  # right before the request's one write
            sock.sendall(request)
            timer.start()
            recv, yield_ = sock.recv, gevent.sleep
            while not ended.ended:
                data = recv(_READ_BYTES)
                t = clock()
                if not data:
                    reader.connection_lost(None)
                    break
                yield_(0)
                reader.feed(data, t)
        except _ReadStalled:
            reader.end(Failure.TIMEOUT, f"no byte for {self.read_timeout_s:g} s (read timeout)")
        except OSError as exc:
            reader.connection_lost(exc)
        finally:
            timer.stop()
        return reader


class _ReadTimer:
    """The read timeout as one lazy libev timer per request: a read only stores its time
    (``ResponseReader.last_ns``); the timer, when it fires, re-arms itself from the last read
    or throws ``_ReadStalled`` into the reading greenlet."""

    def __init__(self, reader: Any, read_timeout_s: float) -> None:
        self.reader = reader
        self.read_ns = int(read_timeout_s * 1e9)
        self.glet = getcurrent()
        self.loop = gevent.get_hub().loop
        self.timer: Any = None

    def start(self, delay_s: float | None = None) -> None:
        self.timer = self.loop.timer(self.read_ns / 1e9 if delay_s is None else delay_s)
        self.timer.start(self._fire)

    def _fire(self) -> None:
        idle_ns = time.perf_counter_ns() - self.reader.last_ns
        if idle_ns >= self.read_ns:
            self.timer = None
            self.glet.throw(_ReadStalled())
        else:
            self.start((self.read_ns - idle_ns) / 1e9)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.stop()
            self.timer.close()
            self.timer = None

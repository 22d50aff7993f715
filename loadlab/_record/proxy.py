"""``loadlab record``'s reverse proxy: pass traffic through unchanged, write its shape.

The relay is asyncio protocols over HTTP/1.1 (``loadlab._record.exchange``; the bytes are read
by ``loadlab._record.relay``): a
client's request is read whole (head and ``Content-Length`` or chunked body) and sent over a
kept-alive connection to the upstream, with its body and headers as they came (this hop's
aside); the answer's bytes are written to the client as each read returns them, framing
included (a chunked body passes through untouched), before the proxy reads its copy. Nothing is
buffered but what the client's socket has not taken yet (past 64 KiB the proxy stops reading
the upstream until it drains) and, when the proxy asked for usage itself, a partial SSE event
(then the proxy sends the body in chunks of its own, that one event taken out). A request is
read ahead of the loop's other reads when it comes in during a burst of them
(``RecordingProxy.look``: an epoll of the idle client connections, polled after each upstream
read and while a burst's payloads are read). Per traced
request (OpenAI chat, completions, Responses and Anthropic messages; other paths pass through
untraced), once its answer has ended, the request's body as it came, its times and what its
stream's watch counted go in one pipe write to the trace writer's process
(``loadlab._record.handoff``), which reads its shape (``RequestShape``: block hashes, the
tokenizer's counts) and writes its line; this loop never reads a shape or writes a line. A
writer that falls behind or dies costs trace lines (counted and said), never traffic.

The proxy answers 502 only when the upstream could not be reached, or closed or timed out
before its answer's head; an upstream answer, error statuses included, is passed on as it came.
An upstream that breaks off mid-answer closes the client's connection at the same byte.

Example::

    tracer = TraceChild(Path("trace.jsonl"), {"unit": "chars", "block": 16})
    proxy = RecordingProxy("http://127.0.0.1:8000", tracer)
    await proxy.start("127.0.0.1", 9000)
    ...
    await proxy.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import ssl
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import orjson

from loadlab._record.exchange import Client, Exchange, UpstreamConn
from loadlab._record.handoff import TraceChild, request_frame
from loadlab._record.relay import Request, Upstream, upstream_request
from loadlab._record.stream import StreamWatch

__all__ = ["API_PATHS", "RecordingProxy", "api_of"]

API_PATHS = {
    "/v1/chat/completions": "chat",
    "/chat/completions": "chat",
    "/v1/completions": "completions",
    "/completions": "completions",
    "/v1/responses": "responses",
    "/responses": "responses",
    "/v1/messages": "anthropic",
    "/messages": "anthropic",
}


def api_of(path: str) -> str | None:
    """The API a request path speaks (a prefix before ``/v1/...`` is allowed), or None.

    >>> api_of("/v1/chat/completions"), api_of("/openai/v1/messages"), api_of("/v1/models")
    ('chat', 'anthropic', None)
    """
    for suffix, api in API_PATHS.items():
        if path.endswith(suffix) and suffix.startswith("/v1"):
            return api
    return API_PATHS.get(path)


_LOOK = select.EPOLLIN | select.EPOLLONESHOT if hasattr(select, "epoll") else 0
_LOOK_EVERY = 16  # payloads read between two looks
IDLE_KEPT = 1024  # kept-alive upstream connections waiting for a request
STOP_GRACE_S = 5.0  # how long ``stop`` lets answers in flight finish


class RecordingProxy:
    def __init__(
        self,
        upstream: str,
        tracer: TraceChild,
        *,
        ask_usage: bool = True,
        timeout_s: float = 600.0,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self._up = Upstream.of(self.upstream)
        self.tracer = tracer
        self.ask_usage = ask_usage
        self.timeout_s = timeout_s
        self._server: asyncio.Server | None = None
        self._ssl = ssl.create_default_context() if self._up.tls else None
        self._idle: list[UpstreamConn] = []
        self._opening = 0  # upstream connections being opened ahead of a request (``warm``)
        self._waiting: deque[Exchange] = deque()  # requests waiting for one of those
        self.clients: set[Client] = set()
        # The lookout: client connections between requests, watched by an epoll of their own
        # that every upstream read polls, so a request that comes in while the loop forwards
        # a burst of token events goes upstream at once, not after the burst (``look``).
        self._lookout = select.epoll() if hasattr(select, "epoll") else None
        self.watched: dict[int, Client] = {}
        self._active: set[Exchange] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._feeds: list[tuple[StreamWatch, bytes, int]] = []  # payloads to read (_feed_soon)
        self.upstream_failures = 0

    async def start(self, host: str, port: int) -> int:
        """Listens, starts the trace writer (``ConfigError`` if it cannot start), then serves;
        returns the port (a free one when ``port`` is 0)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Client(self), host, port, backlog=4096, start_serving=False
        )
        try:
            await self.tracer.start()
        except BaseException:
            self._server.close()
            raise
        await self._server.start_serving()
        self._spawn(self._watch_timeouts())
        return int(self._server.sockets[0].getsockname()[1]) if self._server.sockets else port

    async def stop(self) -> None:
        """Stops listening, lets answers in flight end (``STOP_GRACE_S``), then closes all."""
        if self._server is not None:
            self._server.close()
        deadline = time.monotonic() + STOP_GRACE_S
        while self._active and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for ex in list(self._active):
            ex.broke()
        for client in list(self.clients):
            if client.transport is not None:
                client.transport.abort()
        for up in self._idle:
            if up.transport is not None:
                up.transport.close()
        self._idle.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._lookout is not None:
            self._lookout.close()
            self._lookout = None
        await self.tracer.stop()

    def exchange(self, client: Client, req: Request) -> Exchange:
        """A whole request from a client: send it upstream (its answer comes back in reads),
        then read its JSON for the trace; first only when the proxy may ask for usage in it."""
        api = api_of(req.path) if req.method == b"POST" else None
        body, traced, read = req.body, None, False
        if api in ("chat", "completions") and self.ask_usage and not _asks_usage(body):
            traced, read = _json_object(body), True
            body = (traced is not None and self._ask_usage(api, traced)) or body
        ex = Exchange(self, client, req, upstream_request(self._up, req, body), api)
        self._active.add(ex)
        ex.sent_ns = time.perf_counter_ns()
        self._send(ex)
        if api is not None:  # its shape is read by the trace writer, after the answer
            obj = traced if read else _json_object(req.body)
            if obj is not None:
                stream = bool(obj.get("stream", False))
                ex.watch = StreamWatch(api, stream, drop_usage_event=body is not req.body)
        return ex

    def watch(self, conn: Client) -> None:
        """A client's connection is between requests: the lookout watches it, once."""
        fd, lookout = conn.fd, self._lookout
        if fd < 0 or lookout is None:
            return
        try:
            try:
                lookout.modify(fd, _LOOK)  # watched before (one shot, spent)
            except FileNotFoundError:  # its first time (or a closed connection's number)
                lookout.register(fd, _LOOK)
        except OSError:
            return
        self.watched[fd] = conn

    def forget(self, conn: Client) -> None:
        """A client's connection has closed: out of the lookout."""
        fd = conn.fd
        if self.watched.get(fd) is not conn:
            return  # not watched, or its number is another connection's by now
        del self.watched[fd]
        if self._lookout is not None:
            with contextlib.suppress(OSError):
                self._lookout.unregister(fd)

    def look(self) -> None:
        """Reads now the requests that came in on idle connections since the loop last looked
        (one non-blocking poll): the loop would read them only after every read it already
        had in hand, a whole tick of every stream's tokens, milliseconds at 64 streams."""
        lookout = self._lookout
        if lookout is None:
            return
        for fd, _ in lookout.poll(0):
            conn = self.watched.pop(fd, None)
            if conn is not None:
                conn.read_now()

    def _send(self, ex: Exchange) -> None:
        while self._idle:
            up = self._idle.pop()
            if not up.closed:
                ex.send(up, reused=True)
                return
        if self._opening > len(self._waiting):  # one is on its way (warm)
            ex.last_ns = time.perf_counter_ns()
            self._waiting.append(ex)
            return
        self.connect_soon(ex)

    def warm(self) -> None:
        """A client connected: open an upstream connection for its first request meanwhile, so
        that the connect is not part of that request's time to first token."""
        if len(self._idle) + self._opening < min(len(self.clients), IDLE_KEPT):
            self._opening += 1
            self._spawn(self._open())

    async def _open(self) -> None:
        try:
            conn: UpstreamConn | None = await self._new_connection()
        except (TimeoutError, OSError, ssl.SSLError):
            conn = None  # a request that waited for it connects itself, and says why it failed
        self._opening -= 1
        while self._waiting:
            ex = self._waiting.popleft()
            if not ex.finished:
                if conn is None:
                    self.connect_soon(ex)
                else:
                    ex.send(conn, reused=False)
                return
        if conn is not None:
            self.release(conn, keep=True)

    def connect_soon(self, ex: Exchange) -> None:
        ex.last_ns = time.perf_counter_ns()
        self._spawn(self._connect(ex))

    async def _connect(self, ex: Exchange) -> None:
        try:
            conn = await self._new_connection()
        except (TimeoutError, OSError, ssl.SSLError) as exc:
            ex.unreachable(exc)
            return
        if ex.finished:  # the client left meanwhile
            self.release(conn, keep=True)
            return
        ex.send(conn, reused=False)

    async def _new_connection(self) -> UpstreamConn:
        up = self._up
        _, conn = await asyncio.wait_for(
            asyncio.get_running_loop().create_connection(
                lambda: UpstreamConn(self), up.host, up.port, ssl=self._ssl,
                server_hostname=up.host if self._ssl else None,
            ),
            self.timeout_s,
        )  # fmt: skip
        return conn

    def release(self, up: UpstreamConn, *, keep: bool) -> None:
        if keep and not up.closed and len(self._idle) < IDLE_KEPT:
            self._idle.append(up)
            return
        up.closed = True
        if up.transport is not None:
            up.transport.abort()  # one mid-answer cannot be reused; an extra one is not needed

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch_timeouts(self) -> None:
        """An upstream silent past ``timeout_s`` (no answer, or a stream that stalled) ends its
        exchange: 502 before the answer's head, ``incomplete`` after. A client that does not
        read (the proxy paused the upstream for it) is not the upstream's silence."""
        step = min(1.0, self.timeout_s / 4)
        limit_ns = int(self.timeout_s * 1e9)
        while True:
            await asyncio.sleep(step)
            now = time.perf_counter_ns()
            for ex in [e for e in self._active if not e.paused and now - e.last_ns > limit_ns]:
                if ex.on_body is None:
                    ex.unreachable(TimeoutError())
                else:
                    ex.broke()

    def feed_soon(self, watch: StreamWatch, payload: bytes, t_ns: int) -> None:
        """Has the watch read a payload already passed on once the reads that came with it are
        passed on too: a burst of reads (every stream's next token at once) goes out at the
        cost of its writes, not of its writes and their reading."""
        self._feeds.append((watch, payload, t_ns))
        if len(self._feeds) == 1:
            asyncio.get_running_loop().call_soon(self.feed_all)

    def feed_all(self) -> None:
        feeds, self._feeds = self._feeds, []
        for i, (watch, payload, t_ns) in enumerate(feeds, 1):
            watch.feed(payload, t_ns)
            if not i % _LOOK_EVERY and self.watched:  # a tick's reading takes a while too
                self.look()

    def finished(self, ex: Exchange, outcome: str) -> None:
        """An exchange has ended: it goes to the trace writer's process for its line."""
        self.feed_all()  # what its watch has yet to read
        self._active.discard(ex)
        if outcome == "upstream_error":
            self.upstream_failures += 1
        if ex.api is None or ex.watch is None:  # not a JSON object to an API the trace knows
            return
        if outcome == "ok" and ex.watch.stream_error:
            outcome = "stream_error"
        status = ex.status if outcome != "upstream_error" else 0
        watch = ex.watch if outcome != "upstream_error" else None
        if self.tracer.accepts():
            end_ns, req = time.perf_counter_ns(), ex.req
            self.tracer.put(
                request_frame(ex.api, req.body, req.arrival_ns, ex.sent_ns, end_ns, watch,
                              outcome, status)
            )  # fmt: skip

    def _ask_usage(self, api: str, body: dict[str, Any]) -> bytes | None:
        """The body to send instead, asking for usage, for a stream that did not; else None."""
        options = body.get("stream_options")
        if (  # the caller asks only for chat and completions, with ``ask_usage`` on
            not body.get("stream", False)
            or not isinstance(options, Mapping | None)
            or (options or {}).get("include_usage")
        ):
            return None
        return orjson.dumps(body | {"stream_options": {**(options or {}), "include_usage": True}})


def _asks_usage(body: bytes) -> bool:
    """The body asks for usage in its stream already (``"include_usage": true`` outside any
    string: a quote inside a JSON string is always escaped)."""
    return b'"include_usage":true' in body or b'"include_usage": true' in body


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None

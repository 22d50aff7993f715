"""``loadlab record``'s reverse proxy: pass traffic through unchanged, write its shape.

Every request is forwarded to the upstream with its body and headers as they came (hop-by-hop
headers aside) and every response chunk is written to the client as soon as it arrives, before
the proxy reads its copy; nothing is buffered but a partial SSE event when the proxy asked for
usage itself and must take that one event out. Per traced request (OpenAI chat, completions,
Responses and Anthropic messages; other paths pass through untraced) one trace line goes to a
bounded queue that a writer task empties: a write that fails is counted and said once, and the
traffic goes on. The request's shape (``RequestShape``: block hashes, the tokenizer's counts) is
read when its answer has ended, never on its way upstream.

The proxy answers 502 only when the upstream could not be reached at all; an upstream answer,
error statuses included, is passed on as it came.

Example::

    proxy = RecordingProxy("http://127.0.0.1:8000", TraceWriter(Path("trace.jsonl"), ...))
    await proxy.start("127.0.0.1", 9000)
    ...
    await proxy.stop()
"""

from __future__ import annotations

import itertools
import os
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, NamedTuple

import aiohttp
import orjson
from aiohttp import web

from loadlab._record.shape import RequestShape, Tokenize
from loadlab._record.stream import StreamWatch
from loadlab._record.tracefile import TraceWriter

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


_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
CONTINUATIONS_KEPT = 200_000  # conversations remembered to find a request's previous turn


class _Turn(NamedTuple):
    """A conversation's last request, remembered to find its next turn. A tuple of ints: the
    collector stops tracking it, so a full collection never walks the remembered turns."""

    line_id: int  # its trace line's ``id``
    session: int
    turn: int
    end_ns: int


class RecordingProxy:
    def __init__(
        self,
        upstream: str,
        writer: TraceWriter,
        *,
        salt: bytes | None = None,
        block: int = 16,
        tokenize: Tokenize | None = None,
        ask_usage: bool = True,
        timeout_s: float = 600.0,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.writer = writer
        self.salt = salt if salt is not None else os.urandom(32)  # never written anywhere
        self.block = block
        self.tokenize = tokenize
        self.ask_usage = ask_usage
        self.timeout_s = timeout_s
        self._turns: OrderedDict[bytes, _Turn] = OrderedDict()
        self._count = 0
        self._sessions = 0
        self._t0_ns: int | None = None
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.upstream_failures = 0

    async def start(self, host: str, port: int) -> int:
        """Starts listening; returns the port (a free one when ``port`` is 0)."""
        self._session = aiohttp.ClientSession(
            auto_decompress=False,  # bytes pass through as the upstream encoded them
            timeout=aiohttp.ClientTimeout(total=None, sock_read=self.timeout_s),
            connector=aiohttp.TCPConnector(limit=0),
        )
        app = web.Application(client_max_size=256 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        await self.writer.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        return int(sockets[0].getsockname()[1]) if sockets else port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        await self.writer.stop()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        arrival_ns = time.perf_counter_ns()
        body = await request.read()
        api = api_of(request.path) if request.method == "POST" else None
        traced = _json_object(body) if api is not None else None
        sent_body, watch = body, None
        if api is not None and traced is not None:  # its shape is read after the answer
            sent_body = self._ask_usage(api, traced) or body
            stream = bool(traced.get("stream", False))
            watch = StreamWatch(api, stream, drop_usage_event=sent_body is not body)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        url = self.upstream + request.rel_url.path_qs
        if self._session is None:
            raise RuntimeError("RecordingProxy.start() was not awaited")
        sent_ns = time.perf_counter_ns()
        try:
            upstream = await self._session.request(
                request.method, url, data=sent_body, headers=headers, allow_redirects=False
            )
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            self.upstream_failures += 1
            if api is not None and traced is not None:
                self._trace(api, traced, arrival_ns, sent_ns, None, "upstream_error", 0)
            return web.json_response(
                {
                    "error": {
                        "message": f"loadlab record: upstream unreachable ({type(exc).__name__})",
                        "type": "upstream_error",
                    }
                },
                status=502,
            )
        async with upstream:
            resp, outcome = await self._relay(request, upstream, watch)
        if api is not None and traced is not None and watch is not None:
            if outcome == "ok" and watch.stream_error:
                outcome = "stream_error"
            self._trace(api, traced, arrival_ns, sent_ns, watch, outcome, upstream.status)
        return resp

    async def _relay(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        watch: StreamWatch | None,
    ) -> tuple[web.StreamResponse, str]:
        """Passes the upstream's answer on, each chunk as it comes; (response, outcome)."""
        resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for k, v in upstream.headers.items():
            if k.lower() not in _HOP:
                resp.headers.add(k, v)
        if upstream.content_length is not None and (watch is None or not watch.drop_usage_event):
            resp.content_length = upstream.content_length
        outcome = "ok" if upstream.status < 400 else f"http_{upstream.status}"
        try:
            await resp.prepare(request)
            async for chunk in upstream.content.iter_any():
                t_ns = time.perf_counter_ns()
                if watch is None:
                    await resp.write(chunk)
                    continue
                if not watch.drop_usage_event:
                    await resp.write(chunk)  # forwarded before it is read
                    watch.feed(chunk, t_ns)
                else:
                    out = watch.feed(chunk, t_ns)
                    if out:
                        await resp.write(out)
            if watch is not None:
                rest = watch.finish()
                if rest:
                    await resp.write(rest)
            await resp.write_eof()
        except (TimeoutError, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
            outcome = "incomplete"  # the upstream broke off; the client sees the stream end
        except (ConnectionResetError, ConnectionError):
            outcome = "client_disconnect"
        return resp, outcome

    def _ask_usage(self, api: str, body: dict[str, Any]) -> bytes | None:
        """The body to send instead, asking for usage, for a stream that did not; else None."""
        options = body.get("stream_options")
        if (
            not self.ask_usage
            or api not in ("chat", "completions")
            or not body.get("stream", False)
            or not isinstance(options, Mapping | None)
            or (options or {}).get("include_usage")
        ):
            return None
        return orjson.dumps(body | {"stream_options": {**(options or {}), "include_usage": True}})

    def _trace(
        self,
        api: str,
        body: dict[str, Any],
        arrival_ns: int,
        sent_ns: int,
        watch: StreamWatch | None,
        outcome: str,
        status: int,
    ) -> None:
        """Writes one request's trace line, its shape read now that its answer has ended (no
        request waits for it); a body whose shape cannot be read is not traced."""
        end_ns = time.perf_counter_ns()
        try:
            shape = RequestShape.of(
                api, body, salt=self.salt, block=self.block, tokenize=self.tokenize
            )
        except (TypeError, ValueError, AttributeError):
            return
        if self._t0_ns is None:
            self._t0_ns = arrival_ns
        index = self._count
        self._count += 1
        prev = self._continues(shape)
        if prev is None:
            session, turn, new_from = self._sessions, 0, 0
            self._sessions += 1
        else:
            (j, before) = prev
            session, turn, new_from = before.session, before.turn + 1, j
        chain = shape.message_chain
        if chain:
            self._turns[chain[-1]] = _Turn(index, session, turn, end_ns)
            self._turns.move_to_end(chain[-1])
            while len(self._turns) > CONTINUATIONS_KEPT:
                self._turns.popitem(last=False)
        line = _line(shape, watch, outcome, status)
        line.update(
            id=index,
            timestamp=round((arrival_ns - self._t0_ns) / 1e6, 3),
            session=session,
            turn=turn,
            continues=None if prev is None else prev[1].line_id,
            think_ms=None if prev is None else round((arrival_ns - prev[1].end_ns) / 1e6, 3),
            new_length=_new_length(shape, new_from),
            new_kind=_new_kind(shape, new_from),
            proxy_ms=round((sent_ns - arrival_ns) / 1e6, 3),
        )
        line.update(_latencies(watch, sent_ns, end_ns))
        self.writer.put(line)

    def _continues(self, shape: RequestShape) -> tuple[int, _Turn] | None:
        """The earlier request whose messages this one repeats and adds to (the longest)."""
        chain = shape.message_chain
        for j in range(len(chain) - 1, 0, -1):
            found = self._turns.get(chain[j - 1])
            if found is not None:
                return j, found
        return None


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _new_length(shape: RequestShape, start: int) -> int:
    """What a request adds to the one it continues: its messages after the repeated ones, less
    the earlier answer (the first assistant messages), in the trace's unit."""
    lengths = shape.message_lengths[start:]
    roles = shape.message_roles[start:]
    i = 0
    while start and i < len(roles) and roles[i] == "assistant":
        i += 1
    return sum(lengths[i:])


def _new_kind(shape: RequestShape, start: int) -> str:
    """``tool`` when what a request adds is tool results (an agent's next step), else ``user``."""
    return "tool" if "tool" in shape.message_roles[start:] and start else "user"


def _line(
    shape: RequestShape, watch: StreamWatch | None, outcome: str, status: int
) -> dict[str, Any]:
    usage = watch.usage if watch is not None else None
    return {
        "input_length": usage.prompt_tokens if usage and usage.prompt_tokens is not None else None,
        "output_length": usage.output_tokens if usage and usage.output_tokens is not None else None,
        "hash_ids": shape.hash_ids,
        "api": shape.api,
        "model": shape.model,
        "stream": shape.stream,
        "max_tokens": shape.max_tokens,
        "params": shape.params,
        "status": status,
        "outcome": outcome,
        "cached_tokens": usage.cached_tokens if usage else None,
        "reasoning_tokens": usage.reasoning_tokens if usage else None,
        "prompt_length": shape.prompt_length,
        "messages": shape.roles,
        "tools": shape.tools,
        "tools_length": shape.tools_length,
        "tool_calls": shape.tool_calls,
        "images": shape.images,
        "images_unsized": shape.images_unsized,
        "reply_length": watch.reply_chars if watch else 0,
        "answer_tool_call": watch.called_tool if watch else False,
        "tool_choice": shape.tool_choice,
        "chunks": len(watch.token_times_ns) if watch else 0,
    }


def _latencies(watch: StreamWatch | None, sent_ns: int, end_ns: int) -> dict[str, Any]:
    """TTFT, ITL (p50 and max) and E2E as the proxy saw them, in ms from its send upstream."""
    times = watch.token_times_ns if watch is not None else []
    if not times:
        return {
            "ttft_ms": None,
            "itl_ms_p50": None,
            "itl_ms_max": None,
            "e2e_ms": round((end_ns - sent_ns) / 1e6, 3),
        }
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    return {
        "ttft_ms": round((times[0] - sent_ns) / 1e6, 3),
        "itl_ms_p50": round(gaps[len(gaps) // 2] / 1e6, 3) if gaps else None,
        "itl_ms_max": round(gaps[-1] / 1e6, 3) if gaps else None,
        "e2e_ms": round((times[-1] - sent_ns) / 1e6, 3),
    }

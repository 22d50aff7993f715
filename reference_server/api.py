"""HTTP layer: OpenAI-compatible endpoints over the engine, SSE streaming, admission, errors.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/messages``
(Anthropic's Messages API, ``reference_server.messages``; each ``stream`` or not),
``GET /v1/models``, ``/health``, ``/metrics`` (Prometheus text), ``/v1/server_info``.
Every error is OpenAI-shaped JSON and bad input is a 4xx, never a 500: invalid JSON, a
non-object body or a schema violation is 400 (FastAPI's 422 is converted), an unknown model
404, a body over the limit 413, a missing or wrong API key 401 (sent as ``Authorization:
Bearer <key>`` or, as Anthropic's clients send it, ``x-api-key: <key>``), and a full queue 429 with
``Retry-After`` at once. A client that goes away, streaming or not, aborts its request, which
frees its KV blocks.

Usage::

    app = create_app(engine, ServerSettings(model_name="loadlab-ref", max_model_len=2048))
    uvicorn.run(app, host="127.0.0.1", port=8000)
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from reference_server import messages
from reference_server.engine_like import EngineLike, EventQueue, TokenEvent
from reference_server.messages import MessagesRequest
from reference_server.protocol import (
    ChatRequest,
    CompletionRequest,
    Kind,
    chat_prompt,
    error_body,
    stream_chunk,
    whole_response,
)
from reference_server.sequence import Sequence

__all__ = ["ServerSettings", "create_app"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class ServerSettings:
    model_name: str = "loadlab-ref"
    max_model_len: int = 2048
    max_queue: int = 1024  # requests beyond the running batch that may wait; more get 429
    api_key: str | None = None
    max_body_bytes: int = 1 << 20
    info: dict[str, Any] = field(default_factory=dict)  # served at /v1/server_info
    encode: Callable[[str], list[int]] = lambda s: list(s.encode("utf-8"))

    def __post_init__(self) -> None:
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be >= 1024")


class _ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.type_, self.param, self.code = status, type_, param, code
        self.headers = headers

    def response(self) -> JSONResponse:
        body = error_body(str(self), self.type_, self.param, self.code)
        return JSONResponse(body, status_code=self.status, headers=self.headers)


class _Guard:
    """Pure ASGI middleware: API key on every route, then the body-size limit (413)."""

    def __init__(self, app: Any, settings: ServerSettings) -> None:
        self.app, self.settings = app, settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        key = self.settings.api_key
        if key is not None:
            scheme, _, given = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer":
                given = headers.get("x-api-key", "")  # Anthropic's clients send the key so
            if not hmac.compare_digest(given.strip().encode(), key.encode()):
                msg = "missing or invalid API key: send 'Authorization: Bearer <key>'"
                return await _send_json(
                    send, 401, error_body(msg, "authentication_error", None, "invalid_api_key")
                )
        if scope["method"] == "POST":  # JSON is the only body this API reads, whatever the label
            raw = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
            scope = {**scope, "headers": [*raw, (b"content-type", b"application/json")]}
        limit = self.settings.max_body_bytes
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit() or int(length) > limit:
                return await _send_json(send, 413, _too_large(limit))
            return await self.app(scope, receive, send)
        if scope["method"] in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        # No Content-Length (chunked upload): read up to the limit before the app sees it.
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > limit:
                return await _send_json(send, 413, _too_large(limit))
        replayed = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


def _too_large(limit: int) -> dict[str, Any]:
    msg = f"request body exceeds {limit} bytes"
    return error_body(msg, "invalid_request_error", None, "request_too_large")


async def _send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class _Release:
    """Runs once, however the response ends: frees the in-flight slot and aborts the request
    in the engine unless it finished (a client that went away frees its KV blocks)."""

    def __init__(self, state: dict[str, int], engine: EngineLike, seq_id: str) -> None:
        self.state, self.engine, self.seq_id = state, engine, seq_id
        self.finished = False
        self._released = False

    def __call__(self) -> None:
        if self._released:
            return
        self._released = True
        self.state["in_flight"] -= 1
        if not self.finished:
            self.engine.abort(self.seq_id)


class _SSE(StreamingResponse):
    """Releases the request however the stream ends, even when the client hangs up before
    the first event (the generator may then never start, so its own ``finally`` never runs)."""

    def __init__(self, events: AsyncGenerator[str, None], release: _Release) -> None:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(events, media_type="text/event-stream", headers=headers)
        self._events, self._release = events, release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # type: ignore[override]
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._events.aclose()
            self._release()


def create_app(engine: EngineLike, settings: ServerSettings) -> Any:
    """The ASGI app (FastAPI wrapped in the auth and body-size guard) over any engine."""
    state = {"in_flight": 0}
    capacity = engine.max_num_seqs + settings.max_queue

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    app = FastAPI(title="loadlab reference server", version="0.1.0", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            msg, param = "request body is not valid JSON", None
        elif not loc and first.get("type") == "missing":
            msg, param = "a JSON object request body is required", None
        elif not loc and first.get("type") in ("model_attributes_type", "dict_type"):
            msg, param = "request body must be a JSON object", None
        else:
            param = ".".join(loc) or None
            msg = f"{param or 'body'}: {first.get('msg', 'invalid value')}"
        return JSONResponse(error_body(msg, "invalid_request_error", param, None), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(
            error_body(str(exc.detail), type_, None, None), status_code=exc.status_code
        )

    @app.exception_handler(_ApiError)
    async def _api(_: Request, exc: _ApiError) -> JSONResponse:
        return exc.response()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": settings.model_name, "object": "model", "created": 0, "owned_by": "loadlab"}
        return {"object": "list", "data": [card]}

    @app.get("/v1/server_info")
    async def server_info() -> dict[str, Any]:
        return {**settings.info, "model": settings.model_name, "max_queue": settings.max_queue}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        text = _render_metrics(engine, state["in_flight"])
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatRequest, request: Request) -> Response:
        return await _serve("chat", body, chat_prompt(body.messages), request)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        if isinstance(body.prompt, list) and len(body.prompt) != 1:
            raise _ApiError(
                400, "send exactly one prompt per request", "invalid_request_error", "prompt"
            )
        prompt = body.prompt[0] if isinstance(body.prompt, list) else body.prompt
        return await _serve("completion", body, prompt, request)

    @app.post("/v1/messages", response_model=None)
    async def messages_route(body: MessagesRequest, request: Request) -> Response:
        seq, queue, release = _start("chat", body, messages.messages_prompt(body))
        if body.stream:
            return _SSE(_message_events(body, seq, queue, release), release)
        build = functools.partial(_whole_message, body, seq)
        return await _whole(seq, queue, request, release, build)

    async def _serve(
        kind: Kind, body: ChatRequest | CompletionRequest, prompt: str, request: Request
    ) -> Response:
        seq, queue, release = _start(kind, body, prompt)
        if body.stream:
            return _SSE(_events(kind, seq, body.include_usage, queue, release), release)
        build = functools.partial(_whole_openai, kind, seq)
        return await _whole(seq, queue, request, release, build)

    def _start(kind: Kind, body: Any, prompt: str) -> tuple[Sequence, EventQueue, _Release]:
        seq = _admit(kind, body, prompt)
        queue: EventQueue = asyncio.Queue()
        state["in_flight"] += 1
        release = _Release(state, engine, seq.seq_id)
        engine.submit(seq, asyncio.get_running_loop(), queue)
        return seq, queue, release

    def _whole_openai(kind: Kind, seq: Sequence, text: str, ev: TokenEvent) -> dict[str, Any]:
        body = whole_response(
            kind, seq.seq_id, settings.model_name, text, ev.finish_reason or "", _usage(seq, ev)
        )
        return _with_transfer(body, ev)

    def _whole_message(
        req: MessagesRequest, seq: Sequence, text: str, ev: TokenEvent
    ) -> dict[str, Any]:
        return messages.whole_message(
            seq.seq_id, settings.model_name, text, ev.finish_reason or "", req,
            seq.num_prompt_tokens, ev.completion_tokens,
        )  # fmt: skip

    async def _message_events(
        req: MessagesRequest, seq: Sequence, queue: EventQueue, release: _Release
    ) -> AsyncGenerator[str, None]:
        """Anthropic's event stream; an engine error is an ``error`` event."""
        try:
            for name, obj in messages.message_start(
                seq.seq_id, settings.model_name, seq.num_prompt_tokens
            ):
                yield _sse_event(name, obj)
            while True:
                ev = await queue.get()
                if ev is None:  # only the non-streaming watcher sends None
                    continue
                if ev.error is not None:
                    release.finished = True
                    err = {"type": "error", "error": {"type": "api_error", "message": ev.error}}
                    yield _sse_event("error", err)
                    break
                if ev.completion_tokens > 0 and ev.finish_reason != "error" and ev.text:
                    yield _sse_event(*messages.text_delta(ev.text))
                if ev.finish_reason is not None:
                    release.finished = True
                    for name, obj in messages.message_delta(
                        ev.finish_reason, req, seq.num_prompt_tokens, ev.completion_tokens
                    ):
                        yield _sse_event(name, obj)
                    break
        finally:
            release()

    def _admit(kind: Kind, body: Any, prompt: str) -> Sequence:
        if body.model != settings.model_name:
            msg = f"model {body.model!r} does not exist; this server serves {settings.model_name!r}"
            raise _ApiError(404, msg, "invalid_request_error", "model", "model_not_found")
        ids = settings.encode(prompt)
        if not ids:
            raise _ApiError(
                400,
                "the prompt is empty: send at least one token",
                "invalid_request_error",
                "messages" if kind == "chat" else "prompt",
            )
        max_tokens = body.requested_max_tokens()
        if len(ids) + max_tokens > settings.max_model_len:
            msg = (f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds the context of "
                   f"{settings.max_model_len} tokens; shorten the prompt or lower max_tokens")  # fmt: skip
            raise _ApiError(
                400, msg, "invalid_request_error", "max_tokens", "context_length_exceeded"
            )
        if state["in_flight"] >= capacity:
            engine.stats.record_rejected("queue_full")
            msg = f"server is at capacity ({capacity} requests in flight); retry later"
            raise _ApiError(429, msg, "rate_limit_error", None, "queue_full", {"Retry-After": "1"})
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        return Sequence(
            prefix + uuid.uuid4().hex, ids, body.sampling_params(max_tokens), time.perf_counter_ns()
        )

    async def _events(
        kind: Kind,
        seq: Sequence,
        include_usage: bool,
        queue: EventQueue,
        release: _Release,
    ) -> AsyncGenerator[str, None]:
        created, model, rid = int(time.time()), settings.model_name, seq.seq_id
        first = True
        try:
            while True:
                ev = await queue.get()
                if ev is None:  # only the non-streaming watcher sends None
                    continue
                if ev.error is not None:
                    release.finished = True
                    yield _sse(error_body(ev.error, "server_error", None, "engine_error"))
                    break
                if ev.completion_tokens > 0 and ev.finish_reason != "error":
                    yield _sse(stream_chunk(kind, rid, model, created, text=ev.text, role=first))
                    first = False
                if ev.finish_reason is not None:
                    release.finished = True
                    last = stream_chunk(
                        kind,
                        rid,
                        model,
                        created,
                        text="" if kind == "completion" else None,
                        finish_reason=ev.finish_reason,
                    )
                    yield _sse(_with_transfer(last, ev))
                    if include_usage:
                        usage = stream_chunk(kind, rid, model, created, usage=_usage(seq, ev))
                        yield _sse(_with_transfer(usage, ev))
                    break
            yield "data: [DONE]\n\n"
        finally:
            release()

    async def _whole(
        seq: Sequence,
        queue: EventQueue,
        request: Request,
        release: _Release,
        build: Callable[[str, TokenEvent], dict[str, Any]],
    ) -> Response:
        watcher = asyncio.create_task(_watch_disconnect(request, queue))
        parts: list[str] = []
        try:
            while True:
                ev = await queue.get()
                if ev is None:  # the client went away
                    return Response(status_code=499)
                parts.append(ev.text)
                if ev.error is not None:
                    release.finished = True
                    return JSONResponse(
                        error_body(ev.error, "server_error", None, "engine_error"), status_code=500
                    )
                if ev.finish_reason is not None:
                    release.finished = True
                    return JSONResponse(build("".join(parts), ev))
        finally:
            watcher.cancel()
            release()

    return _Guard(app, settings)


async def _watch_disconnect(request: Request, queue: EventQueue) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    queue.put_nowait(None)


def _usage(seq: Sequence, ev: TokenEvent) -> dict[str, Any]:
    n_prompt = seq.num_prompt_tokens
    return {"prompt_tokens": n_prompt, "completion_tokens": ev.completion_tokens,
            "total_tokens": n_prompt + ev.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": ev.cached_tokens}}  # fmt: skip


def _with_transfer(body: dict[str, Any], ev: TokenEvent) -> dict[str, Any]:
    """Disaggregated mode: the request's KV transfer beside ``usage`` (SSE has no trailers)."""
    if ev.kv_transfer is not None:
        body["kv_transfer"] = ev.kv_transfer
    return body


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def _sse_event(name: str, obj: dict[str, Any]) -> str:
    """A named event, as Anthropic's stream sends each one."""
    return f"event: {name}\ndata: {json.dumps(obj, separators=(',', ':'))}\n\n"


def _render_metrics(engine: EngineLike, in_flight: int) -> str:
    g = engine.gauges()
    gauges = {
        "requests_in_flight": in_flight,
        "queue_depth": g.queue_depth,
        "running_requests": g.running_requests,
        "batch_slots": g.batch_slots,
        "kv_blocks_used": g.kv_blocks_used,
        "kv_blocks_total": g.kv_blocks_total,
        "kv_blocks_cached": g.kv_blocks_cached,
    }
    counters: dict[str, float] = {
        "preemptions_total": g.preemptions_total,
        "prefix_cache_queries_total": g.prefix_cache_queries_total,
        "prefix_cache_hits_total": g.prefix_cache_hits_total,
    }
    text = engine.stats.render(gauges=gauges, counters=counters)
    return text + "".join(line + "\n" for line in engine.extra_metrics())

"""HTTP layer: OpenAI-compatible endpoints over the engine, SSE streaming, admission, errors.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/messages``
(Anthropic's Messages API, ``reference_server.messages``), ``POST /v1/responses`` (OpenAI's
Responses API, ``reference_server.responses``), each ``stream`` or not; ``POST /tokenize``
(vLLM's shape: ``prompt`` or ``messages`` in, ``count`` and ``tokens`` out) and ``POST
/detokenize`` (``tokens`` in, ``prompt`` out); ``GET /v1/models``,
``/health``, ``/metrics`` (Prometheus text), ``/v1/server_info``, ``/v1/step_log`` (each
recent step's wall time and shape: ``reference_server.metrics``), ``/v1/request_log`` (each
recent request as it was framed: ``reference_server.answer``). Every route runs one loop over
the engine's token events; a dialect's ``AnswerStream`` writes them, and ``answer.Answer``
decides whether each token goes out as reasoning, answer text or a tool call's arguments.
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
import hmac
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from reference_server import messages
from reference_server.answer import Answer, AnswerBook, AnswerLog, Piece, choose_tool
from reference_server.audio import AudioError
from reference_server.checks import at_least
from reference_server.engine_like import EngineLike, EventQueue, TokenEvent
from reference_server.messages import MessagesRequest
from reference_server.metrics import gpu_lines
from reference_server.pooling import add_pooling_routes
from reference_server.protocol import (
    ChatRequest,
    ChatStream,
    CompletionRequest,
    DetokenizeRequest,
    Kind,
    TokenizeRequest,
    chat_prompt,
    error_body,
)
from reference_server.responses import ResponsesRequest, ResponsesStream, responses_prompt
from reference_server.sequence import Sequence
from reference_server.vision import (
    MAX_SIDE,
    PATCH,
    Image,
    ImageError,
    encode_pieces,
    pieces_text,
    prompt_pieces,
)

__all__ = ["MAX_BODY_BYTES", "ServerSettings", "create_app"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class AnswerStream(Protocol):
    """One dialect's framing of one answer (``ChatStream``, ``messages.MessagesStream``,
    ``ResponsesStream``): each returns the SSE text to write, or a whole body."""

    def head(self) -> str: ...
    def piece(self, piece: Piece, text: str) -> str: ...
    def tail(self, ev: TokenEvent) -> str: ...
    def error(self, message: str) -> str: ...
    def whole(self, ev: TokenEvent) -> dict[str, Any]: ...


MAX_BODY_BYTES = 32 << 20  # larger bodies get 413 request_too_large


@dataclass(frozen=True)
class ServerSettings:
    model_name: str = "loadlab-ref"
    max_model_len: int = 2048
    max_queue: int = 1024  # requests beyond the running batch that may wait; more get 429
    api_key: str | None = None
    # a request's body: room for a few images or minutes of WAV audio as data URLs
    max_body_bytes: int = MAX_BODY_BYTES
    info: dict[str, Any] = field(default_factory=dict)  # served at /v1/server_info
    encode: Callable[[str], list[int]] = lambda s: list(s.encode("utf-8"))
    # ids outside the byte range are dropped; a cut UTF-8 character becomes U+FFFD
    decode: Callable[[list[int]], str] = lambda ids: bytes(i for i in ids if 0 <= i < 256).decode(
        "utf-8", "replace"
    )
    # a reasoning model and tool calls (``reference_server.answer``)
    reasoning_tokens: int = 0  # the first N tokens of each answer go out as reasoning
    tool_call_rate: float = 0.5  # of requests that offer tools, the share answered by a call
    answer_seed: int = 0  # seeds the tool-call draw
    request_log_size: int = 1024  # requests kept for GET /v1/request_log

    def __post_init__(self) -> None:
        at_least("max_queue", self.max_queue, 0)
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be >= 1024")
        at_least("--reasoning-tokens", self.reasoning_tokens, 0)
        if not 0.0 <= self.tool_call_rate <= 1.0:
            raise ValueError(f"--tool-call-rate must be in [0, 1], got {self.tool_call_rate}")


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
    book = AnswerBook(settings.request_log_size)
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

    @app.exception_handler(AudioError)
    @app.exception_handler(ImageError)
    async def _image(_: Request, exc: ValueError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), "invalid_request_error", "messages", None),
                            status_code=400)  # fmt: skip

    add_pooling_routes(app, engine, model_name=settings.model_name,
                       max_model_len=settings.max_model_len, encode=settings.encode,
                       api_error=_ApiError)  # fmt: skip

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": settings.model_name, "object": "model", "created": 0, "owned_by": "loadlab"}
        return {"object": "list", "data": [card]}

    @app.get("/v1/server_info")
    async def server_info() -> dict[str, Any]:
        info = {**settings.info, "model": settings.model_name, "max_queue": settings.max_queue,
                "image_patch": PATCH, "image_max_side": MAX_SIDE}  # fmt: skip
        return {"tokenizer": "byte", **info}  # loadlab sizes prompts locally when it sees "byte"

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        # vLLM's /tokenize shape: a chat's prompt is built as /v1/chat/completions builds it
        text = chat_prompt(body.messages) if body.messages is not None else body.prompt or ""
        ids = settings.encode(text)
        return {"count": len(ids), "max_model_len": settings.max_model_len, "tokens": ids,
                "token_strs": None}  # fmt: skip

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, str]:
        # vLLM's shape; with /tokenize, vllm bench serve cuts its prompts to exact lengths here
        return {"prompt": settings.decode(body.tokens)}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        text = _render_metrics(engine, state["in_flight"])
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/v1/request_log")
    async def request_log() -> list[dict[str, Any]]:
        """The last requests as the server framed them (``reference_server.answer``)."""
        return book.to_list()

    @app.get("/v1/step_log")
    async def step_log() -> list[dict[str, Any]]:
        """The last steps, their wall times and shapes (``ServerStats.step_log``)."""
        return engine.stats.step_log()

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatRequest, request: Request) -> Response:
        pieces = prompt_pieces(lambda: chat_prompt(body.messages))
        seq, queue, release = _start("chat", body, pieces)
        answer = _answer(seq, "chat", pieces_text(pieces), body.tools, body.tool_choice)
        writer = ChatStream("chat", seq.seq_id, settings.model_name, seq.num_prompt_tokens,
                            answer, body.include_usage)  # fmt: skip
        return await _respond(body.stream, writer, answer, queue, release, request)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        if isinstance(body.prompt, list) and len(body.prompt) != 1:
            raise _ApiError(
                400, "send exactly one prompt per request", "invalid_request_error", "prompt"
            )
        prompt = body.prompt[0] if isinstance(body.prompt, list) else body.prompt
        seq, queue, release = _start("completion", body, [prompt])
        answer = _answer(seq, "completions", prompt, None, None, reasons=False)
        writer = ChatStream("completion", seq.seq_id, settings.model_name,
                            seq.num_prompt_tokens, answer, body.include_usage)  # fmt: skip
        return await _respond(body.stream, writer, answer, queue, release, request)

    @app.post("/v1/messages", response_model=None)
    async def messages_route(body: MessagesRequest, request: Request) -> Response:
        pieces = prompt_pieces(lambda: messages.messages_prompt(body))
        seq, queue, release = _start("chat", body, pieces, "msg_")
        answer = _answer(seq, "messages", pieces_text(pieces), body.tools, body.tool_choice_name())
        writer = messages.MessagesStream(body, seq.seq_id, settings.model_name,
                                         seq.num_prompt_tokens, answer)  # fmt: skip
        return await _respond(body.stream, writer, answer, queue, release, request)

    @app.post("/v1/responses", response_model=None)
    async def responses_route(body: ResponsesRequest, request: Request) -> Response:
        pieces = prompt_pieces(lambda: responses_prompt(body))
        seq, queue, release = _start("chat", body, pieces, "resp_")
        answer = _answer(seq, "responses", pieces_text(pieces), body.tools, body.tool_choice)
        writer = ResponsesStream(seq.seq_id, settings.model_name, seq.num_prompt_tokens, answer)
        return await _respond(body.stream, writer, answer, queue, release, request)

    def _start(
        kind: Kind, body: Any, pieces: list[str | Image], prefix: str | None = None
    ) -> tuple[Sequence, EventQueue, _Release]:
        seq = _admit(kind, body, pieces, prefix)
        queue: EventQueue = asyncio.Queue()
        state["in_flight"] += 1
        release = _Release(state, engine, seq.seq_id)
        engine.submit(seq, asyncio.get_running_loop(), queue)
        return seq, queue, release

    def _answer(seq: Sequence, api: str, prompt: str, tools: Any, tool_choice: Any,
                reasons: bool = True) -> Answer:  # fmt: skip
        """How this request's tokens go out (reasoning, text, a tool call), logged."""
        log = AnswerLog(seq.seq_id, api, seq.arrival_ns)
        book.add(log)
        tool = choose_tool(tools, tool_choice, rate=settings.tool_call_rate,
                           seed=settings.answer_seed, prompt=prompt)  # fmt: skip
        budget = settings.reasoning_tokens if reasons else 0
        return Answer(log, reasoning_tokens=budget, tool=tool)

    async def _respond(stream: bool, writer: AnswerStream, answer: Answer, queue: EventQueue,
                       release: _Release, request: Request) -> Response:  # fmt: skip
        if stream:
            return _SSE(_events(writer, answer, queue, release), release)
        return await _whole(writer, answer, queue, request, release)

    def _admit(kind: Kind, body: Any, pieces: list[str | Image], prefix: str | None) -> Sequence:
        if body.model != settings.model_name:
            msg = f"model {body.model!r} does not exist; this server serves {settings.model_name!r}"
            raise _ApiError(404, msg, "invalid_request_error", "model", "model_not_found")
        try:
            ids, images = encode_pieces(pieces, settings.encode)
        except UnicodeEncodeError as exc:  # a lone surrogate ("\\ud800") is valid JSON only
            msg = (f"the prompt is not valid Unicode (a lone surrogate at character {exc.start}); "
                   "send well-formed UTF-8 text")  # fmt: skip
            raise _ApiError(400, msg, "invalid_request_error", _prompt_param(kind)) from None
        if not ids:
            raise _ApiError(
                400,
                "the prompt is empty: send at least one token",
                "invalid_request_error",
                _prompt_param(kind),
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
        prefix = prefix or ("chatcmpl-" if kind == "chat" else "cmpl-")
        params = body.sampling_params(max_tokens)
        return Sequence(prefix + uuid.uuid4().hex, ids, params, time.perf_counter_ns(),
                        images=images)  # fmt: skip

    async def _events(
        writer: AnswerStream, answer: Answer, queue: EventQueue, release: _Release
    ) -> AsyncGenerator[str, None]:
        """The stream: the dialect's head, a piece per token, its tail; an engine error is
        the dialect's error event. Each piece with text is logged as it is handed over."""
        log = answer.log
        try:
            if head := writer.head():
                yield head
            while True:
                ev = await queue.get()
                if ev is None:  # only the non-streaming watcher sends None
                    continue
                if ev.error is not None:
                    release.finished = True
                    yield writer.error(ev.error)
                    break
                split = answer.split(ev)
                if split is not None and (out := writer.piece(*split)):
                    if split[1]:
                        log.wrote(split[0], time.perf_counter_ns())
                    yield out
                if ev.finish_reason is not None:
                    release.finished = True
                    yield writer.tail(ev)
                    break
        finally:
            release()

    async def _whole(
        writer: AnswerStream,
        answer: Answer,
        queue: EventQueue,
        request: Request,
        release: _Release,
    ) -> Response:
        watcher = asyncio.create_task(_watch_disconnect(request, queue))
        try:
            while True:
                ev = await queue.get()
                if ev is None:  # the client went away
                    return Response(status_code=499)
                if ev.error is not None:
                    release.finished = True
                    return JSONResponse(
                        error_body(ev.error, "server_error", None, "engine_error"), status_code=500
                    )
                split = answer.split(ev)
                if split is not None and split[1]:
                    answer.log.wrote(split[0], time.perf_counter_ns())
                if ev.finish_reason is not None:
                    release.finished = True
                    return JSONResponse(writer.whole(ev))
        finally:
            watcher.cancel()
            release()

    return _Guard(app, settings)


def _prompt_param(kind: Kind) -> str:
    return "messages" if kind == "chat" else "prompt"


async def _watch_disconnect(request: Request, queue: EventQueue) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    queue.put_nowait(None)


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
    extra = [*engine.extra_metrics(), *gpu_lines()]  # GPU lines: on CUDA only
    return text + "".join(line + "\n" for line in extra)

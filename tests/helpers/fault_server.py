"""A real misbehaving OpenAI-compatible server on loopback, one fault per request.

The fault is picked by a path prefix, ``/fault/<mode>/v1/chat/completions`` (so an endpoint URL
``http://127.0.0.1:P/fault/<mode>`` makes every request of a client misbehave the same way),
or by an ``X-Fault: <mode>`` header or a ``"fault": "<mode>"`` body field (a request's
``extra_body``) on a plain ``/v1/...`` path. The dialect follows the path: OpenAI chat or
completions chunks, or Anthropic Messages events on ``/v1/messages`` (there the errors are
Anthropic-shaped, ``{"type": "error", "error": {...}}``, a stream error is an ``event: error``,
``eof`` sends the stop reason and usage but no ``message_stop``, and ``echo_auth`` echoes
``x-api-key``), or Responses API events on ``/v1/responses`` (a stream error is an ``error``
event, ``eof`` ends after ``response.output_text.done`` without ``response.completed``). Every fault is real bytes on a real socket (a reset is a TCP RST).

=============  ==============================================================  ================
mode           what the server does                                            client outcome
=============  ==============================================================  ================
ok             a normal stream of 3 tokens, usage, ``[DONE]`` (or JSON)        ok
malformed      one token, then an event whose data is not JSON                 protocol_error
stream_error   one token, then ``{"error": {...}}`` inside the 200 stream      stream_error
eof            two tokens, then a clean end of body without ``[DONE]``         incomplete
close          two tokens, then FIN in the middle of the chunked body          incomplete
reset          one token, then a TCP reset                                     incomplete
reset_early    a TCP reset right after reading the request                     connect_error
429            429 with ``Retry-After: 7`` and a JSON error                    http_429
500_html       500 with an HTML body                                           http_500
echo_auth      401 whose body echoes the ``Authorization`` header              http_401
stall          headers and one token, then silence (the read timeout fires)   timeout
drip           a token every 100 ms forever (the total timeout fires)          timeout
non_json       200 ``text/plain`` body "hello, world"                          protocol_error
not_sse        200 ``text/event-stream`` whose body is HTML                    protocol_error
huge_line      one token, then a 6 MiB line with no end, then silence          protocol_error
=============  ==============================================================  ================

Usage::

    async with FaultServer() as srv:
        url = srv.url + "/fault/429"      # EndpointConfig(url) -> every request gets a 429
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from typing import Any

from loadlab.selftest._http import HTTPConnection, Request, chunk_frame, json_bytes, parse_json_body

__all__ = ["MODES", "FaultServer"]

MODES = (
    "ok",
    "malformed",
    "stream_error",
    "eof",
    "close",
    "reset",
    "reset_early",
    "429",
    "500_html",
    "echo_auth",
    "stall",
    "drip",
    "non_json",
    "not_sse",
    "huge_line",
)
HUGE_LINE_BYTES = 6 << 20  # over the client's default SSE limit (4 MiB)


def _rst(conn: HTTPConnection) -> None:
    """Close with a TCP RST (SO_LINGER 0), as a crashed server's kernel would."""
    if conn.transport is None:
        return
    sock = conn.transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.abort()


class FaultServer:
    """``async with FaultServer() as srv``: serves on 127.0.0.1 until the block ends."""

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.url = ""
        self._server: asyncio.Server | None = None
        self._conns: set[HTTPConnection] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> FaultServer:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._protocol, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in list(self._tasks):
            task.cancel()
        for conn in list(self._conns):
            conn.abort()  # stalled streams would otherwise outlive the server
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _protocol(self) -> HTTPConnection:
        conn = HTTPConnection(self)
        self._conns.add(conn)
        return conn

    def connection_lost(self, conn: HTTPConnection) -> None:
        self._conns.discard(conn)

    def handle(self, conn: HTTPConnection, req: Request) -> None:
        path, mode = req.path, req.headers.get("x-fault", "ok")
        if path.startswith("/fault/"):
            _, _, mode, path = path.split("/", 3)
            path = "/" + path
        body = parse_json_body(req) or {}
        mode = str(body.get("fault", mode))
        if path not in _DIALECTS or mode not in MODES:
            conn.respond(404, json_bytes({"error": {"message": f"no route {req.path}"}}))
            return
        task = asyncio.ensure_future(self._serve(conn, req, mode, _DIALECTS[path], body))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(
        self, conn: HTTPConnection, req: Request, mode: str, dialect: str, body: dict[str, Any]
    ) -> None:
        d = _Shape(dialect)
        error = d.error_body("model overloaded")
        if mode == "reset_early":
            _rst(conn)
        elif mode == "429":
            conn.respond(429, json_bytes(error), headers={"Retry-After": "7"})
        elif mode == "500_html":
            conn.respond(
                500, b"<html><body><h1>500 Internal Server Error</h1></body></html>", "text/html"
            )
        elif mode == "echo_auth":
            auth = req.headers.get("x-api-key" if dialect == "messages" else "authorization", "")
            conn.respond(401, json_bytes(d.error_body(f"bad key: {auth}")))
        elif mode == "non_json":
            conn.respond(200, b"hello, world", "text/plain")
        elif mode == "not_sse":
            conn.start_stream(first=b"<html><body>maintenance</body></html>")
            conn.end_stream()
        elif mode == "ok" and not body.get("stream"):
            conn.respond(200, json_bytes(d.whole(" tok" * 3)))
        else:
            await self._stream(conn, mode, d)

    async def _stream(self, conn: HTTPConnection, mode: str, d: _Shape) -> None:
        async def tokens(n: int) -> None:
            for _ in range(n):
                await asyncio.sleep(0.005)
                conn.write(chunk_frame(d.token(" tok")))

        conn.start_stream(first=d.start())
        if mode == "ok":
            await tokens(3)
            conn.end_stream(d.end())
        elif mode == "malformed":
            await tokens(1)
            conn.write(chunk_frame(d.malformed()))
            conn.end_stream()
        elif mode == "stream_error":
            await tokens(1)
            conn.end_stream(d.error_event("model overloaded"))
        elif mode == "eof":
            await tokens(2)
            conn.end_stream(d.before_end())
        elif mode == "close":
            await tokens(2)
            conn.close()
        elif mode == "reset":
            await tokens(1)
            await asyncio.sleep(0.01)
            _rst(conn)
        elif mode == "stall":
            await tokens(1)
            await asyncio.sleep(3600)
        elif mode == "huge_line":
            await tokens(1)
            piece = chunk_frame(b"x" * (256 << 10))
            conn.write(chunk_frame(b"data: "))
            for _ in range(HUGE_LINE_BYTES >> 18):
                if conn.closed:  # the client hung up: its limit worked
                    return
                conn.write(piece)
                await asyncio.sleep(0)
            await asyncio.sleep(3600)
        elif mode == "drip":
            deadline = time.monotonic() + 3600
            while time.monotonic() < deadline and not conn.closed:
                await tokens(1)
                await asyncio.sleep(0.1)


_DIALECTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/messages": "messages",
    "/v1/responses": "responses",
}


class _Shape:
    """The bytes of one dialect: OpenAI chat, OpenAI completions, Anthropic Messages, or the
    OpenAI Responses API."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        self.messages = dialect == "messages"
        self.responses = dialect == "responses"

    def _sse(self, obj: dict[str, Any]) -> bytes:
        if self.messages or self.responses:  # named events, the name repeated as "type"
            return b"event: %s\ndata: %s\n\n" % (obj["type"].encode(), json_bytes(obj))
        return b"data: " + json_bytes(obj) + b"\n\n"

    def _chunk(self, text: str | None = None, finish: str | None = None, **more: Any) -> bytes:
        if self.dialect == "chat":
            choice = {"index": 0, "delta": {} if text is None else {"content": text}}
        else:
            choice = {"index": 0, "text": text or ""}
        obj = {"id": "f", "model": "fault", "choices": [choice | {"finish_reason": finish}]}
        return self._sse(obj | more)

    def error_body(self, message: str) -> dict[str, Any]:
        if self.messages:
            return {"type": "error", "error": {"type": "overloaded_error", "message": message}}
        return {"error": {"message": message, "type": "server_error"}}

    def start(self) -> bytes:
        if self.responses:
            return self._sse(
                {"type": "response.created", "response": self._response("in_progress")}
            )
        if not self.messages:
            return b""
        msg: dict[str, Any] = {"id": "f", "type": "message", "role": "assistant", "content": []}
        msg |= {
            "model": "fault",
            "stop_reason": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
        block = {"type": "text", "text": ""}
        return self._sse({"type": "message_start", "message": msg}) + self._sse(
            {"type": "content_block_start", "index": 0, "content_block": block}
        )

    def _response(self, status: str, text: str = "") -> dict[str, Any]:
        """A Responses API response object (``text``: its one output message)."""
        content = [{"type": "output_text", "text": text}] if text else []
        output = [{"type": "message", "role": "assistant", "content": content}] if text else []
        usage = {"input_tokens": 1, "output_tokens": 3, "total_tokens": 4}
        return {"id": "f", "object": "response", "status": status, "output": output} | {
            "usage": usage if status == "completed" else None
        }

    def token(self, text: str) -> bytes:
        if self.responses:
            return self._sse({"type": "response.output_text.delta", "item_id": "m", "delta": text})
        if self.messages:
            delta = {"type": "text_delta", "text": text}
            return self._sse({"type": "content_block_delta", "index": 0, "delta": delta})
        return self._chunk(text)

    def before_end(self) -> bytes:
        """What comes after the last token but before the end marker (Anthropic: the stop
        reason and usage; so an EOF here proves that only message_stop completes)."""
        if self.responses:  # the text's done events: still not the response's end
            return self._sse({"type": "response.output_text.done", "item_id": "m", "text": ""})
        if not self.messages:
            return b""
        return self._sse({"type": "content_block_stop", "index": 0}) + self._sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 3},
            }
        )

    def end(self) -> bytes:
        if self.responses:
            done = {"type": "response.completed", "response": self._response("completed", "x")}
            return self.before_end() + self._sse(done)
        if self.messages:
            return self.before_end() + self._sse({"type": "message_stop"})
        usage = {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}
        return self._chunk(finish="stop") + self._chunk(usage=usage) + b"data: [DONE]\n\n"

    def malformed(self) -> bytes:
        if self.responses:
            return b'event: response.output_text.delta\ndata: {"type": "response.output_te\n\n'
        if self.messages:
            return b'event: content_block_delta\ndata: {"type": "content_block_delta", \n\n'
        return b'data: {"choices": [{"delta": \n\n'

    def error_event(self, message: str) -> bytes:
        if self.responses:  # the Responses API's stream error: no "error" wrapper
            return self._sse({"type": "error", "code": "server_error", "message": message})
        if self.messages:
            return self._sse(self.error_body(message))
        return b"data: " + json_bytes(self.error_body(message)) + b"\n\n"

    def whole(self, text: str) -> dict[str, Any]:
        """The non-streaming answer."""
        if self.responses:
            return self._response("completed", text)
        if self.messages:
            usage = {"input_tokens": 1, "output_tokens": 3}
            return {"id": "f", "type": "message", "role": "assistant", "model": "fault"} | {
                "content": [{"type": "text", "text": text}],
                "stop_reason": "end_turn",
                "usage": usage,
            }
        chat = self.dialect == "chat"
        choice = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
        usage = {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}
        return {"id": "f", "choices": [{"index": 0, "finish_reason": "stop"} | choice]} | {
            "usage": usage
        }

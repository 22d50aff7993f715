"""A real misbehaving OpenAI-compatible server on loopback, one fault per request.

The fault is picked by a path prefix, ``/fault/<mode>/v1/chat/completions`` (so an endpoint URL
``http://127.0.0.1:P/fault/<mode>`` makes every request of a client misbehave the same way),
or by an ``X-Fault: <mode>`` header or a ``"fault": "<mode>"`` body field (a request's
``extra_body``) on a plain ``/v1/...`` path. Chat or completions chunks
follow the path. Every fault is real bytes on a real socket (a reset is a TCP RST).

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

from loadlab.testing.http import HTTPConnection, Request, chunk_frame, json_bytes, parse_json_body

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
)


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
        if path not in ("/v1/chat/completions", "/v1/completions") or mode not in MODES:
            conn.respond(404, json_bytes({"error": {"message": f"no route {req.path}"}}))
            return
        task = asyncio.ensure_future(
            self._serve(conn, req, mode, path.endswith("chat/completions"), body)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(
        self, conn: HTTPConnection, req: Request, mode: str, chat: bool, body: dict[str, Any]
    ) -> None:
        def event(text: str | None = None, finish: str | None = None, **more: Any) -> bytes:
            if chat:
                choice = {"index": 0, "delta": {} if text is None else {"content": text}}
            else:
                choice = {"index": 0, "text": text or ""}
            obj = {"id": "f", "model": "fault", "choices": [choice | {"finish_reason": finish}]}
            return b"data: " + json_bytes(obj | more) + b"\n\n"

        async def tokens(n: int) -> None:
            for _ in range(n):
                await asyncio.sleep(0.005)
                conn.write(chunk_frame(event(" tok")))

        error = {"error": {"message": "model overloaded", "type": "server_error"}}
        if mode == "reset_early":
            _rst(conn)
        elif mode == "429":
            conn.respond(429, json_bytes(error), headers={"Retry-After": "7"})
        elif mode == "500_html":
            conn.respond(
                500, b"<html><body><h1>500 Internal Server Error</h1></body></html>", "text/html"
            )
        elif mode == "echo_auth":
            auth = req.headers.get("authorization", "")
            conn.respond(401, json_bytes({"error": {"message": f"bad key: {auth}"}}))
        elif mode == "non_json":
            conn.respond(200, b"hello, world", "text/plain")
        elif mode == "not_sse":
            conn.start_stream(first=b"<html><body>maintenance</body></html>")
            conn.end_stream()
        elif mode == "ok" and not body.get("stream"):
            text = " tok" * 3
            choice = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
            usage = {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}
            out = {
                "id": "f",
                "choices": [{"index": 0, "finish_reason": "stop"} | choice],
                "usage": usage,
            }
            conn.respond(200, json_bytes(out))
        else:
            await self._stream(conn, mode, event, tokens, error)

    async def _stream(
        self, conn: HTTPConnection, mode: str, event: Any, tokens: Any, error: Any
    ) -> None:
        conn.start_stream()
        if mode == "ok":
            await tokens(3)
            usage = {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}
            conn.end_stream(event(finish="stop") + event(usage=usage) + b"data: [DONE]\n\n")
        elif mode == "malformed":
            await tokens(1)
            conn.write(chunk_frame(b'data: {"choices": [{"delta": \n\n'))
            conn.end_stream()
        elif mode == "stream_error":
            await tokens(1)
            conn.end_stream(b"data: " + json_bytes(error) + b"\n\n")
        elif mode == "eof":
            await tokens(2)
            conn.end_stream()
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
        elif mode == "drip":
            deadline = time.monotonic() + 3600
            while time.monotonic() < deadline and not conn.closed:
                await tokens(1)
                await asyncio.sleep(0.1)

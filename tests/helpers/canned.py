"""A real HTTP/1.1 server on loopback that answers each request with bytes a test wrote: a
status, headers and body no well-behaved server would send (negative usage, escape sequences
in an error, a redirect, a 401 on ``/metrics``).

Usage::

    with CannedServer({"/v1/chat/completions": sse_response([...])}) as srv:
        url = srv.url                       # http://127.0.0.1:PORT
        srv.requests                        # ["POST /v1/chat/completions", ...]
"""

from __future__ import annotations

import json
import socketserver
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tests.helpers.loopback import ThreadedServer

__all__ = ["CannedServer", "response", "sse_response"]


def response(status: str, body: bytes, headers: Mapping[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 response that closes its connection: ``response("200 OK", b"hi")``."""
    head = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def sse_response(events: Sequence[Any]) -> bytes:
    """A 200 ``text/event-stream`` of ``data:`` events (JSON, or a str as is), then ``[DONE]``."""
    body = b"".join(
        b"data: " + (e.encode() if isinstance(e, str) else json.dumps(e).encode()) + b"\n\n"
        for e in [*events, "[DONE]"]
    )
    return response("200 OK", body, {"Content-Type": "text/event-stream"})


class _Handler(socketserver.StreamRequestHandler):
    server: Any  # a ThreadedServer's, with ``requests`` and ``answer``

    def handle(self) -> None:
        first = self.rfile.readline(65536).decode("latin-1").strip()
        length = 0
        while True:
            line = self.rfile.readline(65536)
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        if length:
            self.rfile.read(length)
        path = first.split(" ")[1] if first.count(" ") >= 2 else "/"
        self.server.requests.append(first)
        answer = self.server.answer(path)
        self.wfile.write(answer if answer is not None else response("404 Not Found", b"{}"))


class CannedServer(ThreadedServer):
    """``with CannedServer(routes) as srv``: answers ``routes[path]`` (bytes, or a function of
    the path) on 127.0.0.1 until the block ends; any other path is a 404."""

    def __init__(self, routes: Mapping[str, bytes | Callable[[str], bytes]]) -> None:
        self.routes = dict(routes)
        self.requests: list[str] = []
        super().__init__(_Handler, requests=self.requests, answer=self._answer)

    def _answer(self, path: str) -> bytes | None:
        found = self.routes.get(path.split("?")[0])
        return found(path) if callable(found) else found

    def __enter__(self) -> CannedServer:
        super().__enter__()
        return self

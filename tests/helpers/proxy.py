"""A real forward HTTP proxy on loopback: what ``HTTP_PROXY`` points at in the tests.

It takes absolute-form requests (``POST http://127.0.0.1:P/v1/... HTTP/1.1``), sends each to
its origin in origin form with ``Connection: close``, streams the answer back as it arrives
(an SSE stream stays a stream) and closes. It keeps the request line of every request it
forwarded (``proxied``), so a test can tell a proxied request from a direct one.

Usage::

    with ForwardProxy() as proxy:
        os.environ["HTTP_PROXY"] = proxy.url
        ...
        proxy.proxied       # ["POST http://127.0.0.1:P/v1/chat/completions HTTP/1.1", ...]
"""

from __future__ import annotations

import socket
import socketserver
from typing import Any
from urllib.parse import urlsplit

from tests.helpers.loopback import ThreadedServer

__all__ = ["ForwardProxy"]


class _Handler(socketserver.StreamRequestHandler):
    server: Any  # a ThreadedServer's, with ``proxied``

    def handle(self) -> None:
        first = self.rfile.readline(65536).decode("latin-1").rstrip("\r\n")
        method, target, version = first.split(" ", 2)
        headers, length = [], 0
        while True:
            line = self.rfile.readline(65536).decode("latin-1")
            if line in ("\r\n", "\n", ""):
                break
            name = line.split(":", 1)[0].strip().lower()
            if name == "content-length":
                length = int(line.split(":", 1)[1])
            if name not in ("connection", "keep-alive", "proxy-connection", "proxy-authorization"):
                headers.append(line.rstrip("\r\n"))
        body = self.rfile.read(length) if length else b""
        url = urlsplit(target)
        if url.scheme != "http" or url.hostname != "127.0.0.1":  # loopback origins only
            self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return
        self.server.proxied.append(first)
        path = url.path + (f"?{url.query}" if url.query else "")
        head = "\r\n".join([f"{method} {path or '/'} {version}", *headers, "Connection: close"])
        with socket.create_connection((url.hostname, url.port or 80), timeout=60) as up:
            up.sendall(head.encode("latin-1") + b"\r\n\r\n" + body)
            while data := up.recv(65536):
                self.wfile.write(data)
                self.wfile.flush()


class ForwardProxy(ThreadedServer):
    """``with ForwardProxy() as proxy``: serves on 127.0.0.1 until the block ends."""

    def __init__(self) -> None:
        self.proxied: list[str] = []
        super().__init__(_Handler, proxied=self.proxied)

    def __enter__(self) -> ForwardProxy:
        super().__enter__()
        return self

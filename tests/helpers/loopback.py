"""What tests need to start servers and processes: the checkout's root, a free loopback port,
an async server in its own thread, a self-signed certificate, and the outcome class each
``FaultServer`` mode must become (the asyncio client and the Locust transport alike)."""

from __future__ import annotations

import asyncio
import shutil
import socket
import socketserver
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "FAULT_OUTCOMES",
    "ROOT",
    "ThreadedServer",
    "free_port",
    "self_signed_cert",
    "serve_in_thread",
]

ROOT = Path(__file__).resolve().parents[2]

FAULT_OUTCOMES = {
    "ok": "ok",
    "malformed": "protocol_error",
    "stream_error": "stream_error",
    "eof": "incomplete",
    "close": "incomplete",
    "reset": "incomplete",
    "reset_early": "connect_error",
    "429": "http_429",
    "500_html": "http_500",
    "non_json": "protocol_error",
    "not_sse": "protocol_error",
    "stall": "timeout",
    "drip": "timeout",
    "huge_line": "protocol_error",
}


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_in_thread(make: Callable[[], AbstractAsyncContextManager[Any]]) -> Iterator[Any]:
    """Start ``make()`` (an async context manager) in a thread's loop; yield it; stop it."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stop = asyncio.Event()
    holder: dict[str, Any] = {}

    async def main() -> None:
        server: AbstractAsyncContextManager[Any] = make()
        async with server as srv:
            holder["srv"] = srv
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("test server did not start in 10 s")
    try:
        yield holder["srv"]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (PEM files in ``folder``); skips without openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not found")
    crt, key = folder / "c.pem", folder / "k.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(crt)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return crt, key


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class ThreadedServer:
    """A ``socketserver`` handler served on 127.0.0.1 from a thread until the block ends:
    ``with ThreadedServer(Handler, routes=...) as srv`` (``srv.url``); each keyword becomes an
    attribute of the server, where ``Handler`` reads it as ``self.server.<name>``."""

    def __init__(self, handler: type[socketserver.BaseRequestHandler], **attrs: Any) -> None:
        self.handler, self.attrs, self.url = handler, attrs, ""
        self._server: _TCPServer | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ThreadedServer:
        server = _TCPServer(("127.0.0.1", 0), self.handler)
        for name, value in self.attrs.items():
            setattr(server, name, value)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(10)

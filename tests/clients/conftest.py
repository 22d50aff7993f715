"""Servers for the client tests: each in its own thread and event loop, on 127.0.0.1."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from loadlab.testing.fault_server import FaultServer
from loadlab.testing.fixed_server import FixedScheduleServer


def _serve_in_thread(make: Any) -> Iterator[Any]:
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


@pytest.fixture(scope="session")
def fault_server() -> Iterator[FaultServer]:
    yield from _serve_in_thread(FaultServer)


@pytest.fixture(scope="session")
def fixed_server() -> Iterator[FixedScheduleServer]:
    yield from _serve_in_thread(lambda: FixedScheduleServer(ttft_ms=20, itl_ms=2))

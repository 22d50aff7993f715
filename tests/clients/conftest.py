"""Servers for the client tests: each in its own thread and event loop, on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loadlab.selftest._fixed_server import FixedScheduleServer
from tests.helpers.fault_server import FaultServer
from tests.helpers.loopback import serve_in_thread


@pytest.fixture(scope="session")
def fault_server() -> Iterator[FaultServer]:
    yield from serve_in_thread(FaultServer)


@pytest.fixture(scope="session")
def fixed_server() -> Iterator[FixedScheduleServer]:
    yield from serve_in_thread(lambda: FixedScheduleServer(ttft_ms=20, itl_ms=2))

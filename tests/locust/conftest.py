"""The fixed-schedule server the Locust tests stream from (Locust itself runs in its own
processes: ``tests/helpers/locust.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from loadlab.selftest._fixed_server import FixedServerProcess
from tests.helpers.locust import get_json, post


@pytest.fixture(scope="module")
def fixed_server() -> Iterator[str]:
    """TTFT 50 ms, ITL 20 ms, answers as long as ``max_tokens``."""
    with FixedServerProcess(ttft_ms=50, itl_ms=20) as url:
        yield url


@pytest.fixture
def truth(fixed_server: str) -> Iterator[Any]:
    """Reset the server's truth before the test; call the yielded function to read it."""
    post(fixed_server + "/truth/reset")
    yield lambda: get_json(fixed_server + "/truth")

"""Reference servers for the tests: the ``tiny`` preset in real subprocesses on loopback.

One server per configuration for the whole session (started on first use, always stopped).
Every server requires an API key, so every test also exercises the auth path.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import uvicorn

from reference_server.cli import build_app
from reference_server.config import ServerConfig
from reference_server.launch import RunningServer, free_port
from tests.helpers.server import API_KEY

MODES = ("static", "continuous", "chunked", "disaggregated")
# A short context keeps every request (and every fuzzed one) to a few hundred milliseconds;
# 40 blocks of 16 tokens is less than 8 sequences x 128 tokens, so busy runs preempt.
BASE = ServerConfig(preset="tiny", api_key_env="LOADLAB_TEST_KEY", threads=1)
MODE_CONFIG = replace(BASE, max_num_seqs=8, max_queue=64, max_model_len=128, num_kv_blocks=40,
                      max_batched_tokens=64, chunk_size=16)  # fmt: skip
# A reasoning model that calls a tool whenever a request offers one.
REASONING_CONFIG = replace(BASE, mode="continuous", max_num_seqs=8, max_model_len=512,
                           num_kv_blocks=96, reasoning_tokens=6, tool_call_rate=1.0)  # fmt: skip
# Capacity 2 (one running, one queued) and the full context, for overload and disconnects.
SMALL_CONFIG = replace(BASE, mode="continuous", max_num_seqs=1, max_queue=1)


class InProcessServer:
    """The real app (``cli.build_app``) under uvicorn in a thread of the test process, as
    httpx's tests do: one torch import serves every mode, which keeps start-up cheap."""

    def __init__(self, config: ServerConfig) -> None:
        os.environ["LOADLAB_TEST_KEY"] = API_KEY
        self.mode = mode = config.mode
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app, self.engine, _info = build_app(replace(config, port=self.port))
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                timeout_graceful_shutdown=2, access_log=False)  # fmt: skip
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name=f"server-{mode}", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout_s: float = 60.0) -> InProcessServer:
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"in-process server on {self.url} did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(15)
        if self.mode == "disaggregated":  # the lifespan stops the workers; make sure of it
            self.engine.stop()


class _Servers:
    """Starts each configuration on first use and stops them all at the end of the session.

    The overload server is a real subprocess started through ``launch`` (the path users and
    benchmarks take); it is started first so its start-up overlaps the in-process ones.
    """

    def __init__(self) -> None:
        self._running: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        if not self._running:
            self._running["small"] = RunningServer(
                config=SMALL_CONFIG, api_key=API_KEY, env={"LOADLAB_TEST_KEY": API_KEY}
            )
        if name not in self._running:
            config = REASONING_CONFIG if name == "reasoning" else replace(MODE_CONFIG, mode=name)
            self._running[name] = InProcessServer(config)
        return self._running[name].wait_ready(60)

    def close(self) -> None:
        for server in self._running.values():
            server.stop()


@pytest.fixture(scope="session")
def servers() -> Iterator[_Servers]:
    s = _Servers()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="session", params=MODES)
def server(request: pytest.FixtureRequest, servers: _Servers) -> Any:
    """A server in each mode (tests using it run once per mode)."""
    return servers.get(request.param)


def _one(name: str) -> Any:
    """The session fixture ``{name}_server``: that one configuration of ``_Servers.get``."""

    @pytest.fixture(scope="session", name=f"{name}_server")
    def one_server(servers: _Servers) -> Any:
        return servers.get(name)

    return one_server


continuous_server = _one("continuous")
disaggregated_server = _one("disaggregated")
reasoning_server = _one("reasoning")  # a reasoning model and an agent (REASONING_CONFIG)
small_server = _one("small")  # a RunningServer subprocess of capacity 2 (SMALL_CONFIG)

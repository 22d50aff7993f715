"""A whole run against a real misbehaving server: every fault becomes its outcome class, the
run goes on, the results file is written, the invariants hold, and the API key (a canary)
appears nowhere in it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from pathlib import Path
from typing import Unpack

import pytest

from loadlab._analysis.metrics import count_outcomes
from loadlab._runner.runner import Runner
from loadlab.clients import OpenAIClient
from loadlab.clients._base import Completion, SendOptions
from loadlab.config import EndpointConfig, RunConfig
from loadlab.records import RequestSpec
from loadlab.results import read_results, write_results
from tests.helpers.fault_server import FaultServer

EXPECTED = {
    "ok": "ok",
    "malformed": "protocol_error",
    "stream_error": "stream_error",
    "eof": "incomplete",
    "reset": "incomplete",
    "reset_early": "connect_error",
    "429": "http_429",
    "500_html": "http_500",
    "echo_auth": "http_401",
    "stall": "timeout",
}
CANARY = "sk-canary-5f3e9d2a7b"


class FaultMix:
    """One real OpenAI client per fault mode; request i goes to mode i mod len(modes)."""

    def __init__(self, base: str, cfg: RunConfig) -> None:
        self.modes = list(EXPECTED)
        self.clients = {
            m: OpenAIClient(
                EndpointConfig(url=f"{base}/fault/{m}", name=m, api_key_env="LOADLAB_CANARY_KEY"),
                timeout_s=cfg.timeout_s,
                read_timeout_s=cfg.read_timeout_s,
            )
            for m in self.modes
        }
        self.stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> FaultMix:
        for c in self.clients.values():
            await self.stack.enter_async_context(c)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stack.aclose()

    async def send(self, spec: RequestSpec, **options: Unpack[SendOptions]) -> Completion:
        mode = self.modes[int(spec.request_id) % len(self.modes)]
        return await self.clients[mode].send(spec, **options)


def test_a_run_mixing_faults_completes_and_keeps_every_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOADLAB_CANARY_KEY", CANARY)
    cfg = RunConfig(concurrency=5, requests=20, read_timeout_s=1.0, timeout_s=5.0)
    specs = (RequestSpec(str(i), "hello", 4) for i in itertools.count())

    async def go() -> object:
        async with FaultServer() as srv, FaultMix(srv.url, cfg) as client:
            return await Runner(cfg, specs, client).run()

    res = asyncio.run(go())
    path = write_results(res, tmp_path / "faults.json")  # type: ignore[arg-type]
    back = read_results(path)
    got = {r.request_id: r.outcome for r in back.records}
    assert len(got) == 20
    modes = list(EXPECTED)
    assert got == {str(i): EXPECTED[modes[i % len(modes)]] for i in range(20)}
    c = count_outcomes(back.records, back.scheduled_count)
    assert c.scheduled == c.sent + c.dropped == 20
    assert c.sent == c.ok + c.failed and c.ok == 2
    assert CANARY not in path.read_text(encoding="utf-8")

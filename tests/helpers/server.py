"""Helpers for the reference server's tests: the API key every test server requires, small
aiohttp helpers (SSE parsing, metrics scraping), and the server run as a tool-calling agent."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import aiohttp

API_KEY = "test-key-not-a-secret"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def session(**kw: Any) -> aiohttp.ClientSession:
    timeout = kw.pop("timeout", aiohttp.ClientTimeout(total=30))
    return aiohttp.ClientSession(headers=AUTH, timeout=timeout, **kw)


async def post(s: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any, Any]:
    """POST JSON; returns (status, parsed body, headers)."""
    async with s.post(url, json=body) as r:
        return r.status, await r.json(content_type=None), r.headers


async def stream(s: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[Any]:
    """POST a streaming request; every ``data:`` payload in order (JSON, or the "[DONE]" str)."""
    events: list[Any] = []
    async with s.post(url, json=body) as r:
        assert r.status == 200, await r.text()
        assert r.headers["content-type"].startswith("text/event-stream")
        buf = b""
        async for chunk in r.content.iter_any():
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                data = event.decode().removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
    assert buf == b""
    return events


async def metrics(s: aiohttp.ClientSession, base: str) -> dict[str, float]:
    """Unlabelled samples and labelled ones keyed as ``name{labels}``."""
    async with s.get(base + "/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name.removeprefix("loadlab_server_")] = float(value)
    return out


async def wait_idle(
    s: aiohttp.ClientSession, base: str, timeout_s: float = 15.0
) -> dict[str, float]:
    """Poll /metrics until nothing runs, waits or holds KV blocks; returns the last sample."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = await metrics(s, base)
        idle = (
            m["running_requests"],
            m["queue_depth"],
            m["kv_blocks_used"],
            m["requests_in_flight"],
        )
        if idle == (0, 0, 0, 0) or time.monotonic() > deadline:
            return m
        await asyncio.sleep(0.05)


def label(name: str, **labels: str) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}}"


ASCII = re.compile(r"^[\x00-\x7f]*$")


def serve_agent(reasoning_tokens: int) -> Iterator[str]:
    """A fixture's body: the reference server (fake preset) as an agent that thinks
    ``reasoning_tokens`` tokens, then calls a tool in every answer that may (``--tool-call-rate
    1``); yields its URL and stops it. The caller skips where the server's extra is missing."""
    from reference_server import launch

    flags = ["--reasoning-tokens", str(reasoning_tokens), "--tool-call-rate", "1"]
    with launch.start_server(mode="continuous", preset="fake", extra_args=flags,
                             timeout_s=60) as server:  # fmt: skip
        yield server.url

"""CPU cost of the client per streamed token: the SSE decoder alone, the stream interpretation
(SSE + JSON + token detection), and the whole client over loopback for each transport.

CPU time (user + system of this process), not wall time, so a busy machine inflates the
figures less than it would wall-clock ones (it still does: shared caches, SMT siblings).

    python3 benchmarks/client_overhead.py                     # all three parts, ~1-2 minutes
    python3 benchmarks/client_overhead.py --events 50000 --streams 64 --requests 256
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import urllib.request
from typing import cast

import aiohttp
import numpy as np

from loadlab.clients import OpenAIClient, OpenAIStreamState
from loadlab.clients._http1 import Ended, ResponseReader
from loadlab.clients._sse import SSEDecoder
from loadlab.config import EndpointConfig
from loadlab.records import RequestRecord, RequestSpec
from loadlab.selftest import FixedServerProcess

CHUNK = (
    b'data: {"id":"cmpl-q1","object":"chat.completion.chunk","created":1796028737,'
    b'"model":"loadlab-fixed","choices":[{"index":0,"delta":{"content":" tok"},'
    b'"finish_reason":null}]}\n\n'
)


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def per_event_us(fn: object, n: int) -> float:
    c0 = cpu_s()
    for _ in range(n):
        fn(CHUNK)  # type: ignore[operator]
    return (cpu_s() - c0) / n * 1e6


def micro(n: int) -> None:
    dec = SSEDecoder()
    print(
        f"SSE decoder, feed_raw (one event per read):    {per_event_us(dec.feed_raw, n):6.2f} us/event"
    )
    dec = SSEDecoder()
    print(
        f"SSE decoder, feed -> SSEEvent objects:         {per_event_us(dec.feed, n):6.2f} us/event"
    )
    ten = CHUNK * 10
    c0 = cpu_s()
    dec = SSEDecoder()
    for _ in range(n // 10):
        dec.feed_raw(ten)
    print(
        f"SSE decoder, 10 events per read:               {(cpu_s() - c0) / n * 1e6:6.2f} us/event"
    )
    state = OpenAIStreamState(RequestRecord("r"), "chat")
    state.on_headers(200, {"Content-Type": "text/event-stream"}, 0)
    c0 = cpu_s()
    for i in range(n):
        state.on_bytes(CHUNK, i)
    print(
        f"OpenAIStreamState.on_bytes (SSE+JSON+tokens):  {(cpu_s() - c0) / n * 1e6:6.2f} us/chunk"
    )
    # what a read of the raw transport goes through: the HTTP reader, then the stream's frame
    state = OpenAIStreamState(RequestRecord("r"), "chat")
    reader = ResponseReader()
    reader.start(state, Ended())
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    reader.feed(head, 0)
    framed = b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK)
    c0 = cpu_s()
    for i in range(n):
        reader.feed(framed, i)
    print(
        f"ResponseReader.feed (HTTP chunk, then state):  {(cpu_s() - c0) / n * 1e6:6.2f} us/chunk"
    )


async def bare_aiohttp(url: str, streams: int, requests: int, tokens: int) -> None:
    """Reference: aiohttp reading the same streams and doing nothing with them."""
    body = json.dumps({"model": "m", "messages": [], "max_tokens": tokens, "stream": True}).encode()
    ids = iter(range(requests))

    async def worker(s: aiohttp.ClientSession) -> None:
        for i in ids:
            hdrs = {"X-Request-Id": f"b{i}", "Content-Type": "application/json"}
            async with s.post(url + "/v1/chat/completions", data=body, headers=hdrs) as r:
                async for _ in r.content.iter_any():
                    time.perf_counter_ns()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=streams)) as s:
        await asyncio.gather(*(worker(s) for _ in range(streams)))


class _Discard(asyncio.Protocol):
    """Reads a keep-alive connection's chunked responses and keeps nothing: the floor."""

    def __init__(self) -> None:
        self.done: asyncio.Future[None] | None = None
        self.tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        time.perf_counter_ns()
        self.tail = (self.tail + data)[-5:]
        if self.tail == b"0\r\n\r\n" and self.done is not None and not self.done.done():
            self.done.set_result(None)


async def bare_protocol(url: str, streams: int, requests: int, tokens: int) -> None:
    """Floor: an asyncio protocol that sends each request and reads its stream to the end, with
    no HTTP or SSE parsing at all (the event loop's and the kernel's cost a read)."""
    host, port = url.split("//")[1].split(":")
    body = json.dumps({"model": "m", "messages": [], "max_tokens": tokens, "stream": True}).encode()
    ids = iter(range(requests))
    loop = asyncio.get_running_loop()

    async def worker() -> None:
        _, proto = await loop.create_connection(_Discard, host, int(port))
        for i in ids:
            proto.done, proto.tail = loop.create_future(), b""
            head = (
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nX-Request-Id: p{i}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            )
            proto.transport.write(head.encode() + body)
            await proto.done
        proto.transport.close()

    await asyncio.gather(*(worker() for _ in range(streams)))


async def loadlab_client(
    url: str, streams: int, requests: int, tokens: int, transport: str
) -> None:
    ids = iter(range(requests))
    t0 = time.perf_counter_ns()

    async def worker(c: OpenAIClient) -> None:
        for i in ids:
            done = await c.send(RequestSpec(f"{transport}{i}", "hi", tokens), t0_ns=t0)
            if not done.record.ok:
                raise SystemExit(f"request failed: {done.record.outcome} {done.record.error}")

    ep = EndpointConfig(url)
    async with OpenAIClient(ep, max_connections=streams, transport=transport) as c:
        await asyncio.gather(*(worker(c) for _ in range(streams)))


def e2e(streams: int, requests: int, tokens: int, itl_ms: float, rounds: int) -> None:
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run  # type: ignore[assignment]
    print(
        f"\nwhole client over loopback: {streams} streams x {requests} requests x {tokens} tokens,"
    )
    print(
        f"fixed server (own process) at ITL {itl_ms} ms; client CPU only; {rounds} round(s),"
        " alternating the order (the machine's speed drifts: compare within a round)"
    )
    with FixedServerProcess(ttft_ms=10, itl_ms=itl_ms, tokens=tokens) as url:
        cases = [
            (
                "loadlab raw transport",
                lambda: loadlab_client(url, streams, requests, tokens, "raw"),
            ),
            (
                "loadlab aiohttp transport",
                lambda: loadlab_client(url, streams, requests, tokens, "aiohttp"),
            ),
            ("bare aiohttp, no parsing", lambda: bare_aiohttp(url, streams, requests, tokens)),
            ("bare protocol (floor)", lambda: bare_protocol(url, streams, requests, tokens)),
        ]
        for r in range(rounds):
            for name, make in cases if r % 2 == 0 else cases[::-1]:
                t0, w0 = os.times(), time.perf_counter()
                run(make())
                t1, wall = os.times(), time.perf_counter() - w0
                n = requests * tokens
                user, system = (t1.user - t0.user) / n * 1e6, (t1.system - t0.system) / n * 1e6
                print(
                    f"  {name:27s} {user + system:6.1f} us CPU/token ({user:4.1f} user,"
                    f" {system:4.1f} system)   ({n / wall:,.0f} tokens/s reached)"
                )


async def _send_delays(url: str, n: int, transport: str) -> tuple[list[float], list[float]]:
    """Per request: server receive time minus ``sent_ns``, and minus the time ``send`` was called."""
    from_sent, from_call = [], []
    async with OpenAIClient(EndpointConfig(url), transport=transport) as c:
        for i in range(n):
            t_call = time.perf_counter_ns()
            done = await c.send(RequestSpec(f"s{transport}{i}", "hi", 2), t0_ns=0)
            from_sent.append(float(done.record.sent_ns or 0))
            from_call.append(float(t_call))
    with urllib.request.urlopen(url + "/truth", timeout=30) as resp:  # noqa: S310 (loopback)
        truth = json.load(resp)
    recv = [truth[f"s{transport}{i}"]["recv_ns"] for i in range(n)]
    return (
        [(r - s) / 1e3 for r, s in zip(recv, from_sent, strict=True)][1:],  # 1st: new connection
        [(r - s) / 1e3 for r, s in zip(recv, from_call, strict=True)][1:],
    )


def send_stamp(n: int) -> None:
    print(
        f"\nwhere sent_ns is taken: server receive time minus the stamp, one stream, {n} requests"
    )
    with FixedServerProcess(ttft_ms=1, itl_ms=1, tokens=2) as url:
        for transport in ("raw", "aiohttp"):
            sent, call = asyncio.run(_send_delays(url, n, transport))
            p = lambda xs: " / ".join(f"{q:.0f}" for q in np.percentile(xs, [50, 90, 99]))  # noqa: E731
            print(
                f"  {transport:8s} stamp at the socket write: {p(sent)} us   at the send() call: {p(call)} us (p50/p90/p99)"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=200_000, help="events for the micro-benchmarks")
    p.add_argument("--streams", type=int, default=128)
    p.add_argument("--requests", type=int, default=512)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--itl-ms", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=1, help="rounds of the whole-client cases")
    p.add_argument("--skip-e2e", action="store_true")
    p.add_argument("--send-requests", type=int, default=300, help="requests for the sent_ns check")
    a = p.parse_args()
    print(f"loadlab client overhead; host CPUs: {os.cpu_count()}; load average: {os.getloadavg()}")
    micro(a.events)
    send_stamp(a.send_requests)
    if not a.skip_e2e:
        e2e(a.streams, a.requests, a.tokens, a.itl_ms, a.rounds)


if __name__ == "__main__":
    main()

"""End-to-end check of the client against the fixed-schedule server in its own process.

Closed loop: N concurrent streams, each sending requests back to back until R requests are
done. Prints the tokens/s the server actually reached (from its write log) and the client's
TTFT / ITL error against that truth.

    python3 benchmarks/client_load.py --streams 256 --ttft-ms 50 --itl-ms 5 --tokens 128 --requests 2560
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import urllib.request

import numpy as np

from loadlab.clients import OpenAIClient
from loadlab.config import EndpointConfig
from loadlab.records import RequestSpec
from loadlab.selftest import FixedServerProcess


async def drive(
    url: str, streams: int, requests: int, tokens: int, api: str, transport: str
) -> tuple[list, int]:
    ep = EndpointConfig(url, api=api)
    t0 = time.perf_counter_ns()
    ids = iter(range(requests))
    records = []

    async def worker(client: OpenAIClient) -> None:
        for i in ids:
            done = await client.send(RequestSpec(f"q{i}", "hello world", tokens), t0_ns=t0)
            records.append(done.record)

    async with OpenAIClient(ep, max_connections=streams, transport=transport) as client:
        await asyncio.gather(*(worker(client) for _ in range(streams)))
    return records, t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--requests", type=int, default=2560)
    p.add_argument("--ttft-ms", type=float, default=50)
    p.add_argument("--itl-ms", type=float, default=5)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--api", default="chat")
    p.add_argument("--no-uvloop", action="store_true")
    p.add_argument("--transport", default="raw", choices=["raw", "aiohttp"])
    a = p.parse_args()
    server = FixedServerProcess(ttft_ms=a.ttft_ms, itl_ms=a.itl_ms, tokens=a.tokens)
    with server as url:
        cpu0 = os.times()
        coro = drive(url, a.streams, a.requests, a.tokens, a.api, a.transport)
        if a.no_uvloop:
            records, t0 = asyncio.run(coro)
        else:
            import uvloop

            records, t0 = uvloop.run(coro)
        with urllib.request.urlopen(url + "/truth", timeout=60) as resp:  # noqa: S310 (loopback)
            truth = json.load(resp)
        cpu1 = os.times()
        cpu_client = cpu1.user - cpu0.user + cpu1.system - cpu0.system
        print(
            f"client user {cpu1.user - cpu0.user:.2f} s, system {cpu1.system - cpu0.system:.2f} s"
        )
        assert server.proc is not None
        with open(f"/proc/{server.proc.pid}/stat") as fh:
            f = fh.read().rsplit(")", 1)[1].split()
        cpu_server = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        print(f"server user {int(f[11]) / 100:.2f} s, system {int(f[12]) / 100:.2f} s")
    ok = [r for r in records if r.ok]
    chunks = sum(len(t["chunk_ns"]) for t in truth.values())
    span = max(t["chunk_ns"][-1] for t in truth.values()) - min(
        t["recv_ns"] for t in truth.values()
    )
    ttft_err, itl_err, read_delay, send_delay = [], [], [], []
    for r in ok:
        t = truth[r.request_id]
        tc = [x - t0 for x in t["chunk_ns"]]
        read_delay.append((r.chunk_ns[0] - tc[0]) / 1e6)  # first token: read minus write
        send_delay.append((t["recv_ns"] - t0 - r.sent_ns) / 1e6)  # server receive minus sent
        ttft_err.append(((r.chunk_ns[0] - r.sent_ns) - (tc[0] - (t["recv_ns"] - t0))) / 1e6)
        itl_err += list((np.diff(r.chunk_ns) - np.diff(tc)) / 1e6)
    q = [50, 90, 99]
    print(
        f"{a.streams} streams, TTFT {a.ttft_ms} ms, ITL {a.itl_ms} ms, {a.tokens} tokens, {len(records)} requests ({len(ok)} ok)"
    )
    print(
        f"CPU s: client {cpu_client:.1f}, server {cpu_server:.1f}; us/token client {cpu_client / chunks * 1e6:.1f}, server {cpu_server / chunks * 1e6:.1f}"
    )
    print(f"server reached {chunks / span * 1e9:,.0f} tokens/s")
    print(
        "TTFT error ms p50/p90/p99 (reported - server recv-to-first-write):",
        np.round(np.percentile(ttft_err, q), 2),
    )
    print("ITL error ms p50/p90/p99:", np.round(np.percentile(itl_err, q), 3))
    print("  of which first-token read delay:", np.round(np.percentile(read_delay, q), 2))
    print("  and send delay (server receive - sent):", np.round(np.percentile(send_delay, q), 2))


if __name__ == "__main__":
    main()

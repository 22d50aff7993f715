"""Do bad requests slow the good ones? The reference server under a legitimate load, with four
threads sending either good requests or bad ones beside it (a lone surrogate; temperature 2
with top_p 1e-300).

    python3 benchmarks/server_bad_requests.py                  # tiny preset, ~2 minutes
    python3 benchmarks/server_bad_requests.py --preset cpu --phase-s 10

Eight asyncio clients send non-streaming completions (64 tokens) in a closed loop: their output
tokens/s is the figure. Beside them, four threads loop over requests of one
kind per phase, alternated three times:

- ``alone``: no threads;
- ``good``: the threads send ordinary requests (64 tokens): the cost of four more clients;
- ``bad``: the threads alternate a prompt with a lone surrogate (a 400 now, a 500 before) and
  ``temperature 2, top_p 1e-300`` (served now; it failed its whole batch before, which then
  reran one request at a time).

"Never slows the others measurably" reads: ``bad`` is no lower than ``good``. A server that
failed such a batch and reran it one request at a time fell from ~4,300 legitimate tokens/s
to ~820 with such threads.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL = "loadlab-ref"
GOOD = {"model": MODEL, "prompt": "good " * 8, "max_tokens": 64}
BAD = [
    {"model": MODEL, "prompt": "bad \ud800 prompt", "max_tokens": 64},
    {"model": MODEL, "prompt": "odd sampling", "max_tokens": 64, "temperature": 2, "top_p": 1e-300},
]


def _threads(
    url: str, kind: str, stop: threading.Event, statuses: list[int]
) -> list[threading.Thread]:
    host, port = url.removeprefix("http://").split(":")
    bodies = [GOOD] if kind == "good" else BAD

    def loop() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        i = 0
        while not stop.is_set():
            conn.request("POST", "/v1/completions", json.dumps(bodies[i % len(bodies)]),
                         {"Content-Type": "application/json"})  # fmt: skip
            resp = conn.getresponse()
            resp.read()
            statuses.append(resp.status)
            i += 1
        conn.close()

    return [threading.Thread(target=loop, daemon=True) for _ in range(4)]


async def _legit_tokens_per_s(url: str, seconds: float) -> float:
    tokens = 0
    deadline = time.monotonic() + seconds

    async def client(s: aiohttp.ClientSession) -> None:
        nonlocal tokens
        while time.monotonic() < deadline:
            async with s.post(url + "/v1/completions", json=GOOD) as r:
                body = await r.json()
                tokens += body["usage"]["completion_tokens"]

    t0 = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
        await asyncio.gather(*(client(s) for _ in range(8)))
    return tokens / (time.monotonic() - t0)


def phase(url: str, kind: str, seconds: float) -> tuple[float, dict[int, int]]:
    stop, statuses = threading.Event(), list[int]()
    threads = _threads(url, kind, stop, statuses) if kind != "alone" else []
    for t in threads:
        t.start()
    try:
        rate = asyncio.run(_legit_tokens_per_s(url, seconds))
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    counts: dict[int, int] = {}
    for code in statuses:
        counts[code] = counts.get(code, 0) + 1
    return rate, counts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--phase-s", type=float, default=8.0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    from reference_server.launch import start_server

    print(f"loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())} at start")
    rates: dict[str, list[float]] = {"alone": [], "good": [], "bad": []}
    with start_server(mode="continuous", preset=args.preset) as server:
        phase(server.url, "alone", 2.0)  # warm-up
        for _ in range(args.rounds):
            for kind in rates:
                rate, counts = phase(server.url, kind, args.phase_s)
                rates[kind].append(rate)
                print(
                    f"{kind:6s} legitimate {rate:8.0f} tok/s   threads' answers {counts}",
                    flush=True,
                )
    print("\nmedian legitimate output tokens/s: "
          + ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in rates.items()))  # fmt: skip
    print(f"loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())

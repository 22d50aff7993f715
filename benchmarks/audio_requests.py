"""Audio in prompts: what clips cost the client and the server (TTFT against audio tokens).

1. The client's cost per clip: making and encoding one WAV clip of 5, 20 and 60 s (the work
   of the thread that makes clips ahead of the requests, beside the send loop), and
   serializing the request body (on the send loop), in ms (median).
2. Against the reference server (``--preset``, one request at a time): TTFT p50 of requests
   carrying 0, 1, 2 and 4 clips of 2.56 s (64 audio tokens at 25 per second), beside text-only
   requests of the same prompt length: audio tokens are prefilled like text, so the two
   columns should match.

    python3 benchmarks/audio_requests.py --preset tiny --repeats 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from loadlab.clients._bodies import build_body
from loadlab.clients._counting import post_json
from loadlab.clients._state import dumps
from loadlab.config import EndpointConfig
from loadlab.records import RequestSpec
from loadlab.workloads._audio import AudioMaker


def _median_ms(fn: Callable[[int], object], repeats: int) -> float:
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def client_part(repeats: int) -> None:
    print(f"\nclient cost per clip (ms, median of {repeats})")
    print(f"{'clip':>6}  {'make+encode':>11}  {'body JSON':>9}  {'body MB':>7}")
    ep = EndpointConfig("http://127.0.0.1:9", model="m")
    for seconds in (5, 20, 60):
        maker, rng = AudioMaker.of({"seconds": seconds}, seed=1), np.random.default_rng(1)
        make = _median_ms(lambda i, m=maker, r=rng: m._new(r, i), repeats)
        clip, frames = maker._new(rng, 0)
        spec = RequestSpec("r", "hi", 8, audio=(clip,), audio_s=(frames / 16000,))
        body = dumps(build_body(spec, ep, stream=True))
        ser = _median_ms(lambda i, s=spec: dumps(build_body(s, ep, stream=True)), repeats)
        print(f"{seconds:>5}s  {make:>11.2f}  {ser:>9.3f}  {len(body) / 1e6:>7.2f}")


def server_part(preset: str, repeats: int) -> None:
    from reference_server.launch import start_server

    maker = AudioMaker.of({"seconds": 2.56}, seed=3)  # 64 audio tokens each
    rng = np.random.default_rng(0)
    print(f"\nTTFT (ms, p50 of {repeats}) on the reference server, preset {preset}")
    print(f"{'clips':>5}  {'prompt tokens':>13}  {'with audio':>10}  {'text only':>9}")
    with start_server(mode="continuous", preset=preset) as srv:
        ep = EndpointConfig(srv.url, model="loadlab-ref")

        def ttft_ms(spec: RequestSpec) -> float:
            body = {**build_body(spec, ep, stream=False), "max_tokens": 1}
            t0 = time.perf_counter()  # max_tokens 1: the answer is the first token
            post_json(srv.url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
            return (time.perf_counter() - t0) * 1e3

        for n in (0, 1, 2, 4):
            tokens = 16 + 64 * n
            clips = [tuple(maker.draw(rng)[0][0] for _ in range(n)) for _ in range(repeats)]
            audio = [ttft_ms(RequestSpec("a", f"{i:04d} " + "x" * 11, 1, audio=clips[i]))
                     for i in range(repeats)]  # fmt: skip
            text = [ttft_ms(RequestSpec("t", f"{i:04d}-" + "y" * (tokens - 5), 1))
                    for i in range(repeats)]  # fmt: skip
            print(f"{n:>5}  {tokens:>13}  {statistics.median(audio):>10.1f}  "
                  f"{statistics.median(text):>9.1f}")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    client_part(args.repeats)
    server_part(args.preset, args.repeats)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Images in prompts: what they cost the server (TTFT against image tokens) and the client.

1. Against the reference server (``--preset``, one request at a time): TTFT p50 of requests
   carrying 0, 1, 2 and 4 new images of ``--side`` pixels square (224: 64 image tokens each),
   beside text-only requests of the same prompt length, and the wall time of each request's
   prefill step in the server's step log. Image tokens go through the same layers as text, so
   the prefill steps should nearly match (the images' add the patch embedding); TTFT with
   images also holds the server's decoding and resizing of each new image.
2. The client's cost per image request: drawing and encoding one image (512 x 512 and
   1000 x 1000, PNG and JPEG) and serializing the request body, per request, in ms. New images
   are drawn by a thread ahead of the requests that take them, so drawing is work beside the
   send loop; the body's serialization is on it.

    python3 benchmarks/image_requests.py --preset tiny --repeats 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from loadlab.clients._bodies import build_body
from loadlab.clients._counting import post_json
from loadlab.clients._state import dumps
from loadlab.config import EndpointConfig
from loadlab.records import RequestSpec
from loadlab.simulate._fit import read_step_log
from loadlab.workloads._images import ImageMaker, image_tokens


def _ttft_ms(url: str, body: dict) -> tuple[float, float]:
    """TTFT of one request and the wall time of its prefill step (the step log's last step)."""
    t0 = time.perf_counter()
    post_json(
        url + "/v1/chat/completions",
        {**body, "max_tokens": 1},
        {"Content-Type": "application/json"},
    )
    ttft_ms = (time.perf_counter() - t0) * 1e3  # max_tokens 1: the answer is the first token
    last = read_step_log(url)[-1]  # one request at a time: its prefill was the last step
    return ttft_ms, (last["end_ns"] - last["start_ns"]) / 1e6


def server_part(preset: str, repeats: int, side: int) -> None:
    from reference_server.launch import start_server

    maker = ImageMaker.of({"count": 1, "width": side, "height": side}, seed=3)
    rng = np.random.default_rng(0)
    print(f"\nTTFT (ms, p50 of {repeats}) on the reference server, preset {preset}")
    print(
        f"{'images':>6}  {'prompt tokens':>13}  {'with images':>11}  {'text only':>9}  "
        f"{'prefill step, images':>20}  {'text':>6}"
    )
    with start_server(mode="continuous", preset=preset) as srv:
        ep = EndpointConfig(srv.url, model="loadlab-ref")
        for n in (0, 1, 2, 4):
            img, txt = [], []
            for i in range(repeats):
                urls = tuple(maker.draw(rng)[0][0] for _ in range(n))
                tokens = 16 + n * image_tokens(side, side)
                text = f"{i:04d} " + "x" * 11  # 16 unique characters first: no cache hit
                spec = RequestSpec(f"r{i}", text, 1, images=urls)
                img.append(_ttft_ms(srv.url, build_body(spec, ep, stream=False)))
                # unique from the first block on, across levels too: no prefix-cache hit
                plain = RequestSpec(f"t{i}", f"{n}{i:03d}-" + "y" * (tokens - 5), 1)
                txt.append(_ttft_ms(srv.url, build_body(plain, ep, stream=False)))
            (ti, si), (tt, st) = (map(statistics.median, zip(*x, strict=True)) for x in (img, txt))
            print(f"{n:>6}  {tokens:>13}  {ti:>11.1f}  {tt:>9.1f}  {si:>20.1f}  {st:>6.1f}")


def client_part(repeats: int) -> None:
    print(f"\nclient cost per image request (ms, median of {repeats})")
    print(f"{'image':>14}  {'draw+encode':>11}  {'body JSON':>9}  {'body MB':>7}")
    ep = EndpointConfig("http://127.0.0.1:9", model="m")
    for side in (512, 1000):
        for fmt in ("png", "jpeg"):
            maker = ImageMaker.of({"count": 1, "width": side, "format": fmt}, seed=1)
            rng = np.random.default_rng(1)
            draw, ser, size = [], [], 0
            for i in range(repeats):
                t0 = time.perf_counter()
                url, size_px = maker._new(rng, i)  # the work the drawing thread does per image
                urls, sizes = (url,), (size_px,)
                t1 = time.perf_counter()
                body = dumps(
                    build_body(
                        RequestSpec(f"r{i}", "hi", 8, images=urls, image_sizes=sizes),
                        ep,
                        stream=True,
                    )
                )
                t2 = time.perf_counter()
                draw.append((t1 - t0) * 1e3)
                ser.append((t2 - t1) * 1e3)
                size = len(body)
            print(
                f"{side}x{side} {fmt:>4}  {statistics.median(draw):>11.2f}  {statistics.median(ser):>9.3f}  {size / 1e6:>7.2f}"
            )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--side", type=int, default=224, help="image side in pixels (224: 64 tokens)")
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    client_part(args.repeats)
    server_part(args.preset, args.repeats, args.side)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Prefix caching on the reference server: TTFT of requests sharing a long prefix, on and off.

Starts the server twice (``--prefix-caching on``, then ``off``), sends one warm-up request
with the shared prefix, then one request at a time (no queueing: TTFT is the prefill alone)
of ``prefix + a unique suffix``, streaming, and times the first content chunk. With caching
on, the prefix's full blocks come from the cache and only the suffix is prefilled::

    python3 benchmarks/prefix_caching.py                       # cpu preset, 1,024 + 64 tokens
    python3 benchmarks/prefix_caching.py --preset tiny --requests 5 --modes continuous,chunked

It also reads ``usage.prompt_tokens_details.cached_tokens`` from every response and the
server's ``/metrics`` (prefill tokens computed, prefix-cache queries and hits), and exits 1
unless, in every mode, TTFT p50 with caching on is at most ``--max-ratio`` (0.25) of off,
every cached request reports the whole prefix cached, and the greedy texts are identical.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from reference_server.launch import start_server

MODEL = "loadlab-ref"


@dataclass(frozen=True)
class Sample:
    ttft_ms: float
    cached_tokens: int
    text: str


@dataclass(frozen=True)
class Result:
    samples: list[Sample]
    prefill_tokens: int  # computed by the server for the measured requests
    queries: int
    hits: int

    @property
    def ttft_p50_ms(self) -> float:
        return statistics.median(s.ttft_ms for s in self.samples)


def _stream(url: str, prompt: str, max_tokens: int) -> Sample:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    req = urllib.request.Request(  # noqa: S310 (loopback URL we started)
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    sent = time.perf_counter()
    first, text, cached = 0.0, "", -1
    with urllib.request.urlopen(req, timeout=600) as resp:  # noqa: S310
        for line in resp:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                cached = event["usage"]["prompt_tokens_details"]["cached_tokens"]
            for choice in event.get("choices", []):
                if choice.get("text"):
                    first = first or time.perf_counter()
                    text += choice["text"]
    return Sample((first - sent) * 1e3, cached, text)


def _metrics(base: str) -> dict[str, float]:
    with urllib.request.urlopen(base + "/metrics", timeout=30) as resp:  # noqa: S310
        lines = resp.read().decode().splitlines()
    out = {}
    for line in lines:
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name.removeprefix("loadlab_server_")] = float(value)
    return out


def _measure(
    args: argparse.Namespace, mode: str, caching: str, prefix: str, suffixes: list[str]
) -> Result:
    extra = ["--prefix-caching", caching, "--max-model-len", "2048", "--kv-cache-mb", "256"]
    with start_server(mode=mode, preset=args.preset, extra_args=extra) as server:
        url = server.url + "/v1/completions"
        _stream(url, prefix + "warm-up", args.max_tokens)  # caches the prefix (when on)
        before = _metrics(server.url)
        samples = [_stream(url, prefix + suffix, args.max_tokens) for suffix in suffixes]
        after = _metrics(server.url)

    def delta(name: str) -> int:
        return int(after[name] - before[name])

    return Result(samples, delta('tokens_total{phase="prefill"}'),
                  delta("prefix_cache_queries_total"), delta("prefix_cache_hits_total"))  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", default="cpu")
    p.add_argument(
        "--modes", default="continuous", help="comma-separated: static,continuous,chunked"
    )
    p.add_argument("--prefix-tokens", type=int, default=1024)
    p.add_argument("--suffix-tokens", type=int, default=64)
    p.add_argument("--requests", type=int, default=20, help="measured requests per server")
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--max-ratio", type=float, default=0.25, help="acceptance: p50 on / p50 off")
    args = p.parse_args()
    prefix = ("You are a helpful assistant. " * (args.prefix_tokens // 29 + 1))[
        : args.prefix_tokens
    ]
    rng = random.Random(0)  # the same unique suffixes on and off: their texts must match
    letters = "abcdefghijklmnopqrstuvwxyz"
    suffixes = ["".join(rng.choice(letters) for _ in range(args.suffix_tokens))
                for _ in range(args.requests)]  # fmt: skip
    with open("/proc/loadavg") as f:
        print(f"load average before: {f.read().strip()}")
    print(f"preset {args.preset}, prefix {args.prefix_tokens} + suffix {args.suffix_tokens} "
          f"tokens, {args.requests} requests one at a time, max_tokens {args.max_tokens}")  # fmt: skip
    print(f"{'mode':<11} {'caching':<7} {'TTFT p50 ms':>11} {'min':>8} {'max':>8} "
          f"{'cached/req':>10} {'prefill tok':>11} {'hit rate':>8}")  # fmt: skip
    ok = True
    for mode in args.modes.split(","):
        results = {c: _measure(args, mode, c, prefix, suffixes) for c in ("on", "off")}
        for caching, r in results.items():
            ttfts = [s.ttft_ms for s in r.samples]
            cached = statistics.median(s.cached_tokens for s in r.samples)
            rate = r.hits / r.queries if r.queries else 0.0
            print(f"{mode:<11} {caching:<7} {r.ttft_p50_ms:>11.1f} {min(ttfts):>8.1f} "
                  f"{max(ttfts):>8.1f} {cached:>10.0f} {r.prefill_tokens:>11} {rate:>8.1%}")  # fmt: skip
        on, off = results["on"], results["off"]
        ratio = on.ttft_p50_ms / off.ttft_p50_ms
        whole = args.prefix_tokens // 16 * 16  # block size 16
        texts_equal = all(a.text == b.text for a, b in zip(on.samples, off.samples, strict=True))
        cached_ok = all(s.cached_tokens == whole for s in on.samples)
        cached_ok &= all(s.cached_tokens == 0 for s in off.samples)
        print(f"{mode}: p50 on / off = {ratio:.3f} (acceptance <= {args.max_ratio}); "
              f"cached tokens {'as expected' if cached_ok else 'WRONG'}; "
              f"texts {'identical' if texts_equal else 'DIFFER'} on and off")  # fmt: skip
        ok &= ratio <= args.max_ratio and cached_ok and texts_equal
    with open("/proc/loadavg") as f:
        print(f"load average after: {f.read().strip()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

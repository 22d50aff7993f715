"""CPU per token-carrying chunk of each dialect's sans-IO state: OpenAI chat vs Anthropic.

Feeds one realistic event per read (what a streaming server sends) to ``OpenAIStreamState``
and ``AnthropicStreamState`` and prints CPU microseconds per chunk, so the cost of the
Anthropic dialect can be read against the OpenAI one measured in the same run.

Usage::

    python3 benchmarks/dialect_overhead.py [--events 200000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import time

from loadlab.clients import AnthropicStreamState, OpenAIStreamState
from loadlab.clients.state import StreamState
from loadlab.records import RequestRecord

OPENAI = (
    b'data: {"id":"cmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}\n\n'
)
ANTHROPIC = (
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" tok"}}'
    b"\n\n"
)


def per_chunk_us(state: StreamState, chunk: bytes, n: int) -> float:
    state.on_headers(200, {"Content-Type": "text/event-stream"}, 0)
    c0 = time.process_time()
    for i in range(n):
        state.on_bytes(chunk, i)
    return (time.process_time() - c0) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=200_000, help="chunks per measurement")
    p.add_argument("--repeats", type=int, default=3, help="measurements per dialect (best kept)")
    args = p.parse_args()
    print(f"host CPUs: {os.cpu_count()}; load average: {os.getloadavg()}")
    best: dict[str, float] = {}
    for _ in range(args.repeats):  # alternate, so a burst of load hits both alike
        o = per_chunk_us(OpenAIStreamState(RequestRecord("r"), "chat"), OPENAI, args.events)
        a = per_chunk_us(AnthropicStreamState(RequestRecord("r")), ANTHROPIC, args.events)
        best["openai"] = min(best.get("openai", o), o)
        best["anthropic"] = min(best.get("anthropic", a), a)
    print(f"OpenAIStreamState.on_bytes     {best['openai']:6.2f} us/chunk")
    print(f"AnthropicStreamState.on_bytes  {best['anthropic']:6.2f} us/chunk")
    print(f"ratio anthropic/openai         {best['anthropic'] / best['openai']:6.2f}")


if __name__ == "__main__":
    main()

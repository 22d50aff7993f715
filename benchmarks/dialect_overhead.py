"""CPU per token-carrying chunk of each dialect's sans-IO state: OpenAI chat, Anthropic and
the Responses API, and the chat dialect's other chunks (reasoning, an escaped text that the
token frame's fast path leaves to the full way).

Feeds one realistic event per read (what a streaming server sends) to each dialect's state and
prints CPU microseconds per chunk, so each cost can be read against the OpenAI one measured in
the same run.

Usage::

    python3 benchmarks/dialect_overhead.py [--events 200000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import time

from loadlab.clients import AnthropicStreamState, OpenAIStreamState, ResponsesStreamState
from loadlab.clients._state import StreamState
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


# the full way (no token frame): a reasoning delta, and text with an escape in it
REASONING = OPENAI.replace(b'"content":" tok"', b'"reasoning_content":" tok"')
ESCAPED = OPENAI.replace(b'" tok"', b'" t\\"ok"')
# every Responses event has its own sequence_number: the frame never repeats (full way)
RESPONSES = [
    b"event: response.output_text.delta\n"
    b'data: {"type":"response.output_text.delta","sequence_number":%d,"item_id":"msg_1",'
    b'"output_index":0,"content_index":0,"delta":" tok","logprobs":[]}\n\n' % i
    for i in range(4096)
]


def per_chunk_us(state: StreamState, chunk: bytes | list[bytes], n: int) -> float:
    chunks = chunk if isinstance(chunk, list) else [chunk]
    k = len(chunks)
    state.on_headers(200, {"Content-Type": "text/event-stream"}, 0)
    c0 = time.process_time()
    for i in range(n):
        state.on_bytes(chunks[i % k], i)
    return (time.process_time() - c0) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=200_000, help="chunks per measurement")
    p.add_argument("--repeats", type=int, default=3, help="measurements per dialect (best kept)")
    args = p.parse_args()
    print(f"host CPUs: {os.cpu_count()}; load average: {os.getloadavg()}")
    cases = {
        "openai": lambda: (OpenAIStreamState(RequestRecord("r"), "chat"), OPENAI),
        "anthropic": lambda: (AnthropicStreamState(RequestRecord("r")), ANTHROPIC),
        "responses": lambda: (ResponsesStreamState(RequestRecord("r")), RESPONSES),
        "openai reasoning": lambda: (OpenAIStreamState(RequestRecord("r"), "chat"), REASONING),
        "openai escaped text": lambda: (OpenAIStreamState(RequestRecord("r"), "chat"), ESCAPED),
    }
    best: dict[str, float] = {}
    for _ in range(args.repeats):  # alternate, so a burst of load hits every case alike
        for name, make in cases.items():
            state, chunk = make()
            us = per_chunk_us(state, chunk, args.events)
            best[name] = min(best.get(name, us), us)
    for name, us in best.items():
        ratio = us / best["openai"]
        print(f"{name:22s} {us:6.2f} us/chunk   {ratio:5.2f}x openai")


if __name__ == "__main__":
    main()

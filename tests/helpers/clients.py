"""Shared helpers for the client tests (no fixtures: those stay in conftest files)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from loadlab.clients import AnthropicStreamState, OpenAIStreamState
from loadlab.clients._state import StreamState
from loadlab.clients._streaming import StreamingClient
from loadlab.config import EndpointConfig
from loadlab.records import RequestRecord, RequestSpec
from tests.helpers.loopback import FAULT_OUTCOMES

__all__ = [
    "CANARY",
    "Sink",
    "assert_faults_classified",
    "assert_matches_truth",
    "run_faults",
    "send_one",
    "sse_state",
]

CANARY = "sk-canary-7f3a9e1b2c4d"  # an API key that must never reach a record, log or file


class Sink:
    """Collects a response: its status, headers and body."""

    def __init__(self) -> None:
        self.status = 0
        self.headers: Mapping[str, str] = {}
        self.body = b""

    def on_headers(self, status: int, headers: Mapping[str, str], t_ns: int) -> None:
        self.status, self.headers = status, headers

    def on_bytes(self, data: bytes, t_ns: int) -> bool:
        self.body += data
        return False


async def send_one(
    client: type[StreamingClient], url: str, api: str, *, stream: bool = True,
    transport: str = "raw",
) -> RequestRecord:  # fmt: skip
    """One request through a fresh client of ``client``'s dialect, with short timeouts (the
    fault server's stall and drip end in 1 s and 2 s) and a 256 KiB event limit: the huge
    line then ends at its first piece, where reading the default 4 MiB of it against a
    0.6 s deadline came out ``timeout`` at load average 7. The deadlines were 0.3 and 0.6 s
    until a clean-clone CI run saw one of the thirteen faults sent at once come out
    ``timeout``; under a loaded machine a whole batch of them did (1 in 80 batches)."""
    ep = EndpointConfig(url, api=api)
    async with client(ep, stream=stream, timeout_s=2.0, read_timeout_s=1.0,
                      transport=transport, max_event_bytes=256 << 10) as c:  # fmt: skip
        return (await c.send(RequestSpec("f1", "hi", 3), t0_ns=time.perf_counter_ns())).record


def run_faults(
    client: type[StreamingClient], base: str, api: str, modes: Sequence[str], *,
    stream: bool = True, transport: str = "raw",
) -> dict[str, RequestRecord]:  # fmt: skip
    """Each fault mode of the fault server at ``base``, at once, through ``client``."""

    async def main() -> list[RequestRecord]:
        urls = [f"{base}/fault/{m}" for m in modes]
        sends = (send_one(client, u, api, stream=stream, transport=transport) for u in urls)
        return await asyncio.gather(*sends)

    return dict(zip(modes, asyncio.run(main()), strict=True))


def assert_faults_classified(records: Mapping[str, RequestRecord]) -> None:
    """What every dialect must make of the fault server's streaming faults: each its outcome
    class (``FAULT_OUTCOMES``), the error's words kept, tokens before a failure timed."""
    assert {m: r.outcome for m, r in records.items()} == FAULT_OUTCOMES
    assert records["429"].server["retry_after_s"] == 7.0
    assert "model overloaded" in (records["429"].error or "")
    assert "500 Internal Server Error" in (records["500_html"].error or "")
    assert records["stream_error"].error == "error in stream: model overloaded"
    assert len(records["reset"].chunk_ns) == 1  # tokens before the failure keep their times
    for r in records.values():
        assert r.sent_ns is not None and r.end_ns is not None


def sse_state(kind: str) -> StreamState:
    """A stream state of ``kind`` (``anthropic``, or an OpenAI kind: ``chat``, ``completions``)
    for a request sent at 1000 ns whose 200 event-stream headers came at 1100 ns."""
    record = RequestRecord("r")
    if kind == "anthropic":
        state: StreamState = AnthropicStreamState(record, t0_ns=1000)
    else:
        state = OpenAIStreamState(record, kind, t0_ns=1000)
    state.on_headers(200, {"Content-Type": "text/event-stream"}, 1100)
    return state


def assert_matches_truth(r: RequestRecord, truth: dict[str, Any], t0: int, chunks: int) -> None:
    """The record's times against the fixed server's log, on one clock: the client sent before
    the server received and read each chunk after the server wrote it."""
    assert len(r.chunk_ns) == len(truth["chunk_ns"]) == chunks
    assert r.sent_ns is not None and r.end_ns is not None
    assert r.sent_ns + t0 <= truth["recv_ns"]
    for mine, theirs in zip(r.chunk_ns, truth["chunk_ns"], strict=True):
        assert mine + t0 >= theirs
    assert r.chunk_ns[-1] <= r.end_ns
    assert not r.output_tokens_disagree

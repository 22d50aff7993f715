"""The client's hot path, held to a budget of work that a noisy machine cannot fool.

A recorded stream (made here, in the wire format servers send: OpenAI chat chunks with a usage
chunk, and an Anthropic Messages stream) is replayed in process through the real path of a
request: ``StreamingClient.send`` (record, stream state, body), the connection's
``data_received`` and parse queue, the HTTP reader, the stream state, the end of the exchange
(``settle``), the runner's bookkeeping (``Runner._record``) and the journal's line. No socket
and no event loop: ``ReplayTransport`` hands the reads to the connection the way the loop
does, so what is counted is loadlab's own work, not the kernel's or the scheduler's (nor
the loop's share of an exchange: its future, the read-timeout timer, the request's task).

Work is counted in two units that do not depend on the machine's speed or load: calls (Python
functions and built-ins, ``sys.setprofile``) and Python lines executed (``sys.settrace``).
Replaying the same stream with 64 and with 128 tokens gives the work of one more token chunk
(the difference over 64) and, from it, the work of a request apart from its chunks.

THE BUDGETS ARE A RATCHET. A change that adds work on the hot path fails here, and must raise
the budget in the same commit, saying in the commit message what the work buys. A change that
removes work should lower the budget, so that the next one cannot spend it unnoticed.
The per-chunk budgets sit half a unit above the count, so one call or one line more per chunk
fails; per request, about 3 % above.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from loadlab._runner.runner import Runner
from loadlab.clients import AnthropicClient, OpenAIClient
from loadlab.clients._http1 import Ended, ResponseReader, frame_request
from loadlab.clients._pool import _Conn, _Deferred
from loadlab.clients._state import StreamState
from loadlab.clients._streaming import StreamingClient
from loadlab.clients._transports import settle
from loadlab.config import EndpointConfig, RunConfig
from loadlab.journal import JournalWriter, _line
from loadlab.records import RequestSpec

# (calls, lines) per token chunk and per request, on the CPython these were counted with.
# Raise a budget only with a commit that says what the new work buys (module docstring).
BUDGETS: dict[tuple[int, int], dict[str, dict[str, float]]] = {
    (3, 11): {
        # one read per token chunk, the usual read of a stream that keeps up; counted
        # 14.64 calls and 33.52 lines a chunk, 384 calls and 1,274 lines a request
        "openai": {
            "chunk_calls": 15.1,
            "chunk_lines": 34.0,
            "request_calls": 396,
            "request_lines": 1313,
        },
        # counted 14.69 and 33.56 a chunk, 529 and 1,660 a request
        "anthropic": {
            "chunk_calls": 15.2,
            "chunk_lines": 34.1,
            "request_calls": 545,
            "request_lines": 1710,
        },
        # three token chunks a read: a stream read behind its server; counted 12.81 calls
        # and 25.73 lines a chunk, 387 and 1,356 a request
        "openai_behind": {
            "chunk_calls": 13.3,
            "chunk_lines": 26.2,
            "request_calls": 399,
            "request_lines": 1397,
        },
    }
}

# tokens as prose has them: words, punctuation, non-ASCII, a newline and a quote (escaped in
# JSON: both stay on the fast path, unescaped by the JSON parser)
_WORDS = [" The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ".",
          " Caf\u00e9", " na\u00efve", " 42", ",", " and", " then", ' "some"', "\n"]  # fmt: skip
_HEAD = (
    b"HTTP/1.1 200 OK\r\ndate: Mon, 30 Nov 2026 10:00:00 GMT\r\nserver: uvicorn\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
)


def _compact(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def openai_events(tokens: int) -> list[bytes]:
    """A chat stream as vLLM sends it: the role chunk, a chunk per token, the finish chunk,
    the usage chunk (``stream_options.include_usage``) and ``[DONE]``."""

    def event(choices: list[Any], **more: Any) -> bytes:
        obj = {"id": "chatcmpl-5e1f0c2a9b7d4e3f", "object": "chat.completion.chunk",
               "created": 1796032800, "model": "meta-llama/Llama-3.1-8B-Instruct",
               "choices": choices, **more}  # fmt: skip
        return b"data: " + _compact(obj) + b"\n\n"

    def choice(delta: dict[str, Any], finish: str | None = None) -> list[Any]:
        return [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]

    usage = {"prompt_tokens": 17, "total_tokens": 17 + tokens, "completion_tokens": tokens}
    return [
        event(choice({"role": "assistant", "content": ""})),
        *(event(choice({"content": _WORDS[i % len(_WORDS)]})) for i in range(tokens)),
        event(choice({}, "length")),
        event([], usage=usage),
        b"data: [DONE]\n\n",
    ]


def anthropic_events(tokens: int) -> list[bytes]:
    """A Messages stream as Anthropic's API sends it."""

    def event(kind: str, **body: Any) -> bytes:
        return b"event: " + kind.encode() + b"\ndata: " + _compact({"type": kind, **body}) + b"\n\n"

    message: dict[str, Any] = {"id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant",
               "content": [], "model": "claude-sonnet-4-5", "stop_reason": None,
               "stop_sequence": None, "usage": {"input_tokens": 17, "output_tokens": 1}}  # fmt: skip
    return [
        event("message_start", message=message),
        event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        event("ping"),
        *(
            event(
                "content_block_delta",
                index=0,
                delta={"type": "text_delta", "text": _WORDS[i % len(_WORDS)]},
            )
            for i in range(tokens)
        ),
        event("content_block_stop", index=0),
        event(
            "message_delta",
            delta={"stop_reason": "max_tokens", "stop_sequence": None},
            usage={"output_tokens": tokens},
        ),
        event("message_stop"),
    ]


def reads_of(events: list[bytes], per_read: int = 1) -> list[bytes]:
    """The reads of a chunked response carrying ``events``, one HTTP chunk each, with
    ``per_read`` of them in a read (the first read also holds the head and the first event)."""
    chunks = [b"%x\r\n%s\r\n" % (len(e), e) for e in events]
    chunks[-1] += b"0\r\n\r\n"
    first, rest = _HEAD + chunks[0], chunks[1:]
    return [first] + [b"".join(rest[i : i + per_read]) for i in range(0, len(rest), per_read)]


class _Loop:
    """What the parse queue needs of the event loop: ``call_soon`` (a built-in call, as
    uvloop's is); ``ReplayTransport`` runs what it queued after each read, as the loop runs
    it after the reads of its turn."""

    def __init__(self) -> None:
        self.ready: list[Callable[[], None]] = []
        self.call_soon = self.ready.append


class ReplayTransport:
    """The raw transport's exchange (``RawTransport.exchange`` with ``RawPool._exchange``),
    its socket replaced by recorded reads."""

    def __init__(self, reads: list[bytes]) -> None:
        self.reads = reads
        self.loop = _Loop()
        self.deferred = _Deferred(self.loop)  # type: ignore[arg-type]

    async def exchange(self, body: bytes, request_id: str, state: StreamState) -> None:
        frame_request(b"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\n", request_id, body)
        conn = _Conn(self.deferred)
        result = conn.start(state, Ended())
        result.sent_ns = 1_000
        ready = self.loop.ready
        for data in self.reads:
            conn.data_received(data)
            for callback in ready:
                callback()
            ready.clear()
        state.on_sent(result.sent_ns)
        settle(state, result)

    async def close(self) -> None:
        pass


@dataclass(frozen=True)
class Work:
    calls: int
    lines: int


def count(fn: Callable[[], object]) -> Work:
    """The calls and Python lines that ``fn`` makes loadlab (and the library code it calls)
    run. This file's own frames (the replay harness) and what they call directly are left
    out: a call counts when it is made from a frame outside this file, or into one."""
    calls = lines = 0
    here = __file__

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "call":  # frame: the callee; its caller is f_back
            caller = frame.f_back
            if frame.f_code.co_filename != here or (
                caller is not None and caller.f_code.co_filename != here
            ):
                calls += 1
        elif event == "c_call" and frame.f_code.co_filename != here:  # frame: the caller
            calls += 1

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal lines
        if event == "line" and frame.f_code.co_filename != here:
            lines += 1
        return trace

    previous = sys.gettrace()  # a coverage tool's tracer, put back after
    sys.setprofile(profile)
    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(previous)
        sys.setprofile(None)
    return Work(calls, lines)


def _run(coro: Any) -> Any:
    """Run a coroutine that never waits (the replay has no I/O) without an event loop."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the replayed send waited for something")


def request_work(kind: str, tokens: int, tmp: Path) -> Work:
    """The work of one request whose stream carries ``tokens`` token chunks, from ``send``
    to its journal line."""
    return count(replayer(kind, tokens, tmp))


def replayer(kind: str, tokens: int, tmp: Path) -> Callable[[], None]:
    """One request whose stream carries ``tokens`` token chunks, from ``send`` to its journal
    line, as a function that replays it (warmed up once: lazy imports, compiled patterns).
    ``benchmarks/hot_path_instructions.py`` counts its machine instructions."""
    per_read = 3 if kind.endswith("_behind") else 1
    api = "anthropic" if kind == "anthropic" else "chat"
    events = anthropic_events(tokens) if api == "anthropic" else openai_events(tokens)
    client: StreamingClient = (AnthropicClient if api == "anthropic" else OpenAIClient)(
        EndpointConfig("http://127.0.0.1:9", model="m", api=api)
    )
    client._transport = ReplayTransport(reads_of(events, per_read))
    journal = JournalWriter(tmp / "run.journal.jsonl")
    runner = Runner(RunConfig(concurrency=1, requests=1), [], client, journal=journal)
    spec = RequestSpec("q1", "Tell me about foxes.", tokens)

    def one() -> None:
        done = _run(client.send(spec, t0_ns=0))
        runner._record(done.record, spec, None)
        _line(done.record)
        assert done.record.outcome == "ok" and len(done.record.chunk_ns) == tokens
        assert done.text == "".join(_WORDS[i % len(_WORDS)] for i in range(tokens))

    one()  # warm: lazy imports, caches of compiled patterns
    return one


def per_chunk_and_request(kind: str, tmp: Path) -> dict[str, float]:
    """Work per token chunk (128 tokens minus 64, over 64) and per request (the rest)."""
    small, big = request_work(kind, 64, tmp), request_work(kind, 128, tmp)
    chunk_calls = (big.calls - small.calls) / 64
    chunk_lines = (big.lines - small.lines) / 64
    return {
        "chunk_calls": chunk_calls,
        "chunk_lines": chunk_lines,
        "request_calls": big.calls - 128 * chunk_calls,
        "request_lines": big.lines - 128 * chunk_lines,
    }


def over_budget(kind: str, work: dict[str, float]) -> list[str]:
    budget = BUDGETS[sys.version_info[:2]][kind]
    return [
        f"{kind} {unit}: {work[unit]:g} > budget {budget[unit]:g}"
        for unit in budget
        if work[unit] > budget[unit]
    ]


@pytest.fixture(autouse=True)
def _calibrated_interpreter() -> Iterator[None]:
    if sys.version_info[:2] not in BUDGETS:
        pytest.skip(
            f"hot-path budgets are counted on CPython {sorted(BUDGETS)}; count them on "
            f"{sys.version_info[:2]} (per_chunk_and_request) and add its row"
        )
    yield


@pytest.mark.parametrize("kind", ["openai", "anthropic", "openai_behind"])
def test_the_hot_path_stays_within_its_budget(kind: str, tmp_path: Path) -> None:
    work = per_chunk_and_request(kind, tmp_path)
    problems = over_budget(kind, work)
    assert not problems, (
        "more work on the client's hot path: " + "; ".join(problems) + ". If the work is "
        "needed, raise BUDGETS in tests/clients/test_hot_path_budget.py in the same commit and "
        "say why in its message; measured: " + json.dumps(work)
    )


def test_the_guard_fails_on_one_more_call_per_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard is not blind: a wrapper around the per-read parse, one Python call and one
    line more per token chunk, puts both counts over their budgets."""
    # compiled under a file name of its own: this file's lines are not counted
    code = "def wrapped(self, data, t_ns):\n    return original(self, data, t_ns)\n"
    namespace = {"original": ResponseReader.feed}
    exec(compile(code, "<one more call per chunk>", "exec"), namespace)  # noqa: S102
    monkeypatch.setattr(ResponseReader, "feed", namespace["wrapped"])
    problems = over_budget("openai", per_chunk_and_request("openai", tmp_path))
    assert any("chunk_calls" in p for p in problems), problems
    assert any("chunk_lines" in p for p in problems), problems

"""The trace writer's process: the lines it writes, a writer that falls behind, one that dies.

The proxy hands each finished request to ``python -m loadlab._record.tracer`` over a pipe; the
lines must be those the tracer writes when called in this process, a writer that falls behind
must cost trace lines (counted), never forwarding, and one that dies must leave the traffic
passing and the summary saying the trace is incomplete.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from loadlab._record.handoff import TraceChild, request_frame
from loadlab._record.proxy import RecordingProxy
from loadlab._record.stream import StreamWatch
from loadlab._record.tracer import Answered, Tracer, frames
from loadlab.errors import ConfigError
from loadlab.workloads._tokenizers import load_tokenizer
from tests.helpers.fault_server import FaultServer
from tests.helpers.loopback import ROOT, serve_in_thread
from tests.record.test_record import recording
from tests.record.test_relay import _in_loop

SALT = b"s" * 32
SYSTEM = {"role": "system", "content": "You answer briefly. " * 5}
TURN1 = [SYSTEM, {"role": "user", "content": "what is a block hash? " * 8}]
TURN2 = [
    *TURN1,
    {"role": "assistant", "content": "a keyed hash of a prefix " * 3},
    {"role": "user", "content": "and a salt?"},
]
TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
STEP = [
    *TURN2,
    {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "search", "arguments": '{"q": "salt"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "a secret mixed into the hash " * 4},
]
# (api, body, watched: None for an upstream that could not be reached, outcome, status)
REQUESTS: list[tuple[str, bytes, Answered | None, str, int]] = [
    ("chat", json.dumps({"model": "m", "stream": True, "messages": TURN1}).encode(),
     Answered(64, 3, 0, None, 12, False, [1_050_000, 1_060_000, 1_071_000]), "ok", 200),
    ("chat", json.dumps({"model": "m", "stream": True, "n": 2, "messages": TURN2}).encode(),
     Answered(90, 2, 64, None, 9, True, [2_040_000, 2_052_000]), "ok", 200),
    ("chat", json.dumps({"model": "m", "messages": STEP, "tools": TOOLS}).encode(),
     Answered(130, 5, 90, 2, 20, False, []), "ok", 200),
    ("anthropic", json.dumps({"model": "m", "max_tokens": 8, "messages": TURN1}).encode(),
     None, "upstream_error", 0),
    ("responses", json.dumps({"model": "m", "input": "hi " * 40}).encode(),
     Answered(None, None, None, None, 0, False, []), "http_429", 429),
    ("completions", b'{"model": "m", "prompt": ["a", 1, null]}',
     Answered(3, 1, None, None, 1, False, [5_000_000]), "stream_error", 200),
    ("chat", b'{"messages": "not a list"}', None, "ok", 200),  # an odd body
]  # fmt: skip


def _watch(answered: Answered | None) -> StreamWatch | None:
    if answered is None:
        return None
    watch = StreamWatch("chat", True)
    u = watch.usage
    u.prompt_tokens, u.output_tokens = answered.prompt_tokens, answered.output_tokens
    u.cached_tokens, u.reasoning_tokens = answered.cached_tokens, answered.reasoning_tokens
    watch.reply_chars, watch.called_tool = answered.reply_chars, answered.called_tool
    watch.token_times_ns = list(answered.token_times_ns)
    return watch


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.parametrize("tokenizer", [None, "byte"])
@_in_loop
async def test_the_child_writes_the_lines_the_tracer_writes_in_process(
    tmp_path: Path, tokenizer: str | None
) -> None:
    child = TraceChild(tmp_path / "t.jsonl", {"unit": "chars", "block": 16}, salt=SALT,
                       tokenizer=tokenizer)  # fmt: skip
    await child.start()
    tokenize = load_tokenizer(tokenizer).encode if tokenizer else None
    here, expected = Tracer(SALT, 16, tokenize), []
    for i, (api, body, answered, outcome, status) in enumerate(REQUESTS * 2):
        arrival, sent, end = 10**9 * i, 10**9 * i + 250_000, 10**9 * i + 9_000_000
        assert child.accepts()
        child.put(request_frame(api, body, arrival, sent, end, _watch(answered), outcome, status))
        line = here.line(api, json.loads(body), arrival, sent, end, answered, outcome, status)
        expected += [line] if line is not None else []
    await child.stop()
    header, *lines = _read(tmp_path / "t.jsonl")
    assert header == {"loadlab_trace": 2, "unit": "chars", "block": 16}
    assert lines == json.loads(json.dumps(expected))
    assert len(lines) == 14 and (child.written, child.lost, child.died) == (14, 0, "")
    assert [x["turn"] for x in lines[:3]] == [0, 1, 2]  # continuations found in the child
    assert lines[8]["continues"] == 7  # the latest request it repeats and adds to
    assert SALT.hex() not in (tmp_path / "t.jsonl").read_text()


@_in_loop
async def test_a_child_that_cannot_start_says_why(tmp_path: Path) -> None:
    child = TraceChild(tmp_path / "t.jsonl", {}, tokenizer=str(tmp_path / "no-such-tokenizer"))
    proxy = RecordingProxy("http://127.0.0.1:9", child)
    with pytest.raises(ConfigError, match=r"trace writer cannot start: .*no-such-tokenizer"):
        await proxy.start("127.0.0.1", 0)
    assert proxy._server is not None and not proxy._server.is_serving()
    assert not psutil.pid_exists(child.pid) and not child.died


async def _post_all(url: str, n: int) -> list[tuple[int, bytes]]:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as s:

        async def one() -> tuple[int, bytes]:
            async with s.post(url + "/v1/chat/completions", json=body) as r:
                return r.status, await r.read()

        return list(await asyncio.gather(*(one() for _ in range(n))))


@_in_loop
async def test_a_child_that_falls_behind_costs_trace_lines_not_forwarding(
    tmp_path: Path,
) -> None:
    for srv in serve_in_thread(FaultServer):
        direct = await _post_all(srv.url, 1)
        child = TraceChild(tmp_path / "t.jsonl", {"unit": "chars"}, max_pending=4)
        proxy = RecordingProxy(srv.url, child)
        port = await proxy.start("127.0.0.1", 0)
        os.kill(child.pid, signal.SIGSTOP)  # a writer that does not keep up at all
        try:
            via = await _post_all(f"http://127.0.0.1:{port}", 20)
        finally:
            os.kill(child.pid, signal.SIGCONT)
        await proxy.stop()
    assert via == direct * 20
    assert (child.written, child.dropped, child.lost, child.died) == (4, 16, 16, "")
    assert "16 dropped: the trace writer fell behind" in child.why()
    assert len(_read(tmp_path / "t.jsonl")) == 1 + 4


def _trace_writer_of_this_test() -> psutil.Process:
    found = [
        p
        for p in psutil.Process().children(recursive=True)
        if "loadlab._record.tracer" in " ".join(p.cmdline())
    ]
    assert len(found) == 1, found
    return found[0]


def test_a_child_that_dies_leaves_traffic_passing_and_the_trace_marked_incomplete(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "t.jsonl"
    for srv in serve_in_thread(FaultServer):
        with recording(srv.url, trace) as (url, logs):
            first = asyncio.run(_post_all(url, 3))
            for _ in range(200):  # their lines written before the writer is killed
                if len(_read(trace)) == 4:
                    break
                time.sleep(0.05)
            writer = _trace_writer_of_this_test()
            assert writer.nice() == 10  # the traffic comes first
            writer.kill()
            writer.wait(10)
            after = asyncio.run(_post_all(url, 5))
    assert [s for s, _ in first + after] == [200] * 8
    assert after[0][1] == first[0][1]
    err = logs[-1]
    assert err.count("the trace writer was killed by signal 9") == 2  # said once, and summed up
    assert "traffic still passes through" in err
    assert "recorded 3 request(s)" in err and "5 not traced" in err
    assert "the trace is incomplete" in err
    assert len(_read(trace)) == 1 + 3


@_in_loop
async def test_a_stop_signal_is_left_to_the_proxy_and_the_writer_ends_with_it(
    tmp_path: Path,
) -> None:
    for srv in serve_in_thread(FaultServer):
        child = TraceChild(tmp_path / "t.jsonl", {"unit": "chars"})
        proxy = RecordingProxy(srv.url, child)
        port = await proxy.start("127.0.0.1", 0)
        os.kill(child.pid, signal.SIGTERM)  # as a service manager stops the whole group
        os.kill(child.pid, signal.SIGINT)  # as a Ctrl-C does
        via = await _post_all(f"http://127.0.0.1:{port}", 3)
        await proxy.stop()
    assert [s for s, _ in via] == [200] * 3
    assert (child.written, child.lost, child.died) == (3, 0, "")
    assert not psutil.pid_exists(child.pid)  # ended and reaped at the proxy's stop


def test_the_writer_dies_with_a_proxy_that_is_killed(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadlab", "record", "--listen", "127.0.0.1:0",
         "--upstream", "http://127.0.0.1:9", "--out", str(tmp_path / "t.jsonl")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("recording: ")
        writer = _trace_writer_of_this_test()
    finally:
        proc.kill()
        proc.wait(10)
    writer.wait(10)  # psutil.TimeoutExpired if it outlived the proxy
    assert not writer.is_running()


def test_a_request_the_tracer_fails_on_is_left_out_and_the_next_traced(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def tokenize(text: str) -> list[int]:
        if "boom" in text:
            raise RuntimeError("a tokenizer's own error")
        return list(text.encode())

    tracer = Tracer(SALT, 16, tokenize)
    r, w = os.pipe()
    for messages in ([{"role": "user", "content": "boom"}], TURN1):
        body = json.dumps({"messages": messages}).encode()
        os.write(w, request_frame("chat", body, 1, 2, 3, None, "ok", 200))
    os.close(w)
    (batch,) = list(frames(r))  # both frames, read as the writer reads them
    os.close(r)
    lines = [tracer.safe_line(f) for f in batch]
    assert lines[0] is None and lines[1] is not None and lines[1]["id"] == 0
    assert "could not be traced (RuntimeError)" in capsys.readouterr().err

"""``loadlab record`` for real: a proxy process between loadlab and a server on loopback.

Recorded and replayed end to end (chat sessions and an agent) against the reference server;
no text, key or address in the trace; upstream errors, broken streams, an unreachable upstream
and a full disk passed through or counted, never a 5xx the upstream did not send.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from tests.helpers.fault_server import FaultServer
from tests.helpers.loopback import ROOT, free_port, serve_in_thread

CANARY = "CANARY-7f3a9c"


@contextmanager
def recording(upstream: str, out: Path, *extra: str) -> Iterator[tuple[str, list[str]]]:
    """``loadlab record`` in its own process; yields its URL and (after the block) its output."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadlab", "record", "--listen", "127.0.0.1:0",
         "--upstream", upstream, "--out", str(out), "--force", "--duration", "240", *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    logs: list[str] = []
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("recording: "), first + (proc.stderr.read() if proc.stderr else "")
        yield first.split()[1].rstrip(), logs
    finally:
        proc.send_signal(signal.SIGTERM)
        out_text, err_text = proc.communicate(timeout=30)
        logs += [first, out_text, err_text]


def _run(url: str, *args: str, out: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "loadlab", "run", "--endpoint", url, *args, "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


def _replay(trace: Path, url: str, out: Path) -> dict:
    n = len(trace.read_text().splitlines()) - 1
    scenario = out.with_suffix(".toml")
    scenario.write_text(
        f'rate_rps = 1\nrequests = {n}\n[workload]\nkind = "trace"\npath = "{trace}"\n'
    )
    return _run(url, "--scenario", str(scenario), out=out)


def _hit_rate(records: list[dict]) -> float:
    return sum(r["cached_prompt_tokens"] or 0 for r in records) / sum(
        r["prompt_tokens"] for r in records
    )


def _by_session(records: list[dict], *more: str) -> list[list[tuple[int, ...]]]:
    """Each session's (turn, prompt tokens, output tokens, ``more`` fields) in turn order,
    sessions in the order they began."""
    sessions: dict[str, list[dict]] = {}
    for r in sorted(records, key=lambda r: r["sent_ns"]):
        sessions.setdefault(r["session_id"], []).append(r)
    keys = ("turn", "prompt_tokens", "output_tokens", *more)
    return [sorted(tuple(r[k] for k in keys) for r in rs) for rs in sessions.values()]


def _first_turn_gaps_ms(records: list[dict]) -> np.ndarray:
    return np.diff(sorted(r["sent_ns"] for r in records if r["turn"] == 0)) / 1e6


CHAT = """rate_rps = 4\nrequests = 18\nseed = 5\n[workload]\nkind = "chat"\nsessions = 6
turns = 3\nthink_time_s = 0.2\nprompt_tokens = 64\noutput_tokens = 32\n"""
AGENT = """rate_rps = 4\nrequests = 16\nseed = 5\n[workload]\nkind = "agent"\nsessions = 4
tool_rounds = 3\ntools = ["search", "read_file"]\nprompt_tokens = 100\ntool_result_tokens = 50
output_tokens = 32\nthink_time_s = 0.1\n"""


def _record_and_replay(tmp_path: Path, scenario: str) -> tuple[dict, dict, Path]:
    from reference_server.launch import start_server

    (tmp_path / "s.toml").write_text(scenario)
    trace = tmp_path / "trace.jsonl"
    with start_server(mode="continuous", preset="tiny") as srv:
        with recording(srv.url, trace) as (url, _logs):
            recorded = _run(url, "--scenario", str(tmp_path / "s.toml"), out=tmp_path / "a.json")
    with start_server(mode="continuous", preset="tiny") as srv:  # a fresh server: a cold cache
        replayed = _replay(trace, srv.url, tmp_path / "b.json")
    return recorded, replayed, trace


@pytest.mark.slow
def test_chat_sessions_replay_as_recorded(tmp_path: Path) -> None:
    a, b, trace = _record_and_replay(tmp_path, CHAT)
    ra, rb = a["records"], b["records"]
    assert len(ra) == len(rb) == 18 and all(r["outcome"] == "ok" for r in ra + rb)
    by_turn = lambda rs: sorted((r["turn"], r["prompt_tokens"], r["output_tokens"]) for r in rs)  # noqa: E731
    assert by_turn(ra) == by_turn(rb)  # every length, in the server's count
    assert abs(_hit_rate(ra) - _hit_rate(rb)) <= 0.02
    # sessions start when the trace says (a loaded test machine: a loose bound; docs/record.md)
    gaps = np.abs(_first_turn_gaps_ms(ra) - _first_turn_gaps_ms(rb))
    assert np.percentile(gaps, 99) < 100
    lines = [json.loads(x) for x in trace.read_text().splitlines()[1:]]
    assert sorted(x["turn"] for x in lines) == [0] * 6 + [1] * 6 + [2] * 6
    assert all(x["think_ms"] is None or 150 < x["think_ms"] < 2000 for x in lines)


@pytest.mark.slow
def test_an_agent_replays_with_its_tool_rounds(tmp_path: Path) -> None:
    a, b, trace = _record_and_replay(tmp_path, AGENT)
    ra, rb = a["records"], b["records"]
    assert len(ra) == len(rb) and all(r["outcome"] == "ok" for r in ra + rb)
    lines = [json.loads(x) for x in trace.read_text().splitlines()[1:]]
    assert {x["new_kind"] for x in lines if x["turn"]} == {"tool"}
    assert any(x["turn"] == 2 for x in lines)  # sessions of three steps
    # every length equal in the server's count, each session's steps in order (the tool
    # results take up what the server's fresh tool-call arguments add or leave out)
    assert _by_session(ra) == _by_session(rb)
    # the sessions' first prompts begin alike ("agent-0000...") but share less than one of the
    # server's 16-token blocks: the replay shares no more, so the hit rates are equal, within
    # 2 points (sessions share nothing between them, each step follows the last one's answer:
    # the cached counts do not depend on timing)
    assert _hit_rate(ra) > 0.2
    assert abs(_hit_rate(ra) - _hit_rate(rb)) <= 0.02


def test_no_text_key_or_address_reaches_the_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    secrets = [CANARY, "sk-live-" + CANARY, "x-key-" + CANARY, "127.0.0.1"]

    async def send(url: str) -> None:
        headers = {"Authorization": f"Bearer sk-live-{CANARY}", "x-api-key": f"x-key-{CANARY}",
                   "X-Forwarded-For": "127.0.0.1", "Cookie": f"s={CANARY}"}  # fmt: skip
        body = {"model": "m", "stream": True, "user": CANARY,
                "messages": [{"role": "system", "content": f"secret {CANARY}"},
                             {"role": "user", "content": f"tell me {CANARY} " * 20}]}  # fmt: skip
        async with aiohttp.ClientSession() as s:
            for path in ("/v1/chat/completions", f"/v1/chat/completions?key={CANARY}"):
                async with s.post(url + path, json=body, headers=headers) as r:
                    assert r.status == 200
                    await r.read()

    for srv in serve_in_thread(FaultServer):
        with recording(srv.url, trace) as (url, logs):
            asyncio.run(send(url))
    text = trace.read_text() + "".join(logs)
    for secret in secrets:
        assert secret not in trace.read_text(), secret
    assert CANARY not in text
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert len(lines) == 3 and lines[1]["input_length"] is not None


def test_errors_pass_through_and_are_counted(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"

    async def send(url: str, mode: str) -> tuple[int, bytes]:
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        async with aiohttp.ClientSession() as s:
            try:
                async with s.post(f"{url}/fault/{mode}/v1/chat/completions", json=body) as r:
                    return r.status, await r.read()
            except aiohttp.ClientPayloadError:
                return -1, b""

    for srv in serve_in_thread(FaultServer):
        direct = {m: asyncio.run(send(srv.url, m)) for m in ("429", "500_html")}
        with recording(srv.url, trace) as (url, _logs):
            via = {
                m: asyncio.run(send(url, m)) for m in ("429", "500_html", "close", "stream_error")
            }
    assert via["429"] == direct["429"] and via["500_html"] == direct["500_html"]
    outcomes = [json.loads(x)["outcome"] for x in trace.read_text().splitlines()[1:]]
    assert sorted(outcomes) == sorted(["http_429", "http_500", "incomplete", "stream_error"])


def test_an_unreachable_upstream_is_502_and_a_full_disk_loses_lines_not_traffic(
    tmp_path: Path,
) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

    async def post(url: str) -> int:
        async with (
            aiohttp.ClientSession() as s,
            s.post(url + "/v1/chat/completions", json=body) as r,
        ):
            await r.read()
            return r.status

    with recording(f"http://127.0.0.1:{free_port()}", tmp_path / "t.jsonl") as (url, _logs):
        assert asyncio.run(post(url)) == 502
    line = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[1])
    assert line["outcome"] == "upstream_error"

    for srv in serve_in_thread(FaultServer):
        with recording(srv.url, Path("/dev/full")) as (url, logs):  # every write: ENOSPC
            assert [asyncio.run(post(url)) for _ in range(3)] == [200, 200, 200]
    assert "lost" in logs[-1] and "traffic still passes through" in logs[-1]


def test_every_api_streams_through_byte_for_byte_with_its_figures(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    chat = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    bodies = {
        "/v1/chat/completions": chat,
        "/v1/completions": {"model": "m", "stream": True, "prompt": "hi"},
        "/v1/messages": chat | {"max_tokens": 8},
        "/v1/responses": {"model": "m", "stream": True, "input": "hi"},
    }
    odd = chat | {"stream_options": "yes"}  # not an object: sent as it came, never rewritten

    async def send(url: str) -> list[bytes]:
        async with aiohttp.ClientSession() as s:
            out = []
            for path, body in [*bodies.items(), ("/v1/chat/completions", odd)]:
                async with s.post(url + path, json=body) as r:
                    assert r.status == 200
                    out.append(await r.read())
            return out

    for srv in serve_in_thread(FaultServer):
        direct = asyncio.run(send(srv.url))
        with recording(srv.url, trace) as (url, _logs):
            via = asyncio.run(send(url))
    assert via == direct
    lines = [json.loads(x) for x in trace.read_text().splitlines()[1:]]
    assert [x["api"] for x in lines] == ["chat", "completions", "anthropic", "responses", "chat"]
    assert [(x["chunks"], x["output_length"], x["reply_length"]) for x in lines] == [(3, 3, 12)] * 5

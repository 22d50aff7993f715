"""The fixed-schedule server: schedule, truth log, both APIs, reset, and its own process."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from loadlab.selftest._fixed_server import FixedScheduleServer, FixedServerProcess
from loadlab.selftest._http import Handoff, HTTPConnection, Request

CHAT = {"model": "m", "messages": [{"role": "user", "content": "a b c"}], "max_tokens": 4}


async def _post(session: aiohttp.ClientSession, url: str, body: dict, rid: str) -> bytes:
    async with session.post(url, json=body, headers={"X-Request-Id": rid}) as resp:
        assert resp.status == 200
        return await resp.read()


def test_stream_schedule_truth_and_usage() -> None:
    async def main() -> None:
        async with FixedScheduleServer(ttft_ms=30, itl_ms=10) as srv, aiohttp.ClientSession() as s:
            body = CHAT | {"stream": True, "stream_options": {"include_usage": True}}
            raw = await _post(s, srv.url + "/v1/chat/completions", body, "q1")
            events = [ln[6:] for ln in raw.decode().split("\n") if ln.startswith("data: ")]
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
            tokens = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
            assert len(tokens) == 4  # max_tokens, one token per chunk
            assert chunks[-1]["usage"] == {
                "prompt_tokens": 3,
                "completion_tokens": 4,
                "total_tokens": 7,
            }
            async with s.get(srv.url + "/truth") as resp:
                truth = await resp.json()
            t = truth["q1"]
            gaps = [
                b - a for a, b in zip([t["recv_ns"], *t["chunk_ns"]], t["chunk_ns"], strict=False)
            ]
            assert len(t["chunk_ns"]) == 4
            # the schedule is never early by more than the 0.2 ms tick slack
            assert gaps[0] >= 29.7e6
            assert t["chunk_ns"][-1] - t["recv_ns"] >= 59.7e6  # 30 + 3 x 10 ms
            async with s.post(srv.url + "/truth/reset") as resp:
                assert resp.status == 200
            async with s.get(srv.url + "/truth") as resp:
                assert await resp.json() == {}

    asyncio.run(main())


def test_streams_from_one_template_keep_their_own_id_and_usage() -> None:
    """The server builds a stream's bytes from a template shared by requests of one shape;
    the id (JSON-escaped) and the usage are each request's own."""

    async def stream(s: aiohttp.ClientSession, url: str, body: dict, rid: str) -> list[dict]:
        raw = await _post(s, url, body, rid)
        events = [ln[6:] for ln in raw.decode().split("\n") if ln.startswith("data: ")]
        assert events[-1] == "[DONE]"
        return [json.loads(e) for e in events[:-1]]

    async def main() -> None:
        async with FixedScheduleServer(ttft_ms=1, itl_ms=1) as srv, aiohttp.ClientSession() as s:
            url = srv.url + "/v1/completions"
            odd = 'q"\\</'  # a quote and a backslash: escaped in JSON
            for rid, prompt in (("a1", "one two"), (odd, "one two three four"), ("a3", "x")):
                body = {"prompt": prompt, "max_tokens": 3, "stream": True}
                chunks = await stream(
                    s, url, body | {"stream_options": {"include_usage": True}}, rid
                )
                assert {c["id"] for c in chunks} == {f"cmpl-{rid}"}
                assert [c["choices"][0]["text"] for c in chunks if c["choices"]] == [" tok"] * 3 + [
                    ""
                ]
                words = len(prompt.split())
                assert chunks[-1]["usage"] == {
                    "prompt_tokens": words,
                    "completion_tokens": 3,
                    "total_tokens": words + 3,
                }
                assert all(isinstance(c["created"], int) for c in chunks)
            no_usage = await stream(s, url, {"prompt": "x", "max_tokens": 2, "stream": True}, "b")
            assert all("usage" not in c for c in no_usage)
            assert len(srv.truth[odd]["chunk_ns"]) == 3

    asyncio.run(main())


def test_completions_non_stream_and_tokens_override() -> None:
    async def main() -> None:
        async with (
            FixedScheduleServer(ttft_ms=5, itl_ms=1, tokens=3) as srv,
            aiohttp.ClientSession() as s,
        ):
            body = {"model": "m", "prompt": "x", "max_tokens": 50}
            out = json.loads(await _post(s, srv.url + "/v1/completions", body, "n1"))
            assert out["choices"][0]["text"] == " tok" * 3
            assert out["choices"][0]["finish_reason"] == "stop"
            assert out["usage"]["completion_tokens"] == 3
            assert len(srv.truth["n1"]["chunk_ns"]) == 1

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_runs_as_its_own_process() -> None:
    async def main(url: str) -> None:
        async with aiohttp.ClientSession() as s:
            body = {"model": "m", "prompt": "x", "max_tokens": 2, "stream": True}
            raw = await _post(s, url + "/v1/completions", body, "p1")
            assert raw.endswith(b"data: [DONE]\n\n")

    with FixedServerProcess(ttft_ms=1, itl_ms=1) as url:
        assert url.startswith("http://127.0.0.1:")
        asyncio.run(main(url))


def test_requests_are_handled_a_slice_per_loop_turn_after_the_reads() -> None:
    # Three requests read in one turn: none is handled inside the read, and a handler slower
    # than the slice leaves the rest to later turns (the loop reads its sockets in between)
    handled: list[str] = []

    class SlowApp:
        def handle(self, conn: HTTPConnection, req: Request) -> None:
            handled.append(req.path)
            time.sleep(0.002)  # past the 0.2 ms slice

    async def go() -> None:
        handoff = Handoff(slice_ns=200_000)
        conn = HTTPConnection(SlowApp(), handoff)  # type: ignore[arg-type]
        for path in ("/a", "/b", "/c"):
            handoff.add(conn, Request("POST", path, {}, b"", time.perf_counter_ns()))
        assert handled == []
        await asyncio.sleep(0)
        assert handled == ["/a"]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert handled == ["/a", "/b", "/c"] and not handoff.items

    asyncio.run(go())

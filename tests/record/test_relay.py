"""The recording proxy's relay: HTTP/1.1 read and passed on as it came, on real sockets.

The reader and the chunk decoder on every split of their input; then the proxy in the test's
event loop between raw-socket clients and an upstream of the test's own (it counts its
connections, keeps what it was sent, and answers as a header asks): chunked framing passed
through byte for byte, kept-alive upstream connections, a client or an upstream that goes away
mid-stream, a client that does not read (the proxy stops reading the upstream), HTTP/1.0
clients, ``Expect: 100-continue``, pipelined requests and a kept-alive connection the upstream
closed.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from loadlab._record.handoff import TraceChild
from loadlab._record.proxy import RecordingProxy
from loadlab._record.relay import ChunkDecoder, HTTPError, RequestReader

BODY = json.dumps(
    {
        "model": "m",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hi"}],
    }
).encode()


def _in_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Runs an async test in the event loop ``loadlab record`` runs in (uvloop, where installed)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            import uvloop

            factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
        except ImportError:
            factory = None
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(asyncio.wait_for(test(*args, **kwargs), 60))

    return run


PLAIN = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _token(text: str) -> bytes:
    return _event({"id": "c", "choices": [{"index": 0, "delta": {"content": text}}]})


USAGE = _event({"id": "c", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}})


def _frame(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def test_the_chunk_decoder_reads_every_split_alike() -> None:
    body = _frame(b"hello") + b"3;ext=1\r\n wo\r\n" + _frame(b"rld!" * 40) + b"0\r\nX-T: 1\r\n\r\n"
    for cut in range(len(body) + 1):
        for cut2 in range(cut, len(body) + 1, 7):
            dec = ChunkDecoder()
            out = dec.feed(body[:cut]) + dec.feed(body[cut:cut2]) + dec.feed(body[cut2:])
            assert out == b"hello wo" + b"rld!" * 40 and dec.done, (cut, cut2)
    with pytest.raises(HTTPError):
        ChunkDecoder().feed(b"zz\r\nhello\r\n")


def test_the_request_reader_takes_requests_split_anywhere_and_pipelined() -> None:
    one = b"POST /v1/x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}"
    chunked = (
        b"POST /v1/y HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + _frame(b"{}") + b"0\r\n\r\n"
    )
    data = one + chunked + one
    for cut in range(len(data) + 1):
        reader, got = RequestReader(), []
        for part in (data[:cut], data[cut:]):
            req = reader.feed(part, 1)
            while req is not None:
                got.append((req.target, req.body))
                req = reader.next(1)
        assert got == [(b"/v1/x", b"{}"), (b"/v1/y", b"{}"), (b"/v1/x", b"{}")], cut
    for bad in (b"GARBAGE\r\n\r\n", b"POST / HTTP/1.1\r\nno colon\r\n\r\n",
                b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n"):  # fmt: skip
        with pytest.raises(HTTPError) as exc:
            RequestReader().feed(bad, 1)
        assert exc.value.status == 400


class Upstream:
    """An upstream of the test's own: each request's answer is chosen by its ``X-Answer``:
    ``stream`` (a chunked SSE stream), ``break`` (two tokens, then a close mid-body), ``slow``
    (a token every 20 ms, 200 of them), ``big`` (64 MiB of SSE as fast as the socket takes it),
    ``length`` (a JSON body with Content-Length), ``until_close`` (one that ends with the connection), ``stall`` (one token, then
    silence), ``silent`` (no answer). ``once`` closes the connection after one
    answer although it kept it alive."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed = asyncio.Event()  # a connection ended (the peer went away)
        self.big_sent = 0
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Upstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1]) for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )  # fmt: skip
                self.requests.append(head + await r.readexactly(length))
                path = head.split(b"X-Answer: ")[1].split(b"\r\n")[0]
                if not await self._answer(path, w):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed.set()
            w.close()

    async def _answer(self, path: bytes, w: asyncio.StreamWriter) -> bool:
        if path == b"silent":
            await asyncio.sleep(30)
            return False
        if path in (b"length", b"until_close"):
            body = b'{"usage": {"prompt_tokens": 4, "completion_tokens": 1}}'
            if path == b"until_close":
                w.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body)
                return False
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            return True
        w.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        if path == b"big":
            piece = _frame(_token("x" * 4000) * 16)
            while self.big_sent < 64 << 20:
                w.write(piece)
                self.big_sent += len(piece)
                await w.drain()
            return False
        n = {b"slow": 200, b"break": 2, b"stall": 1}.get(path, 3)
        for i in range(n):
            w.write(_frame(_token(f" t{i}")))
            await w.drain()
            await asyncio.sleep(0.02 if path == b"slow" else 0)
        if path == b"stall":
            await asyncio.sleep(30)
        if path in (b"break", b"stall"):
            return False
        w.write(_frame(USAGE) + _frame(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await w.drain()
        return path != b"once"


@asynccontextmanager
async def relay(
    tmp_path: Path, timeout_s: float = 600.0
) -> AsyncIterator[tuple[Upstream, RecordingProxy, int]]:
    async with Upstream() as up:
        tracer = TraceChild(tmp_path / "t.jsonl", {"unit": "chars"})
        proxy = RecordingProxy(up.url, tracer, timeout_s=timeout_s)
        port = await proxy.start("127.0.0.1", 0)
        try:
            yield up, proxy, port
        finally:
            await proxy.stop()


def _lines(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()[1:]]


def _request(answer: str, *, version: str = "1.1", extra: str = "", body: bytes = BODY) -> bytes:
    """A chat request whose answer the test's upstream chooses by ``answer``."""
    head = (
        f"POST /v1/chat/completions HTTP/{version}\r\nHost: x\r\nX-Answer: {answer}\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


async def _answer(r: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One answer's head and its body's bytes as they came (chunked framing included)."""
    head = await r.readuntil(b"\r\n\r\n")
    if b"content-length" in head.lower():
        n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        return head, await r.readexactly(n)
    return head, await r.readuntil(b"0\r\n\r\n")


@_in_loop
async def test_a_chunked_stream_passes_untouched_over_kept_alive_connections(
    tmp_path: Path,
) -> None:
    async with relay(tmp_path) as (up, _proxy, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        dr, dw = await asyncio.open_connection("127.0.0.1", int(up.url.rsplit(":", 1)[1]))
        for answer in ("stream", "length") * 2:
            body = PLAIN if answer == "length" else BODY
            auth = "Authorization: Bearer k\r\nConnection: keep-alive\r\n"
            w.write(_request(answer, extra=auth, body=body))
            dw.write(_request(answer, body=body))
            (head, via), (_, direct) = await _answer(r), await _answer(dr)
            assert via == direct and head.startswith(b"HTTP/1.1 200 OK\r\n")
        w.close()
        dw.close()
        assert up.connections == 2  # one for the proxy, kept alive; one for the direct client
    sent = next(x for x in up.requests if b"Authorization" in x)  # the proxy's, not direct
    assert sent.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"Authorization: Bearer k\r\n" in sent and b"keep-alive" not in sent.lower()
    lines = _lines(tmp_path)
    assert [(x["outcome"], x["chunks"], x["output_length"]) for x in lines] == [
        ("ok", 3, 3), ("ok", 0, 1), ("ok", 3, 3), ("ok", 0, 1)
    ]  # fmt: skip


@_in_loop
async def test_pipelined_requests_and_expect_continue_are_answered_in_turn(
    tmp_path: Path,
) -> None:
    async with relay(tmp_path) as (_up, _proxy, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(_request("stream") + _request("length", body=PLAIN))
        assert (await _answer(r))[1].endswith(b"0\r\n\r\n")
        assert b'"completion_tokens": 1' in (await _answer(r))[1]
        head = _request("stream", extra="Expect: 100-continue\r\n")
        w.write(head[: -len(BODY)])
        assert await r.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        w.write(BODY)
        assert (await _answer(r))[0].startswith(b"HTTP/1.1 200")
        w.close()
    assert len(_lines(tmp_path)) == 3


async def _until_close(tmp_path: Path, request: bytes) -> tuple[bytes, bytes]:
    """Sends one request through a proxy; the head and body the client got before the proxy
    closed the connection."""
    async with relay(tmp_path) as (_up, _proxy, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(request)
        head, _, body = (await asyncio.wait_for(r.read(), 10)).partition(b"\r\n\r\n")
        w.close()
    return head, body


@_in_loop
async def test_an_http10_client_gets_the_body_decoded_and_the_connection_closed(
    tmp_path: Path,
) -> None:
    head, body = await _until_close(tmp_path, _request("stream", version="1.0"))
    assert b"chunked" not in head.lower() and b"Connection: close" in head
    assert body == b"".join(_token(f" t{i}") for i in range(3)) + USAGE + b"data: [DONE]\n\n"
    assert _lines(tmp_path)[0]["chunks"] == 3


@_in_loop
async def test_an_upstream_that_breaks_off_closes_the_client_at_the_same_byte(
    tmp_path: Path,
) -> None:
    _, body = await _until_close(tmp_path, _request("break"))
    assert body.endswith(_frame(_token(" t1")))  # no last chunk: the client sees the break
    assert [(x["outcome"], x["chunks"]) for x in _lines(tmp_path)] == [("incomplete", 2)]


@_in_loop
async def test_an_answer_that_ends_with_its_connection_ends_the_clients(tmp_path: Path) -> None:
    head, body = await _until_close(tmp_path, _request("until_close", body=PLAIN))
    assert b"Connection: close" in head and body.endswith(b'"completion_tokens": 1}}')
    assert [(x["outcome"], x["output_length"]) for x in _lines(tmp_path)] == [("ok", 1)]


@_in_loop
async def test_a_client_that_leaves_mid_stream_ends_the_upstream_stream(tmp_path: Path) -> None:
    async with relay(tmp_path) as (up, _proxy, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(_request("slow"))
        await r.readuntil(b"t2")
        w.transport.abort()
        await asyncio.wait_for(up.closed.wait(), 10)  # well before its 200 tokens
    [line] = _lines(tmp_path)
    assert line["outcome"] == "client_disconnect" and 3 <= line["chunks"] < 100


@_in_loop
async def test_a_client_that_does_not_read_stops_the_proxy_reading_the_upstream(
    tmp_path: Path,
) -> None:
    async with relay(tmp_path) as (up, proxy, port):
        r, w = await asyncio.open_connection("127.0.0.1", port, limit=1 << 16)
        w.transport.set_write_buffer_limits(0)
        w.write(_request("big"))
        await r.readuntil(b"data:")
        r._transport.pause_reading()  # type: ignore[attr-defined]
        await asyncio.sleep(1.0)
        held = sum(c.transport.get_write_buffer_size() for c in proxy.clients)
        assert up.big_sent < 32 << 20  # the upstream is held back by the socket it writes to
        assert held < 4 << 20  # the proxy keeps little of what it could not pass on yet
        r._transport.resume_reading()  # type: ignore[attr-defined]
        got = 0
        while chunk := await asyncio.wait_for(r.read(1 << 20), 20):
            got += len(chunk)
        assert up.big_sent >= 64 << 20
        w.close()


@_in_loop
async def test_a_kept_alive_connection_the_upstream_closed_is_not_a_502(tmp_path: Path) -> None:
    async with relay(tmp_path) as (up, _proxy, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        for answer in ("once", "stream"):
            w.write(_request(answer))
            head, _ = await _answer(r)
            assert head.startswith(b"HTTP/1.1 200"), head
        w.close()
        assert up.connections == 2
    assert [x["outcome"] for x in _lines(tmp_path)] == ["ok", "ok"]


@_in_loop
async def test_an_upstream_silent_past_the_timeout_is_a_502_or_an_incomplete_stream(
    tmp_path: Path,
) -> None:
    async with relay(tmp_path, timeout_s=0.4) as (_up, _proxy, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(_request("silent"))
        head, body = await asyncio.wait_for(_answer(r), 10)
        assert head.startswith(b"HTTP/1.1 502") and b"upstream_error" in body
        w.write(_request("stall"))  # the same connection: a 502 keeps it
        data = await asyncio.wait_for(r.read(), 10)
        assert data.endswith(_frame(_token(" t0")))
        w.close()
    assert [x["outcome"] for x in _lines(tmp_path)] == ["upstream_error", "incomplete"]


@_in_loop
async def test_a_client_that_connects_gets_an_upstream_connection_before_its_request(
    tmp_path: Path,
) -> None:
    async with relay(tmp_path) as (up, _proxy, port):
        clients = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        for _ in range(100):
            if up.connections == 3:
                break
            await asyncio.sleep(0.05)
        assert up.connections == 3 and not up.requests  # opened ahead, one per client
        for r, w in clients:
            w.write(_request("stream"))
            assert (await _answer(r))[0].startswith(b"HTTP/1.1 200")
            w.close()
        assert up.connections == 3  # the requests went over them


@_in_loop
async def test_a_request_is_read_at_the_next_upstream_read_not_after_the_loops_other_reads(
    tmp_path: Path,
) -> None:
    # The lookout: a connection between requests is polled at every upstream read, so a
    # request that comes in during a burst of token reads goes upstream inside that burst.
    async with relay(tmp_path) as (up, proxy, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(200):
            if proxy.watched:
                break
            await asyncio.sleep(0.01)
        (client,) = proxy.watched.values()
        for answer in ("stream", "length"):
            w.write(_request(answer, body=BODY if answer == "stream" else PLAIN))
            assert client.busy is None  # the loop has not read it (this test holds the loop)
            proxy.look()  # what every upstream read does
            assert client.busy is not None and client.fd not in proxy.watched  # read, sent on
            head, _ = await _answer(r)
            assert head.startswith(b"HTTP/1.1 200 OK")
            assert proxy.watched == {client.fd: client}  # idle again: watched again
        w.close()
        for _ in range(200):
            if not proxy.clients:
                break
            await asyncio.sleep(0.01)
        assert not proxy.watched  # a closed connection is not watched
    assert len(up.requests) == 2  # each request once: the loop's own read found nothing more
    assert [x["outcome"] for x in _lines(tmp_path)] == ["ok", "ok"]

"""A fixed-schedule OpenAI-compatible streaming server that logs when it wrote every chunk.

The ground truth of ``loadlab selftest``: each request's first token is due ``ttft_ms`` after
the request arrived and each next one ``itl_ms`` later (``due_k = recv + ttft + k * itl``, so
lateness never accumulates). What counts as truth is not this schedule but the
``perf_counter_ns`` taken immediately before each chunk is handed to the socket
(``transport.write``, which sends at once when the socket buffer has room, as it does for a
client that keeps up). Before, not after: so truth never postdates the bytes, even when the
reader runs (another process on the other core, or a thread taking the GIL) before ``write``
returns. ``perf_counter_ns`` is ``CLOCK_MONOTONIC`` on Linux, so the server's and the load
generator's times compare directly across processes on one machine.

Speed: one timer serves every stream (a heap of due times; each tick writes every chunk that is
due within ``_SLACK_NS``) and each chunk is a prebuilt byte string, so a chunk costs a heap
operation and one ``send`` (the last token's shares its ``send`` with the stream's end). A
request's chunks come from per-second templates, not from encoding JSON. Serves ``/v1/chat/completions`` and ``/v1/completions``, streaming
or not, with a usage chunk when ``stream_options.include_usage`` is set; each token chunk
carries exactly one token (``" tok"``), and a chat stream starts with a role-only chunk (as
real servers do; it is not a token). ``prompt_tokens`` in usage counts whitespace-separated
words of the prompt (a stand-in; this server has no tokenizer).

It also speaks the Anthropic Messages API on ``/v1/messages`` with the same schedule and
truth: ``message_start`` (``usage.input_tokens``), ``content_block_start`` and a ``ping``
before the first token, one ``content_block_delta`` (``text_delta`` ``" tok"``) per token,
then ``content_block_stop``, ``message_delta`` (``stop_reason``, ``usage.output_tokens``) and
``message_stop``; or one Message JSON when not streaming.

A request's ``recv_ns`` is taken first thing in the read that completed it, and requests are
handled a slice at a time after the loop's reads (``loadlab.selftest._http.Handoff``), so a burst
of big requests is not stamped behind the handling of the ones before it.

Truth, keyed by the request's ``X-Request-Id`` header (else ``r<n>`` from a counter)::

    GET  /truth        {"<request_id>": {"recv_ns": int, "chunk_ns": [int, ...]}, ...}
    POST /truth/reset  clears it

Usage::

    python3 -m loadlab.selftest._fixed_server --port 8100 --ttft-ms 100 --itl-ms 20 [--tokens 64]

    async with FixedScheduleServer(ttft_ms=100, itl_ms=20) as srv:
        ...  # send requests to srv.url; srv.truth holds the write times

    with FixedServerProcess(ttft_ms=50, itl_ms=5, tokens=128) as url:
        ...  # the server in its own process (what the self-test uses: one core each)
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import itertools
import os
import signal
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from loadlab.selftest._http import (
    Handoff,
    HTTPConnection,
    Request,
    chunk_frame,
    json_bytes,
    parse_json_body,
)

__all__ = ["FixedScheduleServer", "FixedServerProcess", "main"]

_SLACK_NS = 200_000  # write chunks due within 0.2 ms now: timers are not finer than that
# Ticks are at least this far apart, so under load one wake-up writes many chunks (a wake-up
# per chunk would cost more than the chunk); a chunk is then at most this late vs schedule.
_MIN_TICK_NS = int(os.environ.get("LOADLAB_FIXED_TICK_NS", "1000000"))
_DONE = b"data: [DONE]\n\n"
_RID = b"@@loadlab-request-id@@"  # placeholders in the stream templates (_stream_bytes)
_USAGE = b"@@loadlab-usage@@"


@dataclass(slots=True)
class _Stream:
    conn: HTTPConnection
    frame: bytes  # one token chunk, HTTP-framed; identical for every token of the stream
    tail: bytes  # finish chunk, usage chunk, [DONE], terminating chunk
    chunk_ns: list[int]
    first_due_ns: int
    itl_ns: int
    tokens: int
    sent: int = 0
    body: bytes = b""  # non-streaming: the whole response, written once when due
    extra: dict[str, Any] = field(default_factory=dict)


class FixedScheduleServer:
    """The server on the running event loop; ``async with`` starts and stops it."""

    def __init__(
        self,
        *,
        ttft_ms: float,
        itl_ms: float,
        tokens: int | None = None,
        port: int = 0,
        host: str = "127.0.0.1",
        model: str = "loadlab-fixed",
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if ttft_ms < 0 or itl_ms < 0:
            raise ValueError("--ttft-ms and --itl-ms must be >= 0")
        if tokens is not None and tokens < 1:
            raise ValueError(f"--tokens must be >= 1 (or omitted to use max_tokens), got {tokens}")
        self.ttft_ns = int(ttft_ms * 1e6)
        self.itl_ns = int(itl_ms * 1e6)
        self.tokens = tokens
        self.port = port
        self.host = host  # 127.0.0.1 unless a test serves a network namespace it made
        self.model = model
        self.ssl_context = ssl_context  # serve https (tests of the client's TLS path)
        self.truth: dict[str, dict[str, Any]] = {}
        self._heap: list[tuple[int, int, _Stream]] = []
        self._templates: dict[tuple[bool, str, bool], tuple[int, bytes, bytes, bytes]] = {}
        self._seq = itertools.count()
        self._ids = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = 0
        self._server: asyncio.Server | None = None
        self._conns: set[HTTPConnection] = set()
        self._handoff = Handoff()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.url = ""

    async def __aenter__(self) -> FixedScheduleServer:
        self._loop = asyncio.get_running_loop()
        self._server = await self._loop.create_server(
            self._connection, self.host, self.port, backlog=1024, ssl=self.ssl_context
        )
        self.port = self._server.sockets[0].getsockname()[1]
        scheme = "https" if self.ssl_context else "http"
        self.url = f"{scheme}://{self.host}:{self.port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._server is not None:
            self._server.close()
            for conn in list(self._conns):  # kept-alive clients would hold wait_closed (3.12+)
                conn.close()
            await self._server.wait_closed()

    # ------------------------------------------------------------------ HTTP

    def handle(self, conn: HTTPConnection, req: Request) -> None:
        if req.path == "/truth" and req.method == "GET":
            conn.respond(200, json_bytes(self.truth))
        elif req.path == "/truth/reset" and req.method == "POST":
            self.truth.clear()
            conn.respond(200, b'{"ok":true}')
        elif req.path == "/health":
            conn.respond(200, b'{"ok":true}')
        elif req.path in ("/v1/chat/completions", "/v1/completions") and req.method == "POST":
            self._completion(conn, req, chat=req.path == "/v1/chat/completions")
        elif req.path == "/v1/messages" and req.method == "POST":
            self._completion(conn, req, chat=True, anthropic=True)
        else:
            conn.respond(404, json_bytes({"error": {"message": f"no route {req.path}"}}))

    def _connection(self) -> HTTPConnection:
        conn = HTTPConnection(self, self._handoff)  # arrivals stamped before any handling
        self._conns.add(conn)
        return conn

    def connection_lost(self, conn: HTTPConnection) -> None:
        self._conns.discard(conn)  # its stream, if any, is skipped when it comes due

    def _completion(
        self, conn: HTTPConnection, req: Request, *, chat: bool, anthropic: bool = False
    ) -> None:
        body = parse_json_body(req)
        if body is None:
            conn.respond(400, json_bytes({"error": {"message": "body must be a JSON object"}}))
            return
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 16
        n = int(self.tokens or max_tokens)
        rid = req.headers.get("x-request-id") or f"r{next(self._ids)}"
        chunk_ns: list[int] = []
        self.truth[rid] = {"recv_ns": req.recv_ns, "chunk_ns": chunk_ns}
        if chat:
            words = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        else:
            words = len(str(body.get("prompt", "")).split())
        usage = {"prompt_tokens": words, "completion_tokens": n, "total_tokens": words + n}
        finish = "length" if n >= int(max_tokens) else "stop"
        first_due = req.recv_ns + self.ttft_ns
        if anthropic:
            usage = {"input_tokens": words, "output_tokens": n}
            stop = "max_tokens" if finish == "length" else "end_turn"
            if body.get("stream"):
                frame, tail, start = _messages_stream(rid, self.model, stop, usage)
                conn.start_stream(first=start)
                st = _Stream(conn, frame, tail, chunk_ns, first_due, self.itl_ns, n)
            else:
                st = _Stream(conn, b"", b"", chunk_ns, first_due + (n - 1) * self.itl_ns, 0, n)
                st.body = json_bytes(_message(rid, self.model, " tok" * n, stop, usage))
        elif body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            frame, tail, role = self._stream_bytes(
                rid, chat, finish, usage if include_usage else None
            )
            conn.start_stream(first=role)
            st = _Stream(conn, frame, tail, chunk_ns, first_due, self.itl_ns, n)
        else:
            st = _Stream(conn, b"", b"", chunk_ns, first_due + (n - 1) * self.itl_ns, 0, n)
            st.body = self._full_body(rid, chat, n, finish, usage)
        self._push(st.first_due_ns, st)

    def _stream_bytes(
        self, rid: str, chat: bool, finish: str, usage: dict[str, int] | None
    ) -> tuple[bytes, bytes, bytes]:
        """(one token chunk, HTTP-framed; the tail after the last token, framed and
        terminated; the role event). Built from templates made once per second and shape
        (encoding four JSON events per request was half this server's cost per request);
        only the id and the usage differ between requests."""
        created = int(time.time())
        key = (chat, finish, usage is not None)
        tpl = self._templates.get(key)
        if tpl is None or tpl[0] != created:
            tpl = (created, *self._stream_events(chat, finish, usage is not None, created))
            self._templates[key] = tpl
        rid_json = json_bytes(rid)[1:-1]  # the id's JSON string body, escapes and all
        token, tail, role = (t.replace(_RID, rid_json) for t in tpl[1:])
        if usage is not None:
            tail = tail.replace(_USAGE, json_bytes(usage))
        return chunk_frame(token), chunk_frame(tail + _DONE) + b"0\r\n\r\n", role

    def _stream_events(
        self, chat: bool, finish: str, with_usage: bool, created: int
    ) -> tuple[bytes, bytes, bytes]:
        """The events of ``_stream_bytes`` with placeholders for the id and the usage."""
        head: dict[str, Any] = {
            "id": "cmpl-" + _RID.decode(),
            "object": "chat.completion.chunk" if chat else "text_completion",
        }
        head |= {"created": created, "model": self.model}

        def event(choices: list[dict[str, Any]], **more: Any) -> bytes:
            return b"data: " + json_bytes(head | {"choices": choices} | more) + b"\n\n"

        def choice(text: str | None, fin: str | None) -> dict[str, Any]:
            if chat:
                delta = {} if text is None else {"content": text}
                return {"index": 0, "delta": delta, "finish_reason": fin}
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": fin}

        tail = event([choice(None, finish)])
        if with_usage:
            tail += event([], usage=_USAGE.decode()).replace(b'"' + _USAGE + b'"', _USAGE)
        role = event([{"index": 0, "delta": {"role": "assistant", "content": ""}}]) if chat else b""
        return event([choice(" tok", None)]), tail, role

    def _full_body(self, rid: str, chat: bool, n: int, finish: str, usage: dict[str, int]) -> bytes:
        text = " tok" * n
        if chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
        choice["finish_reason"] = finish
        obj = "chat.completion" if chat else "text_completion"
        return json_bytes(
            {"id": f"cmpl-{rid}", "object": obj, "created": int(time.time()), "model": self.model}
            | {"choices": [choice], "usage": usage}
        )

    # ------------------------------------------------------------------ the one timer

    def _push(self, due_ns: int, st: _Stream) -> None:
        heapq.heappush(self._heap, (due_ns, next(self._seq), st))
        if self._timer is None or due_ns < self._timer_due:
            self._arm(due_ns)

    def _arm(self, due_ns: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_due = due_ns
        delay_s = max(0.0, (due_ns - time.perf_counter_ns()) / 1e9)
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._tick)

    def _tick(self) -> None:
        self._timer = None
        heap, pop, clock = self._heap, heapq.heappop, time.perf_counter_ns
        horizon = clock() + _SLACK_NS
        again: list[_Stream] = []  # at most one chunk per stream per tick, even when late
        while heap and heap[0][0] <= horizon:
            _, _, st = pop(heap)
            conn = st.conn
            if conn.closed:
                continue
            if st.body:  # non-streaming: the whole answer at once
                st.chunk_ns.append(clock())
                conn.respond(200, st.body)
                continue
            st.sent += 1
            if st.sent >= st.tokens:  # the last token and the end of the stream: one write
                data = st.frame + st.tail
                st.chunk_ns.append(clock())
                conn.transport.write(data)  # type: ignore[union-attr]
                conn.finish()
            else:
                st.chunk_ns.append(clock())
                conn.transport.write(st.frame)  # type: ignore[union-attr]
                again.append(st)
        for st in again:
            heapq.heappush(heap, (st.first_due_ns + st.sent * st.itl_ns, next(self._seq), st))
        if heap:
            self._arm(max(heap[0][0], horizon - _SLACK_NS + _MIN_TICK_NS))


def _message(rid: str, model: str, text: str, stop: str | None, usage: dict[str, int]) -> Any:
    """An Anthropic Message object (the non-streaming answer, and message_start's payload)."""
    return {
        "id": f"msg_{rid}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}] if text else [],
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }


def _messages_stream(
    rid: str, model: str, stop: str, usage: dict[str, int]
) -> tuple[bytes, bytes, bytes]:
    """(one token frame, HTTP-framed; the tail after the last token, framed and terminated;
    the events before the first token) of an Anthropic Messages stream."""

    def event(kind: str, **obj: Any) -> bytes:
        return b"event: %s\ndata: %s\n\n" % (kind.encode(), json_bytes({"type": kind} | obj))

    start_usage = {"input_tokens": usage["input_tokens"], "output_tokens": 1}
    start = event("message_start", message=_message(rid, model, "", None, start_usage))
    start += event("content_block_start", index=0, content_block={"type": "text", "text": ""})
    start += event("ping")
    delta = {"type": "text_delta", "text": " tok"}
    frame = chunk_frame(event("content_block_delta", index=0, delta=delta))
    tail = event("content_block_stop", index=0)
    tail += event(
        "message_delta",
        delta={"stop_reason": stop, "stop_sequence": None},
        usage={"output_tokens": usage["output_tokens"]},
    )
    tail += event("message_stop")
    return frame, chunk_frame(tail) + b"0\r\n\r\n", start


class FixedServerProcess:
    """The server in a child process (``with ... as url``); stopped on exit.

    Reads the URL the child prints when ready; raises ``RuntimeError`` if it does not start
    within ``start_timeout_s``.
    """

    def __init__(
        self,
        *,
        ttft_ms: float,
        itl_ms: float,
        tokens: int | None = None,
        host: str = "127.0.0.1",
        start_timeout_s: float = 20.0,
    ) -> None:
        self.args = ["--port", "0", "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms)]
        self.args += ["--host", host]
        if tokens is not None:
            self.args += ["--tokens", str(tokens)]
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def __enter__(self) -> str:
        cmd = [sys.executable, "-m", "loadlab.selftest._fixed_server", *self.args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)  # noqa: S603
        if self.proc.stdout is None:
            raise RuntimeError("no stdout pipe from the fixed server process")
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith("http://"):
                self.url = line.strip()
                return self.url
            if not line and self.proc.poll() is not None:
                break
        self.__exit__()
        raise RuntimeError(f"fixed server did not start: {' '.join(cmd)}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


async def _serve(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with FixedScheduleServer(
        ttft_ms=args.ttft_ms,
        itl_ms=args.itl_ms,
        tokens=args.tokens,
        port=args.port,
        host=args.host,
    ) as srv:
        print(srv.url, flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m loadlab.selftest", description=__doc__.split("\n")[0]
    )
    p.add_argument("--port", type=int, default=0, help="TCP port (0: a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--ttft-ms", type=float, default=100.0, help="request arrival to first token")
    p.add_argument("--itl-ms", type=float, default=20.0, help="gap between tokens")
    p.add_argument(
        "--tokens", type=int, default=None, help="tokens per answer (default: max_tokens)"
    )
    args = p.parse_args(argv)
    try:
        FixedScheduleServer(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, tokens=args.tokens)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop  # optional: a faster event loop when installed
    except ImportError:
        asyncio.run(_serve(args))
    else:
        uvloop.run(_serve(args))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

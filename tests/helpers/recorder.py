"""A loopback OpenAI chat server that keeps every request body, for tests that compare what two
ways of running a load actually sent.

It counts a prompt's tokens one of two ways:

    bytes   as the reference server does (one token per UTF-8 byte of the messages' contents
            joined by "\\n"), and says so in ``/v1/server_info``: ``tokenizer = "auto"`` then
            sizes prompts locally, asking nothing more
    words   whitespace-separated words plus 3 for the template: nothing like one character
            per token, so a prompt sized for another count misses; with ``tokenize`` it answers
            ``/tokenize`` (vLLM's shape), else ``auto`` has to calibrate

Each answer streams ``max_tokens`` one-token chunks (``" tok"``), then a usage chunk and
``[DONE]``, at once (or one JSON answer when not streamed).

Usage::

    for srv in serve_in_thread(RecordingServer):   # tests.helpers.loopback
        ...  # srv.url; srv.bodies: every chat request body received, in order
"""

from __future__ import annotations

import json
from typing import Any

from loadlab.selftest._http import HTTPConnection, Request, chunk_frame, json_bytes, parse_json_body
from tests.helpers.fault_server import FaultServer

__all__ = ["RecordingServer"]


def _event(obj: dict[str, Any]) -> bytes:
    return chunk_frame(b"data: " + json.dumps(obj).encode() + b"\n\n")


class RecordingServer(FaultServer):
    """``async with RecordingServer() as srv``: serves on 127.0.0.1 until the block ends (the
    fault server's life cycle, this module's answers)."""

    def __init__(self, count: str = "bytes", tokenize: bool = True) -> None:
        super().__init__()
        self.count, self.tokenize = count, tokenize
        self.bodies: list[dict[str, Any]] = []

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        """A request's prompt tokens as this server counts them."""
        if "messages" in body:
            texts = [str(m.get("content") or "") for m in body["messages"]]
        else:
            texts = [str(body.get("prompt", ""))]
        if self.count == "bytes":
            return len("\n".join(texts).encode())
        return sum(len(t.split()) for t in texts) + 3

    def handle(self, conn: HTTPConnection, req: Request) -> None:
        if req.path == "/v1/server_info" and self.count == "bytes":
            conn.respond(200, json_bytes({"tokenizer": "byte"}))
        elif req.path == "/tokenize" and self.tokenize and req.method == "POST":
            body = parse_json_body(req) or {}
            conn.respond(200, json_bytes({"count": self.prompt_tokens(body)}))
        elif req.path == "/v1/chat/completions" and req.method == "POST":
            body = parse_json_body(req)
            if body is None or not isinstance(body.get("messages"), list):
                conn.respond(400, json_bytes({"error": {"message": "messages must be a list"}}))
                return
            self.bodies.append(body)
            self._answer(conn, body)
        else:
            conn.respond(404, json_bytes({"error": {"message": f"no route {req.path}"}}))

    def _answer(self, conn: HTTPConnection, body: dict[str, Any]) -> None:
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        prompt = self.prompt_tokens(body)
        usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
        if not body.get("stream"):
            msg = {"role": "assistant", "content": " tok" * n}
            choice = {"index": 0, "message": msg, "finish_reason": "length"}
            conn.respond(200, json_bytes({"id": "r", "choices": [choice], "usage": usage}))
            return

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {"id": "r", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        conn.start_stream()
        parts = [_event(chunk({"role": "assistant"}))]
        parts += [_event(chunk({"content": " tok"})) for _ in range(n)]
        parts += [_event(chunk({}, "length")), _event({"id": "r", "choices": [], "usage": usage})]
        conn.write(b"".join(parts) + chunk_frame(b"data: [DONE]\n\n"))
        conn.end_stream()

"""A tiny in-process client for the runner's unit tests: it implements the Client protocol,
sleeps a fixed TTFT and ITL, and records what it was asked (history, concurrency)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Unpack

from loadlab.clients._base import Completion, SendOptions
from loadlab.records import OUTCOME_OK, RequestRecord, RequestSpec


class FakeClient:
    def __init__(
        self,
        ttft_s: float = 0.01,
        itl_s: float = 0.002,
        tokens: int = 3,
        fail_ids: frozenset[str] = frozenset(),
    ) -> None:
        self.ttft_s = ttft_s
        self.itl_s = itl_s
        self.tokens = tokens
        self.fail_ids = fail_ids
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls: list[dict[str, Any]] = []

    async def __aenter__(self) -> FakeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def send(self, spec: RequestSpec, **options: Unpack[SendOptions]) -> Completion:
        t0_ns, history = options["t0_ns"], options.get("history", ())
        intended_ns = options.get("intended_ns")
        rec = RequestRecord(
            request_id=spec.request_id,
            session_id=spec.session_id,
            turn=spec.turn,
            max_tokens=spec.max_tokens,
            intended_ns=intended_ns,
        )
        rec.sent_ns = time.perf_counter_ns() - t0_ns
        self.calls.append({"id": spec.request_id, "history": list(history), "sent_ns": rec.sent_ns})
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.ttft_s)
            if spec.request_id in self.fail_ids:
                rec.outcome = "http_500"
                rec.http_status = 500
                return Completion(rec)
            for i in range(self.tokens):
                if i:
                    await asyncio.sleep(self.itl_s)
                rec.chunk_ns.append(time.perf_counter_ns() - t0_ns)
            rec.end_ns = rec.chunk_ns[-1]
            rec.outcome = OUTCOME_OK
            rec.output_tokens = self.tokens
            rec.output_tokens_source = "chunks"
            rec.output_tokens_chunks = self.tokens
            return Completion(rec, text=f"answer to {spec.request_id}")
        finally:
            self.in_flight -= 1

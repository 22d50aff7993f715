"""Shared helpers for the client tests (no fixtures: those stay in conftest files)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loadlab.records import RequestRecord

__all__ = ["CANARY", "Sink", "assert_matches_truth"]

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

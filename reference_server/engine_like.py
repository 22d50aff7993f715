"""What the HTTP layer needs of an engine: ``EngineLike``, implemented by ``engine.Engine``
(one scheduler, one model runner) and ``disagg.router.DisaggregatedEngine`` (worker pools).

``api.create_app`` takes any ``EngineLike`` and never asks which mode runs. Both engines hand
``TokenEvent``s back to the caller's asyncio loop; ``gauges`` is read on each ``/metrics``
scrape, never on the per-step path.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from reference_server.metrics import ServerStats
from reference_server.sequence import Sequence

__all__ = ["EngineGauges", "EngineLike", "EventQueue", "TokenEvent"]


@dataclass(frozen=True)
class TokenEvent:
    """What one step produced for one request: a text delta for one new token, and at the
    end a ``finish_reason`` (``length``, ``stop``, ``abort`` or ``error``)."""

    text: str
    completion_tokens: int  # total generated so far
    finish_reason: str | None = None
    error: str | None = None
    kv_transfer: dict[str, Any] | None = None  # disaggregated mode: {"bytes", "seconds"}
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (usage's cached_tokens)


# A request's events; the API's disconnect watcher may also put None (the client went away).
EventQueue = asyncio.Queue[TokenEvent | None]


@dataclass(frozen=True)
class EngineGauges:
    """The engine's side of ``/metrics`` at one moment (the API adds requests in flight)."""

    queue_depth: int  # requests without a running slot yet
    running_requests: int
    batch_slots: int  # rows the forward pass runs (static mode: finished members included)
    kv_blocks_used: int
    kv_blocks_total: int
    preemptions_total: int
    kv_blocks_cached: int = 0  # blocks holding a cached prefix (0: no prefix caching)
    prefix_cache_queries_total: int = 0  # prompt tokens of admitted requests
    prefix_cache_hits_total: int = 0  # of which served from the prefix cache


class EngineLike(Protocol):
    """An engine behind the API: thread-safe ``submit``/``abort``, ``start``/``stop`` from
    the app's lifespan, and what ``/metrics`` and admission read."""

    stats: ServerStats

    @property
    def max_num_seqs(self) -> int:
        """The largest running batch (admission lets ``max_num_seqs + max_queue`` in)."""
        ...

    @property
    def queue_depth(self) -> int: ...

    def submit(self, seq: Sequence, loop: asyncio.AbstractEventLoop, queue: EventQueue) -> None:
        """Queue ``seq``; its ``TokenEvent``s arrive on ``queue`` via ``loop``."""
        ...

    def abort(self, seq_id: str) -> None:
        """Drop a request wherever it is and free its KV blocks (no further events)."""
        ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def gauges(self) -> EngineGauges: ...

    def extra_metrics(self) -> list[str]:
        """Prometheus lines of this engine's own (e.g. per-pool blocks, KV transfers)."""
        ...

"""Scheduling policies behind one interface (``Scheduler``); ``make_scheduler`` picks by name."""

from __future__ import annotations

from typing import Any

from reference_server.kv_cache import BlockManager
from reference_server.scheduler.base import Scheduler
from reference_server.scheduler.chunked import ChunkedScheduler
from reference_server.scheduler.continuous import ContinuousScheduler
from reference_server.scheduler.static import StaticScheduler

__all__ = [
    "MODES",
    "ChunkedScheduler",
    "ContinuousScheduler",
    "Scheduler",
    "StaticScheduler",
    "make_scheduler",
]

MODES: dict[str, type[Scheduler]] = {
    "static": StaticScheduler,
    "continuous": ContinuousScheduler,
    "chunked": ChunkedScheduler,
}


def make_scheduler(mode: str, block_manager: BlockManager, **kwargs: Any) -> Scheduler:
    """``make_scheduler("continuous", bm, max_num_seqs=32)``; ``chunk_size`` only for chunked,
    ``finished_slots`` only for static (other modes drop them)."""
    try:
        cls = MODES[mode]
    except KeyError:
        raise ValueError(f"unknown mode {mode!r}; choose one of {sorted(MODES)}") from None
    if cls is not ChunkedScheduler:
        kwargs.pop("chunk_size", None)
    if cls is not StaticScheduler:
        kwargs.pop("finished_slots", None)
    return cls(block_manager, **kwargs)

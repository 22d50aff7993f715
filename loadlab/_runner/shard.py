"""``--shard K/N`` and ``--start-at``: this machine's part of a run spread over several.

The shard keeps units ``K, K+N, K+2N, ...`` of the run's stream (requests, or whole chat
sessions and agent loops; after the ``requests`` cut), as ``--workers`` deals them over one
machine's processes, so the N shards together are the one-machine schedule. Its zero time is
``start_at`` mapped onto this machine's monotonic clock, so every shard's intended times count
from the same wall-clock instant (as good as the machines' clock agreement).

``extra["shard"]`` in the results file: index, count, the run's identity (every setting that
shapes the schedule, hashed, with ``start_at``), the host, and how far ahead of ``start_at`` it was
ready to send (``loadlab._analysis.shards`` merges by it).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import socket
import time
from collections.abc import Iterable, Iterator
from typing import Any

from loadlab._runner.runner import group_units
from loadlab.config import RunConfig
from loadlab.errors import ConfigError
from loadlab.records import RequestSpec
from loadlab.workloads._base import RequestStream

__all__ = [
    "MAX_START_WAIT_S",
    "partition",
    "run_id",
    "shard_extra",
    "shard_specs",
    "start_ns",
    "wait_for_start",
]

MAX_START_WAIT_S = 24 * 3600.0
# settings that do not change the schedule: where output goes, what is printed, which shard
_NOT_SCHEDULE = {"shard", "out", "progress", "slo", "scrape", "scrape_interval_s", "pricing",
                 "gpu_metrics", "gpu_interval_s", "gpu_baseline_s", "redact_headers"}  # fmt: skip


def run_id(cfg: RunConfig) -> str:
    """The identity every shard of one run shares (12 hex digits)."""
    data = {k: v for k, v in cfg.to_dict().items() if k not in _NOT_SCHEDULE}
    text = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def shard_specs(cfg: RunConfig, specs: Iterable[RequestSpec]) -> Iterable[RequestSpec]:
    """This shard's units of ``specs`` (``specs`` itself without ``--shard``); a workload's
    stream stays one, so what the workload did still reaches the results file."""
    if cfg.shard is None:
        return specs
    k, n = cfg.shard
    part = partition(specs, n, k, cfg.requests)
    return RequestStream(part, specs.extra) if isinstance(specs, RequestStream) else part


def partition(
    specs: Iterable[RequestSpec], n: int, index: int, requests: int | None = None
) -> Iterator[RequestSpec]:
    """Part ``index`` of ``n`` of the stream (units round-robin; chat sessions stay whole)."""
    if requests is not None:
        specs = itertools.islice(specs, requests)
    for i, unit in enumerate(group_units(specs)):
        if i % n == index:
            yield from unit


def wait_for_start(cfg: RunConfig, lead_s: float = 0.5) -> float | None:
    """Sleep until ``lead_s`` before ``start_at``; refuse a start long past or too far ahead.
    Returns how far ahead of ``start_at`` this process was ready (ms; negative: late)."""
    if cfg.start_at is None:
        return None
    ahead = cfg.start_at - time.time()
    if ahead < -1.0:
        raise ConfigError(
            f"--start-at was {-ahead:.1f} s ago; give a time ahead of every shard's start"
        )
    if ahead > MAX_START_WAIT_S:
        raise ConfigError(f"--start-at is {ahead / 3600:.1f} h ahead; at most 24 h")
    if ahead > lead_s:
        time.sleep(ahead - lead_s)
    return round((cfg.start_at - time.time()) * 1e3, 3)


def start_ns(cfg: RunConfig, default_delay_ns: int) -> int:
    """The run's zero on this machine's ``perf_counter_ns`` clock: ``start_at`` mapped onto it
    (read back to back, the two clocks' offset is known to a few microseconds), else now plus
    ``default_delay_ns``."""
    if cfg.start_at is None:
        return time.perf_counter_ns() + default_delay_ns
    wall, mono = time.time_ns(), time.perf_counter_ns()
    return mono + int(cfg.start_at * 1e9) - wall


def shard_extra(cfg: RunConfig, ready_ms: float | None) -> dict[str, Any]:
    """The results file's ``extra["shard"]`` (see the module docstring)."""
    k, n = cfg.shard if cfg.shard is not None else (0, 1)
    return {"index": k, "count": n, "run_id": run_id(cfg), "host": socket.gethostname(),
            "start_at": cfg.start_at, "ready_before_start_ms": ready_ms}  # fmt: skip

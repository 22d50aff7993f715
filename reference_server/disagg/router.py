"""The ``disaggregated`` mode: prefill and decode worker pools behind the engine's interface.

``DisaggregatedEngine`` is an ``EngineLike`` (``engine_like.py``), as ``Engine`` is, so the
API never asks which mode runs. Requests go to a prefill worker (least loaded), their first
token comes back, the KV is pulled by a decode worker over ``torch.distributed`` (see
``worker.py`` for the protocol and rank layout, ``messages.py`` for the messages), and the
decode worker's tokens come back here. Each transfer's bytes and seconds go to ``/metrics`` and to the request's final
event (``TokenEvent.kv_transfer``), which the API puts in the response body, split into the
part the prefill worker served from its prefix cache and the part it computed for the request
(``cached_*`` / ``computed_*``, bytes and blocks). The prefill pool's prefix-cache counters are
summed into the gauges, so ``/metrics`` reads as in the other modes.

Compute split: each pool is pinned to its own CPUs (``--prefill-cpus``/``--decode-cpus``;
default: the first half of this process's CPUs for prefill, the rest for decode, e.g. core 0
and core 1 on a 2-core machine; the API process stays unpinned). On a CPU the prefill workers
also run at nice +10 (``--prefill-nice``): the API process and a local load generator share
their cores, and their token delivery must not queue behind a long prefill. On GPUs every rank gets its
own device when there are enough (NCCL), else all share ``cuda:0`` through gloo.

Usage::

    loadlab-server --mode disaggregated --preset cpu --prefill-workers 1 --decode-workers 1
"""

from __future__ import annotations

import asyncio
import atexit
import bisect
import logging
import multiprocessing as mp
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reference_server.config import ServerConfig
from reference_server.disagg.messages import (
    Abort,
    Add,
    Crashed,
    Failed,
    Lost,
    Offer,
    Ready,
    State,
    Step,
    StepToken,
    Stop,
    ToRouter,
    Transfer,
    Up,
)
from reference_server.engine import TextStream
from reference_server.engine_like import EngineGauges, EventQueue, TokenEvent
from reference_server.launch import free_port
from reference_server.metrics import PREFIX, ServerStats
from reference_server.sequence import Sequence

if TYPE_CHECKING:  # the worker module imports torch; the router imports it when it starts workers
    from reference_server.disagg.worker import WorkerConfig

__all__ = [
    "DisaggregatedEngine",
    "TransferStats",
    "build_app",
    "parse_cpus",
    "split_cpus",
    "transfer_split",
]

log = logging.getLogger("reference_server.disagg.router")

TRANSFER_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def parse_cpus(text: str) -> tuple[int, ...]:
    """``"0"``, ``"0,2"`` or ``"0-3"`` -> CPU ids."""
    cpus: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"bad CPU list {text!r}: write e.g. 0 or 0,2 or 0-3")
        cpus += range(int(lo), int(hi or lo) + 1)
    return tuple(sorted(set(cpus)))


def split_cpus(available: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Default split: the first half (rounded up) for prefill, the rest for decode; with one
    CPU both pools share it. ``(0, 1)`` -> ``((0,), (1,))``."""
    if len(available) < 2:
        return available, available
    half = (len(available) + 1) // 2
    return available[:half], available[half:]


def transfer_split(nbytes: int, num_tokens: int, cached_tokens: int, block_size: int) -> dict[str, int]:  # fmt: skip
    """What a transfer of ``num_tokens`` tokens' KV (``nbytes``) moved from the prefill cache
    and what it moved that was computed for the request, in bytes and blocks. Every token's KV
    has the same size, so the bytes split as the tokens; cached tokens are whole blocks.

    >>> transfer_split(1000, 10, 4, 4)
    {'cached_bytes': 400, 'computed_bytes': 600, 'cached_blocks': 1, 'computed_blocks': 2}
    """
    cached_bytes = nbytes * cached_tokens // num_tokens if num_tokens else 0
    cached_blocks = cached_tokens // block_size
    return {"cached_bytes": cached_bytes, "computed_bytes": nbytes - cached_bytes,
            "cached_blocks": cached_blocks,
            "computed_blocks": -(-num_tokens // block_size) - cached_blocks}  # fmt: skip


class TransferStats:
    """KV transfer counters (bytes and blocks, cached and computed apart) and a per-transfer
    seconds histogram (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes_total = 0
        self.seconds_total = 0.0
        self.count = 0
        self.split = dict.fromkeys(("cached_bytes", "computed_bytes", "cached_blocks",
                                    "computed_blocks"), 0)  # fmt: skip
        self._buckets = [0] * (len(TRANSFER_BUCKETS_S) + 1)

    def record(self, nbytes: int, seconds: float, split: dict[str, int] | None = None) -> None:
        with self._lock:
            self.bytes_total += nbytes
            self.seconds_total += seconds
            self.count += 1
            self._buckets[bisect.bisect_left(TRANSFER_BUCKETS_S, seconds)] += 1
            for key, n in (split or {}).items():
                self.split[key] += n

    def render(self) -> list[str]:
        with self._lock:
            lines = [
                f"# TYPE {PREFIX}kv_transfer_bytes_total counter",
                f"{PREFIX}kv_transfer_bytes_total {self.bytes_total}",
                f"# TYPE {PREFIX}kv_transfer_seconds_total counter",
                f"{PREFIX}kv_transfer_seconds_total {self.seconds_total!r}",
                f"# TYPE {PREFIX}kv_transfers_total counter",
                f"{PREFIX}kv_transfers_total {self.count}",
            ]
            for key, n in self.split.items():  # kv_transfer_cached_bytes_total, ...
                lines += [f"# TYPE {PREFIX}kv_transfer_{key}_total counter",
                          f"{PREFIX}kv_transfer_{key}_total {n}"]  # fmt: skip
            lines += [
                f"# TYPE {PREFIX}kv_transfer_seconds histogram",
            ]
            cumulative = 0
            for bound, n in zip((*TRANSFER_BUCKETS_S, float("inf")), self._buckets, strict=True):
                cumulative += n
                le = "+Inf" if bound == float("inf") else repr(bound)
                lines.append(f'{PREFIX}kv_transfer_seconds_bucket{{le="{le}"}} {cumulative}')
            lines.append(f"{PREFIX}kv_transfer_seconds_sum {self.seconds_total!r}")
            lines.append(f"{PREFIX}kv_transfer_seconds_count {self.count}")
        return lines


@dataclass
class _Req:
    seq: Sequence
    loop: asyncio.AbstractEventLoop
    queue: EventQueue
    text: TextStream
    prefill_rank: int
    decode_rank: int | None = None
    phase: str = "prefill"  # prefill -> offered -> decode
    tokens: list[int] = field(default_factory=list)
    kv_transfer: dict[str, Any] = field(default_factory=lambda: {"bytes": 0, "seconds": 0.0})
    cached_tokens: int = 0  # prompt tokens the prefill worker served from its prefix cache


class DisaggregatedEngine:
    """Starts the worker processes, routes requests and tokens; see the module docstring."""

    def __init__(self, configs: list[WorkerConfig], *, max_num_seqs: int, stats: ServerStats | None = None) -> None:  # fmt: skip
        from reference_server.disagg.worker import worker_main

        self.stats = stats or ServerStats()
        self.transfers = TransferStats()
        self.num_prefill = sum(1 for c in configs if c.role == "prefill")
        self.configs = configs
        ctx = mp.get_context("forkserver")  # workers fork from a clean process with torch loaded
        ctx.set_forkserver_preload(["reference_server.disagg.worker"])
        self.outbox: Any = ctx.Queue()
        self.inboxes: list[Any] = [ctx.Queue() for _ in configs]
        pre, dec = self.inboxes[: self.num_prefill], self.inboxes[self.num_prefill :]
        self.procs = [
            ctx.Process(
                target=worker_main,
                name=f"{c.role}-{c.rank}",
                daemon=True,
                args=(c, self.inboxes[c.rank], self.outbox, dec if c.role == "prefill" else pre),
            )
            for c in configs
        ]
        self._max_num_seqs = max_num_seqs
        self.blocks_used: dict[int, int] = {c.rank: 0 for c in configs}
        self.blocks_total: dict[int, int] = {}
        self.preemptions: dict[int, int] = {c.rank: 0 for c in configs}
        # Per prefill rank: (blocks cached, prefix-cache queries, hits), from State messages.
        self.prefix_cache: dict[int, tuple[int, int, int]] = {}
        self.block_size = configs[0].block_size if configs else 16
        self.worker_info: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._requests: dict[str, _Req] = {}
        self._stopping = threading.Event()
        self._dead: str | None = None  # why no request can be served any more
        self.crashes: list[str] = []  # worker tracebacks
        self._thread: threading.Thread | None = None
        atexit.register(self.stop)

    # -- start-up and shutdown ----------------------------------------------------------------

    def launch(self, timeout_s: float = 300.0) -> dict[int, dict[str, Any]]:
        """Start every worker and wait until each has its model and process group."""
        for p in self.procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        while len(self.worker_info) < len(self.procs):
            try:
                msg = self.outbox.get(timeout=0.5)
            except queue.Empty:
                dead = [p.name for p in self.procs if not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"disaggregated workers did not start (dead: {dead})"
                    ) from None
                continue
            if isinstance(msg, Failed):
                self.stop()
                raise RuntimeError(f"worker rank {msg.rank} failed to start: {msg.error}")
            if isinstance(msg, Up):
                self.worker_info[msg.rank] = msg.info
                self.blocks_total[msg.rank] = int(msg.info["num_kv_blocks"])
        return self.worker_info

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="disagg-router", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the router and every worker (asked first, then terminated, then killed)."""
        self._stopping.set()
        for inbox, p in zip(self.inboxes, self.procs, strict=True):
            if p.is_alive():
                inbox.put(Stop())
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            if p.pid is None:
                continue
            p.join(max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join(2)
            if p.is_alive():
                p.kill()
                p.join(2)
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        for q in (*self.inboxes, self.outbox):
            q.cancel_join_thread()
            q.close()

    # -- called from the API thread -----------------------------------------------------------

    def submit(self, seq: Sequence, loop: asyncio.AbstractEventLoop, queue: EventQueue) -> None:
        if self._dead is not None:
            event = TokenEvent("", 0, "error", error=self._dead)
            loop.call_soon_threadsafe(queue.put_nowait, event)
            return
        with self._lock:
            load = dict.fromkeys(range(self.num_prefill), 0)
            for r in self._requests.values():
                if r.phase != "decode":
                    load[r.prefill_rank] += 1
            rank = min(load, key=lambda k: load[k])
            self._requests[seq.seq_id] = _Req(seq, loop, queue, TextStream(seq.params.stop), rank)
            self.inboxes[rank].put(Add(seq))

    def abort(self, seq_id: str) -> None:
        """Both sides drop the request; each frees its blocks whatever stage it is at."""
        with self._lock:
            req = self._requests.pop(seq_id, None)
            if req is None:
                return
            self.inboxes[req.prefill_rank].put(Abort(seq_id))
            if req.decode_rank is not None:
                self.inboxes[req.decode_rank].put(Abort(seq_id))
        self.stats.record_finished("abort")

    @property
    def queue_depth(self) -> int:
        """Requests without their first token yet, or waiting to be pulled."""
        return self.count_phase("prefill") + self.count_phase("offered")

    @property
    def max_num_seqs(self) -> int:
        return self._max_num_seqs

    def gauges(self) -> EngineGauges:
        """Both pools summed (``extra_metrics`` has the blocks per pool); running = decoding."""
        running = self.count_phase("decode")
        pools = list(self.prefix_cache.values())  # (blocks cached, queries, hits) per prefill rank
        cached, queries, hits = (sum(p[i] for p in pools) for i in range(3))
        return EngineGauges(queue_depth=self.queue_depth, running_requests=running,
                            batch_slots=running, kv_blocks_used=sum(self.blocks_used.values()),
                            kv_blocks_total=sum(self.blocks_total.values()),
                            preemptions_total=sum(self.preemptions.values()),
                            kv_blocks_cached=cached, prefix_cache_queries_total=queries,
                            prefix_cache_hits_total=hits)  # fmt: skip

    def count_phase(self, phase: str) -> int:
        with self._lock:
            return sum(1 for r in self._requests.values() if r.phase == phase)

    def extra_metrics(self) -> list[str]:
        """Per-pool KV blocks and the transfer counters, for ``/metrics``."""
        lines = []
        for name, values in (("kv_pool_blocks_used", self.blocks_used),
                             ("kv_pool_blocks_total", self.blocks_total)):  # fmt: skip
            lines.append(f"# TYPE {PREFIX}{name} gauge")
            for pool in ("prefill", "decode"):
                n = sum(
                    v for r, v in values.items() if (r < self.num_prefill) == (pool == "prefill")
                )
                lines.append(f'{PREFIX}{name}{{pool="{pool}"}} {n}')
        return lines + self.transfers.render()

    # -- the router thread --------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                msg: ToRouter = self.outbox.get(timeout=0.1)
            except (queue.Empty, OSError, ValueError):
                self._check_workers()
                continue
            if isinstance(msg, Step):  # the most frequent first
                if msg.cached:
                    self._on_cached(msg.cached)
                self._on_step(msg.seconds, msg.prefill_tokens, msg.decode_tokens, msg.tokens)
                self.stats.log_step(msg.role, msg.rank, msg.start_ns, msg.end_ns, msg.shape)
            elif isinstance(msg, State):
                self.blocks_used[msg.rank], self.preemptions[msg.rank] = (
                    msg.blocks_used,
                    msg.preemptions,
                )
                if msg.rank < self.num_prefill:
                    self.prefix_cache[msg.rank] = (msg.blocks_cached, msg.prefix_queries,
                                                   msg.prefix_hits)  # fmt: skip
            elif isinstance(msg, Ready):
                self._on_ready(msg.seq_id)
            elif isinstance(msg, Transfer):
                split = transfer_split(msg.nbytes, msg.num_tokens, msg.cached_tokens, self.block_size)  # fmt: skip
                self.transfers.record(msg.nbytes, msg.seconds, split)
                with self._lock:
                    if (req := self._requests.get(msg.seq_id)) is not None:
                        req.phase = "decode"
                        req.kv_transfer = {"bytes": msg.nbytes, "seconds": msg.seconds, **split}
            elif isinstance(msg, Lost):  # its KV transfer failed: an error event, not a hang
                self._fail_request(msg.seq_id, "KV transfer from the prefill worker failed")
            elif isinstance(msg, Crashed):
                log.error("disaggregated worker rank %d crashed:\n%s", msg.rank, msg.traceback)
                self.crashes.append(msg.traceback)

    def _fail_request(self, seq_id: str, message: str) -> None:
        with self._lock:
            req = self._requests.pop(seq_id, None)
        if req is not None:
            self._send_error(req, message)

    def _send_error(self, req: _Req, message: str) -> None:
        """Finish ``req`` with an error event (its client gets a clear failure, not a hang)."""
        self.stats.record_finished("error")
        event = TokenEvent("", len(req.tokens), "error", error=message)
        try:
            req.loop.call_soon_threadsafe(req.queue.put_nowait, event)
        except RuntimeError:  # the API loop has closed: nobody is listening
            pass

    def _check_workers(self) -> None:
        """A worker that died (a bug, the OOM killer) fails every request in flight with an
        error event instead of leaving its clients waiting; the server keeps answering."""
        dead = [p.name for p in self.procs if p.pid is not None and not p.is_alive()]
        if not dead or self._stopping.is_set():
            return
        with self._lock:
            failed, self._requests = list(self._requests.values()), {}
        message = f"disaggregated worker {', '.join(dead)} exited; restart the server"
        self._dead = message
        if failed:
            log.error("%s: failing %d requests", message, len(failed))
        for req in failed:
            self._send_error(req, message)

    def _on_cached(self, cached: tuple[tuple[str, int], ...]) -> None:
        with self._lock:
            for seq_id, n in cached:
                if (req := self._requests.get(seq_id)) is not None:
                    req.cached_tokens = n

    def _on_step(self, seconds: float, prefill: int, decode: int, out: list[StepToken]) -> None:
        phase = "mixed" if prefill and decode else ("prefill" if prefill else "decode")
        self.stats.record_step(phase, seconds, prefill_tokens=prefill, decode_tokens=decode)
        # One cross-thread call per step and event loop, not one per token.
        outbox: dict[asyncio.AbstractEventLoop, list[tuple[_Req, TokenEvent]]] = {}
        for seq_id, token, reason in out:
            with self._lock:
                req = self._requests.get(seq_id)
                if req is None:
                    continue
                req.tokens.append(token)
                if reason is not None:
                    del self._requests[seq_id]
            text = req.text.push(token, reason is not None)
            kv = req.kv_transfer if reason is not None else None
            event = TokenEvent(text, len(req.tokens), reason, kv_transfer=kv,
                               cached_tokens=req.cached_tokens)  # fmt: skip
            outbox.setdefault(req.loop, []).append((req, event))
            if reason is not None:
                self.stats.record_finished(reason)
        for loop, items in outbox.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the API loop has closed
                pass

    def _on_ready(self, seq_id: str) -> None:
        with self._lock:
            req = self._requests.get(seq_id)
            if req is None:
                return  # aborted: the prefill worker got the abort and frees the KV
            load = {c.rank: 0 for c in self.configs if c.role == "decode"}
            for r in self._requests.values():
                if r.decode_rank is not None:
                    load[r.decode_rank] += 1
            rank = min(load, key=lambda k: load[k])
            req.decode_rank, req.phase = rank, "offered"
            s = req.seq
            offer = Sequence(s.seq_id, s.prompt_token_ids, s.params, s.arrival_ns,
                             list(req.tokens), images=s.images)  # fmt: skip
            self.inboxes[rank].put(Offer(offer, req.prefill_rank))


def _put_all(items: list[tuple[_Req, TokenEvent]]) -> None:
    for req, event in items:
        req.queue.put_nowait(event)


def build_app(config: ServerConfig) -> tuple[Any, DisaggregatedEngine, dict[str, Any]]:
    """``cli.build_app`` for ``--mode disaggregated``: workers, engine, settings and app."""
    import torch

    from reference_server.api import ServerSettings, create_app
    from reference_server.disagg.worker import WorkerConfig
    from reference_server.model_runner import resolve_args

    if config.preset == "fake":
        raise ValueError("--mode disaggregated needs a real model preset (tiny, cpu, 1b)")
    model = resolve_args(config.preset)
    n_pre, n_dec = config.prefill_workers, config.decode_workers
    if n_pre < 1 or n_dec < 1:
        raise ValueError("--prefill-workers and --decode-workers must be >= 1")
    world = n_pre + n_dec
    avail = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()
    pre_cpus, dec_cpus = split_cpus(avail)
    if config.prefill_cpus:
        pre_cpus = parse_cpus(config.prefill_cpus)
    if config.decode_cpus:
        dec_cpus = parse_cpus(config.decode_cpus)
    ndev = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = "nccl" if ndev >= world else "gloo"
    nice = config.prefill_nice if config.prefill_nice is not None else (0 if ndev else 10)
    if nice < 0:
        raise ValueError(f"--prefill-nice must be >= 0 (raising priority needs root), got {nice}")
    small = model.num_params < 5_000_000  # one thread: a tiny model's ops are too small to split
    max_len = min(model.max_seq_len, config.max_model_len or model.max_seq_len)
    kv_bytes = int(config.kv_cache_mb * 2**20) if config.kv_cache_mb else None
    init = config.dist_init or f"tcp://127.0.0.1:{free_port()}"
    # rank r runs on cuda:(r % ndev); the workers on one device split its default KV memory
    on_device = [sum(1 for r in range(world) if r % ndev == d) for d in range(ndev)]
    configs: list[WorkerConfig] = []
    for rank in range(world):
        role = "prefill" if rank < n_pre else "decode"
        cpus = pre_cpus if role == "prefill" else dec_cpus
        per = n_pre if role == "prefill" else n_dec
        threads = config.threads or (1 if small else max(1, len(cpus) // per))
        configs.append(WorkerConfig(role=role, rank=rank, world_size=world, num_prefill=n_pre,
            init_method=init, preset=config.preset, seed=config.seed, num_kv_blocks=config.num_kv_blocks,
            kv_cache_bytes=kv_bytes, block_size=config.block_size, max_num_seqs=config.max_num_seqs,
            max_model_len=max_len, max_batched_tokens=config.max_batched_tokens, cpus=cpus,
            threads=threads, device=f"cuda:{rank % ndev}" if ndev else None, backend=backend,
            max_held=config.max_held or config.max_num_seqs, api_pid=os.getpid(),
            nice=nice if role == "prefill" else 0,
            prefix_caching=config.prefix_caching == "on",
            kv_share=1 / on_device[rank % ndev] if ndev else 1.0))  # fmt: skip
    engine = DisaggregatedEngine(configs, max_num_seqs=config.max_num_seqs)
    workers = engine.launch()
    max_len = min(max_len, *(int(w["num_kv_blocks"]) * config.block_size for w in workers.values()))
    first = workers[0]
    info: dict[str, Any] = {k: first[k] for k in ("preset", "num_params", "dtype", "kv_bytes_per_token",
                                  "block_size", "max_seq_len") if k in first}  # fmt: skip
    info.update(mode="disaggregated", device=first.get("device"), max_num_seqs=config.max_num_seqs,
                max_model_len=max_len, num_kv_blocks=sum(engine.blocks_total.values()),
                prefill_workers=n_pre, decode_workers=n_dec, kv_transfer_backend=backend,
                prefix_caching=config.prefix_caching == "on",
                dist_init=init.split("://")[0],
                compute_split={"prefill_cpus": list(pre_cpus), "decode_cpus": list(dec_cpus),
                               "api_cpus": "unpinned", "prefill_nice": nice},
                workers=[{"rank": r, "role": c.role, "device": workers[r].get("device"),
                          "cpus": workers[r].get("cpus"), "threads": workers[r].get("threads"),
                          "nice": workers[r].get("nice"),
                          "num_kv_blocks": workers[r].get("num_kv_blocks")}
                         for r, c in enumerate(configs)])  # fmt: skip
    settings = ServerSettings(model_name=config.model_name, max_model_len=max_len,
                              max_queue=config.max_queue, info=info,
                              api_key=config.api_key(), **config.answer_settings())  # fmt: skip
    return create_app(engine, settings), engine, info

"""Prefill and decode worker processes of the ``disaggregated`` mode.

Each worker is its own process with its own model replica (same seed, so same weights), its own
KV cache and ``BlockManager``, pinned to its own CPUs. Ranks of the ``torch.distributed`` group:
prefill workers are ranks ``0 .. P-1``, decode workers ``P .. P+D-1`` (the API process is not
in the group; it talks to workers through multiprocessing queues). Only the KV bytes go through
``torch.distributed`` (gloo on CPU; NCCL when every rank has its own GPU).

The pull protocol (backpressure: the decode side asks only when its block manager can admit)::

    prefill: prompt -> cached prefix blocks + one forward pass over the rest -> first token
             -> Ready (KV held, bounded)
    router:  Offer the request to the least-loaded decode worker
    decode:  when blocks are free: allocate, send Pull to the prefill worker
    prefill: export KV (cached and computed), free its blocks (full ones stay cached),
             isend(KV), tell the decode worker Coming with how much was cached (or Gone
             when the request was aborted meanwhile); a thread serves pulls at once, even
             while a forward pass runs
    decode:  irecv(KV) into its own blocks, then continuous batching takes it from there

Prefix caching (``--prefix-caching on``) lives on the prefill side, where prompts are computed:
its block manager shares the cached blocks of a prompt's leading tokens and only the rest is
prefilled. The decode side has no cache of its own: it receives the whole prompt's KV, and the
transfer says how many of those tokens came from the prefill worker's cache.

Every Pull is answered with Coming or Gone, so an abort anywhere never leaves a receive
waiting and every block is freed on both sides. The messages are in ``messages.py``. Usage
(from ``router.py``)::

    ctx.Process(target=worker_main, args=(WorkerConfig(...), inbox, outbox, prefill_inboxes))
"""

from __future__ import annotations

import datetime
import os
import queue
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from reference_server.disagg.messages import (
    Abort,
    Add,
    Coming,
    Crashed,
    Failed,
    Gone,
    Lost,
    Offer,
    Pull,
    Ready,
    State,
    Step,
    StepToken,
    Stop,
    ToWorker,
    Transfer,
    Up,
)
from reference_server.kv_cache import BlockManager
from reference_server.model_runner import ModelRunner
from reference_server.scheduler.base import Scheduler
from reference_server.scheduler.continuous import ContinuousScheduler
from reference_server.sequence import ScheduledBatch, ScheduledSeq, SeqStatus, Sequence

__all__ = ["PrefillScheduler", "WorkerConfig", "worker_main"]

_TRANSFER_TIMEOUT = datetime.timedelta(seconds=60)
_MAX_PULLS_IN_FLIGHT = 2  # pulls a decode worker has asked for and not yet received


@dataclass(frozen=True)
class WorkerConfig:
    role: str  # "prefill" | "decode"
    rank: int
    world_size: int
    num_prefill: int
    init_method: str  # e.g. tcp://127.0.0.1:29500
    preset: str
    seed: int
    num_kv_blocks: int | None
    kv_cache_bytes: int | None
    block_size: int
    max_num_seqs: int
    max_model_len: int
    max_batched_tokens: int | None
    cpus: tuple[int, ...]  # () = leave the affinity alone
    threads: int | None
    device: str | None
    backend: str  # "gloo" | "nccl"
    max_held: int  # prefill: requests whose KV waits for a pull before prefill pauses
    api_pid: int = 0  # the API process: the worker exits when it is gone (0: the parent)
    nice: int = 0  # added to the worker's nice value (CPU: let token delivery preempt prefill)
    prefix_caching: bool = False  # the prefill side's block manager caches prefixes
    kv_share: float = 1.0  # of its device's default KV memory (workers sharing one GPU)

    def __post_init__(self) -> None:
        if self.role not in ("prefill", "decode"):
            raise ValueError(f"role must be prefill or decode, got {self.role!r}")


class PrefillScheduler(Scheduler):
    """Whole prompts batched into one pass (as continuous mode's prefill step); after the first
    token a sequence leaves ``running`` for ``held`` and waits there, KV intact, to be pulled."""

    mode = "prefill"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held: dict[str, Sequence] = {}

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget, bm = self.max_num_batched_tokens, self.block_manager
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hit, n = self._cached_prefix(seq)  # n: the uncached rest of the prompt
            if (batch and n > budget) or not bm.can_allocate(seq, seq.num_tokens, hit):
                break
            self._start(seq, seq.num_tokens, hit)
            batch.items.append(ScheduledSeq(seq, n))
            budget -= n
        return batch

    def postprocess(self, batch: ScheduledBatch, tokens: list[int | None]) -> list[Sequence]:
        updated = super().postprocess(batch, tokens)
        for seq in updated:
            if not seq.is_finished:
                self.running.remove(seq)
                self.held[seq.seq_id] = seq
        return updated

    def abort(self, seq_id: str) -> Sequence | None:
        seq = self.held.pop(seq_id, None)
        if seq is None:
            return super().abort(seq_id)
        self.num_aborted += 1
        self._release(seq, "abort")
        return seq

    def take(self, seq_id: str) -> Sequence | None:
        """Hand a held sequence over (its blocks stay allocated until the caller frees them)."""
        return self.held.pop(seq_id, None)


def _pin(cfg: WorkerConfig) -> None:
    if cfg.cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cfg.cpus)
    threads = cfg.threads or max(1, len(cfg.cpus) or 1)
    torch.set_num_threads(threads)
    if cfg.nice > 0 and hasattr(os, "nice"):
        os.nice(cfg.nice)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # killed but not yet reaped by its own parent
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def _watchdog(api_pid: int) -> None:
    """Exit when the API process dies, so no worker outlives it. Workers are children of the
    fork server, not of the API process, so the API's pid is watched, not the parent's."""
    while True:
        if _gone(api_pid):
            os._exit(3)
        time.sleep(0.5)


def worker_main(cfg: WorkerConfig, inbox: Any, outbox: Any, peers: list[Any]) -> None:
    """A worker's whole life. ``peers``: prefill workers' inboxes (decode side) or decode
    workers' inboxes (prefill side), indexed by rank within the other pool."""
    api_pid = cfg.api_pid or os.getppid()
    threading.Thread(target=_watchdog, args=(api_pid,), daemon=True, name="watchdog").start()
    try:
        _pin(cfg)
        if cfg.device and cfg.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(cfg.device))
        dist.init_process_group(cfg.backend, init_method=cfg.init_method, rank=cfg.rank,
                                world_size=cfg.world_size, timeout=datetime.timedelta(seconds=120))  # fmt: skip
        runner = ModelRunner(cfg.preset, num_kv_blocks=cfg.num_kv_blocks,
                             kv_cache_bytes=cfg.kv_cache_bytes, block_size=cfg.block_size,
                             seed=cfg.seed, threads=cfg.threads or torch.get_num_threads(),
                             device=cfg.device, kv_share=cfg.kv_share)  # fmt: skip
    except Exception as exc:
        outbox.put(Failed(cfg.rank, f"{type(exc).__name__}: {exc}"))
        return
    info = {**runner.info(), "cpus": list(cfg.cpus), "threads": torch.get_num_threads(),
            "nice": os.nice(0) if hasattr(os, "nice") else 0}  # fmt: skip
    outbox.put(Up(cfg.rank, info))
    worker = (_Prefill if cfg.role == "prefill" else _Decode)(cfg, runner, inbox, outbox, peers)
    try:
        worker.loop()
    except Exception:  # report it: the API process fails requests in flight and logs this
        outbox.put(Crashed(cfg.rank, traceback.format_exc()))
        outbox.close()
        outbox.join_thread()
        os._exit(1)
    # Exit without tearing the process group down: a peer may already be gone, and gloo's
    # teardown can wait on it. Flush the outbox first so the last block counts arrive.
    outbox.close()
    outbox.join_thread()
    os._exit(0)


class _Worker:
    def __init__(self, cfg: WorkerConfig, runner: ModelRunner, inbox: Any, outbox: Any,
                 peers: list[Any]) -> None:  # fmt: skip
        self.cfg, self.runner, self.inbox, self.outbox, self.peers = (
            cfg,
            runner,
            inbox,
            outbox,
            peers,
        )
        # Only the prefill side caches: the decode side receives every prompt's KV whole.
        caching = cfg.prefix_caching and cfg.role == "prefill"
        self.bm = BlockManager(runner.num_kv_blocks, runner.block_size, prefix_caching=caching)
        cls = PrefillScheduler if cfg.role == "prefill" else ContinuousScheduler
        self.sched: Scheduler = cls(self.bm, max_num_seqs=cfg.max_num_seqs,
                                    max_model_len=cfg.max_model_len,
                                    max_num_batched_tokens=cfg.max_batched_tokens)  # fmt: skip
        self.stopping = False
        self.lock = threading.Lock()  # the prefill side serves pulls from another thread
        self._reported: tuple[int, ...] = ()
        # On a GPU with gloo (one device shared by every rank) the KV is staged through host memory.
        self.stage_cpu = cfg.backend == "gloo" and runner.device.type != "cpu"

    def loop(self) -> None:
        while not self.stopping:
            idle = not self.busy()
            try:
                msg = self._next_msg(0.05 if idle else None)
                self.handle(msg)
                while not self.stopping:
                    self.handle(self._next_msg(None))
            except queue.Empty:
                pass
            if not self.stopping:
                self.work()
            sched = self.sched
            state = (self.bm.num_used_blocks, sched.num_preemptions, self.bm.num_cached_blocks,
                     sched.prefix_cache_queries, sched.prefix_cache_hits)  # fmt: skip
            if state != self._reported:
                self._reported = state
                self.outbox.put(State(self.cfg.rank, *state))

    def _next_msg(self, timeout_s: float | None) -> ToWorker:
        """The next message (``queue.Empty`` when none comes within ``timeout_s``; None:
        do not wait)."""
        return self.inbox.get(timeout=timeout_s) if timeout_s else self.inbox.get_nowait()

    def step(self) -> list[Sequence]:
        """One forward pass of this worker's scheduler; reports tokens and step time. The
        scheduler and block manager are touched under ``self.lock``, the forward pass not."""
        t_begin = time.perf_counter_ns()
        with self.lock:
            batch = self.sched.schedule()
        if not batch:
            return []
        shape = batch.step_shape()  # before the run advances num_computed_tokens
        t0 = time.perf_counter()
        tokens = self.runner.run(batch)
        with self.lock:
            updated = self.sched.postprocess(batch, tokens)
        seconds = time.perf_counter() - t0
        out: list[StepToken] = [
            (s.seq_id, s.output_token_ids[-1], s.finish_reason) for s in updated
        ]
        # A prefill step finishes each prompt: say which were partly served from the cache.
        cached = tuple(
            (s.seq_id, s.num_cached_tokens)
            for s in updated
            if s.num_cached_tokens and len(s.output_token_ids) == 1
        )
        self.outbox.put(Step(self.cfg.rank, self.cfg.role, seconds, batch.num_prefill_tokens,
                             batch.num_decode_tokens, out, cached, shape, t_begin,
                             time.perf_counter_ns()))  # fmt: skip
        return updated

    def busy(self) -> bool:
        return self.sched.has_work

    def handle(self, msg: ToWorker) -> None:
        raise NotImplementedError

    def work(self) -> None:
        raise NotImplementedError


class _Prefill(_Worker):
    sched: PrefillScheduler

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.sends: queue.Queue[Any] = queue.Queue()
        self.local: queue.Queue[ToWorker] = queue.Queue()  # inbox minus the pulls
        # gloo's send Work only completes inside wait(): a thread waits so prefill never does.
        threading.Thread(target=self._reap, daemon=True, name="kv-send").start()
        # Pulls are served at once, even during a forward pass: a request prefilled just
        # before a long prompt would otherwise wait seconds for its KV to leave, and its
        # stream would stall between its first and second token.
        threading.Thread(target=self._read_inbox, daemon=True, name="inbox").start()

    def _read_inbox(self) -> None:
        while not self.stopping:
            try:
                msg = self.inbox.get(timeout=0.1)
            except queue.Empty:
                continue
            if isinstance(msg, Pull):
                with self.lock:
                    self._send(msg.seq_id, msg.dst, msg.tag)
            else:  # Add, Abort, Stop: between forward passes, in the main loop
                self.local.put(msg)

    def _next_msg(self, timeout_s: float | None) -> ToWorker:
        return self.local.get(timeout=timeout_s) if timeout_s else self.local.get_nowait()

    def _reap(self) -> None:
        while True:
            work, _kv = self.sends.get()  # _kv: keep the tensor alive until the send is done
            try:
                work.wait(_TRANSFER_TIMEOUT)
            except RuntimeError:  # the decode side is gone or timed out; its side reports it
                pass

    def handle(self, msg: ToWorker) -> None:
        with self.lock:
            if isinstance(msg, Add):
                self.sched.add(msg.seq)
            elif isinstance(msg, Abort):
                self.sched.abort(msg.seq_id)
            elif isinstance(msg, Stop):  # (Pull never comes here: the inbox thread serves it)
                self.stopping = True

    def _send(self, seq_id: str, dst: int, tag: int) -> None:
        peer = self.peers[dst - self.cfg.num_prefill]
        seq = self.sched.take(seq_id)
        if seq is None:  # aborted since it was offered
            peer.put(Gone(seq_id))
            return
        kv = self.runner.export_kv(seq)  # [L, 2, n, KVH, hd], a copy: the blocks can go now
        self.bm.free(seq)
        seq.status = SeqStatus.FINISHED
        if self.stage_cpu:
            kv = kv.cpu()
        work = dist.isend(kv, dst, tag=tag)
        self.sends.put((work, kv))
        peer.put(Coming(seq_id, tag, int(kv.shape[2]), seq.num_cached_tokens))

    def busy(self) -> bool:
        return bool(self.sched.waiting or self.sched.running)

    def work(self) -> None:
        if len(self.sched.held) >= self.cfg.max_held:
            time.sleep(0.001)  # bounded: wait for the decode side to pull (another thread)
            return
        for seq in self.step():
            if seq.seq_id in self.sched.held:
                self.outbox.put(Ready(self.cfg.rank, seq.seq_id, seq.num_computed_tokens))


class _Decode(_Worker):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.offers: deque[tuple[Sequence, int]] = deque()  # (sequence, prefill rank)
        self.pulling: dict[str, Sequence] = {}  # blocks reserved, KV not yet received
        self.aborted: set[str] = set()  # aborted while pulling: free on arrival
        self.srcs: dict[str, int] = {}  # prefill rank each pulled request comes from
        self.cached_of: dict[str, int] = {}  # tokens of a coming KV from the prefill cache
        self.next_tag = 1
        self.recvs: queue.Queue[tuple[Any, str, torch.Tensor | None, float]] = queue.Queue()
        self.arrived: queue.Queue[tuple[str, torch.Tensor | None, float, float]] = queue.Queue()
        # A thread waits for each receive, so decode steps go on while the KV streams in.
        threading.Thread(target=self._wait_recvs, daemon=True, name="kv-recv").start()

    def _wait_recvs(self) -> None:
        while True:
            work, seq_id, buf, t0 = self.recvs.get()
            try:
                work.wait(_TRANSFER_TIMEOUT)
            except RuntimeError:  # the prefill side died or timed out: fail this request
                buf = None
            self.arrived.put((seq_id, buf, t0, time.perf_counter()))

    def handle(self, msg: ToWorker) -> None:
        if isinstance(msg, Offer):
            self.offers.append((msg.seq, msg.prefill_rank))
        elif isinstance(msg, Coming):
            self.cached_of[msg.seq_id] = msg.cached_tokens
            self._receive(msg.seq_id, msg.tag, msg.num_tokens)
        elif isinstance(msg, Gone):
            seq = self.pulling.pop(msg.seq_id, None)
            self.aborted.discard(msg.seq_id)
            self.srcs.pop(msg.seq_id, None)
            if seq is not None:
                self.bm.free(seq)
        elif isinstance(msg, Abort):
            self._abort(msg.seq_id)
        elif isinstance(msg, Stop):
            self.stopping = True

    def _abort(self, seq_id: str) -> None:
        for item in self.offers:
            if item[0].seq_id == seq_id:
                self.offers.remove(item)
                return
        if seq_id in self.pulling:
            self.aborted.add(seq_id)  # the pull is answered either way; free then
            return
        self.sched.abort(seq_id)

    def _receive(self, seq_id: str, tag: int, n: int) -> None:
        """The prefill side has posted its send: post the receive and let the thread wait."""
        a, r = self.runner.args, self.runner
        dev = "cpu" if self.stage_cpu else r.device
        buf = torch.empty((a.n_layers, 2, n, a.n_kv_heads, a.head_dim), dtype=r.dtype, device=dev)
        t0 = time.perf_counter()
        work = dist.irecv(buf, self.srcs.pop(seq_id), tag=tag)
        self.recvs.put((work, seq_id, buf, t0))

    def _admit_arrived(self, timeout_s: float | None) -> None:
        """Write each received KV into its blocks and start decoding it."""
        try:
            item = self.arrived.get(timeout=timeout_s) if timeout_s else self.arrived.get_nowait()
        except queue.Empty:
            return
        while True:
            seq_id, buf, t0, t1 = item
            seq = self.pulling.pop(seq_id)
            cached = self.cached_of.pop(seq_id, 0)
            if seq_id in self.aborted or buf is None:
                self.aborted.discard(seq_id)
                self.bm.free(seq)
                if buf is None:
                    self.outbox.put(Lost(self.cfg.rank, seq_id))
            else:
                t2 = time.perf_counter()
                self.runner.import_kv(seq, buf)
                seconds = (t1 - t0) + (time.perf_counter() - t2)  # receive + copy into blocks
                seq.num_computed_tokens = int(buf.shape[2])
                seq.status = SeqStatus.RUNNING
                self.sched.running.append(seq)
                nbytes = buf.numel() * buf.element_size()
                n = int(buf.shape[2])
                self.outbox.put(Transfer(self.cfg.rank, seq_id, nbytes, seconds, n, cached))
            try:
                item = self.arrived.get_nowait()
            except queue.Empty:
                return

    def busy(self) -> bool:
        return self.sched.has_work or bool(self.pulling)

    def work(self) -> None:
        # Only waiting for KV to arrive: sleep on the arrivals instead of spinning.
        waiting_only = bool(self.pulling) and not self.sched.has_work
        self._admit_arrived(0.005 if waiting_only else None)
        self._pull()
        self.step()

    def _pull(self) -> None:
        """Backpressure: ask for the next ready request only when its KV fits here now."""
        sched = self.sched
        while self.offers and len(self.pulling) < _MAX_PULLS_IN_FLIGHT:
            seq, src = self.offers[0]
            if len(sched.running) + len(sched.waiting) + len(self.pulling) >= sched.max_num_seqs:
                return
            # Room for the prompt's KV plus the first decode token.
            if not self.bm.can_allocate(seq, seq.num_prompt_tokens + 1):
                return
            self.offers.popleft()
            self.bm.allocate(seq, seq.num_prompt_tokens + 1)
            self.pulling[seq.seq_id] = seq
            self.srcs[seq.seq_id] = src
            tag, self.next_tag = self.next_tag, self.next_tag + 1
            self.peers[src].put(Pull(seq.seq_id, self.cfg.rank, tag))

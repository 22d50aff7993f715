"""Disaggregated mode's two worker policies (``reference_server/disagg/worker.py``).

- ``PrefillPolicy``: prompts batched into one pass, each less its cached prefix blocks
  (``PrefillScheduler``; the prefix cache lives on this side only); after its
  first token a request leaves ``running`` for ``held`` and keeps its KV blocks until a decode
  worker pulls it. A worker holding ``max_held`` requests does not step.
- ``DecodePolicy``: continuous batching (``ContinuousScheduler``) plus the pull protocol's
  backpressure: offers wait in FIFO order; one is pulled only when the running, waiting and
  pulling requests leave a slot, its prompt + 1 tokens' blocks are free, and fewer than two
  pulls are in flight. Its blocks are taken at the pull; its KV arrives a transfer later.

The engine (``engine.py``) routes: a new request to the prefill worker with the fewest
requests not yet decoding, a prefilled one to the decode worker with the fewest requests
assigned (``reference_server/disagg/router.py``: ``DisaggregatedEngine.submit``, ``_on_ready``).
"""

from __future__ import annotations

from collections import deque

from loadlab.simulate._policies import ContinuousPolicy, Item, Policy, SimSeq
from loadlab.simulate._server import ServerConfig

__all__ = ["MAX_PULLS_IN_FLIGHT", "DecodePolicy", "PrefillPolicy", "make_workers"]

MAX_PULLS_IN_FLIGHT = 2  # reference_server.disagg.worker._MAX_PULLS_IN_FLIGHT


class PrefillPolicy(Policy):
    mode = "prefill"

    def __init__(self, cfg: ServerConfig) -> None:
        super().__init__(cfg)
        self.held: list[SimSeq] = []
        self.max_held = cfg.held_cap

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running) and len(self.held) < self.max_held

    def schedule(self) -> list[Item]:
        items: list[Item] = []
        budget = self.budget
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hit, n = self._cached_prefix(seq)  # n: the uncached rest of the prompt
            if (items and n > budget) or not self._can_allocate(seq, seq.num_tokens, hit):
                break
            self._start(seq, seq.num_tokens, hit)
            items.append((seq, n, False))
            budget -= n
        return items

    def postprocess(self, items: list[Item], step: int) -> list[SimSeq]:
        done = super().postprocess(items, step)
        self.held += self.running  # every prompt of the step is done: wait to be pulled
        self.running = []
        return done

    def abort(self, seq: SimSeq) -> bool:
        if seq in self.held:
            self.held.remove(seq)
            self._release(seq, abort=True)
            return True
        return super().abort(seq)

    def take(self, seq: SimSeq) -> bool:
        """A decode worker pulls ``seq``: its blocks go back here; False if it is gone."""
        if seq not in self.held:
            return False
        self.held.remove(seq)
        self._free(seq)
        seq.status = 2
        return True


class DecodePolicy(ContinuousPolicy):
    mode = "decode"

    def __init__(self, cfg: ServerConfig) -> None:
        super().__init__(cfg)
        self.cache = None  # it receives whole prompts' KV: no prefix cache of its own
        self.offers: deque[SimSeq] = deque()
        self.pulling: list[SimSeq] = []

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running) or self.pull_possible()

    def pull(self) -> list[SimSeq]:
        """The offers pulled now (blocks allocated; their KV is on its way)."""
        pulled: list[SimSeq] = []
        while self.offers and len(self.pulling) < MAX_PULLS_IN_FLIGHT:
            seq = self.offers[0]
            if not self._slots_free():
                break
            if not self._can_allocate(seq, seq.prompt + 1):
                break
            self.offers.popleft()
            self._allocate(seq, seq.prompt + 1)
            self.pulling.append(seq)
            pulled.append(seq)
        return pulled

    def arrived(self, seq: SimSeq, aborted: bool) -> None:
        """Its KV is here: decode it from the next step on (or free it: it was aborted)."""
        self.pulling.remove(seq)
        if aborted:
            self._free(seq)
            seq.status = 2
            return
        seq.computed = seq.prompt  # the prompt's KV; the first token is decoded next
        seq.status = 1
        self.running.append(seq)

    def abort(self, seq: SimSeq) -> bool:
        if seq in self.offers:
            self.offers.remove(seq)
            seq.status = 2
            return True
        if seq in self.pulling:
            return True  # freed when its KV arrives (the pull is answered either way)
        return super().abort(seq)

    def decode_stretch(self) -> tuple[int, bool]:
        if self.offers and self.pull_possible():
            return 0, True
        k, matter = super().decode_stretch()
        # A pulled offer joins ``running`` without passing the waiting queue, so a preempted
        # head stuck there on blocks (which makes the base policy say arrivals cannot matter)
        # does not stop it: a new request, an offer once prefilled, can still be pulled while
        # a slot and a pull are free. (Behind an offer that cannot be pulled it waits in FIFO
        # order, and nothing in a stretch frees a slot or a block.)
        if not matter and not self.offers:
            matter = len(self.pulling) < MAX_PULLS_IN_FLIGHT and self._slots_free()
        return k, matter

    def _slots_free(self) -> bool:
        return len(self.running) + len(self.waiting) + len(self.pulling) < self.max_num_seqs

    def pull_possible(self) -> bool:
        if not self.offers or len(self.pulling) >= MAX_PULLS_IN_FLIGHT:
            return False
        if not self._slots_free():
            return False
        return self._can_allocate(self.offers[0], self.offers[0].prompt + 1)


def make_workers(cfg: ServerConfig) -> tuple[list[PrefillPolicy], list[DecodePolicy]]:
    """The prefill and decode policies of a disaggregated server."""
    return (
        [PrefillPolicy(cfg) for _ in range(cfg.prefill_workers)],
        [DecodePolicy(cfg) for _ in range(cfg.decode_workers)],
    )

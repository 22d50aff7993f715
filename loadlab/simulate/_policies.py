"""The reference server's scheduling policies, replayed on counters instead of tensors.

Each class mirrors one of ``reference_server/scheduler/`` rule for rule (read those modules
and ``docs/reference-server.md``): the same waiting deque and running list, FCFS admission by
free KV blocks, the same budgets, the same preemption by recompute (victims newest first, the
victim waits at the front of the queue), static batching's reserved KV and padding rows. What
is dropped is everything that does not change *which tokens run when*: token ids, block ids
(only counts matter), text. A test drives the real schedulers and these side by side and
checks that every step schedules the same items.

Requests generate exactly ``max_tokens`` tokens (the reference server's default
``ignore_eos``), or stop at ``max_model_len``.

On top of the server's verbs, ``decode_stretch`` says how many next steps are certain to be
plain decode steps of the same running set (no admission, no finish, no preemption), so the
engine can price and advance them in one go instead of one Python step at a time.

Usage::

    policy = make_policy(ServerConfig(mode="continuous", num_kv_blocks=1024))
    policy.add(SimSeq(0, prompt=128, max_out=64))
    items = policy.schedule()            # [(seq, num_new_tokens, padding), ...]
    finished = policy.postprocess(items, step=0)
"""

from __future__ import annotations

from collections import deque

from loadlab.simulate._prefix import Content, PrefixCache
from loadlab.simulate._server import ServerConfig

__all__ = [
    "ChunkedPolicy",
    "ContinuousPolicy",
    "Item",
    "Policy",
    "SimSeq",
    "StaticPolicy",
    "make_policy",
]


class SimSeq:
    """One request inside the simulated server: counts only (``reference_server.Sequence``).

    ``segs`` lists the steps at which it got tokens as flat pairs ``[first_step, count, ...]``
    (one pair per run of consecutive steps), so a long decode costs O(1), not O(tokens).
    """

    __slots__ = ("blocks", "cached", "computed", "content", "first_step", "hashes", "idx",
                 "max_out", "out", "preemptions", "prompt", "published", "segs", "status",
                 "table")  # fmt: skip

    def __init__(self, idx: int, prompt: int, max_out: int, content: Content | None = None) -> None:
        self.idx = idx
        self.prompt = prompt
        self.max_out = max_out
        self.out = 0  # tokens generated
        self.computed = 0  # tokens whose K/V are cached
        self.blocks = 0  # KV blocks held
        self.status = 0  # 0 waiting, 1 running, 2 finished
        self.preemptions = 0
        self.first_step = -1  # the first step that scheduled any of its tokens
        self.segs: list[int] = []
        # prefix caching only (``prefix.py``): what its tokens are, its block ids, chain
        # hashes, blocks published, prompt tokens found cached at its first admission
        self.content = content  # None: a prompt unlike any other
        self.table: list[int] = []
        self.hashes: list[int] = []
        self.published = 0
        self.cached = 0

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.out

    @property
    def is_prefill(self) -> bool:
        return self.computed < self.prompt + self.out - (1 if self.out else 0)

    def emit(self, step: int, count: int = 1) -> None:
        """Tokens at steps ``step .. step + count - 1``."""
        segs = self.segs
        if segs and segs[-2] + segs[-1] == step:
            segs[-1] += count
        else:
            segs += (step, count)


Item = tuple[SimSeq, int, bool]  # (sequence, new tokens, padding row)


class Policy:
    """Waiting queue, running set, finishing and preemption (``scheduler/base.py``)."""

    mode = "base"

    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.bs = cfg.block_size
        self.free = cfg.num_kv_blocks
        self.max_num_seqs = cfg.max_num_seqs
        self.max_model_len = cfg.context_tokens
        self.budget = cfg.batched_tokens
        self.waiting: deque[SimSeq] = deque()
        self.running: list[SimSeq] = []
        self.num_preemptions = 0
        # None: block counts only (caching off, or disaggregated mode, which has none)
        self.cache = PrefixCache(cfg.num_kv_blocks, self.bs) if cfg.caching else None

    # -- the server's verbs -------------------------------------------------------------------

    def add(self, seq: SimSeq) -> None:
        seq.status = 0
        self.waiting.append(seq)

    def abort(self, seq: SimSeq) -> bool:
        """Drop ``seq`` wherever it is and free its blocks; False if it is not here."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.running:
            self.running.remove(seq)
        else:
            return False
        self._release(seq, abort=True)
        return True

    def schedule(self) -> list[Item]:
        raise NotImplementedError

    def postprocess(self, items: list[Item], step: int) -> list[SimSeq]:
        """Advance computed tokens, emit sampled ones, finish; returns the finished sequences."""
        done: list[SimSeq] = []
        for seq, n, _padding in items:
            if seq.status == 2:  # a padding row, or aborted after scheduling
                continue
            completes = seq.computed + n == seq.prompt + seq.out
            seq.computed += n
            if not completes:
                continue
            seq.out += 1
            seq.emit(step)
            if seq.out >= seq.max_out or seq.prompt + seq.out >= self.max_model_len:
                self.running.remove(seq)
                self._release(seq)
                done.append(seq)
        return done

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- the simulator's shortcut -------------------------------------------------------------

    def decode_stretch(self) -> tuple[int, bool]:
        """``(k, arrivals_matter)``: the next ``k`` steps (0 = not known) are plain decode
        steps of the running set, unless, when ``arrivals_matter``, a request arrives first."""
        return 0, True

    def advance_decode(self, k: int, step: int) -> None:
        """Apply ``k`` plain decode steps starting at ``step`` (after ``decode_stretch``)."""
        bs = self.bs
        if self.cache is not None:
            self.cache.advance_decode(self.running, k)
            self.free = self.cache.num_free
            for seq in self.running:
                seq.out += k
                seq.computed += k
                seq.emit(step, k)
            return
        for seq in self.running:
            need = -(-(seq.prompt + seq.out + k - 1) // bs)
            if need > seq.blocks:
                self.free -= need - seq.blocks
                seq.blocks = need
            seq.out += k
            seq.computed += k
            seq.emit(step, k)

    def _steps_to_finish(self) -> int:
        """Steps until the first running sequence finishes (that step included)."""
        mml = self.max_model_len
        return min(min(s.max_out - s.out, mml - s.prompt - s.out) for s in self.running)

    def _block_limited(self, k: int, free: int | None = None) -> int:
        """The largest ``j <= k`` such that ``j`` decode steps of the running set allocate at
        most ``free`` blocks (default: the free blocks, so none of them can preempt)."""
        bs, running = self.bs, self.running
        free = self.free if free is None else free

        def extra(j: int) -> int:
            return sum(max(0, -(-(s.prompt + s.out + j - 1) // bs) - s.blocks) for s in running)

        if extra(k) <= free:
            return k
        lo, hi = 0, k  # extra(lo) <= free < extra(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if extra(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo

    # -- shared rules (scheduler/base.py) -----------------------------------------------------

    def _need(self, seq: SimSeq, num_tokens: int, hit: list[int] | None = None) -> int:
        if self.cache is not None:
            return self.cache.need(seq, num_tokens, hit or ())
        return max(0, -(-num_tokens // self.bs) - seq.blocks)

    def _can_allocate(self, seq: SimSeq, num_tokens: int, hit: list[int] | None = None) -> bool:
        return self._need(seq, num_tokens, hit) <= self.free

    def _allocate(self, seq: SimSeq, num_tokens: int, hit: list[int] | None = None) -> None:
        cache = self.cache
        if cache is not None:
            cache.allocate(seq, num_tokens, hit or ())
            self.free = len(cache.empty) + len(cache.evictable)
            return
        need = self._need(seq, num_tokens)
        self.free -= need
        seq.blocks += need

    def _free(self, seq: SimSeq) -> None:
        if self.cache is not None:
            self.cache.free(seq)
            self.free = self.cache.num_free
            return
        self.free += seq.blocks
        seq.blocks = 0

    def _cached_prefix(self, seq: SimSeq) -> tuple[list[int] | None, int]:
        """The cached blocks a waiting ``seq`` would start with, and the tokens left."""
        if self.cache is None:
            return None, seq.prompt + seq.out
        hit = self.cache.match(seq)
        return hit, seq.prompt + seq.out - len(hit) * self.bs

    def _start(self, seq: SimSeq, num_tokens: int, hit: list[int] | None) -> None:
        """Admit the head of the queue with its ``hit`` blocks counted as computed."""
        self._allocate(seq, num_tokens, hit)
        if hit:
            seq.computed = len(hit) * self.bs
        if seq.preemptions == 0:
            seq.cached = seq.computed
        self._admit(seq)

    def _stretch_limits(self, head: SimSeq, hit: list[int] | None) -> tuple[int | None, int]:
        """For a head waiting on blocks during a decode stretch: the free blocks the stretch
        may take and its most steps such that the head's cached prefix neither loses a block
        (evicted) nor gains one (published by a decode); ``(None, k)``: no limit."""
        cache = self.cache
        if cache is None:
            return None, 1 << 62
        free = len(cache.empty) + cache.evictions_before(hit or ())
        n = len(hit or ())
        if n < (head.prompt + head.out - 1) // self.bs:  # its first missing block
            step = cache.first_step_publishing(self.running, n, cache.chain(head, n + 1)[n])
            if step is not None:
                return free, step
        return free, 1 << 62

    def _release(self, seq: SimSeq, abort: bool = False) -> None:
        seq.status = 2
        self._free(seq)

    def _preempt(self, seq: SimSeq) -> None:
        self._free(seq)
        seq.computed = 0
        seq.status = 0
        seq.preemptions += 1
        self.num_preemptions += 1
        self.running.remove(seq)
        self.waiting.appendleft(seq)

    def _ensure_blocks(self, seq: SimSeq, num_tokens: int, victims: list[SimSeq]) -> bool:
        while not self._can_allocate(seq, num_tokens):
            if victims:
                self._preempt(victims.pop())
            else:
                self._preempt(seq)
                return False
        self._allocate(seq, num_tokens)
        return True

    def _schedule_running(self, items: list[Item], budget: int, chunk_size: int) -> int:
        queue = [s for s in self.running if not s.is_prefill]
        queue += [s for s in self.running if s.is_prefill]
        used = 0
        while queue and used < budget:
            seq = queue.pop(0)
            remaining = seq.prompt + seq.out - seq.computed
            n = min(remaining, chunk_size, budget - used) if seq.is_prefill else remaining
            if self._ensure_blocks(seq, seq.computed + n, queue):
                items.append((seq, n, False))
                used += n
        return used

    def _admit(self, seq: SimSeq) -> None:
        self.waiting.popleft()
        seq.status = 1
        self.running.append(seq)

    def _all_decoding(self) -> bool:
        return all(s.computed == s.prompt + s.out - 1 for s in self.running)


class ContinuousPolicy(Policy):
    """``scheduler/continuous.py``: decodes, then whole prompts of admitted requests."""

    mode = "continuous"

    def schedule(self) -> list[Item]:
        items: list[Item] = []
        self._schedule_running(items, self.max_num_seqs, chunk_size=1)
        budget = self.budget
        admitted = False
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hit, n = self._cached_prefix(seq)  # n: the rest of the prompt (or recompute)
            if (admitted and n > budget) or not self._can_allocate(seq, seq.num_tokens, hit):
                break
            self._start(seq, seq.num_tokens, hit)
            items.append((seq, n, False))
            budget -= n
            admitted = True
        return items

    def decode_stretch(self) -> tuple[int, bool]:
        if not self.running or not self._all_decoding():
            return 0, True
        free, steps = None, 1 << 62
        if self.waiting:
            if len(self.running) < self.max_num_seqs:
                head = self.waiting[0]
                hit, _n = self._cached_prefix(head)
                if self._can_allocate(head, head.num_tokens, hit):
                    return 0, True
                free, steps = self._stretch_limits(head, hit)
            matter = False
        else:
            matter = len(self.running) < self.max_num_seqs
        return self._block_limited(min(self._steps_to_finish() - 1, steps), free), matter


class ChunkedPolicy(Policy):
    """``scheduler/chunked.py``: a token budget; decodes, prompts under way, new prompts."""

    mode = "chunked"

    def __init__(self, cfg: ServerConfig) -> None:
        super().__init__(cfg)
        self.chunk_size = cfg.chunk_size

    def schedule(self) -> list[Item]:
        items: list[Item] = []
        budget = self.budget
        budget -= self._schedule_running(items, budget, self.chunk_size)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hit, remaining = self._cached_prefix(seq)
            n = min(remaining, self.chunk_size, budget)
            end = seq.num_tokens - remaining + n
            # Never preempt for a newcomer: it waits until blocks are free.
            if not self._can_allocate(seq, end, hit):
                break
            self._start(seq, end, hit)
            items.append((seq, n, False))
            budget -= n
        return items

    def decode_stretch(self) -> tuple[int, bool]:
        b = len(self.running)
        if not b or b > self.budget or not self._all_decoding():
            return 0, True
        left = self.budget - b
        full = b >= self.max_num_seqs or left <= 0
        free, steps = None, 1 << 62
        if self.waiting:
            if not full:
                head = self.waiting[0]
                hit, remaining = self._cached_prefix(head)
                n = min(remaining, self.chunk_size, left)
                if self._can_allocate(head, head.num_tokens - remaining + n, hit):
                    return 0, True
                free, steps = self._stretch_limits(head, hit)
            matter = False
        else:
            matter = not full
        return self._block_limited(min(self._steps_to_finish() - 1, steps), free), matter


class StaticPolicy(Policy):
    """``scheduler/static.py``: a batch runs until its longest member ends; KV reserved."""

    mode = "static"

    def __init__(self, cfg: ServerConfig) -> None:
        super().__init__(cfg)
        self.pad = cfg.static_finished == "pad"
        self.held: list[SimSeq] = []  # finished members whose rows run as padding

    def schedule(self) -> list[Item]:
        items: list[Item] = []
        if not self.running:
            self._take_new_batch(items)
            return items
        for seq in self.running:
            items.append((seq, seq.prompt + seq.out - seq.computed, False))
        for seq in self.held:
            items.append((seq, 1, True))
        return items

    def postprocess(self, items: list[Item], step: int) -> list[SimSeq]:
        done = super().postprocess(items, step)
        if not self.running:
            self._end_batch()
        return done

    def abort(self, seq: SimSeq) -> bool:
        found = super().abort(seq)
        if not self.running:  # its last member was aborted: the padded rows go now
            self._end_batch()
        return found

    def _end_batch(self) -> None:
        for seq in self.held:
            self._free(seq)
        self.held = []

    def _release(self, seq: SimSeq, abort: bool = False) -> None:
        if self.pad and not abort and self.running:
            seq.status = 2
            self.held.append(seq)
            return
        super()._release(seq, abort)

    def _take_new_batch(self, items: list[Item]) -> None:
        budget = self.budget
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hit, n = self._cached_prefix(seq)
            reserve = min(seq.prompt + seq.max_out, self.max_model_len)
            if (items and n > budget) or not self._can_allocate(seq, reserve, hit):
                break
            self._start(seq, reserve, hit)
            items.append((seq, n, False))
            budget -= n

    def decode_stretch(self) -> tuple[int, bool]:
        if not self.running or not self._all_decoding():
            return 0, True
        return self._steps_to_finish() - 1, False

    def advance_decode(self, k: int, step: int) -> None:
        for seq in self.running:  # blocks were reserved at admission
            seq.out += k
            seq.computed += k
            seq.emit(step, k)


_POLICIES: dict[str, type[Policy]] = {
    "static": StaticPolicy,
    "continuous": ContinuousPolicy,
    "chunked": ChunkedPolicy,
}


def make_policy(cfg: ServerConfig) -> Policy:
    """The policy of ``cfg.mode`` (one engine loop; disaggregated mode: ``disagg.py``)."""
    return _POLICIES[cfg.mode](cfg)

"""A request inside the engine, and the unit of work a scheduler hands the model runner.

The contract between the scheduler side (``scheduler/``, ``kv_cache.py``, ``engine.py``) and
the model side (``model_runner.py``): a step is a ``ScheduledBatch`` of ``ScheduledSeq``; each
says "process tokens ``[seq.num_computed_tokens, seq.num_computed_tokens + num_new_tokens)``
of ``seq.token_ids``". A whole prompt, a slice of one (chunked prefill) and a single decode
token are the same thing to the runner. Before the step, the block manager has given
``seq.block_table`` enough blocks to hold ``num_computed_tokens + num_new_tokens`` tokens; the
runner writes their K/V there and reads all earlier K/V from there (blocks of a cached prefix
may be shared with other sequences: the runner only reads those). The runner returns, per
item, the sampled next token when the item reached the end of the known tokens (the last
prompt slice, or a decode step), else ``None``. The scheduler's ``postprocess`` then advances
``num_computed_tokens`` and appends tokens. No torch here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from reference_server.checks import at_least

if TYPE_CHECKING:
    from reference_server.vision import Image

__all__ = ["SamplingParams", "ScheduledBatch", "ScheduledSeq", "SeqStatus", "Sequence"]


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = True  # the default: generate exactly max_tokens, so workloads set lengths

    def __post_init__(self) -> None:
        at_least("max_tokens", self.max_tokens, 1)
        at_least("temperature", self.temperature, 0)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


class SeqStatus(enum.Enum):
    WAITING = "waiting"  # queued, or preempted (its KV freed; it recomputes when readmitted)
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    seq_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_ns: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    status: SeqStatus = SeqStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    finish_reason: str | None = None  # "length" | "stop" | "abort"
    num_preemptions: int = 0
    # Prompt tokens whose K/V came from the prefix cache at first admission (usage's
    # cached_tokens; a recompute after preemption does not change it, as in vLLM).
    num_cached_tokens: int = 0
    block_hashes: list[int] = field(default_factory=list)  # chain hashes of its full blocks
    # Images in the prompt: (position of the first image token, image). Their token ids are
    # placeholders (the prefix cache's key); the runner embeds their tiles instead.
    images: list[tuple[int, Image]] = field(default_factory=list)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_prefill(self) -> bool:
        """True while some prompt tokens (or, after preemption, any tokens) lack K/V."""
        return self.num_computed_tokens < self.num_tokens - (1 if self.output_token_ids else 0)

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int  # process token_ids[num_computed_tokens : num_computed_tokens + this]
    # A finished member of a static batch, computed again only because the batch keeps its
    # shape (a padded row): the runner runs it, postprocess ignores it, nobody gets a token.
    padding: bool = False

    @property
    def completes(self) -> bool:
        """Whether this slice reaches the last known token (so a new token is sampled)."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass
class ScheduledBatch:
    items: list[ScheduledSeq] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        """Tokens through the forward pass, padding rows included."""
        return sum(i.num_new_tokens for i in self.items)

    def token_counts(self) -> tuple[int, int, int]:
        """(prefill, decode, padding) tokens of this step, in one pass over its items."""
        prefill = decode = padding = 0
        for i in self.items:
            n = i.num_new_tokens
            if i.padding:
                padding += n
            elif n > 1 or i.seq.is_prefill:
                prefill += n
            else:
                decode += n
        return prefill, decode, padding

    def step_shape(self) -> tuple[int, int, int, int]:
        """(prefill tokens of slices n > 1, single-token rows, causal attention pairs, cached
        tokens read): ``loadlab.simulate._steptime``'s step features, for the step log. Call it
        before the step runs (it reads ``num_computed_tokens``)."""
        prefill = rows = pairs = kv = 0
        for i in self.items:
            n, start = i.num_new_tokens, i.seq.num_computed_tokens
            if n > 1:
                prefill += n
            else:
                rows += 1
            pairs += start * n + n * (n + 1) // 2
            kv += start
        return prefill, rows, pairs, kv

    @property
    def num_prefill_tokens(self) -> int:
        return self.token_counts()[0]

    @property
    def num_decode_tokens(self) -> int:
        return self.token_counts()[1]

    @property
    def num_padding_tokens(self) -> int:
        return self.token_counts()[2]

    def __bool__(self) -> bool:
        return bool(self.items)

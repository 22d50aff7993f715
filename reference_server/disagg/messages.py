"""The messages of the disaggregated mode: one frozen dataclass per kind.

They cross process boundaries through ``multiprocessing`` queues (pickled; each class lives at
module level so the receiving process can find it). Only KV bytes go through
``torch.distributed``. Who sends what::

    router  -> worker   Add, Abort, Stop; Offer (decode workers only)
    worker  -> router   Up, Failed (start-up); Step, State, Crashed; Ready (prefill);
                        Transfer, Lost (decode)
    decode  -> prefill  Pull
    prefill -> decode   Coming, Gone (the answer to every Pull)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reference_server.sequence import Sequence

__all__ = [
    "Abort",
    "Add",
    "Coming",
    "Crashed",
    "Failed",
    "Gone",
    "Lost",
    "Offer",
    "Pull",
    "Ready",
    "State",
    "Step",
    "StepToken",
    "Stop",
    "ToRouter",
    "ToWorker",
    "Transfer",
    "Up",
]

# (seq_id, token id, finish reason or None): one per sequence a step advanced. A plain tuple,
# not a class: a step carries up to max-num-seqs of them, and this keeps their pickle small.
StepToken = tuple[str, int, str | None]


# -- router -> worker -------------------------------------------------------------------------


@dataclass(frozen=True)
class Add:
    """A new request for a prefill worker."""

    seq: Sequence


@dataclass(frozen=True)
class Abort:
    """Drop the request wherever it is on this worker and free its blocks."""

    seq_id: str


@dataclass(frozen=True)
class Stop:
    """Leave the worker loop (the process then exits)."""


@dataclass(frozen=True)
class Offer:
    """A prefilled request (its tokens so far in ``seq``) that a decode worker may pull from
    the prefill worker of rank ``prefill_rank`` when it has room."""

    seq: Sequence
    prefill_rank: int


# -- worker -> router -------------------------------------------------------------------------


@dataclass(frozen=True)
class Up:
    """The worker has its model and process group; ``info`` is its runner's info and more."""

    rank: int
    info: dict[str, Any]


@dataclass(frozen=True)
class Failed:
    """The worker could not start."""

    rank: int
    error: str


@dataclass(frozen=True)
class Crashed:
    """The worker loop raised; the process exits after sending this."""

    rank: int
    traceback: str


@dataclass(frozen=True)
class State:
    """The worker's KV blocks in use and preemptions so far, and (prefill side) its prefix
    cache: blocks holding a cached prefix, prompt tokens queried and hit (sent when they change)."""

    rank: int
    blocks_used: int
    preemptions: int
    blocks_cached: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0


@dataclass(frozen=True)
class Step:
    """One forward pass: its seconds, tokens by phase and each advanced sequence's token."""

    rank: int
    role: str
    seconds: float
    prefill_tokens: int
    decode_tokens: int
    tokens: list[StepToken]
    # Prefill side: (seq_id, prompt tokens served from the prefix cache) of each sequence
    # whose prefill this step finished with a hit; usage's cached_tokens. Empty on misses.
    cached: tuple[tuple[str, int], ...] = ()
    # For the step log (``ServerStats.log_step``): the step's shape in the simulator's features
    # and its wall clock (perf_counter_ns, one clock for every process on a host) from
    # scheduling to this message.
    shape: tuple[int, int, int, int] = (0, 0, 0, 0)
    start_ns: int = 0
    end_ns: int = 0


@dataclass(frozen=True)
class Ready:
    """Prefill done, first token sent: the request's KV waits on the prefill worker."""

    rank: int
    seq_id: str
    num_computed_tokens: int


@dataclass(frozen=True)
class Transfer:
    """A decode worker received a request's KV: ``nbytes`` in ``seconds`` (receive + copy),
    ``num_tokens`` tokens' worth, of which the first ``cached_tokens`` came from the prefill
    worker's prefix cache (not computed for this request)."""

    rank: int
    seq_id: str
    nbytes: int
    seconds: float
    num_tokens: int = 0
    cached_tokens: int = 0


@dataclass(frozen=True)
class Lost:
    """A decode worker's KV receive failed: the request must end with an error."""

    rank: int
    seq_id: str


# -- between workers --------------------------------------------------------------------------


@dataclass(frozen=True)
class Pull:
    """Decode -> prefill: send me ``seq_id``'s KV (to rank ``dst``, with this ``tag``)."""

    seq_id: str
    dst: int
    tag: int


@dataclass(frozen=True)
class Coming:
    """Prefill -> decode: the send of ``num_tokens`` tokens' KV is posted with ``tag``; the
    first ``cached_tokens`` of them were served from the prefill worker's prefix cache."""

    seq_id: str
    tag: int
    num_tokens: int
    cached_tokens: int = 0


@dataclass(frozen=True)
class Gone:
    """Prefill -> decode: the request was aborted; nothing will be sent."""

    seq_id: str


ToWorker = Add | Abort | Stop | Offer | Pull | Coming | Gone
ToRouter = Up | Failed | Crashed | State | Step | Ready | Transfer | Lost

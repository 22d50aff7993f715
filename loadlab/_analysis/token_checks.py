"""Did the server get the work that was asked for? Prompt lengths and output lengths.

Pure functions of records:

- prompt-length match: requests whose requested prompt length (``prompt_tokens_requested``)
  and server-counted one (``prompt_tokens``, from ``usage``) are both known, first turns only
  (a later chat turn is counted by the server with its whole history): how many are exact,
  off by one, and off by more;
- short outputs: ok requests that ended with a natural stop (``finish_reason`` ``stop``,
  Anthropic ``end_turn`` or ``stop_sequence``) before ``max_tokens``. Their TPOT and E2E are
  of shorter answers than asked: the summary counts them beside the percentiles.

Example::

    >>> from loadlab.records import RequestRecord
    >>> r = RequestRecord("a", prompt_tokens_requested=100, prompt_tokens=102)
    >>> prompt_match([r]).missed
    1
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from loadlab._analysis.metrics import output_token_count
from loadlab.records import RequestRecord

__all__ = [
    "MISS_RATE_WARN",
    "STOP_REASONS",
    "PromptMatch",
    "is_short",
    "prompt_match",
    "prompt_warning",
    "short_outputs",
]

STOP_REASONS = frozenset({"stop", "end_turn", "stop_sequence", "eos"})
MISS_RATE_WARN = 0.01  # loadlab run warns above 1 % of requests off by more than one token


@dataclass(frozen=True)
class PromptMatch:
    """Requested against server-counted prompt lengths, over first-turn records with both."""

    compared: int
    exact: int
    off_by_one: int
    missed: int  # off by more than one token
    worst: int  # the largest ``server - requested``, signed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def prompt_match(records: Iterable[RequestRecord]) -> PromptMatch:
    """How many first-turn prompts the server counted at exactly the requested length."""
    compared = exact = one = 0
    worst = 0
    for r in records:
        if r.turn != 0 or r.prompt_tokens is None or r.prompt_tokens_requested is None:
            continue
        compared += 1
        diff = r.prompt_tokens - r.prompt_tokens_requested
        exact += diff == 0
        one += abs(diff) == 1
        if abs(diff) > abs(worst):
            worst = diff
    return PromptMatch(
        compared=compared, exact=exact, off_by_one=one, missed=compared - exact - one, worst=worst
    )


def prompt_warning(match: PromptMatch) -> str | None:
    """The line ``loadlab run`` prints when more than 1 % miss by more than one token."""
    n, missed = match.compared, match.missed
    if not n or missed / n <= MISS_RATE_WARN:
        return None
    return (
        f"loadlab run: {missed} of {n} requests' prompts were counted by the server more than "
        f"one token away from the requested length (worst {match.worst:+d}); the load is not "
        "what was asked: give --tokenizer with the model's tokenizer folder or tokenizer.json"
    )


def is_short(r: RequestRecord) -> bool:
    """An ok answer that stopped by itself before ``max_tokens``."""
    return (
        r.ok
        and r.max_tokens is not None
        and r.finish_reason in STOP_REASONS
        and output_token_count(r) < r.max_tokens
    )


def short_outputs(records: Iterable[RequestRecord]) -> int:
    """How many ok answers stopped before ``max_tokens`` (``is_short``)."""
    return sum(1 for r in records if is_short(r))

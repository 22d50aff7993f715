"""Prompts of exactly N tokens as the server counts them, chat template included.

A workload first writes each prompt by a characters-per-token estimate (``prompts``); this
module then cuts or extends it until the server's count is exactly the requested
``spec.prompt_tokens``. ``count`` is whatever knows that count: a local tokenizer
(``loadlab.workloads._tokenizers``: encode + chat template, microseconds) or the server itself
(``loadlab.clients._counting``: ``/tokenize``, ``count_tokens``). Which of them, for which
endpoint, is a ``Sizing``, made once per endpoint before the requests are built
(``loadlab._runner.prompt_sizing``) and passed to ``build_requests``.

The search (``fit_prompt``) is over prefixes of a source text: the workload's prompt (its
request tag first, so prompts stay unique; Mooncake prefix blocks first, so shared prefixes
stay shared) followed by filler cut from the corpus at an offset fixed by the request id.
The count of a prefix grows with its length, so a bracketing search (interpolation, halving
when that stalls) finds the shortest prefix counted as N in a handful of counts. When no
prefix counts exactly N (a merge jumps over it), the closest one below is used; the record's
``prompt_tokens`` from the server then shows the miss and the summary counts it.

Later turns of a chat session are sent after the history the server actually returned, which
is not known when the prompt is built: they are fitted on their own text only, and the
prompt-length match is judged on first turns and independent requests
(``loadlab._analysis.token_checks.prompt_match``).

Example::

    >>> fit = fit_prompt("abcdefghij" * 10, 7, lambda t: len(t) + 2)
    >>> fit.text, fit.counted
    ('abcde', 7)
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from loadlab.records import RequestSpec
from loadlab.workloads._base import RequestStream
from loadlab.workloads._params import WorkloadError
from loadlab.workloads._prompts import prompt_text
from loadlab.workloads._tokenizers import SERVER_METHODS, AnyTokens, ByteTokens, load_tokenizer
from loadlab.workloads._tokenizers import chars_per_token as chars_per_token_of

__all__ = [
    "Fit",
    "FitTally",
    "PromptFitter",
    "Sizing",
    "draft_chars_per_token",
    "exact_prompts",
    "fit_prompt",
    "local_sizing",
    "tokenizer_sizing",
]

_ONE_MORE = (".", ",", "!", "?", ";", ":")
# What a prefix that counts a few short of N is tried with: punctuation a token each in most
# vocabularies, one to three marks (a cut "an.  could" jumps from N-2 to N+1)
_TAILS = (
    _ONE_MORE
    + tuple(a + b for a in _ONE_MORE for b in _ONE_MORE if a != b)
    + tuple(
        a + b + c
        for a, b, c in zip(
            _ONE_MORE, _ONE_MORE[1:] + _ONE_MORE[:1], _ONE_MORE[2:] + _ONE_MORE[:2], strict=True
        )
    )
)
MAX_COUNTS = 48  # per prompt: a bracketing search over a few thousand characters needs ~12


@dataclass(frozen=True)
class Fit:
    text: str
    counted: int  # the count of ``text`` (the requested count when exact)
    counts: int  # how many times ``count`` was called


@dataclass
class FitTally:
    """What a fitter did, for ``results.extra["workload"]["prompt_fit"]`` (every fitter
    reports these three): prompts fitted, how many of them count exactly as asked, and the
    calls to ``count`` they took."""

    fitted: int = 0
    exact: int = 0
    counts: int = 0

    def add(self, fit: Fit, tokens: int) -> Fit:
        """Tallies ``fit``, a fit to ``tokens``, and returns it."""
        self.fitted += 1
        self.exact += fit.counted == tokens
        self.counts += fit.counts
        return fit

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def _prefix(source: str, k: int) -> str:
    # no trailing whitespace: servers and templates may strip it, changing the count
    return source[:k].rstrip()


def fit_prompt(
    source: str,
    tokens: int,
    count: Callable[[str], int],
    guess_chars: int | None = None,
    whole_count: int | None = None,
) -> Fit:
    """The shortest prefix of ``source`` that ``count`` counts as ``tokens`` (else the
    closest below it, else the closest above). ``source`` must be long enough: its whole
    count (``whole_count`` when the caller has it) should reach ``tokens``."""
    seen: dict[int, int] = {} if whole_count is None else {len(source): whole_count}

    def f(k: int) -> int:
        if k not in seen:
            seen[k] = count(_prefix(source, k))
        return seen[k]

    lo, hi = 1, len(source)
    k: int | None = guess_chars if guess_chars is not None and lo < guess_chars < hi else None
    if k is not None and f(k) == tokens:  # a good guess (token offsets) is usually exact
        return Fit(_prefix(source, k), tokens, len(seen))
    if f(hi) <= tokens:
        return Fit(_prefix(source, hi), f(hi), len(seen))
    if f(lo) >= tokens:
        return Fit(_prefix(source, lo), f(lo), len(seen))
    halve = False
    while hi - lo > 1 and len(seen) < MAX_COUNTS:
        if k is None and halve:
            k = (lo + hi) // 2
        elif k is None:  # interpolate between the bracket's counts
            flo, fhi = f(lo), f(hi)
            k = lo + round((tokens - flo) * (hi - lo) / max(1, fhi - flo))
            k = min(max(k, lo + 1), hi - 1)
        width = hi - lo
        fk = f(k)
        if fk == tokens:
            break
        lo, hi = (k, hi) if fk < tokens else (lo, k)
        halve = (hi - lo) * 2 > width  # interpolation stalled: bisect next
        k = None
    # shortest exact prefix among those counted, else the closest below, else above
    exact = [k for k, c in seen.items() if c == tokens]
    if exact:
        return Fit(_prefix(source, min(exact)), tokens, len(seen))
    below = [k for k, c in seen.items() if c < tokens]
    if below:
        k = max(below, key=lambda k: (seen[k], -k))
        if tokens - seen[k] <= 3:  # a merge jumped over N: punctuation counts a token or so
            tried = 0
            for tail in _TAILS:
                text = _prefix(source, k) + tail
                tried += 1
                if count(text) == tokens:
                    return Fit(text, tokens, len(seen) + tried)
        return Fit(_prefix(source, k), seen[k], len(seen))
    k = min(seen, key=lambda k: (seen[k], k))
    return Fit(_prefix(source, k), seen[k], len(seen))


def _filler(request_id: str, chars: int) -> str:
    """Corpus text for extending a prompt, at an offset fixed by the request id."""
    rng = np.random.default_rng(zlib.crc32(request_id.encode()))
    return prompt_text(chars, rng)


class PromptFitter:
    """Rewrites specs so each prompt counts exactly ``spec.prompt_tokens`` under ``count``.

    ``count(text) -> int | None`` counts a first-turn prompt as the server will (template
    included); ``count_text(text) -> int | None`` counts bare text (a later chat turn).
    ``chars_per_token`` is the starting guess; it is re-estimated from every fit.
    """

    def __init__(
        self,
        count: Callable[[str], int],
        count_text: Callable[[str], int] | None = None,
        *,
        chars_per_token: float = 4.0,
        token_ends: Callable[[str], list[int]] | None = None,
    ) -> None:
        self.count, self.count_text = count, count_text
        self.token_ends = token_ends  # end offset of each token of a text: exact first guesses
        self.chars_per_token = chars_per_token  # of the message text, overhead excluded
        self._overhead: int | None = None  # the count of a one-character message, less one
        self.tally = FitTally()
        self.cut_only = 0
        self._asking = True

    def stop_asking(self) -> None:
        """From now on cut prompts by the learned characters per token instead of counting
        (a server counter: its blocking calls must not run while the load is on)."""
        self._asking = False

    def fit(self, spec: RequestSpec) -> RequestSpec:
        n = spec.prompt_tokens
        count = self.count if spec.turn == 0 else self.count_text
        if n is None or count is None or spec.inputs:  # embeddings / rerank: sized per input
            return spec
        if not self._asking:
            self.cut_only += 1
            chars = max(1, round((n - (self._overhead or 0)) * self.chars_per_token))
            text = spec.prompt + " " + _filler(spec.request_id, chars)
            return dataclasses.replace(spec, prompt=_prefix(text, chars))
        if self._overhead is None:
            self._overhead = max(0, self.count(".") - 1)
        body = max(1, n - (self._overhead if spec.turn == 0 else 0))
        chars = max(64, round(body * self.chars_per_token * 1.25) + 64)
        source, whole, guess = spec.prompt, None, None
        for _ in range(8):  # make the source long enough to count more than n
            if len(source) < chars:
                source = source + " " + _filler(spec.request_id, chars - len(source))
            if self.token_ends is not None:  # its tokens say where the n-th one ends
                ends = self.token_ends(source)
                if len(ends) > body + 8:
                    guess = ends[body - 1]
                    break
            else:
                whole = count(_prefix(source, len(source)))
                if whole > n:
                    guess = round(body * self.chars_per_token)
                    break
            chars *= 2
        else:
            return spec  # the count does not grow with the text: leave it (the record shows)
        fit = self.tally.add(fit_prompt(source, n, count, guess, whole), n)
        self.chars_per_token = 0.8 * self.chars_per_token + 0.2 * len(fit.text) / body
        return dataclasses.replace(spec, prompt=fit.text)

    def fit_all(self, specs: Iterable[RequestSpec]) -> Iterator[RequestSpec]:
        for spec in specs:
            yield self.fit(spec)

    def extra(self) -> dict[str, int]:
        """What the fitting did, for ``results.extra["workload"]["prompt_fit"]``."""
        return {**self.tally.to_dict(), "cut_by_chars": self.cut_only}


@dataclass(frozen=True)
class Sizing:
    """How one endpoint's prompts are sized: the first draft's characters per token, and what
    fits each prompt exactly after it (``fitter``; None: the draft is sent as it is).

    Made once per endpoint before any request is built (``loadlab._runner.prompt_sizing``)
    and handed to ``build_requests``: the workloads hold no sizing of their own."""

    method: str  # for results.extra["workload"]["prompt_fit"] and messages
    chars_per_token: float
    fitter: Callable[[], PromptFitter] | None
    remote: bool = False  # the fitter asks the server: stop asking once the run starts
    warning: str | None = None  # one line ``loadlab run`` prints (auto found nothing to count)
    tokens: AnyTokens | None = None  # the tokenizer itself, when loadlab holds it


def local_sizing(tok: AnyTokens, api: str, prefix: str = "tokenizer") -> Sizing:
    """Sizing by a tokenizer loadlab holds: counts in microseconds, no request."""
    return Sizing(
        f"{prefix} {tok.name}",
        chars_per_token_of(tok),
        lambda: PromptFitter(
            lambda t: tok.count_prompt(t, api) or 0,
            lambda t: len(tok.encode(t)),
            chars_per_token=1.0 if isinstance(tok, ByteTokens) else 4.0,
            token_ends=getattr(tok, "token_ends", None),
        ),
        tokens=tok,
    )


def tokenizer_sizing(spec: str, api: str) -> Sizing | None:
    """The sizing by the tokenizer ``spec`` names (a folder, a file, ``byte``...) for ``api``;
    None when only the endpoint can count (a method such as ``auto``, or a tokenizer without
    the chat template a chat API needs)."""
    if spec in SERVER_METHODS or spec == "none":
        return None
    tok = load_tokenizer(spec)
    return local_sizing(tok, api) if tok.count_prompt("x", api) is not None else None


def draft_chars_per_token(params: Mapping[str, Any], how: Sizing | None) -> float:
    """Characters per token of a workload's first drafts: its ``chars_per_token`` key, else
    the sizing's, else 1.0 (the reference server's byte tokenizer)."""
    if params.get("chars_per_token") is not None:
        cpt = float(params["chars_per_token"])
    else:
        cpt = how.chars_per_token if how is not None else 1.0
    if not cpt > 0:
        raise WorkloadError(f"workload.chars_per_token must be > 0, got {cpt}")
    return cpt


def exact_prompts(stream: RequestStream, how: Sizing | None) -> RequestStream:
    """``stream`` with every prompt fitted to its requested token count (unchanged without a
    sizing, or with one that only estimates)."""
    if how is None or how.fitter is None:
        if how is None:
            return stream
        return RequestStream(
            stream, lambda: {**stream.extra(), "prompt_fit": {"method": how.method}}
        )
    fitter = how.fitter()
    return RequestStream(
        fitter.fit_all(stream),
        lambda: {**stream.extra(), "prompt_fit": {"method": how.method, **fitter.extra()}},
        # past the read-ahead (built before the run starts), no blocking call on the hot path
        ready=fitter.stop_asking if how.remote else None,
    )

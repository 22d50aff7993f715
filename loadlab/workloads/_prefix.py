"""Shared-prefix workload: a shared system prompt, or pools of prefixes each reused by many
requests, so a server's prefix cache has something to hit, and the run knows how much.

Every prompt is one of ``prefixes`` (P) prefix texts of ``prefix_tokens`` (N) tokens, a newline,
then a suffix unique to the request (``suffix_tokens``, a number or a distribution). P = 1 is
a shared system prompt (AIPerf's ``--shared-system-prompt-length``); P > 1 with
``requests_per_prefix`` (M) is a prefix pool (vLLM bench's ``prefix_repetition``, SGLang's
``generated-shared-prefix``). ``order`` says how the P·M requests are sent: ``grouped`` (all M
of prefix 0, then prefix 1, ...), ``round_robin`` (0, 1, ..., P-1, 0, ...) or ``random`` (a
seeded shuffle, each prefix still exactly M times).

Cold or warm on purpose: the prefix texts depend only on the seed (and ``salt``), so a second
run with the same seed finds them cached. ``cache_bust = true`` puts a salt unique to the run at
the front of every prompt, so the run starts cold whatever ran before; ``salt = "..."`` fixes
one (two runs with the same salt share their prefixes: the second starts warm). The salt
follows each prefix's 5-character tag (``P0000``), so the prefixes of one run differ from
their first characters and share no block through their common salt.

With a tokenizer loadlab holds (``tokenizer = DIR``, ``--tokenizer``; one with a chat template
for a chat API) the workload fits its own prompts in the server's tokens: each prefix text is
cut so that the prompt's first N tokens as the server counts them (the chat template's opening,
or BOS, included) end where it does, and each whole prompt is N + S tokens, template included.
A 256-token prefix is then 16 whole 16-token blocks of vLLM's cache. (Other sizings, such as
``server`` or ``auto``, fit each whole prompt afterwards, like any workload.)

Each spec carries ``shared_prefix_tokens``: how many of its leading tokens an earlier prompt of
this run already had. With such a tokenizer it is the exact longest common prefix of the
prompt's token ids with every earlier prompt's; on the reference server without one
(``chars_per_token = 1``: its byte tokenizer makes one ASCII character one token) the same in
characters; with another ``chars_per_token`` it is N when the prefix was sent before, else 0,
assuming the tokenizer encodes the prefix the same way in every prompt (the newline keeps the
suffix's first word from merging with it). ``loadlab._analysis.prefix_cache`` turns these into the
expected hit rate (block-aligned with ``block_size``) that the report sets beside the measured.

``[workload]`` keys (kind = "prefix")::

    prefix_tokens        N, tokens per prefix (default 1024)
    prefixes             P, distinct prefixes (default 1: a shared system prompt)
    requests_per_prefix  M (default: the run's requests / P, rounded up; none: endless)
    suffix_tokens        number or distribution (default 64)
    output_tokens        number or distribution (default: the run's max_tokens)
    order                "random" (default) | "grouped" | "round_robin"
    cache_bust           true: a salt unique to this run after the tag at the front of every prompt
    salt                 a fixed salt (reproducible warm starts; with cache_bust: the salt
                         drawn for this run, once for all its worker processes)
    block_size           the server's KV block size, for the block-aligned expected hit rate
                         (the reference server's and vLLM's default: 16)
    request_class, max_output_tokens, exact_output, chars_per_token  (as for synthetic)

Example::

    cfg = RunConfig(concurrency=4, requests=8, workload={"kind": "prefix", "prefixes": 2,
                    "prefix_tokens": 256, "order": "grouped", "block_size": 16})
    [s.shared_prefix_tokens for s in prefix_requests(cfg)]  # [0, 256+, ...] per group
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loadlab.config import RunConfig
from loadlab.records import RequestSpec
from loadlab.workloads._base import (
    COMMON_KEYS,
    RequestStream,
    caps,
    check_common,
    clamp,
    common_extra_body,
    counter,
    int_stream,
    open_loop_times,
    rng_for,
    run_salt,
    text_seed,
    with_run_salt,
)
from loadlab.workloads._exact import FitTally, Sizing, draft_chars_per_token, fit_prompt
from loadlab.workloads._lengths import parse_dist
from loadlab.workloads._params import WorkloadError, check_keys, get_bool, get_int
from loadlab.workloads._prompts import prompt_text, text_chars
from loadlab.workloads._tokenizers import AnyTokens
from loadlab.workloads._tokenizers import chars_per_token as chars_per_token_of

__all__ = [
    "KEYS",
    "ORDERS",
    "PrefixPlan",
    "fits_itself",
    "prefix_requests",
    "validate",
    "with_run_salt",
]

KEYS = COMMON_KEYS | {
    "prefix_tokens",
    "prefixes",
    "requests_per_prefix",
    "suffix_tokens",
    "output_tokens",
    "order",
    "block_size",
}
ORDERS = ("random", "grouped", "round_robin")
_EXACT_LIMIT = 200_000  # prompts kept for the exact common-prefix search (then: by design)


class PrefixPlan:
    """Which prefix each request uses, in send order (``None`` total: endless)."""

    def __init__(self, prefixes: int, per_prefix: int | None, order: str, seed: int) -> None:
        self.prefixes, self.per_prefix, self.order = prefixes, per_prefix, order
        self.rng = rng_for(seed, "prefix")

    @property
    def total(self) -> int | None:
        return None if self.per_prefix is None else self.prefixes * self.per_prefix

    def __iter__(self) -> Iterator[int]:
        p, m = self.prefixes, self.per_prefix
        if m is None:  # endless: grouped cannot end a group, so it cycles like round_robin
            if self.order == "random":
                while True:
                    yield from (int(x) for x in self.rng.integers(0, p, 1024))
            for i in counter(None):
                yield i % p
        elif self.order == "grouped":
            yield from (j for j in range(p) for _ in range(m))
        elif self.order == "round_robin":
            yield from (i % p for i in range(p * m))
        else:
            yield from (int(x) for x in self.rng.permutation(np.repeat(np.arange(p), m)))


def validate(cfg: RunConfig, params: Mapping[str, Any], bases: Sequence[Path] = ()) -> None:
    check_keys("prefix", params, KEYS)
    for key in ("suffix_tokens", "output_tokens"):
        if key in params:
            parse_dist(params[key], key, bases=bases)
    get_int(params, "prefix_tokens", 1024)
    get_int(params, "prefixes", 1)
    get_int(params, "requests_per_prefix", None)
    get_int(params, "block_size", None)
    if params.get("order", "random") not in ORDERS:
        raise WorkloadError(
            f"workload.order = {params['order']!r}: choose one of {', '.join(ORDERS)}"
        )
    if "max_prompt_tokens" in params:
        raise WorkloadError(
            "workload.max_prompt_tokens: a prefix workload's prompt is prefix_tokens + "
            "suffix_tokens; bound suffix_tokens instead"
        )
    check_common(params, bases)


def _prefix_texts(n: int, tokens: int, salt: str, seed: int, cpt: float) -> list[str]:
    """The P prefix texts: each starts with its own tag, then the salt, so two differ within
    their first few characters (not only after a salt they share) and none matches another
    run's past its tag (with another salt)."""
    rng = rng_for(seed, "prefix_text")
    tail = f" {salt}" if salt else ""
    return [prompt_text(tokens, rng, tag=f"P{j:04d}{tail}", chars_per_token=cpt) for j in range(n)]


class _SharedPrefixes:
    """Leading tokens of each new prompt already seen in an earlier one. Exact (longest
    common prefix against every earlier prompt, by its neighbours in sorted order) when
    ``add`` is given the prompt's token ids, or its text when one character is one token;
    else by design: N when the prompt's prefix was sent before."""

    def __init__(self, exact: bool, prefix_tokens: int) -> None:
        self.exact, self.prefix_tokens = exact, prefix_tokens
        self._sorted: list[Any] = []  # texts or tuples of token ids, never both
        self._seen: set[int] = set()

    def add(self, prompt: str | tuple[int, ...], prefix_id: int) -> int:
        by_design = self.prefix_tokens if prefix_id in self._seen else 0
        self._seen.add(prefix_id)
        if not self.exact or len(self._sorted) >= _EXACT_LIMIT:
            return by_design
        i = bisect.bisect_left(self._sorted, prompt)
        shared = max((_common(prompt, self._sorted[j]) for j in (i - 1, i)
                      if 0 <= j < len(self._sorted)), default=0)  # fmt: skip
        self._sorted.insert(i, prompt)
        return shared


def _common(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _local_tokens(cfg: RunConfig, sizing: Sizing | None) -> tuple[AnyTokens, str] | None:
    """The run's tokenizer and API when loadlab holds one that gives the prompt's token ids
    (the sizing's: ``--tokenizer DIR``, a chat template for a chat API); None otherwise."""
    tok = sizing.tokens if sizing is not None else None
    if tok is None:
        return None
    api = cfg.endpoints[0].api if cfg.endpoints else "chat"
    return (tok, api) if tok.prompt_ids("x", api) is not None else None


def fits_itself(cfg: RunConfig, sizing: Sizing | None) -> bool:
    """A prefix workload with a local tokenizer fits its own prompts (prefix and whole prompt
    exact in tokens); ``build_requests`` must not refit them."""
    return cfg.workload.get("kind") == "prefix" and _local_tokens(cfg, sizing) is not None


class _TokenFit:
    """Prompts exact in the server's tokens: each prefix is the prompt's first N tokens (the
    chat template's opening included), each whole prompt N + S tokens (template included),
    and the tokens an earlier prompt shared are counted on the ids themselves."""

    def __init__(self, tok: AnyTokens, api: str) -> None:
        self.tok, self.api = tok, api
        self.chars_per_token = chars_per_token_of(tok)
        a, b = self.ids("Alpha one"), self.ids("Zulu two")
        opening = _common(a, b)  # the template's tokens before the message
        # after it (the generation prompt): a whole prompt less the opening and the text
        self.closing = max(0, len(a) - opening - len(tok.encode("Alpha one")))
        self.tally = FitTally()

    def ids(self, text: str) -> tuple[int, ...]:
        return tuple(self.tok.prompt_ids(text, self.api) or ())

    def count(self, text: str) -> int:
        return len(self.tok.prompt_ids(text, self.api) or ())

    def fit(self, source: str, tokens: int, start: int = 0) -> str:
        """The shortest ``source[:k]`` whose prompt counts ``tokens`` (else the closest
        below); never shorter than ``start + 1`` characters (a suffix too short to fit keeps
        the newline after its prefix). ``source`` must count more."""
        fit = self.tally.add(fit_prompt(source, tokens, self.count, None), tokens)
        return fit.text if len(fit.text) > start else source[: start + 1]

    def prefix(self, source: str, tokens: int) -> str:
        # the prompt's first N tokens end where its text does, before the closing tokens
        return self.fit(source, tokens + self.closing)

    def extra(self) -> dict[str, Any]:
        return {
            "method": f"tokenizer {self.tok.name} (prefixes and prompts fitted by the workload)",
            **self.tally.to_dict(),
        }


def prefix_requests(cfg: RunConfig, sizing: Sizing | None = None) -> RequestStream:
    params = cfg.workload
    chars_per_token = draft_chars_per_token(params, sizing)
    validate(cfg, params)
    n_prefixes = get_int(params, "prefixes", 1)
    prefix_tokens = get_int(params, "prefix_tokens", 1024)
    per_prefix = get_int(params, "requests_per_prefix", None)
    if per_prefix is None and cfg.requests is not None:
        per_prefix = -(-cfg.requests // n_prefixes)
    plan = PrefixPlan(n_prefixes, per_prefix, str(params.get("order", "random")), cfg.request_seed)
    suffix_dist = parse_dist(params.get("suffix_tokens", 64), "suffix_tokens")
    output_dist = parse_dist(params.get("output_tokens", cfg.max_tokens), "output_tokens")
    _, max_output = caps(params)
    cls = str(params.get("request_class", "prefix"))
    salt = run_salt(params)
    times = open_loop_times(cfg, plan.total)
    n = len(times) if times is not None else plan.total
    local = _local_tokens(cfg, sizing)
    fitter = _TokenFit(*local) if local is not None else None
    if fitter is not None:  # drafts long enough to count more than N, then cut to N
        chars_per_token = fitter.chars_per_token
        drafts = _prefix_texts(
            n_prefixes, round(prefix_tokens * 1.5) + 64, salt, text_seed(cfg), chars_per_token
        )
        texts = [fitter.prefix(d, prefix_tokens) for d in drafts]
    else:
        texts = _prefix_texts(n_prefixes, prefix_tokens, salt, text_seed(cfg), chars_per_token)
    exact = chars_per_token == 1.0 or fitter is not None
    sent = {"requests": 0}

    def specs() -> Iterator[RequestSpec]:
        suffixes = int_stream(suffix_dist, rng_for(cfg.request_seed, "prompt"))
        outputs = int_stream(output_dist, rng_for(cfg.request_seed, "output"))
        text_rng = rng_for(text_seed(cfg), "text")
        shared = _SharedPrefixes(exact, prefix_tokens)
        for i, j in zip(counter(n), plan, strict=False):
            rid = f"pfx-{i:06d}"
            s_tok = clamp(next(suffixes), None)
            out = clamp(next(outputs), max_output)
            # "\n" + the suffix's text: s_tok tokens in all, the newline one of them
            chars = text_chars(s_tok, chars_per_token)
            # the tag starts with the fastest-changing digit: suffixes differ at once
            tag = "q" + f"{i:06d}"[::-1]
            if fitter is None:
                body = prompt_text(chars - 1, text_rng, tag=tag) if chars > 1 else ""
                prompt = texts[j] + "\n" + body
            else:  # a longer draft, cut where the whole prompt counts N + S
                body = prompt_text(round(chars * 1.5) + 32, text_rng, tag=tag)
                prompt = fitter.fit(texts[j] + "\n" + body, prefix_tokens + s_tok, len(texts[j]))
            sent["requests"] = i + 1
            yield RequestSpec(
                request_id=rid,
                prompt=prompt,
                max_tokens=out,
                intended_at_s=times[i] if times is not None else None,
                prompt_tokens=prefix_tokens + s_tok,
                request_class=cls,
                extra_body=common_extra_body(params, out),
                shared_prefix_tokens=shared.add(
                    prompt if fitter is None else fitter.ids(prompt), j
                ),
            )

    def extra() -> dict[str, Any]:
        return {
            "kind": "prefix",
            "prefixes": n_prefixes,
            "prefix_tokens": prefix_tokens,
            "requests_per_prefix": per_prefix,
            "order": plan.order,
            "salt": salt,
            "cache_bust": get_bool(params, "cache_bust", False),
            "block_size": get_int(params, "block_size", None),
            **({"prompt_fit": fitter.extra()} if fitter is not None else {}),
            "shared_prefix_basis": (
                f"exact: longest common prefix of the prompts' token ids ({fitter.tok.name}, "
                "chat template included)"
                if fitter is not None
                else "exact: longest common prefix in characters, 1 character = 1 token "
                "(the reference server's byte tokenizer)"
                if exact
                else f"by design: {prefix_tokens} tokens once a prefix was sent, assuming the "
                "tokenizer encodes it alike in every prompt"
            ),
            "built": sent["requests"],
        }

    return RequestStream(specs(), extra)

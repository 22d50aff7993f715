"""Prompt text of an exact token length, and shared prefixes from Mooncake hash ids.

On the reference server (byte tokenizer; the chat template joins message contents with "\\n"
and adds no role markers) an ASCII prompt of N characters is exactly N prompt tokens, so a
prompt of ``tokens`` tokens is ``round(tokens * chars_per_token)`` characters with
``chars_per_token = 1``. For another endpoint this text is a first draft that
``loadlab.workloads._exact`` cuts to exactly the requested count under the run's ``tokenizer``
(``--tokenizer``). ``chars_per_token`` alone (or measured by ``calibrate_chars_per_token``,
``chars_per_token_from_tokenizer``) gives approximate lengths; the achieved ones are in the
records.

Text is ASCII English words cut from one fixed 1 MiB corpus (built from a fixed seed, so
every run and machine sees the same corpus). A request's text starts with a tag unique to it
(``request_tag``) so two requests never share a prefix by accident (a prefix cache would
otherwise make them cheaper than production traffic). Mooncake prefix blocks: block id ``h``
always maps to the same 512-token block text, which starts with ``<h>``; equal ids give
identical prefixes, different ids differ within their first characters.

Example::

    >>> rng = np.random.default_rng(0)
    >>> len(prompt_text(100, rng, tag="r1"))
    100
    >>> prefix_prompt([7, 8], 700)[:512] == prefix_prompt([7, 9], 600)[:512]
    True
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from loadlab.errors import CalibrationError
from loadlab.records import RequestSpec
from loadlab.workloads._params import WorkloadError

__all__ = [
    "BLOCK_TOKENS",
    "CalibrationError",
    "block_text",
    "calibrate_chars_per_token",
    "chars_per_token_from_tokenizer",
    "corpus",
    "prefix_prompt",
    "prompt_text",
    "salted",
    "text_chars",
]

BLOCK_TOKENS = 512  # Mooncake's prefix block size
CORPUS_CHARS = 1 << 20
_CORPUS_SEED = 20250101  # fixed: the corpus is part of the format, not of a run

_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there one all we their been has when who will "
    "more no if out so said what up its about into than them can only other new some could "
    "time these two may then do first any my now such like our over man me even most made "
    "after also did many before must through back years where much your way well down "
    "should because each just those people how too little state good very make world still "
    "own see men work long get here between both life being under never day same another "
    "know while last might us great old year off come since against go came right used take "
    "three model token server latency request stream batch cache memory queue decode prefill "
    "throughput kernel tensor layer attention block schedule policy budget window sample"
).split()


@lru_cache(maxsize=1)
def corpus() -> str:
    """The fixed 1 MiB ASCII corpus every prompt is cut from."""
    rng = np.random.default_rng(_CORPUS_SEED)
    idx = rng.integers(0, len(_WORDS), CORPUS_CHARS // 3).tolist()
    text = " ".join([_WORDS[i] for i in idx])
    # sentence punctuation makes the text less uniform for real tokenizers
    text = text.replace(" the ", ". The ", 4000)
    return text[:CORPUS_CHARS]


def text_chars(tokens: int, chars_per_token: float = 1.0) -> int:
    """Characters for a prompt of ``tokens`` tokens (at least 1)."""
    return max(1, round(tokens * chars_per_token))


def _cut(offset: int, n: int) -> str:
    c = corpus()
    offset %= len(c)
    if offset + n <= len(c):
        return c[offset : offset + n]
    reps = (offset + n) // len(c) + 1
    return (c * reps)[offset : offset + n]


def _tidy_end(text: str) -> str:
    # no trailing whitespace: some servers strip it, which would change the token count
    return text[:-1] + "." if text.endswith(" ") else text


def prompt_text(
    tokens: int, rng: np.random.Generator, *, tag: str = "", chars_per_token: float = 1.0
) -> str:
    """ASCII text of exactly ``text_chars(tokens, chars_per_token)`` characters, starting
    with ``tag`` (made unique per request by the caller) and a seeded cut of the corpus."""
    n = text_chars(tokens, chars_per_token)
    head = f"{tag} " if tag else ""
    body = _cut(int(rng.integers(0, CORPUS_CHARS)), max(0, n - len(head)))
    return _tidy_end((head + body)[:n])


def salted(text: str, salt: str) -> str:
    """``text`` with ``salt`` after its first word (a request's tag, a Mooncake block's id),
    the end cut so the length stays: a prompt no earlier run sent, of the same size and shape.
    Prompts that began alike (a shared block) still do, and the salt shares no block by
    itself, since each prompt's own first word comes before it.

    >>> salted("r1 the cat sat on the mat", "ab12")
    'r1 ab12 the cat sat on th'
    >>> len(salted("x" * 40, "ab12")) == 40
    True
    """
    if not salt or not text:
        return text
    word = text.find(" ")
    at = word + 1 if 0 <= word < 32 else 0
    return _tidy_end((text[:at] + salt + " " + text[at:])[: len(text)])


def _block_offset(block_id: int, seed: int) -> int:
    # splitmix64 finaliser: a well-spread, deterministic offset per (id, seed)
    z = (block_id * 0x9E3779B97F4A7C15 + seed * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) % CORPUS_CHARS


@lru_cache(maxsize=4096)
def block_text(
    block_id: int, *, seed: int = 0, chars_per_token: float = 1.0, block_tokens: int = BLOCK_TOKENS
) -> str:
    """The text of one prefix block (512 tokens, Mooncake's, unless ``block_tokens`` says
    otherwise): the same for the same id (and seed)."""
    n = text_chars(block_tokens, chars_per_token)
    head = f"<{block_id}> "
    return (head + _cut(_block_offset(block_id, seed), n))[:n]


def prefix_prompt(
    hash_ids: Sequence[int],
    tokens: int,
    *,
    seed: int = 0,
    chars_per_token: float = 1.0,
    rng: np.random.Generator | None = None,
    tag: str = "",
    block_tokens: int = BLOCK_TOKENS,
) -> str:
    """A Mooncake prompt: the blocks of ``hash_ids`` in order, the last one cut so the whole
    is ``text_chars(tokens)`` long. When the ids cover fewer tokens than ``tokens`` the rest
    is request-unique text (from ``rng`` and ``tag``)."""
    n = text_chars(tokens, chars_per_token)
    parts: list[str] = []
    have = 0
    for h in hash_ids:
        if have >= n:
            break
        parts.append(
            block_text(
                int(h), seed=seed, chars_per_token=chars_per_token, block_tokens=block_tokens
            )
        )
        have += len(parts[-1])
    if have < n:
        fill = rng if rng is not None else np.random.default_rng(seed)
        parts.append(prompt_text(n - have, fill, tag=tag or "x"))
    return _tidy_end("".join(parts)[:n])


async def calibrate_chars_per_token(
    client: Any, *, short_chars: int = 256, long_chars: int = 2304, max_tokens: int = 1
) -> float:
    """Characters per prompt token on an endpoint, from two probe requests.

    Sends a short and a long prompt of this module's text and reads ``usage.prompt_tokens``
    of each (``RequestRecord.prompt_tokens``); the slope
    ``(long_chars - short_chars) / (tokens_long - tokens_short)`` cancels the chat template's
    fixed overhead. ``client`` is a ``loadlab.clients._base.Client`` already entered."""
    t0_ns = time.perf_counter_ns()
    counts = []
    rng = np.random.default_rng(0)
    for i, chars in enumerate((short_chars, long_chars)):
        text = prompt_text(chars, rng, tag=f"probe{i}")
        spec = RequestSpec(
            request_id=f"calibrate-{i}", prompt=text, max_tokens=max_tokens, request_class="probe"
        )
        done = await client.send(spec, t0_ns=t0_ns)
        rec = done.record
        if not rec.ok:
            raise CalibrationError(
                f"calibration probe failed ({rec.outcome}: {rec.error}); check the endpoint, "
                f"or set chars_per_token in the scenario"
            )
        if rec.prompt_tokens is None:
            raise CalibrationError(
                "the endpoint did not report usage.prompt_tokens; set chars_per_token in the "
                "scenario, or give a tokenizer file (tokenizer = PATH)"
            )
        counts.append(rec.prompt_tokens)
    if counts[1] <= counts[0]:
        raise CalibrationError(
            f"probe token counts do not grow with the prompt ({counts[0]} then {counts[1]}); "
            f"set chars_per_token in the scenario"
        )
    return (long_chars - short_chars) / (counts[1] - counts[0])


def chars_per_token_from_tokenizer(path: str, *, sample_chars: int = 20_000) -> float:
    """Characters per token of this module's text under a HuggingFace ``tokenizer.json``.

    Needs the optional ``tokenizers`` package (``pip install tokenizers``)."""
    try:
        from tokenizers import Tokenizer  # type: ignore[import-not-found]
    except ImportError:
        raise WorkloadError(
            "a tokenizer file needs the 'tokenizers' package: pip install tokenizers "
            "(or calibrate against the endpoint instead)"
        ) from None
    tok = Tokenizer.from_file(str(path))
    text = _cut(0, sample_chars)
    ids = tok.encode(text, add_special_tokens=False).ids
    return len(text) / max(1, len(ids))

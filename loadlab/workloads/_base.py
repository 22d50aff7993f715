"""What every workload kind shares: the request stream type, seeded streams, arrivals, clamps.

``RequestStream`` is the lazy iterator ``build_requests`` returns. Besides the specs it carries
``extra()``: a dict of what the workload did (for a trace: the ``TraceStats`` counts of bad
lines, failed rows, thinning...), which the run command stores as
``results.extra["workload"]`` after the run (``loadlab.workloads.workload_extra``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from loadlab.config import RunConfig
from loadlab.records import RequestSpec
from loadlab.workloads._arrivals import arrival_times
from loadlab.workloads._lengths import Dist, parse_dist
from loadlab.workloads._params import WorkloadError, get_bool, get_float, get_int
from loadlab.workloads._prompts import prompt_text

__all__ = [
    "COMMON_KEYS",
    "RequestStream",
    "caps",
    "check_common",
    "clamp",
    "common_extra_body",
    "counter",
    "independent_requests",
    "int_stream",
    "length_dists",
    "open_loop_times",
    "rng_for",
    "run_salt",
    "text_seed",
    "with_reasoning_effort",
    "with_run_salt",
]

# keys every kind accepts
COMMON_KEYS = frozenset(
    {
        "kind",
        "request_class",
        "max_prompt_tokens",
        "max_output_tokens",
        "exact_output",
        "chars_per_token",
        "reasoning_effort",  # passed to the API on every request (build_requests)
        "cache_bust",  # true: every prompt salted for this run (``run_salt``): start cold
        "salt",  # a fixed salt (two runs with one salt share their prompts)
    }
)

PREFETCH_SPECS = 2048  # specs built before the run starts
PREFETCH_CHARS = 32 << 20  # ... or this much prompt text and media, whichever comes first

# purposes of the separate seeded streams: changing one distribution never shifts another
PURPOSES = {"prompt": 1, "output": 2, "text": 3, "turns": 4, "think": 5, "thin": 6, "pairs": 7,
            "prefix": 8, "prefix_text": 9, "count": 10, "query": 11, "images": 12,
            "audio": 13}  # fmt: skip


class RequestStream(Iterator[RequestSpec]):
    """An iterator of ``RequestSpec`` plus ``extra()``: what the workload did, as plain data."""

    def __init__(
        self,
        specs: Iterable[RequestSpec],
        extra: Callable[[], dict[str, Any]],
        ready: Callable[[], None] | None = None,
    ):
        self._extra = extra
        self._it: Iterator[RequestSpec] = iter(specs)
        self._ready = ready  # called once the read-ahead is built

    def read_ahead(
        self, count: int = PREFETCH_SPECS, max_chars: int = PREFETCH_CHARS
    ) -> RequestStream:
        """Build the first ``count`` specs (or ``max_chars`` of prompt text and media) now.

        ``build_requests`` does it before the runner takes t0: one-time costs (the prompt
        corpus, opening a trace) and the first requests' prompt building stay off the runner's
        hot path, so they never show up as send lag, and errors in the first lines surface
        before any load. Bounded so endless streams stay cheap. A Locust user reads none
        ahead: its stream is one of hundreds started on a live gevent loop."""
        ahead: list[RequestSpec] = []
        chars = 0
        while len(ahead) < count and chars < max_chars:
            spec = next(self._it, None)
            if spec is None:
                break
            ahead.append(spec)
            chars += len(spec.prompt) + sum(map(len, spec.images))
            chars += sum(len(data) for _, data in spec.audio)  # a 30 s clip is 1.3 MB
        self._it = itertools.chain(ahead, self._it)
        if self._ready is not None:
            self._ready()
        return self

    def __next__(self) -> RequestSpec:
        return next(self._it)

    def extra(self) -> dict[str, Any]:
        return self._extra()


def rng_for(seed: int, purpose: str) -> np.random.Generator:
    """The seeded generator for one purpose of one run (``PURPOSES``)."""
    return np.random.default_rng([seed, PURPOSES[purpose]])


def text_seed(cfg: RunConfig) -> int:
    """The seed of the run's prompt text: its seed, mixed with its endpoint's name when the
    requests are built for one (``loadlab._runner.run`` builds them per endpoint).

    The endpoints of one command then send the same requests (ids, lengths, times: the other
    purposes use the seed alone) with different text, so two that are one server never find
    each other's prompts in its prefix cache; the same seed and endpoint repeat the text."""
    seed = cfg.request_seed
    if not cfg.endpoints:
        return seed
    key = f"{seed} {cfg.endpoints[0].name}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") >> 1


def run_salt(params: Mapping[str, Any]) -> str:
    """The workload's salt: ``salt`` when given (or drawn by ``with_run_salt``), a new one
    with ``cache_bust`` (unique: nothing the server cached before can match it), else ""."""
    if "salt" in params:
        return str(params["salt"]).strip()
    if get_bool(params, "cache_bust", False):
        return uuid.uuid4().hex[:12]
    return ""


def with_run_salt(cfg: RunConfig) -> RunConfig:
    """``cfg`` with its cache-busting salt drawn now (``cache_bust`` and no ``salt``), so
    every process of a ``--workers`` run, each rebuilding the stream, sends the same prompts."""
    wl = cfg.workload
    if not wl.get("cache_bust") or "salt" in wl:
        return cfg
    return cfg.replace(workload={**wl, "salt": uuid.uuid4().hex[:12]})


def open_loop_times(cfg: RunConfig, n: int | None) -> list[float] | None:
    """Arrival offsets (s) from ``cfg.arrival`` in open loop; ``None`` in closed loop."""
    if cfg.rate_rps is None:
        return None
    return arrival_times(
        cfg.arrival, cfg.rate_rps, n=n, duration_s=cfg.duration_s, cv=cfg.cv, seed=cfg.request_seed
    )


def counter(n: int | None) -> Iterable[int]:
    """0..n-1, or forever (a closed-loop duration run: the runner stops it)."""
    return range(n) if n is not None else itertools.count()


def int_stream(dist: Dist, rng: np.random.Generator, batch: int = 1024) -> Iterator[int]:
    """Endless draws of ``dist`` as ints, in fixed-size batches (so they are reproducible
    however many are taken)."""
    while True:
        yield from (int(x) for x in dist.sample_int(rng, batch))


def clamp(value: int, upper: int | None) -> int:
    return max(1, min(value, upper) if upper is not None else value)


def length_dists(
    params: Mapping[str, Any], prompt_default: Any, output_default: Any, bases: Iterable[Path]
) -> tuple[Dist, Dist]:
    """The prompt and output length distributions of a kind (defaults: numbers or tables)."""
    b = tuple(bases)
    prompt = parse_dist(params.get("prompt_tokens", prompt_default), "prompt_tokens", bases=b)
    output = parse_dist(params.get("output_tokens", output_default), "output_tokens", bases=b)
    return prompt, output


def caps(params: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """``max_prompt_tokens`` and ``max_output_tokens``: clamps applied to every drawn length."""
    return get_int(params, "max_prompt_tokens", None), get_int(params, "max_output_tokens", None)


def with_reasoning_effort(stream: RequestStream, params: Mapping[str, Any]) -> RequestStream:
    """``stream`` with the workload's ``reasoning_effort`` on every request (if it has one)."""
    effort = params.get("reasoning_effort")
    if effort is None:
        return stream
    specs = (dataclasses.replace(s, reasoning_effort=str(effort)) for s in stream)
    return RequestStream(specs, stream.extra)


def common_extra_body(params: Mapping[str, Any], max_tokens: int) -> dict[str, Any]:
    """``exact_output = true`` asks servers that support it (vLLM, SGLang) for exactly
    ``max_tokens`` tokens; the reference server ignores EOS by default and needs nothing."""
    if get_bool(params, "exact_output", False):
        return {"ignore_eos": True, "min_tokens": max_tokens}
    return {}


def check_common(params: Mapping[str, Any], bases: Iterable[Path] = ()) -> None:
    """Check the keys every kind accepts (``COMMON_KEYS``)."""
    caps(params)
    common_extra_body(params, 1)
    effort = params.get("reasoning_effort")
    if effort is not None and (not isinstance(effort, str) or not effort):
        raise WorkloadError(
            f"workload.reasoning_effort = {effort!r}: a string such as 'low', 'medium', 'high'"
        )
    get_bool(params, "cache_bust", False)
    if "salt" in params and not (isinstance(params["salt"], str) and params["salt"].strip()):
        raise WorkloadError(f"workload.salt = {params['salt']!r}: must be a non-empty string")
    get_float(params, "chars_per_token", None)
    if "request_class" in params and not isinstance(params["request_class"], str):
        raise WorkloadError(
            f"workload.request_class = {params['request_class']!r}: must be a string"
        )


def independent_requests(
    cfg: RunConfig,
    kind: str,
    prefix: str,
    prompt_tokens: Iterable[int],
    output_tokens: Iterable[int],
    times: list[float] | None,
    *,
    n: int | None,
    chars_per_token: float,
) -> Iterator[RequestSpec]:
    """Stand-alone requests (synthetic, batch): ``n`` (or endless) exact-length prompts, each
    tagged by its id ``{prefix}-000042``, lengths clamped to the workload's caps, sent at
    ``times[i]`` when the run is open loop; their class is ``request_class``, else ``kind``."""
    params = cfg.workload
    request_class = str(params.get("request_class", kind))
    max_prompt, max_output = caps(params)
    text_rng = rng_for(text_seed(cfg), "text")
    # strict=False: the length streams may be endless; counter(n) bounds the run
    for i, p_raw, out_raw in zip(counter(n), prompt_tokens, output_tokens, strict=False):
        rid = f"{prefix}-{i:06d}"
        p_tok, out = clamp(int(p_raw), max_prompt), clamp(int(out_raw), max_output)
        yield RequestSpec(
            request_id=rid,
            prompt=prompt_text(p_tok, text_rng, tag=rid, chars_per_token=chars_per_token),
            max_tokens=out,
            intended_at_s=times[i] if times is not None else None,
            prompt_tokens=p_tok,
            request_class=request_class,
            extra_body=common_extra_body(params, out),
        )

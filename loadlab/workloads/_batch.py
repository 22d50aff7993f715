"""Batch workload: a job of N documents (e.g. summarisation) submitted together.

Open loop (``rate_rps`` set): every document is due at ``intended_at_s = 0`` (the whole job at
once; ``rate_rps`` is not used) unless ``submit = "rate"``, which spreads them by the arrival
process. Closed loop (``concurrency = C``): at most C documents in flight, the next one sent as
soon as one finishes. Streaming follows the run's ``stream``. Every spec has
``request_class = "batch"``; the report computes the job completion time (first send to last
token) and tokens/s from the records of that class.

``[workload]`` keys (kind = "batch")::

    documents        N (default: the run's `requests`, else 100)
    prompt_tokens, output_tokens   lengths (default: arXiv summarisation rows, drawn together:
                     long documents, short summaries)
    submit           "at_once" (default) | "rate" (open loop only)
    request_class, max_prompt_tokens, max_output_tokens, exact_output  (as for synthetic)

Example::

    cfg = RunConfig(concurrency=8, requests=200, workload={"kind": "batch"})
    job = list(batch_requests(cfg))     # 200 specs, intended_at_s None
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from loadlab.config import RunConfig
from loadlab.records import RequestSpec
from loadlab.workloads._base import (
    COMMON_KEYS,
    RequestStream,
    check_common,
    independent_requests,
    open_loop_times,
    rng_for,
)
from loadlab.workloads._exact import Sizing, draft_chars_per_token
from loadlab.workloads._lengths import parse_dist, sample_pairs
from loadlab.workloads._params import WorkloadError, check_keys, get_int

__all__ = ["DEFAULT_DOCUMENTS", "KEYS", "batch_requests", "validate"]

KEYS = COMMON_KEYS | {"documents", "prompt_tokens", "output_tokens", "submit"}
DEFAULT_DOCUMENTS = 100
SUBMIT = ("at_once", "rate")


def validate(cfg: RunConfig, params: Mapping[str, Any], bases: Sequence[Path] = ()) -> None:
    check_keys("batch", params, KEYS)
    for key in ("prompt_tokens", "output_tokens"):
        if key in params:
            parse_dist(params[key], key, bases=bases)
    get_int(params, "documents", None)
    check_common(params, bases)
    submit = params.get("submit", "at_once")
    if submit not in SUBMIT:
        raise WorkloadError(f"workload.submit = {submit!r}: choose one of {', '.join(SUBMIT)}")
    if submit == "rate" and cfg.rate_rps is None:
        raise WorkloadError(
            'workload.submit = "rate" needs open loop: set rate_rps instead of concurrency'
        )


def batch_requests(cfg: RunConfig, sizing: Sizing | None = None) -> RequestStream:
    params = cfg.workload
    chars_per_token = draft_chars_per_token(params, sizing)
    validate(cfg, params)
    n = get_int(params, "documents", None) or cfg.requests or DEFAULT_DOCUMENTS
    times: list[float] | None = None
    if cfg.rate_rps is not None:
        if params.get("submit", "at_once") == "rate":
            times = open_loop_times(cfg, n) or []
            n = len(times)
        else:
            times = [0.0] * n

    def specs() -> Iterator[RequestSpec]:
        pairs = sample_pairs("arxiv", rng_for(cfg.request_seed, "pairs"), n)
        prompts, outputs = pairs[:, 0], pairs[:, 1]
        if "prompt_tokens" in params:
            prompts = parse_dist(params["prompt_tokens"], "prompt_tokens").sample_int(
                rng_for(cfg.request_seed, "prompt"), n
            )
        if "output_tokens" in params:
            outputs = parse_dist(params["output_tokens"], "output_tokens").sample_int(
                rng_for(cfg.request_seed, "output"), n
            )
        yield from independent_requests(
            cfg, "batch", "batch", prompts, outputs, times, n=n, chars_per_token=chars_per_token
        )

    cls = str(params.get("request_class", "batch"))
    return RequestStream(specs(), lambda: {"kind": "batch", "documents": n, "request_class": cls})

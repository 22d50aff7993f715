"""Embeddings and rerank workloads: requests that are not generated, only read.

``[workload]`` keys, kind = "embeddings" (sent to ``api = "embeddings"``)::

    batch_size      inputs per request: a number or a distribution (default 1)
    input_tokens    each input's length: a number or a distribution (default: the run's
                    prompt_tokens)

kind = "rerank" (``api = "rerank"``: ``/v1/rerank`` in the Cohere / Jina shape; or
``api = "score"``: vLLM's ``/score``, the query as ``text_1``)::

    documents       documents per request: a number or a distribution (default 8)
    query_tokens    the query's length (default 16)
    document_tokens each document's length (default: the run's prompt_tokens)

Both also take ``request_class`` and ``max_prompt_tokens`` (a clamp on every drawn length). A
request's ``inputs`` hold its texts (the embeddings batch, or the documents; the rerank query
is its ``prompt``); an embeddings request's ``prompt_tokens`` is its inputs' total requested
length (a rerank request has none: each server frames the (query, document) pairs its own way,
so its record keeps the server's count only). Nothing is generated:
``max_tokens`` is 0 and the records have no token chunks (no TTFT, no ITL; latency is end minus
send).

Example::

    cfg = RunConfig(rate_rps=10, requests=100,
                    workload={"kind": "embeddings", "batch_size": 8, "input_tokens": 64})
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from loadlab.config import RunConfig
from loadlab.records import RequestSpec
from loadlab.workloads._base import (
    RequestStream,
    clamp,
    counter,
    int_stream,
    open_loop_times,
    rng_for,
    text_seed,
)
from loadlab.workloads._exact import Sizing, draft_chars_per_token
from loadlab.workloads._lengths import parse_dist
from loadlab.workloads._params import WorkloadError, check_keys, get_int
from loadlab.workloads._prompts import prompt_text

__all__ = ["EMBEDDING_KEYS", "RERANK_KEYS", "embedding_requests", "rerank_requests", "validate"]

_COMMON = {"kind", "request_class", "max_prompt_tokens", "chars_per_token"}
EMBEDDING_KEYS = _COMMON | {"batch_size", "input_tokens"}
RERANK_KEYS = _COMMON | {"documents", "query_tokens", "document_tokens"}
APIS = {"embeddings": ("embeddings",), "rerank": ("rerank", "score")}


def _dists(cfg: RunConfig, params: Mapping[str, Any], bases: Sequence[Path]) -> dict[str, Any]:
    b = tuple(bases)
    if params.get("kind") == "embeddings":
        return {
            "count": parse_dist(params.get("batch_size", 1), "batch_size", bases=b),
            "length": parse_dist(
                params.get("input_tokens", cfg.prompt_tokens), "input_tokens", bases=b
            ),
        }
    return {
        "count": parse_dist(params.get("documents", 8), "documents", bases=b),
        "length": parse_dist(
            params.get("document_tokens", cfg.prompt_tokens), "document_tokens", bases=b
        ),
        "query": parse_dist(params.get("query_tokens", 16), "query_tokens", bases=b),
    }


def validate(cfg: RunConfig, params: Mapping[str, Any], bases: Sequence[Path] = ()) -> None:
    kind = str(params.get("kind"))
    check_keys(kind, params, EMBEDDING_KEYS if kind == "embeddings" else RERANK_KEYS)
    _dists(cfg, params, bases)
    get_int(params, "max_prompt_tokens", None)
    wrong = [ep.name for ep in cfg.endpoints if ep.api not in APIS[kind]]
    if wrong:
        raise WorkloadError(
            f"workload.kind = {kind!r} needs api = {' or '.join(map(repr, APIS[kind]))} on every "
            f"endpoint (--api {APIS[kind][0]}); endpoint(s) {', '.join(wrong)} speak another API"
        )


def _requests(cfg: RunConfig, sizing: Sizing | None, kind: str) -> RequestStream:
    params = cfg.workload
    chars_per_token = draft_chars_per_token(params, sizing)
    validate(cfg, params)
    d = _dists(cfg, params, ())
    cap = get_int(params, "max_prompt_tokens", None)
    times = open_loop_times(cfg, cfg.requests)
    n = len(times) if times is not None else cfg.requests
    cls = str(params.get("request_class", kind))
    counts = {"requests": 0, "inputs": 0}

    def specs() -> Iterator[RequestSpec]:
        seed = cfg.request_seed
        sizes = int_stream(d["count"], rng_for(seed, "count"))
        lengths = int_stream(d["length"], rng_for(seed, "prompt"))
        queries = int_stream(d["query"], rng_for(seed, "query")) if "query" in d else None
        text_rng = rng_for(text_seed(cfg), "text")
        for i in counter(n):
            rid = f"{kind[:3]}-{i:06d}"
            k = max(1, next(sizes))
            toks = [clamp(next(lengths), cap) for _ in range(k)]
            inputs = tuple(
                prompt_text(t, text_rng, tag=f"{rid}-{j}", chars_per_token=chars_per_token)
                for j, t in enumerate(toks)
            )
            query, q_tok = "", 0
            if queries is not None:
                q_tok = clamp(next(queries), cap)
                query = prompt_text(
                    q_tok, text_rng, tag=f"{rid}-q", chars_per_token=chars_per_token
                )
            counts["requests"] += 1
            counts["inputs"] += k
            yield RequestSpec(
                request_id=rid,
                prompt=query,
                max_tokens=0,
                intended_at_s=times[i] if times is not None else None,
                # embeddings: the inputs' total; rerank: how a server frames each (query,
                # document) pair is its own, so only the server's count is kept
                prompt_tokens=sum(toks) if queries is None else None,
                request_class=cls,
                inputs=inputs,
            )

    return RequestStream(specs(), lambda: {"kind": kind, **counts})


def embedding_requests(cfg: RunConfig, sizing: Sizing | None = None) -> RequestStream:
    return _requests(cfg, sizing, "embeddings")


def rerank_requests(cfg: RunConfig, sizing: Sizing | None = None) -> RequestStream:
    return _requests(cfg, sizing, "rerank")

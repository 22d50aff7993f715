"""Embeddings and rerank on the reference server: the same model, pooled.

- ``POST /v1/embeddings`` (OpenAI's shape): ``input`` is a string, a list of strings, a list of
  token ids or a list of such lists; each input's embedding is the model's final-norm hidden
  states averaged over its tokens, unit length (``ModelRunner.pool``). ``usage.prompt_tokens``
  counts every input token.
- ``POST /v1/rerank`` and ``/rerank`` (the Cohere / Jina shape: ``query``, ``documents``,
  ``top_n``, ``return_documents``) and ``POST /score`` / ``/v1/score`` (vLLM's: ``text_1``,
  ``text_2``): each (query, document) pair is read as one sequence, ``query + "\\n" + document``
  (a cross-encoder), and its score is ``sigmoid(w . e)`` for a fixed, seeded vector ``w``;
  ``usage`` counts every token of every pair.

The forward passes run on a worker thread beside the engine's decode steps, at most
``POOL_WORKERS`` at once; their cost shows in the request's latency, not in the step log. A
disaggregated server does not pool (400). Each input is at most the model's context.
"""

from __future__ import annotations

import asyncio
import math
import random
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict

__all__ = ["POOL_WORKERS", "add_pooling_routes"]

POOL_WORKERS = 2


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: str = "float"
    dimensions: int | None = None


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    query: str
    documents: list[str | dict[str, Any]]
    top_n: int | None = None
    return_documents: bool = False


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    text_1: str | list[str]
    text_2: str | list[str]


def _score_vector(dim: int, seed: int = 17) -> list[float]:
    rng = random.Random(seed)  # noqa: S311 - a fixed projection, not a secret
    w = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(x * x for x in w))
    return [x / norm * 4.0 for x in w]  # scores spread over (0, 1) for unit embeddings


def add_pooling_routes(
    app: FastAPI,
    engine: Any,
    *,
    model_name: str,
    max_model_len: int,
    encode: Callable[[str], list[int]],
    api_error: Callable[..., Exception],
) -> None:
    """Adds the routes above to ``app`` (``api_error(status, message, type, param)`` is the
    server's OpenAI-shaped error)."""
    gate = asyncio.Semaphore(POOL_WORKERS)
    weights: list[float] = []

    def check(ids: list[int], param: str) -> list[int]:
        if not ids:
            raise api_error(400, f"{param}: an input has no tokens", "invalid_request_error", param)
        if len(ids) > max_model_len:
            raise api_error(400, f"{param}: an input of {len(ids)} tokens exceeds the model's "
                            f"context of {max_model_len}", "invalid_request_error", param)  # fmt: skip
        return ids

    async def pool(token_lists: list[list[int]]) -> list[list[float]]:
        if not hasattr(engine, "pool"):
            raise api_error(400, "this server's mode does not serve embeddings or rerank "
                            "(disaggregated); start it in another mode", "invalid_request_error")  # fmt: skip
        async with gate:
            try:
                return await asyncio.to_thread(engine.pool, token_lists)
            except ValueError as exc:  # a token id outside the vocabulary
                raise api_error(400, f"input: {exc}", "invalid_request_error", "input") from None

    async def scores(query: str, docs: list[str], param: str) -> tuple[list[float], int]:
        pairs = [check(encode(query + "\n" + d), param) for d in docs]
        vectors = await pool(pairs)
        if not weights and vectors:
            weights.extend(_score_vector(len(vectors[0])))
        out = [
            1 / (1 + math.exp(-sum(a * b for a, b in zip(v, weights, strict=True))))
            for v in vectors
        ]
        return out, sum(map(len, pairs))

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingsRequest) -> dict[str, Any]:
        raw: Any = body.input
        inputs: list[list[int]]
        if isinstance(raw, str):
            inputs = [encode(raw)]
        elif raw and all(isinstance(x, int) for x in raw):
            inputs = [list(raw)]
        elif raw and all(isinstance(x, list) for x in raw):
            inputs = [list(x) for x in raw]
        else:
            inputs = [encode(x) for x in raw]
        if not inputs:
            raise api_error(400, "input: give at least one input", "invalid_request_error", "input")
        token_lists = [check(ids, "input") for ids in inputs]
        vectors = await pool(token_lists)
        if body.dimensions is not None:
            vectors = [v[: max(1, body.dimensions)] for v in vectors]
        n = sum(map(len, token_lists))
        return {
            "object": "list",
            "model": body.model or model_name,
            "data": [
                {"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)
            ],
            "usage": {"prompt_tokens": n, "total_tokens": n},
        }

    async def rerank(body: RerankRequest) -> dict[str, Any]:
        docs = [d if isinstance(d, str) else str(d.get("text", "")) for d in body.documents]
        if not docs:
            raise api_error(
                400, "documents: give at least one", "invalid_request_error", "documents"
            )
        found, n = await scores(body.query, docs, "documents")
        order = sorted(range(len(docs)), key=lambda i: -found[i])[: body.top_n or len(docs)]
        results = []
        for i in order:
            item: dict[str, Any] = {"index": i, "relevance_score": found[i]}
            if body.return_documents:
                item["document"] = {"text": docs[i]}
            results.append(item)
        return {"id": f"rerank-{uuid.uuid4().hex}", "model": body.model or model_name,
                "results": results, "usage": {"prompt_tokens": n, "total_tokens": n}}  # fmt: skip

    app.post("/v1/rerank")(rerank)
    app.post("/rerank")(rerank)

    async def score(body: ScoreRequest) -> dict[str, Any]:
        left = [body.text_1] if isinstance(body.text_1, str) else body.text_1
        right = [body.text_2] if isinstance(body.text_2, str) else body.text_2
        if len(left) == 1:
            left = left * len(right)
        if len(left) != len(right) or not right:
            raise api_error(400, "text_1 must be one text or as many as text_2",
                            "invalid_request_error", "text_1")  # fmt: skip
        out, n = [], 0
        for a, b in zip(left, right, strict=True):
            found, k = await scores(a, [b], "text_2")
            out.append(found[0])
            n += k
        return {"id": f"score-{uuid.uuid4().hex}", "object": "list", "model": body.model or model_name,
                "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(out)],
                "usage": {"prompt_tokens": n, "total_tokens": n}}  # fmt: skip

    app.post("/score")(score)
    app.post("/v1/score")(score)

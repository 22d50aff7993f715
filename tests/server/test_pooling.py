"""The reference server's embeddings, rerank and score routes: the same model, pooled."""

from __future__ import annotations

import math
from typing import Any

from loadlab.clients._counting import post_json
from tests.helpers.server import AUTH

HEADERS = {"Content-Type": "application/json", **AUTH}


def _post(server: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    return post_json(server.url + path, body, HEADERS)


def test_embeddings_are_unit_vectors_counted_by_their_tokens(continuous_server: Any) -> None:
    out = _post(continuous_server, "/v1/embeddings", {"input": ["hello world", "abc"]})
    ids = _post(continuous_server, "/v1/embeddings", {"input": [[104, 105], [1, 2, 3]]})
    vectors = [d["embedding"] for d in out["data"] + ids["data"]]
    assert [d["index"] for d in out["data"]] == [0, 1] and ids["usage"]["prompt_tokens"] == 5
    assert len({len(v) for v in vectors}) == 1 and len(vectors[0]) > 8
    assert all(abs(math.sqrt(sum(x * x for x in v)) - 1.0) < 1e-4 for v in vectors)
    assert vectors[0] != vectors[1]
    assert out["usage"]["prompt_tokens"] == len("hello world") + len("abc")
    again = _post(continuous_server, "/v1/embeddings", {"input": "hello world"})
    assert (
        max(abs(a - b) for a, b in zip(again["data"][0]["embedding"], vectors[0], strict=True))
        < 1e-4
    )


def test_rerank_orders_documents_and_counts_every_pair(continuous_server: Any) -> None:
    docs = ["first document", "second", {"text": "third one"}]
    out = _post(continuous_server, "/v1/rerank", {"query": "q?", "documents": docs, "top_n": 2,
                                                  "return_documents": True})  # fmt: skip
    scores = [r["relevance_score"] for r in out["results"]]
    assert len(scores) == 2 and scores == sorted(scores, reverse=True)
    assert all(0 < s < 1 for s in scores) and "text" in out["results"][0]["document"]
    pairs = sum(len("q?\n" + d) for d in ("first document", "second", "third one"))
    assert out["usage"]["total_tokens"] == pairs
    same = _post(continuous_server, "/rerank", {"query": "q?", "documents": docs})
    assert len(same["results"]) == 3
    score = _post(continuous_server, "/score", {"text_1": "q?", "text_2": ["second", "third one"]})
    by_index = {r["index"]: r["relevance_score"] for r in same["results"]}
    assert abs(score["data"][0]["score"] - by_index[1]) < 1e-6


def test_bad_pooling_requests_are_400(continuous_server: Any) -> None:
    import urllib.error
    import urllib.request

    def status(path: str, body: bytes) -> int:
        req = urllib.request.Request(continuous_server.url + path, data=body, headers=HEADERS)  # noqa: S310
        try:
            with urllib.request.urlopen(req) as r:  # noqa: S310 - loopback test server
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    assert status("/v1/embeddings", b'{"input": []}') == 400
    assert status("/v1/embeddings", b'{"input": "' + b"x" * 200 + b'"}') == 400  # > 128 context
    assert status("/v1/rerank", b'{"query": "q", "documents": []}') == 400
    assert status("/score", b'{"text_1": ["a", "b"], "text_2": ["c"]}') == 400

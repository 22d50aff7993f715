"""Embeddings and rerank: one JSON request, one JSON answer, nothing streamed.

``PoolingClient`` speaks ``api = "embeddings"`` (OpenAI's ``/v1/embeddings``: ``input`` is the
request's texts), ``"rerank"`` (``/v1/rerank``, the Cohere / Jina shape: ``query`` and
``documents``) and ``"score"`` (vLLM's ``/score``: ``text_1`` the query, ``text_2`` the
documents). The record keeps the send and end times (latency is end minus send; there is no
TTFT or ITL), how many inputs went (``inputs``) and the server's input token count
(``usage.prompt_tokens``, else ``total_tokens``). An answer that does not hold one result per
input is a ``protocol_error``.

Example::

    async with PoolingClient(EndpointConfig(url, api="embeddings")) as client:
        done = await client.send(RequestSpec("e1", "", 0, inputs=("a", "b")), t0_ns=t0)
        done.record.inputs, done.record.prompt_tokens
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from loadlab.clients._base import Message
from loadlab.clients._state import StreamState
from loadlab.clients._streaming import StreamingClient
from loadlab.records import OUTCOME_PROTOCOL_ERROR, RequestRecord, RequestSpec

__all__ = ["PoolingClient", "PoolingState"]


class PoolingState(StreamState):
    PROMPT_KEY = "prompt_tokens"
    OUTPUT_KEY = "completion_tokens"

    def __init__(self, record: RequestRecord, api: str, **kw: Any) -> None:
        super().__init__(record, **kw)
        self.api = api

    def on_bytes(self, data: bytes, t_ns: int) -> bool:
        return self._keep(data)

    def _event(self, data: str, event: str, t_rel: int) -> bool:  # pragma: no cover - no stream
        return False

    def _answer(self, obj: dict[str, Any], raw: bytes, t_ns: int) -> None:
        results = obj.get("results") if self.api == "rerank" else obj.get("data")
        want = self.record.inputs or 0
        got = len(results) if isinstance(results, list) else -1
        # a rerank answer may hold fewer than asked for (top_n), never more
        if got < 0 or got > want or (self.api != "rerank" and got != want):
            self._set(OUTCOME_PROTOCOL_ERROR, f"{got} results for {want} inputs")
            return
        usage = obj.get("usage")
        if isinstance(usage, dict) and "prompt_tokens" not in usage and "total_tokens" in usage:
            usage = {**usage, "prompt_tokens": usage["total_tokens"]}  # Jina, vLLM's rerank
        self.usage = usage if isinstance(usage, dict) else None
        self.record.response_id = obj.get("id") if isinstance(obj.get("id"), str) else None
        self.record.output_tokens, self.record.output_tokens_source = 0, "none"


class PoolingClient(StreamingClient):
    APIS = ("embeddings", "rerank", "score")
    STATE: ClassVar[type[StreamState]] = PoolingState

    def __init__(self, endpoint: Any, **kw: Any) -> None:
        kw["stream"] = False  # nothing to stream
        kw.pop("token_ends", None)
        super().__init__(endpoint, **kw)

    def _state(self, rec: RequestRecord, t0_ns: int) -> StreamState:
        return PoolingState(
            rec,
            self.endpoint.api,
            stream=False,
            t0_ns=t0_ns,
            secrets=self._secrets,
            max_event_bytes=self.max_event_bytes,
        )

    def _body(self, spec: RequestSpec, history: Sequence[Message]) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if self.endpoint.model:
            body["model"] = self.endpoint.model
        api, texts = self.endpoint.api, list(spec.inputs)
        if api == "embeddings":
            body["input"] = texts
        elif api == "rerank":
            body.update(query=spec.prompt, documents=texts, return_documents=False)
        else:
            body.update(text_1=spec.prompt, text_2=texts)
        return {**body, **self.extra_body, **dict(spec.extra_body)}

"""Protocol adapters: turn a ``RequestSpec`` into a timed ``RequestRecord``.

``make_client(endpoint, cfg)`` picks the adapter for ``endpoint.api`` (``chat`` and
``completions``: ``OpenAIClient``; ``anthropic``: ``AnthropicClient``; ``responses``:
``ResponsesClient``) and sizes it for the run::

    async with make_client(cfg.endpoints[0], cfg) as client:
        done = await client.send(spec, t0_ns=t0)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from loadlab.clients._anthropic import AnthropicClient, AnthropicStreamState
from loadlab.clients._base import Client, Completion, Message
from loadlab.clients._bodies import build_body
from loadlab.clients._openai import OpenAIClient, OpenAIStreamState
from loadlab.clients._pooling import PoolingClient
from loadlab.clients._responses import ResponsesClient, ResponsesStreamState
from loadlab.clients._sse import SSEDecoder, SSEEvent
from loadlab.clients._streaming import StreamingClient
from loadlab.config import EndpointConfig, RunConfig
from loadlab.errors import ConfigError

__all__ = [
    "AnthropicClient",
    "AnthropicStreamState",
    "Client",
    "Completion",
    "Message",
    "OpenAIClient",
    "OpenAIStreamState",
    "PoolingClient",
    "ResponsesClient",
    "ResponsesStreamState",
    "SSEDecoder",
    "SSEEvent",
    "StreamingClient",
    "build_body",
    "make_client",
]


def make_client(
    endpoint: EndpointConfig,
    cfg: RunConfig,
    token_ends: Callable[[str], Sequence[int]] | None = None,
) -> Client:
    """The client for ``endpoint.api`` with the run's stream, usage, body and timeout knobs.

    ``token_ends`` is the target model's tokenizer when loadlab holds it (the run's prompt
    sizing has it): tokens per streamed chunk where the server does not say.

    The connection pool is the closed-loop concurrency, or the open-loop in-flight cap, or
    unlimited (an open loop without a cap must never wait for a connection).
    """
    kinds: tuple[type[StreamingClient], ...] = (
        OpenAIClient,
        AnthropicClient,
        ResponsesClient,
        PoolingClient,
    )
    kind = next((k for k in kinds if endpoint.api in k.APIS), None)
    if kind is None:
        raise ConfigError(
            f"endpoint {endpoint.name!r}: api {endpoint.api!r} has no client; "
            "use api = 'chat', 'completions', 'anthropic', 'responses', 'embeddings', 'rerank' "
            "or 'score'"
        )
    return kind(
        endpoint,
        token_ends=token_ends,
        stream=cfg.stream,
        include_usage=cfg.include_usage,
        extra_body=cfg.extra_body,
        timeout_s=cfg.timeout_s,
        read_timeout_s=cfg.read_timeout_s,
        max_connections=cfg.concurrency or cfg.max_in_flight or 0,
        transport=cfg.transport,
        max_event_bytes=cfg.max_event_bytes,
    )

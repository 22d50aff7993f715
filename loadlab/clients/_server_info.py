"""What a server says about itself, asked once before a run (never on the hot path).

    GET /v1/models        the models it serves (OpenAI, vLLM, SGLang, the reference server,
                          Anthropic); vLLM's model card also carries ``max_model_len``
    GET /v1/server_info   the reference server: ``max_model_len``, ``block_size``, preset, mode

``server_info(endpoint)`` never raises: a route that does not answer (404, no JSON, a dead
endpoint) leaves its fields unknown, and the run goes on as before. What it keeps of
``/v1/server_info`` is an allow-list of plain facts (``KEPT``), since a results file stores it.

Example::

    info = server_info(EndpointConfig("http://127.0.0.1:8000"))
    info.models, info.max_model_len, info.block_size     # ('loadlab-ref',), 1024, 16
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loadlab.clients._counting import _headers, root_url
from loadlab.config import EndpointConfig
from loadlab.records import pick

__all__ = ["KEPT", "ServerInfo", "server_info"]

TIMEOUT_S = 5.0
# what a results file keeps of /v1/server_info (``loadlab capacity --results`` reads the preset)
KEPT = ("preset", "mode", "dtype", "device", "num_params", "kv_bytes_per_token", "num_kv_blocks",
        "block_size", "max_seq_len", "max_model_len", "max_num_seqs", "prefix_caching",
        "tokenizer")  # fmt: skip


@dataclass(frozen=True)
class ServerInfo:
    """The facts a server gave; ``None`` or empty where it said nothing."""

    models: tuple[str, ...] = ()
    max_model_len: int | None = None
    block_size: int | None = None
    source: str = ""  # the route max_model_len came from ("GET /v1/server_info")
    info: Mapping[str, Any] = field(default_factory=dict)  # /v1/server_info, ``KEPT`` keys

    def to_dict(self) -> dict[str, Any]:
        """For ``results.extra["server_info"]``: the kept facts and the served models."""
        return {**self.info, **pick(self, "max_model_len block_size"),
                "served_models": list(self.models)}  # fmt: skip


def _get(url: str, endpoint: EndpointConfig) -> Any:
    if not url.startswith(("http://", "https://")):
        return None
    req = urllib.request.Request(url, headers=_headers(endpoint))  # noqa: S310 - http(s) only
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:  # noqa: S310
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


def _int(value: Any) -> int | None:
    return value if type(value) is int and value > 0 else None


def server_info(endpoint: EndpointConfig) -> ServerInfo:
    """Ask ``endpoint``'s server (module docstring); unknown fields where it did not say."""
    root = root_url(endpoint)
    listed = _get(root + "/v1/models", endpoint)
    cards = listed.get("data") if isinstance(listed, dict) else None
    cards = [c for c in cards if isinstance(c, dict)] if isinstance(cards, list) else []
    models = tuple(str(c["id"]) for c in cards if isinstance(c.get("id"), str))
    own = _get(root + "/v1/server_info", endpoint)
    own = own if isinstance(own, dict) else {}
    kept = {k: own[k] for k in KEPT if k in own and isinstance(own[k], str | int | float | bool)}
    limit, source = _int(own.get("max_model_len")), "GET /v1/server_info"
    if limit is None:
        card = next((c for c in cards if c.get("id") == endpoint.model), cards[0] if cards else {})
        limit, source = _int(card.get("max_model_len")), "GET /v1/models"
    return ServerInfo(models, limit, _int(own.get("block_size")),
                      source if limit is not None else "", kept)  # fmt: skip

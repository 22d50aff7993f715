"""Asking the server how many tokens a prompt is, when no local tokenizer knows.

Tried in this order by ``server_counter(endpoint)``, each checked with one probe:

    POST /tokenize              vLLM (and the reference server): ``{"model", "messages",
                                "add_generation_prompt": true}`` for chat and Anthropic (vLLM
                                serves /v1/messages through the same chat template),
                                ``{"model", "prompt", "add_special_tokens": true}`` for
                                completions; the answer's ``count``
    POST /v1/tokenize           SGLang's OpenAI-style route, same shapes
    POST /v1/messages/count_tokens   Anthropic: ``{"model", "messages"}`` -> ``input_tokens``

``calibrate(endpoint)`` is the last resort: two one-token requests whose
``usage.prompt_tokens`` give the fixed overhead (chat template) and characters per token;
prompts are then cut by characters, so their lengths are close, not exact.

These are blocking calls made before the run's clock starts: the probes once per endpoint
(``loadlab._runner.prompt_sizing.size_prompts``), the counts while the workload builds its first 2,048
requests ahead (``RequestStream``); they never run on the hot path. A client module because it
speaks the endpoint's API (the data layers, workloads among them, never import clients).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loadlab.clients._bodies import build_body
from loadlab.clients._streaming import api_url, read_api_key
from loadlab.config import EndpointConfig
from loadlab.records import RequestSpec
from loadlab.workloads._params import WorkloadError

__all__ = [
    "Calibration",
    "ServerCounter",
    "calibrate",
    "post_json",
    "root_url",
    "server_counter",
    "server_says_byte",
]

TIMEOUT_S = 10.0
_SUFFIXES = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1")
_CHAT_APIS = ("chat", "anthropic")


def root_url(endpoint: EndpointConfig) -> str:
    """The server root of an endpoint URL (``/v1/...`` removed).

    >>> root_url(EndpointConfig("http://h:8000/v1/chat/completions"))
    'http://h:8000'
    """
    url = endpoint.url.rstrip("/")
    for suffix in _SUFFIXES:
        if url.endswith(suffix):
            return url[: -len(suffix)]
    return url


def _headers(endpoint: EndpointConfig) -> dict[str, str]:
    headers = {"Content-Type": "application/json", **endpoint.headers}
    key = read_api_key(endpoint)
    if endpoint.api == "anthropic":
        headers.setdefault("anthropic-version", "2023-06-01")
        if key:
            headers["x-api-key"] = key
    elif key:
        headers["Authorization"] = f"Bearer {key}"
    return headers


def post_json(url: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    """POST a JSON body, return the JSON answer; raises ``OSError`` (HTTP errors included)."""
    req = urllib.request.Request(  # noqa: S310 - the user's own endpoint, http(s) only
        url, data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    if not url.startswith(("http://", "https://")):
        raise OSError(f"not an http(s) URL: {url}")
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:  # noqa: S310
        data = json.loads(resp.read())
    if not isinstance(data, dict):
        raise OSError(f"{url}: the answer is not a JSON object")
    return data


@dataclass(frozen=True)
class ServerCounter:
    """Counts a one-message prompt with one request to the server's counting route."""

    url: str
    shape: str  # "tokenize" or "count_tokens"
    endpoint: EndpointConfig

    def count(self, text: str) -> int:
        ep = self.endpoint
        message = [{"role": "user", "content": text}]
        if self.shape == "count_tokens":
            body: dict[str, Any] = {"model": ep.model, "messages": message}
            key = "input_tokens"
        elif ep.api in _CHAT_APIS:
            body = {"model": ep.model, "messages": message, "add_generation_prompt": True}
            key = "count"
        else:
            body = {"model": ep.model, "prompt": text, "add_special_tokens": True}
            key = "count"
        value = post_json(self.url, body, _headers(ep)).get(key)
        if not isinstance(value, int):
            raise OSError(f"{self.url}: no integer {key!r} in the answer")
        return value


def server_says_byte(endpoint: EndpointConfig) -> bool:
    """The reference server says ``"tokenizer": "byte"`` in ``/v1/server_info``: prompts are
    then sized locally, with no counting requests."""
    url = root_url(endpoint) + "/v1/server_info"
    if not url.startswith(("http://", "https://")):
        return False
    req = urllib.request.Request(url, headers=_headers(endpoint))  # noqa: S310 - http(s) only
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:  # noqa: S310
            return bool(json.loads(resp.read()).get("tokenizer") == "byte")
    except (OSError, ValueError, AttributeError):
        return False


def server_counter(endpoint: EndpointConfig) -> ServerCounter | None:
    """The first counting route the server answers (module docstring), or None."""
    root = root_url(endpoint)
    routes = [("/tokenize", "tokenize"), ("/v1/tokenize", "tokenize")]
    if endpoint.api == "anthropic":
        routes.insert(0, ("/v1/messages/count_tokens", "count_tokens"))
    for path, shape in routes:
        counter = ServerCounter(root + path, shape, endpoint)
        try:
            if counter.count("Hello") > 0:
                return counter
        except (OSError, ValueError):
            continue
    return None


@dataclass(frozen=True)
class Calibration:
    """``prompt_tokens ≈ overhead_tokens + chars / chars_per_token`` on one endpoint."""

    overhead_tokens: float
    chars_per_token: float

    def chars_for(self, tokens: int) -> int:
        return max(1, round((tokens - self.overhead_tokens) * self.chars_per_token))


def calibrate(
    endpoint: EndpointConfig,
    text: Callable[[int], str],
    short_chars: int = 256,
    long_chars: int = 2304,
) -> Calibration:
    """Two non-streamed one-token requests; their ``usage.prompt_tokens`` give the slope
    (characters per token) and the intercept (the template's fixed overhead)."""
    counts = []
    for i, chars in enumerate((short_chars, long_chars)):
        spec = RequestSpec(f"calibrate-{i}", text(chars), max_tokens=1)
        url, body = api_url(endpoint), build_body(spec, endpoint, stream=False)
        usage_key = "input_tokens" if endpoint.api == "anthropic" else "prompt_tokens"
        try:
            usage = post_json(url, body, _headers(endpoint)).get("usage") or {}
        except OSError as exc:
            raise WorkloadError(f"calibration request to {url} failed: {exc}") from None
        if not isinstance(usage.get(usage_key), int):
            raise WorkloadError(
                f"{url} reported no usage.{usage_key}: give --tokenizer PATH (the model's "
                "tokenizer) so prompt lengths can be set"
            )
        counts.append(usage[usage_key])
    if counts[1] <= counts[0]:
        raise WorkloadError(f"calibration: token counts do not grow with the prompt {counts}")
    cpt = (long_chars - short_chars) / (counts[1] - counts[0])
    return Calibration(overhead_tokens=counts[0] - short_chars / cpt, chars_per_token=cpt)

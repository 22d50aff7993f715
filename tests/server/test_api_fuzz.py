"""Fuzz the HTTP API from its own OpenAPI schema (schemathesis): valid and invalid requests
alike must never get a 5xx. Seeded (``derandomize``) and bounded in examples, so it is
repeatable and fast; the test server's 128-token context keeps each request short."""

from __future__ import annotations

import http.client
import json
import math
import os
import urllib.request
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.helpers.server import AUTH

EXAMPLES = {schemathesis.GenerationMode.POSITIVE: 8, schemathesis.GenerationMode.NEGATIVE: 10}


def _schema(url: str) -> Any:
    req = urllib.request.Request(url + "/openapi.json", headers=AUTH)  # noqa: S310 (loopback)
    with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310
        return schemathesis.openapi.from_dict(json.load(r))


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(EXAMPLES), ids=lambda m: m.value)
def test_fuzzed_requests_never_get_a_server_error(continuous_server: Any, mode: Any) -> None:
    schema = _schema(continuous_server.url)
    seen: list[tuple[str, int]] = []
    for result in schema.get_all_operations():
        op = result.ok()
        if mode is schemathesis.GenerationMode.NEGATIVE and op.method.upper() == "GET":
            continue  # nothing to break: the GET routes take no parameters

        @settings(max_examples=EXAMPLES[mode], deadline=None, database=None, derandomize=True,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(case=op.as_strategy(generation_mode=mode))
        def check(case: Any) -> None:
            # The model name is the one field a fuzzer cannot guess; half the cases use it.
            if isinstance(case.body, dict) and "model" in case.body and len(seen) % 2:
                case.body["model"] = "loadlab-ref"
            response = case.call(base_url=continuous_server.url, headers=AUTH, timeout=30)
            seen.append((case.operation.label, response.status_code))
            assert response.status_code < 500, (case.as_curl_command(), response.text[:500])

        check()
    ops = {label for label, _ in seen}
    assert {"POST /v1/completions", "POST /v1/chat/completions"} <= ops
    if mode is schemathesis.GenerationMode.POSITIVE:  # not everything was refused as unknown
        assert any(status not in (400, 404) for label, status in seen if label.startswith("POST"))


# -- what a schema cannot say -----------------------------------------------------------------
# Unicode edge cases (lone surrogates, NUL, BOM, bidi overrides, combining marks, astral and
# non-characters) and sampling values at and past their limits (subnormals, 1e-300, the 1e-5
# greedy cut-off, inf and NaN, which Python's JSON writes and reads). The CI runs
# FUZZ_EXAMPLES (cheap); `LOADLAB_FUZZ_EXAMPLES=2000` is the acceptance run (docs/reference-server.md).
FUZZ_EXAMPLES = int(os.environ.get("LOADLAB_FUZZ_EXAMPLES", "150"))
ODD_TEXT = ["\ud800", "\udfff", "a\udbffb", "\x00", "\ufeff", "\u202e", "e\u0301", "\uffff",
            "\U0010ffff", "\U0001d54f", "\r\n", "\u2028", "", " ", "ü" * 40]  # fmt: skip
TEXT = st.one_of(st.sampled_from(ODD_TEXT), st.text(st.characters(), max_size=24))
EDGE_FLOATS = [0.0, -0.0, 5e-324, 1e-300, 1.4e-45, 1e-38, 9.99e-6, 1e-5, 1.00001e-5, 0.5, 1.0,
               1.0000001, 2.0, 2.0000001, 1e308, math.inf, -math.inf, math.nan]  # fmt: skip
SAMPLING_FLOAT = st.one_of(st.sampled_from(EDGE_FLOATS), st.floats())
INTS = st.one_of(st.integers(-2, 6), st.sampled_from([2**31, 2**63 - 1, 2**63, -(2**63), 10**30]))


@st.composite
def _odd_request(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {"model": draw(st.sampled_from(["loadlab-ref"] * 5 + ["x\ud800"]))}
    fields = {
        "max_tokens": st.one_of(st.integers(1, 4), INTS),
        "temperature": SAMPLING_FLOAT,
        "top_p": SAMPLING_FLOAT,
        "seed": st.one_of(st.none(), INTS),
        "stop": st.one_of(st.none(), TEXT, st.lists(TEXT, max_size=3)),
        "stream": st.booleans(),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
        "ignore_eos": st.booleans(),
    }
    for name, values in fields.items():
        if draw(st.booleans()):
            body[name] = draw(values)
    if draw(st.booleans()):
        part = st.fixed_dictionaries({"type": st.just("text"), "text": TEXT})
        content = st.one_of(TEXT, st.lists(part, min_size=1, max_size=3))
        message = st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system"]), "content": content}
        )
        body["messages"] = draw(st.lists(message, min_size=1, max_size=3))
        return "/v1/chat/completions", body
    body["prompt"] = draw(st.one_of(TEXT, st.lists(TEXT, min_size=1, max_size=1)))
    return "/v1/completions", body


@pytest.mark.slow
def test_unicode_and_extreme_sampling_never_get_a_server_error(continuous_server: Any) -> None:
    """Every request either streams (no error event inside the 200 either) or gets a 4xx."""
    host, port = continuous_server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    statuses: list[int] = []

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(request=_odd_request())
    def check(request: tuple[str, dict[str, Any]]) -> None:
        path, body = request
        data = json.dumps(body)  # ensure_ascii: a lone surrogate travels as "\ud800"
        conn.request("POST", path, data, {**AUTH, "Content-Type": "application/json"})
        response = conn.getresponse()
        text = response.read().decode("utf-8", "replace")
        statuses.append(response.status)
        assert response.status < 500, (path, data, text[:300])
        assert "engine_error" not in text, (path, data, text[:300])

    try:
        check()
    finally:
        conn.close()
    assert len(statuses) >= FUZZ_EXAMPLES // 2  # (hypothesis may stop early only if exhausted)
    assert 200 in statuses and 400 in statuses, sorted(set(statuses))

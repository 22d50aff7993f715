"""Fuzz the HTTP API from its own OpenAPI schema (schemathesis): valid and invalid requests
alike must never get a 5xx. Seeded (``derandomize``) and bounded in examples, so it is
repeatable and fast; the test server's 128-token context keeps each request short."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings

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

"""The Responses API dialect against the fault server: every misbehaviour classifies as in the
chat dialect (what every dialect must do, non-streamed faults and the canary key included, is in
``tests/clients/test_faults.py``); its stream parsing is in test_reasoning.py."""

from __future__ import annotations

import pytest

from loadlab.clients import ResponsesClient
from tests.helpers.clients import assert_faults_classified, run_faults
from tests.helpers.fault_server import FaultServer
from tests.helpers.loopback import FAULT_OUTCOMES

TRANSPORTS = ["raw", "aiohttp"]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_each_fault_becomes_its_outcome(fault_server: FaultServer, transport: str) -> None:
    records = run_faults(ResponsesClient, fault_server.url, "responses", list(FAULT_OUTCOMES),
                         transport=transport)  # fmt: skip
    assert_faults_classified(records)
    assert len(records["eof"].chunk_ns) == 2  # the text was done, the response never completed
    ok = records["ok"]
    assert (ok.prompt_tokens, ok.output_tokens, len(ok.chunk_ns), ok.response_id) == (1, 3, 3, "f")
    assert ok.finish_reason == "completed"

"""What the transports share: every way a raw exchange can fail has its outcome class."""

from __future__ import annotations

from loadlab.clients._http1 import Failure, RawResult
from loadlab.clients._openai import OpenAIStreamState
from loadlab.clients._transports import RAW_OUTCOMES, settle
from loadlab.records import RequestRecord


def test_every_failure_settles_as_its_outcome_class() -> None:
    assert set(RAW_OUTCOMES) == set(Failure)
    for failure, outcome in RAW_OUTCOMES.items():
        state = OpenAIStreamState(RequestRecord("r"), "chat", t0_ns=1_000)
        settle(state, RawResult(sent_ns=2_000, error=failure, message="why", end_ns=5_000))
        assert (state.record.outcome, state.record.end_ns) == (outcome, 4_000)
        assert state.record.error == "why"

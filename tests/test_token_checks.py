"""Prompt-length match and short outputs: hand-computed counts."""

from __future__ import annotations

from loadlab._analysis.token_checks import is_short, prompt_match, prompt_warning, short_outputs
from loadlab.records import RequestRecord


def _rec(req: int | None, got: int | None, turn: int = 0) -> RequestRecord:
    return RequestRecord("r", prompt_tokens_requested=req, prompt_tokens=got, turn=turn)


def test_prompt_match_counts_first_turns_with_both_counts():
    recs = [_rec(100, 100), _rec(100, 101), _rec(100, 99), _rec(100, 95), _rec(100, 103),
            _rec(100, None), _rec(None, 7), _rec(100, 300, turn=1)]  # fmt: skip
    m = prompt_match(recs)
    assert m.to_dict() == {"compared": 5, "exact": 1, "off_by_one": 2, "missed": 2, "worst": -5}


def test_warning_above_one_percent_missed_by_more_than_one():
    ok = [_rec(10, 10)] * 99
    assert prompt_warning(prompt_match([*ok, _rec(10, 12)])) is None  # exactly 1 %: no
    line = prompt_warning(prompt_match([*ok, _rec(10, 12), _rec(10, 14)]))
    assert line is not None and "2 of 101" in line and "--tokenizer" in line
    assert prompt_warning(prompt_match([*ok, _rec(10, 11), _rec(10, 9)])) is None


def test_short_outputs_are_natural_stops_before_max_tokens():
    def r(fr: str, out: int, outcome: str = "ok") -> RequestRecord:
        return RequestRecord("r", outcome=outcome, max_tokens=64, output_tokens=out,
                             finish_reason=fr)  # fmt: skip

    recs = [r("stop", 20), r("end_turn", 63), r("length", 64), r("stop", 64),
            r("max_tokens", 64), r("stop", 3, "incomplete")]  # fmt: skip
    assert [is_short(x) for x in recs] == [True, True, False, False, False, False]
    assert short_outputs(recs) == 2

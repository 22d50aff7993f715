"""The shared-prefix workload: orders, exact lengths, shared-prefix counts, salts, checks."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from loadlab.config import EndpointConfig, RunConfig
from loadlab.records import RequestSpec
from loadlab.workloads import build_requests
from loadlab.workloads._params import WorkloadError
from loadlab.workloads._prefix import PrefixPlan, with_run_salt


def specs(requests: int = 8, **wl: Any) -> list[RequestSpec]:
    cfg = RunConfig(concurrency=2, requests=requests, workload={"kind": "prefix", **wl})
    return list(build_requests(cfg))


def test_orders_use_each_prefix_m_times() -> None:
    assert list(PrefixPlan(2, 3, "grouped", 0)) == [0, 0, 0, 1, 1, 1]
    assert list(PrefixPlan(2, 3, "round_robin", 0)) == [0, 1, 0, 1, 0, 1]
    shuffled = list(PrefixPlan(3, 4, "random", 0))
    assert Counter(shuffled) == {0: 4, 1: 4, 2: 4} and shuffled != sorted(shuffled)
    assert shuffled == list(PrefixPlan(3, 4, "random", 0))  # seeded


def test_prompts_are_prefix_then_unique_suffix_of_exact_length() -> None:
    out = specs(prefixes=2, prefix_tokens=100, suffix_tokens=20, order="grouped")
    assert [len(s.prompt) for s in out] == [120] * 8 == [s.prompt_tokens for s in out]
    heads = [s.prompt[:100] for s in out]
    assert len(set(heads[:4])) == 1 and len(set(heads[4:])) == 1 and heads[0] != heads[4]
    assert len({s.prompt[100:] for s in out}) == 8
    assert all(s.prompt[100] == "\n" for s in out)


def test_shared_prefix_tokens_count_what_an_earlier_prompt_had() -> None:
    out = specs(prefixes=2, prefix_tokens=100, suffix_tokens=20, order="grouped")
    shared = [s.shared_prefix_tokens for s in out]
    # The first of each group shares at most its tag's first characters ("P000"); the
    # others the prefix, the newline and the suffix tag's first letter ("q"), never more.
    assert shared[0] == 0 and shared[4] is not None and shared[4] < 8
    assert all(s is not None and 102 <= s < 110 for s in shared[1:4] + shared[5:])


def test_by_design_when_characters_are_not_tokens() -> None:
    out = specs(prefixes=2, prefix_tokens=50, suffix_tokens=10, order="round_robin",
                chars_per_token=4.0)  # fmt: skip
    assert [s.shared_prefix_tokens for s in out] == [0, 0, 50, 50, 50, 50, 50, 50]
    assert len(out[0].prompt) == 4 * 60


def test_cache_bust_salts_each_build_differently_and_a_fixed_salt_repeats() -> None:
    a, b = specs(2, cache_bust=True), specs(2, cache_bust=True)
    assert a[0].prompt[:6] == b[0].prompt[:6] == "P0000 "  # the tag, less than a block
    assert a[0].prompt[6:18] != b[0].prompt[6:18]
    assert a[0].prompt[18:] == b[0].prompt[18:]  # only the 12-character salt differs
    c, d = specs(2, salt="run-7"), specs(2, salt="run-7")
    assert c[0].prompt == d[0].prompt and c[0].prompt.startswith("P0000 run-7 ")
    assert specs(2)[0].prompt.startswith("P0000")  # no salt: the seed alone


def test_requests_per_prefix_defaults_to_the_runs_requests() -> None:
    cfg = RunConfig(concurrency=2, requests=7, workload={"kind": "prefix", "prefixes": 3})
    stream = build_requests(cfg)
    assert len(list(stream)) == 9  # ceil(7 / 3) = 3 per prefix; the runner stops at 7
    extra = stream.extra()  # type: ignore[attr-defined]
    assert extra["requests_per_prefix"] == 3 and extra["kind"] == "prefix"


@pytest.mark.parametrize(
    ("wl", "message"),
    [
        ({"order": "sorted"}, "choose one of random, grouped, round_robin"),
        ({"salt": " "}, "non-empty string"),
        ({"prefix_tokens": 0}, ">= 1"),
        ({"max_prompt_tokens": 10}, "bound suffix_tokens"),
        ({"prefixs": 2}, "did you mean 'prefixes'"),
    ],
)
def test_bad_keys_say_how_to_fix_them(wl: dict[str, Any], message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        specs(2, **wl)


def test_a_worker_run_draws_its_cache_busting_salt_once() -> None:
    cfg = RunConfig(concurrency=2, requests=4, workload={"kind": "prefix", "cache_bust": True})
    drawn = with_run_salt(cfg)
    salt = drawn.workload["salt"]
    assert len(salt) == 12 and with_run_salt(drawn) is drawn  # drawn once, then kept
    a, b = list(build_requests(drawn)), list(build_requests(drawn))  # two worker processes
    assert a == b and a[0].prompt.startswith(f"P0000 {salt} ")
    assert with_run_salt(RunConfig(concurrency=1, requests=1)).workload == {"kind": "synthetic"}


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_with_a_tokenizer_prefixes_and_prompts_are_exact_in_its_tokens(
    tmp_path: Path, api: str
) -> None:
    """Each prefix is the prompt's first N tokens as the server counts them (template
    included), each prompt N + S, and the shared tokens are counted on the ids: with 16-token
    blocks the expected hit rate is exactly the repeated prefixes' share."""
    pytest.importorskip("tokenizers")
    from loadlab._analysis.prefix_cache import expected_cached_tokens
    from loadlab.workloads._exact import local_sizing
    from loadlab.workloads._tokenizers import load_tokenizer
    from tests.helpers.bpe import make_tokenizer_dir

    tok_dir = str(make_tokenizer_dir(tmp_path / "tiny"))
    tok = load_tokenizer(tok_dir)
    wl = {"kind": "prefix", "prefixes": 3, "requests_per_prefix": 4,
          "prefix_tokens": 256, "suffix_tokens": 32, "cache_bust": True, "block_size": 16}  # fmt: skip
    cfg = RunConfig(concurrency=1, requests=12, max_tokens=4, workload=wl,
                    endpoints=(EndpointConfig("http://127.0.0.1:1", api=api),))  # fmt: skip
    stream = build_requests(cfg, local_sizing(tok, api))
    got = list(stream)
    ids = [tok.prompt_ids(s.prompt, api) or [] for s in got]
    assert [len(i) for i in ids] == [288] * 12
    for j in range(3):  # the requests of one prefix agree on exactly their first 256 tokens
        group = [i for s, i in zip(got, ids, strict=True) if s.prompt.startswith(f"P{j:04d}")]
        assert len(group) == 4 and len({tuple(i[:256]) for i in group}) == 1
    shared = [s.shared_prefix_tokens or 0 for s in got]
    assert sum(x >= 256 for x in shared) == 9 and max(shared) < 288
    hits = sum(expected_cached_tokens(x, 288, 16) for x in shared)
    assert hits == 9 * 256
    extra = stream.extra()  # type: ignore[attr-defined]
    assert extra["prompt_fit"]["exact"] == extra["prompt_fit"]["fitted"]
    assert extra["shared_prefix_basis"].startswith(
        "exact: longest common prefix of the prompts' token ids"
    )

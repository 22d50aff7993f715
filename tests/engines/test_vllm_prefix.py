"""The prefix workload's expected hit rate against vLLM's own prefix-cache counters.

With the model's tokenizer every prefix is the prompt's first 256 tokens as vLLM counts them
(chat template included) and every prompt 288, so with 16-token blocks the expected hit rate is
exact: 4 prefixes x 8 requests, the first of each cold, 28 x 256 / (32 x 288) = 77.8 %. vLLM's
``vllm:prefix_cache_hits_total / queries_total`` (scraped) and the usage ``cached_tokens``
(``--enable-prompt-tokens-details``) must each be within 5 points of it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loadlab._analysis.prefix_cache import prefix_cache_summary
from loadlab.results import read_results
from tests.engines.conftest import Engine, loadlab_run


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_prefix_hit_rate_matches_vllms_counters(
    vllm: Engine, tiny_model: Path, tmp_path: Path, api: str
) -> None:
    out = tmp_path / f"prefix-{api}.json"
    run = loadlab_run(out, ["--endpoint", vllm.url, "--model", vllm.model, "--api", api,
                            "--concurrency", "2", "--requests", "32", "--max-tokens", "4",
                            "--tokenizer", str(tiny_model), "--prefix-tokens", "256",
                            "--prefixes", "4", "--requests-per-prefix", "8",
                            "--suffix-tokens", "32", "--prefix-order", "round_robin",
                            "--cache-bust", "--cache-block-size", "16",
                            "--scrape", vllm.url + "/metrics", "--scrape-interval", "0.5"])  # fmt: skip
    assert run["_rc"] == 0, run["_stderr"][-2000:]
    res = read_results(out)
    recs = res.records
    assert len(recs) == 32 and all(r.ok for r in recs)
    assert {r.prompt_tokens for r in recs} == {288}  # 256 + 32 as vLLM counted them
    # the first request of each prefix shares only the template's opening and its tag
    assert sorted(r.shared_prefix_tokens or 0 for r in recs)[4] >= 256
    pc = prefix_cache_summary(res)
    assert pc is not None and pc.expected_hit_rate is not None
    assert pc.expected_hit_rate == pytest.approx(28 * 256 / (32 * 288))
    assert pc.server_hit_rate is not None and pc.server_source is not None
    assert pc.server_source.startswith("vllm:prefix_cache_hits_total")
    assert abs(pc.server_hit_rate - pc.expected_hit_rate) <= 0.05, pc.to_dict()
    assert pc.usage_hit_rate is not None
    assert abs(pc.usage_hit_rate - pc.expected_hit_rate) <= 0.05, pc.to_dict()
